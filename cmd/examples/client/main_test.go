package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer builds cmd/examples/server and runs it in its own process.
// stop sends SIGTERM and returns its exit code and output.
func startServer(t *testing.T) (addr string, stop func() (int, string)) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the server with")
	}
	bin := filepath.Join(t.TempDir(), "server")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if out, err := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/go-rdma/rdma/cmd/examples/server").CombinedOutput(); err != nil {
		t.Fatalf("building the server: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin, "-addr", "127.0.0.1:0", "-provider", "soft")
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read the address from the first line, then keep the rest.
	lines := bufio.NewReader(pipe)
	first, err := lines.ReadString('\n')
	m := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(first)
	if m == nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("server said %q (%v)", first, err)
	}
	rest := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(lines)
		rest <- string(b)
	}()
	stopped := false
	stop = func() (int, string) {
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		out := <-rest
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), first + out
		}
		if err != nil {
			t.Errorf("server: %v", err)
		}
		return 0, first + out
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return m[1], stop
}

func runClient(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb strings.Builder
	code = run(ctx, append(args, "-provider", "soft"), &out, &errb)
	return code, out.String(), errb.String()
}

// TestSession runs clients in this process against a server process.
func TestSession(t *testing.T) {
	addr, stop := startServer(t)

	code, out, errs := runClient(t, "-addr", addr, "-name", "alice")
	if code != 0 {
		t.Fatalf("exit code %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		"took ticket 0 from the shared counter",
		"HELLO -> WELCOME alice, you are client 1",
		"round 1: wrote 4096 bytes",
		"round 1: the server's SHA-256 matches ours",
		`round 1: read back the upper-cased bytes in`,
		`"ROUND 1 FROM ALICE: THE QUICK BR"`,
		"BYE -> BYE after 5 requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}

	code, out, errs = runClient(t, "-addr", addr, "-name", "bob", "-size", "100", "-rounds", "2", "-poll", "event")
	if code != 0 || !strings.Contains(out, "took ticket 1") || !strings.Contains(out, "round 2: the server's SHA-256 matches ours") {
		t.Fatalf("exit code %d\n%s%s", code, out, errs)
	}

	// More than the server exposes: the client refuses before using the
	// counter or writing.
	code, out, errs = runClient(t, "-addr", addr, "-size", "1000000")
	if code != 1 || !strings.Contains(errs, "exceeds the server's 65536-byte region") {
		t.Errorf("oversized: exit code %d\n%s%s", code, out, errs)
	}

	code, sout := stop()
	if code != 0 {
		t.Errorf("server exit code %d\n%s", code, sout)
	}
	for _, want := range []string{"shutting down", "done: 3 clients", "counter = 2", "client 1 (127.0.0.1:", "left after 5 requests"} {
		if !strings.Contains(sout, want) {
			t.Errorf("no %q in the server's output:\n%s", want, sout)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-addr", "x:1", "-size", "0"},
		{"-addr", "x:1", "-rounds", "-1"},
		{"-addr", "x:1", "-timeout", "0s"},
		{"-addr", "x:1", "-poll", "sometimes"},
		{"-addr", "x:1", "-provider", "magic"},
		{"-addr", "x:1", "extra"},
		{"-bogus"},
	} {
		var out, errb strings.Builder
		if code := run(context.Background(), args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage:") {
			t.Errorf("%q: exit code %d, want 2 with usage\n%s", args, code, errb.String())
		}
	}
}

func TestNoServer(t *testing.T) {
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	code, out, errs := runClient(t, "-addr", addr)
	if code != 1 || !strings.Contains(errs, "connection refused") {
		t.Errorf("exit code %d\n%s%s", code, out, errs)
	}
}
