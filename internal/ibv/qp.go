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
	"errors"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The cgo binding's calls into libibverbs for QPs and address handles,
// and its post path; qp_shared.go drives them.

// qpHandle is a struct ibv_qp.
type qpHandle struct{ qp *C.struct_ibv_qp }

// createQP creates a QP on the CQs, and srq unless it is the zero
// srqHandle, and returns it, its number and the capacities granted.
func (h pdHandle) createQP(scq, rcq *cqHandle, srq srqHandle, typ verbs.QPType, c verbs.QPCap, signalAll bool) (qpHandle, uint32, verbs.QPCap, error) {
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq = scq.cq
	ia.recv_cq = rcq.cq
	ia.srq = srq.srq
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	ia.qp_type = C.enum_ibv_qp_type(typ)
	if signalAll {
		ia.sq_sig_all = 1
	}
	q, err := C.gordma_ibv_create_qp(h.p, &ia)
	if q == nil {
		return qpHandle{}, 0, verbs.QPCap{}, callErr(err)
	}
	// ibv_create_qp wrote back what it granted.
	return qpHandle{q}, uint32(q.qp_num), verbs.QPCap{
		MaxSendWR:     int(ia.cap.max_send_wr),
		MaxRecvWR:     int(ia.cap.max_recv_wr),
		MaxSendSGE:    int(ia.cap.max_send_sge),
		MaxRecvSGE:    int(ia.cap.max_recv_sge),
		MaxInlineData: int(ia.cap.max_inline_data),
	}, nil
}

func (h qpHandle) queryState() (verbs.QPState, error) {
	var attr C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if rc := C.gordma_ibv_query_qp(h.qp, &attr, C.IBV_QP_STATE, &init); rc != 0 {
		return 0, syscall.Errno(rc)
	}
	return verbs.QPState(attr.qp_state), nil
}

func (h qpHandle) modify(attr *qpAttr, mask int) error {
	return rcErr(int32(C.gordma_ibv_modify_qp(h.qp, (*C.struct_ibv_qp_attr)(attr), C.int(mask))))
}

func (h qpHandle) destroy() error { return rcErr(int32(C.gordma_ibv_destroy_qp(h.qp))) }

// qpAttr is a struct ibv_qp_attr, what qpHandle.modify takes: filled
// from qpAttrs by set, or by rdma_init_qp_attr (cmHandles.initQPAttr).
type qpAttr C.struct_ibv_qp_attr

func (a *qpAttr) set(v *qpAttrs) {
	a.pkey_index = C.uint16_t(v.pkeyIndex)
	a.port_num = C.uint8_t(v.port)
	a.qkey = C.uint32_t(v.qkey)
	a.qp_access_flags = C.uint(v.access)
	a.path_mtu = C.enum_ibv_mtu(v.pathMTU)
	a.dest_qp_num = C.uint32_t(v.destQPN)
	a.rq_psn = C.uint32_t(v.rqPSN)
	setAH(&a.ah_attr, &v.ah)
	a.max_dest_rd_atomic = C.uint8_t(v.maxDestRdAtomic)
	a.min_rnr_timer = C.uint8_t(v.minRNRTimer)
	a.sq_psn = C.uint32_t(v.sqPSN)
	a.timeout = C.uint8_t(v.timeout)
	a.retry_cnt = C.uint8_t(v.retryCnt)
	a.rnr_retry = C.uint8_t(v.rnrRetry)
	a.max_rd_atomic = C.uint8_t(v.maxRdAtomic)
}

func (a *qpAttr) setState(s verbs.QPState)   { a.qp_state = C.enum_ibv_qp_state(s) }
func (a *qpAttr) setMaxDestRdAtomic(v uint8) { a.max_dest_rd_atomic = C.uint8_t(v) }
func (a *qpAttr) setMaxRdAtomic(v uint8)     { a.max_rd_atomic = C.uint8_t(v) }
func (a *qpAttr) port() uint8                { return uint8(a.port_num) }

// setAH copies v into ah; the GRH only when v is global.
func setAH(ah *C.struct_ibv_ah_attr, v *ahAttrs) {
	ah.dlid = C.uint16_t(v.dlid)
	ah.sl = C.uint8_t(v.sl)
	ah.port_num = C.uint8_t(v.port)
	if v.global {
		ah.is_global = 1
		*(*verbs.GID)(unsafe.Pointer(&ah.grh.dgid)) = v.dgid
		ah.grh.sgid_index = C.uint8_t(v.sgidIndex)
		ah.grh.hop_limit = C.uint8_t(v.hopLimit)
	}
}

// ahHandle is a struct ibv_ah.
type ahHandle struct{ ah *C.struct_ibv_ah }

func (h pdHandle) createAH(v *ahAttrs) (ahHandle, error) {
	var attr C.struct_ibv_ah_attr
	setAH(&attr, v)
	a, err := C.gordma_ibv_create_ah(h.p, &attr)
	if a == nil {
		return ahHandle{}, callErr(err)
	}
	return ahHandle{a}, nil
}

func (h ahHandle) destroy() error { return rcErr(int32(C.gordma_ibv_destroy_ah(h.ah))) }

// mcast calls ibv_attach_mcast (attach) or ibv_detach_mcast.
func (h qpHandle) mcast(attach bool, gid *verbs.GID, lid uint16) error {
	g := (*C.union_ibv_gid)(unsafe.Pointer(gid))
	if attach {
		return rcErr(int32(C.gordma_ibv_attach_mcast(h.qp, g, C.uint16_t(lid))))
	}
	return rcErr(int32(C.gordma_ibv_detach_mcast(h.qp, g, C.uint16_t(lid))))
}

var errNoCMemory = errors.New("out of C memory for the WR scratch")

// chain is where a queue's posts are built, a sendChain's or a
// recvChain's: pointer-free WRs and their SGEs in Go memory, from which
// gordma_post_send or gordma_post_recv builds the chain of struct
// ibv_send_wr or ibv_recv_wr in scratch, C memory the chain owns, and
// posts it in one call.
type chain[WR C.gordma_send_wr | C.gordma_recv_wr] struct {
	wrs     []WR
	sges    []C.struct_ibv_sge
	scratch unsafe.Pointer
}

// newChain makes room for maxWR WRs of maxSGE SGEs, each built in
// cSize bytes of scratch.
func newChain[WR C.gordma_send_wr | C.gordma_recv_wr](maxWR, maxSGE int, cSize uintptr) (chain[WR], error) {
	scratch := C.calloc(C.size_t(maxWR), C.size_t(cSize))
	if scratch == nil {
		return chain[WR]{}, errNoCMemory
	}
	return chain[WR]{wrs: make([]WR, maxWR), sges: make([]C.struct_ibv_sge, maxWR*maxSGE), scratch: scratch}, nil
}

func (c *chain[WR]) free() {
	C.free(c.scratch)
	c.scratch = nil
}

// copySGEs copies a WR's SGEs into the chain's from nsge on.
func (c *chain[WR]) copySGEs(nsge int, sgl []verbs.SGE) {
	copy(unsafe.Slice((*verbs.SGE)(unsafe.Pointer(&c.sges[nsge])), len(c.sges)-nsge), sgl)
}

// sgeArg is the SGE array of a post of nsge SGEs: nil for none.
func (c *chain[WR]) sgeArg(nsge int) *C.struct_ibv_sge {
	if nsge == 0 {
		return nil
	}
	return &c.sges[0]
}

// sendChain is a QP's chain of sends.
type sendChain struct {
	chain[C.gordma_send_wr]
	qp *C.struct_ibv_qp
}

func newSendChain(_ ctxHandle, h qpHandle, maxWR, maxSGE int) (*sendChain, error) {
	c, err := newChain[C.gordma_send_wr](maxWR, maxSGE, unsafe.Sizeof(C.struct_ibv_send_wr{}))
	if err != nil {
		return nil, err
	}
	return &sendChain{c, h.qp}, nil
}

// fillSend writes w as the i-th WR of the chain, its SGEs from nsge on.
func (c *sendChain) fillSend(i, nsge int, w *verbs.SendWR) {
	d := &c.wrs[i]
	d.wr_id = C.uint64_t(w.ID)
	d.remote_addr = C.uint64_t(w.RemoteAddr)
	d.compare_add = C.uint64_t(w.CompareAdd)
	d.swap = C.uint64_t(w.Swap)
	d.ah = 0
	if a, ok := w.AH.(*ah); ok && a != nil {
		d.ah = C.uint64_t(uintptr(unsafe.Pointer(a.h.ah)))
	}
	d.rkey = C.uint32_t(w.RKey)
	d.imm = C.uint32_t(w.Imm)
	d.remote_qpn = C.uint32_t(w.RemoteQPN)
	d.remote_qkey = C.uint32_t(w.RemoteQKey)
	d.send_flags = C.uint32_t(w.Flags)
	d.num_sge = C.uint16_t(len(w.SGL))
	d.opcode = C.uint8_t(w.Opcode)
	c.copySGEs(nsge, w.SGL)
}

// post posts the first n WRs, with nsge SGEs in all, and returns how
// many the device took and the errno.
func (c *sendChain) post(n, nsge int) (int, syscall.Errno) {
	var posted C.int
	rc := C.gordma_post_send(handle(unsafe.Pointer(c.qp)), handle(c.scratch), &c.wrs[0], C.int(n), c.sgeArg(nsge), &posted)
	return int(posted), syscall.Errno(rc)
}

// recvChain is the chain of receives of a QP or of an SRQ.
type recvChain struct {
	chain[C.gordma_recv_wr]
	qp  *C.struct_ibv_qp  // or
	srq *C.struct_ibv_srq // the other is nil
}

func newRecvChain(_ ctxHandle, h qpHandle, maxWR, maxSGE int) (*recvChain, error) {
	c, err := newChain[C.gordma_recv_wr](maxWR, maxSGE, unsafe.Sizeof(C.struct_ibv_recv_wr{}))
	if err != nil {
		return nil, err
	}
	return &recvChain{chain: c, qp: h.qp}, nil
}

func newSRQRecvChain(_ ctxHandle, h srqHandle, maxWR, maxSGE int) (*recvChain, error) {
	c, err := newChain[C.gordma_recv_wr](maxWR, maxSGE, unsafe.Sizeof(C.struct_ibv_recv_wr{}))
	if err != nil {
		return nil, err
	}
	return &recvChain{chain: c, srq: h.srq}, nil
}

// fillRecv is fillSend for a receive WR.
func (c *recvChain) fillRecv(i, nsge int, w *verbs.RecvWR) {
	c.wrs[i].wr_id = C.uint64_t(w.ID)
	c.wrs[i].num_sge = C.uint32_t(len(w.SGL))
	c.copySGEs(nsge, w.SGL)
}

// post is sendChain.post for receives.
func (c *recvChain) post(n, nsge int) (int, syscall.Errno) {
	var posted C.int
	rc := C.gordma_post_recv(handle(unsafe.Pointer(c.qp)), handle(unsafe.Pointer(c.srq)), handle(c.scratch), &c.wrs[0], C.int(n), c.sgeArg(nsge), &posted)
	return int(posted), syscall.Errno(rc)
}

// handle passes a C object to a hot-path helper of shim.h as an integer,
// so that cgo does not check at each call whether it points into Go
// memory (it never does: these objects are libibverbs').
func handle(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }
