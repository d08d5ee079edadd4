package pool

import (
	"fmt"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

const (
	// ownedBit is set in Buffer.state while the owner's reference is
	// held; the low 32 bits count the operations' references.
	ownedBit = 1 << 32
	refMask  = ownedBit - 1
)

// Buffer is registered memory from a Pool. Its memory lives off the Go
// heap and is registered with local write access under LKey, so it can be
// named by local SGEs: a send source, a receive target, or the target of
// a READ or an atomic.
//
// A Buffer is freed when its last reference is dropped: the owner's
// (Release) and each operation's (Ref, then Unref). See the package
// documentation. Do not use a *Buffer after Release.
type Buffer struct {
	state atomic.Uint64 // ownedBit | operation references
	n     int           // length, <= len(mem)
	dirty int           // mem[dirty:] is all zero; see Pool.Get
	stale bool          // from GetReceive, not Filled yet: mem[:dirty] may hold earlier owners' bytes, mem[:n] the device's
	mem   []byte        // the whole chunk, off-heap
	addr  uint64
	lkey  uint32
	slab  *slab
	class *class // nil for a large buffer
	pool  *Pool
	next  *Buffer // free-list link
}

// Bytes returns the buffer's memory, Len bytes long. It is the off-heap
// memory itself (mapped by internal/mem), so a sub-slice of it may be
// registered separately, for example to expose it to a peer. After
// Release it returns nil.
func (b *Buffer) Bytes() []byte {
	if !b.Live() {
		return nil
	}
	return b.mem[:b.n:b.n]
}

// Held returns the n bytes at off of the buffer's memory, for the
// holder of an operation's reference (Ref), which keeps the memory the
// buffer's even once its owner has released it (when Bytes is nil).
func (b *Buffer) Held(off, n int) []byte { return b.mem[off : off+n : off+n] }

// Len is the length asked of Get, or set by SetLen.
func (b *Buffer) Len() int {
	if b == nil {
		return 0
	}
	return b.n
}

// Cap is the size of the memory behind the buffer: its size class, or
// the page-rounded size of a large buffer. Len can grow up to it.
func (b *Buffer) Cap() int {
	if b == nil {
		return 0
	}
	return len(b.mem)
}

// SetLen changes Len to n, 0 <= n <= Cap. Bytes past the old Len read
// as zero: no earlier owner's data shows through a grown buffer. It must
// not race with other uses of b.
func (b *Buffer) SetLen(n int) error {
	if !b.Live() {
		return ErrReleased
	}
	if n < 0 || n > len(b.mem) {
		return fmt.Errorf("pool: SetLen(%d): %w: out of range [0, %d]", n, verbs.ErrInvalid, len(b.mem))
	}
	b.n = n
	b.dirty = max(b.dirty, n)
	return nil
}

// Filled sets Len to n, the byte count of a completed receive: the
// device wrote the first n bytes, and nothing else wrote the buffer since
// Get or GetReceive. A buffer from GetReceive has the bytes of earlier
// owners past n cleared now; one from Get is zero there already. Either
// way the next Get clears only n bytes instead of the whole receive
// buffer. It must not race with other uses of b.
func (b *Buffer) Filled(n int) error {
	if !b.Live() {
		return ErrReleased
	}
	if n < 0 || n > len(b.mem) {
		return fmt.Errorf("pool: Filled(%d): %w: out of range [0, %d]", n, verbs.ErrInvalid, len(b.mem))
	}
	if b.stale {
		if b.dirty > n {
			clear(b.mem[n:b.dirty])
		}
		b.stale = false
	}
	b.n, b.dirty = n, n
	return nil
}

// Addr is the virtual address of the first byte, as an SGE names it.
func (b *Buffer) Addr() uint64 {
	if b == nil {
		return 0
	}
	return b.addr
}

// LKey is the local key of the registration that covers the buffer.
func (b *Buffer) LKey() uint32 {
	if b == nil {
		return 0
	}
	return b.lkey
}

// Pool is the pool the buffer came from, so that a caller can refuse
// buffers of another pool (another PD).
func (b *Buffer) Pool() *Pool {
	if b == nil {
		return nil
	}
	return b.pool
}

// Live reports whether the owner still holds the buffer: it has not been
// released. Only a live buffer may be used for a new operation; Ref
// checks this atomically.
func (b *Buffer) Live() bool {
	return b != nil && b.state.Load()&ownedBit != 0
}

// Ref takes a reference for an operation, before the operation is
// posted. It fails with ErrReleased if the owner has released the
// buffer, so a released buffer cannot be posted. Each successful Ref
// must be matched by one Unref.
func (b *Buffer) Ref() error {
	if b == nil {
		return fmt.Errorf("pool: %w: nil Buffer", verbs.ErrInvalid)
	}
	for {
		s := b.state.Load()
		if s&ownedBit == 0 {
			return ErrReleased
		}
		if s&refMask == refMask {
			return fmt.Errorf("pool: %w: too many references to one buffer", verbs.ErrInvalid)
		}
		if b.state.CompareAndSwap(s, s+1) {
			return nil
		}
	}
}

// Unref drops a reference taken by Ref, when a signaled completion
// covers the operation or its post failed. If it was the last reference
// (the owner has released the buffer), the buffer goes back to the pool.
// Unref without a matching Ref returns an error and changes nothing.
//
// Returning a buffer is a lock and a push, except in two cases where the
// goroutine that drops the last reference also deregisters and unmaps
// memory: a large buffer that does not fit the large-buffer cache, and
// the last buffer of a slab after Close.
func (b *Buffer) Unref() error {
	if b == nil {
		return fmt.Errorf("pool: %w: nil Buffer", verbs.ErrInvalid)
	}
	for {
		s := b.state.Load()
		if s&refMask == 0 {
			return fmt.Errorf("pool: Unref: %w: buffer has no operation reference", verbs.ErrInvalid)
		}
		if b.state.CompareAndSwap(s, s-1) {
			if s-1 == 0 {
				b.pool.put(b)
			}
			return nil
		}
	}
}

// Release drops the owner's reference. The buffer goes back to the pool
// now, or when the last operation using it calls Unref. Releasing again
// returns ErrReleased and does nothing else.
func (b *Buffer) Release() error {
	if b == nil {
		return fmt.Errorf("pool: %w: nil Buffer", verbs.ErrInvalid)
	}
	for {
		s := b.state.Load()
		if s&ownedBit == 0 {
			return ErrReleased
		}
		if b.state.CompareAndSwap(s, s&^ownedBit) {
			if s&^ownedBit == 0 {
				b.pool.put(b)
			}
			return nil
		}
	}
}

// Span returns the whole buffer as a Span.
func (b *Buffer) Span() Span { return Span{buf: b, n: b.Len()} }

// Slice names the n bytes at off, for an operation on part of the buffer.
// The range must lie inside Len and n must be positive; otherwise, or
// after Release, it returns an error.
func (b *Buffer) Slice(off, n int) (Span, error) {
	if !b.Live() {
		if b == nil {
			return Span{}, fmt.Errorf("pool: Slice: %w: nil Buffer", verbs.ErrInvalid)
		}
		return Span{}, ErrReleased
	}
	if err := checkRange(off, n, b.n); err != nil {
		return Span{}, err
	}
	return Span{buf: b, off: off, n: n}, nil
}

func checkRange(off, n, length int) error {
	if off < 0 || n <= 0 || off > length || n > length-off {
		return fmt.Errorf("pool: Slice(%d, %d): %w: range outside the %d-byte buffer or empty", off, n, verbs.ErrInvalid, length)
	}
	return nil
}

// Span is a range of a Buffer. It is a value and allocates nothing. A
// Span does not hold a reference: take one on Buffer() for an
// operation.
type Span struct {
	buf    *Buffer
	off, n int
}

// Buffer is the buffer the span lies in.
func (s Span) Buffer() *Buffer { return s.buf }

// Offset is the span's start inside the buffer.
func (s Span) Offset() int { return s.off }

// Len is the span's length.
func (s Span) Len() int { return s.n }

// Addr is the virtual address of the span's first byte.
func (s Span) Addr() uint64 {
	if s.buf == nil {
		return 0
	}
	return s.buf.addr + uint64(s.off)
}

// LKey is the local key of the registration that covers the span.
func (s Span) LKey() uint32 { return s.buf.LKey() }

// Bytes is the span's memory, or nil after the buffer's Release.
func (s Span) Bytes() []byte {
	if !s.buf.Live() {
		return nil
	}
	return s.buf.mem[s.off : s.off+s.n : s.off+s.n]
}

// Slice names the n bytes at off inside the span.
func (s Span) Slice(off, n int) (Span, error) {
	if !s.buf.Live() {
		if s.buf == nil {
			return Span{}, fmt.Errorf("pool: Slice: %w: zero Span", verbs.ErrInvalid)
		}
		return Span{}, ErrReleased
	}
	if err := checkRange(off, n, s.n); err != nil {
		return Span{}, err
	}
	return Span{buf: s.buf, off: s.off + off, n: n}, nil
}
