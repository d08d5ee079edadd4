package soft

import (
	"net/netip"
	"testing"

	"github.com/go-rdma/rdma/internal/verbs"
)

// putGRH writes the form of the address family, with what follows the
// header on the wire as its length, and verbs.ParseGRH reads it back.
func TestPutGRH(t *testing.T) {
	for _, tc := range []struct {
		src, dst string
		n        uint64
		imm      bool
		form     verbs.GRHForm
		payload  int
	}{
		{"127.0.0.1", "127.0.0.1", 256, false, verbs.GRHIPv4, 8 + 12 + 8 + 256 + 4},
		{"10.0.0.1", "239.1.2.3", 1, true, verbs.GRHIPv4, 8 + 12 + 8 + 4 + 4 + 4},
		{"2001:db8::1", "2001:db8::2", 4096, false, verbs.GRHIPv6, 8 + 12 + 8 + 4096 + 4},
		{"10.0.0.1", "2001:db8::2", 0, false, verbs.GRHIPv6, 8 + 12 + 8 + 4},
	} {
		src, dst := verbs.GIDFromIP(netip.MustParseAddr(tc.src)), verbs.GIDFromIP(netip.MustParseAddr(tc.dst))
		b := make([]byte, verbs.GRHSize)
		for i := range b {
			b[i] = 0xee
		}
		putGRH(b, src, dst, tc.n, tc.imm)
		g, err := verbs.ParseGRH(b)
		if err != nil {
			t.Fatalf("%s -> %s: ParseGRH(% x): %v", tc.src, tc.dst, b, err)
		}
		if g.Form != tc.form || g.SrcGID() != src || g.DstGID() != dst || g.PayloadLen != tc.payload || g.NextHeader != verbs.GRHNextUDP || g.HopLimit != 64 {
			t.Errorf("%s -> %s: %+v; want form %v, payload %d, UDP, hop limit 64", tc.src, tc.dst, g, tc.form, tc.payload)
		}
		if tc.form == verbs.GRHIPv4 {
			for i, c := range b[:20] {
				if c != 0 {
					t.Errorf("%s -> %s: byte %d of the IPv4 form is %#x, want 0", tc.src, tc.dst, i, c)
				}
			}
		}
	}
}
