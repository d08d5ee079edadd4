//go:build race

package sysfs

// raceOn: the race detector is on. It keeps the system calls' wrappers
// from being inlined, so a read's stack buffer moves to the heap, and
// allocation counts are no longer the release build's.
const raceOn = true
