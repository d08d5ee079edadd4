package rdma

import (
	"fmt"

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
		return newResolved(fmt.Errorf("rdma: recv on %v: %w: the connection's messages go to its RecvHandler", c.rc.Remote, ErrInvalid))
	}
	if err := c.refuseOnTCP("recv"); err != nil {
		return newResolved(err)
	}
	f := newFuture(c.rc.Drv)
	f.recv = &c.rc.RQ // a pending Recv's Cancel withdraws it
	m, ok, err := c.rc.RQ.Recv((*recvFuture)(f))
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
