//go:build linux && cgo

package ibv

/*
#cgo noescape gordma_post_send
#cgo nocallback gordma_post_send
#cgo noescape gordma_post_recv
#cgo nocallback gordma_post_recv
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// qp is an ibv_qp. Posting flattens the Go WRs into pointer-free arrays
// owned by the QP (under mu) and the C shim turns them into one chain.
type qp struct {
	lt   verbs.Lifetime
	pd   *pd
	qp   *C.struct_ibv_qp
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

	sendMu   sync.Mutex
	sendWRs  []C.gordma_send_wr
	sendSGEs []C.struct_ibv_sge
	sendC    *C.struct_ibv_send_wr // C scratch for the chain

	recvMu   sync.Mutex
	recvWRs  []C.gordma_recv_wr
	recvSGEs []C.struct_ibv_sge
	recvC    *C.struct_ibv_recv_wr
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
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq = scq.h.cq
	ia.recv_cq = rcq.h.cq
	if s != nil {
		ia.srq = s.srq
		c.MaxRecvWR, c.MaxRecvSGE = 0, 0
	}
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	ia.qp_type = C.enum_ibv_qp_type(a.Type)
	if a.SignalAll {
		ia.sq_sig_all = 1
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
	h, err := C.gordma_ibv_create_qp(p.h.p, &ia)
	if h == nil {
		dropAll()
		return nil, errnoErr(fmt.Sprintf("ibv_create_qp %v %+v", a.Type, a.Cap), err)
	}
	q := &qp{pd: p, qp: h, typ: a.Type, qpn: uint32(h.qp_num), scq: scq, rcq: rcq, srq: s}
	// ibv_create_qp wrote back what it granted.
	q.cap = verbs.QPCap{
		MaxSendWR:     int(ia.cap.max_send_wr),
		MaxRecvWR:     int(ia.cap.max_recv_wr),
		MaxSendSGE:    int(ia.cap.max_send_sge),
		MaxRecvSGE:    int(ia.cap.max_recv_sge),
		MaxInlineData: int(ia.cap.max_inline_data),
	}
	q.sendWRs = make([]C.gordma_send_wr, q.cap.MaxSendWR)
	q.sendSGEs = make([]C.struct_ibv_sge, q.cap.MaxSendWR*q.cap.MaxSendSGE)
	q.sendC = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(q.cap.MaxSendWR), C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{}))))
	if s == nil {
		q.recvWRs = make([]C.gordma_recv_wr, q.cap.MaxRecvWR)
		q.recvSGEs = make([]C.struct_ibv_sge, q.cap.MaxRecvWR*q.cap.MaxRecvSGE)
		q.recvC = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(q.cap.MaxRecvWR), C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))))
	}
	if q.sendC == nil || (s == nil && q.recvC == nil) {
		q.freeScratch()
		C.gordma_ibv_destroy_qp(h)
		dropAll()
		return nil, fmt.Errorf("ibv: create QP: out of C memory for the WR scratch")
	}
	p.ctx.qps.Store(q.qpn, q)
	return q, nil
}

func (q *qp) freeScratch() {
	C.free(unsafe.Pointer(q.sendC))
	C.free(unsafe.Pointer(q.recvC))
	q.sendC, q.recvC = nil, nil
}

func (q *qp) QPN() uint32        { return q.qpn }
func (q *qp) Type() verbs.QPType { return q.typ }
func (q *qp) Cap() verbs.QPCap   { return q.cap }

func (q *qp) State() (verbs.QPState, error) {
	if !q.lt.Enter() {
		return 0, verbs.ErrClosed
	}
	defer q.lt.Exit()
	var attr C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if rc := C.gordma_ibv_query_qp(q.qp, &attr, C.IBV_QP_STATE, &init); rc != 0 {
		return 0, errnoErr("ibv_query_qp", syscall.Errno(rc))
	}
	st := verbs.QPState(attr.qp_state)
	if st == verbs.StateReset && q.iwarp() {
		// siw before Linux 6.4 leaves qp_state zero in ibv_query_qp:
		// the state is the last one this QP was moved to.
		st = verbs.QPState(q.state.Load())
	}
	return st, nil
}

// modify runs ibv_modify_qp and records the new state.
func (q *qp) modify(attr *C.struct_ibv_qp_attr, mask C.int, to verbs.QPState) error {
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	attr.qp_state = C.enum_ibv_qp_state(to)
	if rc := C.gordma_ibv_modify_qp(q.qp, attr, mask|C.IBV_QP_STATE); rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_modify_qp %v QP %#x to %v", q.typ, q.qpn, to), syscall.Errno(rc))
	}
	q.state.Store(uint32(to))
	return nil
}

func (q *qp) ToInit(a verbs.InitAttr) error {
	var attr C.struct_ibv_qp_attr
	port := a.Port
	if port == 0 {
		port = 1
	}
	q.port = port
	attr.pkey_index = C.uint16_t(a.PKeyIndex)
	attr.port_num = C.uint8_t(port)
	mask := C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT
	if q.typ == verbs.UD {
		attr.qkey = C.uint32_t(a.QKey)
		mask |= C.IBV_QP_QKEY
	} else {
		// A QP's access flags only say which remote operations it
		// accepts; the LOCAL_WRITE rule is for memory regions.
		if err := (a.Access | verbs.AccessLocalWrite).Validate(); err != nil {
			return fmt.Errorf("ibv: QP access: %w", err)
		}
		attr.qp_access_flags = C.uint(a.Access)
		mask |= C.IBV_QP_ACCESS_FLAGS
	}
	return q.modify(&attr, C.int(mask), verbs.StateInit)
}

// fillAH converts an Address into ibv_ah_attr.
func fillAH(ah *C.struct_ibv_ah_attr, d verbs.Address, defPort uint8) {
	ah.dlid = C.uint16_t(d.LID)
	ah.sl = C.uint8_t(d.SL)
	ah.port_num = C.uint8_t(d.Port)
	if d.Port == 0 {
		ah.port_num = C.uint8_t(defPort)
	}
	if !d.GID.IsZero() {
		ah.is_global = 1
		*(*verbs.GID)(unsafe.Pointer(&ah.grh.dgid)) = d.GID
		ah.grh.sgid_index = C.uint8_t(d.SGIDIndex)
		ah.grh.hop_limit = C.uint8_t(d.HopLimit)
		if d.HopLimit == 0 {
			ah.grh.hop_limit = 64
		}
	}
}

func (q *qp) ToRTR(a verbs.RTRAttr) error {
	var attr C.struct_ibv_qp_attr
	mask := 0
	if q.typ != verbs.UD {
		if a.PathMTU.Bytes() == 0 {
			return fmt.Errorf("ibv: QP to RTR: %w: path MTU %v", verbs.ErrInvalid, a.PathMTU)
		}
		attr.path_mtu = C.enum_ibv_mtu(a.PathMTU)
		attr.dest_qp_num = C.uint32_t(a.DestQPN)
		attr.rq_psn = C.uint32_t(a.RQPSN & 0xffffff)
		fillAH(&attr.ah_attr, a.Dest, q.port)
		mask |= C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_DEST_QPN | C.IBV_QP_RQ_PSN
	}
	if q.typ == verbs.RC {
		rd := int(a.MaxDestRdAtomic)
		if rd == 0 {
			rd = min(16, q.pd.ctx.attr.MaxQPRdAtom)
		}
		attr.max_dest_rd_atomic = C.uint8_t(rd)
		attr.min_rnr_timer = C.uint8_t(a.MinRNRTimer)
		mask |= C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER
	}
	return q.modify(&attr, C.int(mask), verbs.StateRTR)
}

func (q *qp) ToRTS(a verbs.RTSAttr) error {
	var attr C.struct_ibv_qp_attr
	attr.sq_psn = C.uint32_t(a.SQPSN & 0xffffff)
	mask := C.IBV_QP_SQ_PSN
	if q.typ == verbs.RC {
		attr.timeout = C.uint8_t(a.Timeout)
		attr.retry_cnt = C.uint8_t(a.RetryCount)
		attr.rnr_retry = C.uint8_t(a.RNRRetry)
		rd := int(a.MaxRdAtomic)
		if rd == 0 {
			rd = min(16, q.pd.ctx.attr.MaxQPInitRdAtom)
		}
		attr.max_rd_atomic = C.uint8_t(rd)
		mask |= C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY | C.IBV_QP_MAX_QP_RD_ATOMIC
	}
	return q.modify(&attr, C.int(mask), verbs.StateRTS)
}

func (q *qp) ToError() error {
	var attr C.struct_ibv_qp_attr
	return q.modify(&attr, 0, verbs.StateError)
}

func (q *qp) ToReset() error {
	var attr C.struct_ibv_qp_attr
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
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= len(q.sendWRs) {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the send queue holds", verbs.ErrQueueFull, len(q.sendWRs))
			break
		}
		if bad = q.checkSend(w); bad != nil {
			break
		}
		d := &q.sendWRs[i]
		d.wr_id = C.uint64_t(w.ID)
		d.remote_addr = C.uint64_t(w.RemoteAddr)
		d.compare_add = C.uint64_t(w.CompareAdd)
		d.swap = C.uint64_t(w.Swap)
		d.ah = 0
		if a, ok := w.AH.(*ah); ok && a != nil {
			d.ah = C.uint64_t(uintptr(unsafe.Pointer(a.ah)))
		}
		d.rkey = C.uint32_t(w.RKey)
		d.imm = C.uint32_t(w.Imm)
		d.remote_qpn = C.uint32_t(w.RemoteQPN)
		d.remote_qkey = C.uint32_t(w.RemoteQKey)
		d.send_flags = C.uint32_t(w.Flags)
		d.num_sge = C.uint16_t(len(w.SGL))
		d.opcode = C.uint8_t(w.Opcode)
		nsge += copy(unsafe.Slice((*verbs.SGE)(unsafe.Pointer(&q.sendSGEs[nsge])), len(q.sendSGEs)-nsge), w.SGL)
		n++
	}
	if n > 0 {
		var posted C.int
		sges := (*C.struct_ibv_sge)(nil)
		if nsge > 0 {
			sges = &q.sendSGEs[0]
		}
		rc := C.gordma_post_send(handle(unsafe.Pointer(q.qp)), handle(unsafe.Pointer(q.sendC)), &q.sendWRs[0], C.int(n), sges, &posted)
		if rc != 0 {
			return int(posted), &verbs.PostError{Op: "post_send", Posted: int(posted), Err: errnoErr("ibv_post_send", syscall.Errno(rc))}
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
	n, err := postRecv(q.qp, nil, q.recvC, q.recvWRs, q.recvSGEs, q.cap.MaxRecvSGE, wrs)
	if n > 0 && verbs.QPState(q.state.Load()) == verbs.StateError {
		// Receives posted to a QP in the error state must flush. rxe
		// queues them without entering the kernel and flushes only on
		// a state change, so make one.
		var attr C.struct_ibv_qp_attr
		attr.qp_state = C.IBV_QPS_ERR
		C.gordma_ibv_modify_qp(q.qp, &attr, C.IBV_QP_STATE)
	}
	return n, err
}

// postRecv flattens and posts a receive chain for a QP or an SRQ.
func postRecv(h *C.struct_ibv_qp, s *C.struct_ibv_srq, scratch *C.struct_ibv_recv_wr, flat []C.gordma_recv_wr, sges []C.struct_ibv_sge, maxSGE int, wrs []verbs.RecvWR) (int, error) {
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= len(flat) {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the receive queue holds", verbs.ErrQueueFull, len(flat))
			break
		}
		if len(w.SGL) > maxSGE {
			bad = fmt.Errorf("%w: %d SGEs, the queue was granted %d", verbs.ErrInvalid, len(w.SGL), maxSGE)
			break
		}
		flat[i].wr_id = C.uint64_t(w.ID)
		flat[i].num_sge = C.uint32_t(len(w.SGL))
		nsge += copy(unsafe.Slice((*verbs.SGE)(unsafe.Pointer(&sges[nsge])), len(sges)-nsge), w.SGL)
		n++
	}
	if n > 0 {
		var posted C.int
		sp := (*C.struct_ibv_sge)(nil)
		if nsge > 0 {
			sp = &sges[0]
		}
		rc := C.gordma_post_recv(handle(unsafe.Pointer(h)), handle(unsafe.Pointer(s)), handle(unsafe.Pointer(scratch)), &flat[0], C.int(n), sp, &posted)
		if rc != 0 {
			return int(posted), &verbs.PostError{Op: "post_recv", Posted: int(posted), Err: errnoErr("ibv_post_recv", syscall.Errno(rc))}
		}
	}
	if bad != nil {
		return n, &verbs.PostError{Op: "post_recv", Posted: n, Err: bad}
	}
	return n, nil
}

func (q *qp) Close() error {
	return q.lt.Close(func() error {
		if rc := C.gordma_ibv_destroy_qp(q.qp); rc != 0 {
			return errnoErr("ibv_destroy_qp", syscall.Errno(rc))
		}
		q.freeScratch()
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
	ah *C.struct_ibv_ah
}

func (p *pd) CreateAH(d verbs.Address) (verbs.AH, error) {
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	var attr C.struct_ibv_ah_attr
	fillAH(&attr, d, 1)
	h, err := C.gordma_ibv_create_ah(p.h.p, &attr)
	if h == nil {
		p.lt.DropChild()
		return nil, errnoErr("ibv_create_ah", err)
	}
	return &ah{pd: p, ah: h}, nil
}

func (a *ah) Close() error {
	return a.lt.Close(func() error {
		if rc := C.gordma_ibv_destroy_ah(a.ah); rc != 0 {
			return errnoErr("ibv_destroy_ah", syscall.Errno(rc))
		}
		a.pd.lt.DropChild()
		return nil
	})
}

// handle passes a C object to a hot-path helper of shim.h as an integer,
// so that cgo does not check at each call whether it points into Go
// memory (it never does: these objects are libibverbs').
func handle(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }
