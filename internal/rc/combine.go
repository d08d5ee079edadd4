package rc

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Doorbell combining and selective signaling.
//
// Posting takes postMu (it orders the send queue and the sent ring). A
// goroutine that finds it taken does not wait for it: it leaves its
// operation in the connection's combining queue and returns its Future,
// and the goroutine that holds postMu posts what was left there before
// it lets go, as one chain: one doorbell (one provider call, one system
// call on a kernel device) for the operations of many goroutines.
//
// In such a chain only the last WR, and every signalEvery-th, is
// signaled; the completion of a signaled WR resolves the Futures of the
// unsignaled ones before it, in order (TakeCovered), as a Batch's is. The
// last of a chain is always signaled, so the send queue never ends in an
// unsignaled WR and a lone operation completes as promptly as before. A
// failed completion fails the connection, and the WRs it covers flush
// with its reason.
//
// Whoever unlocks postMu looks at the queue after unlocking
// (unlockPost): an operation left while the lock was held is posted by
// the holder or, if the holder had passed its look, by the unlocker's
// second look, so none is stranded.

// signalEvery is how many WRs of a combined chain go at most without a
// signaled one, so that completions return send-queue room in steps.
const signalEvery = 16

// signalSparsely leaves the WRs wrs[from:to] unsignaled but every
// signalEvery-th of them and the chain's last (index last): their ops
// resolve when a later completion covers them (TakeCovered).
func signalSparsely(wrs []verbs.SendWR, ops []Op, from, to, last int) {
	for i := from; i < to; i++ {
		if i != last && (i-from+1)%signalEvery != 0 {
			wrs[i].Flags &^= verbs.SendSignaled
			ops[i].Signaled, ops[i].Covered = false, true
		}
	}
}

// postReq is an operation left in the combining queue: its WR, its SGE
// and its op (its Future and buffer reference are taken).
type postReq struct {
	wr  verbs.SendWR
	sge verbs.SGE
	op  Op
}

// combineQueue is a connection's combining queue.
type combineQueue struct {
	mu    sync.Mutex
	q     []postReq
	spare []postReq
	n     atomic.Int32 // len(q), read without mu
	wrs   []verbs.SendWR
	sges  []verbs.SGE
	ops   []Op
}

// leave puts an operation in the queue.
func (cq *combineQueue) leave(r postReq) {
	cq.mu.Lock()
	cq.q = append(cq.q, r)
	cq.n.Add(1)
	cq.mu.Unlock()
}

// takeAll empties the queue; the caller gives the slice back with
// giveBack once it is done with it.
func (cq *combineQueue) takeAll() []postReq {
	cq.mu.Lock()
	q := cq.q
	cq.q, cq.spare = cq.spare[:0], nil
	cq.n.Store(0)
	cq.mu.Unlock()
	return q
}

func (cq *combineQueue) giveBack(q []postReq) {
	clear(q)
	cq.mu.Lock()
	if cq.spare == nil {
		cq.spare = q[:0]
	}
	cq.mu.Unlock()
}

// postCombinedLocked posts what the combining queue holds, in order: as
// one chain as far as the send queue and the credits have room, then
// each on its own through submitLocked (which queues it for room).
// Caller holds postMu.
func (q *SendQueue) postCombinedLocked() {
	reqs := q.cq.takeAll()
	if len(reqs) == 0 {
		q.cq.giveBack(reqs)
		return
	}
	cq := &q.cq
	if cap(cq.wrs) < len(reqs) {
		cq.wrs, cq.sges, cq.ops = make([]verbs.SendWR, 0, len(reqs)), make([]verbs.SGE, 0, len(reqs)), make([]Op, 0, len(reqs))
	}
	wrs, sges, ops := cq.wrs[:0], cq.sges[:0], cq.ops[:0]
	q.flushCoalescedLocked() // it was issued first
	q.pullLocked()
	credits := q.credits
	i := 0
	for ; i < len(reqs) && q.pending.Len() == 0 && !q.held; i++ {
		r := &reqs[i]
		wr1, op1 := unsafe.Slice(&r.wr, 1), unsafe.Slice(&r.op, 1)
		if err := q.postable(wr1, op1, false); err != nil {
			r.op.DropBuf()
			r.op.Resolve(err, 0, 0)
			continue
		}
		need := NeedCredits(wr1)
		if len(wrs) == q.sqFree || need > credits {
			break // the rest go on their own, and queue for room
		}
		credits -= need
		wrs, sges, ops = append(wrs, r.wr), append(sges, r.sge), append(ops, r.op)
	}
	if len(wrs) > 0 {
		for j := range wrs {
			wrs[j].SGL = sges[j : j+1]
			if ops[j].N == 0 {
				wrs[j].SGL = nil
			}
		}
		signalSparsely(wrs, ops, 0, len(wrs), len(wrs)-1)
		q.stampLatency(ops)
		if err := q.postLocked(wrs, ops); err != nil {
			// The connection fails (postLocked): the WRs the provider
			// took flush, and the Futures of all resolve with err.
			resolveAll(ops, err)
		}
		clear(ops)
	}
	for ; i < len(reqs); i++ {
		r := &reqs[i]
		r.wr.SGL = unsafe.Slice(&r.sge, 1)
		if r.op.N == 0 {
			r.wr.SGL = nil
		}
		if err := q.submitLocked(unsafe.Slice(&r.wr, 1), unsafe.Slice(&r.op, 1)); err != nil {
			r.op.Resolve(err, 0, 0)
		}
	}
	q.cq.giveBack(reqs)
}
