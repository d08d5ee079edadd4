package ud

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Multicast: an endpoint joins a group by attaching its QP to the
// group's GID (an IPv4 group is the GID ::ffff:a.b.c.d, as RoCE v2 over
// IPv4 carries it; an IPv6 group is its own GID), and sends to group:port
// through an address handle to that GID with RemoteQPN
// verbs.MulticastQPN. Joining attaches the QP, not the port: the device
// hands every member QP each datagram to the group, whatever port it was
// meant for. The port travels in the datagram's immediate data
// (SEND_WITH_IMM: mcastTag in the high 16 bits, the port in the low),
// and a member keeps only the datagrams to its own port, as a UDP socket
// joined to a group gets only those to the port it is bound to. Unicast
// datagrams carry no immediate, as before.
//
// A peer is untrusted here as anywhere: a datagram whose GRH names a
// group the endpoint has not joined (one in flight when it left), or
// whose immediate is missing, lacks the tag or names another port, is
// dropped and counted (Stats.DroppedMulticast); none costs more than the
// receive it arrived in.

// MaxGroups bounds the groups one endpoint joins at once, below the
// device's max_mcast_grp (which all its QPs share). Each group joined
// is an attachment in the device and a check per multicast datagram;
// 64 is more than Linux lets a socket join by default
// (net.ipv4.igmp_max_memberships, 20) and few enough that a leak shows.
const MaxGroups = 64

// maxSendGroups bounds the address handles to groups an endpoint keeps
// for sending (least recently used first out): one per group written to,
// joined or not.
const maxSendGroups = 64

// mcastTag marks a multicast datagram's immediate data ("mc"): a
// datagram whose immediate lacks it did not come from a go-rdma
// endpoint's WriteTo to a group.
const mcastTag = 0x6d63

// mcastImm is the immediate data of a datagram to group:port.
func mcastImm(port uint16) uint32 { return mcastTag<<16 | uint32(port) }

// groups is what an endpoint joined. The set is read by the poller for
// every multicast datagram without a lock, so Join and Leave replace it
// whole, under mu, which also orders them against Close.
type groups struct {
	mu     sync.Mutex
	joined atomic.Pointer[map[verbs.GID]netip.Addr] // nil: none
	max    int                                      // min(MaxGroups, the device's max_mcast_grp)
	sendTo *peers                                   // address handles to groups, by routeKey{group, MulticastQPN}
}

// has reports whether gid is a group joined.
func (g *groups) has(gid verbs.GID) bool {
	m := g.joined.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[gid]
	return ok
}

// groupGID is the GID of the multicast address group, checked: it must
// be a multicast address of the family of the endpoint's own GID, as a
// RoCE v2 packet's source and destination are one IP version.
func (e *Endpoint) groupGID(group netip.Addr) (verbs.GID, error) {
	a := group.Unmap()
	if !a.IsMulticast() {
		return verbs.GID{}, fmt.Errorf("%w: %v is not a multicast address", verbs.ErrInvalid, group)
	}
	if own := e.route.GID.IP(); e.eng.Port.LinkLayer == "Ethernet" && own.Is4() != a.Is4() {
		return verbs.GID{}, fmt.Errorf("%w: group %v: the endpoint's GID %v is of the other IP version", verbs.ErrInvalid, group, e.route.GID)
	}
	return verbs.GIDFromIP(a), nil
}

// Join makes the endpoint a member of group: datagrams sent to
// group:port, port the endpoint's own, reach its ReadFrom. Joining a
// group joined already, a non-multicast address or more than MaxGroups
// fails with ErrInvalid; a device without multicast with ErrNotSupported
// naming verbs.FeatureMulticast.
func (e *Endpoint) Join(group netip.Addr) error {
	gid, err := e.groupGID(group)
	if err != nil {
		return err
	}
	if err := e.eng.Lacks(verbs.FeatureMulticast); err != nil {
		return err
	}
	g := &e.mc
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := e.endErr(); err != nil {
		return err
	}
	var next map[verbs.GID]netip.Addr
	if m := g.joined.Load(); m != nil {
		if _, ok := (*m)[gid]; ok {
			return fmt.Errorf("%w: group %v joined already", verbs.ErrInvalid, group)
		}
		if len(*m) >= g.max {
			return fmt.Errorf("%w: group %v: %d groups joined, the most an endpoint joins on %s", verbs.ErrInvalid, group, len(*m), e.eng.Name())
		}
		next = maps.Clone(*m)
	} else {
		next = map[verbs.GID]netip.Addr{}
	}
	if err := e.qp.AttachMcast(gid, 0); err != nil {
		return fmt.Errorf("rdma: attach UD QP %#x to group %v: %w", e.qp.QPN(), group, err)
	}
	next[gid] = group.Unmap()
	g.joined.Store(&next)
	return nil
}

// Leave ends the membership Join began; datagrams to the group already
// received are still read. Leaving a group not joined fails with
// ErrInvalid.
func (e *Endpoint) Leave(group netip.Addr) error {
	gid, err := e.groupGID(group)
	if err != nil {
		return err
	}
	g := &e.mc
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.closed.Load() {
		return verbs.ErrClosed
	}
	m := g.joined.Load()
	if m == nil {
		return fmt.Errorf("%w: group %v not joined", verbs.ErrInvalid, group)
	}
	if _, ok := (*m)[gid]; !ok {
		return fmt.Errorf("%w: group %v not joined", verbs.ErrInvalid, group)
	}
	// Out of the set first: what arrives between here and the detach is
	// dropped as to a group not joined.
	next := maps.Clone(*m)
	delete(next, gid)
	g.joined.Store(&next)
	if err := e.qp.DetachMcast(gid, 0); err != nil {
		return fmt.Errorf("rdma: detach UD QP %#x from group %v: %w", e.qp.QPN(), group, err)
	}
	return nil
}

// leaveAll detaches the QP from every group (Close, once closed is set:
// no Join follows).
func (e *Endpoint) leaveAll() error {
	g := &e.mc
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.joined.Swap(nil)
	if m == nil || e.qp == nil {
		return nil
	}
	var errs []error
	for gid, a := range *m {
		if err := e.qp.DetachMcast(gid, 0); err != nil {
			errs = append(errs, fmt.Errorf("rdma: detach UD QP %#x from group %v: %w", e.qp.QPN(), a, err))
		}
	}
	return errors.Join(errs...)
}

// groupPeer is the cache entry of the group a names (group:port), made
// on the first send to it: no side channel is asked.
func (e *Endpoint) groupPeer(a *Addr) (*peer, error) {
	gid, err := e.groupGID(a.ap.Addr())
	if err != nil {
		return nil, err
	}
	if a.ap.Port() == 0 {
		return nil, fmt.Errorf("%w: address %v: want group:port", verbs.ErrInvalid, a.ap)
	}
	if err := e.eng.Lacks(verbs.FeatureMulticast); err != nil {
		return nil, err
	}
	r := Route{GID: gid, QPN: verbs.MulticastQPN, QKey: QKey, MTU: e.mtu}
	if p := e.mc.sendTo.from(r.key()); p != nil {
		return p, nil
	}
	return e.mc.sendTo.learn(netip.AddrPortFrom(a.ap.Addr(), 0), r), nil
}

// keepMulticast reports whether a datagram to the group gid, completed
// as wc, is for this endpoint: the group joined, and the immediate
// naming its port.
func (e *Endpoint) keepMulticast(gid verbs.GID, wc *verbs.WorkCompletion) bool {
	return e.mc.has(gid) && wc.Flags&verbs.WCWithImm != 0 && wc.Imm == mcastImm(e.local.ap.Port())
}
