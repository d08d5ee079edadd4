package rdma

import (
	"net/netip"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Device describes an RDMA device as Devices lists it. Text fields hold
// what the provider reports (for verbs devices, what sysfs says) and are
// empty when it reports nothing.
type Device struct {
	Name      string // e.g. "mlx5_0", "rxe0"; the soft device is "soft0"
	Provider  string // ProviderVerbs or ProviderSoft
	NodeGUID  GUID   // the node GUID; zero if the device has none
	NodeType  string // e.g. "CA" (a channel adapter) or "RNIC" (iWARP)
	Transport string // "InfiniBand" (IB and RoCE), "iWARP" or "software"
	FWVer     string // the firmware version
	Ports     []Port // in port number order
	// Usable is true when this build can open the device and one of its
	// ports is ACTIVE. A usable device still proves nothing about routes.
	Usable bool
	// Why is the reason a device is not usable; empty when it is.
	Why string
}

// Port describes one port of a device.
type Port struct {
	Port      uint8     // the port number, from 1 (WithPort)
	State     PortState // connections need PortActive
	PhysState string    // the physical state as sysfs writes it, e.g. "5: LinkUp"
	LinkLayer string    // "InfiniBand" or "Ethernet" (RoCE and the soft device)
	// LID is the port's InfiniBand local identifier; 0 on Ethernet. The
	// soft device shows the TCP port its wire listens on, 0 before it
	// listens.
	LID       uint16
	ActiveMTU MTU        // the MTU in use; 0 if unknown
	MaxMTU    MTU        // the largest MTU the port supports; 0 if unknown
	Rate      string     // the link rate as sysfs writes it, e.g. "100 Gb/sec (4X EDR)"
	GIDs      []GIDEntry // the used entries of the GID table, in index order
}

// GIDEntry is one used entry of a port's GID table.
type GIDEntry struct {
	Index  int     // the entry's index in the table
	GID    GID     // never zero: unused entries are not listed
	Type   GIDType // the RoCE version; GIDTypeUnknown where sysfs says none
	Netdev string  // the network device behind a RoCE GID; empty if none
}

// GID is a 128-bit global identifier: an InfiniBand port's address, or
// on RoCE an IPv6 or IPv4-mapped address of the network device.
type GID [16]byte

// IP is the GID as an address; IPv4-mapped GIDs give the IPv4 address.
func (g GID) IP() netip.Addr { return verbs.GID(g).IP() }

// IsZero reports whether g is all zeros, as unused table entries are.
func (g GID) IsZero() bool { return g == GID{} }

// String formats g as an IP address, as ibv_devinfo does.
func (g GID) String() string { return verbs.GID(g).String() }

// GUID is a 64-bit EUI-64 identifier, such as a device's node GUID.
type GUID uint64

// String formats g as ibv_devinfo does: four groups of four hex digits.
func (g GUID) String() string { return verbs.GUID(g).String() }

// GIDType is the type of a GID table entry, as sysfs gid_attrs/types
// names it. RoCE connections use RoCE v2 entries.
type GIDType string

// GID types.
const (
	GIDTypeIB      GIDType = "IB/RoCE v1" // InfiniBand, or RoCE v1 on Ethernet
	GIDTypeRoCEv2  GIDType = "RoCE v2"    // RoCE v2: routable, over UDP/IP
	GIDTypeUnknown GIDType = ""           // sysfs names no type
)

// MTU is an InfiniBand path MTU, as the verbs enum numbers it (1 for 256
// bytes up to 5 for 4096 bytes); Bytes gives the size. Zero means
// unknown.
type MTU uint8

// MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, or 0 if m is not a valid MTU.
func (m MTU) Bytes() int { return verbs.MTU(m).Bytes() }

// String is the MTU in bytes ("4096"), or "MTU(n)" for an invalid m.
func (m MTU) String() string { return verbs.MTU(m).String() }

// PortState is the logical state of a port, as the verbs enum numbers
// it.
type PortState uint8

// Port states.
const (
	PortNop         PortState = 0 // reserved: no state
	PortDown        PortState = 1 // no link
	PortInit        PortState = 2 // link up, not yet configured by the subnet manager
	PortArmed       PortState = 3 // configured, not yet active
	PortActive      PortState = 4 // passes traffic
	PortActiveDefer PortState = 5 // link down for a moment; recovering
)

// String is the state's name as ibv_devinfo shows it after "PORT_"
// ("ACTIVE"), or "PortState(n)" for an unknown s.
func (s PortState) String() string { return verbs.PortState(s).String() }

// deviceFrom is the public description of a device a provider listed.
// Its Ports and their GIDs hold verbs types, so Device(d) cannot
// convert it; TestDeviceTypesInStep fails if a field of either side has
// no counterpart.
func deviceFrom(d verbs.DeviceInfo) Device {
	return Device{
		Name:      d.Name,
		Provider:  d.Provider,
		NodeGUID:  GUID(d.NodeGUID),
		NodeType:  d.NodeType,
		Transport: d.Transport,
		FWVer:     d.FWVer,
		Ports:     convertAll(d.Ports, portFrom),
		Usable:    d.Usable,
		Why:       d.Why,
	}
}

func portFrom(p verbs.PortInfo) Port {
	return Port{
		Port:      p.Port,
		State:     PortState(p.State),
		PhysState: p.PhysState,
		LinkLayer: p.LinkLayer,
		LID:       p.LID,
		ActiveMTU: MTU(p.ActiveMTU),
		MaxMTU:    MTU(p.MaxMTU),
		Rate:      p.Rate,
		GIDs:      convertAll(p.GIDs, gidEntryFrom),
	}
}

func gidEntryFrom(g verbs.GIDEntry) GIDEntry {
	return GIDEntry{Index: g.Index, GID: GID(g.GID), Type: GIDType(g.Type), Netdev: g.Netdev}
}

// convertAll applies f to every element of xs; nil stays nil.
func convertAll[T, U any](xs []T, f func(T) U) []U {
	if xs == nil {
		return nil
	}
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
