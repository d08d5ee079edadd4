package soft

import (
	"fmt"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// srq is a shared receive queue.
type srq struct {
	lt     verbs.Lifetime
	pd     *pd
	maxWR  int
	maxSGE int

	mu         sync.Mutex
	ring       []recvSlot
	head, tail uint64
	limit      uint64 // armed low watermark; 0 when disarmed
}

type recvSlot struct {
	id  uint64
	sge []verbs.SGE
}

func newRecvRing(n, sges int) []recvSlot {
	r := make([]recvSlot, n)
	all := make([]verbs.SGE, n*sges)
	for i := range r {
		r[i].sge = all[i*sges : i*sges : (i+1)*sges]
	}
	return r
}

func (p *pd) CreateSRQ(attr verbs.SRQInit) (verbs.SRQ, error) {
	if attr.MaxWR < 0 || attr.MaxWR > maxQPWR || attr.MaxSGE < 0 || attr.MaxSGE > maxSGE {
		return nil, fmt.Errorf("soft: create srq: %w: max_wr %d (≤ %d), max_sge %d (≤ %d)", verbs.ErrInvalid, attr.MaxWR, maxQPWR, attr.MaxSGE, maxSGE)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, errClosed("create srq")
	}
	s := &srq{pd: p, maxWR: max(attr.MaxWR, 1), maxSGE: max(attr.MaxSGE, 1)}
	s.ring = newRecvRing(s.maxWR, s.maxSGE)
	return s, nil
}

func (s *srq) MaxWR() int { return s.maxWR }

func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if !s.lt.Enter() {
		return 0, errClosed("srq post_recv")
	}
	defer s.lt.Exit()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > s.maxSGE {
			return i, &verbs.PostError{Op: "post_recv", Posted: i, Err: fmt.Errorf("%w: %d SGEs, the SRQ allows %d", verbs.ErrInvalid, len(wr.SGL), s.maxSGE)}
		}
		if s.tail-s.head == uint64(len(s.ring)) {
			return i, &verbs.PostError{Op: "post_recv", Posted: i, Err: fmt.Errorf("%w: SRQ holds %d receives", verbs.ErrQueueFull, len(s.ring))}
		}
		sl := &s.ring[s.tail%uint64(len(s.ring))]
		sl.id = wr.ID
		sl.sge = append(sl.sge[:0], wr.SGL...)
		s.tail++
	}
	return len(wrs), nil
}

// SetLimit arms the low watermark. The check is made only when a
// receive is taken (pop), as rxe does, so arming below the watermark
// reports at the next receive, not at once.
func (s *srq) SetLimit(limit int) error {
	if !s.lt.Enter() {
		return errClosed("srq set limit")
	}
	defer s.lt.Exit()
	if limit < 0 || limit >= s.maxWR {
		return fmt.Errorf("soft: srq set limit %d: %w: the limit must be in [0, MaxWR %d)", limit, verbs.ErrInvalid, s.maxWR)
	}
	s.mu.Lock()
	s.limit = uint64(limit)
	s.mu.Unlock()
	return nil
}

// pop takes the oldest receive into r (whose sge has room for maxSGE).
// When that leaves fewer posted than the armed limit it disarms it and
// queues EventSRQLimitReached, before the caller completes the receive:
// whoever sees the completion can count on the event being queued.
func (s *srq) pop(r *recvSlot) bool {
	s.mu.Lock()
	if s.head == s.tail {
		s.mu.Unlock()
		return false
	}
	sl := &s.ring[s.head%uint64(len(s.ring))]
	r.id = sl.id
	r.sge = append(r.sge[:0], sl.sge...)
	s.head++
	reached := s.limit > 0 && s.tail-s.head < s.limit
	if reached {
		s.limit = 0
	}
	s.mu.Unlock()
	// Queued outside mu: the event queue has its own lock and never
	// blocks (a full queue drops its oldest event), so the responder,
	// which holds its QP's lock here, does not wait on a reader.
	if reached {
		s.pd.ctx.queueEvent(verbs.AsyncEvent{Type: verbs.EventSRQLimitReached, SRQ: s})
	}
	return true
}

func (s *srq) Close() error {
	return s.lt.Close(func() error {
		s.pd.lt.DropChild()
		return nil
	})
}
