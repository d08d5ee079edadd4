package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/leak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(leak.Checked(m)) }

// Rule: the README's main example runs every operation and succeeds on
// the provider this machine has (soft where no device exists).
func TestQuickstart(t *testing.T) {
	if err := run(200, 64<<10); err != nil {
		t.Fatal(err)
	}
}
