package rc

import (
	"sync"

	"github.com/go-rdma/rdma/internal/pool"
)

// OpKind says what a work request was for, so its completion is
// dispatched to the right place.
type OpKind uint8

const (
	OpSend OpKind = iota + 1
	OpWrite
	OpRead
	OpAtomic
	OpRecv
	OpBeacon // marks the end of a failed QP's completions (postBeacon)
	OpCredit // a WRITE of the credits given into the peer's credit word (SendQueue.PostCredit)
)

// Op is the Go-side record of one posted work request. The wr_id of the
// WR is its index in the table plus a generation, never a pointer.
type Op struct {
	Kind OpKind
	// Signaled WRs resolve their future on completion; unsignaled ones
	// (inside a batch) only on failure, or when a later completion
	// covers them. covered ones (unsignaled in a combined chain) resolve
	// their own future when a later completion covers them.
	Signaled bool
	Covered  bool
	Gen      uint32       // Fut's reuse count when issued (Resolve)
	Fut      Resolver     // the operation's Future; nil for receives
	Buf      *pool.Buffer // holds a reference until the completion
	Off      int          // where in buf (atomics read their old value here)
	N        int          // bytes moved
	// Start is when a sampled op was issued (nanotime), zero for the
	// others (LatencySample). With signaled beside kind, it costs the
	// record no size.
	Start int64
}

type slot struct {
	Op
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

// OpTable maps wr_ids to the ops of one connection: no lock is shared
// with other connections on the post or completion path. Whoever takes
// an op first, the completion handler or the connection's teardown, owns
// it; the other finds nothing.
type OpTable struct {
	base   uint64 // the connection's slot and slot generation, in place
	mu     sync.Mutex
	chunks [][]slot
	head   uint32 // first free index + 1; 0 when the free list is empty
	n      uint32 // slots made so far
}

// Init makes the table of the connection in the engine's slot base.
func (t *OpTable) Init(base uint64) { t.base = base }

func (t *OpTable) at(idx uint32) *slot { return &t.chunks[idx/opChunk][idx%opChunk] }

// Add records o and returns its wr_id. A connection has at most its
// send and receive depths of ops (each at most 16,384) recorded at once,
// far below maxOps.
func (t *OpTable) Add(o Op) uint64 {
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
	s.Op = o
	s.gen = (s.gen + 1) & opGenMask
	s.next = 0
	id := t.base | uint64(s.gen)<<opIndexBits | uint64(idx)
	t.mu.Unlock()
	return id
}

// Take removes the op of wrID and returns it; ok is false when the id is
// stale, unknown or already taken.
func (t *OpTable) Take(wrID uint64) (o Op, ok bool) {
	idx, gen := uint32(wrID)&(maxOps-1), uint32(wrID)>>opIndexBits
	t.mu.Lock()
	if idx < t.n {
		s := t.at(idx)
		if s.gen == gen && s.Kind != 0 {
			o, ok = s.Op, true
			s.Op = Op{}
			s.next = t.head
			t.head = idx + 1
		}
	}
	t.mu.Unlock()
	return o, ok
}

// IDs lists the wr_ids of the live ops.
func (t *OpTable) IDs() []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []uint64
	for i := uint32(0); i < t.n; i++ {
		if s := t.at(i); s.Kind != 0 {
			ids = append(ids, t.base|uint64(s.gen)<<opIndexBits|uint64(i))
		}
	}
	return ids
}

// Resolver is the Future of an operation (rdma's): the completion of
// the operation's WR resolves it with its error, the bytes moved and an
// atomic's old value, unless the Future was released and reused since
// the operation was issued (gen is its reuse count then).
type Resolver interface {
	ResolveOp(gen uint32, err error, n int, old uint64)
}

// Resolve resolves o's Future. An op can be resolved twice (a failed
// chain's futures resolve at once, and again as its WRs flush): the
// Future takes the first, and never one meant for its previous
// operation.
func (o *Op) Resolve(err error, n int, old uint64) { o.Fut.ResolveOp(o.Gen, err, n, old) }

// DropBuf gives back o's hold on its buffer: an atomic's result buffer
// is o's own, any other is the caller's, referenced until completion.
func (o *Op) DropBuf() {
	if o.Kind == OpAtomic {
		o.Buf.Release()
	} else {
		o.Buf.Unref()
	}
}
