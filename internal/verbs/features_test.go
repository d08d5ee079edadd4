package verbs_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Lacks answers from what the device reports: siw (iWARP, atomic_cap
// NONE, siw's vendor id), rxe (RoCE, atomics) and a device without SRQs.
func TestLacks(t *testing.T) {
	siw := verbs.DeviceInfo{Name: "siw0", Transport: "iWARP"}
	siwAttr := verbs.DeviceAttr{VendorID: 0x626d74, MaxSRQ: 1024}
	rxe := verbs.DeviceInfo{Name: "rxe0", Transport: "InfiniBand"}
	rxeAttr := verbs.DeviceAttr{AtomicCap: 1, MaxSRQ: 1024, MaxMcastGrp: 8192, MaxMcastQPAttach: 56}
	for _, f := range verbs.Features {
		require.NoError(t, verbs.Lacks(rxe, rxeAttr, f), "rxe has %s", f)
		err := verbs.Lacks(siw, siwAttr, f)
		if f == verbs.FeatureSRQ {
			assert.NoError(t, err, "siw has SRQs")
			continue
		}
		require.Error(t, err, "siw lacks %s", f)
		assert.True(t, errors.Is(err, verbs.ErrNotSupported), "%v wraps ErrNotSupported", err)
		assert.True(t, strings.Contains(err.Error(), string(f)) && strings.Contains(err.Error(), "siw0"), "%q names the feature and the device", err)
	}
	err := verbs.Lacks(rxe, verbs.DeviceAttr{AtomicCap: 1}, verbs.FeatureSRQ)
	assert.ErrorIs(t, err, verbs.ErrNotSupported, "max_srq 0: no SRQs")
	err = verbs.Lacks(rxe, verbs.DeviceAttr{AtomicCap: 1, MaxSRQ: 1}, verbs.FeatureMulticast)
	assert.ErrorIs(t, err, verbs.ErrNotSupported, "max_mcast_grp 0: no multicast")
	assert.ErrorContains(t, err, "max_mcast_grp 0")
	assert.ErrorIs(t, verbs.Lacks(rxe, rxeAttr, verbs.Feature("teleport")), verbs.ErrInvalid)
}
