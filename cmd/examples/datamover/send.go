package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/go-rdma/rdma"
)

type sender struct {
	src      source
	sum      checksum
	chunk    int
	jobs     int
	log      io.Writer
	progress func(label string, total int64) *progress
}

func (s *sender) logf(format string, a ...any) {
	fmt.Fprintf(s.log, "datamover send: "+format+"\n", a...)
}

func (s *sender) run(ctx context.Context, addr string, opts []rdma.Option) (err error) {
	size := s.src.Size()
	if (size+int64(s.chunk)-1)/int64(s.chunk) > math.MaxUint32 {
		return fmt.Errorf("%d bytes in %d-byte chunks: more chunks than a 32-bit immediate can number", size, s.chunk)
	}
	// The first error of any worker cancels the rest.
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	conn, err := rdma.Dial(ctx, "rdma", addr, opts...)
	if err != nil {
		return err
	}
	p := &peer{conn: conn}
	var (
		sum  chan hashResult   // the sender's checksum, computed alongside
		free chan *rdma.Buffer // one registered buffer per worker
	)
	defer func() {
		if err != nil && parent.Err() == nil && !errors.Is(err, errMismatch) {
			p.abort(err) // tell the receiver why, if it can still hear it
		}
		cancel(err)
		if sum != nil {
			<-sum
		}
		if free != nil {
			close(free)
			for b := range free {
				b.Release() // safe even if a write still uses it
			}
		}
		p.close()
	}()

	sum = make(chan hashResult, 1)
	go func() { sum <- hashSource(ctx, s.src, s.sum) }()

	if err := p.send(ctx, startMsg(size, s.chunk, s.sum)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	m, err := p.expect(ctx, msgReady, readyLen)
	if err != nil {
		return fmt.Errorf("waiting for the receiver: %w", err)
	}
	l := layout{size: size, chunk: int64(s.chunk), slots: int(binary.BigEndian.Uint32(m[1:])), slotSize: int64(binary.BigEndian.Uint64(m[5:]))}
	var region rdma.RemoteRegion
	if err := region.UnmarshalBinary(m[13:]); err != nil {
		return err
	}
	if err := l.check(region); err != nil {
		return err
	}
	s.logf("sending %s (%s) to %s over %s: %d chunks of %s, %d workers, %d window(s) of up to %s in %d slot(s)",
		s.src.Name(), human(size), conn.RemoteAddr(), conn.Provider(), l.chunks(), human(l.chunk), s.jobs, l.windows(), human(l.slotSize), l.slots)

	// A worker takes a buffer, fills it, writes it and puts it back.
	free = make(chan *rdma.Buffer, s.jobs)
	for range s.jobs {
		b, err := conn.Alloc(s.chunk)
		if err != nil {
			return err
		}
		free <- b
	}
	// At most s.jobs workers at once: a worker takes a place in workers
	// and gives it back when its chunk is written.
	workers := make(chan struct{}, s.jobs)

	bar := s.progress("send", size)
	start := time.Now()
	var wg sync.WaitGroup
	// stop ends the transfer early: the workers stop, the bar too.
	stop := func(err error) error {
		cancel(err)
		wg.Wait()
		bar.stop()
		return context.Cause(ctx)
	}
	acked := 0
	nextChunk := int64(0)
	for w := 0; w < l.windows() && ctx.Err() == nil; w++ {
		// Window w goes into the slot of window w-slots: wait until the
		// receiver has consumed that one.
		for ; acked <= w-l.slots; acked++ {
			if err := s.awaitAck(ctx, p, acked); err != nil {
				return stop(err)
			}
		}
		for ; nextChunk < l.chunks(); nextChunk++ {
			cw, off, at, n := l.chunkAt(nextChunk)
			if cw != w {
				break
			}
			dst, err := region.Slice(int(at), int(n))
			if err != nil {
				cancel(err)
				break
			}
			idx := uint32(nextChunk)
			workers <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-workers; wg.Done() }()
				if err := s.writeChunk(ctx, conn, free, idx, off, int(n), dst); err != nil {
					cancel(err)
					return
				}
				bar.add(n)
			}()
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return stop(nil)
	}
	written := time.Since(start)
	// Every chunk is in the receiver's memory; wait until it has consumed
	// every window, then compare checksums.
	for ; acked < l.windows(); acked++ {
		if err := s.awaitAck(ctx, p, acked); err != nil {
			return stop(err)
		}
	}
	bar.stop()
	h := <-sum
	sum <- h // for the deferred receive
	if h.err != nil {
		return fmt.Errorf("checksum of %s: %w", s.src.Name(), h.err)
	}
	if err := p.send(ctx, doneMsg(l.chunks(), h.sum)); err != nil {
		return fmt.Errorf("sending the checksum: %w", err)
	}
	m, err = p.expect(ctx, msgVerdict, verdictLen)
	if err != nil {
		return fmt.Errorf("waiting for the verdict: %w", err)
	}
	total := time.Since(start)
	if m[1] != 1 {
		return fmt.Errorf("%w: the receiver got %s %x, we sent %x", errMismatch, s.sum, m[2:2+s.sum.size()], h.sum[:s.sum.size()])
	}
	s.logf("sent %s in %v at %s, the writes in %v at %s; the receiver verified %s %x",
		human(size), total.Round(time.Millisecond), rate(size, total), written.Round(time.Millisecond), rate(size, written), s.sum, h.sum[:s.sum.size()])
	// The receiver waits for us to close, so that its verdict reached us.
	return nil
}

// writeChunk sends one chunk with WRITE_WITH_IMM, the immediate being the
// chunk index.
func (s *sender) writeChunk(ctx context.Context, conn *rdma.Conn, free chan *rdma.Buffer, idx uint32, off int64, n int, dst rdma.RemoteRegion) error {
	var buf *rdma.Buffer
	select {
	case buf = <-free:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { free <- buf }()
	if ctx.Err() != nil {
		// The buffer may still be in use by a write whose wait was cut
		// short; the transfer is over anyway.
		return context.Cause(ctx)
	}
	if _, err := s.src.ReadAt(buf.Bytes()[:n], off); err != nil && !(errors.Is(err, io.EOF) && off+int64(n) == s.src.Size()) {
		return fmt.Errorf("reading %s at %d: %w", s.src.Name(), off, err)
	}
	part, err := buf.Slice(0, n)
	if err != nil {
		return err
	}
	if err := conn.WriteWithImm(part, dst, idx).Wait(ctx); err != nil {
		return fmt.Errorf("chunk %d: %w", idx, err)
	}
	return nil
}

// awaitAck waits for the receiver to say it consumed window w.
func (s *sender) awaitAck(ctx context.Context, p *peer, w int) error {
	m, err := p.expect(ctx, msgAck, 5)
	if err != nil {
		if c := context.Cause(ctx); c != nil {
			return c
		}
		return fmt.Errorf("waiting for window %d to be consumed: %w", w, err)
	}
	if got := int(binary.BigEndian.Uint32(m[1:])); got != w {
		return fmt.Errorf("protocol: window %d consumed, expected %d", got, w)
	}
	return nil
}

type hashResult struct {
	sum [sha256.Size]byte
	err error
}

// hashSource computes the checksum of src, stopping when ctx ends.
func hashSource(ctx context.Context, src source, sum checksum) hashResult {
	h := sum.new()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < src.Size(); {
		if err := ctx.Err(); err != nil {
			return hashResult{err: err}
		}
		n := int(min(int64(len(buf)), src.Size()-off))
		if _, err := src.ReadAt(buf[:n], off); err != nil && !(errors.Is(err, io.EOF) && off+int64(n) == src.Size()) {
			return hashResult{err: err}
		}
		h.Write(buf[:n])
		off += int64(n)
	}
	var r hashResult
	h.Sum(r.sum[:0])
	return r
}
