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
