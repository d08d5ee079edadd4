//go:build !amd64

package main

import "time"

var cyclesBase = time.Now()

// cycles is nanoseconds from the monotonic clock where there is no TSC
// reader.
func cycles() uint64 { return uint64(time.Since(cyclesBase)) }
