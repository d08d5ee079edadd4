package rdmatest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a goroutine outlives the tests: the helpers'
// cleanups must leave nothing running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
