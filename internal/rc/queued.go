package rc

import (
	"fmt"
	"slices"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// What a post made later keeps. A chain that waits for room or credits
// keeps copies of its WRs, SGEs and ops, since its caller reuses its own;
// an inline operation posted later, by the holder of postMu or once there
// is room, keeps a copy of its bytes, since its caller may change them as
// soon as its call returns.

// queuedPost is a chain waiting for room, with copies of its WRs, SGEs
// and ops (the caller reuses its own). Drained ones go back to
// queuedPool, their arrays with them: queuing allocates nothing in a
// steady state, and the garbage collector may free what load left.
type queuedPost struct {
	seq   uint64
	waits waitKind // what it waits for, in the counters
	wrs   []verbs.SendWR
	sges  []verbs.SGE
	ops   []Op
}

// waitKind is what a queued chain waits for, as SendCounts counts it.
type waitKind uint8

const (
	waitCompletion waitKind = iota // coalescing: the next completion's doorbell
	waitRoom
	waitCredits
)

var queuedPool = sync.Pool{New: func() any { return new(queuedPost) }}

// newQueued copies the chain wrs, ops into a queuedPost.
func newQueued(wrs []verbs.SendWR, ops []Op) *queuedPost {
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
	q.waits = waitCompletion
	queuedPool.Put(q)
}

// stageInline copies the bytes of an inline operation into a buffer of
// its own from the same pool and makes sge and o name the copy: its WR
// is posted later (by the holder of postMu, or once there is room), and
// the caller may change its bytes as soon as its call returns, as it may
// after an inline post. o gives up its reference on the caller's buffer
// and holds the copy's until its completion, as any op holds its buffer.
// It fails, changing nothing, when the pool has no buffer to give.
func stageInline(sge *verbs.SGE, o *Op) error {
	n := int(sge.Length) // not o.N: a Batch's last op reports the whole batch's bytes
	cp, err := o.Buf.Pool().Get(n)
	if err != nil {
		return fmt.Errorf("copy %d inline bytes: %w", n, err)
	}
	copy(cp.Held(0, n), o.Buf.Held(int(sge.Addr-o.Buf.Addr()), n))
	cp.Ref() // the op's reference, and no owner's: DropBuf's Unref gives it back
	cp.Release()
	o.Buf.Unref()
	o.Buf, o.Off = cp, 0
	*sge = verbs.SGE{Addr: cp.Addr(), Length: uint32(n), LKey: cp.LKey()}
	return nil
}

// Coalescing. A goroutine that issues operations one by one, each a
// Future, rings one doorbell per operation (on rxe a system call per
// WR), where a C peer posts lists of them; operations only combine into
// one chain when goroutines contend for postMu. So while the send queue
// has coalesceAfter WRs or more posted and not completed, an inline
// operation (a copy of at most the inline size) does not ring: it joins
// the chains waiting for room, and the next completion, which is
// certain to come with that many in flight, posts everything waiting as
// one chain (drainLocked). A lone operation, and a ping-pong's few in
// flight, still go out at once. The delay it adds is bounded by the
// completion of WRs ahead of it on the same send queue, which completes
// in order: the operation could not have completed before them anyway.

// coalesceAfter is how many WRs posted and not completed make an inline
// operation wait for the next completion's doorbell.
const coalesceAfter = 8

// coalesceLocked reports whether the one-WR chain wrs, which has room,
// should wait for the next completion's doorbell. Caller holds postMu.
func (q *SendQueue) coalesceLocked(wrs []verbs.SendWR) bool {
	return len(wrs) == 1 && wrs[0].Flags&verbs.SendInline != 0 && q.depth-q.sqFree >= coalesceAfter
}

// drainChain is drainLocked's chain, kept for the next drain: draining
// allocates nothing in a steady state.
type drainChain struct {
	wrs []verbs.SendWR
	ops []Op
	qps []*queuedPost
}

// drainLocked posts the queued chains that fit, oldest first, as one
// chain: one doorbell for all. In it, an inline operation queued alone
// goes unsignaled unless it is the last or every signalEvery-th, and a
// later completion covers it (TakeCovered), as in a combined chain.
// Caller holds postMu.
func (q *SendQueue) drainLocked() {
	d := &q.drain
	took, need := 0, 0 // the room and credits of the chains taken so far
	for q.pending.Len() > 0 {
		// roomLocked looks at what is left after the chains taken.
		q.sqFree -= took
		q.credits -= need
		fits := q.roomLocked(q.pending.Items()[0].wrs)
		q.sqFree += took
		q.credits += need
		if !fits {
			break
		}
		qp := q.pending.Pop()
		q.pendingWRs -= len(qp.wrs)
		q.drainedSeq = qp.seq
		if err := q.postable(qp.wrs, qp.ops, true); err != nil {
			dropAll(qp.ops)
			resolveAll(qp.ops, err)
			qp.free()
			continue
		}
		took += len(qp.wrs)
		need += NeedCredits(qp.wrs)
		d.wrs = append(d.wrs, qp.wrs...)
		d.ops = append(d.ops, qp.ops...)
		d.qps = append(d.qps, qp)
	}
	if len(d.wrs) > 0 {
		last, j := len(d.wrs)-1, 0
		for _, qp := range d.qps {
			if len(qp.wrs) == 1 && d.wrs[j].Flags&verbs.SendInline != 0 && j != last && (j+1)%signalEvery != 0 {
				d.wrs[j].Flags &^= verbs.SendSignaled
				d.ops[j].Signaled, d.ops[j].Covered = false, true
			}
			j += len(qp.wrs)
		}
		if err := q.postLocked(d.wrs, d.ops); err != nil {
			// The connection fails (postLocked): the WRs the provider
			// took flush, and the Futures of all resolve with err.
			resolveAll(d.ops, err)
		}
		for _, qp := range d.qps {
			qp.free() // after the post: d.wrs' SGLs are the chains' SGEs
		}
		clear(d.wrs)
		clear(d.ops)
		clear(d.qps)
		d.wrs, d.ops, d.qps = d.wrs[:0], d.ops[:0], d.qps[:0]
	}
	q.notifyLocked()
}
