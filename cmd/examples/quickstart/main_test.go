package main

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Rule: the README's main example runs every operation and succeeds on
// the provider this machine has (soft where no device exists).
func TestQuickstart(t *testing.T) {
	if err := run(200, 64<<10); err != nil {
		t.Fatal(err)
	}
}
