//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/go-rdma/rdma/internal/verbs"
)

// joinIPGroup joins on the netdev of the port's RoCE v2 GID of the
// group's family, and only on RoCE: the host's membership shows in
// /proc/net/igmp while the join is open and is gone after Close.
func TestJoinIPGroup(t *testing.T) {
	group := verbs.GIDFromIP(netip.MustParseAddr("239.71.82.9"))
	gids := func(netdev string) []verbs.GIDEntry {
		return []verbs.GIDEntry{
			{Index: 0, GID: verbs.GIDFromIP(netip.MustParseAddr("fe80::1")), Type: verbs.GIDTypeRoCEv2, Netdev: "not-this-one"},
			{Index: 1, GID: verbs.GIDFromIP(netip.MustParseAddr("127.0.0.1")), Type: verbs.GIDTypeRoCEv2, Netdev: netdev},
		}
	}
	ib := verbs.DeviceInfo{Ports: []verbs.PortInfo{{Port: 1, LinkLayer: "InfiniBand", GIDs: gids("lo")}}}
	if j, err := joinIPGroup(ib, 1, group); j != nil || err != nil {
		t.Fatalf("InfiniBand port: %v, %v; want nothing to join", j, err)
	}
	none := verbs.DeviceInfo{Ports: []verbs.PortInfo{{Port: 1, LinkLayer: "Ethernet", GIDs: gids("")}}}
	if j, err := joinIPGroup(none, 1, group); j != nil || err != nil {
		t.Fatalf("no netdev: %v, %v; want nothing to join", j, err)
	}
	bad := verbs.DeviceInfo{Ports: []verbs.PortInfo{{Port: 1, LinkLayer: "Ethernet", GIDs: gids("go-rdma-none0")}}}
	if j, err := joinIPGroup(bad, 1, group); err == nil || !strings.Contains(err.Error(), "netdev") {
		t.Fatalf("unknown netdev: %v, %v; want an error naming the netdev", j, err)
	}
	lo := verbs.DeviceInfo{Ports: []verbs.PortInfo{{Port: 1, LinkLayer: "Ethernet", GIDs: gids("lo")}}}
	j, err := joinIPGroup(lo, 1, group)
	if err != nil {
		skipJoin(t, fmt.Sprintf("joining %v on lo: %v", group, err))
	}
	if !igmpMember(t, "lo", group) {
		t.Errorf("after the join, /proc/net/igmp has no %v on lo", group)
	}
	if err := closeJoin(j); err != nil {
		t.Fatal(err)
	}
	if igmpMember(t, "lo", group) {
		t.Errorf("after Close, /proc/net/igmp still has %v on lo", group)
	}
}

// igmpMember reports whether /proc/net/igmp lists group on dev.
func igmpMember(t *testing.T, dev string, group verbs.GID) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/igmp")
	if err != nil {
		skipJoin(t, fmt.Sprintf("no /proc/net/igmp: %v", err))
	}
	a := group.IP().As4()
	want := fmt.Sprintf("%02X%02X%02X%02X", a[3], a[2], a[1], a[0]) // the kernel prints it little-endian
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && !strings.HasPrefix(l, "\t") {
			in = f[1] == dev
		} else if in && len(f) > 0 && f[0] == want {
			return true
		}
	}
	return false
}

// skipJoin skips a host that cannot join an IP group (no multicast on
// lo, no /proc/net/igmp), or fails where the device tests must run
// (RDMA_TEST_REQUIRE_DEVICE=1, as in the VM, where RoCE's join is what
// rxe's multicast needs).
func skipJoin(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		t.Fatalf("%s, and RDMA_TEST_REQUIRE_DEVICE=1", why)
	}
	t.Skip(why)
}
