package rdma

import (
	"sync"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// opKind says what a work request was for, so its completion is
// dispatched to the right place.
type opKind uint8

const (
	opSend opKind = iota + 1
	opWrite
	opRead
	opAtomic
	opRecv
	opBeacon // marks the end of a failed QP's completions (postBeacon)
	opCredit // a WRITE of the credits given into the peer's credit word (postCredit)
)

// op is the Go-side record of one posted work request. The wr_id of the
// WR is its index in the table plus a generation, never a pointer.
type op struct {
	kind opKind
	// signaled WRs resolve their future on completion; unsignaled ones
	// (inside a batch) only on failure, or when a later completion
	// covers them. covered ones (unsignaled in a combined chain) resolve
	// their own future when a later completion covers them.
	signaled bool
	covered  bool
	gen      uint32 // fut's reuse count when issued (resolveOp)
	conn     *conn
	fut      *Future      // nil for receives
	buf      *pool.Buffer // holds a reference until the completion
	off      int          // where in buf (atomics read their old value here)
	n        int          // bytes moved
	// start is when a sampled op was issued (nanotime), zero for the
	// others (LatencySample). With signaled beside kind, it costs the
	// record no size.
	start int64
}

type slot struct {
	op
	gen  uint32
	next uint32 // next free index + 1, while on the free list
}

// A wr_id names its connection and its op, never a pointer: the
// connection's slot in its engine and the slot's generation (engine.Slot),
// then the op's index in the connection's table and its generation.
//
//	63        40 39     32 31      20 19        0
//	[   slot   ][slot gen][ op gen  ][  op index ]
const (
	opIndexBits = 20
	opGenMask   = 1<<12 - 1
	maxOps      = 1 << opIndexBits
)

// opChunk is the size of one block of a table; blocks never move.
const opChunk = 64

// opTable maps wr_ids to the ops of one connection: no lock is shared
// with other connections on the post or completion path. Whoever takes
// an op first, the completion handler or the connection's teardown, owns
// it; the other finds nothing.
type opTable struct {
	base   uint64 // the connection's slot and slot generation, in place
	mu     sync.Mutex
	chunks [][]slot
	head   uint32 // first free index + 1; 0 when the free list is empty
	n      uint32 // slots made so far
}

// init makes the table of the connection in the engine's slot base.
func (t *opTable) init(base uint64) { t.base = base }

func (t *opTable) at(idx uint32) *slot { return &t.chunks[idx/opChunk][idx%opChunk] }

// add records o and returns its wr_id. A connection has at most its
// send and receive depths of ops (each at most 16,384) recorded at once,
// far below maxOps.
func (t *opTable) add(o op) uint64 {
	t.mu.Lock()
	var idx uint32
	if t.head != 0 {
		idx = t.head - 1
		t.head = t.at(idx).next
	} else {
		idx = t.n
		if idx%opChunk == 0 {
			t.chunks = append(t.chunks, make([]slot, opChunk))
		}
		t.n++
	}
	s := t.at(idx)
	s.op = o
	s.gen = (s.gen + 1) & opGenMask
	s.next = 0
	id := t.base | uint64(s.gen)<<opIndexBits | uint64(idx)
	t.mu.Unlock()
	return id
}

// take removes the op of wrID and returns it; ok is false when the id is
// stale, unknown or already taken.
func (t *opTable) take(wrID uint64) (o op, ok bool) {
	idx, gen := uint32(wrID)&(maxOps-1), uint32(wrID)>>opIndexBits
	t.mu.Lock()
	if idx < t.n {
		s := t.at(idx)
		if s.gen == gen && s.kind != 0 {
			o, ok = s.op, true
			s.op = op{}
			s.next = t.head
			t.head = idx + 1
		}
	}
	t.mu.Unlock()
	return o, ok
}

// ids lists the wr_ids of the live ops.
func (t *opTable) ids() []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []uint64
	for i := uint32(0); i < t.n; i++ {
		if s := t.at(i); s.kind != 0 {
			ids = append(ids, t.base|uint64(s.gen)<<opIndexBits|uint64(i))
		}
	}
	return ids
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

// onCompletion hands the completion of a WR of the connection to what
// posted it, once: the op table gives each wr_id's op to the first who
// takes it, the completion or the teardown (resolveLeft). It runs on a
// poller.
func (c *conn) onCompletion(wc *verbs.WorkCompletion) {
	o, ok := c.ops.take(wc.WRID)
	if !ok || c.holdForVerdict(&o, nil, wc) {
		return
	}
	c.complete(&o, wc)
}

// opDone counts a finished WR and wakes Close when it was the last.
func (c *conn) opDone() {
	if c.inflight.Add(-1) == 0 && c.closing.Load() {
		c.drainOnce.Do(func() { close(c.drained) })
	}
}

// complete hands the completion of o to what posted it. It runs on a
// poller.
func (c *conn) complete(o *op, wc *verbs.WorkCompletion) {
	switch o.kind {
	case opRecv:
		c.onRecv(o.buf, wc)
	case opBeacon:
		c.onBeacon(wc)
		c.opDone()
	case opCredit:
		c.onCreditWritten(wc)
	default:
		c.onSendDone(o, wc)
	}
}

// resolveLeft resolves the operations still in the table, for which no
// completion will come: each once (take), a receive's buffer back to the
// pool, every other operation failed with the connection's error.
func (c *conn) resolveLeft() {
	for _, id := range c.ops.ids() {
		if o, ok := c.ops.take(id); ok {
			switch o.kind {
			case opBeacon, opCredit:
			case opRecv:
				o.buf.Release()
			default:
				o.resolveOp(c.closedErr(), 0, 0)
				c.dropBuf(&o)
			}
			c.opDone()
		}
	}
}
