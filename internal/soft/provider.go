package soft

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// DeviceName is the one device of the soft provider.
const DeviceName = "soft0"

// Environment variables read when the first Context opens.
const (
	// EnvAddr is the ip:port the provider listens on for peers in other
	// processes or on other hosts; default 127.0.0.1:0 (loopback, any
	// free port). The IP becomes the port's RoCE v2 GID and the port its
	// LID, so peers must be able to reach exactly that address.
	EnvAddr = "RDMA_SOFT_ADDR"
	// EnvTransport set to "tcp" sends even traffic between QPs of this
	// process over the loopback TCP connection, to test the wire path.
	EnvTransport = "RDMA_SOFT_TRANSPORT"
)

// Provider is the soft provider.
var Provider verbs.Provider = provider{}

type provider struct{}

func (provider) Name() string { return "soft" }

func (provider) Devices() ([]verbs.DeviceInfo, error) {
	return []verbs.DeviceInfo{dev.info()}, nil
}

func (provider) Open(name string) (verbs.Context, error) {
	if name != "" && name != DeviceName {
		return nil, fmt.Errorf("soft: open %q: %w (the soft provider has only %q)", name, verbs.ErrNoDevice, DeviceName)
	}
	return dev.open()
}

// device is soft0: the listener, the connections to peers, and the tables
// that name QPs and MRs. There is one per process.
type device struct {
	guid verbs.GUID

	life sync.Mutex // serialises starting and stopping the listener

	mu       sync.Mutex
	nctx     int
	running  bool
	ln       net.Listener
	addr     netip.AddrPort // advertised: GID IP and LID port
	forceTCP bool
	out      map[outKey]*dialCall  // outgoing connections
	conns    map[*conn]struct{}    // every connection with goroutines
	raw      map[net.Conn]struct{} // accepted, still in handshake
	wg       sync.WaitGroup
}

var dev = &device{guid: verbs.GUID(uint64(randKey())<<32 | uint64(randKey()))}

func defaultAddr() string { return "127.0.0.1:0" }

func (d *device) info() verbs.DeviceInfo {
	d.mu.Lock()
	addr := d.addr
	running := d.running
	d.mu.Unlock()
	if !running {
		// Not listening yet: show the address it would take.
		if ap, err := netip.ParseAddrPort(envOr(EnvAddr, defaultAddr())); err == nil {
			addr = ap
		} else {
			addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
		}
	}
	return verbs.DeviceInfo{
		Name:      DeviceName,
		Provider:  "soft",
		NodeGUID:  d.guid,
		NodeType:  "CA",
		Transport: "software",
		FWVer:     fmt.Sprintf("soft-wire-%d", wireVersion),
		Ports: []verbs.PortInfo{{
			Port:      1,
			State:     verbs.PortActive,
			PhysState: "5: LinkUp",
			LinkLayer: "Ethernet",
			LID:       addr.Port(),
			ActiveMTU: verbs.MTU4096,
			MaxMTU:    verbs.MTU4096,
			Rate:      "software",
			GIDs:      []verbs.GIDEntry{{Index: 0, GID: verbs.GIDFromIP(addr.Addr()), Type: verbs.GIDTypeRoCEv2}},
		}},
		Usable: true,
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// open starts the listener if this is the first Context.
func (d *device) open() (verbs.Context, error) {
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	first := d.nctx == 0
	d.mu.Unlock()
	if first {
		if err := d.start(); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	d.nctx++
	d.mu.Unlock()
	return newContext(d.info()), nil
}

// release is called when a Context closes; the last one stops the
// listener and every connection, so no goroutine outlives the Contexts.
func (d *device) release() {
	d.life.Lock()
	defer d.life.Unlock()
	d.mu.Lock()
	d.nctx--
	last := d.nctx == 0
	d.mu.Unlock()
	if last {
		d.stop()
	}
}

func (d *device) start() error {
	spec := envOr(EnvAddr, defaultAddr())
	ap, err := netip.ParseAddrPort(spec)
	if err != nil {
		return fmt.Errorf("soft: %s=%q: want ip:port: %w", EnvAddr, spec, err)
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return fmt.Errorf("soft: listen on %s (set %s to change it): %w", ap, EnvAddr, err)
	}
	bound := ln.Addr().(*net.TCPAddr).AddrPort()
	ip := ap.Addr().Unmap()
	if ip.IsUnspecified() {
		ip = pickIP()
	}
	d.mu.Lock()
	d.ln = ln
	d.addr = netip.AddrPortFrom(ip, bound.Port())
	d.forceTCP = strings.EqualFold(os.Getenv(EnvTransport), "tcp")
	d.running = true
	d.out = map[outKey]*dialCall{}
	d.conns = map[*conn]struct{}{}
	d.raw = map[net.Conn]struct{}{}
	d.wg.Add(1)
	d.mu.Unlock()
	go d.acceptLoop(ln)
	return nil
}

// pickIP is the address advertised for a listener on an unspecified IP:
// the first non-loopback IPv4 address, else 127.0.0.1.
func pickIP() netip.Addr {
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					ip = ip.Unmap()
					if ip.Is4() && !ip.IsLoopback() {
						return ip
					}
				}
			}
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

func (d *device) stop() {
	d.mu.Lock()
	ln := d.ln
	d.running = false
	d.ln = nil
	conns := d.conns
	raw := d.raw
	d.conns, d.raw, d.out = nil, nil, nil
	d.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for c := range raw {
		c.Close()
	}
	for c := range conns {
		c.fail(fmt.Errorf("soft: device closed: %w", net.ErrClosed), false)
	}
	d.wg.Wait()
}

func (d *device) acceptLoop(ln net.Listener) {
	defer d.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		d.mu.Lock()
		if !d.running || d.ln != ln {
			d.mu.Unlock()
			nc.Close()
			return
		}
		d.raw[nc] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.acceptConn(nc)
	}
}

// outKey names an outgoing connection: a provider sends its requests to
// a peer on up to stripes connections, a QP on the one its QPN picks, so
// that the QPs of a busy pair of processes are not all funnelled through
// one socket and its two goroutines on each side. Connections are dialed
// when first needed.
type outKey struct {
	peer   netip.AddrPort
	stripe int
}

const stripes = 4

// stripeOf is the connection QP qpn sends on.
func stripeOf(qpn uint32) int { return int(qpn % stripes) }

// existing returns the live connection to peer on the given stripe, if
// one is up; it never dials or waits.
func (d *device) existing(peer netip.AddrPort, stripe int) *conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	dc := d.out[outKey{peer, stripe}]
	if dc == nil {
		return nil
	}
	select {
	case <-dc.done:
		if dc.err == nil && !dc.c.isDead() {
			return dc.c
		}
	default:
	}
	return nil
}

// local reports whether peer is this device and traffic to it stays in
// the process.
func (d *device) local(peer netip.AddrPort) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.forceTCP && peer == d.addr
}

func (d *device) self() netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.addr
}

// routeOf turns an address into the peer's listener address.
func routeOf(a verbs.Address) (netip.AddrPort, error) {
	if a.Port > 1 {
		return netip.AddrPort{}, fmt.Errorf("soft: %w: port %d (soft0 has only port 1)", verbs.ErrInvalid, a.Port)
	}
	if a.LID == 0 {
		return netip.AddrPort{}, fmt.Errorf("soft: %w: address without LID (the soft provider routes by GID IP and LID = TCP port)", verbs.ErrInvalid)
	}
	ip := dev.self().Addr()
	if !a.GID.IsZero() {
		ip = a.GID.IP()
	}
	return netip.AddrPortFrom(ip, a.LID), nil
}

// The QP table: QPNs are unique in the process so that both in-process
// and TCP requests find their QP by number.
var qps = struct {
	sync.RWMutex
	m    map[uint32]*qp
	next uint32
}{m: map[uint32]*qp{}, next: 0x11}

func addQP(q *qp) {
	qps.Lock()
	defer qps.Unlock()
	for {
		n := qps.next
		qps.next = (qps.next + 1) & qpnMask
		if qps.next < 2 {
			qps.next = 2
		}
		if _, used := qps.m[n]; !used {
			q.qpn = n
			qps.m[n] = q
			return
		}
	}
}

// getQP finds a QP and holds it; the caller releases it with
// q.refs.release().
func getQP(n uint32) *qp {
	qps.RLock()
	q := qps.m[n]
	if q != nil {
		q.refs.acquire()
	}
	qps.RUnlock()
	return q
}

// connectedTo lists the RC and UC QPs connected to peer. A UD QP serves
// everyone, so one failed peer does not take it down.
func connectedTo(peer netip.AddrPort) []uint32 {
	qps.RLock()
	defer qps.RUnlock()
	var out []uint32
	for n, q := range qps.m {
		if q.typ != verbs.UD && q.remote() == peer {
			out = append(out, n)
		}
	}
	return out
}

func removeQP(q *qp) {
	qps.Lock()
	delete(qps.m, q.qpn)
	qps.Unlock()
}

// The key table: lkeys and rkeys of every MR, drawn at random.
var keys = keyTable{m: map[uint32]*mr{}}

type keyTable struct {
	sync.RWMutex
	m map[uint32]*mr
}

// lookup finds the MR with lkey (remote false) or rkey (remote true) k
// and holds it.
func (t *keyTable) lookup(k uint32, remote bool) *mr {
	t.RLock()
	m := t.m[k]
	if m != nil {
		if (remote && m.rkey != k) || (!remote && m.lkey != k) {
			m = nil
		} else {
			m.refs.acquire()
		}
	}
	t.RUnlock()
	return m
}

// keyCache is one QP's memory of the last MR a key lookup found, so that
// a run of WRs on one buffer (a Batch's staging, a stream's ring) skips
// the table's lock and map: a lookup in the table was a tenth of an
// in-process WRITE's cost (BenchmarkWrite/batch/8B/qd64). The QP's mu
// guards it. A cached MR is used only while it is open: get takes a
// reference first and then checks that Close has not begun, the order
// that makes Close's drain either see the reference or this check see
// the close.
type keyCache struct {
	key uint32
	m   *mr
}

// get is keys.lookup(k, remote) through the cache.
func (c *keyCache) get(k uint32, remote bool) *mr {
	if m := c.m; m != nil && c.key == k {
		m.refs.acquire()
		if !m.refs.closing.Load() {
			return m
		}
		m.refs.release()
	}
	m := keys.lookup(k, remote)
	c.key, c.m = k, m
	return m
}

func (t *keyTable) add(m *mr) {
	t.Lock()
	defer t.Unlock()
	for {
		k := randKey()
		if _, used := t.m[k]; !used {
			m.lkey = k
			t.m[k] = m
			break
		}
	}
	for {
		k := randKey()
		if _, used := t.m[k]; !used {
			m.rkey = k
			t.m[k] = m
			break
		}
	}
}

func (t *keyTable) remove(m *mr) {
	t.Lock()
	delete(t.m, m.lkey)
	delete(t.m, m.rkey)
	t.Unlock()
}

// Pending CQ overruns, handled with no QP lock held (see handleOverflows).
var overruns struct {
	pending atomic.Int32
	mu      sync.Mutex
	list    []*cq
}

// handleOverflows moves the QPs of every overrun CQ to ERR and reports
// EventCQErr. It runs at the end of each operation that may complete WRs,
// when the caller holds no QP lock.
func handleOverflows() {
	for overruns.pending.Load() != 0 {
		overruns.mu.Lock()
		list := overruns.list
		overruns.list = nil
		overruns.pending.Store(0)
		overruns.mu.Unlock()
		for _, c := range list {
			c.overrun()
		}
	}
}
