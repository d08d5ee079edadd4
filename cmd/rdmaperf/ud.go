package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/engine"
)

// transportFlag is -c (--connection, --transport): RC, or UD as
// perftest's -c UD.
type transportFlag struct{ ud *bool }

func (f transportFlag) String() string {
	if f.ud != nil && *f.ud {
		return "UD"
	}
	return "RC"
}

func (f transportFlag) Set(s string) error {
	switch strings.ToUpper(s) {
	case "RC":
		*f.ud = false
	case "UD":
		*f.ud = true
	default:
		return errors.New("want RC or UD")
	}
	return nil
}

// udMaxRx bounds the receives posted over UD by default: perftest's
// UC_MAX_RX.
const udMaxRx = 16000

// checkUD refuses what -c UD does not run.
func (p *params) checkUD() error {
	switch {
	case p.test != "send_bw" && p.test != "send_lat":
		return fmt.Errorf("-c UD runs send_bw and send_lat (as perftest's ib_send_* -c UD): %s needs a connection", p.test)
	case p.api == "stream":
		return errors.New("-c UD: the stream is a connection; use --api verbs or async")
	case p.qps > 1:
		return fmt.Errorf("-q %d: -c UD runs one QP", p.qps)
	case p.posters > 1:
		return fmt.Errorf("-g %d: -c UD posts from one goroutine", p.posters)
	}
	return nil
}

// setUDMTU caps the run's sizes at the path MTU, mtu bytes (path says
// whose): a UD message is one packet. perftest's -c UD caps its sizes at
// the MTU too; -s beyond it is refused.
func (p *params) setUDMTU(mtu int, path string) error {
	if mtu <= 0 {
		return fmt.Errorf("-c UD: no MTU known for %s", path)
	}
	if !p.all && p.size > mtu {
		return fmt.Errorf("-s %d: a UD message is one packet, at most the path MTU: %d B (%s)", p.size, mtu, path)
	}
	p.udMTU = mtu
	return nil
}

// udNote follows the row of send_bw's receiver over UD: how many of the
// datagrams sent did not arrive.
func udNote(w io.Writer, r result) {
	if r.Transport != "UD" || r.Sent == 0 {
		return
	}
	fmt.Fprintf(w, " UD: %d datagrams sent, %d received, %d dropped at the receiver (%.2f%%)",
		r.Sent, r.Iters, r.Dropped, 100*float64(r.Dropped)/float64(r.Sent))
	if r.API == "async" {
		fmt.Fprintf(w, ", %d of them by the PacketConn's full queue", r.QueueFull)
	}
	fmt.Fprintln(w)
}

// udHello is the one-byte datagram of the async API's handshake. No
// datagram of the tests is one byte of 0xff (send_lat's sequence bytes
// are 1..251, send_bw's are 0), so a late one is known and skipped.
const udHello = 0xff

func isHello(b []byte) bool { return len(b) == 1 && b[0] == udHello }

// udSide is one end of the async API over UD: a PacketConn, the buffer
// it sends from, and (the client) the server's address.
type udSide struct {
	p    *params
	pc   *rdma.PacketConn
	buf  *rdma.Buffer
	peer net.Addr
}

// udOptions are the PacketConn's options. Its receive depth is -r but
// at most what the library's completion queue bound leaves beside the
// send depth (engine.CQEntries in all): 8064 receives against perftest's
// 10000 for -n 10000.
func udOptions(p *params) []rdma.Option {
	send := max(p.txDepth, 16)
	opts := []rdma.Option{rdma.WithProvider(p.provider), rdma.WithPollMode(pollMode(p)),
		rdma.WithQueueDepth(send, min(p.rxDepth, engine.CQEntries-send))}
	opts = append(opts, p.locked.options()...)
	if p.device != "" {
		opts = append(opts, rdma.WithDevice(p.device))
	}
	return opts
}

func (s *udSide) close() {
	if s.p.stats && s.p.stderr != nil && s.pc != nil {
		st := s.pc.PacketStats()
		fmt.Fprintf(s.p.stderr, "rdmaperf: packetconn: sent %d received %d dropped-queue-full %d not-reposted %d recv-errors %d\n",
			st.Sent, st.Received, st.DroppedQueueFull, st.NotReposted, st.RecvErrors)
	}
	if s.buf != nil {
		s.buf.Release()
	}
	if s.pc != nil {
		s.pc.Close()
	}
}

// setupUDAsync opens the PacketConns, the server's on -p+1 and the
// client's on any port, agrees on the MTU, and has the client's hello
// reach the server: that finds the server's route (its side channel's
// answer) and gives the server the client's, before any measurement.
func setupUDAsync(ctx context.Context, p *params, o *oob) (s *udSide, err error) {
	s = &udSide{p: p}
	side := s // the returns below set s to nil
	defer func() {
		if err != nil {
			side.close()
		}
	}()
	bind := ":0"
	if p.host == "" {
		bind = ":" + strconv.Itoa(p.port+1)
	}
	if s.pc, err = rdma.ListenPacket("rdma", bind, udOptions(p)...); err != nil {
		return nil, err
	}
	// The exchange is also the barrier: the server's PacketConn is open
	// before the client sends to it.
	var peerMTU uint32
	if err = o.exchange(uint32(s.pc.MaxDatagram()), &peerMTU); err != nil {
		return nil, err
	}
	if err = p.setUDMTU(min(s.pc.MaxDatagram(), int(peerMTU)), fmt.Sprintf("the PacketConns' MaxDatagram on %s and its peer", s.pc.Device())); err != nil {
		return nil, err
	}
	if s.buf, err = s.pc.Alloc(p.maxSize()); err != nil {
		return nil, err
	}
	if p.host != "" {
		if s.peer, err = rdma.ResolvePacketAddr(net.JoinHostPort(p.host, strconv.Itoa(p.port+1))); err != nil {
			return nil, err
		}
	}
	// A hello may be lost: up to 5 tries, the server saying over TCP
	// whether one came.
	const tries, wait = 5, time.Second
	for try := 1; ; try++ {
		var got, peerGot uint32
		if p.host != "" {
			s.pc.SetWriteDeadline(time.Now().Add(p.timeout))
			if _, err = s.pc.WriteTo([]byte{udHello}, s.peer); err != nil {
				return nil, fmt.Errorf("hello to %v: %w", s.peer, err)
			}
			s.pc.SetWriteDeadline(time.Time{})
		} else {
			hctx, cancel := context.WithTimeout(ctx, wait)
			b, _, err := s.pc.RecvFrom(hctx)
			cancel()
			if err == nil {
				got = 1
				b.Release()
			}
		}
		if err = o.exchange(got, &peerGot); err != nil {
			return nil, err
		}
		if got|peerGot != 0 {
			return s, nil
		}
		if try == tries {
			return nil, fmt.Errorf("-c UD: no hello datagram reached the server in %d tries", tries)
		}
	}
}

func runUDAsync(ctx context.Context, p *params) ([]result, error) {
	o, err := oobConnect(ctx, p)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	s, err := setupUDAsync(ctx, p, o)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return runSizes(p, o, s.pc.Provider(), s.pc.Device(), 1, nil, func(size int) (result, error) {
		switch {
		case p.host == "" && p.isLat:
			return s.serveLat(ctx, o, size)
		case p.host == "":
			return s.serveBW(ctx, o, size)
		case p.isLat:
			return s.clientLat(ctx, o, size)
		}
		return s.clientBW(ctx, o, size)
	})
}

func (s *udSide) src(size int) rdma.Local {
	sl, _ := s.buf.Slice(0, size)
	return sl
}

// clientBW sends -n datagrams (or -D seconds' worth), tx depth in
// flight: SendTo Futures, or with -l > 1 PacketBatches of -l. A Future
// resolves once its datagrams have left; nothing says they arrived.
func (s *udSide) clientBW(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	per := p.postList
	window := make([]*rdma.Future, max(1, p.txDepth/per))
	counts := make([]int, len(window))
	batch := s.pc.NewBatch() // Post empties it
	src := s.src(size)
	wctx, cancel := context.WithTimeout(ctx, p.timeout+p.duration)
	defer cancel()
	m := newBWMeter(p, size)
	const forever = 1 << 62
	target := p.iters
	if p.duration > 0 {
		target = forever
	}
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
			f.Release() // for the next datagram: the loop allocates nothing
			window[slot] = nil
			done += counts[slot]
			m.progress(time.Now(), done)
		}
		if target == forever && time.Now().After(deadline) {
			target = posted
		}
		if posted < target {
			k := min(per, target-posted)
			if k == 1 {
				window[slot] = s.pc.SendTo(src, s.peer)
			} else {
				for range k {
					batch.SendTo(src, s.peer)
				}
				window[slot] = batch.Post()
			}
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

// serveBW takes datagrams with RecvFrom until the client's count has
// arrived and either all have come or none for udQuiet (see serveUD),
// and reports those received, from the first to the last.
func (s *udSide) serveBW(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	st := o.watchStop(ctx)
	before := s.pc.PacketStats()
	m := newBWMeter(p, size)
	var last time.Time
	recvd, sent := 0, -1
	for sent < 0 || recvd < sent {
		rctx, cancel := st.ctx, context.CancelFunc(func() {})
		if sent >= 0 {
			rctx, cancel = context.WithTimeout(ctx, udQuiet)
		}
		b, _, err := s.pc.RecvFrom(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return result{}, ctx.Err()
			}
			if rctx.Err() == nil {
				return result{}, err
			}
			if sent >= 0 {
				break // quiet: the rest is lost
			}
			if err := st.wait(); err != nil {
				return result{}, err
			}
			sent, _ = st.stopped()
			continue
		}
		hello := isHello(b.Bytes())
		b.Release()
		if hello {
			continue
		}
		now := time.Now()
		if recvd == 0 {
			m.begin(now)
		}
		recvd++
		last = now
		m.progress(now, recvd)
	}
	// A rate needs two datagrams: one alone spans no time.
	r := result{Test: p.test, API: p.api, Bytes: size, Iters: recvd}
	if recvd > 1 {
		r = m.result(p, size, recvd, last)
	}
	r.Sent, r.Dropped = sent, sent-recvd
	r.QueueFull = int(s.pc.PacketStats().DroppedQueueFull - before.DroppedQueueFull)
	return r, o.send(0)
}

// clientLat is the ping-pong: SendTo, then RecvFrom the answer; a
// sample is half the round trip. A lost datagram stops it (--timeout),
// as it stops perftest's.
func (s *udSide) clientLat(ctx context.Context, o *oob, size int) (result, error) {
	p := s.p
	wctx, cancel := context.WithTimeout(ctx, p.timeout+p.duration)
	defer cancel()
	src := s.src(size)
	mine := s.buf.Bytes()
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	line := newProgressLine(p, size)
	start := time.Now()
	line.begin(start)
	deadline := start.Add(p.duration)
	for i := 0; ; i++ {
		if p.duration > 0 {
			if i > 0 && time.Now().After(deadline) {
				break
			}
		} else if i == p.iters {
			break
		}
		mine[size-1] = byte(i%251 + 1)
		t0 := cycles()
		f := s.pc.SendTo(src, s.peer)
		b, _, err := s.pc.RecvFrom(wctx)
		if err != nil {
			return result{}, fmt.Errorf("no answer to datagram %d: %w", i, err)
		}
		b.Release()
		if err := f.Wait(wctx); err != nil {
			return result{}, err
		}
		f.Release()
		samples = append(samples, float64(cycles()-t0)*ns/2)
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

// serveLat answers each datagram to its sender until the client's count
// has arrived.
func (s *udSide) serveLat(ctx context.Context, o *oob, size int) (result, error) {
	st := o.watchStop(ctx)
	src := s.src(size)
	mine := s.buf.Bytes()
	var last *rdma.Future
	for i := 0; ; i++ {
		b, from, err := s.pc.RecvFrom(st.ctx)
		if err != nil {
			if ctx.Err() != nil {
				return result{}, ctx.Err()
			}
			if st.ctx.Err() == nil {
				return result{}, err
			}
			break // the client has all its answers: it sent its count
		}
		hello := isHello(b.Bytes())
		b.Release()
		if hello {
			continue
		}
		if last != nil {
			// src is sent from: it must not change before the last
			// answer has left
			if err := last.Wait(ctx); err != nil {
				return result{}, err
			}
			last.Release()
		}
		mine[size-1] = byte(i%251 + 1)
		last = s.pc.SendTo(src, from)
	}
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
