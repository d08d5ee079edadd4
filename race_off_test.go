//go:build !race

package rdma_test

// raceOn: the race detector is on (race_on_test.go).
const raceOn = false
