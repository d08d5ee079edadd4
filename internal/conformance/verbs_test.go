package conformance

import (
	"testing"

	"github.com/go-rdma/rdma/internal/ibv"
)

// The verbs provider (libibverbs): the first two usable devices, or the
// first one twice; RDMA_TEST_VERBS_DEVICES="rxe0,rxe1" overrides.
func init() {
	register("verbs", func(t *testing.T) Target {
		a, b := pickDevices(t, ibv.Provider, "RDMA_TEST_VERBS_DEVICES")
		t.Logf("verbs provider: device A %s, device B %s", a, b)
		return Target{Provider: ibv.Provider, DeviceA: a, DeviceB: b}
	})
}
