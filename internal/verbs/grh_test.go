package verbs_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-rdma/rdma/internal/verbs"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The GRHs below are written out byte by byte, as the devices write them:
// rxe's IPv4 form (bytes 0..19 zero, then the packet's IPv4 header with
// its checksum), an IPv4 form whose undefined first bytes start with a 6,
// InfiniBand's GRH, and an IPv6 GRH whose byte 20 happens to be 0x45.
func TestParseGRH(t *testing.T) {
	zero20 := strings.Repeat("00", 20)
	// 10.99.0.1 -> 10.99.0.2, total length 0x0154, DF, TTL 64, UDP; the
	// checksum from checksum below.
	v4hdr := "4500 0154 0000 4000 4011 %s 0a63 0001 0a63 0002"
	sum := checksum(mustHex(t, strings.ReplaceAll(strings.Replace(v4hdr, "%s", "0000", 1), " ", "")))
	v4 := strings.Replace(v4hdr, "%s", hex.EncodeToString([]byte{byte(sum >> 8), byte(sum)}), 1)
	ib := "6000 0000 0130 1b40" + " fe80 0000 0000 0000 0002 c903 0001 0203" + " fe80 0000 0000 0000 0002 c903 0004 0506"
	// An IPv6 GRH (RoCE v2, IPv6) whose source GID puts 0x45 at byte 20:
	// the checksum test keeps it IPv6.
	v6with45 := "6000 0000 0130 1140" + " 2001 0db8 0000 0000 0000 0000 4500 0154" + " 2001 0db8 0000 0000 0000 0000 0000 0002"
	for _, tc := range []struct {
		name    string
		grh     string
		form    verbs.GRHForm
		src     string
		dst     string
		hop     uint8
		next    uint8
		payload int
		wantErr bool
	}{
		{name: "rxe IPv4", grh: zero20 + v4, form: verbs.GRHIPv4, src: "10.99.0.1", dst: "10.99.0.2", hop: 64, next: 17, payload: 0x154 - 20},
		{name: "IPv4, garbage 6 before", grh: "6" + strings.Repeat("a", 39) + v4, form: verbs.GRHIPv4, src: "10.99.0.1", dst: "10.99.0.2", hop: 64, next: 17, payload: 0x154 - 20},
		{name: "IPv4, garbage before", grh: strings.Repeat("ff", 20) + v4, form: verbs.GRHIPv4, src: "10.99.0.1", dst: "10.99.0.2", hop: 64, next: 17, payload: 0x154 - 20},
		{name: "InfiniBand", grh: ib, form: verbs.GRHIPv6, src: "fe80::2:c903:1:203", dst: "fe80::2:c903:4:506", hop: 64, next: 0x1b, payload: 0x130},
		{name: "IPv6 with 0x45 at byte 20", grh: v6with45, form: verbs.GRHIPv6, src: "2001:db8::4500:154", dst: "2001:db8::2", hop: 64, next: 17, payload: 0x130},
		{name: "IPv4-mapped GIDs in the IPv6 form", grh: "6000 0000 0010 1b40" + " 0000 0000 0000 0000 0000 ffff 7f00 0001" + " 0000 0000 0000 0000 0000 ffff 7f00 0002",
			form: verbs.GRHIPv6, src: "::ffff:127.0.0.1", dst: "::ffff:127.0.0.2", hop: 64, next: 0x1b, payload: 16},
		{name: "neither", grh: strings.Repeat("00", 40), wantErr: true},
		{name: "IPv4 with options", grh: zero20 + "46" + strings.Repeat("00", 19), wantErr: true},
		{name: "short", grh: zero20 + v4[:len(v4)-5], wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustHex(t, tc.grh)
			g, err := verbs.ParseGRH(b)
			if tc.wantErr {
				if err == nil || !errors.Is(err, verbs.ErrInvalid) {
					t.Fatalf("ParseGRH = %+v, %v; want an error wrapping ErrInvalid", g, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseGRH: %v", err)
			}
			if g.Form != tc.form || g.Src != netip.MustParseAddr(tc.src) || g.Dst != netip.MustParseAddr(tc.dst) ||
				g.HopLimit != tc.hop || g.NextHeader != tc.next || g.PayloadLen != tc.payload {
				t.Errorf("ParseGRH = %+v; want form %v src %s dst %s hop %d next %d payload %d", g, tc.form, tc.src, tc.dst, tc.hop, tc.next, tc.payload)
			}
			if want := verbs.GIDFromIP(netip.MustParseAddr(tc.src)); g.SrcGID() != want {
				t.Errorf("SrcGID = %v; want %v", g.SrcGID(), want)
			}
			// Put writes what was parsed back (bytes 0..19 of the IPv4
			// form are zero, as rxe writes them).
			out := make([]byte, verbs.GRHSize)
			if err := g.Put(out); err != nil {
				t.Fatalf("Put(%+v): %v", g, err)
			}
			want := b[:verbs.GRHSize]
			if g.Form == verbs.GRHIPv4 {
				want = append(make([]byte, 20), b[20:40]...)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("Put = %x\n want %x", out, want)
			}
		})
	}
}

// checksum is the IPv4 header checksum of h (its checksum field zero),
// written independently of the package's.
func checksum(h []byte) uint16 {
	var s uint64
	for i := 0; i+1 < len(h); i += 2 {
		s += uint64(h[i])<<8 | uint64(h[i+1])
	}
	for s>>16 != 0 {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

func TestGRHPutRefuses(t *testing.T) {
	b := make([]byte, verbs.GRHSize)
	v6 := netip.MustParseAddr("2001:db8::1")
	v4 := netip.MustParseAddr("10.0.0.1")
	for _, g := range []verbs.GRH{
		{Form: verbs.GRHIPv4, Src: v6, Dst: v4},
		{Form: verbs.GRHIPv4, Src: v4, Dst: v4, PayloadLen: 0xffff},
		{Form: verbs.GRHIPv6, Src: v6, Dst: v6, FlowLabel: 1 << 20},
		{Form: 5, Src: v4, Dst: v4},
	} {
		if err := g.Put(b); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("Put(%+v) = %v; want ErrInvalid", g, err)
		}
	}
	if err := (verbs.GRH{Form: verbs.GRHIPv6, Src: v6, Dst: v6}).Put(b[:39]); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Put into 39 bytes = %v; want ErrInvalid", err)
	}
}

// FuzzParseGRH: ParseGRH never panics, reads only the first 40 bytes, and
// what it accepts is consistent with the bytes: the IPv4 form has a
// 20-byte IPv4 header at byte 20 whose checksum is right whenever byte 0
// says IPv6, and Put of the result parses back to the same GRH.
func FuzzParseGRH(f *testing.F) {
	seed := func(g verbs.GRH) {
		b := make([]byte, verbs.GRHSize)
		if err := g.Put(b); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(verbs.GRH{Form: verbs.GRHIPv4, Src: netip.MustParseAddr("10.99.0.1"), Dst: netip.MustParseAddr("239.1.2.3"), HopLimit: 64, NextHeader: 17, PayloadLen: 300})
	seed(verbs.GRH{Form: verbs.GRHIPv6, Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("ff0e::1"), HopLimit: 1, NextHeader: 0x1b, PayloadLen: 4096, FlowLabel: 0x12345, TrafficClass: 7})
	f.Add(make([]byte, 40))
	f.Add(make([]byte, 12))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := verbs.ParseGRH(b)
		if len(b) > verbs.GRHSize {
			g2, err2 := verbs.ParseGRH(b[:verbs.GRHSize])
			if g2 != g || (err == nil) != (err2 == nil) {
				t.Fatalf("bytes past 40 changed the result: %+v, %v vs %+v, %v", g, err, g2, err2)
			}
		}
		if err != nil {
			if !errors.Is(err, verbs.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		switch g.Form {
		case verbs.GRHIPv4:
			if !g.Src.Is4() || !g.Dst.Is4() || b[20] != 0x45 {
				t.Fatalf("IPv4 form %+v from %x", g, b[:40])
			}
			if b[0]>>4 == 6 && checksum(append(append([]byte{}, b[20:30]...), append([]byte{0, 0}, b[32:40]...)...)) != uint16(b[30])<<8|uint16(b[31]) {
				t.Fatalf("IPv4 form with a bad checksum while byte 0 says IPv6: %x", b[:40])
			}
		case verbs.GRHIPv6:
			if b[0]>>4 != 6 || !g.Src.Is6() || g.Src.As16() != [16]byte(b[8:24]) || g.Dst.As16() != [16]byte(b[24:40]) {
				t.Fatalf("IPv6 form %+v from %x", g, b[:40])
			}
		default:
			t.Fatalf("form %v", g.Form)
		}
		out := make([]byte, verbs.GRHSize)
		if err := g.Put(out); err != nil {
			t.Fatalf("Put(%+v): %v", g, err)
		}
		g2, err := verbs.ParseGRH(out)
		if err != nil || g2 != g {
			t.Fatalf("Put then ParseGRH: %+v, %v; want %+v", g2, err, g)
		}
	})
}

func TestGIDIsMulticast(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"239.1.2.3", true}, {"224.0.0.1", true}, {"10.99.0.1", false}, {"255.255.255.255", false},
		{"ff0e::1", true}, {"ff02::1:ff00:1", true}, {"fe80::1", false}, {"2001:db8::1", false},
	} {
		g := verbs.GIDFromIP(netip.MustParseAddr(tc.addr))
		if got := g.IsMulticast(); got != tc.want {
			t.Errorf("GID %v (%s).IsMulticast() = %v, want %v", g, tc.addr, got, tc.want)
		}
	}
	// A multicast IPv4 group in the IPv4-mapped GID, as RoCE names it.
	if g := verbs.GIDFromIP(netip.MustParseAddr("239.1.2.3")); g != verbs.GID(netip.MustParseAddr("::ffff:239.1.2.3").As16()) {
		t.Errorf("group 239.1.2.3 as a GID: %v", g)
	}
}
