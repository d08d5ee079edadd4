package ud

import (
	"net"
	"net/netip"
	"strconv"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Route is where a datagram goes on the fabric: the peer's GID and LID
// (the soft provider routes by LID too), its UD QP number and Q_Key, and
// the largest datagram it takes.
type Route struct {
	GID  verbs.GID
	LID  uint16
	QPN  uint32
	QKey uint32
	MTU  int
}

// routeKey names a sender as a UD receive does: the GRH's source GID and
// the work completion's source QPN.
type routeKey struct {
	gid verbs.GID
	qpn uint32
}

func (r Route) key() routeKey { return routeKey{gid: r.GID, qpn: r.QPN} }

// Addr is the address of a datagram endpoint: the ip:port of its UDP side
// channel, which is where a peer asks for its route. An Addr that
// ReadFrom reports also carries the sender's route, so that a reply needs
// no lookup; one from a sender that never announced itself (see
// Endpoint.ReadFrom) has port 0 and only the route. An Addr is immutable:
// ReadFrom hands the same one out for every datagram of a peer.
type Addr struct {
	ap    netip.AddrPort
	route Route    // QPN 0: none
	ext   net.Addr // the API's address for this one (Config.Wrap)
}

// Ext is the API's address for a, made once with it by Config.Wrap; nil
// for an address the endpoint did not make.
func (a *Addr) Ext() net.Addr { return a.ext }

// NewAddr is the address ap, without a route.
func NewAddr(ap netip.AddrPort) *Addr {
	return &Addr{ap: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
}

// Network is "rdma".
func (a *Addr) Network() string { return "rdma" }

// String is ip:port; an address known only by its route (port 0) adds
// the QPN, so that two such senders on one host read differently.
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	if a.ap.Port() == 0 && a.route.QPN != 0 {
		return a.ap.String() + "#qp" + strconv.FormatUint(uint64(a.route.QPN), 16)
	}
	return a.ap.String()
}

// AddrPort is the address's ip:port.
func (a *Addr) AddrPort() netip.AddrPort { return a.ap }

// hasRoute reports whether a came from a datagram and carries its route.
func (a *Addr) hasRoute() bool { return a.route.QPN != 0 }
