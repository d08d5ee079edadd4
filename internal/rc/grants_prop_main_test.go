package rc

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes what it opens: the engines of the credit rig
// (grants_prop_rig_test.go), the soft provider's listener and the
// pool's goroutines are gone at the end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
