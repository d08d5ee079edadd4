// Package engine is one RDMA device port and what the endpoints on it
// share: the device context, the protection domain, the buffer pool, the
// completion queues with their pollers, the table that maps a wr_id to
// the endpoint that posted it, the shared receive queues and the workers
// that run message handlers.
//
// An endpoint (a reliable connection of internal/rc) implements Endpoint:
// the engine's pollers hand it the completions of the work requests it
// posted, and the messages that took receives of a shared receive queue
// on its behalf. That is the one seam between the engine and what runs
// on it.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/fifo"
	"github.com/go-rdma/rdma/internal/loglimit"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Endpoint is what the engine's pollers hand completions to. Its methods
// run on a poller: they must not block.
type Endpoint interface {
	// Complete handles the completion of a WR the endpoint posted with
	// a wr_id of its slot (Slot.Base).
	Complete(wc *verbs.WorkCompletion)
	// Received handles a message that took pb, a receive of a shared
	// receive queue, on the endpoint's queue pair.
	Received(pb *pool.Buffer, wc *verbs.WorkCompletion)
	// Fail ends the endpoint: its poller stopped, or its device port
	// went down.
	Fail(err error)
}

// Handler is work the engine's workers run (Dispatch).
type Handler interface {
	Handle()
}

// Config is an engine's settings.
type Config struct {
	Port           uint8
	PollMode       poller.Mode
	Spin           time.Duration // an Adaptive poller's spin
	ThreadLock     poller.ThreadLock
	CPUs           []int // the pollers' CPUs; nil: not pinned
	SlabSize       int
	MaxPool        int64
	SharedRecvs    int          // the most receives an SRQ posts; 0: by message size
	HandlerWorkers int          // Dispatch's bound; 0: 4 × GOMAXPROCS
	Log            *slog.Logger // device events; nil: none
}

// ErrPortDown means the device port an endpoint runs on went down (the
// device reported PORT_ERR): the endpoint cannot carry anything more.
var ErrPortDown = errors.New("device port went down")

// Engine is one device port and what its endpoints share. Its exported
// fields are set by Open and read-only after.
type Engine struct {
	Cfg   Config
	Prov  verbs.Provider
	Ctx   verbs.Context
	Attr  verbs.DeviceAttr
	PD    verbs.PD
	Pool  *pool.Pool
	Port  verbs.PortInfo
	Cells Cells // small registered cells: the endpoints' credit words

	lacking map[verbs.Feature]error // what the device cannot do (verbs.Lacks)
	slots   slots                   // wr_id -> endpoint
	srqs    [maxSRQs]atomic.Pointer[SRQ]
	qpns    sync.Map // QPN -> qpnEntry, for receives of an SRQ
	events  context.CancelFunc
	evDone  chan struct{}
	evLimit loglimit.Limiter // device events

	// The workers that run handlers (Dispatch).
	dmu        sync.Mutex
	runq       fifo.Queue[Handler]
	workers    int
	maxWorkers int
	dwg        sync.WaitGroup
	handling   atomic.Int64 // Handle calls running

	mu      sync.Mutex
	units   []*Unit
	refs    int
	closed  bool
	onClose []func()
}

// qpnEntry is an endpoint whose queue pair takes receives of an SRQ, and
// the CQ unit its completions come on.
type qpnEntry struct {
	ep Endpoint
	u  *Unit
}

// poolDecay is how long pool memory stays registered idle before the
// engine gives it back by itself: a slab idle from one look to the next,
// so between one and two of these.
const poolDecay = time.Second

// Open opens device dev of prov with the engine's settings cfg; the
// caller holds its one reference (Release).
func Open(cfg Config, prov verbs.Provider, dev string) (*Engine, error) {
	ctx, err := prov.Open(dev)
	if err != nil {
		return nil, fmt.Errorf("rdma: open %s device %q: %w", prov.Name(), dev, err)
	}
	e := &Engine{Cfg: cfg, Prov: prov, Ctx: ctx, refs: 1}
	info := ctx.Info()
	for _, p := range info.Ports {
		if p.Port == cfg.Port {
			e.Port = p
		}
	}
	if e.Port.Port == 0 {
		ctx.Close()
		return nil, fmt.Errorf("rdma: device %s has no port %d: %w", info.Name, cfg.Port, verbs.ErrNoDevice)
	}
	if e.Attr, err = ctx.QueryDevice(); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: query device %s: %w", info.Name, err)
	}
	for _, f := range verbs.Features {
		if err := verbs.Lacks(info, e.Attr, f); err != nil {
			if e.lacking == nil {
				e.lacking = map[verbs.Feature]error{}
			}
			e.lacking[f] = err
		}
	}
	if e.PD, err = ctx.AllocPD(); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	e.Pool, err = pool.New(e.PD, pool.Options{SlabSize: cfg.SlabSize, MaxBytes: cfg.MaxPool, Decay: poolDecay})
	if err != nil {
		e.PD.Close()
		ctx.Close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	evctx, cancel := context.WithCancel(context.Background())
	e.events, e.evDone = cancel, make(chan struct{})
	go e.readEvents(evctx)
	return e, nil
}

// OnClose adds f to what runs when the engine closes (its last Release).
func (e *Engine) OnClose(f func()) {
	e.mu.Lock()
	e.onClose = append(e.onClose, f)
	e.mu.Unlock()
}

// Name is the device's name.
func (e *Engine) Name() string { return e.Ctx.Info().Name }

// Lacks is nil when the engine's device has f, else why not (an error
// wrapping ErrNotSupported that names the device): the calls that need
// f fail with it at once rather than with a failed completion later.
func (e *Engine) Lacks(f verbs.Feature) error { return e.lacking[f] }

// CheckDepths refuses queue depths the device cannot serve: past its
// queue pairs' or its CQs' limits.
func (e *Engine) CheckDepths(send, recv int) error {
	attr := e.Attr
	if attr.MaxQPWR > 0 && max(send, recv) > attr.MaxQPWR {
		return fmt.Errorf("rdma: %w: queue depths %d/%d: device %s allows %d work requests per queue", verbs.ErrInvalid, send, recv, e.Name(), attr.MaxQPWR)
	}
	if n := send + recv; attr.MaxCQE > 0 && n > attr.MaxCQE {
		return fmt.Errorf("rdma: %w: queue depths %d/%d need %d completion queue entries per connection; device %s allows %d", verbs.ErrInvalid, send, recv, n, e.Name(), attr.MaxCQE)
	}
	return nil
}

// GIDFor picks the GID an endpoint whose local address is local uses:
// the one carrying that address, else the port's RoCE v2 (or IB) GID.
func (e *Engine) GIDFor(local netip.Addr) (verbs.GIDEntry, error) {
	if local.IsValid() {
		for _, g := range e.Port.GIDs {
			if g.GID.IP() == local.Unmap() && (g.Type == verbs.GIDTypeRoCEv2 || e.Port.LinkLayer != "Ethernet") {
				return g, nil
			}
		}
	}
	return verbs.SelectGID(e.Port, !local.IsValid() || local.Unmap().Is4())
}

// ClosedErr is the error of a use of the engine after it closed.
func (e *Engine) ClosedErr() error {
	return fmt.Errorf("rdma: engine %s: %w", e.Name(), verbs.ErrClosed)
}

// Closed reports whether the engine has closed.
func (e *Engine) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Acquire adds a user (an endpoint, a listener).
func (e *Engine) Acquire() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.ClosedErr()
	}
	e.refs++
	return nil
}

// Release drops a user; the last one tears the engine down. Buffers the
// application still holds keep the PD and device open until they are
// released (see pool.Drained).
func (e *Engine) Release() error {
	e.mu.Lock()
	e.refs--
	if e.refs > 0 || e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	units := e.units
	e.units = nil
	hooks := e.onClose
	e.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	var errs []error
	for _, u := range units {
		errs = append(errs, u.close())
	}
	e.events()
	<-e.evDone
	e.stopWorkers()
	errs = append(errs, e.Cells.close())
	if err := e.Pool.Close(); err != nil && !errors.Is(err, verbs.ErrBusy) {
		errs = append(errs, err)
	}
	select {
	case <-e.Pool.Drained():
		errs = append(errs, e.PD.Close(), e.Ctx.Close())
	default:
		// The application holds buffers: close the PD once they are back.
		go func() {
			<-e.Pool.Drained()
			e.PD.Close()
			e.Ctx.Close()
		}()
	}
	return errors.Join(errs...)
}

// AddEndpoint gives ep a slot: the wr_ids of its WRs carry the slot's
// base, so that their completions reach it.
func (e *Engine) AddEndpoint(ep Endpoint) (Slot, error) { return e.slots.add(ep) }

// RemoveEndpoint frees ep's slot: completions for it found after this
// are dropped.
func (e *Engine) RemoveEndpoint(s Slot) { e.slots.remove(s) }

// Endpoints lists the endpoints that have a slot.
func (e *Engine) Endpoints() []Endpoint { return e.slots.all() }

// RegisterQPN routes the receives of the SRQ that qpn's messages take,
// as they complete on u, to ep.
func (e *Engine) RegisterQPN(qpn uint32, ep Endpoint, u *Unit) {
	e.qpns.Store(qpn, qpnEntry{ep: ep, u: u})
}

// UnregisterQPN stops routing qpn's receives to ep: no completion of its
// queue pair is left in its CQ, and the QPN may go to another.
func (e *Engine) UnregisterQPN(qpn uint32, ep Endpoint) {
	if v, ok := e.qpns.Load(qpn); ok && v.(qpnEntry).ep == ep {
		e.qpns.CompareAndDelete(qpn, v)
	}
}

// readEvents reads the device's asynchronous events until the engine
// closes.
func (e *Engine) readEvents(ctx context.Context) {
	defer close(e.evDone)
	for {
		ev, err := e.Ctx.AsyncEvent(ctx)
		if err != nil {
			return
		}
		e.onAsyncEvent(ev)
	}
}

// onAsyncEvent handles one of the device's asynchronous events: it logs
// it, refills an SRQ at its limit, and fails the endpoints of a port that
// went down.
func (e *Engine) onAsyncEvent(ev verbs.AsyncEvent) {
	if l := e.Cfg.Log; l != nil {
		lvl := slog.LevelWarn
		switch ev.Type {
		case verbs.EventSRQLimitReached, verbs.EventCommEst, verbs.EventQPLastWQEReached:
			lvl = slog.LevelDebug
		case verbs.EventPortActive:
			lvl = slog.LevelInfo
		}
		// A device has a few event types: no key is held back.
		if ok, more, _ := e.evLimit.Allow(ev.Type.String(), time.Now()); ok {
			l.Log(context.Background(), lvl, "rdma: device event", "device", e.Name(), "event", ev.Type.String(),
				"port", ev.Port, "qpn", ev.QPN, "more_since", more)
		}
	}
	switch ev.Type {
	case verbs.EventSRQLimitReached:
		if !refillByEvent.Load() {
			return
		}
		for i := range e.srqs {
			if s := e.srqs[i].Load(); s != nil && s.q == ev.SRQ {
				s.refill(RefillEvent)
			}
		}
	case verbs.EventPortErr:
		if ev.Port != e.Port.Port {
			return
		}
		err := fmt.Errorf("rdma: device %s port %d: %w", e.Name(), ev.Port, ErrPortDown)
		for _, ep := range e.slots.all() {
			ep.Fail(err)
		}
	}
}
