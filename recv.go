package rdma

import (
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
)

// The receive side of a connection is rc.Receiver (c.rq); Recv is its
// API, and a Recv's Future is what it delivers to.

// Recv receives the next message. The future's Buffer holds its bytes
// (the caller must Release it), Len its length and Imm its immediate
// value. A WRITE_WITH_IMM from the peer also resolves a Recv, with no
// buffer.
func (c *Conn) Recv() *Future {
	if c.cfg.handler != nil {
		return newResolved(fmt.Errorf("rdma: recv on %v: %w: the connection's messages go to its RecvHandler", c.remote, ErrInvalid))
	}
	f := newFuture(c.drv)
	f.recv = &c.rq // a pending Recv's Cancel withdraws it
	m, ok, err := c.rq.Recv((*recvFuture)(f))
	switch {
	case ok:
		f.resolve(nil, m.N, m.Imm, m.Has, m.Buf, 0)
	case err != nil:
		f.resolve(err, 0, 0, false, nil, 0)
	}
	return f
}

// recvFuture is a Future as the receive side sees it (rc.Delivery): a
// type of its own, so that Deliver stays out of Future's API.
type recvFuture Future

// Deliver resolves the Recv with a message or an error.
func (r *recvFuture) Deliver(err error, n int, imm uint32, has bool, pb *pool.Buffer) bool {
	return (*Future)(r).resolve(err, n, imm, has, pb, 0)
}

// postBeacon posts a WR to the QP, just moved to the error state, whose
// flush comes after the completion of every message that arrived before
// the error: a CQ reports a QP's completions in order, and in the error
// state the QP takes no more messages. When the flush is handled, every
// message that came is delivered, so the Recvs still waiting fail
// (Receiver.OnBeacon), and no completion of the QP is left in its CQ, so its QPN
// may go to another connection (teardown).
func (c *conn) postBeacon() {
	if c.srq != nil && !c.sq.PostBeacon() {
		// Nothing to wait for (the QP is closed, or the provider
		// refuses): what came is all there is.
		c.rq.OnBeacon(nil)
	}
}

// abandonAfter is how long after a failure a connection on a device
// that never completes WRs posted to a QP in ERR (siw) waits for the
// flushes of those it posted before giving up on the rest.
const abandonAfter = time.Second

// abandonPosted gives up on the WRs the device will never complete. On
// such a device a WR posted after the device moved the QP to ERR on its
// own (the peer's reset), before this side knew, waits for ever; the
// ones posted before were flushed when fail moved the QP to ERR, and
// their completions are handled well within abandonAfter. So the Recvs
// still waiting fail now rather than at Close, and the operations left
// resolve with the connection's error; their buffers go back, as the
// device will not touch them.
func (c *conn) abandonPosted() {
	c.rq.Abandon()
	c.resolveLeft()
}
