package rdma

import (
	"fmt"
)

// A handler takes a connection's messages instead of Recv, for servers
// with many connections: a goroutine blocked in Recv for each of 10,000
// connections costs 10,000 stacks, a handler costs nothing while its
// connection is idle. Handlers run on a bounded pool of worker goroutines
// per engine, never on a poller; one connection's messages are handled
// one at a time, in order. The pool is the engine's own: a worker starts
// when a connection's messages wait and fewer than the bound run, and
// exits when none wait, so an idle engine runs no worker. It is not a
// library's such as ants, which starts a default pool from a package
// variable: importing this package must start nothing. A service that
// bounds its work with a pool of its own (ants' among them) passes it
// in with WithHandlerPool.

// RecvHandler handles one message of c: f is a resolved Recv future
// (Buffer, Len, Imm). The handler owns f's Buffer and must Release it.
type RecvHandler func(c *Conn, f *Future)

// WithRecvHandler makes every message of the connection (or of every
// connection a Listener accepts) go to h, run on the engine's worker pool
// (at most WithHandlerWorkers at once), instead of to Recv, which then fails
// with ErrInvalid. A connection's messages reach h one at a time, in
// order; a slow h holds back its own connection only, and, when every
// worker is busy, the start of other connections' handlers. The end of
// the connection does not call h: watch Conn.Done, which closes only
// after h has returned for every message that arrived before the end
// (the peer's close, death or abort, or a failure here), so a server
// that runs
//
//	go func() { <-c.Done(); c.api.Close() }()
//
// loses none of them. h therefore must not wait for Done of its own
// connection. A Close before Done drops what h has not been called for.
func WithRecvHandler(h RecvHandler) ConnOption {
	return connOpt(func(c *config) error {
		if h == nil {
			return fmt.Errorf("rdma: %w: nil RecvHandler", ErrInvalid)
		}
		c.handler = h
		return nil
	})
}

// HandlerPool runs RecvHandlers on goroutines of the application's:
// github.com/panjf2000/ants/v2's *Pool satisfies it, as does any pool
// with this method. Submit runs task on one of the pool's goroutines, or
// says why it cannot.
type HandlerPool interface {
	Submit(task func()) error
}

// WithHandlerPool runs the RecvHandler of the connection (or of every
// connection a Listener accepts) on p instead of the engine's own
// workers, so that a service bounds its handlers with the pool it bounds
// the rest of its work with. A connection's messages still reach the
// handler one at a time, in order: p runs one task per connection at a
// time, which hands the handler every message waiting. The engine's
// workers submit the tasks (a poller never waits for p), so a Submit
// that blocks until p has room holds back the start of other
// connections' handlers, as a busy engine pool does; when Submit fails
// (p is closed or full and does not wait), an engine worker runs the
// task itself, so no message is left waiting. Without it, or with a nil
// p, handlers run on the engine's own workers (WithHandlerWorkers).
func WithHandlerPool(p HandlerPool) ConnOption {
	return connOpt(func(c *config) error {
		c.handlerPool = p
		return nil
	})
}

// WithHandlerWorkers bounds the RecvHandler calls an engine runs at once
// to n (n ≥ 1; default 4 × GOMAXPROCS at the engine's first handler).
// It is an engine setting: connections with different bounds use
// different engines, and an Engine's bound is given to OpenEngine.
func WithHandlerWorkers(n int) EngineOption {
	return engineOpt(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("rdma: %w: handler workers %d (want ≥ 1)", ErrInvalid, n)
		}
		c.handlerWorkers = n
		return nil
	})
}

// handle runs on a worker: it hands c's ready messages to the handler,
// one at a time, until none is left.
func (c *conn) handle() {
	for {
		m, ok := c.rc.RQ.NextHandled()
		if !ok {
			return
		}
		f := newFuture(nil)
		f.resolve(nil, m.N, m.Imm, m.Has, m.Buf, 0)
		c.cfg.handler(c.public(), f)
	}
}
