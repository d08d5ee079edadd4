package ud

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes what it opens: endpoints, engines and the soft
// provider's listener are gone at the end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
