package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/soft"
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

func pickProvider(name string) (verbs.Provider, error) {
	switch name {
	case "soft":
		return soft.Provider, nil
	case "verbs":
		return ibv.Provider, nil
	}
	if devs, err := ibv.Provider.Devices(); err == nil {
		for _, d := range devs {
			if d.Usable {
				return ibv.Provider, nil
			}
		}
	}
	return soft.Provider, nil
}

// rawSide is one end of the raw path: a QP on one CQ and one buffer of
// two halves, [0, half) to send or read into, [half, 2*half) to receive
// or to be written.
type rawSide struct {
	p      *params
	ctx    verbs.Context
	pd     verbs.PD
	cq     verbs.CQ
	qp     verbs.QP
	buf    []byte
	mr     verbs.MR
	half   int
	peer   peerInfo
	wc     []verbs.WorkCompletion
	recvs  []verbs.RecvWR
	rsge   []verbs.SGE
	posted int // receives posted and not yet completed
}

func (s *rawSide) close() {
	if s.qp != nil {
		s.qp.Close()
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
	if s.pd != nil {
		s.pd.Close()
	}
	if s.ctx != nil {
		s.ctx.Close()
	}
}

func setupRaw(p *params, o *oob) (s *rawSide, err error) {
	prov, err := pickProvider(p.provider)
	if err != nil {
		return nil, err
	}
	s = &rawSide{p: p, wc: make([]verbs.WorkCompletion, 128)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.ctx, err = prov.Open(p.device); err != nil {
		return nil, err
	}
	attr, err := s.ctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	info := s.ctx.Info()
	if p.ibPort < 1 || p.ibPort > len(info.Ports) {
		return nil, fmt.Errorf("-i %d: %s has %d ports", p.ibPort, info.Name, len(info.Ports))
	}
	port := info.Ports[p.ibPort-1]
	gid, err := verbs.SelectGID(port, true)
	if p.gidIndex >= 0 {
		gid, err = verbs.GIDEntry{}, fmt.Errorf("-x %d: no such GID", p.gidIndex)
		for _, g := range port.GIDs {
			if g.Index == p.gidIndex {
				gid, err = g, nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if s.cq, err = s.ctx.CreateCQ(p.txDepth+p.rxDepth+64, nil); err != nil {
		return nil, err
	}
	if s.qp, err = s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: p.txDepth + 16, MaxRecvWR: p.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	s.half = (p.maxSize() + 63) &^ 63
	if s.buf, err = mem.Map(2 * s.half); err != nil {
		return nil, err
	}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if s.mr, err = s.pd.RegMR(s.buf, acc); err != nil {
		return nil, err
	}
	if err = s.qp.ToInit(verbs.InitAttr{Port: uint8(p.ibPort), Access: acc}); err != nil {
		return nil, err
	}
	me := peerInfo{QPN: s.qp.QPN(), PSN: uint32(time.Now().UnixNano()) & 0xffffff, LID: port.LID,
		MTU: uint16(port.ActiveMTU), GID: gid.GID, Addr: s.mr.Addr(), RKey: s.mr.RKey(), Len: uint32(len(s.buf))}
	if err = o.exchange(me, &s.peer); err != nil {
		return nil, err
	}
	mtu := min(verbs.MTU(s.peer.MTU), port.ActiveMTU)
	rd := uint8(max(1, min(attr.MaxQPRdAtom, 16)))
	if err = s.qp.ToRTR(verbs.RTRAttr{PathMTU: mtu, DestQPN: s.peer.QPN, RQPSN: s.peer.PSN,
		Dest:            verbs.Address{Port: uint8(p.ibPort), LID: s.peer.LID, GID: s.peer.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64},
		MaxDestRdAtomic: rd, MinRNRTimer: 1}); err != nil {
		return nil, err
	}
	if err = s.qp.ToRTS(verbs.RTSAttr{SQPSN: me.PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: rd}); err != nil {
		return nil, err
	}
	s.recvs = make([]verbs.RecvWR, p.rxDepth)
	s.rsge = make([]verbs.SGE, p.rxDepth)
	return s, nil
}

// fillRecvs keeps rxDepth receives posted, in one chain. Each takes up to
// the largest size of the run, so that receives left over from a smaller
// size still fit.
func (s *rawSide) fillRecvs(size int) error {
	k := len(s.recvs) - s.posted
	if k == 0 {
		return nil
	}
	for i := 0; i < k; i++ {
		s.rsge[i] = verbs.SGE{Addr: s.mr.Addr() + uint64(s.half), Length: uint32(s.half), LKey: s.mr.LKey()}
		s.recvs[i] = verbs.RecvWR{ID: recvID, SGL: s.rsge[i : i+1]}
	}
	if _, err := s.qp.PostRecv(s.recvs[:k]); err != nil {
		return err
	}
	s.posted += k
	return nil
}

const recvID = 1 << 62

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
	s, err := setupRaw(p, o)
	if err != nil {
		return nil, err
	}
	defer s.close()
	info := s.ctx.Info()
	header(p.stdout, p, info.Provider, info.Name)
	var results []result
	for step, size := range p.sizes() {
		if p.test == "send_bw" || p.test == "send_lat" {
			if err := s.fillRecvs(size); err != nil {
				return nil, err
			}
		}
		if err := o.barrier(uint64(step)<<32 | uint64(size)); err != nil {
			return nil, err
		}
		var r result
		var err error
		if p.host == "" {
			r, err = s.serve(o, size)
		} else {
			r, err = s.client(o, size)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %d B: %w", p.test, size, err)
		}
		r.Provider, r.Device = info.Provider, info.Name
		if p.host != "" || p.test == "send_bw" {
			row(p.stdout, p, r)
			results = append(results, r)
		}
	}
	fmt.Fprintln(p.stdout, rule)
	return results, nil
}

// poll takes completions and checks them; sends move *done to their WR
// ID + 1, receives count in *recvd.
func (s *rawSide) poll(done, recvd *int) (int, error) {
	n, err := s.cq.Poll(s.wc)
	if err != nil {
		return 0, err
	}
	for i := range s.wc[:n] {
		w := &s.wc[i]
		if w.Status != verbs.WCSuccess {
			return 0, w.Err()
		}
		if w.WRID == recvID {
			*recvd++
			s.posted--
			continue
		}
		*done = int(w.WRID) + 1
	}
	return n, nil
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

func (s *rawSide) client(o *oob, size int) (result, error) {
	if s.p.isLat {
		return s.clientLat(o, size)
	}
	p := s.p
	op := s.opcode()
	wrs := make([]verbs.SendWR, p.postList)
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	for i := range wrs {
		wrs[i] = verbs.SendWR{Opcode: op, SGL: sge, RemoteAddr: s.peer.Addr + uint64(s.half), RKey: s.peer.RKey, CompareAdd: 1}
	}
	target := p.iters
	var deadline time.Time
	if p.duration > 0 {
		target = 1 << 62
	}
	m := newBWMeter(p.iters, p.txDepth, p.duration)
	stall := time.Now().Add(p.timeout)
	posted, done, recvd, idle := 0, 0, 0, 0
	start := time.Now()
	m.begin(start)
	if p.duration > 0 {
		deadline = start.Add(p.duration)
	}
	for done < target {
		for posted < target && posted-done+min(p.postList, target-posted) <= p.txDepth {
			k := min(p.postList, target-posted)
			for j := 0; j < k; j++ {
				idx := posted + j
				wrs[j].ID = uint64(idx)
				wrs[j].Flags = 0
				if (idx+1)%p.cqMod == 0 || idx == target-1 {
					wrs[j].Flags = verbs.SendSignaled
				}
			}
			if _, err := s.qp.PostSend(wrs[:k]); err != nil {
				return result{}, err
			}
			posted += k
		}
		n, err := s.poll(&done, &recvd)
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
			m.progress(now, done)
			stall = now.Add(p.timeout)
		} else if now.After(stall) {
			return result{}, fmt.Errorf("no completion for %v", p.timeout)
		}
		if p.duration > 0 && target == 1<<62 && now.After(deadline) {
			// Stop on a signaled WR: the last one posted, rounded up
			// to the signaling period.
			target = (posted + p.cqMod - 1) / p.cqMod * p.cqMod
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

// serve is the passive side: for WRITE, READ and atomics it waits for the
// client; for SEND it receives and re-posts.
func (s *rawSide) serve(o *oob, size int) (result, error) {
	p := s.p
	if p.isLat {
		return s.serveLat(o, size)
	}
	st := o.watchStop()
	if p.test != "send_bw" {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	m := newBWMeter(p.iters, p.txDepth, p.duration)
	done, recvd := 0, 0
	started := false
	for {
		n, err := s.poll(&done, &recvd)
		if err != nil {
			return result{}, err
		}
		if n > 0 {
			now := time.Now()
			if !started {
				m.begin(now) // from the first receive
				started = true
			}
			m.progress(now, recvd)
			if s.posted < len(s.recvs)/2 {
				if err := s.fillRecvs(size); err != nil {
					return result{}, err
				}
			}
		}
		if c, ok := st.stopped(); ok && recvd >= c {
			break
		}
	}
	end := time.Now()
	if err := st.wait(); err != nil {
		return result{}, err
	}
	if err := s.fillRecvs(size); err != nil {
		return result{}, err
	}
	if recvd == 0 {
		return result{Test: p.test, API: p.api, Bytes: size}, o.send(0)
	}
	return m.result(p, size, recvd, end), o.send(0)
}

// clientLat runs the ping-pong (send, write) or the READ loop and keeps
// one sample per iteration.
func (s *rawSide) clientLat(o *oob, size int) (result, error) {
	p := s.p
	op := s.opcode()
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	wr := []verbs.SendWR{{Opcode: op, SGL: sge, RemoteAddr: s.peer.Addr + uint64(s.half), RKey: s.peer.RKey}}
	if op == verbs.OpRead {
		wr[0].RemoteAddr = s.peer.Addr // read the peer's first half
	}
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	var deadline time.Time
	start := time.Now()
	if p.duration > 0 {
		deadline = start.Add(p.duration)
	}
	done, recvd := 0, 0
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
		wr[0].Flags = 0
		if i%p.cqMod == p.cqMod-1 || op == verbs.OpRead {
			wr[0].Flags = verbs.SendSignaled
		}
		var stall time.Time
		t0 := cycles()
		if _, err := s.qp.PostSend(wr); err != nil {
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
					if _, err := s.poll(&done, &recvd); err != nil {
						return result{}, err
					}
				}
			case verbs.OpRead:
				if _, err := s.poll(&done, &recvd); err != nil {
					return result{}, err
				}
				if done > i {
					goto arrived
				}
			default:
				r0 := recvd
				if _, err := s.poll(&done, &recvd); err != nil {
					return result{}, err
				}
				if recvd > r0 {
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
		samples = append(samples, d)
		if op == verbs.OpSend && s.posted < len(s.recvs)/2 {
			if err := s.fillRecvs(size); err != nil {
				return result{}, err
			}
		}
	}
	// Drain: wait until the last signaled send has completed.
	lastSig := len(samples) - 1
	if op != verbs.OpRead {
		lastSig = (len(samples)/p.cqMod)*p.cqMod - 1
	}
	stall := time.Now().Add(p.timeout)
	for done <= lastSig {
		if _, err := s.poll(&done, &recvd); err != nil {
			return result{}, err
		}
		if time.Now().After(stall) {
			return result{}, fmt.Errorf("no completion for %v", p.timeout)
		}
	}
	if err := o.send(uint64(len(samples))); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return latResult(p, size, samples), nil
}

// serveLat answers each ping of send_lat and write_lat; for read_lat it
// only waits.
func (s *rawSide) serveLat(o *oob, size int) (result, error) {
	p := s.p
	op := s.opcode()
	st := o.watchStop()
	if op == verbs.OpRead {
		if err := st.wait(); err != nil {
			return result{}, err
		}
		return result{}, o.send(0)
	}
	sge := []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(size), LKey: s.mr.LKey()}}
	wr := []verbs.SendWR{{Opcode: op, SGL: sge, RemoteAddr: s.peer.Addr + uint64(s.half), RKey: s.peer.RKey}}
	done, recvd := 0, 0
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
					if _, err := s.poll(&done, &recvd); err != nil {
						return result{}, err
					}
				}
			} else {
				if _, err := s.poll(&done, &recvd); err != nil {
					return result{}, err
				}
				if recvd > i {
					break
				}
			}
			if k&255 == 255 {
				if c, ok := st.stopped(); ok && answered >= c {
					goto finished
				}
			}
		}
		s.buf[size-1] = seq
		wr[0].ID = uint64(i)
		wr[0].Flags = 0
		if i%p.cqMod == p.cqMod-1 {
			wr[0].Flags = verbs.SendSignaled
		}
		if _, err := s.qp.PostSend(wr); err != nil {
			return result{}, err
		}
		answered++
		if op == verbs.OpSend && s.posted < len(s.recvs)/2 {
			if err := s.fillRecvs(size); err != nil {
				return result{}, err
			}
		}
	}
finished:
	if err := st.wait(); err != nil {
		return result{}, err
	}
	lastSig := (answered/p.cqMod)*p.cqMod - 1
	stall := time.Now().Add(p.timeout)
	for done <= lastSig {
		if _, err := s.poll(&done, &recvd); err != nil {
			return result{}, err
		}
		if time.Now().After(stall) {
			return result{}, fmt.Errorf("no completion for %v", p.timeout)
		}
	}
	return result{}, o.send(0)
}
