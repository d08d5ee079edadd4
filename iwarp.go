package rdma

import (
	"context"
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// iwarpSettleRetry is how long a dialer on iWARP waits for the answer to
// its zero-length READ before it sends another (settleIWARP).
const iwarpSettleRetry = 250 * time.Millisecond

// settleIWARP makes sure the peer of a new iWARP connection reads what
// this side sends, before Dial returns it.
//
// Linux's siw (6.1 and later) sends the MPA reply before it gives the
// accepted socket to the queue pair (siw_accept): a message that arrives
// in between finds the connection manager's callback, which ignores it,
// and stays unread in the socket until the next segment arrives. A
// dialer that sends one request and waits for the answer then waits for
// ever. So the dialer, which speaks first on iWARP (MPA), posts a
// zero-length RDMA READ, which names no memory, touches none and takes
// no receive, and waits for its answer; while none comes it posts
// another every iwarpSettleRetry, whose arrival makes the peer read what
// it holds. Once a READ is answered the peer reads every later message.
// Only READs: siw completes a WRITE as soon as it is sent, before a READ
// posted earlier is answered, and the first READ's answer must be the
// proof. At most readDepth (the negotiated ORD) are outstanding; a peer
// that grants no READs gets none, as a READ beyond the ORD fails the
// connection.
func (c *Conn) settleIWARP(ctx context.Context, readDepth int) error {
	if c.eng.ctx.Info().Transport != "iWARP" || readDepth == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.setup)
	defer cancel()
	first, n := c.readZero(), 1
	tick := time.NewTicker(iwarpSettleRetry)
	defer tick.Stop()
	for {
		select {
		case <-first.Done():
			err := first.Err()
			first.Release()
			return err
		case <-tick.C:
			if n < readDepth {
				// Answered after the first: nothing waits for it.
				c.readZero().Release()
				n++
			}
		case <-ctx.Done():
			return fmt.Errorf("rdma: peer %v: no answer to a zero-length READ after the rdma_cm connect: %w", c.remote, ctx.Err())
		}
	}
}

// readZero posts a zero-length RDMA READ of the peer.
func (c *Conn) readZero() *Future {
	pb, err := c.eng.pool.Get(1) // the op holds a buffer, as every op does
	if err != nil {
		return newResolved(fmt.Errorf("rdma: %v: %w", verbs.OpRead, err))
	}
	defer pb.Release()
	c.st.issued(verbs.OpRead, 0)
	return c.post(op{kind: opRead, buf: pb}, verbs.SendWR{Opcode: verbs.OpRead, Flags: verbs.SendSignaled})
}
