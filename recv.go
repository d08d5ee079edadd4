package rdma

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/fifo"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// receives is a connection's receive side: rmu and the state it guards,
// the messages that arrived and the Recvs that wait for them. Conn holds
// it as c.rq.
type receives struct {
	rmu       sync.Mutex
	rposted   int // receives posted (without an SRQ)
	ready     fifo.Queue[message]
	waiters   fifo.Queue[*Future]
	rwrs      []verbs.RecvWR
	rsges     []verbs.SGE
	recvSize  int
	handling  bool // a worker runs the RecvHandler
	ended     bool // done is closed
	abandoned bool // the receives left will never complete (abandonPosted)

	beaconDone atomic.Bool // the beacon flushed: every message that came is delivered
}

// takeWaitersLocked takes the Recvs that wait, for the caller to fail
// them once it has unlocked rmu. Caller holds rmu.
func (r *receives) takeWaitersLocked() []*Future {
	return r.waiters.Take()
}

// message is a received message waiting for Recv.
type message struct {
	pb  *pool.Buffer // nil for WRITE_WITH_IMM notifications
	n   int
	imm uint32
	has bool
}

// postReceives fills the receive queue of a connection without an SRQ;
// the QP must be in INIT.
func (c *conn) postReceives() error {
	if c.srq != nil {
		return nil
	}
	c.rq.rmu.Lock()
	defer c.rq.rmu.Unlock()
	return c.repostLocked(c.cfg.rqDepth)
}

// endIfDeliveredLocked closes Done once the connection has ended and
// every message that arrived was handed over: taken by Recv, or handled
// (the handler returned). Caller holds rmu.
func (c *conn) endIfDeliveredLocked() {
	if c.rq.ended || c.life.Err() == nil || c.rq.ready.Len() > 0 || c.rq.handling || c.moreToComeLocked() {
		return
	}
	c.rq.ended = true
	close(c.done)
}

// onRecv delivers a completion of a receive the connection posted on its
// own receive queue. It runs on a poller.
func (c *conn) onRecv(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	defer c.life.OpDone()
	c.rq.rmu.Lock()
	c.rq.rposted--
	if c.iw.awaitingGo.Load() {
		if taken, err := c.takeGoLocked(pb, wc); taken {
			c.rq.rmu.Unlock()
			if err != nil {
				c.fail(err)
			} else {
				c.sq.Release()
			}
			return
		}
	}
	c.deliverLocked(pb, wc)
}

// onSharedRecv delivers a completion of a receive of the SRQ that a
// message to this connection took. It runs on a poller.
func (c *conn) onSharedRecv(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	if wc.Status == verbs.WCSuccess && !c.cr.Arrived() {
		pb.Release()
		return
	}
	c.rq.rmu.Lock()
	c.deliverLocked(pb, wc)
}

// deliverLocked hands a received message to the oldest waiting Recv,
// the handler or the ready queue, or fails the connection when the
// receive failed. Caller holds rmu; it unlocks it.
func (c *conn) deliverLocked(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	if c.rq.ended {
		// Close took what was here, and nothing is delivered after it: a
		// completion the poller took as the QP went is dropped.
		c.rq.rmu.Unlock()
		pb.Release()
		return
	}
	if wc.Status != verbs.WCSuccess {
		c.st.recvFailed(wc.Status, wc.Status == verbs.WCWRFlushErr && c.life.Orderly())
		// Every receive before this one was delivered; the waiters
		// left will get nothing more.
		ws := c.rq.takeWaitersLocked()
		c.endIfDeliveredLocked()
		c.rq.rmu.Unlock()
		pb.Release()
		err := c.completionErr(postedWC(rc.OpRecv, wc))
		c.fail(err)
		for _, f := range ws {
			f.resolve(err, 0, 0, false, nil, 0)
		}
		return
	}
	m := message{pb: pb, n: int(wc.ByteLen), imm: wc.Imm, has: wc.Flags&verbs.WCWithImm != 0}
	c.st.recvs.Add(1)
	c.st.recvBytes.Add(uint64(m.n))
	if wc.Opcode == verbs.WCRecvWriteWithImm {
		// The data went to the written region; the buffer stayed empty,
		// so its next user need not clear it (a 64 KiB memclr per
		// notification otherwise).
		pb.Filled(0)
		pb.Release()
		m.pb = nil
	} else {
		pb.Filled(m.n)
	}
	if c.rq.waiters.Len() > 0 {
		f := c.rq.waiters.Pop()
		c.refillLocked()
		c.endIfDeliveredLocked()
		c.rq.rmu.Unlock()
		if !f.resolve(nil, m.n, m.imm, m.has, m.pb, 0) && m.pb != nil {
			m.pb.Release() // resolved already: nobody would release it
		}
		return
	}
	c.rq.ready.Push(m)
	if c.cfg.handler != nil {
		c.dispatchLocked()
	}
	c.rq.rmu.Unlock()
}

// Recv receives the next message. The future's Buffer holds its bytes
// (the caller must Release it), Len its length and Imm its immediate
// value. A WRITE_WITH_IMM from the peer also resolves a Recv, with no
// buffer.
func (c *Conn) Recv() *Future {
	if c.cfg.handler != nil {
		return newResolved(fmt.Errorf("rdma: recv on %v: %w: the connection's messages go to its RecvHandler", c.remote, ErrInvalid))
	}
	c.rq.rmu.Lock()
	if c.rq.ready.Len() > 0 {
		return c.takeReadyLocked()
	}
	if c.life.Err() != nil && !c.moreToComeLocked() {
		c.rq.rmu.Unlock()
		return newResolved(c.life.ClosedErr())
	}
	f := newFuture(c.drv)
	f.recv = c.conn
	c.rq.waiters.Push(f)
	c.rq.rmu.Unlock()
	return f
}

// takeReadyLocked takes the oldest message that arrived before a Recv
// asked for it, as a resolved future, and unlocks rmu.
func (c *conn) takeReadyLocked() *Future {
	m := c.rq.ready.Pop()
	c.refillLocked()
	c.endIfDeliveredLocked()
	c.rq.rmu.Unlock()
	f := newFuture(nil)
	f.resolve(nil, m.n, m.imm, m.has, m.pb, 0)
	return f
}

// withdraw removes the pending Recv f, if no message matched it yet.
func (c *conn) withdraw(f *Future) bool {
	c.rq.rmu.Lock()
	i := slices.Index(c.rq.waiters.Items(), f)
	if i >= 0 {
		c.rq.waiters.Remove(i)
	}
	c.rq.rmu.Unlock()
	if i < 0 {
		return false
	}
	f.resolve(fmt.Errorf("rdma: recv on %v withdrawn: %w", c.remote, context.Canceled), 0, 0, false, nil, 0)
	return true
}

// moreToComeLocked reports whether messages of a failed connection may
// still be delivered. A failure can be seen (the peer's close on the
// control channel) before the poller has taken the completions of
// messages that arrived ahead of it. With its own receive queue, the QP
// completes the posted receives in order, first those that got a
// message before the failure, then flushes, which fail the waiters left
// (onRecv). With an SRQ, the beacon's flush comes after every message
// that arrived (postBeacon). After a local Close, or once the poller
// has stopped, or the receives left were abandoned (abandonPosted),
// nothing more comes. Caller holds rmu.
func (c *conn) moreToComeLocked() bool {
	if c.life.Closing() || c.rq.abandoned || c.unit == nil || isClosedChan(c.unit.P.Done()) {
		return false
	}
	if c.srq != nil {
		return !c.rq.beaconDone.Load()
	}
	return c.rq.rposted > 0
}

// postBeacon posts a WR to the QP, just moved to the error state, whose
// flush comes after the completion of every message that arrived before
// the error: a CQ reports a QP's completions in order, and in the error
// state the QP takes no more messages. When the flush is handled, every
// message that came is delivered, so the Recvs still waiting fail
// (onBeacon), and no completion of the QP is left in its CQ, so its QPN
// may go to another connection (teardown).
func (c *conn) postBeacon() {
	if c.srq != nil && !c.sq.PostBeacon() {
		// Nothing to wait for (the QP is closed, or the provider
		// refuses): what came is all there is.
		c.onBeacon(nil)
	}
}

// onBeacon fails the Recvs left: every message that came is delivered.
// Their error is the beacon's flush, as a receive's own flush would be.
func (c *conn) onBeacon(wc *verbs.WorkCompletion) {
	c.rq.beaconDone.Store(true)
	c.rq.rmu.Lock()
	ws := c.rq.takeWaitersLocked()
	c.endIfDeliveredLocked()
	c.rq.rmu.Unlock()
	err := c.life.Err()
	if wc != nil && wc.Status != verbs.WCSuccess {
		err = c.completionErr(postedWC(rc.OpRecv, wc)) // the Recvs' error: it names RECV
	}
	for _, f := range ws {
		f.resolve(err, 0, 0, false, nil, 0)
	}
}

// refillLocked accounts for a message the application took. With an SRQ
// its credit goes back to the peer (tookLocked). Otherwise it re-posts
// consumed receives once enough of them add up to a batch: one chain and
// one doorbell for many, as the peer libraries that kept receives deep
// learned. Caller holds rmu.
func (c *conn) refillLocked() {
	if c.srq != nil {
		c.cr.TookLocked()
		return
	}
	if gap := len(c.rq.rwrs) - c.rq.rposted - c.rq.ready.Len(); gap >= rc.ReturnBatch(len(c.rq.rwrs)) {
		before := c.rq.rposted
		c.repostLocked(gap)
		c.cr.Owe(c.rq.rposted - before)
	}
}

// repostLocked posts up to k receives, keeping at most rqDepth posted or
// waiting in ready. Caller holds rmu.
func (c *conn) repostLocked(k int) error {
	if c.life.Closing() || c.life.Err() != nil {
		return nil
	}
	k = min(k, len(c.rq.rwrs)-c.rq.rposted-c.rq.ready.Len())
	if k <= 0 {
		return nil
	}
	for i := 0; i < k; i++ {
		pb, err := c.eng.Pool.GetReceive(c.rq.recvSize)
		if err != nil {
			c.unpost(i)
			return fmt.Errorf("rdma: receive buffers: %w", err)
		}
		c.rq.rsges[i] = verbs.SGE{Addr: pb.Addr(), Length: uint32(c.rq.recvSize), LKey: pb.LKey()}
		c.life.AddInflight()
		c.rq.rwrs[i].ID = c.ops.Add(rc.Op{Kind: rc.OpRecv, Buf: pb})
	}
	n, err := c.qp.PostRecv(c.rq.rwrs[:k])
	c.rq.rposted += n
	if err != nil {
		for i := n; i < k; i++ {
			if o, ok := c.ops.Take(c.rq.rwrs[i].ID); ok {
				o.Buf.Release()
				c.life.OpDone()
			}
		}
		return fmt.Errorf("rdma: post receives: %w", err)
	}
	return nil
}

// unpost undoes the first i prepared receives.
func (c *conn) unpost(i int) {
	for j := 0; j < i; j++ {
		if o, ok := c.ops.Take(c.rq.rwrs[j].ID); ok {
			o.Buf.Release()
			c.life.OpDone()
		}
	}
}

// init makes room for the receives of a connection that posts its own
// (rdma_cm), rqDepth of them.
func (q *receives) init(rqDepth int) {
	q.rwrs = make([]verbs.RecvWR, rqDepth)
	q.rsges = make([]verbs.SGE, rqDepth)
	for i := range q.rwrs {
		q.rwrs[i].SGL = q.rsges[i : i+1]
	}
}

// isClosedChan reports whether c is closed, without blocking.
func isClosedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// dropReceived ends delivery at teardown: the messages that arrived and
// were not handed over go back to the pool, Done closes, and it returns
// the Recvs still waiting, for the caller to fail.
func (c *conn) dropReceived() []*Future {
	c.rq.rmu.Lock()
	for _, m := range c.rq.ready.Take() {
		if m.pb != nil {
			m.pb.Release()
		}
	}
	ws := c.rq.takeWaitersLocked()
	if !c.rq.ended {
		// Nothing more is delivered: a handler still running (it
		// may be the caller) has its message already.
		c.rq.ended = true
		close(c.done)
	}
	c.rq.rmu.Unlock()
	return ws
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
	c.rq.rmu.Lock()
	c.rq.abandoned = true
	ws := c.rq.takeWaitersLocked()
	c.endIfDeliveredLocked()
	c.rq.rmu.Unlock()
	err := c.life.Err()
	for _, f := range ws {
		f.resolve(err, 0, 0, false, nil, 0)
	}
	c.resolveLeft()
}
