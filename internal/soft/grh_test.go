package soft

import (
	"errors"
	"net/netip"
	"strings"
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

// Multicast: the argument checks, the bounds, and that Close detaches
// (a datagram to the group after the member closed reaches nobody, and
// the group is gone from the table). Delivery itself is the conformance
// suite's Multicast case.
func TestMcastAttach(t *testing.T) {
	group := verbs.GIDFromIP(netip.MustParseAddr("239.9.9.9"))
	rc, _ := pair(t, verbs.RC, connOpt{})
	if err := rc.qp.AttachMcast(group, 0); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("AttachMcast on RC: %v; want ErrInvalid", err)
	}
	a := newSide(t, sideOpt{typ: verbs.UD})
	if err := a.qp.AttachMcast(verbs.GIDFromIP(netip.MustParseAddr("10.0.0.1")), 0); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("AttachMcast to a unicast GID: %v; want ErrInvalid", err)
	}
	if err := a.qp.DetachMcast(group, 0); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("DetachMcast of a group not attached: %v; want ErrInvalid", err)
	}
	must(t, a.qp.AttachMcast(group, 0))
	must(t, a.qp.AttachMcast(group, 0)) // again: no error, one membership
	mcast.RLock()
	n := len(mcast.groups[group])
	mcast.RUnlock()
	if n != 1 {
		t.Fatalf("group has %d members after attaching one QP twice", n)
	}
	// The bound on QPs per group.
	var extra []*side
	for range maxMcastQPAttach - 1 {
		s := newSide(t, sideOpt{typ: verbs.UD, ctx: a.ctx, size: 64})
		must(t, s.qp.AttachMcast(group, 0))
		extra = append(extra, s)
	}
	over := newSide(t, sideOpt{typ: verbs.UD, ctx: a.ctx, size: 64})
	if err := over.qp.AttachMcast(group, 0); !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "max_mcast_qp_attach") {
		t.Fatalf("attach number %d: %v; want ErrInvalid naming max_mcast_qp_attach", maxMcastQPAttach+1, err)
	}
	for _, s := range extra {
		must(t, s.qp.DetachMcast(group, 0))
	}
	must(t, a.qp.Close())
	mcast.RLock()
	_, there := mcast.groups[group]
	mcast.RUnlock()
	if there {
		t.Fatal("the group outlived its last member's Close")
	}
	if err := a.qp.AttachMcast(group, 0); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("AttachMcast after Close: %v; want ErrClosed", err)
	}
}
