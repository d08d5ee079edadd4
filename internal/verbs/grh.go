package verbs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// GRHForm is what the 40 bytes in front of a UD receive hold. The work
// completion does not say it (libibverbs' ibv_wc has no network header
// type; the kernel's ib_wc does, but it does not reach user space), so
// ParseGRH tells the forms apart by their bytes, as the kernel's
// ib_get_rdma_header_version and libibverbs' ibv_init_ah_from_wc do.
type GRHForm uint8

const (
	// GRHIPv6 is InfiniBand's GRH, which RoCE v2 over IPv6 shares: an
	// IPv6 header, the source GID at bytes 8..23 and the destination GID
	// at bytes 24..39.
	GRHIPv6 GRHForm = 6
	// GRHIPv4 is RoCE v2 over IPv4: bytes 20..39 are the packet's IPv4
	// header (rxe writes it so); bytes 0..19 are undefined.
	GRHIPv4 GRHForm = 4
)

func (f GRHForm) String() string {
	switch f {
	case GRHIPv6:
		return "IPv6"
	case GRHIPv4:
		return "IPv4"
	}
	return fmt.Sprintf("GRHForm(%d)", uint8(f))
}

// GRH is the global route header of a UD receive, parsed.
type GRH struct {
	Form GRHForm
	// Src and Dst are the source and destination: IPv4 addresses in the
	// IPv4 form, the GIDs as 16-byte addresses in the IPv6 form (an
	// IPv4-mapped GID stays mapped: Unmap it to compare with an IPv4
	// address). Dst is the group's address for a multicast datagram.
	Src, Dst netip.Addr
	// TrafficClass is the IPv6 traffic class or the IPv4 TOS byte.
	TrafficClass uint8
	// FlowLabel is the IPv6 flow label (0 in the IPv4 form).
	FlowLabel uint32
	// PayloadLen is what the header says follows it: the IPv6 payload
	// length, or the IPv4 total length less the 20-byte header.
	PayloadLen int
	// NextHeader is the IPv6 next header or the IPv4 protocol: 17 (UDP)
	// on RoCE v2, 0x1b (the IB transport header) on InfiniBand.
	NextHeader uint8
	// HopLimit is the IPv6 hop limit or the IPv4 TTL.
	HopLimit uint8
}

// SrcGID is the sender's GID, as an address handle back to it names it
// (an IPv4 source is mapped).
func (g GRH) SrcGID() GID { return GIDFromIP(g.Src) }

// DstGID is the destination GID (an IPv4 destination is mapped).
func (g GRH) DstGID() GID { return GIDFromIP(g.Dst) }

// Next header and protocol numbers of the two forms.
const (
	GRHNextUDP   = 17   // RoCE v2
	GRHNextIBBTH = 0x1b // InfiniBand, RoCE v1
)

// ParseGRH parses the first GRHSize bytes of a UD receive. It decides the
// form as the kernel does: an IPv6 version nibble at byte 0 means the IPv6
// form unless bytes 20..39 are an option-less IPv4 header with a valid
// checksum (bytes 0..19 of the IPv4 form are undefined and may look like
// anything); any other nibble means the IPv4 form if byte 20 starts an
// option-less IPv4 header. Anything else is an error wrapping ErrInvalid.
func ParseGRH(b []byte) (GRH, error) {
	if len(b) < GRHSize {
		return GRH{}, fmt.Errorf("%w: GRH of %d bytes, want %d", ErrInvalid, len(b), GRHSize)
	}
	b = b[:GRHSize]
	v4 := b[20:]
	isV4 := v4[0] == 0x45 // version 4, IHL 5: RoCE v2 has no IP options
	if b[0]>>4 == 6 {
		if isV4 && ipv4HeaderSum(v4) == 0xffff {
			return parseIPv4(v4), nil
		}
		return parseIPv6(b), nil
	}
	if isV4 {
		return parseIPv4(v4), nil
	}
	return GRH{}, fmt.Errorf("%w: GRH is neither form: IP version nibble %d at byte 0 and %d at byte 20 (want 6 at 0, or 4 with a 20-byte header at 20)",
		ErrInvalid, b[0]>>4, v4[0]>>4)
}

func parseIPv6(b []byte) GRH {
	w := binary.BigEndian.Uint32(b[0:4])
	return GRH{
		Form:         GRHIPv6,
		Src:          netip.AddrFrom16([16]byte(b[8:24])),
		Dst:          netip.AddrFrom16([16]byte(b[24:40])),
		TrafficClass: uint8(w >> 20),
		FlowLabel:    w & 0xfffff,
		PayloadLen:   int(binary.BigEndian.Uint16(b[4:6])),
		NextHeader:   b[6],
		HopLimit:     b[7],
	}
}

func parseIPv4(h []byte) GRH {
	return GRH{
		Form:         GRHIPv4,
		Src:          netip.AddrFrom4([4]byte(h[12:16])),
		Dst:          netip.AddrFrom4([4]byte(h[16:20])),
		TrafficClass: h[1],
		PayloadLen:   max(int(binary.BigEndian.Uint16(h[2:4]))-20, 0),
		NextHeader:   h[9],
		HopLimit:     h[8],
	}
}

// ipv4HeaderSum is the ones' complement sum of the 20-byte header h,
// folded: 0xffff when its checksum is right.
func ipv4HeaderSum(h []byte) uint16 {
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// Put writes g into b[:GRHSize] in its form, as a device writes it in
// front of a UD receive: the IPv4 form zeroes bytes 0..19 and writes a
// 20-byte IPv4 header (don't-fragment, with its checksum) at byte 20;
// the IPv6 form writes the IPv6 header with the two GIDs. Src and Dst
// must be IPv4 addresses for the IPv4 form (mapped ones are unmapped).
// It is ParseGRH's inverse, for providers without a device (soft) and
// for tests.
func (g GRH) Put(b []byte) error {
	if len(b) < GRHSize {
		return fmt.Errorf("%w: GRH of %d bytes, want %d", ErrInvalid, len(b), GRHSize)
	}
	b = b[:GRHSize]
	switch g.Form {
	case GRHIPv6:
		if g.FlowLabel > 0xfffff || g.PayloadLen < 0 || g.PayloadLen > 0xffff {
			return fmt.Errorf("%w: IPv6 GRH: flow label %#x or payload length %d out of range", ErrInvalid, g.FlowLabel, g.PayloadLen)
		}
		binary.BigEndian.PutUint32(b[0:4], 6<<28|uint32(g.TrafficClass)<<20|g.FlowLabel)
		binary.BigEndian.PutUint16(b[4:6], uint16(g.PayloadLen))
		b[6], b[7] = g.NextHeader, g.HopLimit
		s, d := g.Src.As16(), g.Dst.As16()
		copy(b[8:24], s[:])
		copy(b[24:40], d[:])
	case GRHIPv4:
		src, dst := g.Src.Unmap(), g.Dst.Unmap()
		if !src.Is4() || !dst.Is4() || g.FlowLabel != 0 || g.PayloadLen < 0 || g.PayloadLen > 0xffff-20 {
			return fmt.Errorf("%w: IPv4 GRH from %v to %v, flow label %#x, payload length %d", ErrInvalid, g.Src, g.Dst, g.FlowLabel, g.PayloadLen)
		}
		clear(b[:20])
		h := b[20:]
		h[0], h[1] = 0x45, g.TrafficClass
		binary.BigEndian.PutUint16(h[2:4], uint16(20+g.PayloadLen))
		binary.BigEndian.PutUint16(h[4:6], 0)      // identification
		binary.BigEndian.PutUint16(h[6:8], 0x4000) // don't fragment
		h[8], h[9] = g.HopLimit, g.NextHeader
		binary.BigEndian.PutUint16(h[10:12], 0)
		s, d := src.As4(), dst.As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		binary.BigEndian.PutUint16(h[10:12], ^ipv4HeaderSum(h))
	default:
		return fmt.Errorf("%w: GRH form %v", ErrInvalid, g.Form)
	}
	return nil
}
