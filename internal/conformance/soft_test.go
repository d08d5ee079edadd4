package conformance

import (
	"testing"

	"github.com/go-rdma/rdma/internal/soft"
)

// The soft provider (pure Go): its usable devices, normally soft0 used as
// both A and B; RDMA_TEST_SOFT_DEVICES="a,b" overrides.
func init() {
	register("soft", func(t *testing.T) Target {
		a, b := pickDevices(t, soft.Provider, "RDMA_TEST_SOFT_DEVICES")
		t.Logf("soft provider: device A %s, device B %s", a, b)
		return Target{Provider: soft.Provider, DeviceA: a, DeviceB: b}
	})
}
