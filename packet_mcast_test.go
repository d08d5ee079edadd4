package rdma_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// mcastGroup is the group of the multicast tests, an IPv4 one: the
// PacketConns listen on IPv4 addresses.
var mcastGroup = netip.MustParseAddr("239.71.82.7")

// listenOn opens a PacketConn on e at ip:port (port 0: a free one),
// closed when the test ends.
func listenOn(t *testing.T, e *rdma.Engine, ip string, port uint16) *rdma.PacketConn {
	t.Helper()
	p, err := e.ListenPacket("rdma", net.JoinHostPort(ip, strconv.Itoa(int(port))))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// portOf is p's port.
func portOf(p *rdma.PacketConn) uint16 { return p.LocalAddr().(*rdma.PacketAddr).AddrPort().Port() }

// groupOn is the multicast address group:port.
func groupOn(port uint16) *net.UDPAddr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(mcastGroup, port))
}

// expectMarker shows that p received nothing before now: it writes a
// unicast marker from "from" to p and requires it to be the first
// datagram p reads (a datagram sent to p earlier by the same sender
// would be read first).
func expectMarker(t *testing.T, from, p *rdma.PacketConn, what string) {
	t.Helper()
	marker := "marker to " + p.LocalAddr().String()
	_, err := from.WriteTo([]byte(marker), p.LocalAddr())
	require.NoError(t, err)
	buf := make([]byte, 256)
	n, _ := readWithin(t, p, buf)
	require.Equal(t, marker, string(buf[:n]), "%s: the first datagram read must be the unicast marker", what)
}

// multicastRound checks one group:port: sender writes to it with WriteTo,
// SendTo and a PacketBatch; each member (all on the port, joined) reads
// the three datagrams, reports the sender as for unicast (its ip:port if
// it has heard from it, else its route), and replies to that address,
// which reaches the sender; nobody else (others) receives any. It
// returns the address each member reported the sender by, and the one
// the sender reported its reply from.
func multicastRound(t *testing.T, sender *rdma.PacketConn, port uint16, members, others []*rdma.PacketConn) (froms, replyFroms []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	to := groupOn(port)
	_, err := sender.WriteTo([]byte("to the group 1"), to)
	require.NoError(t, err)
	src, err := sender.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	two, err := src.Slice(0, copy(src.Bytes(), "to the group 2"))
	require.NoError(t, err)
	f := sender.SendTo(two, to)
	require.NoError(t, f.Wait(ctx))
	f.Release()
	b := sender.NewBatch()
	three, err := src.Slice(32, copy(src.Bytes()[32:], "to the group 3"))
	require.NoError(t, err)
	b.SendTo(three, to)
	f = b.Post()
	require.NoError(t, f.Wait(ctx))
	f.Release()

	buf := make([]byte, 256)
	for i, m := range members {
		what := fmt.Sprintf("member %d (%s)", i, m.LocalAddr())
		var from net.Addr
		for k := 1; k <= 3; k++ {
			n, a := readWithin(t, m, buf)
			require.Equal(t, fmt.Sprintf("to the group %d", k), string(buf[:n]), what)
			require.NotContains(t, a.String(), mcastGroup.String(), "%s: the sender, not the group", what)
			from = a
		}
		reply := "reply from " + m.LocalAddr().String()
		_, err := m.WriteTo([]byte(reply), from)
		require.NoError(t, err, what)
		n, a := readWithin(t, sender, buf)
		require.Equal(t, reply, string(buf[:n]), "%s: its reply to the address ReadFrom reported reaches the sender", what)
		froms, replyFroms = append(froms, from.String()), append(replyFroms, a.String())
	}
	for i, o := range others {
		expectMarker(t, sender, o, fmt.Sprintf("non-member %d (%s)", i, o.LocalAddr()))
	}
	return froms, replyFroms
}

// Rule: a datagram to group:port reaches, once, every PacketConn that
// joined the group and listens on port, and no other: not one on the
// port that did not join, not a member on another port (which counts it
// in DroppedMulticast), not the sender that did not join; a member
// reports the sender as for unicast and its reply reaches it. After
// LeaveGroup nothing arrives; joined again, it does. A member that sends
// to its group reads its own datagram (soft and rxe deliver to every
// attached queue pair, the sender's included). Close of a member still
// joined succeeds: it detaches first (on verbs a queue pair still
// attached to a group cannot be destroyed: EBUSY).
func TestPacketMulticast(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		checkMulticast(t, e, e)
	})
}

// checkMulticast is TestPacketMulticast with the sender on se and the
// rest on e.
func checkMulticast(t *testing.T, se, e *rdma.Engine) {
	// Three members on one port, as three hosts would be, at
	// addresses of the loopback net. None is at the address of the
	// device's GID (soft's is 127.0.0.1), where the side channel
	// would take only peers announcing a GID of the address they
	// send from, which these, all on one device, do not.
	sender := listenOn(t, se, "127.0.0.5", 0)
	m0 := listenOn(t, e, "127.0.0.2", 0)
	port := portOf(m0)
	members := []*rdma.PacketConn{m0, listenOn(t, e, "127.0.0.3", port), listenOn(t, e, "127.0.0.4", port)}
	nonMember := listenOn(t, e, "127.0.0.6", port)
	otherPort := listenOn(t, e, "127.0.0.3", 0)
	for _, m := range append(members, otherPort) {
		require.NoError(t, m.JoinGroup(mcastGroup))
	}
	// m0 has heard from the sender (it reports its ip:port); the
	// others know it by route only.
	expectMarker(t, sender, m0, "member 0")

	froms, replyFroms := multicastRound(t, sender, port, members, []*rdma.PacketConn{nonMember, otherPort})
	assert.Equal(t, sender.LocalAddr().String(), froms[0], "member 0 reports the sender by its ip:port")
	assert.Equal(t, m0.LocalAddr().String(), replyFroms[0], "the sender reports member 0's reply by its ip:port")
	assert.Equal(t, uint64(3), otherPort.PacketStats().DroppedMulticast, "the member on another port dropped the three")
	for _, p := range append(members, nonMember) {
		assert.Zero(t, p.PacketStats().DroppedMulticast, p.LocalAddr().String())
	}

	// The sender did not join: nothing came back to it.
	expectMarker(t, m0, sender, "the sender")

	// A member that sends to its group reads its own datagram too, on
	// soft and on rxe alike; the non-member on the port still nothing.
	_, err := m0.WriteTo([]byte("loop"), groupOn(port))
	require.NoError(t, err)
	buf := make([]byte, 64)
	for i, m := range members {
		n, _ := readWithin(t, m, buf)
		require.Equal(t, "loop", string(buf[:n]), "member %d, member 0 its sender", i)
	}
	expectMarker(t, sender, nonMember, "the non-member, after a member's datagram")

	for _, m := range members {
		require.NoError(t, m.LeaveGroup(mcastGroup))
	}
	_, err = sender.WriteTo([]byte("after leave"), groupOn(port))
	require.NoError(t, err)
	for i, m := range members {
		expectMarker(t, sender, m, fmt.Sprintf("former member %d", i))
	}

	require.NoError(t, members[1].JoinGroup(mcastGroup))
	multicastRound(t, sender, port, members[1:2], []*rdma.PacketConn{members[0], members[2]})
}

// Rule: TestPacketMulticast's, between two devices (rxe0 and rxe1 in the
// VM, on a veth pair): the sender on one, the rest on the other, so that
// the datagrams to the group cross the link.
func TestVerbsPacketMulticastTwoDevices(t *testing.T) {
	ip0, ip1 := cmAddrs(t)
	se, e := engineAt(t, ip0), engineAt(t, ip1)
	require.NotEqual(t, se.Device(), e.Device(), "both on one device: the datagrams would not cross the link")
	checkMulticast(t, se, e)
}

// engineAt opens an engine on the verbs device of the address ip,
// closed when the test ends.
func engineAt(t *testing.T, ip string) *rdma.Engine {
	t.Helper()
	p, err := rdma.ListenPacket("rdma", ip+":0", rdma.WithProvider(rdma.ProviderVerbs))
	require.NoError(t, err)
	dev := p.Device()
	require.NoError(t, p.Close())
	return packetEngine(t, []rdma.Option{rdma.WithProvider(rdma.ProviderVerbs), rdma.WithDevice(dev)})
}

// Rule: JoinGroup and LeaveGroup check their input: a unicast, an
// unspecified, an IPv6 group on an IPv4 PacketConn, a group joined twice,
// a group not joined, more groups than the bound (64), all fail with
// ErrInvalid naming the group; WriteTo a group with port 0 too. After
// Close they fail with net.ErrClosed.
func TestPacketMulticastErrors(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		p := listenOn(t, e, "127.0.0.1", 0)
		for _, bad := range []netip.Addr{netip.MustParseAddr("10.1.2.3"), {}, netip.IPv4Unspecified(), netip.MustParseAddr("ff0e::db8:7")} {
			err := p.JoinGroup(bad)
			require.ErrorIs(t, err, rdma.ErrInvalid, "JoinGroup(%v)", bad)
			require.ErrorIs(t, p.LeaveGroup(bad), rdma.ErrInvalid, "LeaveGroup(%v)", bad)
		}
		require.ErrorIs(t, p.LeaveGroup(mcastGroup), rdma.ErrInvalid, "a group not joined")
		require.NoError(t, p.JoinGroup(mcastGroup))
		err := p.JoinGroup(mcastGroup)
		require.ErrorIs(t, err, rdma.ErrInvalid, "joined twice")
		assert.ErrorContains(t, err, mcastGroup.String())
		_, err = p.WriteTo([]byte("x"), groupOn(0))
		require.ErrorIs(t, err, rdma.ErrInvalid, "a group without a port")

		joined := 1
		for i := range 100 {
			g := netip.AddrFrom4([4]byte{239, 71, 83, byte(i)})
			if err := p.JoinGroup(g); err != nil {
				require.ErrorIs(t, err, rdma.ErrInvalid)
				assert.ErrorContains(t, err, "groups joined")
				break
			}
			joined++
		}
		assert.Equal(t, 64, joined, "the groups one PacketConn joins")
		require.NoError(t, p.LeaveGroup(mcastGroup))
		require.NoError(t, p.JoinGroup(netip.MustParseAddr("239.71.84.1")), "leaving made room")

		require.NoError(t, p.Close())
		require.ErrorIs(t, p.JoinGroup(netip.MustParseAddr("239.71.84.2")), net.ErrClosed)
		require.ErrorIs(t, p.LeaveGroup(mcastGroup), net.ErrClosed)
	})
}
