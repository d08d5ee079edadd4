package rdma

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// slots maps the slot part of a wr_id (ops.go) to its connection, for the
// completion path, without a lock: the slot's chunk and entry are atomic
// pointers, written only when a connection comes or goes. A slot's
// generation changes at every reuse, so a completion a closed
// connection left in a CQ never reaches the connection that took its
// slot next.
type slots struct {
	mu     sync.Mutex
	chunks [slotChunks]atomic.Pointer[[slotChunk]atomic.Pointer[Conn]]
	gens   []uint8  // each slot's generation; under mu
	free   []uint32 // slots free for reuse; under mu
}

const (
	slotChunk  = 1024
	slotChunks = 1 << 20 / slotChunk // a million connections an engine
)

var errTooManyConns = fmt.Errorf("rdma: %w: an engine holds at most %d connections", ErrInvalid, slotChunks*slotChunk)

// add gives c a slot and sets the base of its op table's wr_ids.
func (t *slots) add(c *Conn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s uint32
	if k := len(t.free); k > 0 {
		s = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		s = uint32(len(t.gens))
		if s == slotChunks*slotChunk {
			return errTooManyConns
		}
		t.gens = append(t.gens, 0)
		if s%slotChunk == 0 {
			t.chunks[s/slotChunk].Store(new([slotChunk]atomic.Pointer[Conn]))
		}
	}
	t.gens[s]++
	c.slot, c.slotGen = s, t.gens[s]
	c.ops.base = uint64(s)<<40 | uint64(c.slotGen)<<32
	t.chunks[s/slotChunk].Load()[s%slotChunk].Store(c)
	return nil
}

// remove frees c's slot. Completions for c found after it are dropped.
func (t *slots) remove(c *Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.chunks[c.slot/slotChunk].Load()[c.slot%slotChunk].Store(nil)
	t.free = append(t.free, c.slot)
}

// conn returns the connection wrID belongs to, or nil when it has gone.
func (t *slots) conn(wrID uint64) *Conn {
	s, gen := uint32(wrID>>40), uint8(wrID>>32)
	chunk := t.chunks[s/slotChunk].Load()
	if chunk == nil {
		return nil
	}
	if c := chunk[s%slotChunk].Load(); c != nil && c.slotGen == gen {
		return c
	}
	return nil
}

// all lists the open connections, for Stats.
func (t *slots) all() []*Conn {
	t.mu.Lock()
	n := len(t.gens)
	t.mu.Unlock()
	var cs []*Conn
	for s := 0; s < n; s++ {
		if chunk := t.chunks[s/slotChunk].Load(); chunk != nil {
			if c := chunk[s%slotChunk].Load(); c != nil {
				cs = append(cs, c)
			}
		}
	}
	return cs
}
