package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
	"github.com/go-rdma/rdma/poller"
	"github.com/go-rdma/rdma/pool"
)

// engine holds what the connections of one Listener (or one Dial) share:
// the device context, the PD, the buffer pool, the CQs with their pollers
// and the table of operations in flight.
type engine struct {
	cfg  config
	prov verbs.Provider
	ctx  verbs.Context
	pd   verbs.PD
	pool *pool.Pool
	port verbs.PortInfo
	ops  opTable

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

// cqEntries is the size of each CQ, bounded by the device.
const cqEntries = 8192

func newEngine(cfg config, local netip.Addr) (*engine, error) {
	prov, devs, err := chooseProvider(cfg.provider, cfg.device)
	if err != nil {
		return nil, err
	}
	dev := cfg.device
	if dev == "" && local.IsValid() {
		dev = deviceFor(devs, local)
	}
	ctx, err := prov.Open(dev)
	if err != nil {
		return nil, fmt.Errorf("rdma: open %s device %q: %w", prov.Name(), dev, err)
	}
	e := &engine{cfg: cfg, prov: prov, ctx: ctx, refs: 1}
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
	if e.pd, err = ctx.AllocPD(); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	e.pool, err = pool.New(e.pd, pool.Options{SlabSize: cfg.slabSize, MaxBytes: cfg.maxPool})
	if err != nil {
		e.pd.Close()
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	return e, nil
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
	return ""
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
		return nil, ErrClosed
	}
	for _, u := range e.units {
		if u.free >= n {
			u.free -= n
			u.conns[c] = struct{}{}
			return u, nil
		}
	}
	size := cqEntries
	if attr, err := e.ctx.QueryDevice(); err == nil && attr.MaxCQE > 0 {
		size = min(size, attr.MaxCQE)
	}
	if n > size {
		return nil, fmt.Errorf("rdma: %w: queue depths need %d CQ entries, the device allows %d", ErrInvalid, n, size)
	}
	u := &cqUnit{}
	var err error
	if e.cfg.pollMode != poller.Busy {
		if u.ch, err = e.ctx.CreateCompChannel(); err != nil {
			return nil, fmt.Errorf("rdma: %w", err)
		}
	}
	if u.cq, err = e.ctx.CreateCQ(size, u.ch); err != nil {
		u.close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	if u.p, err = poller.New(u.cq, u.ch, poller.HandlerFunc(e.completions), poller.Config{Mode: e.cfg.pollMode, Lock: e.cfg.threadLock, Spin: e.cfg.pollSpin(e.prov.Name())}); err == nil {
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

// acquire adds a user (a connection or the listener).
func (e *engine) acquire() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
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
	var errs []error
	for _, u := range units {
		errs = append(errs, u.close())
	}
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

// completions dispatches a batch of completions to their operations. It
// runs on a poller goroutine and allocates nothing on success.
func (e *engine) completions(wcs []verbs.WorkCompletion) {
	for i := range wcs {
		wc := &wcs[i]
		o, ok := e.ops.take(wc.WRID)
		if !ok {
			continue
		}
		if o.kind == opRecv {
			o.conn.onRecv(o.buf, wc)
			continue
		}
		o.conn.onSendDone(&o, wc)
	}
}
