//go:build linux && !cgo && (amd64 || arm64)

package ibv

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
	srq   uintptr // struct ibv_srq *
	maxWR int
	key   uint64 // in srq_context and devContext.srqs

	mu     sync.Mutex
	maxSGE int
	postOp uintptr // the context's post_srq_recv
	wrs    *chain[ibvRecvWR]
}

func (p *pd) CreateSRQ(a verbs.SRQInit) (verbs.SRQ, error) {
	if a.MaxWR <= 0 || a.MaxSGE <= 0 {
		return nil, fmt.Errorf("ibv: create SRQ: %w: capacities %+v must be positive", verbs.ErrInvalid, a)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	// srq_context is key, an integer the Go side maps back to its SRQ
	// when an event names it, so C keeps no Go pointer.
	key := p.ctx.srqKey.Add(1)
	ia := ibvSRQInitAttr{srqContext: uintptr(key), attr: ibvSRQAttr{maxWR: uint32(a.MaxWR), maxSGE: uint32(a.MaxSGE)}}
	h, err := ccallErrno(ibv.createSRQ, p.h.p, uintptr(unsafe.Pointer(&ia)))
	if h == 0 {
		p.lt.DropChild()
		return nil, errnoErr(fmt.Sprintf("ibv_create_srq %+v", a), err)
	}
	s := &srq{pd: p, srq: h, key: key, maxWR: int(ia.attr.maxWR), maxSGE: int(ia.attr.maxSGE),
		postOp: *at[uintptr](p.ctx.h.c, offOpPostSRQRecv)}
	if s.wrs, err = newChain[ibvRecvWR](s.maxWR, s.maxSGE); err != nil {
		ccall(ibv.destroySRQ, h)
		p.lt.DropChild()
		return nil, fmt.Errorf("ibv: create SRQ: %w", err)
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
	attr := ibvSRQAttr{srqLimit: uint32(limit)}
	if rc := int32(ccall(ibv.modifySRQ, s.srq, uintptr(unsafe.Pointer(&attr)), ibvSRQLimit)); rc != 0 {
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
	return postRecv(s.postOp, s.srq, s.wrs, s.maxSGE, wrs)
}

func (s *srq) Close() error {
	return s.lt.Close(func() error {
		if rc := int32(ccall(ibv.destroySRQ, s.srq)); rc != 0 {
			return errnoErr("ibv_destroy_srq", syscall.Errno(rc))
		}
		s.mu.Lock()
		s.wrs.free()
		s.mu.Unlock()
		s.pd.ctx.srqs.Delete(s.key)
		s.pd.lt.DropChild()
		return nil
	})
}
