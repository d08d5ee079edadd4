// Package testchild runs parts of a test binary in child processes: a
// peer that can be SIGKILLed, a process with an environment of its own,
// the other side of a cross-process transport. The test binary re-executes
// itself with $RDMA_TEST_CHILD naming a role; its TestMain hands the roles
// to Main, which runs the named one instead of the tests.
//
// A child talks to its parent over stdout, one line at a time ("ready",
// an address, a JSON line), and may read stdin, which stays open until
// the test ends: a child that serves until stdin closes lives as long as
// its test.
package testchild

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Env names the role a child process runs.
const Env = "RDMA_TEST_CHILD"

// Main runs the role $RDMA_TEST_CHILD names, if it is set, and exits
// with the code the role returns; an unknown role exits 2. Without
// $RDMA_TEST_CHILD it returns, and TestMain goes on to run the tests.
// Call it first in TestMain, so that a child runs none of the test
// setup (leak checks, flags) meant for the parent.
func Main(roles map[string]func() int) {
	role, ok := os.LookupEnv(Env)
	if !ok || role == "" {
		return
	}
	run, ok := roles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "testchild: unknown role %q\n", role)
		os.Exit(2)
	}
	os.Exit(run())
}

// Command is the test binary as a child running role, with this
// process's environment plus env ("KEY=value"; a later entry wins, so
// "KEY=" clears one). ctx kills the child when it ends. It runs no test
// (-test.run=^$) should the role not be dispatched. For a child that runs
// to completion (cmd.Output); Start is for one that runs beside the test.
func Command(ctx context.Context, role string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), Env+"="+role), env...)
	return cmd
}

// Child is a child process started by Start.
type Child struct {
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	once  sync.Once
}

// Start starts role as a child (see Command) that runs beside the test:
// its stdout is read with ReadLine or Expect, its stdin stays open until
// the test ends, and its stderr is this process's, so what a failing
// child says shows in the test's output. When the test ends the child's
// stdin is closed and the child is killed and reaped; how it exited is
// not checked, so a role reports a failure on stdout or stderr.
func Start(ctx context.Context, t testing.TB, role string, env ...string) *Child {
	t.Helper()
	cmd := Command(ctx, role, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), "start child %q", role)
	c := &Child{role: role, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(c.stop)
	return c
}

// stop ends the child and reaps it, once. Its errors are what killing a
// child gives (the process is gone, "signal: killed"), not the test's.
func (c *Child) stop() {
	c.once.Do(func() {
		c.stdin.Close()
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
}

// ReadLine returns the child's next line of output, without its newline.
// It fails the test if the child's stdout ends first, with what the
// child wrote of the line.
func (c *Child) ReadLine(t testing.TB) string {
	t.Helper()
	line, err := c.out.ReadString('\n')
	require.NoError(t, err, "child %q: stdout ended after %q", c.role, line)
	return strings.TrimSuffix(line, "\n")
}

// Expect reads the child's next line and fails the test unless it is
// want (a child that fails says why on that line, or on stderr).
func (c *Child) Expect(t testing.TB, want string) {
	t.Helper()
	require.Equal(t, want, c.ReadLine(t), "child %q", c.role)
}

// Stdin is the child's standard input, for a role that reads from its
// parent.
func (c *Child) Stdin() io.Writer { return c.stdin }

// Kill kills the child with SIGKILL now, as a crash would, and reaps
// it: when Kill returns the process is gone and its pipes are closed,
// so a test can count what it has left open.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	c.Signal(t, os.Kill)
	c.stop()
}

// Signal sends sig to the child.
func (c *Child) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig), "signal child %q", c.role)
}

// Pid is the child's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }
