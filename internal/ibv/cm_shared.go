//go:build linux && (cgo || amd64 || arm64)

package ibv

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

	"github.com/go-rdma/rdma/internal/verbs"
)

// The rdma_cm logic both bindings share: the cgo one (cm.go) and the
// purego one (cm_purego.go) each supply cmHandles, an id and its event
// channel, and the few calls into librdmacm on them; the states, waits,
// checks and error texts here are the same for both.

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
	h  cmHandles
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
	readDepth    uint8 // active, iWARP: the READs the connection lets this side have outstanding
}

// CMListener listens for rdma_cm connection requests.
type CMListener struct {
	lt   verbs.Lifetime
	h    cmHandles
	w    *fdWaiter
	addr CMAddr
}

// createCM makes an event channel, its non-blocking waiter and an id in
// the TCP port space. It is the one way to an rdma_cm object, so it is
// where librdmacm is loaded.
func createCM(name string) (cmHandles, *fdWaiter, error) {
	if err := loadCM(); err != nil {
		return cmHandles{}, nil, err
	}
	h, err := cmCreateChannel()
	if err != nil {
		return cmHandles{}, nil, errnoErr("rdma_create_event_channel (is the rdma_ucm module loaded?)", err)
	}
	w, err := newFDWaiter(h.fd(), name)
	if err != nil {
		h.destroyChannel()
		return cmHandles{}, nil, err
	}
	if err := h.createID(); err != nil {
		w.close()
		h.destroyChannel()
		return cmHandles{}, nil, errnoErr("rdma_create_id", err)
	}
	return h, w, nil
}

// destroy destroys the id, then its event channel.
func (h cmHandles) destroy() error {
	if err := h.destroyID(); err != nil {
		return errnoErr("rdma_destroy_id", err)
	}
	h.destroyChannel()
	return nil
}

// cmEvent is an rdma_cm event in Go values, copied out of librdmacm's
// memory so the event could be acknowledged before Go looks at it.
type cmEvent struct {
	typ       int
	status    int
	rr, depth uint8
	priv      []byte
	// CONNECT_REQUEST: the new id, moved to an event channel of its
	// own; or, when that failed, migrateErr (the request was then
	// rejected and its id destroyed).
	h          cmHandles
	migrateErr syscall.Errno
}

// readCMEvent waits for the next event of h's channel through the
// netpoller. h.getEvent reads one event without blocking, gives the id
// of a connection request its own channel and acknowledges the event.
func readCMEvent(ctx context.Context, w *fdWaiter, h cmHandles) (cmEvent, error) {
	var ev cmEvent
	err := w.wait(ctx, func() (bool, error) {
		var err error
		ev, err = h.getEvent()
		if errors.Is(err, syscall.EAGAIN) {
			return false, nil
		}
		if err != nil {
			return true, errnoErr("rdma_get_cm_event", err)
		}
		return true, nil
	})
	if err != nil {
		return cmEvent{}, err
	}
	return ev, nil
}

// cmEventNames is indexed by the cm* event types of cm_types.go (enum
// rdma_cm_event_type).
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
func cmMillis(d time.Time, limit time.Duration) int {
	return int(max(1, min(time.Until(d), limit)/time.Millisecond))
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

// cmScope is the IPv6 scope id of a's zone (a number or an interface
// name), 0 for none.
func cmScope(a netip.AddrPort) uint32 {
	z := a.Addr().Zone()
	if z == "" {
		return 0
	}
	if n, err := strconv.Atoi(z); err == nil {
		return uint32(n)
	}
	if ifi, err := net.InterfaceByName(z); err == nil {
		return uint32(ifi.Index)
	}
	return 0
}

// cmAddrFrom is a socket address read out of C (v4-mapped for IPv4, so
// v4 says which) as a CMAddr.
func cmAddrFrom(ip [16]byte, port uint16, v4 bool) CMAddr {
	a := netip.AddrFrom16(ip)
	if v4 {
		a = a.Unmap()
	}
	return CMAddr{netip.AddrPortFrom(a, port)}
}

// CMListen listens for connection requests on addr ("ip:port", ":port"
// for every address; port 0 picks one, see Addr). backlog <= 0 takes the
// kernel's default.
func CMListen(addr string, backlog int) (*CMListener, error) {
	ap, err := parseCMAddr(context.Background(), addr, true)
	if err != nil {
		return nil, err
	}
	h, w, err := createCM("rdma_cm-listen")
	if err != nil {
		return nil, err
	}
	l := &CMListener{h: h, w: w}
	if err := h.bind(ap); err != nil {
		l.Close()
		return nil, errnoErr("rdma_bind_addr "+ap.String(), err)
	}
	if err := h.listen(max(backlog, 0)); err != nil {
		l.Close()
		return nil, errnoErr("rdma_listen "+ap.String(), err)
	}
	l.addr = h.sockAddr(false)
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
		ev, err := readCMEvent(ctx, l.w, l.h)
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
	w, err := newFDWaiter(ev.h.fd(), "rdma_cm")
	if err != nil {
		ev.h.reject(nil)
		ev.h.destroy()
		return nil, err
	}
	c := &CMID{h: ev.h, w: w, state: cmRequested, priv: ev.priv, reqRR: ev.rr, reqDepth: ev.depth}
	if err := c.learn(); err != nil {
		ev.h.reject(nil)
		c.Close()
		return nil, err
	}
	return &CMRequest{CMID: c, ResponderResources: ev.rr, InitiatorDepth: ev.depth}, nil
}

// Close stops listening. Requests already returned by Accept live on.
func (l *CMListener) Close() error {
	return l.lt.Close(func() error {
		l.w.close()
		return l.h.destroy()
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
	h, w, err := createCM("rdma_cm")
	if err != nil {
		return nil, err
	}
	c := &CMID{h: h, w: w}
	fail := func(err error) (*CMID, error) {
		c.Close()
		return nil, err
	}
	deadline := cmDeadline(ctx)
	for {
		if err := h.resolveAddr(src, dst, cmMillis(deadline, cmAddrAttempt)); err != nil {
			return fail(errnoErr("rdma_resolve_addr "+dst.String(), err))
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
	if err := h.resolveRoute(cmMillis(cmDeadline(ctx), cmResolveTime)); err != nil {
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
	dev, port, ibLink, ok := c.h.device()
	if !ok {
		return fmt.Errorf("ibv: rdma_cm: %w: the id is bound to no device", verbs.ErrNoDevice)
	}
	c.dev, c.port, c.ibLink = dev, port, ibLink
	c.local = c.h.sockAddr(false)
	c.remote = c.h.sockAddr(true)
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

// modifyQP is ModifyQP for a checked QP.
func (c *CMID) modifyQP(q *qp, to verbs.QPState) error {
	if to != verbs.StateInit && to != verbs.StateRTR && to != verbs.StateRTS {
		return fmt.Errorf("ibv: rdma_cm ModifyQP: %w: rdma_cm gives attributes for INIT, RTR and RTS, not %v", verbs.ErrInvalid, to)
	}
	c.mu.Lock()
	override, rr, depth := c.override, c.accRR, c.accDepth
	c.mu.Unlock()
	return c.modifyQPAttr(q, to, cmQPOverride{set: override, rr: rr, depth: depth})
}

// modifyQPAttr asks rdma_cm for the attributes of state to and applies
// them to q.
func (c *CMID) modifyQPAttr(q *qp, to verbs.QPState, o cmQPOverride) error {
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	var attr qpAttr
	attr.setState(to)
	mask, err := c.h.initQPAttr(&attr)
	c.lt.Exit()
	if err != nil {
		return errnoErr(fmt.Sprintf("rdma_init_qp_attr %v", to), err)
	}
	if mask&ibvQPState == 0 {
		// rdma_cm asks for no state change: iWARP's RTS, which the
		// kernel's iWARP CM makes itself when the connection is
		// established (a modify to RTS by hand fails there).
		// librdmacm's ibv_modify_qp without IBV_QP_STATE changes
		// nothing that matters either (the port, set at INIT).
		return nil
	}
	if c.ibLink {
		mask &^= cmRoCEOnlyMask
	}
	if o.set {
		switch to {
		case verbs.StateRTR:
			attr.setMaxDestRdAtomic(o.rr)
		case verbs.StateRTS:
			attr.setMaxRdAtomic(o.depth)
		}
	}
	if to == verbs.StateInit {
		q.port = attr.port()
	}
	return q.modify(&attr, mask, to)
}

// cmQPOverride replaces rdma_cm's read/atomic depths with what the
// passive side granted (set), at RTR (rr) and RTS (depth).
type cmQPOverride struct {
	set       bool
	rr, depth uint8
}

// cmRoCEOnlyMask are bits 21-24 of an attribute mask from
// rdma_init_qp_attr: RoCE-only kernel attributes that librdmacm drops
// on an InfiniBand link, as modifyQPAttr does.
const cmRoCEOnlyMask = 0xe00000

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

// cmConnParams are the values of a struct rdma_conn_param, which each
// binding builds in memory C may read during the call.
type cmConnParams struct {
	qpn       uint32
	srq       bool
	rr, depth uint8
	retry     uint8 // the active side's; ignored when accepting
	rnr       uint8
	data      []byte
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
	cp := cmConnParams{
		qpn:   q.qpn,
		srq:   q.srq != nil,
		rr:    cmDepth(p.ResponderResources, da.MaxQPRdAtom),
		depth: cmDepth(p.InitiatorDepth, da.MaxQPInitRdAtom),
		retry: retry,
		rnr:   rnr,
		data:  p.PrivateData,
	}
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	err := c.h.establish(false, cp)
	c.lt.Exit()
	if err != nil {
		return errnoErr("rdma_connect", err)
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
	if q.iwarp() {
		// The iWARP CM reports the negotiated ORD of this side as the
		// event's responder resources (the kernel's cma_iw_handler).
		c.readDepth = ev.rr
	}
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
	err = c.h.rdmaEstablish()
	c.lt.Exit()
	if err != nil {
		q.ToError()
		return errnoErr("rdma_establish", err)
	}
	return nil
}

// ReadDepth is, on iWARP, how many RDMA READs the connection lets this
// side have outstanding, as the connection manager reported it when
// Connect completed: 0 when the peer takes none, whose QP a READ would
// fail. It is 0 on other transports and before Connect returns.
func (c *CMID) ReadDepth() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.readDepth)
}

// abort rejects the peer's answer after a local failure and stops q.
func (c *CMID) abort(q *qp) {
	if c.lt.Enter() {
		c.h.reject(nil)
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
	if !c.lt.Enter() {
		return verbs.ErrClosed
	}
	err := c.h.establish(true, cmConnParams{qpn: q.qpn, srq: q.srq != nil, rr: rr, depth: depth, rnr: rnr, data: p.PrivateData})
	c.lt.Exit()
	if err != nil {
		q.ToError()
		return errnoErr("rdma_accept", err)
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
	if err := c.h.reject(privateData); err != nil {
		return errnoErr("rdma_reject", err)
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
	if err := c.h.disconnect(); err != nil {
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
		ev, err := readCMEvent(ctx, c.w, c.h)
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
		return c.h.destroy()
	})
}
