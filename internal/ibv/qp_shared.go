//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// qp is an ibv_qp. Posting writes the chain into the queue's sendChain
// or recvChain, scratch the QP owns (under sendMu or recvMu), and posts
// it with one call into C.
type qp struct {
	lt   verbs.Lifetime
	pd   *pd
	h    qpHandle
	typ  verbs.QPType
	cap  verbs.QPCap
	qpn  uint32
	scq  *cq
	rcq  *cq
	srq  *srq
	port uint8

	// state as last set through this QP; posting checks it so a post
	// in RESET, INIT or RTR fails at the call on every provider.
	state atomic.Uint32

	sendMu sync.Mutex
	send   *sendChain
	recvMu sync.Mutex
	recv   *recvChain // nil with an SRQ

	// groups are the multicast groups the QP is attached to, each with
	// the IP membership that joined it, if any (mcast_shared.go).
	mcMu   sync.Mutex
	groups map[verbs.GID]io.Closer
}

func (p *pd) CreateQP(a verbs.QPInit) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.ctx != p.ctx || rcq.ctx != p.ctx {
		return nil, fmt.Errorf("ibv: create QP: %w: send and receive CQs must be CQs of the same device", verbs.ErrInvalid)
	}
	if a.Type != verbs.RC && a.Type != verbs.UC && a.Type != verbs.UD {
		return nil, fmt.Errorf("ibv: create QP: %w: type %v", verbs.ErrInvalid, a.Type)
	}
	var s *srq
	if a.SRQ != nil {
		var ok bool
		if s, ok = a.SRQ.(*srq); !ok || s.pd.ctx != p.ctx {
			return nil, fmt.Errorf("ibv: create QP: %w: SRQ of another device or provider", verbs.ErrInvalid)
		}
	}
	c := a.Cap
	if c.MaxSendWR <= 0 || c.MaxSendSGE <= 0 || (s == nil && (c.MaxRecvWR <= 0 || c.MaxRecvSGE <= 0)) || c.MaxInlineData < 0 {
		return nil, fmt.Errorf("ibv: create QP: %w: capacities %+v must be positive", verbs.ErrInvalid, c)
	}
	var sh srqHandle
	if s != nil {
		sh = s.h
		c.MaxRecvWR, c.MaxRecvSGE = 0, 0
	}
	// Register as a child everywhere first, so a racing Close of a parent
	// cannot destroy it under the new QP.
	parents := []*verbs.Lifetime{&p.lt, &scq.lt, &rcq.lt}
	if s != nil {
		parents = append(parents, &s.lt)
	}
	for i, l := range parents {
		if err := l.AddChild(); err != nil {
			for _, l := range parents[:i] {
				l.DropChild()
			}
			return nil, err
		}
	}
	dropAll := func() {
		for _, l := range parents {
			l.DropChild()
		}
	}
	h, qpn, granted, err := p.h.createQP(&scq.h, &rcq.h, sh, a.Type, c, a.SignalAll)
	if err != nil {
		dropAll()
		return nil, errnoErr(fmt.Sprintf("ibv_create_qp %v %+v", a.Type, a.Cap), err)
	}
	q := &qp{pd: p, h: h, typ: a.Type, cap: granted, qpn: qpn, scq: scq, rcq: rcq, srq: s}
	q.send, err = newSendChain(p.ctx.h, h, q.cap.MaxSendWR, q.cap.MaxSendSGE)
	if err == nil && s == nil {
		q.recv, err = newRecvChain(p.ctx.h, h, q.cap.MaxRecvWR, q.cap.MaxRecvSGE)
	}
	if err != nil {
		if q.send != nil {
			q.send.free()
		}
		h.destroy()
		dropAll()
		return nil, fmt.Errorf("ibv: create QP: %w", err)
	}
	p.ctx.qps.Store(q.qpn, q)
	return q, nil
}

func (q *qp) QPN() uint32        { return q.qpn }
func (q *qp) Type() verbs.QPType { return q.typ }
func (q *qp) Cap() verbs.QPCap   { return q.cap }

func (q *qp) State() (verbs.QPState, error) {
	if !q.lt.Enter() {
		return 0, verbs.ErrClosed
	}
	defer q.lt.Exit()
	st, err := q.h.queryState()
	if err != nil {
		return 0, errnoErr("ibv_query_qp", err)
	}
	if st == verbs.StateReset && q.iwarp() {
		// siw before Linux 6.4 leaves qp_state zero in ibv_query_qp:
		// the state is the last one this QP was moved to.
		st = verbs.QPState(q.state.Load())
	}
	return st, nil
}

// The bits of enum ibv_qp_attr_mask this package sets (abi_cgo.go
// checks them against abi.h).
const (
	ibvQPState           = 1 << 0
	ibvQPAccessFlags     = 1 << 3
	ibvQPPKeyIndex       = 1 << 4
	ibvQPPort            = 1 << 5
	ibvQPQKey            = 1 << 6
	ibvQPAV              = 1 << 7
	ibvQPPathMTU         = 1 << 8
	ibvQPTimeout         = 1 << 9
	ibvQPRetryCnt        = 1 << 10
	ibvQPRNRRetry        = 1 << 11
	ibvQPRQPSN           = 1 << 12
	ibvQPMaxQPRdAtomic   = 1 << 13
	ibvQPMinRNRTimer     = 1 << 15
	ibvQPSQPSN           = 1 << 16
	ibvQPMaxDestRdAtomic = 1 << 17
	ibvQPDestQPN         = 1 << 20
)

// qpAttrs are the fields of struct ibv_qp_attr that ToInit, ToRTR and
// ToRTS set, as Go values; qpAttr.set copies them into the binding's
// struct.
type qpAttrs struct {
	pkeyIndex       uint16
	port            uint8
	qkey            uint32
	access          uint32
	pathMTU         uint32
	destQPN         uint32
	rqPSN           uint32
	ah              ahAttrs
	maxDestRdAtomic uint8
	minRNRTimer     uint8
	sqPSN           uint32
	timeout         uint8
	retryCnt        uint8
	rnrRetry        uint8
	maxRdAtomic     uint8
}

// ahAttrs are the fields of struct ibv_ah_attr this package sets.
type ahAttrs struct {
	dlid      uint16
	sl        uint8
	port      uint8
	global    bool // is_global: the GRH fields below are set
	dgid      verbs.GID
	sgidIndex uint8
	hopLimit  uint8
}

// ahAttrsOf converts an Address, on defPort when it names no port.
func ahAttrsOf(d verbs.Address, defPort uint8) ahAttrs {
	a := ahAttrs{dlid: d.LID, sl: d.SL, port: d.Port}
	if d.Port == 0 {
		a.port = defPort
	}
	if !d.GID.IsZero() {
		a.global = true
		a.dgid = d.GID
		a.sgidIndex = d.SGIDIndex
		a.hopLimit = d.HopLimit
		if d.HopLimit == 0 {
			a.hopLimit = 64
		}
	}
	return a
}

// modify runs ibv_modify_qp and records the new state.
func (q *qp) modify(attr *qpAttr, mask int, to verbs.QPState) error {
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	attr.setState(to)
	if err := q.h.modify(attr, mask|ibvQPState); err != nil {
		return errnoErr(fmt.Sprintf("ibv_modify_qp %v QP %#x to %v", q.typ, q.qpn, to), err)
	}
	q.state.Store(uint32(to))
	return nil
}

// modifyTo is modify with the attributes a.
func (q *qp) modifyTo(a *qpAttrs, mask int, to verbs.QPState) error {
	var attr qpAttr
	attr.set(a)
	return q.modify(&attr, mask, to)
}

func (q *qp) ToInit(a verbs.InitAttr) error {
	port := a.Port
	if port == 0 {
		port = 1
	}
	q.port = port
	attr := qpAttrs{pkeyIndex: a.PKeyIndex, port: port}
	mask := ibvQPPKeyIndex | ibvQPPort
	if q.typ == verbs.UD {
		attr.qkey = a.QKey
		mask |= ibvQPQKey
	} else {
		// A QP's access flags only say which remote operations it
		// accepts; the LOCAL_WRITE rule is for memory regions.
		if err := (a.Access | verbs.AccessLocalWrite).Validate(); err != nil {
			return fmt.Errorf("ibv: QP access: %w", err)
		}
		attr.access = uint32(a.Access)
		mask |= ibvQPAccessFlags
	}
	return q.modifyTo(&attr, mask, verbs.StateInit)
}

func (q *qp) ToRTR(a verbs.RTRAttr) error {
	var attr qpAttrs
	mask := 0
	if q.typ != verbs.UD {
		if a.PathMTU.Bytes() == 0 {
			return fmt.Errorf("ibv: QP to RTR: %w: path MTU %v", verbs.ErrInvalid, a.PathMTU)
		}
		attr.pathMTU = uint32(a.PathMTU)
		attr.destQPN = a.DestQPN
		attr.rqPSN = a.RQPSN & 0xffffff
		attr.ah = ahAttrsOf(a.Dest, q.port)
		mask |= ibvQPAV | ibvQPPathMTU | ibvQPDestQPN | ibvQPRQPSN
	}
	if q.typ == verbs.RC {
		rd := int(a.MaxDestRdAtomic)
		if rd == 0 {
			rd = min(16, q.pd.ctx.attr.MaxQPRdAtom)
		}
		attr.maxDestRdAtomic = uint8(rd)
		attr.minRNRTimer = a.MinRNRTimer
		mask |= ibvQPMaxDestRdAtomic | ibvQPMinRNRTimer
	}
	return q.modifyTo(&attr, mask, verbs.StateRTR)
}

func (q *qp) ToRTS(a verbs.RTSAttr) error {
	attr := qpAttrs{sqPSN: a.SQPSN & 0xffffff}
	mask := ibvQPSQPSN
	if q.typ == verbs.RC {
		attr.timeout = a.Timeout
		attr.retryCnt = a.RetryCount
		attr.rnrRetry = a.RNRRetry
		rd := int(a.MaxRdAtomic)
		if rd == 0 {
			rd = min(16, q.pd.ctx.attr.MaxQPInitRdAtom)
		}
		attr.maxRdAtomic = uint8(rd)
		mask |= ibvQPTimeout | ibvQPRetryCnt | ibvQPRNRRetry | ibvQPMaxQPRdAtomic
	}
	return q.modifyTo(&attr, mask, verbs.StateRTS)
}

func (q *qp) ToError() error { return q.modifyTo(&qpAttrs{}, 0, verbs.StateError) }
func (q *qp) ToReset() error { return q.modifyTo(&qpAttrs{}, 0, verbs.StateReset) }

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if !q.lt.Enter() {
		return 0, &verbs.PostError{Op: "post_send", Err: verbs.ErrClosed}
	}
	defer q.lt.Exit()
	if s := verbs.QPState(q.state.Load()); !sendable(s) {
		return 0, &verbs.PostError{Op: "post_send", Err: fmt.Errorf("%w: QP %#x is %v, sends need RTS", verbs.ErrQPState, q.qpn, s)}
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	c := q.send
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= q.cap.MaxSendWR {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the send queue holds", verbs.ErrQueueFull, q.cap.MaxSendWR)
			break
		}
		if bad = q.checkSend(w); bad != nil {
			break
		}
		c.fillSend(i, nsge, w)
		nsge += len(w.SGL)
		n++
	}
	if n > 0 {
		if posted, errno := c.post(n, nsge); errno != 0 {
			return posted, &verbs.PostError{Op: "post_send", Posted: posted, Err: errnoErr("ibv_post_send", errno)}
		}
	}
	if bad != nil {
		return n, &verbs.PostError{Op: "post_send", Posted: n, Err: bad}
	}
	return n, nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if !q.lt.Enter() {
		return 0, &verbs.PostError{Op: "post_recv", Err: verbs.ErrClosed}
	}
	defer q.lt.Exit()
	if q.srq != nil {
		return 0, &verbs.PostError{Op: "post_recv", Err: fmt.Errorf("%w: QP %#x takes its receives from an SRQ", verbs.ErrInvalid, q.qpn)}
	}
	if s := verbs.QPState(q.state.Load()); s == verbs.StateReset {
		return 0, &verbs.PostError{Op: "post_recv", Err: fmt.Errorf("%w: QP %#x is RESET", verbs.ErrQPState, q.qpn)}
	}
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	n, err := postRecv(q.recv, q.cap.MaxRecvWR, q.cap.MaxRecvSGE, wrs)
	if n > 0 && verbs.QPState(q.state.Load()) == verbs.StateError {
		q.flushRecvs()
	}
	return n, err
}

// flushRecvs makes the receives just posted to a QP in the error state
// flush, as they must. rxe queues them without entering the kernel and
// flushes only on a state change, so make one.
func (q *qp) flushRecvs() {
	var attr qpAttr
	attr.setState(verbs.StateError)
	q.h.modify(&attr, ibvQPState)
}

// postRecv writes and posts a receive chain through c, a QP's or an
// SRQ's, which holds maxWR WRs of maxSGE SGEs.
func postRecv(c *recvChain, maxWR, maxSGE int, wrs []verbs.RecvWR) (int, error) {
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= maxWR {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the receive queue holds", verbs.ErrQueueFull, maxWR)
			break
		}
		if len(w.SGL) > maxSGE {
			bad = fmt.Errorf("%w: %d SGEs, the queue was granted %d", verbs.ErrInvalid, len(w.SGL), maxSGE)
			break
		}
		c.fillRecv(i, nsge, w)
		nsge += len(w.SGL)
		n++
	}
	if n > 0 {
		if posted, errno := c.post(n, nsge); errno != 0 {
			return posted, &verbs.PostError{Op: "post_recv", Posted: posted, Err: errnoErr("ibv_post_recv", errno)}
		}
	}
	if bad != nil {
		return n, &verbs.PostError{Op: "post_recv", Posted: n, Err: bad}
	}
	return n, nil
}

func (q *qp) Close() error {
	return q.lt.Close(func() error {
		if err := q.h.destroy(); err != nil {
			return errnoErr("ibv_destroy_qp", err)
		}
		q.leaveAll()
		q.sendMu.Lock()
		q.send.free()
		q.sendMu.Unlock()
		if q.recv != nil {
			q.recvMu.Lock()
			q.recv.free()
			q.recvMu.Unlock()
		}
		q.pd.ctx.qps.CompareAndDelete(q.qpn, q)
		q.pd.lt.DropChild()
		q.scq.lt.DropChild()
		q.rcq.lt.DropChild()
		if q.srq != nil {
			q.srq.lt.DropChild()
		}
		return nil
	})
}

// ah is an ibv_ah.
type ah struct {
	lt verbs.Lifetime
	pd *pd
	h  ahHandle
}

func (p *pd) CreateAH(d verbs.Address) (verbs.AH, error) {
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	attr := ahAttrsOf(d, 1)
	h, err := p.h.createAH(&attr)
	if err != nil {
		p.lt.DropChild()
		return nil, errnoErr("ibv_create_ah", err)
	}
	return &ah{pd: p, h: h}, nil
}

func (a *ah) Close() error {
	return a.lt.Close(func() error {
		if err := a.h.destroy(); err != nil {
			return errnoErr("ibv_destroy_ah", err)
		}
		a.pd.lt.DropChild()
		return nil
	})
}
