// Package leak tracks rdma.Buffer handles in tests, as cilium/ebpf's
// testmain tracks file descriptors: when enabled, every handle records
// the stack that made it, Release forgets it, and the GC safety net that
// returns an unreleased handle's memory reports it. A test binary's
// TestMain enables it and calls Check after m.Run.
//
// Disabled (the default, and always outside tests) every hook is one
// atomic load.
package leak

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

var enabled atomic.Bool

var (
	mu        sync.Mutex
	live      = map[any]*site{} // handles made and not released
	collected []*site           // handles the GC found unreleased
)

// site is where a handle was made: its stack, formatted only when it is
// reported.
type site struct {
	pcs     [32]uintptr
	n       int
	claimed bool // Claim moved it to the goroutine that took ownership
	order   uint64
}

var seq uint64 // under mu: keeps reports in allocation order

// Enable turns tracking on. Handles made before it are not tracked.
func Enable() { enabled.Store(true) }

// Enabled reports whether tracking is on.
func Enabled() bool { return enabled.Load() }

// Track records the caller's stack for key (the handle's memory, which
// no other live handle shares). skip is the number of frames above
// Track's caller to leave out.
func Track(key any, skip int) {
	if enabled.Load() {
		track(key, skip+1)
	}
}

func track(key any, skip int) {
	s := &site{}
	s.n = runtime.Callers(skip+2, s.pcs[:])
	mu.Lock()
	seq++
	s.order = seq
	live[key] = s
	mu.Unlock()
}

// Claim records the caller's stack for key once, replacing the one
// Track recorded: for a received buffer, Track runs on the poller that
// delivered it and Claim where the application takes it.
func Claim(key any, skip int) {
	if !enabled.Load() {
		return
	}
	mu.Lock()
	s := live[key]
	if s == nil || s.claimed {
		mu.Unlock()
		return
	}
	s.claimed = true
	mu.Unlock()
	var pcs [32]uintptr
	n := runtime.Callers(skip+2, pcs[:])
	mu.Lock()
	if live[key] == s {
		s.pcs, s.n = pcs, n
	}
	mu.Unlock()
}

// Forget drops key: its handle was released. Call it before the memory
// can be handed to another handle.
func Forget(key any) {
	if enabled.Load() {
		mu.Lock()
		delete(live, key)
		mu.Unlock()
	}
}

// Collected reports that the GC found key's handle unreachable and not
// released. Call it before the memory can be handed to another handle.
func Collected(key any) {
	if !enabled.Load() {
		return
	}
	mu.Lock()
	if s := live[key]; s != nil {
		delete(live, key)
		collected = append(collected, s)
	}
	mu.Unlock()
}

// Leak is one handle that was never released.
type Leak struct {
	// Collected is true when the GC found the handle unreachable (the
	// safety net returned its memory), false when it is still reachable.
	Collected bool
	// Site is the first frame outside the library and the runtime,
	// "file:line", preferring a _test.go file: where the test made or
	// took the handle.
	Site string
	// Stack is the whole stack, one "function\n\tfile:line" per frame.
	Stack string
	order uint64
}

// Leaks returns the handles made since Enable and not released: those the
// GC collected and those still reachable, oldest first.
func Leaks() []Leak {
	mu.Lock()
	var out []Leak
	for _, s := range collected {
		out = append(out, s.leak(true))
	}
	for _, s := range live {
		out = append(out, s.leak(false))
	}
	mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].order < out[j].order })
	return out
}

// Mark is a point in the sequence of tracked handles, for Take.
type Mark uint64

// Now returns the current mark.
func Now() Mark {
	mu.Lock()
	defer mu.Unlock()
	return Mark(seq)
}

// Take removes and returns the leaks among the handles made after m, for
// a test that leaks on purpose; oldest first. Tests that leak must not
// run in parallel with others.
func Take(m Mark) []Leak {
	mu.Lock()
	var out []Leak
	keep := collected[:0]
	for _, s := range collected {
		if s.order > uint64(m) {
			out = append(out, s.leak(true))
		} else {
			keep = append(keep, s)
		}
	}
	clear(collected[len(keep):])
	collected = keep
	for k, s := range live {
		if s.order > uint64(m) {
			out = append(out, s.leak(false))
			delete(live, k)
		}
	}
	mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].order < out[j].order })
	return out
}

func (s *site) leak(gc bool) Leak {
	l := Leak{Collected: gc, order: s.order}
	var b strings.Builder
	var first, firstTest string
	frames := runtime.CallersFrames(s.pcs[:s.n])
	for {
		f, more := frames.Next()
		fmt.Fprintf(&b, "%s\n\t%s:%d\n", f.Function, f.File, f.Line)
		at := fmt.Sprintf("%s:%d", f.File, f.Line)
		if firstTest == "" && strings.HasSuffix(f.File, "_test.go") {
			firstTest = at
		}
		if first == "" && !library(f.Function) {
			first = at
		}
		if !more {
			break
		}
	}
	l.Stack = b.String()
	l.Site = firstTest
	if l.Site == "" {
		l.Site = first
	}
	if l.Site == "" {
		l.Site = "(no caller outside the library: see the stack)"
	}
	return l
}

// library reports whether fn is the rdma library's own code or the
// runtime's: frames to look past for the allocation site.
func library(fn string) bool {
	for _, p := range []string{"runtime.", "testing.", "github.com/go-rdma/rdma."} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return strings.HasPrefix(fn, "github.com/go-rdma/rdma/") && !strings.Contains(fn, "_test.")
}

// Check runs the GC so that unreachable handles are collected, then
// writes every leak to w and returns how many there were.
func Check(w io.Writer) int {
	runtime.GC()
	runtime.GC() // a second cycle: cleanups queued by the first have run or will
	leaks := Leaks()
	for _, l := range leaks {
		how := "not garbage collected yet"
		if l.Collected {
			how = "garbage collected; the safety net returned its memory"
		}
		fmt.Fprintf(w, "leak: rdma.Buffer never released (%s), allocated at %s\n%s\n", how, l.Site, indent(l.Stack))
	}
	if len(leaks) > 0 {
		fmt.Fprintf(w, "leak: %d rdma.Buffer handle(s) never released\n", len(leaks))
	}
	return len(leaks)
}

// ExitCode is the exit code of a test binary whose tests passed but left
// a handle unreleased, as cilium/ebpf's testmain exits for a leaked fd.
const ExitCode = 99

// M is what TestMain runs: a *testing.M.
type M interface{ Run() int }

// Checked enables tracking and returns m with a Run that, after the
// tests, fails a passing run with ExitCode if any handle made during it
// was never released, printing where each was made to stderr. Use it as
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(leak.Checked(m)) }
//
// or os.Exit(leak.Checked(m).Run()). A run with -test.bench is not
// tracked: a stack per handle would be what the benchmarks measure.
func Checked(m M) M {
	if !flag.Parsed() {
		flag.Parse() // testing's flags, registered by testing.MainStart
	}
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		Enable()
	}
	return checked{m}
}

type checked struct{ m M }

func (c checked) Run() int {
	code := c.m.Run()
	if Check(os.Stderr) > 0 && code == 0 {
		code = ExitCode
	}
	return code
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n\t")
}
