package engine

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// A wr_id names its endpoint, never a pointer: the endpoint's slot in
// its engine and the slot's generation in the top 32 bits (Slot.Base);
// the endpoint numbers its WRs in the low 32 (internal/rc's op table).
// SRQ receives set bit 63 (srq.go); slots stay below 2^20.
//
//	63        40 39     32 31                 0
//	[   slot   ][slot gen][  the endpoint's   ]

// Slot is an endpoint's place in its engine's table.
type Slot struct {
	idx uint32
	gen uint8
}

// Base is the top 32 bits of the wr_ids of the slot's endpoint.
func (s Slot) Base() uint64 { return uint64(s.idx)<<40 | uint64(s.gen)<<32 }

// slots maps the slot part of a wr_id to its endpoint, for the
// completion path, without a lock: the slot's chunk and entry are atomic
// pointers, written only when an endpoint comes or goes. A slot's
// generation changes at every reuse, so a completion a closed endpoint
// left in a CQ never reaches the endpoint that took its slot next.
type slots struct {
	mu     sync.Mutex
	chunks [slotChunks]atomic.Pointer[[slotChunk]atomic.Pointer[slotEntry]]
	gens   []uint8  // each slot's generation; under mu
	free   []uint32 // slots free for reuse; under mu
}

type slotEntry struct {
	ep  Endpoint
	gen uint8
}

const (
	slotChunk  = 1024
	slotChunks = 1 << 20 / slotChunk // a million endpoints an engine
)

var errTooManyEndpoints = fmt.Errorf("rdma: %w: an engine holds at most %d connections", verbs.ErrInvalid, slotChunks*slotChunk)

// add gives ep a slot.
func (t *slots) add(ep Endpoint) (Slot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s uint32
	if k := len(t.free); k > 0 {
		s = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		s = uint32(len(t.gens))
		if s == slotChunks*slotChunk {
			return Slot{}, errTooManyEndpoints
		}
		t.gens = append(t.gens, 0)
		if s%slotChunk == 0 {
			t.chunks[s/slotChunk].Store(new([slotChunk]atomic.Pointer[slotEntry]))
		}
	}
	t.gens[s]++
	sl := Slot{idx: s, gen: t.gens[s]}
	t.chunks[s/slotChunk].Load()[s%slotChunk].Store(&slotEntry{ep: ep, gen: sl.gen})
	return sl, nil
}

// remove frees slot s. Completions for it found after it are dropped.
func (t *slots) remove(s Slot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := &t.chunks[s.idx/slotChunk].Load()[s.idx%slotChunk]
	if cur := e.Load(); cur == nil || cur.gen != s.gen {
		return // removed already
	}
	e.Store(nil)
	t.free = append(t.free, s.idx)
}

// get returns the endpoint wrID belongs to, or nil when it has gone.
func (t *slots) get(wrID uint64) Endpoint {
	s, gen := uint32(wrID>>40), uint8(wrID>>32)
	chunk := t.chunks[(s/slotChunk)%slotChunks].Load()
	if chunk == nil {
		return nil
	}
	if e := chunk[s%slotChunk].Load(); e != nil && e.gen == gen {
		return e.ep
	}
	return nil
}

// all lists the endpoints that have a slot.
func (t *slots) all() []Endpoint {
	t.mu.Lock()
	n := len(t.gens)
	t.mu.Unlock()
	var eps []Endpoint
	for s := 0; s < n; s++ {
		if chunk := t.chunks[s/slotChunk].Load(); chunk != nil {
			if e := chunk[s%slotChunk].Load(); e != nil {
				eps = append(eps, e.ep)
			}
		}
	}
	return eps
}
