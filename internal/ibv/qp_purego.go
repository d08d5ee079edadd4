//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The purego binding's calls into libibverbs for QPs and address
// handles; qp_shared.go drives them, and posts through the chains of
// post_purego.go.

// qpHandle is a struct ibv_qp.
type qpHandle struct{ qp uintptr }

// createQP creates a QP on the CQs, and srq unless it is the zero
// srqHandle, and returns it, its number and the capacities granted.
func (h pdHandle) createQP(scq, rcq *cqHandle, srq srqHandle, typ verbs.QPType, c verbs.QPCap, signalAll bool) (qpHandle, uint32, verbs.QPCap, error) {
	ia := ibvQPInitAttr{
		sendCQ: scq.cq,
		recvCQ: rcq.cq,
		srq:    srq.srq,
		cap: ibvQPCap{
			maxSendWR:     uint32(c.MaxSendWR),
			maxRecvWR:     uint32(c.MaxRecvWR),
			maxSendSGE:    uint32(c.MaxSendSGE),
			maxRecvSGE:    uint32(c.MaxRecvSGE),
			maxInlineData: uint32(c.MaxInlineData),
		},
		qpType: uint32(typ),
	}
	if signalAll {
		ia.sqSigAll = 1
	}
	q, err := ccallErrno(ibv.createQP, h.p, uintptr(unsafe.Pointer(&ia)))
	if q == 0 {
		return qpHandle{}, 0, verbs.QPCap{}, callErr(err)
	}
	// ibv_create_qp wrote back what it granted.
	return qpHandle{q}, *at[uint32](q, offQPNum), verbs.QPCap{
		MaxSendWR:     int(ia.cap.maxSendWR),
		MaxRecvWR:     int(ia.cap.maxRecvWR),
		MaxSendSGE:    int(ia.cap.maxSendSGE),
		MaxRecvSGE:    int(ia.cap.maxRecvSGE),
		MaxInlineData: int(ia.cap.maxInlineData),
	}, nil
}

func (h qpHandle) queryState() (verbs.QPState, error) {
	var attr ibvQPAttr
	var init ibvQPInitAttr
	if err := rcErr(int32(ccall(ibv.queryQP, h.qp, uintptr(unsafe.Pointer(&attr)), ibvQPState, uintptr(unsafe.Pointer(&init))))); err != nil {
		return 0, err
	}
	return verbs.QPState(attr.qpState), nil
}

func (h qpHandle) modify(attr *qpAttr, mask int) error {
	return rcErr(int32(ccall(ibv.modifyQP, h.qp, uintptr(unsafe.Pointer(attr)), uintptr(mask))))
}

func (h qpHandle) destroy() error { return rcErr(int32(ccall(ibv.destroyQP, h.qp))) }

// qpAttr is a struct ibv_qp_attr, what qpHandle.modify takes: filled
// from qpAttrs by set, or by rdma_init_qp_attr (cmHandles.initQPAttr).
type qpAttr ibvQPAttr

func (a *qpAttr) set(v *qpAttrs) {
	a.pkeyIndex = v.pkeyIndex
	a.portNum = v.port
	a.qkey = v.qkey
	a.qpAccessFlags = v.access
	a.pathMTU = v.pathMTU
	a.destQPNum = v.destQPN
	a.rqPSN = v.rqPSN
	setAH(&a.ahAttr, &v.ah)
	a.maxDestRdAtomic = v.maxDestRdAtomic
	a.minRNRTimer = v.minRNRTimer
	a.sqPSN = v.sqPSN
	a.timeout = v.timeout
	a.retryCnt = v.retryCnt
	a.rnrRetry = v.rnrRetry
	a.maxRdAtomic = v.maxRdAtomic
}

func (a *qpAttr) setState(s verbs.QPState)   { a.qpState = uint32(s) }
func (a *qpAttr) setMaxDestRdAtomic(v uint8) { a.maxDestRdAtomic = v }
func (a *qpAttr) setMaxRdAtomic(v uint8)     { a.maxRdAtomic = v }
func (a *qpAttr) port() uint8                { return a.portNum }

// setAH copies v into ah; the GRH only when v is global.
func setAH(ah *ibvAHAttr, v *ahAttrs) {
	ah.dlid = v.dlid
	ah.sl = v.sl
	ah.portNum = v.port
	if v.global {
		ah.isGlobal = 1
		*(*verbs.GID)(unsafe.Pointer(&ah.dgid)) = v.dgid
		ah.sgidIndex = v.sgidIndex
		ah.hopLimit = v.hopLimit
	}
}

// ahHandle is a struct ibv_ah.
type ahHandle struct{ ah uintptr }

func (h pdHandle) createAH(v *ahAttrs) (ahHandle, error) {
	var attr ibvAHAttr
	setAH(&attr, v)
	a, err := ccallErrno(ibv.createAH, h.p, uintptr(unsafe.Pointer(&attr)))
	if a == 0 {
		return ahHandle{}, callErr(err)
	}
	return ahHandle{a}, nil
}

func (h ahHandle) destroy() error { return rcErr(int32(ccall(ibv.destroyAH, h.ah))) }

// mcast calls ibv_attach_mcast (attach) or ibv_detach_mcast.
func (h qpHandle) mcast(attach bool, gid *verbs.GID, lid uint16) error {
	fn := ibv.detachMcast
	if attach {
		fn = ibv.attachMcast
	}
	return rcErr(int32(ccall(fn, h.qp, uintptr(unsafe.Pointer(gid)), uintptr(lid))))
}
