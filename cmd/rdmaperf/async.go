package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/poller"
)

// asyncSide is one end of the async path: an rdma.Conn, a buffer of two
// halves like the raw path's, and the peer's exposed region.
type asyncSide struct {
	p       *params
	c       *rdma.Conn
	buf     *rdma.Buffer
	half    int
	region  rdma.RemoteRegion // the peer's whole buffer
	pending *rdma.Future      // server: the receive waited for across rounds
}

func asyncOptions(p *params) []rdma.Option {
	mode := poller.Busy
	switch p.pollMode {
	case "adaptive":
		mode = poller.Adaptive
	case "event":
		mode = poller.Event
	}
	rq := 64
	if p.test == "send_bw" {
		rq = max(2, min(p.rxDepth, (256<<20)/max(p.maxSize(), 64)))
	}
	opts := []rdma.Option{rdma.WithProvider(p.provider), rdma.WithPollMode(mode), rdma.WithPollerThreadLock(p.locked),
		rdma.WithMaxMessage(max(p.maxSize(), 64)), rdma.WithQueueDepth(max(p.txDepth, 16), rq)}
	if p.device != "" {
		opts = append(opts, rdma.WithDevice(p.device))
	}
	return opts
}

func setupAsync(ctx context.Context, p *params, o *oob) (s *asyncSide, err error) {
	s = &asyncSide{p: p}
	addr := net.JoinHostPort(p.host, strconv.Itoa(p.port+1))
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if p.host == "" {
		ln, err := rdma.Listen("rdma", addr, asyncOptions(p)...)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if err := o.barrier(1); err != nil { // listening
			return nil, err
		}
		if s.c, err = ln.Accept(ctx); err != nil {
			return nil, err
		}
	} else {
		if err := o.barrier(1); err != nil {
			return nil, err
		}
		if s.c, err = rdma.Dial(ctx, "rdma", addr, asyncOptions(p)...); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.half = (p.maxSize() + 63) &^ 63
	if s.buf, err = s.c.Alloc(2 * s.half); err != nil {
		return nil, err
	}
	r, err := s.c.Expose(s.buf, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- s.c.SendRegion(ctx, r) }()
	if s.region, err = s.c.RecvRegion(ctx); err != nil {
		return nil, err
	}
	if err = <-errc; err != nil {
		return nil, err
	}
	return s, nil
}

func (s *asyncSide) close() {
	if s.pending != nil {
		if s.pending.Resolved() {
			if b := s.pending.Buffer(); b != nil {
				b.Release()
			}
		}
	}
	if s.c != nil {
		s.c.Close()
	}
	if s.buf != nil {
		s.buf.Release()
	}
}

func runAsync(ctx context.Context, p *params) ([]result, error) {
	o, err := oobConnect(ctx, p)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	s, err := setupAsync(ctx, p, o)
	if err != nil {
		return nil, err
	}
	defer s.close()
	header(p.stdout, p, s.c.Provider(), s.c.Device())
	var results []result
	for step, size := range p.sizes() {
		if err := o.barrier(uint64(step)<<32 | uint64(size)); err != nil {
			return nil, err
		}
		var r result
		var err error
		if p.host == "" {
			r, err = s.serve(ctx, o, size)
		} else {
			r, err = s.client(ctx, o, size)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %d B: %w", p.test, size, err)
		}
		r.Provider, r.Device = s.c.Provider(), s.c.Device()
		if p.host != "" || p.test == "send_bw" {
			row(p.stdout, p, r)
			results = append(results, r)
		}
	}
	fmt.Fprintln(p.stdout, rule)
	return results, nil
}

func (s *asyncSide) src(size int) rdma.Local {
	sl, _ := s.buf.Slice(0, size)
	return sl
}

func (s *asyncSide) dst(size int) rdma.RemoteRegion {
	r, _ := s.region.Slice(s.half, size)
	return r
}

// client runs the bandwidth window: tx depth operations in flight, as
// futures, or as batches of -l operations when -l > 1.
func (s *asyncSide) client(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.clientLat(ctx, o, size)
	}
	src, dst := s.src(size), s.dst(size)
	atom, _ := s.region.Slice(s.half, 8)
	per := p.postList
	window := make([]*rdma.Future, max(1, p.txDepth/per))
	batches := make([]*rdma.Batch, len(window))
	for i := range batches {
		batches[i] = s.c.NewBatch()
	}
	post := func(slot, k int) *rdma.Future {
		if per == 1 {
			switch p.test {
			case "write_bw":
				return s.c.Write(src, dst)
			case "read_bw":
				return s.c.Read(src, dst)
			case "atomic_bw":
				return s.c.FetchAdd(atom, 1)
			}
			return s.c.Send(src)
		}
		b := batches[slot]
		for j := 0; j < k; j++ {
			switch p.test {
			case "write_bw":
				b.Write(src, dst)
			case "read_bw":
				b.Read(src, dst)
			default:
				b.Send(src)
			}
		}
		return b.Post()
	}
	if p.test == "atomic_bw" && per > 1 {
		return result{}, errors.New("-l: the async API has no batched atomics")
	}
	wctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	m := newBWMeter(p.iters, p.txDepth, p.duration)
	target := p.iters
	if p.duration > 0 {
		target = 1 << 62
	}
	counts := make([]int, len(window))
	posted, done := 0, 0
	start := time.Now()
	m.begin(start)
	deadline := start.Add(p.duration)
	for i := 0; ; i++ {
		slot := i % len(window)
		if f := window[slot]; f != nil {
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
			window[slot] = nil
			done += counts[slot]
			m.progress(time.Now(), done)
		}
		if p.duration > 0 && target == 1<<62 && time.Now().After(deadline) {
			target = posted
		}
		if posted < target {
			k := min(per, target-posted)
			window[slot] = post(slot, k)
			counts[slot] = k
			posted += k
		} else if done == posted {
			break
		}
	}
	end := time.Now()
	if err := o.send(uint64(done)); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return m.result(p, size, done, end), nil
}

func (s *asyncSide) recvFuture() *rdma.Future {
	if s.pending == nil {
		s.pending = s.c.Recv()
	}
	return s.pending
}

// takeRecv finishes the pending receive.
func (s *asyncSide) takeRecv() error {
	f := s.pending
	s.pending = nil
	if err := f.Err(); err != nil {
		return err
	}
	if b := f.Buffer(); b != nil {
		b.Release()
	}
	return nil
}

func (s *asyncSide) serve(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.serveLat(ctx, o, size)
	}
	st := o.watchStop()
	if p.test != "send_bw" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	m := newBWMeter(p.iters, p.txDepth, p.duration)
	recvd := 0
	for {
		if c, ok := st.stopped(); ok && recvd >= c {
			break
		}
		f := s.recvFuture()
		select {
		case <-f.Done():
			if err := s.takeRecv(); err != nil {
				return result{}, err
			}
			now := time.Now()
			if recvd == 0 {
				m.begin(now)
			}
			recvd++
			m.progress(now, recvd)
		case <-st.done:
			if e := st.wait(); e != nil {
				return result{}, e
			}
			// the count has arrived: take what is left
			c, _ := st.stopped()
			for recvd < c {
				if err := s.recvFuture().Wait(ctx); err != nil {
					return result{}, err
				}
				if err := s.takeRecv(); err != nil {
					return result{}, err
				}
				recvd++
			}
		}
	}
	end := time.Now()
	if recvd == 0 {
		return result{Test: p.test, API: p.api, Bytes: size}, o.send(0)
	}
	return m.result(p, size, recvd, end), o.send(0)
}

func (s *asyncSide) pollByte(off int) byte {
	b := s.buf.Bytes()
	w := (*uint32)(unsafe.Pointer(&b[off&^3]))
	return byte(atomic.LoadUint32(w) >> (8 * (off & 3)))
}

func (s *asyncSide) clientLat(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	wctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	src, dst := s.src(size), s.dst(size)
	rsrc, _ := s.region.Slice(0, size)
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	start := time.Now()
	deadline := start.Add(p.duration)
	mine := s.buf.Bytes()
	poll := s.half + size - 1
	for i := 0; ; i++ {
		if p.duration > 0 {
			if i > 0 && time.Now().After(deadline) {
				break
			}
		} else if i == p.iters {
			break
		}
		seq := byte(i%251 + 1)
		mine[size-1] = seq
		t0 := cycles()
		switch p.test {
		case "read_lat":
			if err := s.c.Read(src, rsrc).Wait(wctx); err != nil {
				return result{}, err
			}
		case "send_lat":
			f := s.c.Send(src)
			if err := s.recvFuture().Wait(wctx); err != nil {
				return result{}, err
			}
			if err := s.takeRecv(); err != nil {
				return result{}, err
			}
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
		default: // write_lat: the answer is detected in memory
			f := s.c.Write(src, dst)
			for k := 0; s.pollByte(poll) != seq; k++ {
				if k&1023 == 1023 && wctx.Err() != nil {
					return result{}, fmt.Errorf("no answer: %w", wctx.Err())
				}
			}
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
		}
		d := float64(cycles()-t0) * ns
		if p.test != "read_lat" {
			d /= 2
		}
		samples = append(samples, d)
	}
	if err := o.send(uint64(len(samples))); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return latResult(p, size, samples), nil
}

func (s *asyncSide) serveLat(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	st := o.watchStop()
	if p.test == "read_lat" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	src, dst := s.src(size), s.dst(size)
	mine := s.buf.Bytes()
	poll := s.half + size - 1
	var last *rdma.Future
	answered := 0
	for i := 0; ; i++ {
		seq := byte(i%251 + 1)
		if p.test == "send_lat" {
			f := s.recvFuture()
			select {
			case <-f.Done():
				if err := s.takeRecv(); err != nil {
					return result{}, err
				}
			case <-st.done:
				if c, _ := st.stopped(); answered >= c {
					goto finished
				}
				if err := f.Wait(ctx); err != nil {
					return result{}, err
				}
				if err := s.takeRecv(); err != nil {
					return result{}, err
				}
			}
		} else {
			for k := 0; s.pollByte(poll) != seq; k++ {
				if k&255 == 255 {
					if c, ok := st.stopped(); ok && answered >= c {
						goto finished
					}
				}
			}
		}
		if last != nil {
			if err := last.Wait(ctx); err != nil {
				return result{}, err
			}
		}
		mine[size-1] = seq
		if p.test == "send_lat" {
			last = s.c.Send(src)
		} else {
			last = s.c.Write(src, dst)
		}
		answered++
	}
finished:
	if err := st.wait(); err != nil {
		return result{}, err
	}
	if last != nil {
		if err := last.Wait(ctx); err != nil {
			return result{}, err
		}
	}
	return result{}, o.send(0)
}
