//go:build !(linux && (cgo || amd64 || arm64))

package ibv

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/sysfs"
	"github.com/go-rdma/rdma/internal/verbs"
)

// This build is not Linux, or has neither cgo nor purego (CGO_ENABLED=0
// off amd64 and arm64), so the provider can only list devices.

var errNoVerbs = fmt.Errorf("ibv: %w: this build has no libibverbs support (not Linux, or CGO_ENABLED=0 on an architecture purego does not call C on)", verbs.ErrNotSupported)

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
