package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// engine is an engine of the package: the device port (internal/engine)
// and what the API keeps of it: the settings it was opened with, its key
// in the registry of the package-level Dial and Listen, and the counters
// of its connections' lives and of those that closed.
type engine struct {
	*ieng.Engine
	cfg    config
	key    engineKey
	shared bool // in the registry of the package-level Dial and Listen

	// Counters of the closed connections, for Stats
	retired   closedStats
	lifecycle lifeCounters
}

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
	if e := engines.m[key]; e != nil && e.Acquire() == nil {
		return e, nil
	}
	e, err := openEngine(cfg, prov, dev)
	if err != nil {
		return nil, err
	}
	e.key, e.shared = key, true
	e.OnClose(func() {
		engines.mu.Lock()
		if engines.m[key] == e {
			delete(engines.m, key)
		}
		engines.mu.Unlock()
	})
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
		err = eng.Acquire()
	}
	if err != nil {
		return nil, err
	}
	if err := eng.check(cfg); err != nil {
		eng.Release()
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
	ie, err := ieng.Open(ieng.Config{Port: cfg.port, PollMode: cfg.pollMode.poller(), Spin: cfg.pollSpin(prov.Name()),
		ThreadLock: cfg.threadLock, CPUs: cfg.cpus, SlabSize: cfg.slabSize, MaxPool: cfg.maxPool,
		SharedRecvs: cfg.sharedRecvs, HandlerWorkers: cfg.handlerWorkers, Log: cfg.log}, prov, dev)
	if err != nil {
		return nil, err
	}
	e := &engine{Engine: ie, cfg: cfg, key: cfg.engineKey(prov.Name(), dev)}
	e.register()
	e.OnClose(e.unregister)
	return e, nil
}

// check refuses a configuration the device cannot serve, at Dial or
// Listen rather than at every handshake: queue depths past the device's
// queue pairs or CQs (see also config.check), or a transport it lacks.
func (e *engine) check(cfg config) error {
	if err := e.checkTransport(cfg); err != nil {
		return err
	}
	return e.CheckDepths(cfg.sqDepth, cfg.rqDepth)
}

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
	if n := c.sqDepth + c.rqDepth; n > ieng.CQEntries {
		return fmt.Errorf("rdma: %w: queue depths %d/%d need %d completion queue entries per connection; the most is %d", ErrInvalid, c.sqDepth, c.rqDepth, n, ieng.CQEntries)
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
		e.Release()
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
func (x *Engine) PoolStats() PoolStats { return PoolStats(x.e.Pool.Stats()) }

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
	errs = append(errs, x.e.TrimSRQs())
	errs = append(errs, x.e.Pool.Trim())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rdma: engine %s: trim: %w", x.Device(), err)
	}
	return nil
}

// Provider is "verbs" or "soft".
func (x *Engine) Provider() string { return x.e.Prov.Name() }

// Device is the name of the engine's device.
func (x *Engine) Device() string { return x.e.Name() }

// Port is the engine's port number.
func (x *Engine) Port() uint8 { return x.e.Port.Port }

// Close lets the engine go: it closes once its connections and listeners
// have closed too (and the buffers they handed out are released). Dial,
// Listen and Alloc fail after Close.
func (x *Engine) Close() error {
	x.closeOnce.Do(func() {
		x.closed.Store(true)
		x.closeErr = x.e.Release()
	})
	return x.closeErr
}

// alloc is Alloc for every handle that shares the engine's pool.
func (e *engine) alloc(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, ErrInvalid)
	}
	if e.Closed() {
		return nil, e.ClosedErr()
	}
	pb, err := e.Pool.Get(n)
	if err != nil {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, err)
	}
	return newBuffer(pb), nil
}
