//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

// The cgo binding's calls into libibverbs for SRQs; srq_shared.go drives
// them, and posts through a recvChain (qp.go).

// srqHandle is a struct ibv_srq.
type srqHandle struct{ srq *C.struct_ibv_srq }

// createSRQ creates an SRQ whose srq_context is key and returns it and
// the WRs and SGEs granted.
func (h pdHandle) createSRQ(maxWR, maxSGE int, key uint64) (srqHandle, int, int, error) {
	var ia C.struct_ibv_srq_init_attr
	ia.attr.max_wr = C.uint32_t(maxWR)
	ia.attr.max_sge = C.uint32_t(maxSGE)
	s, err := C.gordma_create_srq(h.p, &ia, C.uint64_t(key))
	if s == nil {
		return srqHandle{}, 0, 0, callErr(err)
	}
	return srqHandle{s}, int(ia.attr.max_wr), int(ia.attr.max_sge), nil
}

func (h srqHandle) setLimit(limit int) error {
	var attr C.struct_ibv_srq_attr
	attr.srq_limit = C.uint32_t(limit)
	return rcErr(int32(C.gordma_ibv_modify_srq(h.srq, &attr, C.IBV_SRQ_LIMIT)))
}

func (h srqHandle) destroy() error { return rcErr(int32(C.gordma_ibv_destroy_srq(h.srq))) }
