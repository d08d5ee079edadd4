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
	seq  uint64
	wrs  []verbs.SendWR
	sges []verbs.SGE
	ops  []Op
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
