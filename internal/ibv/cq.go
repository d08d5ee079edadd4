//go:build linux && cgo

package ibv

/*
#cgo noescape gordma_poll
#cgo nocallback gordma_poll
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Compile-time checks that gordma_wc and verbs.WorkCompletion have one
// layout, so the C shim can write completions straight into Go's slice.
const (
	_ = uint(unsafe.Sizeof(C.gordma_wc{}) - unsafe.Sizeof(verbs.WorkCompletion{}))
	_ = uint(unsafe.Sizeof(verbs.WorkCompletion{}) - unsafe.Sizeof(C.gordma_wc{}))
	_ = uint(unsafe.Offsetof(C.gordma_wc{}.byte_len) - unsafe.Offsetof(verbs.WorkCompletion{}.ByteLen))
	_ = uint(unsafe.Offsetof(verbs.WorkCompletion{}.ByteLen) - unsafe.Offsetof(C.gordma_wc{}.byte_len))
	_ = uint(unsafe.Offsetof(C.gordma_wc{}.flags) - unsafe.Offsetof(verbs.WorkCompletion{}.Flags))
	_ = uint(unsafe.Offsetof(verbs.WorkCompletion{}.Flags) - unsafe.Offsetof(C.gordma_wc{}.flags))
	_ = uint(unsafe.Offsetof(C.gordma_wc{}.sl) - unsafe.Offsetof(verbs.WorkCompletion{}.SL))
	_ = uint(unsafe.Offsetof(verbs.WorkCompletion{}.SL) - unsafe.Offsetof(C.gordma_wc{}.sl))
	// SGE and ibv_sge share a layout too: the post path copies SGEs as is.
	_ = uint(unsafe.Sizeof(C.struct_ibv_sge{}) - unsafe.Sizeof(verbs.SGE{}))
	_ = uint(unsafe.Sizeof(verbs.SGE{}) - unsafe.Sizeof(C.struct_ibv_sge{}))
)

// compChannel is an ibv_comp_channel.
type compChannel struct {
	lt     verbs.Lifetime
	ctx    *devContext
	ch     *C.struct_ibv_comp_channel
	waiter *fdWaiter

	mu  sync.Mutex
	cqs map[*C.struct_ibv_cq]*cq // CQs reporting here, to map events back

	// GetEvent's state, under getMu: the CQ of the event taken, and the
	// waiter's try function, made once so that a wait allocates nothing.
	getMu  sync.Mutex
	got    *C.struct_ibv_cq
	tryGet func() (bool, error)
}

// getEvent takes one event off the channel without blocking, into ch.got.
func (ch *compChannel) getEvent() (bool, error) {
	rc := C.gordma_get_cq_event(ch.ch, &ch.got)
	if rc == C.EAGAIN {
		return false, nil
	}
	if rc != 0 {
		return true, errnoErr("ibv_get_cq_event", syscall.Errno(rc))
	}
	return true, nil
}

func (c *devContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, err
	}
	ch, err := C.gordma_ibv_create_comp_channel(c.h.c)
	if ch == nil {
		c.lt.DropChild()
		return nil, errnoErr("ibv_create_comp_channel", err)
	}
	w, werr := newFDWaiter(int(ch.fd), "ibv-comp-channel")
	if werr != nil {
		C.gordma_ibv_destroy_comp_channel(ch)
		c.lt.DropChild()
		return nil, werr
	}
	cc := &compChannel{ctx: c, ch: ch, waiter: w, cqs: map[*C.struct_ibv_cq]*cq{}}
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
		if rc := C.gordma_ibv_destroy_comp_channel(ch.ch); rc != 0 {
			return errnoErr("ibv_destroy_comp_channel", syscall.Errno(rc))
		}
		ch.ctx.lt.DropChild()
		return nil
	})
}

// cq is an ibv_cq.
type cq struct {
	lt  verbs.Lifetime
	ctx *devContext
	cq  *C.struct_ibv_cq
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
	var chp *C.struct_ibv_comp_channel
	if cch != nil {
		chp = cch.ch
	}
	p, err := C.gordma_ibv_create_cq(c.h.c, C.int(cqe), nil, chp, 0)
	if p == nil {
		c.lt.DropChild()
		if cch != nil {
			cch.lt.DropChild()
		}
		return nil, errnoErr(fmt.Sprintf("ibv_create_cq %d entries", cqe), err)
	}
	q := &cq{ctx: c, cq: p, ch: cch, n: int(p.cqe)}
	if cch != nil {
		cch.mu.Lock()
		cch.cqs[p] = q
		cch.mu.Unlock()
	}
	return q, nil
}

func (q *cq) Len() int { return q.n }

// Poll takes up to len(wc) completions, at most 128 per cgo call.
func (q *cq) Poll(wc []verbs.WorkCompletion) (int, error) { return q.PollSpin(wc, 1) }

// PollSpin is verbs.SpinPoller: the C helper polls up to spins times
// before it returns empty.
func (q *cq) PollSpin(wc []verbs.WorkCompletion, spins int) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	if !q.lt.Enter() {
		return 0, verbs.ErrClosed
	}
	total := 0
	for total < len(wc) {
		want := min(len(wc)-total, C.GORDMA_POLL_MAX)
		got := int(C.gordma_poll(handle(unsafe.Pointer(q.cq)), C.int(want), (*C.gordma_wc)(unsafe.Pointer(&wc[total])), C.int(spins)))
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
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	if rc := C.gordma_req_notify(q.cq, s); rc != 0 {
		return errnoErr("ibv_req_notify_cq", syscall.Errno(rc))
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
		C.gordma_ibv_ack_cq_events(q.cq, C.uint(n))
	}
}

func (q *cq) Close() error {
	return q.lt.Close(func() error {
		// ibv_destroy_cq waits for every event to be acked: ack the rest.
		q.mu.Lock()
		if q.events > 0 {
			C.gordma_ibv_ack_cq_events(q.cq, C.uint(q.events))
			q.events = 0
		}
		q.mu.Unlock()
		if rc := C.gordma_ibv_destroy_cq(q.cq); rc != 0 {
			return errnoErr("ibv_destroy_cq", syscall.Errno(rc))
		}
		if q.ch != nil {
			q.ch.mu.Lock()
			delete(q.ch.cqs, q.cq)
			q.ch.mu.Unlock()
			q.ch.lt.DropChild()
		}
		q.ctx.lt.DropChild()
		return nil
	})
}
