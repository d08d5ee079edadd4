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

var errNoVerbs = fmt.Errorf("ibv: %w: this build has no libibverbs support (built without cgo or not on Linux)", verbs.ErrNotSupported)

func (provider) Devices() ([]verbs.DeviceInfo, error) {
	devs, err := sysfs.Devices()
	for i := range devs {
		devs[i].Usable = false
		devs[i].Why = errNoVerbs.Error()
	}
	return devs, err
}

func (provider) Open(name string) (verbs.Context, error) {
	return nil, fmt.Errorf("ibv: open %q: %w", name, errNoVerbs)
}

// Available fails with verbs.ErrNotSupported: this build cannot open
// devices.
func Available() error { return errNoVerbs }
