//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/go-rdma/rdma/internal/verbs"
)

func (q *qp) AttachMcast(gid verbs.GID, lid uint16) error { return q.mcast(true, gid, lid) }
func (q *qp) DetachMcast(gid verbs.GID, lid uint16) error { return q.mcast(false, gid, lid) }

// mcast attaches the QP to group gid or detaches it. On a RoCE port the
// attach also makes the host a member of the IP group on the port's
// netdev, as rdma_join_multicast does (IGMP or MLD): rxe receives
// through the kernel's IP stack, which drops multicast of groups the
// host has not joined, and on hardware a switch with IGMP snooping
// forwards a group only to the ports that joined it.
// ibv_attach_mcast does neither.
func (q *qp) mcast(attach bool, gid verbs.GID, lid uint16) error {
	op := "ibv_detach_mcast"
	if attach {
		op = "ibv_attach_mcast"
	}
	ctx := q.pd.ctx
	if err := verbs.Lacks(ctx.info, ctx.attr, verbs.FeatureMulticast); err != nil {
		return fmt.Errorf("ibv: %s: %w", op, err)
	}
	if q.typ != verbs.UD {
		return fmt.Errorf("ibv: %s: %w: %v QP %#x; multicast needs a UD QP", op, verbs.ErrInvalid, q.typ, q.qpn)
	}
	if !gid.IsMulticast() {
		return fmt.Errorf("ibv: %s: %w: %v is not a multicast GID", op, verbs.ErrInvalid, gid)
	}
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	q.mcMu.Lock()
	defer q.mcMu.Unlock()
	joined, ok := q.groups[gid]
	if !attach {
		if !ok {
			return fmt.Errorf("ibv: %s %v: %w: QP %#x is not attached to it", op, gid, verbs.ErrInvalid, q.qpn)
		}
		if err := q.h.mcast(false, &gid, lid); err != nil {
			return errnoErr(fmt.Sprintf("%s %v QP %#x", op, gid, q.qpn), err)
		}
		delete(q.groups, gid)
		return closeJoin(joined)
	}
	if ok {
		return nil // attached already, as rxe answers too
	}
	port := q.port
	if port == 0 {
		port = 1
	}
	joined, err := joinIPGroup(ctx.info, port, gid)
	if err != nil {
		return fmt.Errorf("ibv: %s %v on %s port %d: %w", op, gid, ctx.info.Name, port, err)
	}
	if err := q.h.mcast(true, &gid, lid); err != nil {
		_ = closeJoin(joined)
		return errnoErr(fmt.Sprintf("%s %v QP %#x", op, gid, q.qpn), err)
	}
	if q.groups == nil {
		q.groups = map[verbs.GID]io.Closer{}
	}
	q.groups[gid] = joined
	return nil
}

// leaveAll drops the IP memberships of the QP's groups; destroying the
// QP detached it from the groups themselves. Close calls it.
func (q *qp) leaveAll() {
	q.mcMu.Lock()
	defer q.mcMu.Unlock()
	for gid, j := range q.groups {
		_ = closeJoin(j)
		delete(q.groups, gid)
	}
}

func closeJoin(j io.Closer) error {
	if j == nil {
		return nil
	}
	if err := j.Close(); err != nil {
		return fmt.Errorf("ibv: leave the IP multicast group: %w", err)
	}
	return nil
}

// joinIPGroup makes the host a member of the IP group of gid on the
// netdev behind port's RoCE v2 GID of the group's address family, with a
// UDP socket joined to the group until it is closed (the socket itself
// receives nothing: it is bound to a port of its own, and RoCE goes to
// UDP 4791). It returns nil and no error on InfiniBand and where the
// port names no netdev (nothing to join).
func joinIPGroup(info verbs.DeviceInfo, port uint8, gid verbs.GID) (io.Closer, error) {
	var p *verbs.PortInfo
	for i := range info.Ports {
		if info.Ports[i].Port == port {
			p = &info.Ports[i]
		}
	}
	if p == nil || p.LinkLayer != "Ethernet" {
		return nil, nil
	}
	group := gid.IP()
	dev := ""
	for _, g := range p.GIDs {
		if g.Netdev != "" && g.Type == verbs.GIDTypeRoCEv2 && g.GID.IP().Is4() == group.Is4() {
			dev = g.Netdev
			break
		}
	}
	if dev == "" {
		return nil, nil
	}
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return nil, fmt.Errorf("netdev of the port: %w", err)
	}
	network := "udp6"
	if group.Is4() {
		network = "udp4"
	}
	c, err := net.ListenMulticastUDP(network, ifi, net.UDPAddrFromAddrPort(netip.AddrPortFrom(group, 0)))
	if err != nil {
		return nil, fmt.Errorf("join IP group %v on %s: %w", group, dev, err)
	}
	return c, nil
}
