package rdma

import (
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/internal/pool"
)

// Buffer is registered memory from a connection's buffer pool. Its bytes
// live off the Go heap. Release gives it back; the memory returns to the
// pool only when no operation uses it any more, so releasing a buffer
// that is still being sent or written is safe.
//
// A Buffer handle is not reused: after Release every method fails or
// returns zero, even when the pool has handed the memory to someone else.
// The one exception is the Buffer of a received message whose Future was
// released too (Future.Release): it goes with the future to a later
// receive.
//
// Release is required. As with an os.File, a Buffer that becomes
// unreachable without Release is released by the garbage collector some
// time later, so that a lost handle does not keep its pool, PD and device
// open for ever; this is a safety net, not a way to manage memory. Keep
// the handle (not only the slice Bytes returns) until you Release it:
// once the handle is collected the memory may be handed to someone else.
type Buffer struct {
	p       atomic.Pointer[pool.Buffer]
	cleanup runtime.Cleanup // the safety net; stopped by Release
	// cell, in the handle of a reused future's receive, is that
	// future's safety net (Future.Release): own sets it and Release
	// clears it, and no cleanup is armed per message.
	cell *atomic.Pointer[pool.Buffer]
}

func newBuffer(pb *pool.Buffer) *Buffer {
	b := &Buffer{}
	b.own(pb)
	return b
}

// own makes b the owner of pb and arms the safety net. The cleanup's
// argument is pb, never b: b must be able to become unreachable.
func (b *Buffer) own(pb *pool.Buffer) {
	b.p.Store(pb)
	leak.Track(pb, 1)
	if b.cell != nil {
		b.cell.Store(pb)
		return
	}
	b.cleanup = runtime.AddCleanup(b, collected, pb)
}

// collected is the safety net of a Buffer that became unreachable without
// Release. The handle still owned pb: Release stops the cleanup before it
// gives pb back, so pb cannot be another handle's memory by now.
func collected(pb *pool.Buffer) {
	leak.Collected(pb)
	_ = pb.Release()
}

// Bytes is the buffer's memory, Len bytes long; nil after Release.
func (b *Buffer) Bytes() []byte {
	if pb := b.pb(); pb != nil {
		return pb.Bytes()
	}
	return nil
}

// Len is the buffer's length: what Alloc asked for, what a receive
// delivered, or what SetLen set.
func (b *Buffer) Len() int { return b.pb().Len() }

// Cap is how far SetLen may grow the buffer.
func (b *Buffer) Cap() int { return b.pb().Cap() }

// SetLen changes the length, up to Cap.
func (b *Buffer) SetLen(n int) error {
	pb := b.pb()
	if pb == nil {
		return fmt.Errorf("rdma: buffer: %w", pool.ErrReleased)
	}
	return pb.SetLen(n)
}

// Release gives the buffer back. Operations still using it keep the
// memory until their completions arrive. A second Release returns an
// error and does nothing.
func (b *Buffer) Release() error {
	if b == nil {
		return fmt.Errorf("rdma: release of a nil buffer: %w", ErrInvalid)
	}
	pb := b.p.Swap(nil)
	if pb == nil {
		return fmt.Errorf("rdma: buffer: %w", pool.ErrReleased)
	}
	// Disarm the safety net before pb can go to another handle. b is
	// reachable across Stop (KeepAlive), so the cleanup is not queued.
	if b.cell != nil {
		b.cell.Store(nil)
	} else {
		b.cleanup.Stop()
	}
	runtime.KeepAlive(b)
	leak.Forget(pb)
	return pb.Release()
}

func (b *Buffer) pb() *pool.Buffer {
	if b == nil {
		return nil
	}
	return b.p.Load()
}

// Slice names n bytes of the buffer at offset off, for an operation that
// should use only part of it.
func (b *Buffer) Slice(off, n int) (Slice, error) {
	pb := b.pb()
	if pb == nil {
		return Slice{}, fmt.Errorf("rdma: buffer: %w", pool.ErrReleased)
	}
	if off < 0 || n < 0 || off > pb.Len() || n > pb.Len()-off {
		return Slice{}, fmt.Errorf("rdma: slice [%d:+%d] of a %d-byte buffer: %w", off, n, pb.Len(), ErrInvalid)
	}
	return Slice{buf: b, off: off, n: n}, nil
}

// Slice is a sub-range of a Buffer.
type Slice struct {
	buf    *Buffer
	off, n int
}

// Bytes is the slice's memory.
func (s Slice) Bytes() []byte {
	if bb := s.buf.Bytes(); bb != nil && s.off+s.n <= len(bb) {
		return bb[s.off : s.off+s.n]
	}
	return nil
}

// Len is the slice's length.
func (s Slice) Len() int { return s.n }

// Both kinds of local memory are a Local.
var (
	_ Local = (*Buffer)(nil)
	_ Local = Slice{}
)

// Local is memory an operation reads or writes on this side: a *Buffer
// (all of it) or a Slice.
type Local interface {
	span() (pb *pool.Buffer, off, n int, err error)
}

func (b *Buffer) span() (*pool.Buffer, int, int, error) {
	pb := b.pb()
	if pb == nil {
		if b == nil {
			return nil, 0, 0, fmt.Errorf("rdma: nil buffer: %w", ErrInvalid)
		}
		return nil, 0, 0, fmt.Errorf("rdma: buffer: %w", pool.ErrReleased)
	}
	return pb, 0, pb.Len(), nil
}

func (s Slice) span() (*pool.Buffer, int, int, error) {
	pb, _, n, err := s.buf.span()
	if err != nil {
		return nil, 0, 0, err
	}
	if s.off+s.n > n {
		return nil, 0, 0, fmt.Errorf("rdma: slice [%d:+%d] past the buffer's %d bytes: %w", s.off, s.n, n, ErrInvalid)
	}
	return pb, s.off, s.n, nil
}
