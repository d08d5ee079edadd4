package testchild_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/testchild"
)

func TestMain(m *testing.M) {
	testchild.Main(map[string]func() int{
		"echo": echoChild,
		"hold": holdChild,
		"env":  func() int { fmt.Println(os.Getenv("TESTCHILD_X")); return 0 },
		"exit": func() int { return 3 },
	})
	goleak.VerifyTestMain(m)
}

// echoChild says "ready", then writes back each line of its stdin until
// it closes.
func echoChild() int {
	fmt.Println("ready")
	var line string
	for {
		if _, err := fmt.Scanln(&line); err != nil {
			return 0
		}
		fmt.Println(line)
	}
}

// holdChild says "ready" and reads nothing: only a signal ends it.
func holdChild() int {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	fmt.Println("ready")
	<-ch
	return 1
}

// Rule: a started child's stdout reads line by line and its stdin
// reaches it.
func TestStartTalks(t *testing.T) {
	c := testchild.Start(context.Background(), t, "echo")
	c.Expect(t, "ready")
	_, err := fmt.Fprintln(c.Stdin(), "hello")
	require.NoError(t, err)
	assert.Equal(t, "hello", c.ReadLine(t))
}

// Rule: the end of the test kills and reaps a child that would not end on
// its own.
func TestStartCleanupKills(t *testing.T) {
	var pid int
	t.Run("child", func(t *testing.T) {
		c := testchild.Start(context.Background(), t, "hold")
		c.Expect(t, "ready")
		pid = c.Pid()
		require.NoError(t, syscall.Kill(pid, 0), "the child runs")
	})
	// Reaped, so the process is gone, not a zombie.
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH)
}

// Rule: Kill ends the child at once and reaps it.
func TestKill(t *testing.T) {
	c := testchild.Start(context.Background(), t, "hold")
	c.Expect(t, "ready")
	c.Kill(t)
	assert.ErrorIs(t, syscall.Kill(c.Pid(), 0), syscall.ESRCH, "the child is gone, not a zombie")
}

// reap waits for the child pid to end and returns the signal that ended
// it. The cleanup's own wait then finds it gone, which it ignores.
func reap(t *testing.T, pid int) syscall.Signal {
	t.Helper()
	var ws syscall.WaitStatus
	_, err := syscall.Wait4(pid, &ws, 0, nil)
	require.NoError(t, err)
	require.True(t, ws.Signaled(), "child exited by itself: %v", ws)
	return ws.Signal()
}

// Rule: Command passes the role's exit code and env, a later entry
// winning; an unknown role exits 2.
func TestCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := testchild.Command(ctx, "env", "TESTCHILD_X=a", "TESTCHILD_X=b").Output()
	require.NoError(t, err)
	assert.Equal(t, "b\n", string(out))

	var exit *exec.ExitError
	require.ErrorAs(t, testchild.Command(ctx, "exit").Run(), &exit)
	assert.Equal(t, 3, exit.ExitCode())
	require.ErrorAs(t, testchild.Command(ctx, "nosuch").Run(), &exit)
	assert.Equal(t, 2, exit.ExitCode())
}

// Rule: the context bounds the child: its end kills it.
func TestStartContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := testchild.Start(ctx, t, "hold")
	c.Expect(t, "ready")
	cancel()
	assert.Equal(t, syscall.SIGKILL, reap(t, c.Pid()))
}
