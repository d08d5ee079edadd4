package rdma

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/panjf2000/ants/v2"
)

// A handler takes a connection's messages instead of Recv, for servers
// with many connections: a goroutine blocked in Recv for each of 10,000
// connections costs 10,000 stacks, a handler costs nothing while its
// connection is idle. Handlers run on a bounded pool of worker goroutines
// per engine (github.com/panjf2000/ants/v2), never on a poller; one
// connection's messages are handled one at a time, in order.

// RecvHandler handles one message of c: f is a resolved Recv future
// (Buffer, Len, Imm). The handler owns f's Buffer and must Release it.
type RecvHandler func(c *Conn, f *Future)

// WithRecvHandler makes every message of the connection (or of every
// connection a Listener accepts) go to h, run on the engine's worker pool
// (at most HandlerWorkers at once), instead of to Recv, which then fails
// with ErrInvalid. A connection's messages reach h one at a time, in
// order; a slow h holds back its own connection only, and, when every
// worker is busy, the start of other connections' handlers. The end of
// the connection does not call h: watch Conn.Done, which closes only
// after h has returned for every message that arrived before the end
// (the peer's close, death or abort, or a failure here), so a server
// that runs
//
//	go func() { <-c.Done(); c.Close() }()
//
// loses none of them. h therefore must not wait for Done of its own
// connection. A Close before Done drops what h has not been called for.
func WithRecvHandler(h RecvHandler) Option {
	return func(c *config) error {
		if h == nil {
			return fmt.Errorf("rdma: %w: nil RecvHandler", ErrInvalid)
		}
		c.handler = h
		return nil
	}
}

// HandlerWorkers is the most RecvHandler calls an engine runs at once.
var HandlerWorkers = 4 * runtime.GOMAXPROCS(0)

// dispatchLocked schedules c's handler for the messages in c.ready, if it
// is not running already. Caller holds rmu; it may run on a poller, so it
// only queues.
func (c *Conn) dispatchLocked() {
	if c.handling || len(c.ready) == 0 {
		return
	}
	c.handling = true
	c.eng.dispatch(c)
}

// handle runs on a worker: it hands c's ready messages to the handler,
// one at a time, until none is left.
func (c *Conn) handle() {
	for {
		c.rmu.Lock()
		if len(c.ready) == 0 || c.closing.Load() {
			c.handling = false
			c.endIfDeliveredLocked() // the handler returned for the last one
			c.rmu.Unlock()
			return
		}
		f := c.takeReadyLocked()
		c.eng.handlers.Add(1)
		c.cfg.handler(c, f)
		c.eng.handlers.Add(-1)
	}
}

// dispatch queues c for a worker. The queue is bounded by the receives
// the engine's connections have posted (a connection is in it at most
// once), so it never blocks the poller.
func (e *engine) dispatch(c *Conn) {
	e.dmu.Lock()
	e.runq = append(e.runq, c)
	if !e.dispatching {
		e.dispatching = true
		e.dwg.Add(1)
		go e.dispatcher()
	}
	e.dmu.Unlock()
}

// dispatcher hands queued connections to the worker pool, waiting for a
// free worker when all are busy; it exits when the queue is empty.
func (e *engine) dispatcher() {
	defer e.dwg.Done()
	for {
		e.dmu.Lock()
		if len(e.runq) == 0 {
			e.dispatching = false
			e.dmu.Unlock()
			return
		}
		c := e.runq[0]
		e.runq[0] = nil
		e.runq = e.runq[1:]
		if e.workers == nil {
			p, err := ants.NewPool(HandlerWorkers, ants.WithExpiryDuration(time.Second))
			if err != nil { // only for a size below 1
				e.dmu.Unlock()
				c.fail(fmt.Errorf("rdma: handler workers: %w", err))
				continue
			}
			e.workers = p
		}
		p := e.workers
		e.dmu.Unlock()
		if err := p.Submit(c.handle); err != nil {
			if !errors.Is(err, ants.ErrPoolClosed) {
				c.fail(fmt.Errorf("rdma: handler workers: %w", err))
			}
			c.rmu.Lock()
			c.handling = false
			c.endIfDeliveredLocked()
			c.rmu.Unlock()
		}
	}
}

// stopWorkers waits for the dispatcher and the workers to finish. When a
// handler is still running (it closed the engine's last connection
// itself) the pool is released without waiting: its workers exit when
// their handler returns.
func (e *engine) stopWorkers() error {
	e.dwg.Wait()
	e.dmu.Lock()
	p := e.workers
	e.workers = nil
	e.dmu.Unlock()
	if p == nil {
		return nil
	}
	if e.handlers.Load() > 0 {
		p.Release()
		return nil
	}
	return p.ReleaseTimeout(5 * time.Second)
}
