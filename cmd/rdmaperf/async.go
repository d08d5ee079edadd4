package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/go-rdma/rdma"
)

// asyncConn is one connection of the async path: an rdma.Conn, a buffer
// of two halves like the raw path's, and the peer's exposed region.
type asyncConn struct {
	c       *rdma.Conn
	buf     *rdma.Buffer
	region  rdma.RemoteRegion // the peer's whole buffer
	pending *rdma.Future      // server: the receive waited for across rounds
}

// asyncSide is one end of the async path: -q connections (one for the
// latency tests).
type asyncSide struct {
	p     *params
	conns []*asyncConn
	half  int
	rr    int                  // the server's round robin over pending receives
	cases []reflect.SelectCase // its wait on several of them
}

func pollMode(p *params) rdma.PollMode {
	switch p.pollMode {
	case "adaptive":
		return rdma.PollAdaptive
	case "event":
		return rdma.PollEvent
	}
	return rdma.PollBusy
}

func asyncOptions(p *params) []rdma.Option {
	rq := 64
	if p.test == "send_bw" {
		rq = max(2, min(p.rxDepth, (256<<20)/max(p.maxSize(), 64)/p.qps))
	}
	mode := pollMode(p)
	if p.host == "" && p.test != "send_bw" && p.test != "send_lat" && p.test != "write_lat" {
		// The passive side of a one-sided test has no completion to
		// wait for: like perftest's server it should not spin, which
		// would take a CPU from the device (rxe is software).
		mode = rdma.PollEvent
	}
	opts := []rdma.Option{rdma.WithProvider(p.provider), rdma.WithPollMode(mode),
		rdma.WithMaxMessage(max(p.maxSize(), 64)), rdma.WithQueueDepth(max(p.txDepth, 16), rq)}
	opts = append(opts, p.locked.options()...)
	if p.device != "" {
		opts = append(opts, rdma.WithDevice(p.device))
	}
	return opts
}

func setupAsync(ctx context.Context, p *params, o *oob) (s *asyncSide, err error) {
	s = &asyncSide{p: p}
	side := s // the returns below set s to nil
	defer func() {
		if err != nil {
			side.close()
		}
	}()
	addr := net.JoinHostPort(p.host, strconv.Itoa(p.port+1))
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if p.host == "" {
		ln, err := rdma.Listen("rdma", addr, asyncOptions(p)...)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if err := o.barrier(uint64(p.qps)); err != nil { // listening, for -q connections
			return nil, fmt.Errorf("%w (same -q on both sides?)", err)
		}
		for range p.qps {
			c, err := ln.Accept(ctx)
			if err != nil {
				return nil, err
			}
			s.conns = append(s.conns, &asyncConn{c: c})
		}
	} else {
		if err := o.barrier(uint64(p.qps)); err != nil {
			return nil, fmt.Errorf("%w (same -q on both sides?)", err)
		}
		for range p.qps {
			c, err := rdma.Dial(ctx, "rdma", addr, asyncOptions(p)...)
			if err != nil {
				return nil, err
			}
			s.conns = append(s.conns, &asyncConn{c: c})
		}
	}
	s.half = (p.maxSize() + 63) &^ 63
	// The connections exchange their regions concurrently: the two sides
	// need not see them in the same order.
	errs := make([]error, len(s.conns))
	var wg sync.WaitGroup
	for i, ac := range s.conns {
		wg.Go(func() { errs[i] = ac.exchange(ctx, s.half) })
	}
	wg.Wait()
	return s, errors.Join(errs...)
}

// exchange allocates and exposes the connection's buffer and learns the
// peer's.
func (ac *asyncConn) exchange(ctx context.Context, half int) error {
	var err error
	if ac.buf, err = ac.c.Alloc(2 * half); err != nil {
		return err
	}
	r, err := ac.c.Expose(ac.buf, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- ac.c.SendRegion(ctx, r) }()
	if ac.region, err = ac.c.RecvRegion(ctx); err != nil {
		return err
	}
	return <-errc
}

func (s *asyncSide) close() {
	if s.p.stats && s.p.stderr != nil {
		s.printStats(s.p.stderr)
	}
	for _, ac := range s.conns {
		if ac.pending != nil && ac.pending.Resolved() {
			if b := ac.pending.Buffer(); b != nil {
				b.Release()
			}
		}
		ac.c.Close()
		if ac.buf != nil {
			ac.buf.Release()
		}
	}
}

// printStats writes --stats: the counters of the engines' pollers (all
// of the process's engines, summed per engine) and of each connection.
func (s *asyncSide) printStats(w io.Writer) {
	conns := make([]*rdma.Conn, len(s.conns))
	for i, ac := range s.conns {
		conns[i] = ac.c
	}
	printStats(w, conns)
}

// printStats writes the counters of the process's pollers (summed per
// engine) and of each of conns.
func printStats(w io.Writer, conns []*rdma.Conn) {
	for _, es := range rdma.AllStats() {
		ps := es.Pollers
		fmt.Fprintf(w, "rdmaperf: pollers: polls %d empty %d completions %d yields %d spins-cut %d parks %d events %d kicks %d "+
			"drives %d driven %d standbys %d looks %d drives-cut %d backlogs %d long-spins %d\n",
			ps.Polls, ps.EmptyPolls, ps.Completions, ps.Yields, ps.SpinsCut, ps.Parks, ps.Events, ps.Kicks,
			ps.Drives, ps.Driven, ps.Standbys, ps.Looks, ps.DrivesCut, ps.Backlogs, ps.LongSpins)
	}
	for i, c := range conns {
		st := c.Stats()
		fmt.Fprintf(w, "rdmaperf: conn %d: sends %d writes %d reads %d recvs %d completions %d failed %d recv-failed %d "+
			"credit-waits %d queue-waits %d credits-out %d credit-writes %d control-frames %d doorbells %d\n",
			i, st.Sends, st.Writes, st.Reads, st.Recvs, st.Completions, st.Failed, st.RecvFailed,
			st.CreditWaits, st.QueueWaits, st.CreditsOut, st.CreditWrites, st.ControlFrames, st.Doorbells)
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
	c0 := s.conns[0].c
	return runSizes(p, o, c0.Provider(), c0.Device(), len(s.conns), nil, func(size int) (result, error) {
		if p.host == "" {
			return s.serve(ctx, o, size)
		}
		return s.client(ctx, o, size)
	})
}

func (s *asyncSide) src(ac *asyncConn, size int) rdma.Local {
	sl, _ := ac.buf.Slice(0, size)
	return sl
}

func (s *asyncSide) dst(ac *asyncConn, size int) rdma.RemoteRegion {
	r, _ := ac.region.Slice(s.half, size)
	return r
}

// client runs the bandwidth window: tx depth operations in flight per
// connection, as futures, or as batches of -l operations when -l > 1.
// The window's slots go round robin over the connections, and each
// connection does -n operations (or -D seconds' worth).
func (s *asyncSide) client(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.clientLat(ctx, o, size)
	}
	if p.posters > 1 {
		return s.clientPosters(ctx, o, size)
	}
	nc := len(s.conns)
	per := p.postList
	if p.test == "atomic_bw" && per > 1 {
		return result{}, errors.New("-l: the async API has no batched atomics")
	}
	window := make([]*rdma.Future, nc*max(1, p.txDepth/per))
	batches := make([]*rdma.Batch, len(window))
	for i := range batches {
		batches[i] = s.conns[i%nc].c.NewBatch()
	}
	srcs := make([]rdma.Local, nc)
	dsts := make([]rdma.RemoteRegion, nc)
	atoms := make([]rdma.RemoteRegion, nc)
	for i, ac := range s.conns {
		srcs[i], dsts[i] = s.src(ac, size), s.dst(ac, size)
		atoms[i], _ = ac.region.Slice(s.half, 8)
	}
	post := func(slot, k int) *rdma.Future {
		ci := slot % nc
		c, src, dst := s.conns[ci].c, srcs[ci], dsts[ci]
		if per == 1 {
			switch p.test {
			case "write_bw":
				return c.Write(src, dst)
			case "read_bw":
				return c.Read(src, dst)
			case "atomic_bw":
				return c.FetchAdd(atoms[ci], 1)
			}
			return c.Send(src)
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
	wctx, cancel := context.WithTimeout(ctx, p.timeout+p.duration)
	defer cancel()
	m := newBWMeter(p, size)
	const forever = 1 << 62
	target := p.iters
	if p.duration > 0 {
		target = forever
	}
	posted := make([]int, nc) // per connection
	counts := make([]int, len(window))
	perConn := make([]int, nc)
	total, done := 0, 0
	const clockEvery = 16 // operations between reads of the clock for the peak and the progress line
	clockAt := clockEvery
	left := nc // connections that have not posted their target
	start := time.Now()
	m.begin(start)
	deadline := start.Add(p.duration)
	for i := 0; ; i++ {
		slot := i % len(window)
		ci := slot % nc
		if f := window[slot]; f != nil {
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
			f.Release() // for the next operation: the loop allocates nothing
			window[slot] = nil
			done += counts[slot]
			perConn[ci] += counts[slot]
			if done >= clockAt {
				// Not at every Future: in the VM time.Now traps (HPET),
				// a cost per operation that perftest's TSC reads lack.
				m.progress(time.Now(), done)
				clockAt = done + clockEvery
			}
		}
		if target == forever && time.Now().After(deadline) {
			target, left = 0, 0
		}
		if posted[ci] < target {
			k := min(per, target-posted[ci])
			window[slot] = post(slot, k)
			counts[slot] = k
			posted[ci] += k
			total += k
			if posted[ci] == target {
				left--
			}
		} else if left == 0 && done == total {
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
	r := m.result(p, size, done, end)
	if nc > 1 {
		r.QPs, r.PerQP = nc, perConn
	}
	return r, nil
}

// clientPosters is the bandwidth client of -g: that many goroutines post
// the operations as Futures, one call each, every goroutine keeping tx
// depth/g of them in flight over the connections in turn. Their posts
// meet on the connections' send queues, where the async API combines
// concurrent posts into one WR chain and one doorbell (the Conn's
// Stats count the doorbells); the single-goroutine client, with -l 1,
// rings one per Future.
func (s *asyncSide) clientPosters(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	nc := len(s.conns)
	wctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	m := newBWMeter(p, size)
	total := p.iters * nc
	depth := max(1, p.txDepth*nc/p.posters)
	var done atomic.Int64
	g, gctx := errgroup.WithContext(wctx)
	start := time.Now()
	m.begin(start)
	for w := range p.posters {
		n := total / p.posters
		if w < total%p.posters {
			n++
		}
		g.Go(func() error {
			window := make([]*rdma.Future, depth)
			for i := 0; i < n+depth; i++ {
				slot := i % depth
				if f := window[slot]; f != nil {
					if err := f.Wait(gctx); err != nil {
						return err
					}
					f.Release()
					window[slot] = nil
					done.Add(1)
				}
				if i < n {
					ac := s.conns[(w+i)%nc]
					src, dst := s.src(ac, size), s.dst(ac, size)
					switch p.test {
					case "write_bw":
						window[slot] = ac.c.Write(src, dst)
					case "read_bw":
						window[slot] = ac.c.Read(src, dst)
					case "atomic_bw":
						atom, _ := ac.region.Slice(s.half, 8)
						window[slot] = ac.c.FetchAdd(atom, 1)
					default:
						window[slot] = ac.c.Send(src)
					}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return result{}, err
	}
	end := time.Now()
	if err := o.send(uint64(done.Load())); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return m.result(p, size, int(done.Load()), end), nil
}

func (ac *asyncConn) recvFuture() *rdma.Future {
	if ac.pending == nil {
		ac.pending = ac.c.Recv()
	}
	return ac.pending
}

// takeRecv finishes the pending receive.
func (ac *asyncConn) takeRecv() error {
	f := ac.pending
	ac.pending = nil
	if err := f.Err(); err != nil {
		return err
	}
	if b := f.Buffer(); b != nil {
		b.Release()
	}
	f.Release()
	return nil
}

// waitRecv waits until the pending receive of one of the connections has
// completed and returns its index, or -1 when stop closes first (a nil
// stop is never ready).
//
// With one connection it waits with Future.Wait, so that a Busy poller
// runs to completion on this goroutine (poller/drive.go), as perftest's
// server polls its own CQ; a context that ends at stop bounds the wait.
func (s *asyncSide) waitRecv(ctx context.Context, stop *stopper) (int, error) {
	n := len(s.conns)
	for k := range n {
		// Resolved, not a select on Done: Done wakes a Busy poller for
		// whoever will block on the channel, a wake and a second thread
		// spinning per message (issue 18: send_bw at 0.52x perftest).
		i := (s.rr + k) % n
		if s.conns[i].recvFuture().Resolved() {
			s.rr = i + 1
			return i, nil
		}
	}
	if n == 1 {
		f, w := s.conns[0].recvFuture(), ctx
		if stop != nil {
			w = stop.ctx
		}
		f.Wait(w) // its error, if any, is takeRecv's
		switch {
		case f.Resolved():
			return 0, nil
		case ctx.Err() != nil:
			return -1, ctx.Err()
		}
		return -1, nil
	}
	if s.cases == nil {
		s.cases = make([]reflect.SelectCase, n+2)
		for i := range s.cases {
			s.cases[i].Dir = reflect.SelectRecv
		}
	}
	for i, ac := range s.conns {
		s.cases[i].Chan = reflect.ValueOf(ac.recvFuture().Done())
	}
	s.cases[n].Chan = reflect.Value{} // ignored when nil
	if stop != nil {
		s.cases[n].Chan = reflect.ValueOf(stop.done)
	}
	s.cases[n+1].Chan = reflect.ValueOf(ctx.Done())
	i, _, _ := reflect.Select(s.cases)
	switch {
	case i < n:
		s.rr = i + 1
		return i, nil
	case i == n:
		return -1, nil
	}
	return -1, ctx.Err()
}

func (s *asyncSide) serve(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.serveLat(ctx, o, size)
	}
	st := o.watchStop(ctx)
	if p.test != "send_bw" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	m := newBWMeter(p, size)
	perConn := make([]int, len(s.conns))
	recvd := 0
	stop := st
	for {
		if c, ok := st.stopped(); ok && recvd >= c {
			break
		}
		i, err := s.waitRecv(ctx, stop)
		if err != nil {
			return result{}, err
		}
		if i < 0 {
			// the count has arrived: take what is left
			if e := st.wait(); e != nil {
				return result{}, e
			}
			stop = nil
			continue
		}
		if err := s.conns[i].takeRecv(); err != nil {
			return result{}, err
		}
		now := time.Now()
		if recvd == 0 {
			m.begin(now)
		}
		recvd++
		perConn[i]++
		m.progress(now, recvd)
	}
	end := time.Now()
	if recvd == 0 {
		return result{Test: p.test, API: p.api, Bytes: size}, o.send(0)
	}
	r := m.result(p, size, recvd, end)
	if len(s.conns) > 1 {
		r.QPs, r.PerQP = len(s.conns), perConn
	}
	return r, o.send(0)
}

func (ac *asyncConn) pollByte(off int) byte {
	b := ac.buf.Bytes()
	w := (*uint32)(unsafe.Pointer(&b[off&^3]))
	return byte(atomic.LoadUint32(w) >> (8 * (off & 3)))
}

func (s *asyncSide) clientLat(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	wctx, cancel := context.WithTimeout(ctx, p.timeout+p.duration)
	defer cancel()
	ac := s.conns[0]
	src, dst := s.src(ac, size), s.dst(ac, size)
	rsrc, _ := ac.region.Slice(0, size)
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	line := newProgressLine(p, size)
	start := time.Now()
	line.begin(start)
	deadline := start.Add(p.duration)
	mine := ac.buf.Bytes()
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
			f := ac.c.Read(src, rsrc)
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
			f.Release()
		case "send_lat":
			f := ac.c.Send(src)
			if err := ac.recvFuture().Wait(wctx); err != nil {
				return result{}, err
			}
			if err := ac.takeRecv(); err != nil {
				return result{}, err
			}
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
			f.Release()
		default: // write_lat: the answer is detected in memory
			// As ib_write_lat: post, wait for the WRITE's own
			// completion, then spin on memory for the answer. Waiting
			// first also lets a Busy poller stand by while this
			// goroutine spins (poller/drive.go): otherwise two threads
			// would spin per process.
			f := ac.c.Write(src, dst)
			if err := f.Wait(wctx); err != nil {
				return result{}, err
			}
			f.Release()
			for k := 0; ac.pollByte(poll) != seq; k++ {
				if k&1023 == 1023 && wctx.Err() != nil {
					return result{}, fmt.Errorf("no answer: %w", wctx.Err())
				}
			}
		}
		d := float64(cycles()-t0) * ns
		if p.test != "read_lat" {
			d /= 2
		}
		if d >= slowAfter {
			slowRoundTrip(int64(d))
		}
		samples = append(samples, d)
		line.tick(samples)
	}
	line.end()
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
	st := o.watchStop(ctx)
	if p.test == "read_lat" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	ac := s.conns[0]
	src, dst := s.src(ac, size), s.dst(ac, size)
	mine := ac.buf.Bytes()
	poll := s.half + size - 1
	var last *rdma.Future
	answered := 0
	for i := 0; ; i++ {
		seq := byte(i%251 + 1)
		if p.test == "send_lat" {
			// Wait, not a select on Done: a Busy poller then runs
			// to completion here (see waitRecv).
			f := ac.recvFuture()
			f.Wait(st.ctx)
			if !f.Resolved() {
				if ctx.Err() != nil {
					return result{}, ctx.Err()
				}
				if c, _ := st.stopped(); answered >= c {
					goto finished
				}
				f.Wait(ctx)
			}
			if err := ac.takeRecv(); err != nil {
				return result{}, err
			}
		} else {
			for k := 0; ac.pollByte(poll) != seq; k++ {
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
			last.Release()
		}
		mine[size-1] = seq
		if p.test == "send_lat" {
			last = ac.c.Send(src)
		} else {
			// wait for the WRITE at once, as the client does
			f := ac.c.Write(src, dst)
			if err := f.Wait(ctx); err != nil {
				return result{}, err
			}
			f.Release()
			last = nil
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

// lockFlag is --poller_lock: "auto" (the library's default) or a bool.
type lockFlag struct {
	set, locked bool
}

func (f *lockFlag) String() string {
	if f == nil || !f.set {
		return "auto"
	}
	return strconv.FormatBool(f.locked)
}

func (f *lockFlag) Set(s string) error {
	if s == "auto" {
		*f = lockFlag{}
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want auto, true or false")
	}
	*f = lockFlag{set: true, locked: b}
	return nil
}

func (f *lockFlag) IsBoolFlag() bool { return true }

// options is the rdma.WithPollerThreadLock option the flag asks for, if
// any.
func (f lockFlag) options() []rdma.Option {
	if !f.set {
		return nil
	}
	return []rdma.Option{rdma.WithPollerThreadLock(f.locked)}
}
