package rdma

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// Close closes the connection gracefully and returns every buffer it
// holds. What it promises to both sides:
//   - Every operation this side issued before Close completes as it
//     would have: Close first waits (up to 5 s) for them. Operations
//     still queued for room or credits go out as the peer makes room;
//     if it makes none for half a second (it does not read), they fail
//     with ErrClosed.
//   - The peer hears of the close, posts nothing more (its new and
//     pending operations and its Err give one error matching
//     ErrPeerClosed), and its operations in flight
//     complete too: Close keeps the queue pair up until the peer says
//     they are done (up to 2 s more). So a message that this side's Recv
//     took before Close counts as delivered on the sender's side, and a
//     READ or WRITE of the peer's into memory exposed here finishes
//     before the memory is deregistered.
//   - Messages that arrived and were not handed over yet (no Recv took
//     them; the RecvHandler was not called for them) are dropped;
//     pending Recvs and anything the bounds cut short fail with an error
//     wrapping net.ErrClosed (ErrClosed here, ErrPeerClosed on the
//     peer). A caller that closes once Done is closed drops nothing:
//     Done closes only after every message that arrived was handed
//     over. Done is closed when Close returns.
//
// On connections set up through rdma_cm the peer's operations are not
// waited for. Close is safe to call twice.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.life.CallClose()
		// Let the operations in flight finish first (bounded): holding
		// every send credit means none is outstanding, and none can
		// start. A message we sent is then known to have arrived
		// before the peer hears that we close.
		if c.life.Err() == nil {
			c.quiesce(fmt.Errorf("rdma: conn %v: %w", c.remote, ErrClosed), true)
		}
		if c.ctl.Conn() != nil && !c.told.Load() { // an abort told the peer already
			c.ctl.WriteLast(rc.CtrlClose, nil, time.Second)
			// Keep the QP up until the peer's operations are done too
			// (bounded): it acknowledges what it received only while
			// it is up, and the peer may still be reading from or
			// writing to our memory.
			select {
			case <-c.ctl.CloseAcked():
			case <-c.ctl.Done():
			case <-time.After(closeAckBound):
			}
		}
		if c.cm != nil {
			// Keep the QP in RTS until the peer has answered the
			// disconnect (bounded): moving it to ERR at once can drop
			// the ACK of the last message the peer sent us (rxe
			// completes a receive before it acknowledges it), and the
			// peer would then wait for its retries.
			c.cm.Disconnect()
			select {
			case <-c.ctl.Done():
			case <-time.After(2 * time.Second):
			}
		}
		c.closeErr = c.teardown()
	})
	return c.closeErr
}

// teardown releases everything the connection holds.
func (c *conn) teardown() error {
	c.life.BeginTeardown()
	c.fail(fmt.Errorf("rdma: conn %v: %w", c.remote, ErrClosed))
	var errs []error
	if c.qp != nil {
		// The QP is in the error state: the outstanding WRs flush.
		var stopped <-chan struct{} // a stopped poller drains nothing
		if c.unit != nil {
			stopped = c.unit.P.Done()
		}
		select {
		case <-c.life.Drained():
		case <-stopped:
		case <-time.After(5 * time.Second):
		}
		errs = append(errs, c.qp.Close())
		if c.srq != nil {
			// The beacon flushed (or the bounds above ran out): no
			// completion of the QP is left to reach the next user of
			// its QPN.
			c.eng.UnregisterQPN(c.qp.QPN(), c.ep())
		}
	}
	errs = append(errs, c.closeCreditWord(), c.closeSettleByte())
	if c.srq != nil {
		c.cr.Leave()
		errs = append(errs, c.eng.DropSRQ(c.srq))
	}
	c.sq.ClearSent()
	// The QP is gone, so no completion can arrive for what is left:
	// resolve it here.
	c.resolveLeft()
	c.rq.Drop(c.life.ClosedErr())
	// The abort frame goes out before the socket closes. A failure
	// racing with this (a device event) starts no telling after it.
	c.tellMu.Lock()
	c.untold = true
	c.tellMu.Unlock()
	c.telling.Wait()
	if c.ctl.Conn() != nil {
		c.ctl.Conn().Close()
	}
	<-c.ctl.Done()
	c.ctl.WaitWorker()
	if c.cm != nil {
		errs = append(errs, c.cm.Close())
	}
	errs = append(errs, c.rg.RevokeAll())
	c.eng.retire(c) // its ops are all resolved: later completions are dropped
	if c.unit != nil {
		c.eng.Unreserve(c.ep(), c.unit, c.cfg.sqDepth+c.cfg.rqDepth)
	}
	errs = append(errs, c.eng.Release())
	return errors.Join(errs...)
}
