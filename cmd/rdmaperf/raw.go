package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// peerInfo is what the two sides exchange over TCP for the raw path.
type peerInfo struct {
	QPN  uint32
	PSN  uint32
	LID  uint16
	MTU  uint16
	GID  [16]byte
	Addr uint64
	RKey uint32
	Len  uint32
}

// rawQP is one of the side's QPs (-q) and its peer.
type rawQP struct {
	qp     verbs.QP
	peer   peerInfo
	ah     verbs.AH // -c UD: the address handle of the peer
	posted int      // receives posted and not yet completed
	// the client's bandwidth window, in WRs of this round
	sent, done, target int
}

// rawSide is one end of the raw path: -q QPs on one CQ and one buffer of
// two halves, [0, half) to send or read into, [half, 2*half) to receive
// or to be written; all QPs share the buffer.
type rawSide struct {
	p      *params
	run    context.Context
	ctx    verbs.Context
	pd     verbs.PD
	ch     verbs.CompChannel // -e
	cq     verbs.CQ
	qps    []*rawQP
	buf    []byte
	mr     verbs.MR
	half   int
	wc     []verbs.WorkCompletion
	recvs  []verbs.RecvWR
	rsge   []verbs.SGE
	recvd  int // receive completions this round
	events int // completion events taken this round (-e)
}

// WR IDs: the QP's index above qpShift, the WR's index in the round below
// it; receives carry recvID and the QP's index.
const (
	qpShift = 40
	idxMask = 1<<qpShift - 1
	recvID  = 1 << 62
)

func (s *rawSide) close() {
	for _, q := range s.qps {
		q.qp.Close()
		if q.ah != nil {
			q.ah.Close()
		}
	}
	if s.mr != nil {
		s.mr.Close()
	}
	if s.buf != nil {
		mem.Unmap(s.buf)
	}
	if s.cq != nil {
		s.cq.Close()
	}
	if s.ch != nil {
		s.ch.Close()
	}
	if s.pd != nil {
		s.pd.Close()
	}
	if s.ctx != nil {
		s.ctx.Close()
	}
}

// fillRecvs keeps rxDepth receives posted on QP qi, in one chain. Each
// takes up to the largest size of the run, so that receives left over
// from a smaller size still fit.
func (s *rawSide) fillRecvs(qi int) error {
	q := s.qps[qi]
	k := len(s.recvs) - q.posted
	if k == 0 {
		return nil
	}
	for i := 0; i < k; i++ {
		s.rsge[i] = verbs.SGE{Addr: s.mr.Addr() + uint64(s.half), Length: uint32(s.half), LKey: s.mr.LKey()}
		s.recvs[i] = verbs.RecvWR{ID: recvID | uint64(qi), SGL: s.rsge[i : i+1]}
	}
	if _, err := q.qp.PostRecv(s.recvs[:k]); err != nil {
		return err
	}
	q.posted += k
	return nil
}

// refillRecvs tops up the QPs that have used half their receives.
func (s *rawSide) refillRecvs() error {
	for i, q := range s.qps {
		if q.posted < len(s.recvs)/2 {
			if err := s.fillRecvs(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// lastByte is the word that holds the byte at off, read atomically so
// the spin sees a peer's RDMA WRITE. mmap memory is page aligned.
func (s *rawSide) pollByte(off int) byte {
	w := (*uint32)(unsafe.Pointer(&s.buf[off&^3]))
	return byte(atomic.LoadUint32(w) >> (8 * (off & 3))) // little endian
}

func runRaw(ctx context.Context, p *params) ([]result, error) {
	o, err := oobConnect(ctx, p)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	setup := setupRaw
	if p.ud {
		setup = setupRawUD
	}
	s, err := setup(ctx, p, o)
	if err != nil {
		return nil, err
	}
	defer s.close()
	info := s.ctx.Info()
	prepare := func() error {
		if p.test == "send_bw" || p.test == "send_lat" {
			for i := range s.qps {
				if err := s.fillRecvs(i); err != nil {
					return err
				}
			}
		}
		s.recvd, s.events = 0, 0
		for _, q := range s.qps {
			q.sent, q.done = 0, 0
		}
		return nil
	}
	return runSizes(p, o, info.Provider, info.Name, len(s.qps), prepare, func(size int) (r result, err error) {
		if p.host == "" {
			r, err = s.serve(o, size)
		} else {
			r, err = s.client(o, size)
		}
		r.Events = s.events
		return r, err
	})
}

// poll takes completions and checks them: a send moves its QP's done to
// its WR index + 1, a receive counts in s.recvd.
func (s *rawSide) poll() (int, error) {
	// Up to 32 polls in one call into the provider: the verbs
	// provider spins in C, as perftest's loops do, instead of paying a
	// call into C per empty poll.
	n, err := verbs.PollSpin(s.cq, s.wc, 32)
	if err != nil {
		return 0, err
	}
	for i := range s.wc[:n] {
		w := &s.wc[i]
		if w.Status != verbs.WCSuccess {
			return 0, w.Err()
		}
		if w.WRID&recvID != 0 {
			s.recvd++
			s.qps[w.WRID&^recvID].posted--
			continue
		}
		s.qps[w.WRID>>qpShift].done = int(w.WRID&idxMask) + 1
	}
	return n, nil
}

// next polls. Without -e that is all. With -e, when the CQ is empty, it
// arms the CQ, polls again (a completion that came between the first poll
// and the arming raises no event), and only then waits for the channel's
// event, acks it and polls. A wait that ctx ends returns (0, nil) unless
// the whole run is cancelled, so that the server can look at the
// client's stop message.
func (s *rawSide) next(ctx context.Context) (int, error) {
	n, err := s.poll()
	if n > 0 || err != nil || !s.p.events {
		return n, err
	}
	if err := s.cq.ReqNotify(false); err != nil {
		return 0, err
	}
	if n, err := s.poll(); n > 0 || err != nil {
		return n, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.p.timeout)
	cq, err := s.ch.GetEvent(wctx)
	cancel()
	if err != nil {
		switch {
		case s.run.Err() != nil:
			return 0, s.run.Err()
		case ctx.Err() != nil:
			return 0, nil
		case wctx.Err() != nil:
			return 0, fmt.Errorf("no completion event for %v", s.p.timeout)
		}
		return 0, fmt.Errorf("completion channel: %w", err)
	}
	cq.AckEvents(1)
	s.events++
	return s.poll()
}

func (s *rawSide) opcode() verbs.Opcode {
	switch s.p.test {
	case "write_bw", "write_lat":
		return verbs.OpWrite
	case "read_bw", "read_lat":
		return verbs.OpRead
	case "atomic_bw":
		return verbs.OpFetchAdd
	}
	return verbs.OpSend
}

// inlineFlag is SendInline for SENDs and WRITEs of up to -I bytes.
func (s *rawSide) inlineFlag(op verbs.Opcode, size int) verbs.SendFlags {
	if size <= s.p.inline && (op == verbs.OpSend || op == verbs.OpWrite) {
		return verbs.SendInline
	}
	return 0
}

// client runs the bandwidth window: on each QP in turn, tx depth WRs in
// flight, -n of them per QP (or -D seconds' worth), as perftest does.
func (s *rawSide) client(o *oob, size int) (result, error) {
	if s.p.isLat {
		return s.clientLat(o, size)
	}
	p := s.p
	op := s.opcode()
	inl := s.inlineFlag(op, size)
	wrs := make([]verbs.SendWR, p.postList)
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	for i := range wrs {
		wrs[i] = verbs.SendWR{Opcode: op, SGL: sge, RemoteAddr: s.qps[0].peer.Addr + uint64(s.half), RKey: s.qps[0].peer.RKey, CompareAdd: 1}
		s.qps[0].address(&wrs[i])
	}
	const forever = 1 << 40 // below qpShift
	for _, q := range s.qps {
		q.target = p.iters
		if p.duration > 0 {
			q.target = forever
		}
	}
	open := len(s.qps) // QPs whose last WR has not completed
	timed := p.duration > 0
	var deadline time.Time
	m := newBWMeter(p, size)
	stall := time.Now().Add(p.timeout)
	idle := 0
	start := time.Now()
	m.begin(start)
	if timed {
		deadline = start.Add(p.duration)
	}
	for open > 0 {
		for qi, q := range s.qps {
			for q.sent < q.target && q.sent-q.done+min(p.postList, q.target-q.sent) <= p.txDepth {
				k := min(p.postList, q.target-q.sent)
				for j := 0; j < k; j++ {
					idx := q.sent + j
					wrs[j].ID = uint64(qi)<<qpShift | uint64(idx)
					wrs[j].Flags = inl
					if (idx+1)%p.cqMod == 0 || idx == q.target-1 {
						wrs[j].Flags |= verbs.SendSignaled
					}
				}
				if _, err := q.qp.PostSend(wrs[:k]); err != nil {
					return result{}, err
				}
				q.sent += k
			}
		}
		n, err := s.next(s.run)
		if err != nil {
			return result{}, err
		}
		// Read the clock only on progress and every 1024 empty polls:
		// in a VM without a usable TSC it costs a trap.
		if n > 0 {
			idle = 0
		} else if idle++; idle&1023 != 0 {
			continue
		}
		now := time.Now()
		if n > 0 {
			var done int
			done, open = s.window()
			m.progress(now, done)
			stall = now.Add(p.timeout)
		} else if now.After(stall) {
			return result{}, fmt.Errorf("no completion for %v", p.timeout)
		}
		if timed && now.After(deadline) {
			// Stop on a signaled WR: the last one posted, rounded up
			// to the signaling period.
			timed = false
			for _, q := range s.qps {
				q.target = (q.sent + p.cqMod - 1) / p.cqMod * p.cqMod
			}
			_, open = s.window()
		}
	}
	end := time.Now()
	done, _ := s.window()
	var per []int
	for _, q := range s.qps {
		per = append(per, q.done)
	}
	if err := o.send(uint64(done)); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	r := m.result(p, size, done, end)
	if len(per) > 1 {
		r.QPs, r.PerQP = len(per), per
	}
	return r, nil
}

// window sums the WRs completed on every QP and counts the QPs that have
// not reached their target.
func (s *rawSide) window() (done, open int) {
	for _, q := range s.qps {
		done += q.done
		if q.done < q.target {
			open++
		}
	}
	return done, open
}

// serve is the passive side: for WRITE, READ and atomics it waits for the
// client; for SEND it receives and re-posts.
func (s *rawSide) serve(o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.serveLat(o, size)
	}
	if p.ud {
		return s.serveUD(o, size)
	}
	st := o.watchStop(s.run)
	if p.test != "send_bw" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	m := newBWMeter(p, size)
	started := false
	for {
		n, err := s.next(st.ctx)
		if err != nil {
			return result{}, err
		}
		if n > 0 {
			now := time.Now()
			if !started {
				m.begin(now) // from the first receive
				started = true
			}
			m.progress(now, s.recvd)
			if err := s.refillRecvs(); err != nil {
				return result{}, err
			}
		}
		if c, ok := st.stopped(); ok && s.recvd >= c {
			break
		}
	}
	end := time.Now()
	if err := st.wait(); err != nil {
		return result{}, err
	}
	for i := range s.qps {
		if err := s.fillRecvs(i); err != nil {
			return result{}, err
		}
	}
	if s.recvd == 0 {
		return result{Test: p.test, API: p.api, Bytes: size}, o.send(0)
	}
	return m.result(p, size, s.recvd, end), o.send(0)
}

// clientLat runs the ping-pong (send, write) or the READ loop and keeps
// one sample per iteration.
func (s *rawSide) clientLat(o *oob, size int) (result, error) {
	p := s.p
	op := s.opcode()
	q := s.qps[0]
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	wr := []verbs.SendWR{{Opcode: op, SGL: sge, RemoteAddr: q.peer.Addr + uint64(s.half), RKey: q.peer.RKey}}
	q.address(&wr[0])
	if op == verbs.OpRead {
		wr[0].RemoteAddr = q.peer.Addr // read the peer's first half
	}
	inl := s.inlineFlag(op, size)
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	line := newProgressLine(p, size)
	var deadline time.Time
	start := time.Now()
	if p.duration > 0 {
		deadline = start.Add(p.duration)
	}
	line.begin(start)
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
		s.buf[size-1] = seq
		wr[0].ID = uint64(i)
		wr[0].Flags = inl
		if i%p.cqMod == p.cqMod-1 || op == verbs.OpRead {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := s.awaitRoom(i); err != nil {
			return result{}, err
		}
		var stall time.Time
		t0 := cycles()
		if _, err := q.qp.PostSend(wr); err != nil {
			return result{}, err
		}
		for k := 0; ; k++ {
			switch op {
			case verbs.OpWrite:
				if s.pollByte(poll) == seq {
					goto arrived
				}
				if k&63 == 0 {
					// keep send completions flowing
					if _, err := s.poll(); err != nil {
						return result{}, err
					}
				}
			case verbs.OpRead:
				if _, err := s.next(s.run); err != nil {
					return result{}, err
				}
				if q.done > i {
					goto arrived
				}
			default:
				r0 := s.recvd
				if _, err := s.next(s.run); err != nil {
					return result{}, err
				}
				if s.recvd > r0 {
					goto arrived
				}
			}
			if k&1023 == 1023 {
				if now := time.Now(); stall.IsZero() {
					stall = now.Add(p.timeout)
				} else if now.After(stall) {
					return result{}, fmt.Errorf("no answer for %v", p.timeout)
				}
			}
		}
	arrived:
		d := float64(cycles()-t0) * ns
		if op != verbs.OpRead {
			d /= 2
		}
		if d >= slowAfter {
			slowRoundTrip(int64(d))
		}
		samples = append(samples, d)
		line.tick(samples)
		if op == verbs.OpSend && q.posted < len(s.recvs)/2 {
			if err := s.fillRecvs(0); err != nil {
				return result{}, err
			}
		}
	}
	line.end()
	// Drain: wait until the last signaled send has completed.
	lastSig := len(samples) - 1
	if op != verbs.OpRead {
		lastSig = (len(samples)/p.cqMod)*p.cqMod - 1
	}
	if err := s.drain(lastSig); err != nil {
		return result{}, err
	}
	if err := o.send(uint64(len(samples))); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return latResult(p, size, samples), nil
}

// awaitRoom polls until QP 0's send queue has room for WR i (its WRs
// are numbered from 0 in the loop; done is one past the last completed):
// a WR completes when the peer acknowledges it, which a peer may put off
// (soft coalesces up to 16 ACKs), so a ping-pong's WRs can fill the
// send queue (-t + 16) while its pings are answered.
func (s *rawSide) awaitRoom(i int) error {
	if i-s.qps[0].done < s.p.txDepth+16 {
		return nil
	}
	stall := time.Now().Add(s.p.timeout)
	for i-s.qps[0].done >= s.p.txDepth+16 {
		if _, err := s.poll(); err != nil {
			return err
		}
		if time.Now().After(stall) {
			return fmt.Errorf("no send completion for %v", s.p.timeout)
		}
	}
	return nil
}

// drain waits until the send WR lastSig (of QP 0) has completed.
func (s *rawSide) drain(lastSig int) error {
	stall := time.Now().Add(s.p.timeout)
	for s.qps[0].done <= lastSig {
		if _, err := s.next(s.run); err != nil {
			return err
		}
		if time.Now().After(stall) {
			return fmt.Errorf("no completion for %v", s.p.timeout)
		}
	}
	return nil
}

// serveLat answers each ping of send_lat and write_lat; for read_lat it
// only waits.
func (s *rawSide) serveLat(o *oob, size int) (result, error) {
	p := s.p
	op := s.opcode()
	q := s.qps[0]
	st := o.watchStop(s.run)
	if op == verbs.OpRead {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	wr := []verbs.SendWR{{Opcode: op, SGL: sge, RemoteAddr: q.peer.Addr + uint64(s.half), RKey: q.peer.RKey}}
	q.address(&wr[0])
	inl := s.inlineFlag(op, size)
	poll := s.half + size - 1
	answered := 0
	for i := 0; ; i++ {
		seq := byte(i%251 + 1)
		for k := 0; ; k++ {
			if op == verbs.OpWrite {
				if s.pollByte(poll) == seq {
					break
				}
				if k&63 == 0 {
					if _, err := s.poll(); err != nil {
						return result{}, err
					}
				}
			} else {
				if _, err := s.next(st.ctx); err != nil {
					return result{}, err
				}
				if s.recvd > i {
					break
				}
			}
			// With -e each wait ends on an event or on the stop.
			if k&255 == 255 || p.events {
				if c, ok := st.stopped(); ok && answered >= c {
					goto finished
				}
			}
		}
		s.buf[size-1] = seq
		wr[0].ID = uint64(i)
		wr[0].Flags = inl
		if i%p.cqMod == p.cqMod-1 {
			wr[0].Flags |= verbs.SendSignaled
		}
		if err := s.awaitRoom(i); err != nil {
			return result{}, err
		}
		if _, err := q.qp.PostSend(wr); err != nil {
			return result{}, err
		}
		answered++
		if op == verbs.OpSend && q.posted < len(s.recvs)/2 {
			if err := s.fillRecvs(0); err != nil {
				return result{}, err
			}
		}
	}
finished:
	if err := st.wait(); err != nil {
		return result{}, err
	}
	if err := s.drain((answered/p.cqMod)*p.cqMod - 1); err != nil {
		return result{}, err
	}
	return result{}, o.send(0)
}
