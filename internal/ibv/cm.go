//go:build linux && cgo

package ibv

/*
#include "shim.h"
#include <netinet/in.h>
#include <sys/socket.h>

#define GORDMA_CM_DATA_MAX 256

// gordma_cm_event is an rdma_cm event copied out of librdmacm's memory,
// so the event can be acknowledged before Go looks at it.
typedef struct {
	struct rdma_cm_id *id;
	// CONNECT_REQUEST: the event channel the new id was moved to.
	struct rdma_event_channel *channel;
	int32_t  event;
	int32_t  status;
	// CONNECT_REQUEST: errno when the new id could not be moved to its
	// own channel; the request was then rejected and its id destroyed.
	int32_t  migrate_err;
	uint32_t qp_num;
	uint8_t  responder_resources;
	uint8_t  initiator_depth;
	uint8_t  private_data_len;
	uint8_t  pad;
	uint8_t  private_data[GORDMA_CM_DATA_MAX];
} gordma_cm_event;

// gordma_cm_get_event reads one event (EAGAIN when none is ready), copies
// it, gives the id of a connection request its own event channel, and
// acknowledges the event before returning.
static int gordma_cm_get_event(struct rdma_event_channel *ch, gordma_cm_event *out) {
	struct rdma_cm_event *ev = NULL;
	memset(out, 0, sizeof(*out));
	errno = 0;
	if (gordma_rdma_get_cm_event(ch, &ev) != 0) return errno ? errno : EIO;
	out->id = ev->id;
	out->event = ev->event;
	out->status = ev->status;
	if (ev->event != RDMA_CM_EVENT_MULTICAST_JOIN && ev->event != RDMA_CM_EVENT_MULTICAST_ERROR) {
		const struct rdma_conn_param *p = &ev->param.conn;
		out->qp_num = p->qp_num;
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		if (p->private_data && p->private_data_len) {
			out->private_data_len = p->private_data_len;
			memcpy(out->private_data, p->private_data, p->private_data_len);
		}
	}
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct rdma_event_channel *nch = gordma_rdma_create_event_channel();
		if (!nch) {
			out->migrate_err = errno ? errno : EIO;
		} else if (gordma_rdma_migrate_id(ev->id, nch) != 0) {
			out->migrate_err = errno ? errno : EIO;
			gordma_rdma_destroy_event_channel(nch);
		} else {
			out->channel = nch;
		}
	}
	gordma_rdma_ack_cm_event(ev);
	if (out->migrate_err) {
		gordma_rdma_reject(out->id, NULL, 0);
		gordma_rdma_destroy_id(out->id);
		out->id = NULL;
	}
	return 0;
}

// gordma_fill_sockaddr builds an IPv4 (for a v4-mapped ip) or IPv6
// socket address.
static void gordma_fill_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, uint16_t port, uint32_t scope) {
	static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	memset(ss, 0, sizeof(*ss));
	if (memcmp(ip, v4mapped, 12) == 0) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip + 12, 4);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		s->sin6_scope_id = scope;
		memcpy(&s->sin6_addr, ip, 16);
	}
}

// gordma_get_sockaddr reads a socket address into a 16-byte (v4-mapped
// for IPv4) address and a port; it returns 4, 6, or 0 for none.
static int gordma_get_sockaddr(const struct sockaddr *sa, uint8_t *ip, uint16_t *port) {
	memset(ip, 0, 16);
	*port = 0;
	if (!sa) return 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		ip[10] = ip[11] = 0xff;
		memcpy(ip + 12, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 6;
	}
	return 0;
}

static int gordma_cm_addr(struct rdma_cm_id *id, int peer, uint8_t *ip, uint16_t *port) {
	return gordma_get_sockaddr(peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id), ip, port);
}

static int gordma_cm_bind(struct rdma_cm_id *id, const uint8_t *ip, uint16_t port, uint32_t scope) {
	struct sockaddr_storage ss;
	gordma_fill_sockaddr(&ss, ip, port, scope);
	errno = 0;
	if (gordma_rdma_bind_addr(id, (struct sockaddr *)&ss) != 0) return errno ? errno : EIO;
	return 0;
}

static int gordma_cm_resolve_addr(struct rdma_cm_id *id, int has_src, const uint8_t *sip, uint16_t sport, uint32_t sscope,
		const uint8_t *dip, uint16_t dport, uint32_t dscope, int timeout_ms) {
	struct sockaddr_storage src, dst;
	gordma_fill_sockaddr(&src, sip, sport, sscope);
	gordma_fill_sockaddr(&dst, dip, dport, dscope);
	errno = 0;
	if (gordma_rdma_resolve_addr(id, has_src ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst, timeout_ms) != 0)
		return errno ? errno : EIO;
	return 0;
}

// gordma_cm_establish builds rdma_conn_param in C memory and calls
// rdma_connect (active side) or rdma_accept (passive side; retry is the
// active side's and ignored); librdmacm copies the private data into its
// command.
static int gordma_cm_establish(struct rdma_cm_id *id, int accept, uint32_t qpn, int srq, uint8_t rr, uint8_t depth,
		uint8_t retry, uint8_t rnr, const void *data, uint8_t len) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.qp_num = qpn;
	p.srq = srq ? 1 : 0;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.retry_count = accept ? 0 : retry;
	p.rnr_retry_count = rnr;
	p.private_data = len ? data : NULL;
	p.private_data_len = len;
	errno = 0;
	if ((accept ? gordma_rdma_accept(id, &p) : gordma_rdma_connect(id, &p)) != 0) return errno ? errno : EIO;
	return 0;
}

static int gordma_cm_reject(struct rdma_cm_id *id, const void *data, uint8_t len) {
	errno = 0;
	if (gordma_rdma_reject(id, len ? data : NULL, len) != 0) return errno ? errno : EIO;
	return 0;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// cmState is where a CMID is in its life.
type cmState uint8

const (
	cmIdle       cmState = iota // created, resolving
	cmRouted                    // active: address and route resolved
	cmRequested                 // passive: a request not yet answered
	cmConnecting                // Connect or Accept in progress
	cmConnected                 // established
	cmRefused                   // passive: rejected by us
	cmFailed                    // Connect or Accept failed
)

// CMID is one rdma_cm connection end: from CMDial (active) or from
// CMListener.Accept (passive). It has its own event channel. It holds no
// QP: the caller's QP, created on the device Device names, is driven
// through ModifyQP, Connect and Accept. Close it in every case.
type CMID struct {
	lt verbs.Lifetime
	ch *C.struct_rdma_event_channel
	id *C.struct_rdma_cm_id
	w  *fdWaiter

	dev    string
	port   uint8
	ibLink bool // InfiniBand link layer (not RoCE)
	local  CMAddr
	remote CMAddr

	mu           sync.Mutex
	state        cmState
	priv         []byte
	reqRR        uint8 // passive: the most responder resources Accept may grant
	reqDepth     uint8 // passive: the most initiator depth Accept may grant
	override     bool  // passive: accRR and accDepth replace rdma_cm's values
	accRR        uint8
	accDepth     uint8
	qp           *qp // connected QP, moved to ERR by WaitDisconnect
	disconnected bool
}

// CMListener listens for rdma_cm connection requests.
type CMListener struct {
	lt   verbs.Lifetime
	ch   *C.struct_rdma_event_channel
	id   *C.struct_rdma_cm_id
	w    *fdWaiter
	addr CMAddr
}

// createCM makes an event channel, its non-blocking waiter and an id in
// the TCP port space. It is the one way to an rdma_cm object, so it is
// where librdmacm is loaded.
func createCM(name string) (*C.struct_rdma_event_channel, *C.struct_rdma_cm_id, *fdWaiter, error) {
	if err := loadCM(); err != nil {
		return nil, nil, nil, err
	}
	ch, err := C.gordma_rdma_create_event_channel()
	if ch == nil {
		return nil, nil, nil, errnoErr("rdma_create_event_channel (is the rdma_ucm module loaded?)", err)
	}
	w, err := newFDWaiter(int(ch.fd), name)
	if err != nil {
		C.gordma_rdma_destroy_event_channel(ch)
		return nil, nil, nil, err
	}
	var id *C.struct_rdma_cm_id
	if rc, err := C.gordma_rdma_create_id(ch, &id, nil, C.RDMA_PS_TCP); rc != 0 {
		w.close()
		C.gordma_rdma_destroy_event_channel(ch)
		return nil, nil, nil, errnoErr("rdma_create_id", err)
	}
	return ch, id, w, nil
}

// cmEvent is a gordma_cm_event in Go values.
type cmEvent struct {
	typ        int
	status     int
	rr, depth  uint8
	priv       []byte
	id         *C.struct_rdma_cm_id
	ch         *C.struct_rdma_event_channel
	migrateErr syscall.Errno
}

// readCMEvent waits for the next event of ch through the netpoller.
func readCMEvent(ctx context.Context, w *fdWaiter, ch *C.struct_rdma_event_channel) (cmEvent, error) {
	var ev C.gordma_cm_event
	err := w.wait(ctx, func() (bool, error) {
		rc := C.gordma_cm_get_event(ch, &ev)
		if rc == C.EAGAIN {
			return false, nil
		}
		if rc != 0 {
			return true, errnoErr("rdma_get_cm_event", syscall.Errno(rc))
		}
		return true, nil
	})
	if err != nil {
		return cmEvent{}, err
	}
	out := cmEvent{
		typ:        int(ev.event),
		status:     int(ev.status),
		rr:         uint8(ev.responder_resources),
		depth:      uint8(ev.initiator_depth),
		id:         ev.id,
		ch:         ev.channel,
		migrateErr: syscall.Errno(ev.migrate_err),
	}
	if n := int(ev.private_data_len); n > 0 {
		out.priv = C.GoBytes(unsafe.Pointer(&ev.private_data[0]), C.int(n))
	}
	return out, nil
}

// cmEventNames is indexed by the cm* event types of cm_types.go (enum
// rdma_cm_event_type). It is here, not there, because only the cgo
// build reads events.
var cmEventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR",
	"CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE",
	"REJECTED", "ESTABLISHED", "DISCONNECTED", "DEVICE_REMOVAL",
	"MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE", "TIMEWAIT_EXIT",
}

func cmEventName(e int) string {
	if e >= 0 && e < len(cmEventNames) {
		return "RDMA_CM_EVENT_" + cmEventNames[e]
	}
	return fmt.Sprintf("RDMA_CM_EVENT(%d)", e)
}

func cmEventErr(op string, ev cmEvent) error {
	return &CMEventError{Op: op, Event: cmEventName(ev.typ), Status: ev.status, PrivateData: ev.priv, event: ev.typ}
}

// cmResolveTime bounds each resolve step of CMDial when ctx ends later.
const cmResolveTime = 5 * time.Second

// cmAddrAttempt is the kernel timeout of one address-resolution attempt.
// The kernel wakes a request that waits for a neighbour (ARP/ND) entry
// when the entry becomes valid, but only if the request was already
// queued: a reply that comes back during the first lookup (a veth pair,
// a fast LAN) is missed and the request completes only at its timeout.
// Short attempts bound that stall; a timed-out attempt is retried until
// the step's deadline.
const cmAddrAttempt = 250 * time.Millisecond

// cmDeadline is when a resolve step that starts now must end.
func cmDeadline(ctx context.Context) time.Time {
	d := time.Now().Add(cmResolveTime)
	if dl, ok := ctx.Deadline(); ok && dl.Before(d) {
		d = dl
	}
	return d
}

// cmMillis is the time until d, at most limit, as a kernel timeout.
func cmMillis(d time.Time, limit time.Duration) C.int {
	return C.int(max(1, min(time.Until(d), limit)/time.Millisecond))
}

// parseCMAddr parses "host:port". An empty host is 0.0.0.0 when passive;
// a name is looked up, preferring IPv4.
func parseCMAddr(ctx context.Context, s string, passive bool) (netip.AddrPort, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("ibv: rdma_cm address %q: %w: %v", s, verbs.ErrInvalid, err)
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("ibv: rdma_cm address %q: %w: bad port", s, verbs.ErrInvalid)
	}
	ip, err := lookupCMHost(ctx, host, passive)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

func lookupCMHost(ctx context.Context, host string, passive bool) (netip.Addr, error) {
	if host == "" {
		if passive {
			return netip.IPv4Unspecified(), nil
		}
		return netip.Addr{}, fmt.Errorf("ibv: rdma_cm: %w: no host to connect to", verbs.ErrInvalid)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("ibv: rdma_cm: %w", err)
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), nil
		}
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("ibv: rdma_cm: host %q has no address", host)
	}
	return ips[0], nil
}

// sockArgs is an address in the form the C helpers take.
func sockArgs(a netip.AddrPort) (ip [16]byte, port C.uint16_t, scope C.uint32_t) {
	ip = a.Addr().As16()
	if z := a.Addr().Zone(); z != "" {
		if n, err := strconv.Atoi(z); err == nil {
			scope = C.uint32_t(n)
		} else if ifi, err := net.InterfaceByName(z); err == nil {
			scope = C.uint32_t(ifi.Index)
		}
	}
	return ip, C.uint16_t(a.Port()), scope
}

func cmSockAddr(id *C.struct_rdma_cm_id, peer bool) CMAddr {
	var ip [16]byte
	var port C.uint16_t
	p := C.int(0)
	if peer {
		p = 1
	}
	switch C.gordma_cm_addr(id, p, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &port) {
	case 4:
		return CMAddr{netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), uint16(port))}
	case 6:
		return CMAddr{netip.AddrPortFrom(netip.AddrFrom16(ip), uint16(port))}
	}
	return CMAddr{}
}

// CMListen listens for connection requests on addr ("ip:port", ":port"
// for every address; port 0 picks one, see Addr). backlog <= 0 takes the
// kernel's default.
func CMListen(addr string, backlog int) (*CMListener, error) {
	ap, err := parseCMAddr(context.Background(), addr, true)
	if err != nil {
		return nil, err
	}
	ch, id, w, err := createCM("rdma_cm-listen")
	if err != nil {
		return nil, err
	}
	l := &CMListener{ch: ch, id: id, w: w}
	ip, port, scope := sockArgs(ap)
	if rc := C.gordma_cm_bind(id, (*C.uint8_t)(unsafe.Pointer(&ip[0])), port, scope); rc != 0 {
		l.Close()
		return nil, errnoErr("rdma_bind_addr "+ap.String(), syscall.Errno(rc))
	}
	if rc, err := C.gordma_rdma_listen(id, C.int(max(backlog, 0))); rc != 0 {
		l.Close()
		return nil, errnoErr("rdma_listen "+ap.String(), err)
	}
	l.addr = cmSockAddr(id, false)
	return l, nil
}

// Addr is the address the listener is bound to, with the port the kernel
// chose for port 0.
func (l *CMListener) Addr() net.Addr { return l.addr }

// Accept waits for the next connection request. The request's CMID has
// its own event channel; the caller accepts or rejects it and closes it.
// It returns ctx.Err() when ctx ends and an error wrapping
// verbs.ErrClosed after Close.
func (l *CMListener) Accept(ctx context.Context) (*CMRequest, error) {
	if l.lt.Closed() {
		return nil, verbs.ErrClosed
	}
	for {
		ev, err := readCMEvent(ctx, l.w, l.ch)
		if err != nil {
			return nil, err
		}
		switch ev.typ {
		case cmConnectRequest:
			if ev.migrateErr != 0 {
				return nil, errnoErr("moving a connection request to its own event channel (the request was rejected)", ev.migrateErr)
			}
			return newRequest(ev)
		case cmDeviceRemoval:
			return nil, cmEventErr("listen", ev)
		}
		// ADDR_CHANGE and the like: nothing to do for a listener.
	}
}

func newRequest(ev cmEvent) (*CMRequest, error) {
	w, err := newFDWaiter(int(ev.ch.fd), "rdma_cm")
	if err != nil {
		C.gordma_rdma_reject(ev.id, nil, 0)
		C.gordma_rdma_destroy_id(ev.id)
		C.gordma_rdma_destroy_event_channel(ev.ch)
		return nil, err
	}
	c := &CMID{ch: ev.ch, id: ev.id, w: w, state: cmRequested, priv: ev.priv, reqRR: ev.rr, reqDepth: ev.depth}
	if err := c.learn(); err != nil {
		C.gordma_rdma_reject(ev.id, nil, 0)
		c.Close()
		return nil, err
	}
	return &CMRequest{CMID: c, ResponderResources: ev.rr, InitiatorDepth: ev.depth}, nil
}

// Close stops listening. Requests already returned by Accept live on.
func (l *CMListener) Close() error {
	return l.lt.Close(func() error {
		l.w.close()
		if rc, err := C.gordma_rdma_destroy_id(l.id); rc != 0 {
			return errnoErr("rdma_destroy_id", err)
		}
		C.gordma_rdma_destroy_event_channel(l.ch)
		return nil
	})
}

// CMDial resolves raddr ("ip:port" or "host:port") to a device, port and
// route, binding to laddr ("ip" or "ip:port") when it is not "". Each
// of the two resolve steps ends with ctx or after 5 s. Then open
// Device(), create an RC QP there and call Connect.
func CMDial(ctx context.Context, laddr, raddr string) (*CMID, error) {
	dst, err := parseCMAddr(ctx, raddr, false)
	if err != nil {
		return nil, err
	}
	var src netip.AddrPort
	if laddr != "" {
		if _, _, err := net.SplitHostPort(laddr); err != nil {
			laddr = net.JoinHostPort(laddr, "0")
		}
		if src, err = parseCMAddr(ctx, laddr, false); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch, id, w, err := createCM("rdma_cm")
	if err != nil {
		return nil, err
	}
	c := &CMID{ch: ch, id: id, w: w}
	fail := func(err error) (*CMID, error) {
		c.Close()
		return nil, err
	}
	sip, sport, sscope := sockArgs(src)
	dip, dport, dscope := sockArgs(dst)
	hasSrc := C.int(0)
	if src.IsValid() {
		hasSrc = 1
	}
	deadline := cmDeadline(ctx)
	for {
		if rc := C.gordma_cm_resolve_addr(id, hasSrc, (*C.uint8_t)(unsafe.Pointer(&sip[0])), sport, sscope,
			(*C.uint8_t)(unsafe.Pointer(&dip[0])), dport, dscope, cmMillis(deadline, cmAddrAttempt)); rc != 0 {
			return fail(errnoErr("rdma_resolve_addr "+dst.String(), syscall.Errno(rc)))
		}
		_, err := c.waitFor(ctx, "resolve address "+dst.String(), cmAddrResolved)
		if err == nil {
			break
		}
		// A failed attempt leaves the id bound; ask again while time is left.
		var ce *CMEventError
		if !errors.As(err, &ce) || ce.event != cmAddrError || ce.Status != -int(syscall.ETIMEDOUT) || !time.Now().Before(deadline) {
			return fail(err)
		}
	}
	if rc, err := C.gordma_rdma_resolve_route(id, cmMillis(cmDeadline(ctx), cmResolveTime)); rc != 0 {
		return fail(errnoErr("rdma_resolve_route "+dst.String(), err))
	}
	if _, err := c.waitFor(ctx, "resolve route "+dst.String(), cmRouteResolved); err != nil {
		return fail(err)
	}
	if err := c.learn(); err != nil {
		return fail(err)
	}
	c.state = cmRouted
	return c, nil
}

// learn records the device, port and addresses the id is bound to.
func (c *CMID) learn() error {
	v := c.id.verbs
	if v == nil || v.device == nil {
		return fmt.Errorf("ibv: rdma_cm: %w: the id is bound to no device", verbs.ErrNoDevice)
	}
	c.dev = C.GoString(C.gordma_ibv_get_device_name(v.device))
	c.port = uint8(c.id.port_num)
	var pa C.struct_ibv_port_attr
	if C.gordma_query_port(v, C.uint8_t(c.port), &pa) == 0 {
		c.ibLink = pa.link_layer == C.IBV_LINK_LAYER_INFINIBAND
	}
	c.local = cmSockAddr(c.id, false)
	c.remote = cmSockAddr(c.id, true)
	return nil
}

// Device is the name of the device the connection runs on. Open it with
// Provider.Open and create the QP there.
func (c *CMID) Device() string { return c.dev }

// Port is the device port the connection runs on.
func (c *CMID) Port() uint8 { return c.port }

// LocalAddr is this end's IP address and port.
func (c *CMID) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the peer's IP address and port.
func (c *CMID) RemoteAddr() net.Addr { return c.remote }

// PrivateData is what the peer sent with its request (passive side) or
// its accept (active side, after Connect), padded with zeros to the
// transport's size. It is a copy.
func (c *CMID) PrivateData() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.priv...)
}

// ourQP checks that q is an RC QP of this provider on the id's device.
func (c *CMID) ourQP(q verbs.QP) (*qp, error) {
	iq, ok := q.(*qp)
	if !ok || iq == nil {
		return nil, fmt.Errorf("ibv: rdma_cm: %w: %T is not a QP of the verbs provider", verbs.ErrInvalid, q)
	}
	if iq.typ != verbs.RC {
		return nil, fmt.Errorf("ibv: rdma_cm: %w: connects RC QPs, not %v", verbs.ErrInvalid, iq.typ)
	}
	if name := iq.pd.ctx.info.Name; name != c.dev {
		return nil, fmt.Errorf("ibv: rdma_cm: %w: the QP is on device %s but the connection runs on %s; create it on Device()", verbs.ErrInvalid, name, c.dev)
	}
	return iq, nil
}

// ModifyQP moves q, an RC QP of this provider created on Device(), to
// INIT, RTR or RTS with the attributes rdma_cm gives for this
// connection (rdma_init_qp_attr, then ibv_modify_qp). INIT works once
// the route is resolved (active) or the request arrived (passive), so
// receives can be posted before Connect or Accept; RTR and RTS need the
// peer's answer, and Connect and Accept make those moves themselves.
func (c *CMID) ModifyQP(q verbs.QP, state verbs.QPState) error {
	iq, err := c.ourQP(q)
	if err != nil {
		return err
	}
	return c.modifyQP(iq, state)
}

func (c *CMID) modifyQP(q *qp, to verbs.QPState) error {
	if to != verbs.StateInit && to != verbs.StateRTR && to != verbs.StateRTS {
		return fmt.Errorf("ibv: rdma_cm ModifyQP: %w: rdma_cm gives attributes for INIT, RTR and RTS, not %v", verbs.ErrInvalid, to)
	}
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	var attr C.struct_ibv_qp_attr
	var mask C.int
	attr.qp_state = C.enum_ibv_qp_state(to)
	rc, err := C.gordma_rdma_init_qp_attr(c.id, &attr, &mask)
	c.lt.Exit()
	if rc != 0 {
		return errnoErr(fmt.Sprintf("rdma_init_qp_attr %v", to), err)
	}
	if mask&C.IBV_QP_STATE == 0 {
		// rdma_cm asks for no state change: iWARP's RTS, which the
		// kernel's iWARP CM makes itself when the connection is
		// established (a modify to RTS by hand fails there).
		// librdmacm's ibv_modify_qp without IBV_QP_STATE changes
		// nothing that matters either (the port, set at INIT).
		return nil
	}
	if c.ibLink {
		// As librdmacm: bits 21-24 were RoCE-only kernel attributes.
		mask &^= C.int(0xe00000)
	}
	c.mu.Lock()
	if c.override {
		switch to {
		case verbs.StateRTR:
			attr.max_dest_rd_atomic = C.uint8_t(c.accRR)
		case verbs.StateRTS:
			attr.max_rd_atomic = C.uint8_t(c.accDepth)
		}
	}
	c.mu.Unlock()
	if to == verbs.StateInit {
		q.port = uint8(attr.port_num)
	}
	return q.modify(&attr, mask, to)
}

// setState moves from want to next, or reports why it cannot.
func (c *CMID) setState(op string, want, next cmState) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != want {
		what := map[cmState]string{cmRouted: "a CMID from CMDial", cmRequested: "a CMID from CMListener.Accept"}[want]
		return fmt.Errorf("ibv: rdma_cm %s: %w: needs %s that has not connected, accepted or rejected yet", op, verbs.ErrInvalid, what)
	}
	c.state = next
	return nil
}

func (c *CMID) finish(st cmState, q *qp) {
	c.mu.Lock()
	c.state = st
	if st == cmConnected {
		c.qp = q
	}
	c.mu.Unlock()
}

// cmDepth is v, or min(16, devMax) for 0.
func cmDepth(v uint8, devMax int) uint8 {
	if v != 0 {
		return v
	}
	return uint8(min(16, max(devMax, 0)))
}

func cmRetry(v uint8) (uint8, error) {
	if v == 0 {
		return 7, nil
	}
	if v > 7 {
		return 0, fmt.Errorf("ibv: rdma_cm: %w: retry count %d is above 7", verbs.ErrInvalid, v)
	}
	return v, nil
}

func dataArg(b []byte) (unsafe.Pointer, C.uint8_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), C.uint8_t(len(b))
}

// Connect connects q (an RC QP created on Device()) to the peer: it
// moves q to INIT if it is still RESET, sends the request, waits for the
// peer's accept, moves q to RTR and RTS with rdma_cm's attributes and
// completes the handshake. The QP's remote access flags are rdma_cm's:
// REMOTE_WRITE, plus READ and ATOMIC when responder resources were
// granted; memory regions decide what is actually exposed. A rejection
// gives a *CMEventError matching syscall.ECONNREFUSED. On any error,
// Close the CMID; ctx ending gives ctx.Err().
func (c *CMID) Connect(ctx context.Context, q verbs.QP, p CMParams) error {
	iq, err := c.ourQP(q)
	if err != nil {
		return err
	}
	if len(p.PrivateData) > CMMaxConnectData {
		return fmt.Errorf("ibv: rdma_cm connect: %w: %d bytes of private data, at most %d", verbs.ErrInvalid, len(p.PrivateData), CMMaxConnectData)
	}
	retry, err := cmRetry(p.RetryCount)
	if err != nil {
		return err
	}
	rnr, err := cmRetry(p.RNRRetryCount)
	if err != nil {
		return err
	}
	if err := c.setState("connect", cmRouted, cmConnecting); err != nil {
		return err
	}
	err = c.connect(ctx, iq, p, retry, rnr)
	if err != nil {
		c.finish(cmFailed, nil)
		return err
	}
	c.finish(cmConnected, iq)
	return nil
}

func (c *CMID) connect(ctx context.Context, q *qp, p CMParams, retry, rnr uint8) error {
	if verbs.QPState(q.state.Load()) == verbs.StateReset {
		if err := c.modifyQP(q, verbs.StateInit); err != nil {
			return err
		}
	}
	da := q.pd.ctx.attr
	rr := cmDepth(p.ResponderResources, da.MaxQPRdAtom)
	depth := cmDepth(p.InitiatorDepth, da.MaxQPInitRdAtom)
	srq := C.int(0)
	if q.srq != nil {
		srq = 1
	}
	data, n := dataArg(p.PrivateData)
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	rc := C.gordma_cm_establish(c.id, 0, C.uint32_t(q.qpn), srq, C.uint8_t(rr), C.uint8_t(depth), C.uint8_t(retry), C.uint8_t(rnr), data, n)
	c.lt.Exit()
	if rc != 0 {
		return errnoErr("rdma_connect", syscall.Errno(rc))
	}
	// On iWARP the kernel completes the handshake and moves the QP to
	// RTS itself: the active side gets ESTABLISHED, no CONNECT_RESPONSE
	// to answer.
	want := cmConnectResp
	if q.iwarp() {
		want = cmEstablished
	}
	ev, err := c.waitFor(ctx, "connect", want)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.priv = ev.priv
	c.mu.Unlock()
	if q.iwarp() {
		q.state.Store(uint32(verbs.StateRTS))
		return nil
	}
	// INIT again: the access flags come with the peer's answer.
	for _, s := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := c.modifyQP(q, s); err != nil {
			c.abort(q)
			return err
		}
	}
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	rc2, err := C.gordma_rdma_establish(c.id)
	c.lt.Exit()
	if rc2 != 0 {
		q.ToError()
		return errnoErr("rdma_establish", err)
	}
	return nil
}

// abort rejects the peer's answer after a local failure and stops q.
func (c *CMID) abort(q *qp) {
	if c.lt.Enter() {
		C.gordma_rdma_reject(c.id, nil, 0)
		c.lt.Exit()
	}
	q.ToError()
}

// Accept accepts the request with q (an RC QP created on Device()): it
// moves q to INIT (posted receives stay), RTR and RTS with rdma_cm's
// attributes, sends the accept and waits until the connection is
// established. Responder resources and initiator depth are capped by
// what the request offered. On any error, Close the CMID; ctx ending
// gives ctx.Err().
func (c *CMID) Accept(ctx context.Context, q verbs.QP, p CMParams) error {
	iq, err := c.ourQP(q)
	if err != nil {
		return err
	}
	if len(p.PrivateData) > CMMaxAcceptData {
		return fmt.Errorf("ibv: rdma_cm accept: %w: %d bytes of private data, at most %d", verbs.ErrInvalid, len(p.PrivateData), CMMaxAcceptData)
	}
	rnr, err := cmRetry(p.RNRRetryCount)
	if err != nil {
		return err
	}
	if err := c.setState("accept", cmRequested, cmConnecting); err != nil {
		return err
	}
	if err := c.accept(ctx, iq, p, rnr); err != nil {
		c.finish(cmFailed, nil)
		return err
	}
	c.finish(cmConnected, iq)
	return nil
}

func (c *CMID) accept(ctx context.Context, q *qp, p CMParams, rnr uint8) error {
	da := q.pd.ctx.attr
	c.mu.Lock()
	rr := min(cmDepth(p.ResponderResources, da.MaxQPRdAtom), c.reqRR)
	depth := min(cmDepth(p.InitiatorDepth, da.MaxQPInitRdAtom), c.reqDepth)
	c.override, c.accRR, c.accDepth = true, rr, depth
	c.mu.Unlock()
	for _, s := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := c.modifyQP(q, s); err != nil {
			c.abort(q)
			return err
		}
	}
	srq := C.int(0)
	if q.srq != nil {
		srq = 1
	}
	data, n := dataArg(p.PrivateData)
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	rc := C.gordma_cm_establish(c.id, 1, C.uint32_t(q.qpn), srq, C.uint8_t(rr), C.uint8_t(depth), 0, C.uint8_t(rnr), data, n)
	c.lt.Exit()
	if rc != 0 {
		q.ToError()
		return errnoErr("rdma_accept", syscall.Errno(rc))
	}
	if _, err := c.waitFor(ctx, "accept", cmEstablished); err != nil {
		return err
	}
	if q.iwarp() {
		// The kernel moved the QP to RTS with the connection (the
		// RTS step above had nothing to set).
		q.state.Store(uint32(verbs.StateRTS))
	}
	return nil
}

// iwarp reports whether q is on an iWARP device, which rdma_cm connects
// differently (see connect and accept).
func (q *qp) iwarp() bool { return q.pd.ctx.info.Transport == "iWARP" }

// Reject refuses the request, sending privateData (at most
// CMMaxRejectData bytes, may be nil) to the peer, whose Connect fails
// with a *CMEventError matching syscall.ECONNREFUSED. Close the CMID
// afterwards.
func (c *CMID) Reject(privateData []byte) error {
	if len(privateData) > CMMaxRejectData {
		return fmt.Errorf("ibv: rdma_cm reject: %w: %d bytes of private data, at most %d", verbs.ErrInvalid, len(privateData), CMMaxRejectData)
	}
	if err := c.setState("reject", cmRequested, cmRefused); err != nil {
		return err
	}
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	defer c.lt.Exit()
	data, n := dataArg(privateData)
	if rc := C.gordma_cm_reject(c.id, data, n); rc != 0 {
		return errnoErr("rdma_reject", syscall.Errno(rc))
	}
	return nil
}

// Disconnect starts the disconnect (sends a DREQ), or answers the peer's
// (sends a DREP). It does not wait: WaitDisconnect does.
//
// Unlike librdmacm's rdma_disconnect, it leaves the QP in RTS: moving it
// to ERR first can drop the acknowledgement of a message this side has
// already received (rxe posts the receive completion before it sends the
// ACK, and drops packets of a QP that left RTS), and the peer's send
// then fails with RETRY_EXC_ERR although its data arrived. Post nothing
// after Disconnect; WaitDisconnect moves the QP to ERR.
func (c *CMID) Disconnect() error {
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	defer c.lt.Exit()
	if rc, err := C.gordma_rdma_disconnect(c.id); rc != 0 {
		return errnoErr("rdma_disconnect", err)
	}
	return nil
}

// WaitDisconnect waits until the connection is disconnected, by the
// peer or after Disconnect (the peer answered, or the request timed
// out), then moves the connected QP to ERR so its outstanding work
// requests complete with WR_FLUSH_ERR. After the peer's disconnect, call
// Disconnect to answer it. It returns ctx.Err() when ctx ends first.
func (c *CMID) WaitDisconnect(ctx context.Context) error {
	c.mu.Lock()
	done := c.disconnected
	c.mu.Unlock()
	if !done {
		if _, err := c.waitFor(ctx, "wait for disconnect", cmDisconnected); err != nil {
			return err
		}
	}
	c.mu.Lock()
	q := c.qp
	c.mu.Unlock()
	if q == nil || verbs.QPState(q.state.Load()) == verbs.StateError {
		return nil
	}
	if err := q.ToError(); err != nil && !errors.Is(err, verbs.ErrClosed) {
		return err
	}
	return nil
}

// waitFor reads events until one of type want. Events that end a
// connection attempt give a *CMEventError; bookkeeping events are
// skipped.
func (c *CMID) waitFor(ctx context.Context, op string, want int) (cmEvent, error) {
	for {
		ev, err := readCMEvent(ctx, c.w, c.ch)
		if err != nil {
			return ev, err
		}
		if ev.typ == cmDisconnected {
			c.mu.Lock()
			c.disconnected = true
			c.mu.Unlock()
		}
		if ev.typ == want {
			if ev.status != 0 && want != cmDisconnected {
				return ev, cmEventErr(op, ev)
			}
			return ev, nil
		}
		switch ev.typ {
		case cmAddrError, cmRouteError, cmConnectError, cmUnreachable, cmRejected, cmDisconnected, cmDeviceRemoval:
			return ev, cmEventErr(op, ev)
		}
		// TIMEWAIT_EXIT, ADDR_CHANGE, a late ESTABLISHED: nothing to do.
	}
}

// Close destroys the id (a connected id sends a disconnect request) and
// its event channel, waking a waiting call with an error wrapping
// verbs.ErrClosed. It does not touch the QP, which the caller closes.
func (c *CMID) Close() error {
	return c.lt.Close(func() error {
		c.w.close()
		if rc, err := C.gordma_rdma_destroy_id(c.id); rc != 0 {
			return errnoErr("rdma_destroy_id", err)
		}
		C.gordma_rdma_destroy_event_channel(c.ch)
		return nil
	})
}
