package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// engine holds what the connections of one device port share: the
// device context, the PD, the buffer pool, the CQs with their pollers and
// the table of operations in flight. Its cfg holds the engine's settings
// (engineKey); each connection has its own config for the rest.
type engine struct {
	cfg     config
	key     engineKey
	shared  bool // in the registry of the package-level Dial and Listen
	prov    verbs.Provider
	ctx     verbs.Context
	attr    verbs.DeviceAttr
	lacking map[verbs.Feature]error // what the device cannot do (verbs.Lacks), read at the call
	pd      verbs.PD
	pool    *pool.Pool
	credits creditPages // the connections' credit words (credit_word.go)
	port    verbs.PortInfo
	slots   slots                               // wr_id -> connection
	srqs    [maxSRQs]atomic.Pointer[sharedRecv] // by id; made under mu (srq.go)
	qpns    sync.Map                            // QPN -> *Conn, for receives from an SRQ
	events  context.CancelFunc                  // stops readEvents
	evDone  chan struct{}

	logLimit logLimiter // device events (events.go)

	// RecvHandler dispatch (dispatch.go)
	dmu        sync.Mutex
	runq       fifo[*Conn]
	workers    int            // running
	maxWorkers int            // WithHandlerWorkers, set at the first dispatch
	dwg        sync.WaitGroup // the workers
	handlers   atomic.Int64   // RecvHandler calls running

	// Counters of the closed connections (stats.go)
	retired closedStats
	life    lifeCounters

	mu     sync.Mutex
	units  []*cqUnit
	refs   int
	closed bool
}

// cqUnit is one CQ, its completion channel and its poller. Connections
// reserve room in it for every WR they can have outstanding, so the CQ
// can never overrun.
type cqUnit struct {
	cq    verbs.CQ
	ch    verbs.CompChannel
	p     *poller.Poller
	free  int
	conns map[*Conn]struct{} // under engine.mu
}

// cqEntries bounds one connection's CQ reservation (its send and
// receive depths); firstCQ and maxCQ bound the CQs an engine makes. Each
// new CQ is twice the size of the last, up to maxCQ and the device's
// max_cqe, so a process with few connections keeps small CQs and one
// with thousands needs few CQs and pollers.
const (
	cqEntries = 8192
	firstCQ   = 4096
	maxCQ     = 1 << 16
)

// engineKey is what makes two engines different: the device port and the
// settings of its pool and pollers.
type engineKey struct {
	provider       string
	device         string
	port           uint8
	pollMode       PollMode
	spin           time.Duration
	threadLock     poller.ThreadLock
	cpus           string // poller.FormatCPUs: a slice is not comparable
	slabSize       int
	maxPool        int64
	srqDepth       int
	handlerWorkers int
}

func (c *config) engineKey(prov, dev string) engineKey {
	return engineKey{provider: prov, device: dev, port: c.port, pollMode: c.pollMode, spin: c.spin,
		threadLock: c.threadLock, cpus: poller.FormatCPUs(c.cpus), slabSize: c.slabSize, maxPool: c.maxPool, srqDepth: c.sharedRecvs, handlerWorkers: c.handlerWorkers}
}

// engines are the engines of the package-level Dial and Listen, one per
// key; an engine leaves when its last user closes.
var engines struct {
	mu sync.Mutex
	m  map[engineKey]*engine
}

// sharedEngine returns, with a reference for the caller, the engine of
// the package-level Dial and Listen for cfg on the device that serves the
// local address, opening it on first use. Later calls cost a map lookup:
// no device open, no sysfs walk.
func sharedEngine(cfg config, local netip.Addr) (*engine, error) {
	prov, dev, err := resolveDevice(cfg, local)
	if err != nil {
		return nil, err
	}
	key := cfg.engineKey(prov.Name(), dev)
	engines.mu.Lock()
	defer engines.mu.Unlock()
	if e := engines.m[key]; e != nil && e.acquire() == nil {
		return e, nil
	}
	e, err := openEngine(cfg, prov, dev)
	if err != nil {
		return nil, err
	}
	e.key, e.shared = key, true
	if engines.m == nil {
		engines.m = map[engineKey]*engine{}
	}
	engines.m[key] = e
	return e, nil
}

// engineFor returns, with a reference for the caller, eng (an explicit
// Engine's) or the shared engine for local, once cfg's connections are
// known to fit its device.
func engineFor(eng *engine, cfg config, local netip.Addr) (*engine, error) {
	var err error
	if eng == nil {
		eng, err = sharedEngine(cfg, local)
	} else {
		err = eng.acquire()
	}
	if err != nil {
		return nil, err
	}
	if err := eng.check(cfg); err != nil {
		eng.release()
		return nil, err
	}
	return eng, nil
}

// resolveDevice picks the provider and the device for cfg: the configured
// device, else the one with a GID for local, else "" (the provider's
// first usable device).
func resolveDevice(cfg config, local netip.Addr) (verbs.Provider, string, error) {
	prov, devs, err := chooseProvider(cfg.provider, cfg.device)
	if err != nil {
		return nil, "", err
	}
	dev := cfg.device
	if dev == "" && local.IsValid() {
		dev = deviceFor(devs, local)
	}
	return prov, dev, nil
}

// openEngine opens device dev of prov for an engine of cfg's settings.
func openEngine(cfg config, prov verbs.Provider, dev string) (*engine, error) {
	ctx, err := prov.Open(dev)
	if err != nil {
		return nil, fmt.Errorf("rdma: open %s device %q: %w", prov.Name(), dev, err)
	}
	e := &engine{cfg: cfg, prov: prov, ctx: ctx, refs: 1, key: cfg.engineKey(prov.Name(), dev)}
	info := ctx.Info()
	for _, p := range info.Ports {
		if p.Port == cfg.port {
			e.port = p
		}
	}
	if e.port.Port == 0 {
		ctx.Close()
		return nil, fmt.Errorf("rdma: device %s has no port %d: %w", info.Name, cfg.port, ErrNoDevice)
	}
	if e.attr, err = ctx.QueryDevice(); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: query device %s: %w", info.Name, err)
	}
	for _, f := range verbs.Features {
		if err := verbs.Lacks(info, e.attr, f); err != nil {
			if e.lacking == nil {
				e.lacking = map[verbs.Feature]error{}
			}
			e.lacking[f] = err
		}
	}
	if e.pd, err = ctx.AllocPD(); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	e.pool, err = pool.New(e.pd, pool.Options{SlabSize: cfg.slabSize, MaxBytes: cfg.maxPool, Decay: poolDecay})
	if err != nil {
		e.pd.Close()
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	evctx, cancel := context.WithCancel(context.Background())
	e.events, e.evDone = cancel, make(chan struct{})
	go e.readEvents(evctx)
	e.register()
	return e, nil
}

// readEvents reads the device's asynchronous events until the engine
// closes (events.go).
func (e *engine) readEvents(ctx context.Context) {
	defer close(e.evDone)
	for {
		ev, err := e.ctx.AsyncEvent(ctx)
		if err != nil {
			return
		}
		e.onAsyncEvent(ev)
	}
}

// check refuses a configuration the device cannot serve, at Dial or
// Listen rather than at every handshake: queue depths past the device's
// queue pairs or CQs (see also config.check).
func (e *engine) check(cfg config) error {
	attr := e.attr
	if attr.MaxQPWR > 0 && max(cfg.sqDepth, cfg.rqDepth) > attr.MaxQPWR {
		return fmt.Errorf("rdma: %w: queue depths %d/%d: device %s allows %d work requests per queue", ErrInvalid, cfg.sqDepth, cfg.rqDepth, e.ctx.Info().Name, attr.MaxQPWR)
	}
	if n := cfg.sqDepth + cfg.rqDepth; attr.MaxCQE > 0 && n > attr.MaxCQE {
		return fmt.Errorf("rdma: %w: queue depths %d/%d need %d completion queue entries per connection; device %s allows %d", ErrInvalid, cfg.sqDepth, cfg.rqDepth, n, e.ctx.Info().Name, attr.MaxCQE)
	}
	return nil
}

// lacks is nil when the engine's device has f, else why not (an error
// wrapping ErrNotSupported that names the device): the calls that need f
// fail with it at once rather than with a failed completion later.
func (e *engine) lacks(f verbs.Feature) error { return e.lacking[f] }

// check refuses, before anything is opened, a configuration no
// connection could work with: queue depths that do not fit one CQ, or a
// pool limit below the receives one connection keeps posted.
func (c *config) check() error {
	if len(c.cpus) > 0 && c.threadLock == poller.LockNever {
		return fmt.Errorf("rdma: %w: pinned pollers (WithPollerCPUs %s) are locked to their threads; WithPollerThreadLock(false) contradicts it", ErrInvalid, poller.FormatCPUs(c.cpus))
	}
	if c.sqLimit > 0 && c.sqLimit < c.sqDepth {
		return fmt.Errorf("rdma: %w: send queue limit %d is below the send depth %d (WithSendQueueLimit, WithQueueDepth)", ErrInvalid, c.sqLimit, c.sqDepth)
	}
	if n := c.sqDepth + c.rqDepth; n > cqEntries {
		return fmt.Errorf("rdma: %w: queue depths %d/%d need %d completion queue entries per connection; the most is %d", ErrInvalid, c.sqDepth, c.rqDepth, n, cqEntries)
	}
	slab := c.slabSize
	if slab == 0 {
		slab = pool.DefaultSlabSize
	}
	if need := int64(c.rqDepth) * int64(bufferCap(c.maxMsg, slab)); c.maxPool > 0 && need > c.maxPool {
		return fmt.Errorf("rdma: %w: pool limit %d bytes is less than the %d bytes of receives a connection keeps posted (%d of %d bytes; see WithQueueDepth and WithMaxMessage)",
			ErrInvalid, c.maxPool, need, c.rqDepth, c.maxMsg)
	}
	return nil
}

// bufferCap is the memory the pool gives a buffer of n bytes: its size
// class up to the slab size, whole pages past it.
func bufferCap(n, slab int) int {
	if n > slab {
		return (n + 4095) &^ 4095
	}
	c := 64
	for c < n {
		c <<= 1
	}
	return c
}

// deviceFor finds the device with a GID for the local address the
// connection uses, as rdma_cm would; "" lets the provider pick.
func deviceFor(devs []verbs.DeviceInfo, local netip.Addr) string {
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if d.Usable && g.GID.IP() == local.Unmap() {
					return d.Name
				}
			}
		}
	}
	for _, d := range devs {
		if d.Usable && d.Transport == "iWARP" && iwarpHas(d, local) {
			return d.Name
		}
	}
	return ""
}

// iwarpHas reports whether local is an address of the network interface
// under iWARP device d: its GID holds the interface's MAC address, not an
// IP address.
func iwarpHas(d verbs.DeviceInfo, local netip.Addr) bool {
	ifs, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, p := range d.Ports {
		for _, g := range p.GIDs {
			for _, ifc := range ifs {
				if len(ifc.HardwareAddr) != 6 || !bytes.Equal(ifc.HardwareAddr, g.GID[:6]) {
					continue
				}
				addrs, _ := ifc.Addrs()
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok {
						if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap() == local.Unmap() {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// gidFor picks the GID a connection whose local address is local uses:
// the one carrying that address, else the port's RoCE v2 (or IB) GID.
func (e *engine) gidFor(local netip.Addr) (verbs.GIDEntry, error) {
	if local.IsValid() {
		for _, g := range e.port.GIDs {
			if g.GID.IP() == local.Unmap() && (g.Type == verbs.GIDTypeRoCEv2 || e.port.LinkLayer != "Ethernet") {
				return g, nil
			}
		}
	}
	return verbs.SelectGID(e.port, !local.IsValid() || local.Unmap().Is4())
}

// reserve finds a CQ with room for n more entries, making a new one (and
// its poller) when all are full.
func (e *engine) reserve(c *Conn, n int) (*cqUnit, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, e.closedErr()
	}
	for _, u := range e.units {
		if u.free >= n {
			u.free -= n
			u.conns[c] = struct{}{}
			return u, nil
		}
	}
	size := firstCQ
	if k := len(e.units); k > 0 {
		size = 2 * e.units[k-1].cq.Len()
	}
	size = min(max(size, n), maxCQ)
	if e.attr.MaxCQE > 0 {
		size = min(size, e.attr.MaxCQE)
	}
	if n > size {
		return nil, fmt.Errorf("rdma: %w: queue depths need %d CQ entries, the device allows %d", ErrInvalid, n, size)
	}
	u := &cqUnit{}
	var err error
	// Busy pollers too: they park on it while goroutines wait for a P.
	if u.ch, err = e.ctx.CreateCompChannel(); err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	if u.cq, err = e.ctx.CreateCQ(size, u.ch); err != nil {
		u.close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	handle := func(wcs []verbs.WorkCompletion) { e.completions(u, wcs) }
	if u.p, err = poller.New(u.cq, u.ch, poller.HandlerFunc(handle), poller.Config{Mode: e.cfg.pollMode.poller(), Lock: e.cfg.threadLock, CPUs: e.cfg.cpus, Spin: e.cfg.pollSpin(e.prov.Name())}); err == nil {
		err = u.p.Start()
	}
	if err != nil {
		u.close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	u.free = u.cq.Len() - n
	u.conns = map[*Conn]struct{}{c: {}}
	e.units = append(e.units, u)
	go e.watch(u)
	return u, nil
}

// watch fails the connections of u if its poller stops on an error: no
// completion of theirs could be delivered any more.
func (e *engine) watch(u *cqUnit) {
	<-u.p.Done()
	err := u.p.Err()
	if err == nil {
		return
	}
	e.mu.Lock()
	conns := make([]*Conn, 0, len(u.conns))
	for c := range u.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.fail(fmt.Errorf("rdma: completion poller stopped: %w", err))
	}
}

func (e *engine) unreserve(c *Conn, u *cqUnit, n int) {
	e.mu.Lock()
	u.free += n
	delete(u.conns, c)
	e.mu.Unlock()
}

func (u *cqUnit) close() error {
	var errs []error
	if u.p != nil {
		errs = append(errs, u.p.Close())
	}
	if u.cq != nil {
		errs = append(errs, u.cq.Close())
	}
	if u.ch != nil {
		errs = append(errs, u.ch.Close())
	}
	return errors.Join(errs...)
}

// closedErr is the error of a use of the engine after it closed.
func (e *engine) closedErr() error {
	return fmt.Errorf("rdma: engine %s: %w", e.ctx.Info().Name, ErrClosed)
}

// acquire adds a user (a connection or the listener).
func (e *engine) acquire() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.closedErr()
	}
	e.refs++
	return nil
}

// release drops a user; the last one tears the engine down. Buffers the
// application still holds keep the PD and device open until they are
// released (see pool.Drained), by Release or, for a handle the
// application lost, by the Buffer's GC safety net.
func (e *engine) release() error {
	e.mu.Lock()
	e.refs--
	if e.refs > 0 || e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	units := e.units
	e.units = nil
	e.mu.Unlock()
	e.unregister()
	if e.shared {
		engines.mu.Lock()
		if engines.m[e.key] == e {
			delete(engines.m, e.key)
		}
		engines.mu.Unlock()
	}
	var errs []error
	for _, u := range units {
		errs = append(errs, u.close())
	}
	e.events()
	<-e.evDone
	errs = append(errs, e.stopWorkers())
	errs = append(errs, e.credits.close())
	if err := e.pool.Close(); err != nil && !errors.Is(err, verbs.ErrBusy) {
		errs = append(errs, err)
	}
	select {
	case <-e.pool.Drained():
		errs = append(errs, e.pd.Close(), e.ctx.Close())
	default:
		// The application holds buffers: close the PD once they are back.
		go func() {
			<-e.pool.Drained()
			e.pd.Close()
			e.ctx.Close()
		}()
	}
	return errors.Join(errs...)
}

// completions dispatches a batch of completions of u's CQ to their
// operations. It runs on u's poller and allocates nothing on success.
func (e *engine) completions(u *cqUnit, wcs []verbs.WorkCompletion) {
	var shared uint32 // bit i: SRQ i gave receives
	for i := range wcs {
		wc := &wcs[i]
		if isSRQ(wc.WRID) {
			shared |= 1 << uint8(wc.WRID>>40)
			e.sharedRecv(u, wc)
			continue
		}
		c := e.slots.conn(wc.WRID)
		if c == nil {
			continue // a closed connection's
		}
		o, ok := c.ops.take(wc.WRID)
		if !ok || c.holdForVerdict(&o, nil, wc) {
			continue
		}
		c.complete(&o, wc)
	}
	// The check after a poll: refill an SRQ that fell below its low
	// watermark, without waiting for the limit event.
	for shared != 0 && srqPollRefill.Load() {
		i := bits.TrailingZeros32(shared)
		shared &^= 1 << i
		if s := e.srqs[i%maxSRQs].Load(); s != nil && s.posted.Load() < s.low.Load() {
			s.refill(refillPoll)
		}
	}
}

// sharedRecv delivers a receive of an SRQ to the connection whose QP
// took it. A connection's QPN leaves the map only once no completion of
// its QP is left (postBeacon); the CQ check is a second guard.
func (e *engine) sharedRecv(u *cqUnit, wc *verbs.WorkCompletion) {
	s := e.srqs[uint8(wc.WRID>>40)%maxSRQs].Load()
	if s == nil {
		return
	}
	pb := s.take(wc.WRID)
	if pb == nil {
		return
	}
	v, ok := e.qpns.Load(wc.QPN)
	if c, _ := v.(*Conn); ok && c.unit == u {
		if !c.holdForVerdict(nil, pb, wc) {
			c.onSharedRecv(pb, wc)
		}
		return
	}
	pb.Release()
}

// Engine is one RDMA device port and what the connections on it share:
// the device context, the protection domain, one buffer pool, and the
// completion queues and pollers. Memory from Alloc works on every
// connection of the engine, so a server that also dials (a proxy, raft)
// can forward a received buffer without a copy.
//
// The package-level Dial and Listen share one engine per provider,
// device, port and engine settings (WithProvider, WithDevice, WithPort,
// WithPollMode, WithPollSpin, WithPollerThreadLock, WithPollerCPUs,
// WithPoolLimit, WithHandlerWorkers), made on first use and closed with
// its last connection or listener.
// OpenEngine gives an engine of one's own: its own pool limit and pollers.
type Engine struct {
	e         *engine
	cfg       config
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// OpenEngine opens an engine on the device and port opts choose (by
// default the first usable device, port 1), with the pool, pollers and
// handler workers they set. Its Dial and Listen take the options of each
// connection and listener.
func OpenEngine(opts ...EngineOption) (*Engine, error) {
	cfg := defaultConfig()
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	prov, dev, err := resolveDevice(cfg, netip.Addr{})
	if err != nil {
		return nil, err
	}
	e, err := openEngine(cfg, prov, dev)
	if err != nil {
		return nil, err
	}
	if err := e.check(cfg); err != nil {
		e.release()
		return nil, err
	}
	return &Engine{e: e, cfg: cfg}, nil
}

// connConfig is the engine's settings with the connection or listener
// options opts applied.
func connConfig[O ListenOption](x *Engine, opts []O) (config, error) {
	if x.closed.Load() {
		return config{}, fmt.Errorf("rdma: engine %s: %w", x.Device(), ErrClosed)
	}
	cfg := x.cfg
	if err := applyOptions(&cfg, opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// Dial connects to a Listener at address over network "rdma", as the
// package-level Dial does, on this engine.
func (x *Engine) Dial(ctx context.Context, network, address string, opts ...ConnOption) (*Conn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg, err := connConfig(x, opts)
	if err != nil {
		return nil, err
	}
	return dial(ctx, x.e, cfg, address)
}

// Listen listens on address over network "rdma", as the package-level
// Listen does, on this engine. opts are the listener's and those of the
// connections it accepts.
func (x *Engine) Listen(network, address string, opts ...ListenOption) (*Listener, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg, err := connConfig(x, opts)
	if err != nil {
		return nil, err
	}
	return listen(x.e, cfg, address)
}

// Alloc returns n bytes of registered memory, zero to its capacity,
// usable on every connection of the engine.
func (x *Engine) Alloc(n int) (*Buffer, error) {
	if x.closed.Load() {
		return nil, fmt.Errorf("rdma: engine %s: %w", x.Device(), ErrClosed)
	}
	return x.e.alloc(n)
}

// PoolStats reports the engine's buffer pool.
func (x *Engine) PoolStats() PoolStats { return PoolStats(x.e.pool.Stats()) }

// poolDecay is how long pool memory stays registered idle before the
// engine gives it back by itself: a slab idle from one look to the next,
// so between one and two of these.
const poolDecay = time.Second

// Trim gives back the engine's idle memory now: every slab of its buffer
// pool without a buffer in use, and every cached large buffer, is
// deregistered and unmapped. The engine does the same by itself for
// memory idle for a second or two (keeping one slab while buffers are
// in use), and Trim only makes it happen now. Receives posted on a
// shared receive queue beyond what the credits out and the messages
// held need go back the same way: by themselves once the surplus has
// lasted a second or two, at once on Trim, before the pool is trimmed.
// The error reports failed withdrawals and deregistrations.
func (x *Engine) Trim() error {
	var errs []error
	for i := range x.e.srqs {
		if s := x.e.srqs[i].Load(); s != nil {
			errs = append(errs, s.trim())
		}
	}
	errs = append(errs, x.e.pool.Trim())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rdma: engine %s: trim: %w", x.Device(), err)
	}
	return nil
}

// Provider is "verbs" or "soft".
func (x *Engine) Provider() string { return x.e.prov.Name() }

// Device is the name of the engine's device.
func (x *Engine) Device() string { return x.e.ctx.Info().Name }

// Port is the engine's port number.
func (x *Engine) Port() uint8 { return x.e.port.Port }

// Close lets the engine go: it closes once its connections and listeners
// have closed too (and the buffers they handed out are released). Dial,
// Listen and Alloc fail after Close.
func (x *Engine) Close() error {
	x.closeOnce.Do(func() {
		x.closed.Store(true)
		x.closeErr = x.e.release()
	})
	return x.closeErr
}

// alloc is Alloc for every handle that shares the engine's pool.
func (e *engine) alloc(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, ErrInvalid)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, e.closedErr()
	}
	pb, err := e.pool.Get(n)
	if err != nil {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, err)
	}
	return newBuffer(pb), nil
}
