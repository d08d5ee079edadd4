package rdma

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/fifo"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The send queue of a connection has room for WithQueueDepth's send
// depth of WRs posted at once, and a message (SEND, SEND_WITH_IMM,
// WRITE_WITH_IMM) needs a credit too: a receive the peer has posted for
// it. An operation issued while either is short, or while
// others wait ahead of it, waits in a queue of its own, in order,
// without blocking its caller: its Future comes back unresolved and the
// operation is posted when completions make room. So no public call
// blocks a goroutine without a context. The queue is bounded: a
// connection holds at most WithSendQueueLimit WRs posted or queued, so a
// peer that never reads costs its sender that much memory, and past it
// a post fails at once (ErrQueueFull). The state below is under postMu.
//
// posted and completed count send WRs over the connection's life; a send
// queue completes in order, so completed >= n means the first n posted
// WRs are done. waitSent uses that for fences (Revoke, ReleaseRegion)
// and for Close.

// sendQueue is a connection's send queue: postMu and the state it
// guards. Conn holds it as c.sq.
type sendQueue struct {
	sendCredits                         // the sending half of the credits: admission of messages
	postMu      sync.Mutex              // orders posts, so sent matches the send queue
	sqFree      int                     // room in the send queue for operations; given back by settle, after completed
	beacon      bool                    // the beacon is posted, in its room beyond the send depth (postBeacon)
	creditDue   atomic.Bool             // a credit WRITE waits for postMu's holder (postCredit)
	held        bool                    // sends wait until releaseSends (a listener on iWARP: awaitGo)
	pending     fifo.Queue[*queuedPost] // chains waiting for room, oldest first
	pendingWRs  int                     // the WRs of pending
	queuedSeq   uint64                  // seq of the last chain queued
	drainedSeq  uint64                  // seq of the last chain that left pending
	posted      uint64                  // send WRs the QP accepted
	completed   atomic.Uint64           // send WRs completed
	quiescing   bool                    // Close waits for what was issued: nothing new
	progress    chan struct{}           // closed at the next completion or drain, for waitSent
	failAfter   error                   // a post under postMu failed the QP: fail at unlock
	latencySeq  uint64                  // send-side ops submitted, for latency sampling
	wr          [1]verbs.SendWR
	sge         [1]verbs.SGE
	op          [1]rc.Op
	cq          combineQueue // operations left by goroutines that found postMu taken
	heldOps     atomic.Int64 // operations posted and queued, as of the last postUnlock

	revoked     map[uint32]struct{} // rkeys the peer revoked (isRevoked)
	revokedFIFO []uint32

	// sent holds the wr_ids of the posted send WRs in posting order. A
	// send queue completes in order, so a completion covers every
	// unsignaled WR ahead of it in sent.
	sentMu sync.Mutex
	sent   ring
}

// init makes the send queue of a connection of send depth sqDepth, and
// binds the jobs of its credits once (a method value allocates).
func (q *sendQueue) init(sqDepth int, askCredits, returnUnused func()) {
	q.askJob, q.backJob = askCredits, returnUnused
	q.sqFree = sqDepth
	q.sent = newRing(sqDepth)
}

// clearSent forgets the posted WRs of a connection whose QP is gone (no
// completion can come for them: teardown resolves them) and stops the
// idle timer. Posts check closing under postMu, so none is half done.
func (c *conn) clearSent() {
	c.sq.postMu.Lock()
	c.sq.sentMu.Lock()
	c.sq.sent.head, c.sq.sent.size = 0, 0
	c.sq.sentMu.Unlock()
	if c.sq.idleTimer != nil {
		c.sq.idleTimer.Stop()
	}
	c.unlockPost()
}

// ErrQueueFull: the connection holds its WithSendQueueLimit of
// operations issued and not completed; the post failed at once.
var ErrQueueFull = errors.New("send queue full")

// defaultSendQueueLimit is the send queue limit without
// WithSendQueueLimit, at the send depth sqDepth.
func defaultSendQueueLimit(sqDepth int) int { return max(4096, 8*sqDepth) }

// WithSendQueueLimit bounds the operations a connection holds issued and
// not completed, posted or waiting for room or credits (each operation
// of a Batch counts): by default 8 times the send depth, at least 4,096.
// n must be at least the send depth (WithQueueDepth), so that a Batch of
// the send depth fits an idle connection.
//
// A post past the limit fails at once with an error matching
// ErrQueueFull, and holds no buffer: nothing was posted or queued. The
// operations held go out as the send queue and the peer make room, so
// room comes back when one of them resolves: to wait for room, wait (under
// a context) on the Future of an earlier operation of the connection and
// post again. A peer that never reads holds the sender at the limit, and
// no more memory than that.
func WithSendQueueLimit(n int) ConnOption {
	return connOpt(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("rdma: %w: send queue limit %d (want at least the send depth)", ErrInvalid, n)
		}
		c.sqLimit = n
		return nil
	})
}

// queuedPost is a chain waiting for room, with copies of its WRs, SGEs
// and ops (the caller reuses its own). Drained ones go back to
// queuedPool, their arrays with them: queuing allocates nothing in a
// steady state, and the garbage collector may free what load left.
type queuedPost struct {
	seq  uint64
	wrs  []verbs.SendWR
	sges []verbs.SGE
	ops  []rc.Op
}

var queuedPool = sync.Pool{New: func() any { return new(queuedPost) }}

// newQueued copies the chain wrs, ops into a queuedPost.
func newQueued(wrs []verbs.SendWR, ops []rc.Op) *queuedPost {
	q := queuedPool.Get().(*queuedPost)
	q.wrs = append(q.wrs[:0], wrs...)
	q.ops = append(q.ops[:0], ops...)
	q.sges = slices.Grow(q.sges[:0], len(wrs))[:len(wrs)]
	for i := range q.wrs {
		if len(q.wrs[i].SGL) > 0 {
			q.sges[i] = q.wrs[i].SGL[0] // one SGE per WR in this package
			q.wrs[i].SGL = q.sges[i : i+1]
		}
	}
	return q
}

// free gives q, drained or failed, back to queuedPool, without what it
// referenced.
func (q *queuedPost) free() {
	clear(q.ops)
	clear(q.wrs)
	queuedPool.Put(q)
}

// submitLocked posts the chain now, or queues it behind the chains that
// wait for room. On error nothing is posted or queued and the ops'
// buffers are dropped. Caller holds postMu.
func (c *conn) submitLocked(wrs []verbs.SendWR, ops []rc.Op) error {
	if err := c.postable(wrs, ops, false); err != nil {
		c.dropAll(ops)
		return err
	}
	if c.sq.pending.Len() == 0 && c.roomLocked(wrs) {
		c.stampLatency(ops)
		return c.postLocked(wrs, ops)
	}
	// Posted and not completed, and queued: a direct post never passes
	// the limit (at least the send depth), so only a queued one checks.
	if held := c.cfg.sqDepth - c.sq.sqFree + c.sq.pendingWRs; held+len(wrs) > c.sendQueueLimit() {
		c.dropAll(ops)
		c.st.queueFull.Add(1)
		return fmt.Errorf("rdma: conn %v: %w: %d operations issued and not completed (WithSendQueueLimit %d); post again once one of them resolves",
			c.remote, ErrQueueFull, held, c.sendQueueLimit())
	}
	if c.sq.sqFree < len(wrs) {
		c.st.queueWaits.Add(1)
	} else {
		c.st.creditWaits.Add(1)
	}
	c.stampLatency(ops)
	q := newQueued(wrs, ops)
	c.sq.queuedSeq++
	q.seq = c.sq.queuedSeq
	c.sq.pending.Push(q)
	c.sq.pendingWRs += len(q.wrs)
	return nil
}

// sendQueueLimit is the connection's WithSendQueueLimit.
func (c *conn) sendQueueLimit() int {
	if c.cfg.sqLimit > 0 {
		return c.cfg.sqLimit
	}
	return defaultSendQueueLimit(c.cfg.sqDepth)
}

// drainLocked posts the queued chains that fit, oldest first. Caller
// holds postMu.
func (c *conn) drainLocked() {
	for c.sq.pending.Len() > 0 && c.roomLocked(c.sq.pending.Items()[0].wrs) {
		q := c.sq.pending.Pop()
		c.sq.pendingWRs -= len(q.wrs)
		c.sq.drainedSeq = q.seq
		err := c.postable(q.wrs, q.ops, true)
		if err != nil {
			c.dropAll(q.ops)
		} else {
			err = c.postLocked(q.wrs, q.ops)
		}
		if err != nil {
			resolveAll(q.ops, err)
		}
		q.free()
	}
	c.sq.notifyLocked()
}

// failPending fails every queued chain: the connection failed, and
// nothing more will be posted.
func (c *conn) failPending() {
	c.sq.postMu.Lock()
	defer c.postUnlock()
	c.failPendingLocked(c.life.ClosedErr())
}

// failPendingLocked fails every queued chain with err. Caller holds
// postMu.
func (c *conn) failPendingLocked(err error) {
	for _, q := range c.sq.pending.Take() {
		c.dropAll(q.ops)
		resolveAll(q.ops, err)
		c.sq.drainedSeq = q.seq
		q.free()
	}
	c.sq.pendingWRs = 0
	c.sq.notifyLocked()
}

// settle returns the room of k completed WRs and posts what waits for
// it. It runs on the completion path, with no other lock of c held.
func (c *conn) settle(k int) {
	c.sq.completed.Add(uint64(k))
	c.sq.postMu.Lock()
	c.sq.sqFree += k
	c.drainLocked()
	c.postUnlock()
}

// postUnlock posts what the combining queue holds, unlocks postMu,
// queues the credit frames decided under it, and fails the connection if
// a post under it asked to: later and fail take locks of their own.
func (c *conn) postUnlock() {
	for {
		if c.sq.creditDue.Load() {
			c.postCreditLocked()
		}
		if c.sq.cq.n.Load() > 0 {
			c.postCombinedLocked()
		}
		err := c.sq.failAfter
		c.sq.failAfter = nil
		ask, back := c.sq.askNow, c.sq.backNow
		c.sq.askNow, c.sq.backNow = false, false
		c.sq.heldOps.Store(int64(c.cfg.sqDepth - c.sq.sqFree + c.sq.pendingWRs))
		c.sq.postMu.Unlock()
		// A give-back before an ask: a recalled chain gives back its
		// credits and asks for all it needs (onRecall); an ask job
		// queued before takes the give-back ahead of itself
		// (askCredits).
		if back && !c.sq.backQueued.Swap(true) {
			c.later(c.sq.backJob)
		}
		if ask && !c.sq.askQueued.Swap(true) {
			c.later(c.sq.askJob)
		}
		if err != nil {
			c.fail(err)
		}
		// An operation left in the combining queue, or a credit WRITE,
		// after the look above, by a goroutine that found postMu taken,
		// is ours to post.
		if !c.sq.leftWork() || !c.sq.postMu.TryLock() {
			return
		}
	}
}

// unlockPost unlocks postMu where no post was made under it, and posts
// what the combining queue got meanwhile.
func (c *conn) unlockPost() {
	c.sq.postMu.Unlock()
	if c.sq.leftWork() && c.sq.postMu.TryLock() {
		c.postUnlock()
	}
}

// leftWork reports whether a goroutine that found postMu taken left
// something for its holder to post.
func (q *sendQueue) leftWork() bool { return q.cq.n.Load() > 0 || q.creditDue.Load() }

// notifyLocked wakes waitSent. Caller holds postMu.
func (q *sendQueue) notifyLocked() {
	if q.progress != nil {
		close(q.progress)
		q.progress = nil
	}
}

// waitSent waits, until ctx ends, for every send-side WR issued before
// the call to complete: the queued ones are posted (or fail) first, then
// every WR posted up to then completes. New posts may go on meanwhile.
func (c *conn) waitSent(ctx context.Context) error {
	if c.drv != nil { // a Busy poller standing by must poll for us
		c.drv.WaitingAdd(1)
		defer c.drv.WaitingAdd(-1)
	}
	c.sq.postMu.Lock()
	// Operations left in the combining queue were issued before the
	// call too: post (or queue) them first, so seq and posted cover them.
	c.postCombinedLocked()
	seq := c.sq.queuedSeq
	for {
		if c.sq.drainedSeq >= seq && c.sq.completed.Load() >= c.sq.posted {
			// posted can only grow by drains of chains queued after
			// seq, or by later posts: ours are all in.
			break
		}
		if c.sq.drainedSeq >= seq {
			target := c.sq.posted
			for c.sq.completed.Load() < target {
				if err := c.waitProgressLocked(ctx); err != nil {
					return err
				}
			}
			break
		}
		if err := c.waitProgressLocked(ctx); err != nil {
			return err
		}
	}
	c.unlockPost()
	return nil
}

// waitProgressLocked waits for the next completion or drain. It holds
// postMu on return, unless it returns an error.
func (c *conn) waitProgressLocked(ctx context.Context) error {
	if c.sq.progress == nil {
		c.sq.progress = make(chan struct{})
	}
	ch := c.sq.progress
	c.unlockPost()
	select {
	case <-ch:
		c.sq.postMu.Lock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// postLocked records ops[i] for wrs[i] and posts wrs as one chain, taking
// room for them. Caller holds postMu; the send queue has room. On failure
// nothing stays recorded except WRs the provider accepted; those complete
// (or flush, since a failed post fails the connection) like any other.
func (c *conn) postLocked(wrs []verbs.SendWR, ops []rc.Op) error {
	c.sq.sqFree -= len(wrs)
	c.sq.credits -= needCredits(wrs)
	for i := range wrs {
		c.life.AddInflight()
		wrs[i].ID = c.ops.Add(ops[i])
	}
	c.sq.sentMu.Lock()
	for i := range wrs {
		c.sq.sent.push(wrs[i].ID)
	}
	c.sq.sentMu.Unlock()
	n, err := c.doorbellLocked(wrs)
	c.sq.posted += uint64(n)
	if err == nil {
		// A parked Adaptive poller would wait for the completion
		// event; a kick makes it spin for the completion now. It costs
		// nanoseconds otherwise. An Event poller gets the event anyway:
		// waking it to poll once would only cost a wake and a park.
		if c.eng.cfg.pollMode == PollAdaptive {
			c.unit.P.Kick()
		}
		return nil
	}
	// Undo what was not posted, newest first, so sent stays in order.
	c.sq.sentMu.Lock()
	for i := len(wrs) - 1; i >= n; i-- {
		c.sq.sent.popBack()
		if o, ok := c.ops.Take(wrs[i].ID); ok {
			o.DropBuf()
			c.sq.sqFree++
			c.sq.credits += needCredits(wrs[i : i+1])
			c.life.OpDone()
		}
	}
	c.sq.sentMu.Unlock()
	if errors.Is(err, verbs.ErrClosed) || c.life.Err() != nil {
		err = c.life.ClosedErr()
	}
	err = fmt.Errorf("rdma: post %v: %w", wrs[n].Opcode, err)
	if n > 0 {
		// Accepted WRs without a signaled one after them would never
		// be reported; failing the QP flushes them.
		c.sq.failAfter = err
	}
	return err
}

// postable refuses a chain on a connection that failed, is closing or
// whose peer closed, and accesses to regions the peer revoked. A queued
// chain was issued before Close began, so Close lets it go out. Caller
// holds postMu.
func (c *conn) postable(wrs []verbs.SendWR, ops []rc.Op, queued bool) error {
	if c.life.Closing() || c.life.Err() != nil {
		return c.life.ClosedErr()
	}
	// The peer's close quiesces too: a post then fails as the peer's
	// doing, not as a close of ours.
	if c.life.PeerClosed() {
		if c.life.CloseHeard() {
			return c.life.PeerClosedErr()
		}
		return c.life.PeerLostErr() // the failure that says so is on its way
	}
	if c.sq.quiescing && !queued {
		return c.life.ClosedErr()
	}
	for i := range wrs {
		if ops[i].Kind != rc.OpSend && c.sq.isRevoked(wrs[i].RKey) {
			return fmt.Errorf("rdma: %v to %v, rkey %#x: %w", wrs[i].Opcode, c.remote, wrs[i].RKey, ErrRegionRevoked)
		}
	}
	return nil
}

func (c *conn) dropAll(ops []rc.Op) {
	for i := range ops {
		ops[i].DropBuf()
	}
}

// resolveAll resolves the futures of ops (a batch shares one) with err.
func resolveAll(ops []rc.Op, err error) {
	for i := range ops {
		ops[i].Resolve(err, 0, 0)
	}
}

// controlWRs is the room a connection with a shared receive queue keeps
// in its send queue beyond the send depth, for the two WRs of its own
// that no operation waits for: the beacon (posted once, at the end:
// sq.beacon) and one credit WRITE (one at a time: cw.writing). So
// neither ever waits for room, and operations never wait for them.
const controlWRs = 2

// doorbellLocked hands wrs to the QP as one chain: the one place a
// connection posts send WRs. Caller holds postMu.
func (c *conn) doorbellLocked(wrs []verbs.SendWR) (int, error) {
	c.st.doorbells.Add(1)
	return c.qp.PostSend(wrs)
}

// postCredit posts a WRITE of the credits given so far into the peer's
// credit word (the caller set cw.writing; the completion clears it,
// onCreditWritten), in its room beyond the send depth. It never waits for
// postMu: it runs under the shared receive queue's lock and the receive
// side's, so when postMu is taken it leaves the WRITE to the holder, as
// submit leaves an operation, and postUnlock posts it.
func (c *conn) postCredit() {
	c.sq.creditDue.Store(true)
	if c.sq.postMu.TryLock() {
		c.postUnlock()
	}
}

// postCreditLocked posts the credit WRITE left by postCredit. Caller
// holds postMu.
func (c *conn) postCreditLocked() {
	if !c.sq.creditDue.Swap(false) {
		return
	}
	// inflight first: teardown, which waits for it, then cannot free the
	// credit buffer under us.
	c.life.AddInflight()
	if c.life.Err() != nil || c.cr.cw.mr == nil {
		c.life.OpDone() // the connection is failing: nothing is taken any more
		return
	}
	id := c.ops.Add(rc.Op{Kind: rc.OpCredit})
	c.st.creditWrites.Add(1)
	if n, _ := c.doorbellLocked(c.cr.cw.request(id, c.inline, &c.peer)); n == 0 {
		// The QP is closing or failed; its teardown ends the rest.
		if _, ok := c.ops.Take(id); ok {
			c.life.OpDone()
		}
	}
}

// postBeacon posts a WR to the QP, just moved to the error state, whose
// flush comes after the completion of every message that arrived before
// the error: a CQ reports a QP's completions in order, and in the error
// state the QP takes no more messages. When the flush is handled, every
// message that came is delivered, so the Recvs still waiting fail
// (onBeacon), and no completion of the QP is left in its CQ, so its QPN
// may go to another connection (teardown). It goes in its room beyond
// the send depth.
func (c *conn) postBeacon() {
	if c.srq == nil {
		return
	}
	c.sq.postMu.Lock()
	if c.sq.beacon {
		c.unlockPost()
		return
	}
	c.sq.beacon = true
	c.life.AddInflight()
	id := c.ops.Add(rc.Op{Kind: rc.OpBeacon})
	_, err := c.doorbellLocked([]verbs.SendWR{{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled}})
	c.unlockPost()
	if err != nil {
		// Nothing to wait for (the QP is closed, or the provider
		// refuses): what came is all there is.
		if _, ok := c.ops.Take(id); ok {
			c.life.OpDone()
		}
		c.onBeacon(nil)
	}
}

// takeCovered takes the send WRs a completion of id covers off the sent
// ring, and finishes the unsignaled ones before it: a send queue
// completes in order, so they completed successfully, or they would
// have produced a completion of their own. It returns how many WRs the
// completion covers, its own included. It runs on a poller.
func (c *conn) takeCovered(id uint64) int {
	c.sq.sentMu.Lock()
	k := 1
	for c.sq.sent.len() > 0 {
		x := c.sq.sent.popFront()
		if x == id {
			break
		}
		if p, ok := c.ops.Take(x); ok {
			c.finish(&p, nil)
			k++
		}
	}
	c.sq.sentMu.Unlock()
	return k
}

// maxRevokedKeys bounds the revoked rkeys a connection remembers, to
// refuse accesses to them locally.
const maxRevokedKeys = 1024

// addRevoked records a revoked rkey. Caller holds postMu.
func (q *sendQueue) addRevoked(rkey uint32) {
	if q.revoked == nil {
		q.revoked = map[uint32]struct{}{}
	}
	if _, ok := q.revoked[rkey]; ok {
		return
	}
	if len(q.revokedFIFO) >= maxRevokedKeys {
		delete(q.revoked, q.revokedFIFO[0])
		q.revokedFIFO = q.revokedFIFO[1:]
	}
	q.revoked[rkey] = struct{}{}
	q.revokedFIFO = append(q.revokedFIFO, rkey)
}

// forgetRevoked: the peer hands out rkey again (the device reused it for
// new memory), so accesses to it are good again.
func (c *conn) forgetRevoked(rkey uint32) {
	c.sq.postMu.Lock()
	if _, ok := c.sq.revoked[rkey]; ok {
		delete(c.sq.revoked, rkey)
		for i, k := range c.sq.revokedFIFO {
			if k == rkey {
				c.sq.revokedFIFO = append(c.sq.revokedFIFO[:i], c.sq.revokedFIFO[i+1:]...)
				break
			}
		}
	}
	c.unlockPost()
}

// isRevoked reports whether the peer revoked rkey. Caller holds postMu.
func (q *sendQueue) isRevoked(rkey uint32) bool {
	if len(q.revoked) == 0 {
		return false
	}
	_, ok := q.revoked[rkey]
	return ok
}

// postMu.
func (c *conn) stampLatency(ops []rc.Op) {
	for i := range ops {
		c.sq.latencySeq++
		if c.sq.latencySeq%LatencySample == 0 {
			ops[i].Start = nanotime()
		}
	}
}

// quiesceSends stops new posts for a close: the operations issued before
// it, those left in the combining queue included, go out while the peer
// makes room (when drain is set); when it makes none for closeStall,
// or ctx ends, or drain is not set, those still queued fail with why.
func (c *conn) quiesceSends(ctx context.Context, why error, drain bool) {
	c.sq.postMu.Lock()
	// Operations left in the combining queue were issued before
	// the close: they go out (or queue) as issued, not refused as
	// new ones.
	if c.sq.cq.n.Load() > 0 {
		c.postCombinedLocked()
	}
	c.sq.quiescing = true
	for drain && c.sq.pending.Len() > 0 {
		if c.sq.progress == nil {
			c.sq.progress = make(chan struct{})
		}
		ch := c.sq.progress
		c.unlockPost()
		stall := time.NewTimer(closeStall)
		select {
		case <-ch:
		case <-stall.C:
			drain = false
		case <-ctx.Done():
			drain = false
		}
		stall.Stop()
		c.sq.postMu.Lock()
	}
	c.failPendingLocked(why)
	c.postUnlock()
}

// holdSends makes every send wait in the queue, as for room, until
// releaseSends.
func (c *conn) holdSends() {
	c.sq.postMu.Lock()
	c.sq.held = true
	c.unlockPost()
}

// releaseSends lets the held sends go, in order.
func (c *conn) releaseSends() {
	c.sq.postMu.Lock()
	c.sq.held = false
	c.drainLocked()
	c.postUnlock()
}
