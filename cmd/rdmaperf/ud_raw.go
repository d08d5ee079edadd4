package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// udQKey is the Q_Key of the raw path's UD QPs: perftest's (DEF_QKEY).
const udQKey = 0x11111111

// udQuiet is how long the receiver of send_bw over UD goes on waiting
// for datagrams once the client's count has arrived and some are
// missing: UD tells nobody that a datagram was lost, so only a quiet
// spell says that the rest will not come. The rate is over the first to
// the last datagram received, so the wait is not in it.
const udQuiet = 100 * time.Millisecond

// setupRawUD is setupRaw for -c UD: one UD QP in RTS, the peer's QPN,
// GID and MTU learnt over TCP and an address handle to it; the buffer's
// halves are at least a GRH plus the largest size, so that a receive
// (its GRH, then the payload) fits in one SGE, as perftest posts them.
func setupRawUD(ctx context.Context, p *params, o *oob) (s *rawSide, err error) {
	s = &rawSide{p: p, run: ctx, wc: make([]verbs.WorkCompletion, 128)}
	side := s // the returns below set s to nil
	defer func() {
		if err != nil {
			side.close()
		}
	}()
	d, err := s.open()
	if err != nil {
		return nil, err
	}
	qp, err := s.pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: p.txDepth + 16, MaxRecvWR: p.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: p.inline}})
	if err != nil {
		if p.inline > 0 {
			return nil, fmt.Errorf("-I %d: create UD QP with %d bytes of inline data: %w", p.inline, p.inline, err)
		}
		return nil, fmt.Errorf("create UD QP: %w", err)
	}
	if p.wrapQP != nil {
		qp = p.wrapQP(qp)
	}
	q := &rawQP{qp: qp}
	s.qps = append(s.qps, q)
	if got := qp.Cap().MaxInlineData; got < p.inline {
		return nil, fmt.Errorf("-I %d: %s grants only %d bytes of inline data per WR", p.inline, d.info.Name, got)
	}
	if err = qp.ToInit(verbs.InitAttr{Port: uint8(p.ibPort), QKey: udQKey}); err != nil {
		return nil, err
	}
	if err = qp.ToRTR(verbs.RTRAttr{}); err != nil {
		return nil, err
	}
	if err = qp.ToRTS(verbs.RTSAttr{SQPSN: rand.Uint32() & 0xffffff}); err != nil {
		return nil, err
	}
	var peerQPs uint32 // as setupRaw: both sides must run one QP
	if err = o.exchange(uint32(p.qps), &peerQPs); err != nil {
		return nil, err
	}
	if peerQPs != 1 {
		return nil, fmt.Errorf("-c UD: the peer runs -q %d (or RC)", peerQPs)
	}
	me := peerInfo{QPN: qp.QPN(), LID: d.port.LID, MTU: uint16(d.port.ActiveMTU), GID: d.gid.GID}
	if err = o.exchange(me, &q.peer); err != nil {
		return nil, err
	}
	// Both sides take the smaller MTU, so that -a runs the same sizes.
	mtu := min(d.port.ActiveMTU, verbs.MTU(q.peer.MTU))
	if err = p.setUDMTU(mtu.Bytes(), fmt.Sprintf("the active MTU of %s and of its peer", d.info.Name)); err != nil {
		return nil, err
	}
	if q.ah, err = s.pd.CreateAH(verbs.Address{Port: uint8(p.ibPort), LID: q.peer.LID, GID: q.peer.GID,
		SGIDIndex: uint8(d.gid.Index), HopLimit: 64}); err != nil {
		return nil, fmt.Errorf("address handle to the peer: %w", err)
	}
	s.half = (p.maxSize() + verbs.GRHSize + 63) &^ 63
	if s.buf, err = mem.Map(2 * s.half); err != nil {
		return nil, err
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	s.recvs = make([]verbs.RecvWR, p.rxDepth)
	s.rsge = make([]verbs.SGE, p.rxDepth)
	return s, nil
}

// address addresses a send WR to the QP's peer: over UD its address
// handle, QPN and Q_Key; over RC the QP is connected already.
func (q *rawQP) address(wr *verbs.SendWR) {
	if q.ah != nil {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = q.ah, q.peer.QPN, udQKey
	}
}

// serveUD is the receiver of send_bw over UD. As serve's, it keeps rx
// depth receives posted and counts what arrives, but it cannot wait for
// the client's count: a datagram that found no receive posted is gone
// (UD has no flow control; perftest's ib_send_bw -c UD does the same).
// Once the count has arrived it takes what still comes until udQuiet
// passes without a datagram, and reports the datagrams received over
// the time from the first to the last, and how many of those sent did
// not arrive.
func (s *rawSide) serveUD(o *oob, size int) (result, error) {
	p := s.p
	st := o.watchStop(s.run)
	m := newBWMeter(p, size)
	var last, stopped time.Time
	sent, idle := -1, 0
	for {
		n, err := s.next(st.ctx)
		if err != nil {
			return result{}, err
		}
		if n > 0 {
			idle = 0
			now := time.Now()
			if last.IsZero() {
				m.begin(now) // from the first receive
			}
			last = now
			m.progress(now, s.recvd)
			if err := s.refillRecvs(); err != nil {
				return result{}, err
			}
		}
		if sent < 0 {
			c, ok := st.stopped()
			if !ok {
				continue
			}
			sent, stopped = c, time.Now()
		}
		if s.recvd >= sent {
			break
		}
		// Read the clock every 1024 empty polls only, as the client
		// does: in a VM it may cost a trap.
		if idle++; n > 0 || idle&1023 != 0 {
			continue
		}
		if time.Since(stopped) > udQuiet && time.Since(last) > udQuiet {
			break
		}
	}
	if err := st.wait(); err != nil {
		return result{}, err
	}
	if err := s.fillRecvs(0); err != nil {
		return result{}, err
	}
	// A rate needs two datagrams: one alone spans no time.
	r := result{Test: p.test, API: p.api, Bytes: size, Iters: s.recvd}
	if s.recvd > 1 {
		r = m.result(p, size, s.recvd, last)
	}
	r.Sent, r.Dropped = sent, sent-s.recvd
	return r, o.send(0)
}
