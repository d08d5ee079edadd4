//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// srq is an ibv_srq.
type srq struct {
	lt    verbs.Lifetime
	pd    *pd
	srq   *C.struct_ibv_srq
	maxWR int
	key   uint64 // in srq_context and devContext.srqs

	mu     sync.Mutex
	maxSGE int
	flat   []C.gordma_recv_wr
	sges   []C.struct_ibv_sge
	recvC  *C.struct_ibv_recv_wr
}

func (p *pd) CreateSRQ(a verbs.SRQInit) (verbs.SRQ, error) {
	if a.MaxWR <= 0 || a.MaxSGE <= 0 {
		return nil, fmt.Errorf("ibv: create SRQ: %w: capacities %+v must be positive", verbs.ErrInvalid, a)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	var ia C.struct_ibv_srq_init_attr
	ia.attr.max_wr = C.uint32_t(a.MaxWR)
	ia.attr.max_sge = C.uint32_t(a.MaxSGE)
	key := p.ctx.srqKey.Add(1)
	h, err := C.gordma_create_srq(p.h.p, &ia, C.uint64_t(key))
	if h == nil {
		p.lt.DropChild()
		return nil, errnoErr(fmt.Sprintf("ibv_create_srq %+v", a), err)
	}
	s := &srq{pd: p, srq: h, key: key, maxWR: int(ia.attr.max_wr), maxSGE: int(ia.attr.max_sge)}
	s.flat = make([]C.gordma_recv_wr, s.maxWR)
	s.sges = make([]C.struct_ibv_sge, s.maxWR*s.maxSGE)
	s.recvC = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(s.maxWR), C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))))
	if s.recvC == nil {
		C.gordma_ibv_destroy_srq(h)
		p.lt.DropChild()
		return nil, fmt.Errorf("ibv: create SRQ: out of C memory for the WR scratch")
	}
	p.ctx.srqs.Store(key, s)
	return s, nil
}

func (s *srq) MaxWR() int { return s.maxWR }

// SetLimit arms the limit with ibv_modify_srq. The range is checked here
// because devices differ at the edge: rxe checks the limit only against
// its ring, which can hold more than max_wr, others against max_wr.
func (s *srq) SetLimit(limit int) error {
	if !s.lt.Enter() {
		return verbs.ErrClosed
	}
	defer s.lt.Exit()
	if limit < 0 || limit >= s.maxWR {
		return fmt.Errorf("ibv: SRQ set limit %d: %w: the limit must be in [0, MaxWR %d)", limit, verbs.ErrInvalid, s.maxWR)
	}
	var attr C.struct_ibv_srq_attr
	attr.srq_limit = C.uint32_t(limit)
	if rc := C.gordma_ibv_modify_srq(s.srq, &attr, C.IBV_SRQ_LIMIT); rc != 0 {
		return errnoErr(fmt.Sprintf("ibv_modify_srq limit %d", limit), syscall.Errno(rc))
	}
	return nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if !s.lt.Enter() {
		return 0, &verbs.PostError{Op: "post_srq_recv", Err: verbs.ErrClosed}
	}
	defer s.lt.Exit()
	s.mu.Lock()
	defer s.mu.Unlock()
	return postRecv(nil, s.srq, s.recvC, s.flat, s.sges, s.maxSGE, wrs)
}

func (s *srq) Close() error {
	return s.lt.Close(func() error {
		if rc := C.gordma_ibv_destroy_srq(s.srq); rc != 0 {
			return errnoErr("ibv_destroy_srq", syscall.Errno(rc))
		}
		C.free(unsafe.Pointer(s.recvC))
		s.recvC = nil
		s.pd.ctx.srqs.Delete(s.key)
		s.pd.lt.DropChild()
		return nil
	})
}
