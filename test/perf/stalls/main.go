// Command stalls measures how often the machine takes a CPU away from a
// thread that never blocks: N goroutines, each locked to its OS thread,
// read the clock in a loop for the given time and count the gaps between
// consecutive reads of 5-15 µs, 15-50 µs and 50 µs or more. On an idle
// machine the gaps are interrupts (the local timer's above all) and, in
// a virtual machine, the host's own work; a wait on soft that takes a
// few microseconds inherits every such gap that falls inside it, so the
// count per second is the floor under the 99th percentiles of
// test/perf/gowaits.sh and scripts/bench-ab.sh.
//
// Usage: go run ./test/perf/stalls [-n THREADS] [-d DURATION]
package main

import (
	"flag"
	"fmt"
	"runtime"
	"sync"
	"time"
)

type gaps struct{ small, mid, large int }

func spin(d time.Duration) gaps {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var g gaps
	start := time.Now()
	last := start
	for {
		now := time.Now()
		switch gap := now.Sub(last); {
		case gap >= 50*time.Microsecond:
			g.large++
		case gap >= 15*time.Microsecond:
			g.mid++
		case gap >= 5*time.Microsecond:
			g.small++
		}
		last = now
		if now.Sub(start) >= d {
			return g
		}
	}
}

func main() {
	n := flag.Int("n", 1, "spinning threads")
	d := flag.Duration("d", 2*time.Second, "how long each spins")
	flag.Parse()
	res := make([]gaps, *n)
	var wg sync.WaitGroup
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = spin(*d)
		}()
	}
	wg.Wait()
	sec := d.Seconds()
	for i, g := range res {
		fmt.Printf("stalls: thread %d of %d: gaps per second 5-15 us %.0f, 15-50 us %.0f, >= 50 us %.0f\n",
			i+1, *n, float64(g.small)/sec, float64(g.mid)/sec, float64(g.large)/sec)
	}
}
