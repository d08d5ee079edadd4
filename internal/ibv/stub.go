//go:build !(linux && cgo)

package ibv

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/sysfs"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Provider is the libibverbs provider. This build has no cgo or is not
// Linux, so it can only list devices.
var Provider verbs.Provider = provider{}

type provider struct{}

func (provider) Name() string { return "verbs" }

func (provider) Devices() ([]verbs.DeviceInfo, error) {
	devs, err := sysfs.Devices()
	for i := range devs {
		devs[i].Usable = false
		devs[i].Why = "this build has no libibverbs support (built without cgo or not on Linux)"
	}
	return devs, err
}

func (provider) Open(name string) (verbs.Context, error) {
	return nil, fmt.Errorf("ibv: open %q: %w: this build has no libibverbs support (built without cgo or not on Linux)", name, verbs.ErrNotSupported)
}

// Supported is false: this build cannot open devices.
const Supported = false
