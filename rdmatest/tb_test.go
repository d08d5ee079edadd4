package rdmatest_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// fakeTB is the part of testing.TB the helpers use, for what go test
// cannot hand a *testing.T: an example, and a test of how a helper
// fails. It records failures instead of reporting them.
type fakeTB struct {
	testing.TB // nil: a method the helpers are not meant to use panics

	mu       sync.Mutex
	failed   bool
	logs     []string
	cleanups []func()
}

func (t *fakeTB) Helper() {}

func (t *fakeTB) Name() string { return "fakeTB" }

func (t *fakeTB) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	t.logs = append(t.logs, fmt.Sprintf(format, args...))
}

func (t *fakeTB) Logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.logs = append(t.logs, fmt.Sprintf(format, args...))
}

// FailNow ends the goroutine, as testing.T's does; run started it.
func (t *fakeTB) FailNow() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	runtime.Goexit()
}

func (t *fakeTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *fakeTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// run calls test with a fakeTB as go test calls a test function: on a
// goroutine of its own (FailNow ends it), then the cleanups, last
// registered first, each on its own goroutine so that one that fails
// does not stop the rest. It returns the fakeTB to look at.
func run(test func(t testing.TB)) *fakeTB {
	t := &fakeTB{}
	onGoroutine(func() { test(t) })
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return t
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		onGoroutine(f)
	}
}

func onGoroutine(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// runExample is run for an example: it prints what test logged, and
// FAIL if it failed, which no example's output has.
func runExample(test func(t testing.TB)) {
	t := run(test)
	for _, l := range t.logs {
		fmt.Println(l)
	}
	if t.Failed() {
		fmt.Println("FAIL")
	}
}
