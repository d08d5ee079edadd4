//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// srq is an ibv_srq.
type srq struct {
	lt    verbs.Lifetime
	pd    *pd
	h     srqHandle
	maxWR int
	key   uint64 // in srq_context and devContext.srqs

	mu     sync.Mutex
	maxSGE int
	recv   *recvChain
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
	h, maxWR, maxSGE, err := p.h.createSRQ(a.MaxWR, a.MaxSGE, key)
	if err != nil {
		p.lt.DropChild()
		return nil, errnoErr(fmt.Sprintf("ibv_create_srq %+v", a), err)
	}
	s := &srq{pd: p, h: h, key: key, maxWR: maxWR, maxSGE: maxSGE}
	if s.recv, err = newSRQRecvChain(p.ctx.h, h, s.maxWR, s.maxSGE); err != nil {
		h.destroy()
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
	if err := s.h.setLimit(limit); err != nil {
		return errnoErr(fmt.Sprintf("ibv_modify_srq limit %d", limit), err)
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
	return postRecv(s.recv, s.maxWR, s.maxSGE, wrs)
}

func (s *srq) Close() error {
	return s.lt.Close(func() error {
		if err := s.h.destroy(); err != nil {
			return errnoErr("ibv_destroy_srq", err)
		}
		s.mu.Lock()
		s.recv.free()
		s.mu.Unlock()
		s.pd.ctx.srqs.Delete(s.key)
		s.pd.lt.DropChild()
		return nil
	})
}
