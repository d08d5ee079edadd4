//go:build race

package rdma_test

// raceOn: the race detector is on. sync.Pool drops a quarter of what is
// put in it at random then, so allocation counts are no longer exact.
const raceOn = true
