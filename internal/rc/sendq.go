package rc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/fifo"
	"github.com/go-rdma/rdma/internal/poller"
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
// WRs are done. WaitSent uses that for fences (Revoke, ReleaseRegion)
// and for Close.

// SendQueue is a connection's send queue, the only poster of its send
// WRs: postMu and the state it guards, the sending half of the credits,
// the combining queue and the sent ring.
type SendQueue struct {
	sendCredits                         // the sending half of the credits: admission of messages
	postMu      sync.Mutex              // orders posts, so sent matches the send queue
	sqFree      int                     // room in the send queue for operations; given back by Settle, after completed
	beacon      bool                    // the beacon is posted, in its room beyond the send depth (PostBeacon)
	creditDue   atomic.Bool             // a credit WRITE waits for postMu's holder (PostCredit)
	held        bool                    // sends wait until Release (a listener on iWARP waits for the dialer's go)
	pending     fifo.Queue[*queuedPost] // chains waiting for room, oldest first
	pendingWRs  int                     // the WRs of pending
	queuedSeq   uint64                  // seq of the last chain queued
	drainedSeq  uint64                  // seq of the last chain that left pending
	posted      uint64                  // send WRs the QP accepted
	completed   atomic.Uint64           // send WRs completed
	quiescing   bool                    // Close waits for what was issued: nothing new
	progress    chan struct{}           // closed at the next completion or drain, for WaitSent
	failAfter   error                   // a post under postMu failed the QP: fail at unlock
	latencySeq  uint64                  // send-side ops submitted, for latency sampling
	wr          [1]verbs.SendWR
	sge         [1]verbs.SGE
	op          [1]Op
	cq          combineQueue // operations left by goroutines that found postMu taken
	drain       drainChain   // the chain drainWithLocked posts
	heldOps     atomic.Int64 // operations posted and queued, as of the last postUnlock
	st          sendCounters

	revoked     map[uint32]struct{} // rkeys the peer revoked (isRevoked)
	revokedFIFO []uint32

	// sent holds the wr_ids of the posted send WRs in posting order. A
	// send queue completes in order, so a completion covers every
	// unsignaled WR ahead of it in sent.
	sentMu  sync.Mutex
	sent    ring
	covered Op // the op TakeCovered finishes

	// The parts it works with, set by Init and SetQP, read-only after.
	depth, limit int            // the send depth; the most WRs posted and queued (WithSendQueueLimit)
	ops          *OpTable       // the connection's op table: wr_ids
	life         *Life          // the connection's end
	owner        Owner          // the connection, off the post path
	cw           *CreditWord    // where the peer writes credits; nil without credits in band
	peer         *Hello         // the peer's hello: its credit word and its receive depth
	inBand       bool           // credits are asked for and given back on a control channel
	qp           verbs.QP       // where the WRs go
	inline       int            // bytes a WR may carry inline
	kick         *poller.Poller // an Adaptive poller to kick after a post; nil for others
	drv          *poller.Poller // a Busy poller WaitSent drives; nil for others
}

// sendCounters are the send queue's counters (SendCounts).
type sendCounters struct {
	creditWaits, queueWaits, queueFull, creditWrites, doorbells atomic.Uint64
}

// SendCounts are a send queue's counters: the chains that waited for
// credits and for room, the posts refused at the limit, the credit
// WRITEs, and the doorbells (PostSend calls).
type SendCounts struct {
	CreditWaits, QueueWaits, QueueFull, CreditWrites, Doorbells uint64
}

// Counts reads the send queue's counters.
func (q *SendQueue) Counts() SendCounts {
	return SendCounts{CreditWaits: q.st.creditWaits.Load(), QueueWaits: q.st.queueWaits.Load(),
		QueueFull: q.st.queueFull.Load(), CreditWrites: q.st.creditWrites.Load(), Doorbells: q.st.doorbells.Load()}
}

// Init makes the send queue of a connection of send depth depth that
// holds at most limit WRs posted and queued. ops, life, cw and peer are
// the connection's (cw nil without credits in band; inBand says the
// connection has a control channel to ask for credits on); owner is the
// connection itself. It binds the jobs of the credits once (a method
// value allocates).
func (q *SendQueue) Init(depth, limit int, ops *OpTable, life *Life, cw *CreditWord, peer *Hello, inBand bool, owner Owner) {
	q.depth, q.limit = depth, limit
	q.ops, q.life, q.cw, q.peer, q.inBand, q.owner = ops, life, cw, peer, inBand, owner
	q.askJob, q.backJob = q.askCredits, q.returnUnused
	q.sqFree = depth
	q.sent = newRing(depth)
}

// SetQP gives the send queue its QP, which carries inline bytes a WR,
// and the poller of its CQ: kick, an Adaptive one, is kicked after each
// post; drv, a Busy one, is driven while WaitSent waits.
func (q *SendQueue) SetQP(qp verbs.QP, inline int, kick, drv *poller.Poller) {
	q.qp, q.inline, q.kick, q.drv = qp, inline, kick, drv
}

// ErrQueueFull: the connection holds its WithSendQueueLimit of
// operations issued and not completed; the post failed at once.
var ErrQueueFull = errors.New("send queue full")

// DefaultLimit is the send queue limit without WithSendQueueLimit, at
// the send depth depth.
func DefaultLimit(depth int) int { return max(4096, 8*depth) }

// Submit posts one operation: at once when postMu is free, else through
// the combining queue. An operation that fails at once has its Future
// resolved.
// wr and o are read, not kept: the caller's may live on its stack.
func (q *SendQueue) Submit(wr *verbs.SendWR, sge verbs.SGE, o *Op) {
	if !q.postMu.TryLock() {
		// Near the send queue limit, or on a connection that is
		// ending, wait for the lock: a post past the limit, or after
		// the end, fails at once, and the queue stays bounded. An
		// inline operation leaves a copy of its bytes (stageInline):
		// the caller may change its own once the call returns.
		if !q.life.Ending() && q.heldOps.Load()+int64(q.cq.n.Load()) < int64(q.limit/2) &&
			(wr.Flags&verbs.SendInline == 0 || stageInline(&sge, o) == nil) {
			q.cq.leave(postReq{wr: *wr, sge: sge, op: *o})
			if !q.postMu.TryLock() {
				return // the holder posts it (unlockPost)
			}
			q.postUnlock() // the holder had let go: post it ourselves
			return
		}
		q.postMu.Lock()
	}
	if q.cq.n.Load() > 0 {
		// Those who came first go first.
		q.cq.leave(postReq{wr: *wr, sge: sge, op: *o})
		q.postUnlock()
		return
	}
	q.sge[0] = sge
	q.wr[0], q.op[0] = *wr, *o
	q.wr[0].SGL = q.sge[:]
	if o.N == 0 {
		q.wr[0].SGL = nil
	}
	err := q.submitLocked(q.wr[:], q.op[:])
	q.wr[0], q.op[0] = verbs.SendWR{}, Op{}
	q.postUnlock()
	if err != nil {
		o.Resolve(err, 0, 0)
	}
}

// submitLocked posts the chain now, or queues it behind the chains that
// wait for room. On error nothing is posted or queued and the ops'
// buffers are dropped. Caller holds postMu.
func (q *SendQueue) submitLocked(wrs []verbs.SendWR, ops []Op) error {
	if err := q.postable(wrs, ops, false); err != nil {
		dropAll(ops)
		return err
	}
	if q.pending.Len() > 0 && q.pending.Items()[0].coal {
		if q.coalesceLocked(wrs, ops) {
			return nil
		}
		// The coalescing chain goes first, with this one if it fits.
		if took, err := q.drainWithLocked(wrs, ops, true); took {
			return err
		}
	}
	if q.pending.Len() == 0 && q.roomLocked(wrs) {
		if q.coalesceLocked(wrs, ops) {
			return nil
		}
		q.stampLatency(ops)
		return q.postLocked(wrs, ops)
	}
	// Posted and not completed, and queued: a direct post never passes
	// the limit (at least the send depth), so only a queued one checks.
	if held := q.depth - q.sqFree + q.pendingWRs; held+len(wrs) > q.limit {
		dropAll(ops)
		q.st.queueFull.Add(1)
		return fmt.Errorf("rdma: conn %v: %w: %d operations issued and not completed (WithSendQueueLimit %d); post again once one of them resolves",
			q.life.remote, ErrQueueFull, held, q.limit)
	}
	qp := newQueued(wrs, ops)
	for i := range qp.wrs {
		if qp.wrs[i].Flags&verbs.SendInline == 0 || qp.sges[i].Length == 0 {
			continue
		}
		if err := stageInline(&qp.sges[i], &qp.ops[i]); err != nil {
			dropAll(qp.ops) // the copies made so far with the callers' buffers
			qp.free()
			return fmt.Errorf("rdma: conn %v: %w", q.life.remote, err)
		}
	}
	if q.sqFree < len(wrs) {
		q.st.queueWaits.Add(1)
	} else {
		q.st.creditWaits.Add(1)
	}
	q.stampLatency(qp.ops)
	q.queuedSeq++
	qp.seq = q.queuedSeq
	q.pending.Push(qp)
	q.pendingWRs += len(qp.wrs)
	return nil
}

// Settle returns the room of k completed WRs and posts what waits for
// it. It runs on the completion path, with no other lock of c held.
func (q *SendQueue) Settle(k int) {
	q.completed.Add(uint64(k))
	q.postMu.Lock()
	q.sqFree += k
	q.drainLocked()
	q.postUnlock()
}

// postUnlock posts what the combining queue holds, unlocks postMu,
// queues the credit frames decided under it, and fails the connection if
// a post under it asked to: later and fail take locks of their own.
func (q *SendQueue) postUnlock() {
	for {
		if q.creditDue.Load() {
			q.postCreditLocked()
		}
		if q.cq.n.Load() > 0 {
			q.postCombinedLocked()
		}
		err := q.failAfter
		q.failAfter = nil
		ask, back := q.askNow, q.backNow
		q.askNow, q.backNow = false, false
		q.heldOps.Store(int64(q.depth - q.sqFree + q.pendingWRs))
		q.postMu.Unlock()
		// A give-back before an ask: a recalled chain gives back its
		// credits and asks for all it needs (OnRecall); an ask job
		// queued before takes the give-back ahead of itself
		// (askCredits).
		if back && !q.backQueued.Swap(true) {
			q.owner.Later(q.backJob)
		}
		if ask && !q.askQueued.Swap(true) {
			q.owner.Later(q.askJob)
		}
		if err != nil {
			q.owner.Fail(err)
		}
		// An operation left in the combining queue, or a credit WRITE,
		// after the look above, by a goroutine that found postMu taken,
		// is ours to post.
		if !q.leftWork() || !q.postMu.TryLock() {
			return
		}
	}
}

// unlockPost unlocks postMu where no post was made under it, and posts
// what the combining queue got meanwhile.
func (q *SendQueue) unlockPost() {
	q.postMu.Unlock()
	if q.leftWork() && q.postMu.TryLock() {
		q.postUnlock()
	}
}

// leftWork reports whether a goroutine that found postMu taken left
// something for its holder to post.
func (q *SendQueue) leftWork() bool { return q.cq.n.Load() > 0 || q.creditDue.Load() }

// notifyLocked wakes WaitSent. Caller holds postMu.
func (q *SendQueue) notifyLocked() {
	if q.progress != nil {
		close(q.progress)
		q.progress = nil
	}
}

// postLocked records ops[i] for wrs[i] and posts wrs as one chain, taking
// room for them. Caller holds postMu; the send queue has room. On failure
// nothing stays recorded except WRs the provider accepted; those complete
// (or flush, since a failed post fails the connection) like any other.
func (q *SendQueue) postLocked(wrs []verbs.SendWR, ops []Op) error {
	q.sqFree -= len(wrs)
	q.credits -= NeedCredits(wrs)
	for i := range wrs {
		q.life.AddInflight()
		wrs[i].ID = q.ops.Add(ops[i])
	}
	q.sentMu.Lock()
	for i := range wrs {
		q.sent.push(wrs[i].ID)
	}
	q.sentMu.Unlock()
	n, err := q.doorbellLocked(wrs)
	q.posted += uint64(n)
	if err == nil {
		// A parked Adaptive poller would wait for the completion
		// event; a kick makes it spin for the completion now. It costs
		// nanoseconds otherwise. An Event poller gets the event anyway:
		// waking it to poll once would only cost a wake and a park.
		if q.kick != nil {
			q.kick.Kick()
		}
		return nil
	}
	// Undo what was not posted, newest first, so sent stays in order.
	q.sentMu.Lock()
	for i := len(wrs) - 1; i >= n; i-- {
		q.sent.popBack()
		if o, ok := q.ops.Take(wrs[i].ID); ok {
			o.DropBuf()
			q.sqFree++
			q.credits += NeedCredits(wrs[i : i+1])
			q.life.OpDone()
		}
	}
	q.sentMu.Unlock()
	if errors.Is(err, verbs.ErrClosed) || q.life.Err() != nil {
		err = q.life.ClosedErr()
	}
	err = fmt.Errorf("rdma: post %v: %w", wrs[n].Opcode, err)
	if n > 0 {
		// Accepted WRs without a signaled one after them would never
		// be reported; failing the QP flushes them.
		q.failAfter = err
	}
	return err
}

// postable refuses a chain on a connection that failed, is closing or
// whose peer closed, and accesses to regions the peer revoked. A queued
// chain was issued before Close began, so Close lets it go out. Caller
// holds postMu.
func (q *SendQueue) postable(wrs []verbs.SendWR, ops []Op, queued bool) error {
	if q.life.Closing() || q.life.Err() != nil {
		return q.life.ClosedErr()
	}
	// The peer's close quiesces too: a post then fails as the peer's
	// doing, not as a close of ours.
	if q.life.PeerClosed() {
		if q.life.CloseHeard() {
			return q.life.PeerClosedErr()
		}
		return q.life.PeerLostErr() // the failure that says so is on its way
	}
	if q.quiescing && !queued {
		return q.life.ClosedErr()
	}
	for i := range wrs {
		if ops[i].Kind != OpSend && q.isRevoked(wrs[i].RKey) {
			return fmt.Errorf("rdma: %v to %v, rkey %#x: %w", wrs[i].Opcode, q.life.remote, wrs[i].RKey, ErrRegionRevoked)
		}
	}
	return nil
}

// dropAll gives back the ops' holds on their buffers.
func dropAll(ops []Op) {
	for i := range ops {
		ops[i].DropBuf()
	}
}

// resolveAll resolves the futures of ops (a batch shares one) with err.
func resolveAll(ops []Op, err error) {
	for i := range ops {
		ops[i].Resolve(err, 0, 0)
	}
}

// ControlWRs is the room a connection with a shared receive queue keeps
// in its send queue beyond the send depth, for the two WRs of its own
// that no operation waits for: the beacon (posted once, at the end:
// sq.beacon) and one credit WRITE (one at a time: cw.writing). So
// neither ever waits for room, and operations never wait for them.
const ControlWRs = 2

// doorbellLocked hands wrs to the QP as one chain: the one place a
// connection posts send WRs. Caller holds postMu.
func (q *SendQueue) doorbellLocked(wrs []verbs.SendWR) (int, error) {
	q.st.doorbells.Add(1)
	return q.qp.PostSend(wrs)
}

// TakeCovered takes the send WRs a completion of id covers off the sent
// ring, and finishes the unsignaled ones before it: a send queue
// completes in order, so they completed successfully, or they would
// have produced a completion of their own. It returns how many WRs the
// completion covers, its own included. It runs on a poller.
func (q *SendQueue) TakeCovered(id uint64) int {
	q.sentMu.Lock()
	k := 1
	for q.sent.len() > 0 {
		x := q.sent.popFront()
		if x == id {
			break
		}
		var ok bool
		if q.covered, ok = q.ops.Take(x); ok {
			q.owner.Finish(&q.covered, nil) // a field's address: a local's would escape to the heap (Finish is an interface's)
			k++
		}
		q.covered = Op{}
	}
	q.sentMu.Unlock()
	return k
}

// SubmitChain posts a chain (a Batch) as one: what was left in the
// combining queue first, as it was issued first, then the chain, now or
// queued behind what waits for room. On error nothing of the chain is
// posted or queued and the ops' buffers are dropped.
func (q *SendQueue) SubmitChain(wrs []verbs.SendWR, ops []Op) error {
	q.postMu.Lock()
	q.postCombinedLocked()
	err := q.submitLocked(wrs, ops)
	q.postUnlock()
	return err
}

// roomLocked reports whether wrs fit the send queue and the credits,
// and asks the peer for credits when they are what is short. Caller
// holds postMu.
func (q *SendQueue) roomLocked(wrs []verbs.SendWR) bool { return q.roomAfterLocked(wrs, 0, 0) }

// roomAfterLocked is roomLocked after room WRs and credits credits more
// are taken: those of a chain being put together. Caller holds postMu.
func (q *SendQueue) roomAfterLocked(wrs []verbs.SendWR, room, credits int) bool {
	if q.sqFree-room < len(wrs) || q.held {
		return false
	}
	need := credits + NeedCredits(wrs)
	if q.credits >= need {
		return true
	}
	if q.pullLocked(); q.credits >= need {
		return true
	}
	if !q.asked && q.inBand {
		q.asked, q.askNow = true, true // postUnlock queues the ask
	}
	return false
}

// stampLatency marks every LatencySample-th op the connection submits
// with its start time (Op.Start); the others cost the counter check.
// Caller holds postMu.
func (q *SendQueue) stampLatency(ops []Op) {
	for i := range ops {
		q.latencySeq++
		if q.latencySeq%LatencySample == 0 {
			ops[i].Start = Nanotime()
		}
	}
}

// ring is a fixed-size FIFO of wr_ids; it never allocates after newRing.
type ring struct {
	buf        []uint64
	head, size int
}

func newRing(n int) ring { return ring{buf: make([]uint64, n)} }

func (r *ring) len() int { return r.size }

func (r *ring) push(id uint64) {
	if r.size == len(r.buf) {
		// Credits bound the WRs in flight by the ring's size, so this
		// means a bug, not load.
		panic("rdma: send ring overflow")
	}
	r.buf[(r.head+r.size)%len(r.buf)] = id
	r.size++
}

func (r *ring) popFront() uint64 {
	id := r.buf[r.head]
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return id
}

func (r *ring) popBack() uint64 {
	r.size--
	return r.buf[(r.head+r.size)%len(r.buf)]
}

// PostCredit posts a WRITE of the credits given so far into the peer's
// credit word (the caller started it, CreditWord.StartWrite; its
// completion ends it, Grants.CreditWritten), in its room beyond the send depth. It never waits for
// postMu: it runs under the shared receive queue's lock and the receive
// side's, so when postMu is taken it leaves the WRITE to the holder, as
// Submit leaves an operation, and postUnlock posts it.
func (q *SendQueue) PostCredit() {
	q.creditDue.Store(true)
	if q.postMu.TryLock() {
		q.postUnlock()
	}
}

// postCreditLocked posts the credit WRITE left by PostCredit. Caller
// holds postMu.
func (q *SendQueue) postCreditLocked() {
	if !q.creditDue.Swap(false) {
		return
	}
	// inflight first: teardown, which waits for it, then cannot free the
	// credit buffer under us.
	q.life.AddInflight()
	if q.life.Err() != nil || q.cw == nil || q.cw.mr == nil {
		q.life.OpDone() // the connection is failing: nothing is taken any more
		return
	}
	id := q.ops.Add(Op{Kind: OpCredit})
	q.st.creditWrites.Add(1)
	if n, _ := q.doorbellLocked(q.cw.request(id, q.inline, q.peer)); n == 0 {
		// The QP is closing or failed; its teardown ends the rest.
		if _, ok := q.ops.Take(id); ok {
			q.life.OpDone()
		}
	}
}

// PostBeacon posts the beacon, a WR whose flush comes after the
// completion of every message that arrived before the QP moved to the
// error state (see the receive side), once, in its room beyond the send
// depth. It reports false when the provider refused it: nothing is left
// to wait for then.
func (q *SendQueue) PostBeacon() bool {
	q.postMu.Lock()
	if q.beacon {
		q.unlockPost()
		return true
	}
	q.beacon = true
	q.life.AddInflight()
	id := q.ops.Add(Op{Kind: OpBeacon})
	_, err := q.doorbellLocked([]verbs.SendWR{{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled}})
	q.unlockPost()
	if err != nil {
		// Nothing to wait for (the QP is closed, or the provider
		// refuses): what came is all there is.
		if _, ok := q.ops.Take(id); ok {
			q.life.OpDone()
		}
		return false
	}
	return true
}
