package main

import (
	"sync"
	"time"
)

var (
	calibrate   sync.Once
	nsPerCycles float64
)

// cycleNS is the length of one cycles() tick in nanoseconds, measured
// once against the monotonic clock over 50 ms (perftest reads the CPU
// frequency instead).
func cycleNS() float64 {
	calibrate.Do(func() {
		t0, c0 := time.Now(), cycles()
		time.Sleep(50 * time.Millisecond)
		t1, c1 := time.Now(), cycles()
		nsPerCycles = float64(t1.Sub(t0).Nanoseconds()) / float64(c1-c0)
	})
	return nsPerCycles
}

// slowAfter is the one-way latency from which a latency test calls
// slowRoundTrip.
const slowAfter = 1e6 // ns

// slowRoundTrip does nothing: it is where test/perf/switches.sh -W puts a
// uprobe to find the latency tests' slow round trips (d, the one-way
// latency in ns, in the first argument's register) in the scheduler's
// record of the run.
//
//go:noinline
func slowRoundTrip(d int64) { _ = d }
