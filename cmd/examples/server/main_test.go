package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a bytes.Buffer that run may write from several goroutines
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until re matches b and returns its first group.
func waitFor(t *testing.T, b *syncBuffer, re *regexp.Regexp) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m[1]
		}
	}
	t.Fatalf("no %v in:\n%s", re, b.String())
	return ""
}

// buildClient builds cmd/examples/client into a temporary directory.
func buildClient(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the client with")
	}
	bin := filepath.Join(t.TempDir(), "client")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/go-rdma/rdma/cmd/examples/client").CombinedOutput(); err != nil {
		t.Fatalf("building the client: %v\n%s", err, out)
	}
	return bin
}

// startServer runs the server in-process; stop cancels it (as SIGINT
// would) and returns its exit code.
func startServer(t *testing.T, args ...string) (addr string, out *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	out = &syncBuffer{}
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-provider", "soft"}, args...), out, out)
	}()
	var once sync.Once
	var c int
	stop = func() int {
		once.Do(func() {
			cancel()
			c = <-code
		})
		return c
	}
	t.Cleanup(func() { stop() })
	addr = waitFor(t, out, regexp.MustCompile(`listening on (\S+)`))
	return addr, out, stop
}

// TestClients serves three client processes at once, each making a few
// rounds, and checks that they all succeed and share the counter.
func TestClients(t *testing.T) {
	client := buildClient(t)
	addr, out, stop := startServer(t, "-n", "3", "-region", "8192")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	outputs := make([]string, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, client, "-addr", addr, "-provider", "soft", "-name", "c"+strconv.Itoa(i), "-rounds", "3", "-size", "5000")
			b, err := cmd.CombinedOutput()
			outputs[i], errs[i] = string(b), err
		})
	}
	wg.Wait()
	var tickets []int
	for i, o := range outputs {
		if errs[i] != nil {
			t.Errorf("client %d: %v\n%s", i, errs[i], o)
			continue
		}
		for _, want := range []string{"round 3: the server's SHA-256 matches ours", "round 3: read back the upper-cased bytes", "BYE -> BYE after 9 requests"} {
			if !strings.Contains(o, want) {
				t.Errorf("client %d: no %q in:\n%s", i, want, o)
			}
		}
		if m := regexp.MustCompile(`took ticket (\d+)`).FindStringSubmatch(o); m != nil {
			n, _ := strconv.Atoi(m[1])
			tickets = append(tickets, n)
		}
	}
	slices.Sort(tickets)
	if !slices.Equal(tickets, []int{0, 1, 2}) {
		t.Errorf("tickets %v, want 0, 1, 2", tickets)
	}

	// With -n 3 the server exits by itself once the three are done.
	waitFor(t, out, regexp.MustCompile(`(done: 3 clients, 27 requests, counter = 3)`))
	if code := stop(); code != 0 {
		t.Errorf("server exit code %d\n%s", code, out)
	}
}

// TestShutdown interrupts the server while a client is busy: the server
// closes the connection and exits 0, the client fails with 1.
func TestShutdown(t *testing.T) {
	client := buildClient(t)
	addr, out, stop := startServer(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, client, "-addr", addr, "-provider", "soft", "-rounds", "1000000")
	var cout syncBuffer
	cmd.Stdout, cmd.Stderr = &cout, &cout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, out, regexp.MustCompile(`client 1 .*(UPPER 0 4096)`))
	if code := stop(); code != 0 {
		t.Errorf("server exit code %d\n%s", code, out)
	}
	for _, want := range []string{"shutting down: closing 1 connections", "closed by shutdown after", "done: 1 clients"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the server's output:\n%s", want, out)
		}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("client: %v, want exit code 1\n%s", err, cout.String())
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-addr"},
		{"-addr", ":0", "-n", "-1"},
		{"-addr", ":0", "-region", "1"},
		{"-addr", ":0", "-provider", "magic"},
		{"-addr", ":0", "-poll", "sometimes"},
		{"-addr", ":0", "extra"},
	} {
		var out, errb syncBuffer
		if code := run(context.Background(), args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage:") {
			t.Errorf("%q: exit code %d, want 2 with usage\n%s", args, code, errb.String())
		}
	}
	// Failing to listen is an error, not a usage problem.
	var out, errb syncBuffer
	if code := run(context.Background(), []string{"-addr", "256.0.0.1:1", "-provider", "soft"}, &out, &errb); code != 1 {
		t.Errorf("bad address: exit code %d, want 1\n%s", code, errb.String())
	}
}
