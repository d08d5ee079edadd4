package verbs

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// GID is a 128-bit global identifier. On RoCE it holds an IP address.
type GID [16]byte

// IP is the GID as an address; IPv4-mapped GIDs give the IPv4 address.
func (g GID) IP() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsZero reports whether g is all zeros (an unused table entry).
func (g GID) IsZero() bool { return g == GID{} }

func (g GID) String() string { return net.IP(g[:]).String() }

// GIDFromIP is the GID that carries addr (IPv4 addresses are mapped).
func GIDFromIP(addr netip.Addr) GID { return GID(addr.As16()) }

// IsMulticast reports whether g names a multicast group: an IPv4-mapped
// GID of an IPv4 multicast address (224.0.0.0/4, RoCE v2 over IPv4), or
// an IPv6 multicast GID (ff00::/8), as the kernel's rdma_is_multicast_addr
// decides.
func (g GID) IsMulticast() bool { return g.IP().IsMulticast() }

// MulticastQPN is the destination QP number of a datagram sent to a
// multicast group (0xFFFFFF).
const MulticastQPN uint32 = 0xffffff

// GUID is a 64-bit EUI-64 identifier.
type GUID uint64

// String formats g as ibv_devinfo does: four groups of four hex digits.
func (g GUID) String() string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(g))
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7])
}

// GIDType is a GID's type as sysfs gid_attrs/types names it.
type GIDType string

const (
	GIDTypeIB      GIDType = "IB/RoCE v1"
	GIDTypeRoCEv2  GIDType = "RoCE v2"
	GIDTypeUnknown GIDType = ""
)

// GIDEntry is one used entry of a port's GID table.
type GIDEntry struct {
	Index  int
	GID    GID
	Type   GIDType
	Netdev string // the network device behind a RoCE GID, if any
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Port      uint8
	State     PortState
	PhysState string // e.g. "5: LinkUp"
	LinkLayer string // "InfiniBand" or "Ethernet"
	LID       uint16
	ActiveMTU MTU // 0 if unknown
	MaxMTU    MTU // 0 if unknown
	Rate      string
	GIDs      []GIDEntry
}

// DeviceInfo describes a device as Devices lists it.
type DeviceInfo struct {
	Name      string
	Provider  string // "verbs" or "soft"
	NodeGUID  GUID
	NodeType  string // e.g. "CA"
	Transport string // "InfiniBand" (IB and RoCE), "iWARP", "software"
	FWVer     string
	Ports     []PortInfo
	// Usable is true when this build can open the device and one of its
	// ports is ACTIVE. A usable device still proves nothing about routes.
	Usable bool
	// Why is the reason a device is not usable.
	Why string
}

// DeviceAttr is what QueryDevice returns: the device's limits.
type DeviceAttr struct {
	FWVer           string
	NodeGUID        GUID
	VendorID        uint32
	VendorPartID    uint32
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxSGERd        int // SGEs an RDMA READ may scatter into (siw: 1)
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxSRQ          int
	MaxSRQWR        int
	MaxSRQSGE       int
	AtomicCap       int // 0 none, 1 atomic within this HCA, 2 global
	PhysPortCnt     int
	// MaxMcastGrp and MaxMcastQPAttach bound multicast: how many groups
	// the device has, and how many QPs one group takes (0 and 0 on a
	// device without multicast).
	MaxMcastGrp      int
	MaxMcastQPAttach int
}

// PortAttr is what QueryPort returns.
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	LID         uint16
	GIDTableLen int
	LinkLayer   string
	MaxMsgSize  uint32
}

// SelectGID picks the GID a connection should use on port p: on Ethernet
// the first RoCE v2 GID of the wanted family (IPv4 when v4 is true), on
// InfiniBand the first GID (the port GID). It reads types, never assumes
// an index.
func SelectGID(p PortInfo, v4 bool) (GIDEntry, error) {
	if p.LinkLayer != "Ethernet" {
		for _, g := range p.GIDs {
			if !g.GID.IsZero() {
				return g, nil
			}
		}
		return GIDEntry{}, fmt.Errorf("%w: port %d has no GID", ErrNoDevice, p.Port)
	}
	for _, g := range p.GIDs {
		if g.Type == GIDTypeRoCEv2 && !g.GID.IsZero() && g.GID.IP().Is4() == v4 {
			return g, nil
		}
	}
	fam := "IPv6"
	if v4 {
		fam = "IPv4"
	}
	return GIDEntry{}, fmt.Errorf("%w: port %d has no RoCE v2 %s GID", ErrNoDevice, p.Port, fam)
}
