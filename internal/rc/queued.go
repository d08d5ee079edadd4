package rc

import (
	"fmt"
	"slices"
	"sync"

	"github.com/go-rdma/rdma/internal/pool"
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
	seq  uint64
	wrs  []verbs.SendWR
	sges []verbs.SGE
	ops  []Op
	// A coalescing chain (coalesceLocked) holds the inline bytes of its
	// WRs in stage, one slot of the inline size each, until it is
	// posted; at is completed when it began.
	coal  bool
	at    uint64
	stage *pool.Buffer
}

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
	if q.stage != nil {
		q.stage.Release()
	}
	q.coal, q.at, q.stage = false, 0, nil
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
	copy(cp.Held(0, n), o.bytesAt(*sge))
	cp.Ref() // the op's reference, and no owner's: DropBuf's Unref gives it back
	cp.Release()
	o.Buf.Unref()
	o.Buf, o.Off = cp, 0
	*sge = verbs.SGE{Addr: cp.Addr(), Length: uint32(n), LKey: cp.LKey()}
	return nil
}

// bytesAt is the memory of o's buffer that sge names.
func (o *Op) bytesAt(sge verbs.SGE) []byte {
	return o.Buf.Held(int(sge.Addr-o.Buf.Addr()), int(sge.Length))
}

// drainChain is drainWithLocked's chain, kept for the next drain:
// draining allocates nothing in a steady state.
type drainChain struct {
	wrs []verbs.SendWR
	ops []Op
	qps []*queuedPost
}

// drainLocked posts the queued chains that fit, oldest first, as one
// chain; a coalescing one only once fewer than coalesceAfter WRs are in
// flight. Caller holds postMu.
func (q *SendQueue) drainLocked() { _, _ = q.drainWithLocked(nil, nil, false) }

// drainWithLocked posts the queued chains that fit, oldest first, and
// then wrs (when not nil, all queued went, and it fits too), as one
// chain: one doorbell for all. A coalescing chain goes when flush is
// set, or when fewer than coalesceAfter WRs are in flight; in it one WR
// in signalEvery is signaled, and the last of the whole chain. It
// reports whether wrs went (if not, nothing of it is taken), and the
// error of a failed post of a chain with wrs in it, which the caller
// gives wrs' ops, as submitLocked's. Caller holds postMu.
func (q *SendQueue) drainWithLocked(wrs []verbs.SendWR, ops []Op, flush bool) (took bool, err error) {
	d := &q.drain
	room, need := 0, 0 // the room and credits of the chains taken so far
	for q.pending.Len() > 0 {
		head := q.pending.Items()[0]
		if head.coal && !flush && q.depth-q.sqFree >= coalesceAfter {
			break // the next operation, or completion, posts it
		}
		if !q.roomAfterLocked(head.wrs, room, need) {
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
		room += len(qp.wrs)
		need += NeedCredits(qp.wrs)
		d.wrs = append(d.wrs, qp.wrs...)
		d.ops = append(d.ops, qp.ops...)
		d.qps = append(d.qps, qp)
	}
	queued := len(d.wrs)
	if wrs != nil && q.pending.Len() == 0 && q.roomAfterLocked(wrs, room, need) {
		took = true
		q.stampLatency(ops)
		d.wrs = append(d.wrs, wrs...)
		d.ops = append(d.ops, ops...)
	}
	if len(d.wrs) > 0 {
		last, j := len(d.wrs)-1, 0
		for _, qp := range d.qps {
			if qp.coal {
				signalSparsely(d.wrs, d.ops, j, j+len(qp.wrs), last)
			}
			j += len(qp.wrs)
		}
		if err = q.postLocked(d.wrs, d.ops); err != nil {
			// The connection fails (postLocked): the WRs the provider
			// took flush, and the Futures of the queued chains resolve
			// with err; wrs' are the caller's, with err.
			resolveAll(d.ops[:queued], err)
		}
		for _, qp := range d.qps {
			qp.free() // after the post: d.wrs' SGLs are the chains' SGEs, and inline bytes are copied at the post
		}
		clear(d.wrs)
		clear(d.ops)
		clear(d.qps)
		d.wrs, d.ops, d.qps = d.wrs[:0], d.ops[:0], d.qps[:0]
	}
	q.notifyLocked()
	if !took {
		err = nil
	}
	return took, err
}
