package rdma

import (
	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
)

type (
	// Device describes an RDMA device: name, node GUID, transport, ports
	// and whether this build can use it.
	Device = verbs.DeviceInfo
	// Port describes one port of a device: state, link layer, MTU, GIDs.
	Port = verbs.PortInfo
	// GIDEntry is one used entry of a port's GID table with its type.
	GIDEntry = verbs.GIDEntry
	// GID is a 128-bit global identifier (an IP address on RoCE).
	GID = verbs.GID
	// GUID is a 64-bit EUI-64 identifier.
	GUID = verbs.GUID
	// MTU is an InfiniBand MTU enum; MTU.Bytes gives the size.
	MTU = verbs.MTU
	// PortState is the logical state of a port.
	PortState = verbs.PortState
)

// ErrNotSupported means the build, provider or device cannot do what was
// asked.
var ErrNotSupported = verbs.ErrNotSupported

// providers are the verbs providers in the order Devices lists them.
func providers() []verbs.Provider {
	return []verbs.Provider{ibv.Provider}
}

// Devices lists the RDMA devices of every provider. It reads sysfs and
// opens devices only to learn whether they are usable; on a machine
// without devices it returns an empty list and no error.
func Devices() ([]Device, error) {
	var all []Device
	for _, p := range providers() {
		devs, err := p.Devices()
		if err != nil {
			return nil, err
		}
		all = append(all, devs...)
	}
	return all, nil
}
