package rdma_test

import (
	"testing"

	"github.com/go-rdma/rdma"
)

// Rule: Devices never fails on a machine without devices; it lists what
// there is, each device with its provider and ports.
func TestDevices(t *testing.T) {
	devs, err := rdma.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for _, d := range devs {
		if d.Name == "" || (d.Provider != "verbs" && d.Provider != "soft") {
			t.Errorf("device %+v: missing name or unknown provider", d)
		}
		if d.Usable && len(d.Ports) == 0 {
			t.Errorf("device %s is usable but has no ports", d.Name)
		}
		if !d.Usable && d.Why == "" {
			t.Errorf("device %s is not usable and says no reason", d.Name)
		}
	}
}
