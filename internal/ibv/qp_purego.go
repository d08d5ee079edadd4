//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// qp is an ibv_qp. Posting writes the chain into scratch owned by the QP
// (under sendMu or recvMu) and posts it with one call of the QP's op.
type qp struct {
	lt   verbs.Lifetime
	pd   *pd
	qp   uintptr // struct ibv_qp *
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

	sendMu  sync.Mutex
	sendOp  uintptr // the context's post_send
	sendWRs *chain[ibvSendWR]
	recvMu  sync.Mutex
	recvOp  uintptr // the context's post_recv
	recvWRs *chain[ibvRecvWR]
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
	var ia ibvQPInitAttr
	ia.sendCQ = scq.h.cq
	ia.recvCQ = rcq.h.cq
	if s != nil {
		ia.srq = s.srq
		c.MaxRecvWR, c.MaxRecvSGE = 0, 0
	}
	ia.cap = ibvQPCap{
		maxSendWR:     uint32(c.MaxSendWR),
		maxRecvWR:     uint32(c.MaxRecvWR),
		maxSendSGE:    uint32(c.MaxSendSGE),
		maxRecvSGE:    uint32(c.MaxRecvSGE),
		maxInlineData: uint32(c.MaxInlineData),
	}
	ia.qpType = uint32(a.Type)
	if a.SignalAll {
		ia.sqSigAll = 1
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
	h, err := ccallErrno(ibv.createQP, p.h.p, uintptr(unsafe.Pointer(&ia)))
	if h == 0 {
		dropAll()
		return nil, errnoErr(fmt.Sprintf("ibv_create_qp %v %+v", a.Type, a.Cap), err)
	}
	q := &qp{pd: p, qp: h, typ: a.Type, qpn: *at[uint32](h, offQPNum), scq: scq, rcq: rcq, srq: s,
		sendOp: *at[uintptr](p.ctx.h.c, offOpPostSend), recvOp: *at[uintptr](p.ctx.h.c, offOpPostRecv)}
	// ibv_create_qp wrote back what it granted.
	q.cap = verbs.QPCap{
		MaxSendWR:     int(ia.cap.maxSendWR),
		MaxRecvWR:     int(ia.cap.maxRecvWR),
		MaxSendSGE:    int(ia.cap.maxSendSGE),
		MaxRecvSGE:    int(ia.cap.maxRecvSGE),
		MaxInlineData: int(ia.cap.maxInlineData),
	}
	q.sendWRs, err = newChain[ibvSendWR](q.cap.MaxSendWR, q.cap.MaxSendSGE)
	if err == nil && s == nil {
		q.recvWRs, err = newChain[ibvRecvWR](q.cap.MaxRecvWR, q.cap.MaxRecvSGE)
	}
	if err != nil {
		q.sendWRs.free()
		ccall(ibv.destroyQP, h)
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
	var attr ibvQPAttr
	var init ibvQPInitAttr
	if rc := int32(ccall(ibv.queryQP, q.qp, uintptr(unsafe.Pointer(&attr)), ibvQPState, uintptr(unsafe.Pointer(&init)))); rc != 0 {
		return 0, errnoErr("ibv_query_qp", syscall.Errno(rc))
	}
	st := verbs.QPState(attr.qpState)
	if st == verbs.StateReset && q.iwarp() {
		// siw before Linux 6.4 leaves qp_state zero in ibv_query_qp:
		// the state is the last one this QP was moved to (as qp.go).
		st = verbs.QPState(q.state.Load())
	}
	return st, nil
}

// modify runs ibv_modify_qp and records the new state.
func (q *qp) modify(attr *ibvQPAttr, mask int, to verbs.QPState) error {
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	attr.qpState = uint32(to)
	if rc := int32(ccall(ibv.modifyQP, q.qp, uintptr(unsafe.Pointer(attr)), uintptr(mask|ibvQPState))); rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_modify_qp %v QP %#x to %v", q.typ, q.qpn, to), syscall.Errno(rc))
	}
	q.state.Store(uint32(to))
	return nil
}

func (q *qp) ToInit(a verbs.InitAttr) error {
	var attr ibvQPAttr
	port := a.Port
	if port == 0 {
		port = 1
	}
	q.port = port
	attr.pkeyIndex = a.PKeyIndex
	attr.portNum = port
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
		attr.qpAccessFlags = uint32(a.Access)
		mask |= ibvQPAccessFlags
	}
	return q.modify(&attr, mask, verbs.StateInit)
}

// fillAH converts an Address into ibv_ah_attr.
func fillAH(ah *ibvAHAttr, d verbs.Address, defPort uint8) {
	ah.dlid = d.LID
	ah.sl = d.SL
	ah.portNum = d.Port
	if d.Port == 0 {
		ah.portNum = defPort
	}
	if !d.GID.IsZero() {
		ah.isGlobal = 1
		*(*verbs.GID)(unsafe.Pointer(&ah.dgid)) = d.GID
		ah.sgidIndex = d.SGIDIndex
		ah.hopLimit = d.HopLimit
		if d.HopLimit == 0 {
			ah.hopLimit = 64
		}
	}
}

func (q *qp) ToRTR(a verbs.RTRAttr) error {
	var attr ibvQPAttr
	mask := 0
	if q.typ != verbs.UD {
		if a.PathMTU.Bytes() == 0 {
			return fmt.Errorf("ibv: QP to RTR: %w: path MTU %v", verbs.ErrInvalid, a.PathMTU)
		}
		attr.pathMTU = uint32(a.PathMTU)
		attr.destQPNum = a.DestQPN
		attr.rqPSN = a.RQPSN & 0xffffff
		fillAH(&attr.ahAttr, a.Dest, q.port)
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
	return q.modify(&attr, mask, verbs.StateRTR)
}

func (q *qp) ToRTS(a verbs.RTSAttr) error {
	var attr ibvQPAttr
	attr.sqPSN = a.SQPSN & 0xffffff
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
	return q.modify(&attr, mask, verbs.StateRTS)
}

func (q *qp) ToError() error {
	var attr ibvQPAttr
	return q.modify(&attr, 0, verbs.StateError)
}

func (q *qp) ToReset() error {
	var attr ibvQPAttr
	return q.modify(&attr, 0, verbs.StateReset)
}

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
	c := q.sendWRs
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= len(c.wrs) {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the send queue holds", verbs.ErrQueueFull, len(c.wrs))
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
		if posted, errno := c.post(q.sendOp, q.qp, n); errno != 0 {
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
	n, err := postRecv(q.recvOp, q.qp, q.recvWRs, q.cap.MaxRecvSGE, wrs)
	if n > 0 && verbs.QPState(q.state.Load()) == verbs.StateError {
		// Receives posted to a QP in the error state must flush. rxe
		// queues them without entering the kernel and flushes only on
		// a state change, so make one.
		var attr ibvQPAttr
		attr.qpState = ibvQPSErr
		ccall(ibv.modifyQP, q.qp, uintptr(unsafe.Pointer(&attr)), ibvQPState)
	}
	return n, err
}

func (q *qp) Close() error {
	return q.lt.Close(func() error {
		if rc := int32(ccall(ibv.destroyQP, q.qp)); rc != 0 {
			return errnoErr("ibv_destroy_qp", syscall.Errno(rc))
		}
		q.sendMu.Lock()
		q.sendWRs.free()
		q.sendMu.Unlock()
		q.recvMu.Lock()
		q.recvWRs.free()
		q.recvMu.Unlock()
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
	ah uintptr // struct ibv_ah *
}

func (p *pd) CreateAH(d verbs.Address) (verbs.AH, error) {
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	var attr ibvAHAttr
	fillAH(&attr, d, 1)
	h, err := ccallErrno(ibv.createAH, p.h.p, uintptr(unsafe.Pointer(&attr)))
	if h == 0 {
		p.lt.DropChild()
		return nil, errnoErr("ibv_create_ah", err)
	}
	return &ah{pd: p, ah: h}, nil
}

func (a *ah) Close() error {
	return a.lt.Close(func() error {
		if rc := int32(ccall(ibv.destroyAH, a.ah)); rc != 0 {
			return errnoErr("ibv_destroy_ah", syscall.Errno(rc))
		}
		a.pd.lt.DropChild()
		return nil
	})
}
