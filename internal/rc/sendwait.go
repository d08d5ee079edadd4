package rc

import (
	"context"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Waiting for the send queue, and its end: fences and a close wait for
// what was issued before them (WaitSent, Quiesce); a listener on iWARP
// holds its sends until its dialer's go (Hold, Release); a failed
// connection fails what waits (FailPending); the teardown forgets what
// was posted (ClearSent) and takes the credit word back
// (DetachCreditWord).

// WaitSent waits, until ctx ends, for every send-side WR issued before
// the call to complete: the queued ones are posted (or fail) first, then
// every WR posted up to then completes. New posts may go on meanwhile.
func (q *SendQueue) WaitSent(ctx context.Context) error {
	if q.drv != nil { // a Busy poller standing by must poll for us
		q.drv.WaitingAdd(1)
		defer q.drv.WaitingAdd(-1)
	}
	q.postMu.Lock()
	// Operations left in the combining queue were issued before the
	// call too: post (or queue) them first, so seq and posted cover them.
	q.postCombinedLocked()
	q.flushCoalescedLocked()
	seq := q.queuedSeq
	for {
		if q.drainedSeq >= seq && q.completed.Load() >= q.posted {
			// posted can only grow by drains of chains queued after
			// seq, or by later posts: ours are all in.
			break
		}
		if q.drainedSeq >= seq {
			target := q.posted
			for q.completed.Load() < target {
				if err := q.waitProgressLocked(ctx); err != nil {
					return err
				}
			}
			break
		}
		if err := q.waitProgressLocked(ctx); err != nil {
			return err
		}
	}
	q.unlockPost()
	return nil
}

// waitProgressLocked waits for the next completion or drain. It holds
// postMu on return, unless it returns an error.
func (q *SendQueue) waitProgressLocked(ctx context.Context) error {
	if q.progress == nil {
		q.progress = make(chan struct{})
	}
	ch := q.progress
	q.unlockPost()
	select {
	case <-ch:
		q.postMu.Lock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeStall is how long a close lets operations wait for a peer that
// makes no room.
const closeStall = 500 * time.Millisecond

// Quiesce stops new posts for a close: the operations issued before
// it, those left in the combining queue included, go out while the peer
// makes room (when drain is set); when it makes none for closeStall,
// or ctx ends, or drain is not set, those still queued fail with why.
func (q *SendQueue) Quiesce(ctx context.Context, why error, drain bool) {
	q.postMu.Lock()
	// Operations left in the combining queue were issued before
	// the close: they go out (or queue) as issued, not refused as
	// new ones.
	if q.cq.n.Load() > 0 {
		q.postCombinedLocked()
	}
	q.flushCoalescedLocked()
	q.quiescing = true
	for drain && q.pending.Len() > 0 {
		if q.progress == nil {
			q.progress = make(chan struct{})
		}
		ch := q.progress
		q.unlockPost()
		stall := time.NewTimer(closeStall)
		select {
		case <-ch:
		case <-stall.C:
			drain = false
		case <-ctx.Done():
			drain = false
		}
		stall.Stop()
		q.postMu.Lock()
	}
	q.failPendingLocked(why)
	q.postUnlock()
}

// Hold makes every send wait in the queue, as for room, until
// Release.
func (q *SendQueue) Hold() {
	q.postMu.Lock()
	q.held = true
	q.unlockPost()
}

// Release lets the held sends go, in order.
func (q *SendQueue) Release() {
	q.postMu.Lock()
	q.held = false
	q.drainLocked()
	q.postUnlock()
}

// FailPending fails every queued chain: the connection failed, and
// nothing more will be posted.
func (q *SendQueue) FailPending() {
	q.postMu.Lock()
	defer q.postUnlock()
	q.failPendingLocked(q.life.ClosedErr())
}

// failPendingLocked fails every queued chain with err. Caller holds
// postMu.
func (q *SendQueue) failPendingLocked(err error) {
	for _, qp := range q.pending.Take() {
		dropAll(qp.ops)
		resolveAll(qp.ops, err)
		q.drainedSeq = qp.seq
		qp.free()
	}
	q.pendingWRs = 0
	q.notifyLocked()
}

// ClearSent forgets the posted WRs of a connection whose QP is gone (no
// completion can come for them: the teardown resolves them) and stops
// the idle timer. Posts check closing under postMu, so none is half
// done.
func (q *SendQueue) ClearSent() {
	q.postMu.Lock()
	q.sentMu.Lock()
	q.sent.head, q.sent.size = 0, 0
	q.sentMu.Unlock()
	if q.idleTimer != nil {
		q.idleTimer.Stop()
	}
	q.unlockPost()
}

// DetachCreditWord takes the credit word's registration away from the
// send queue (a late look at the word, by the idle timer, then finds
// none) and returns it, for the teardown to close; nil when there is
// none. The QP is closed: no WRITE of either side's can touch the word
// any more, and none of ours is being made (postCreditLocked holds
// inflight).
func (q *SendQueue) DetachCreditWord() verbs.MR {
	if q.cw == nil {
		return nil
	}
	q.postMu.Lock()
	mr := q.cw.detach()
	q.unlockPost()
	return mr
}
