//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/go-rdma/rdma/internal/verbs"
)

// pollMax is how many completions one call into C takes at most.
const pollMax = 128

// compChannel is an ibv_comp_channel.
type compChannel struct {
	lt     verbs.Lifetime
	ctx    *devContext
	h      chanHandle
	waiter *fdWaiter

	mu  sync.Mutex
	cqs map[uintptr]*cq // CQs reporting here by cqHandle.id, to map events back

	// GetEvent's state, under getMu: the CQ of the event taken, and the
	// waiter's try function, made once so that a wait allocates nothing.
	getMu  sync.Mutex
	got    uintptr
	tryGet func() (bool, error)
}

// getEvent takes one event off the channel without blocking, into ch.got.
func (ch *compChannel) getEvent() (bool, error) {
	got, errno := ch.h.getEvent()
	if errno == syscall.EAGAIN {
		return false, nil
	}
	if errno != 0 {
		return true, errnoErr("ibv_get_cq_event", errno)
	}
	ch.got = got
	return true, nil
}

func (c *devContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, err
	}
	h, err := c.h.createCompChannel()
	if err != nil {
		c.lt.DropChild()
		return nil, errnoErr("ibv_create_comp_channel", err)
	}
	w, err := newFDWaiter(h.fd(), "ibv-comp-channel")
	if err != nil {
		h.destroy()
		c.lt.DropChild()
		return nil, err
	}
	cc := &compChannel{ctx: c, h: h, waiter: w, cqs: map[uintptr]*cq{}}
	if err := cc.h.mapScratch(); err != nil {
		w.close()
		h.destroy()
		c.lt.DropChild()
		return nil, err
	}
	cc.tryGet = cc.getEvent
	return cc, nil
}

func (ch *compChannel) GetEvent(ctx context.Context) (verbs.CQ, error) {
	if !ch.lt.Enter() {
		return nil, verbs.ErrClosed
	}
	ch.lt.Exit() // waiting must not hold off Close; Close wakes us
	ch.getMu.Lock()
	err := ch.waiter.wait(ctx, ch.tryGet)
	got := ch.got
	ch.getMu.Unlock()
	if err != nil {
		return nil, err
	}
	ch.mu.Lock()
	q := ch.cqs[got]
	ch.mu.Unlock()
	if q == nil {
		return nil, fmt.Errorf("ibv: event for an unknown CQ")
	}
	q.mu.Lock()
	q.events++
	q.mu.Unlock()
	return q, nil
}

func (ch *compChannel) Close() error {
	return ch.lt.Close(func() error {
		ch.waiter.close()
		if err := ch.h.destroy(); err != nil {
			return errnoErr("ibv_destroy_comp_channel", err)
		}
		ch.getMu.Lock()
		ch.h.unmapScratch()
		ch.getMu.Unlock()
		ch.ctx.lt.DropChild()
		return nil
	})
}

// cq is an ibv_cq.
type cq struct {
	lt  verbs.Lifetime
	ctx *devContext
	h   cqHandle
	ch  *compChannel // nil without a channel
	n   int

	mu     sync.Mutex
	events int // taken by GetEvent and not yet acked
}

func (c *devContext) CreateCQ(cqe int, ch verbs.CompChannel) (verbs.CQ, error) {
	if cqe <= 0 || cqe > c.attr.MaxCQE {
		return nil, fmt.Errorf("ibv: create CQ of %d entries: %w: the device allows 1..%d", cqe, verbs.ErrInvalid, c.attr.MaxCQE)
	}
	var cch *compChannel
	if ch != nil {
		var ok bool
		if cch, ok = ch.(*compChannel); !ok || cch.ctx != c {
			return nil, fmt.Errorf("ibv: create CQ: %w: completion channel of another device or provider", verbs.ErrInvalid)
		}
		if err := cch.lt.AddChild(); err != nil {
			return nil, err
		}
	}
	if err := c.lt.AddChild(); err != nil {
		if cch != nil {
			cch.lt.DropChild()
		}
		return nil, err
	}
	drop := func() {
		c.lt.DropChild()
		if cch != nil {
			cch.lt.DropChild()
		}
	}
	q := &cq{ctx: c, ch: cch}
	if err := q.h.mapScratch(); err != nil {
		drop()
		return nil, err
	}
	var chh *chanHandle
	if cch != nil {
		chh = &cch.h
	}
	n, err := q.h.create(c.h, cqe, chh)
	if err != nil {
		q.h.unmapScratch()
		drop()
		return nil, errnoErr(fmt.Sprintf("ibv_create_cq %d entries", cqe), err)
	}
	q.n = n
	if cch != nil {
		cch.mu.Lock()
		cch.cqs[q.h.id()] = q
		cch.mu.Unlock()
	}
	return q, nil
}

func (q *cq) Len() int { return q.n }

// Poll takes up to len(wc) completions, at most pollMax per call into C.
func (q *cq) Poll(wc []verbs.WorkCompletion) (int, error) { return q.PollSpin(wc, 1) }

// PollSpin is verbs.SpinPoller: it polls up to spins times before it
// returns empty (cqHandle.poll says where the spinning happens).
func (q *cq) PollSpin(wc []verbs.WorkCompletion, spins int) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	if !q.lt.Enter() {
		return 0, verbs.ErrClosed
	}
	total := 0
	for total < len(wc) {
		want := min(len(wc)-total, pollMax)
		got := q.h.poll(wc[total:total+want], spins)
		if got < 0 {
			q.lt.Exit()
			return total, errnoErr("ibv_poll_cq", syscall.Errno(-got))
		}
		total += got
		if got < want {
			break
		}
		spins = 1
	}
	q.lt.Exit()
	for i := range wc[:total] {
		if wc[i].Status != verbs.WCSuccess {
			// The QP is in the error state now; remember it so
			// receives posted later are flushed (see qp.PostRecv).
			if v, ok := q.ctx.qps.Load(wc[i].QPN); ok {
				v.(*qp).state.Store(uint32(verbs.StateError))
			}
		}
	}
	return total, nil
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	if q.ch == nil {
		return fmt.Errorf("ibv: req_notify_cq: %w: CQ has no completion channel", verbs.ErrInvalid)
	}
	if err := q.h.reqNotify(solicitedOnly); err != nil {
		return errnoErr("ibv_req_notify_cq", err)
	}
	return nil
}

func (q *cq) AckEvents(n int) {
	if n <= 0 || !q.lt.Enter() {
		return
	}
	defer q.lt.Exit()
	q.mu.Lock()
	n = min(n, q.events)
	q.events -= n
	q.mu.Unlock()
	if n > 0 {
		q.h.ackEvents(n)
	}
}

func (q *cq) Close() error {
	return q.lt.Close(func() error {
		// ibv_destroy_cq waits for every event to be acked: ack the rest.
		q.mu.Lock()
		if q.events > 0 {
			q.h.ackEvents(q.events)
			q.events = 0
		}
		q.mu.Unlock()
		if err := q.h.destroy(); err != nil {
			return errnoErr("ibv_destroy_cq", err)
		}
		q.h.unmapScratch()
		if q.ch != nil {
			q.ch.mu.Lock()
			delete(q.ch.cqs, q.h.id())
			q.ch.mu.Unlock()
			q.ch.lt.DropChild()
		}
		q.ctx.lt.DropChild()
		return nil
	})
}
