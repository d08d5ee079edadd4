package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma"
)

type receiver struct {
	out      string // file to write; "" verifies only
	window   int64
	log      io.Writer
	progress func(label string, total int64) *progress
}

func (r *receiver) logf(format string, a ...any) {
	fmt.Fprintf(r.log, "datamover recv: "+format+"\n", a...)
}

// run receives one transfer on ln.
func (r *receiver) run(ctx context.Context, ln *rdma.Listener) (err error) {
	conn, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	ln.Close() // one transfer per run
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	p := &peer{conn: conn}
	var (
		mem       *rdma.Buffer
		consumed  chan error
		part      *os.File
		completed bool
	)
	defer func() {
		if err != nil && parent.Err() == nil && !errors.Is(err, errMismatch) {
			p.abort(err)
		}
		cancel(err)
		if consumed != nil {
			<-consumed // the consumer goroutine has ended
		}
		if mem != nil {
			mem.Release()
		}
		p.close()
		if part != nil {
			part.Close()
			if !completed {
				os.Remove(part.Name())
			}
		}
	}()

	m, err := p.expect(ctx, msgStart, startLen)
	if err != nil {
		return fmt.Errorf("waiting for the sender: %w", err)
	}
	size, chunk, sum := int64(binary.BigEndian.Uint64(m[1:])), int64(binary.BigEndian.Uint32(m[9:])), checksum(m[13])
	h := sum.new()
	if h == nil {
		return fmt.Errorf("protocol: unknown checksum %d", m[13])
	}
	if chunk < 1 || chunk > 1<<30 || size < 0 || size > 1<<50 || (size+chunk-1)/chunk > 1<<32-1 {
		return fmt.Errorf("protocol: %d bytes in chunks of %d", size, chunk)
	}
	l := planLayout(size, chunk, r.window)
	if r.out != "" {
		if part, err = os.Create(r.out + ".part"); err != nil {
			return err
		}
	}

	// The destination: exactly this memory, writable by the peer, for
	// this transfer only (closing the connection revokes it).
	if mem, err = conn.Alloc(int(int64(l.slots) * l.slotSize)); err != nil {
		return fmt.Errorf("destination region: %w", err)
	}
	region, err := conn.Expose(mem, rdma.RemoteWrite)
	if err != nil {
		return err
	}
	if err := p.send(ctx, readyMsg(l.slots, l.slotSize, region)); err != nil {
		return err
	}
	dest := "(verify only)"
	if part != nil {
		dest = r.out
	}
	r.logf("receiving %s from %s into %s: %d chunks of %s, %d window(s) in %d slot(s) of %s",
		human(size), conn.RemoteAddr(), dest, l.chunks(), human(chunk), l.windows(), l.slots, human(l.slotSize))

	// The consumer hashes and persists the data in order as it arrives,
	// and frees each window's slot with an ack once it is through. It
	// runs beside the receive loop, so notifications keep being taken
	// meanwhile.
	var arrived, acked atomic.Int64 // chunks arrived in order; windows consumed
	wake := make(chan struct{}, 1)
	consumed = make(chan error, 1)
	go func() {
		err := r.consume(ctx, p, l, mem, part, h, &arrived, wake, &acked)
		if err != nil {
			cancel(err)
		}
		consumed <- err
	}()

	bar := r.progress("recv", size)
	start := time.Now()
	err = r.collect(ctx, p, l, &arrived, wake, &acked, bar)
	bar.stop()
	if err != nil {
		return err
	}
	m, err = p.expect(ctx, msgDone, doneLen)
	if err != nil {
		return fmt.Errorf("waiting for the checksum: %w", err)
	}
	if err := <-consumed; err != nil {
		return err
	}
	consumed = nil
	elapsed := time.Since(start)
	if got := int64(binary.BigEndian.Uint32(m[1:])); got != l.chunks() {
		return fmt.Errorf("protocol: the sender counts %d chunks, we %d", got, l.chunks())
	}
	var ours [sha256.Size]byte
	h.Sum(ours[:0])
	ok := bytes.Equal(ours[:], m[5:])
	sn := sum.size()
	// The verdict is the last message: the sender closes once it has it,
	// and that close can flush our send before its acknowledgement
	// arrives although the verdict was delivered. Our own result stands
	// either way; the sender reports its own.
	if err := p.send(ctx, verdictMsg(ok, ours)); err != nil && !errors.Is(err, rdma.ErrFlushed) && !errors.Is(err, rdma.ErrRetryExceeded) {
		r.logf("the verdict may not have reached the sender: %v", err)
	}
	if !ok {
		r.logf("received %s in %v: checksum MISMATCH: ours %s %x, the sender's %x", human(size), elapsed.Round(time.Millisecond), sum, ours[:sn], m[5:5+sn])
		return errMismatch
	}
	if part != nil {
		if err := part.Close(); err != nil {
			return err
		}
		if err := os.Rename(part.Name(), r.out); err != nil {
			return err
		}
		part = nil
	}
	completed = true
	saved := "not written (no -o)"
	if r.out != "" {
		saved = "wrote " + r.out
	}
	r.logf("received %s in %v at %s: checksum OK, %s %x; %s", human(size), elapsed.Round(time.Millisecond), rate(size, elapsed), sum, ours[:sn], saved)
	// Let the sender close first, once it has our verdict.
	p.awaitClose(parent)
	return nil
}

// collect counts the WRITE_WITH_IMM notifications until every chunk has
// arrived. arrived tells the consumer how many chunks, from the first,
// have all arrived; wake tells it that arrived grew.
func (r *receiver) collect(ctx context.Context, p *peer, l layout, arrived *atomic.Int64, wake chan<- struct{}, acked *atomic.Int64, bar *progress) error {
	type slot struct {
		window int    // the window this slot is collecting
		seen   []bool // which of its chunks arrived
	}
	slots := make([]slot, l.slots)
	for i := range slots {
		slots[i] = slot{window: i, seen: make([]bool, l.perWindow())}
	}
	next := int64(0) // chunks [0, next) have arrived
	for got := int64(0); got < l.chunks(); got++ {
		nt, err := p.recv(ctx)
		if err != nil {
			if c := context.Cause(ctx); c != nil {
				return c
			}
			return fmt.Errorf("after %d of %d chunks: %w", got, l.chunks(), err)
		}
		if !nt.write {
			return fmt.Errorf("protocol: message %q before all chunks arrived (%d of %d)", nt.msg[0], got, l.chunks())
		}
		i := int64(nt.imm)
		if i >= l.chunks() {
			return fmt.Errorf("protocol: chunk %d of %d", i, l.chunks())
		}
		w, _, _, n := l.chunkAt(i)
		// The sender may write window w only after we consumed window
		// w-slots: anything else would have overwritten unread data.
		if int64(w) >= acked.Load()+int64(l.slots) {
			return fmt.Errorf("protocol: chunk %d of window %d arrived with %d windows consumed", i, w, acked.Load())
		}
		s := &slots[w%l.slots]
		if i < next || s.window != w || s.seen[i%l.perWindow()] {
			return fmt.Errorf("protocol: chunk %d arrived twice", i)
		}
		if int64(nt.n) != n {
			return fmt.Errorf("protocol: chunk %d has %d bytes, want %d", i, nt.n, n)
		}
		s.seen[i%l.perWindow()] = true
		bar.add(n)
		// Advance over every chunk now present; a window done with frees
		// its bookkeeping for the window that will reuse the slot.
		for next < l.chunks() {
			w, _, _, _ := l.chunkAt(next)
			s := &slots[w%l.slots]
			k := next % l.perWindow()
			if s.window != w || !s.seen[k] {
				break
			}
			next++
			if k == l.chunksIn(w)-1 {
				clear(s.seen)
				s.window = w + l.slots
			}
		}
		arrived.Store(next)
		select {
		case wake <- struct{}{}:
		default: // the consumer has a wake-up pending
		}
	}
	return nil
}

// consume hashes and persists the data in order, as far as it has
// arrived, and acks each window it is through with, so the sender can
// reuse its slot.
func (r *receiver) consume(ctx context.Context, p *peer, l layout, mem *rdma.Buffer, part *os.File, h hash.Hash, arrived *atomic.Int64, wake <-chan struct{}, acked *atomic.Int64) error {
	done := int64(0) // chunks consumed
	for done < l.chunks() {
		for upto := arrived.Load(); done < upto; {
			w, off, at, _ := l.chunkAt(done)
			// The rest of window w that has arrived is contiguous in
			// its slot.
			winEnd := int64(w+1) * l.perWindow()
			end := min(upto, winEnd)
			n := min(end*l.chunk, l.size) - off
			// A piece at a time, so that the write finds in the cache
			// what the hash has just read.
			for data := mem.Bytes()[at : at+n]; len(data) > 0; {
				k := min(len(data), consumePiece)
				h.Write(data[:k])
				if part != nil {
					if _, err := part.Write(data[:k]); err != nil {
						return err
					}
				}
				data = data[k:]
			}
			done = end
			if done == winEnd || done == l.chunks() {
				acked.Add(1)
				if err := p.send(ctx, ackMsg(w)); err != nil {
					return fmt.Errorf("ack for window %d: %w", w, err)
				}
			}
		}
		if done == l.chunks() {
			break
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// consumePiece is how much of the arrived data the consumer hashes and
// writes at a time.
const consumePiece = 256 << 10
