package rdma

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
)

// debugEnv turns on debug checks: GORDMA_DEBUG=futures (a comma-separated
// list, as GODEBUG's) makes released futures never reused and reports
// every use of one after its Release (Future).
const debugEnv = "GORDMA_DEBUG"

// futureDebugger reports uses of released futures; futureDebug holds
// one while the check is on, nil when it is off (the default: Release
// then reads one atomic more, and nothing else on the hot path).
type futureDebugger struct {
	report func(string) // one report, with its stacks
}

var futureDebug atomic.Pointer[futureDebugger]

func init() {
	for _, w := range strings.Split(os.Getenv(debugEnv), ",") {
		if strings.TrimSpace(w) == "futures" {
			futureDebug.Store(&futureDebugger{report: func(s string) { os.Stderr.WriteString(s) }})
		}
	}
}

// releasedError is a released future's error under GORDMA_DEBUG=futures:
// ErrFutureReleased, and where the Release was.
type releasedError struct{ at []uintptr }

func (e *releasedError) Error() string {
	if fr, ok := runtime.CallersFrames(e.at).Next(); ok {
		return fmt.Sprintf("%v: Release called by %s at %s:%d", ErrFutureReleased, fr.Function, fr.File, fr.Line)
	}
	return ErrFutureReleased.Error()
}

func (e *releasedError) Unwrap() error { return ErrFutureReleased }

// callers is the stack of the caller skip frames up (runtime.Callers'
// skip), bounded.
func callers(skip int) []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(skip+1, pcs)]
}

// usedAfterRelease reports a use of the released future f by the method
// that calls it, when the debug check is on. Called on the path of a
// released future only; it takes no argument, and finds the method in
// its stack, to keep the methods small enough to inline.
func (f *Future) usedAfterRelease() {
	d := futureDebug.Load()
	if d == nil {
		return
	}
	method := "?"
	if fr, _ := runtime.CallersFrames(callers(2)).Next(); fr.Function != "" {
		method = fr.Function[strings.LastIndex(fr.Function, ".")+1:]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rdma: Future.%s after Release (%s=futures)\nused at:\n", method, debugEnv)
	writeStack(&b, callers(3)) // the caller of f's method
	if re, ok := f.err.(*releasedError); ok {
		b.WriteString("released at:\n")
		writeStack(&b, re.at)
	} else {
		// Released before the check was turned on.
		b.WriteString("released at: unknown\n")
	}
	d.report(b.String())
}

// writeStack writes pcs as a goroutine's trace shows them: a function a
// line, its file and line under it.
func writeStack(b *strings.Builder, pcs []uintptr) {
	frames := runtime.CallersFrames(pcs)
	for {
		fr, more := frames.Next()
		if fr.Function != "" {
			fmt.Fprintf(b, "\t%s\n\t\t%s:%d\n", fr.Function, fr.File, fr.Line)
		}
		if !more {
			return
		}
	}
}
