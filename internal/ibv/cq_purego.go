//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// pollMax is how many completions one ibv_poll_cq call takes, as
// GORDMA_POLL_MAX in the cgo build.
const pollMax = 128

// compChannel is an ibv_comp_channel.
type compChannel struct {
	lt     verbs.Lifetime
	ctx    *devContext
	ch     uintptr // struct ibv_comp_channel *
	waiter *fdWaiter

	mu  sync.Mutex
	cqs map[uintptr]*cq // CQs reporting here, to map events back

	// GetEvent's state, under getMu: the CQ and context of the event
	// taken (ibv_get_cq_event writes them: scratch off the Go heap),
	// and the waiter's try function, made once so that a wait
	// allocates nothing.
	getMu  sync.Mutex
	out    *[2]uintptr
	outMem []byte
	tryGet func() (bool, error)
}

// getEvent takes one event off the channel without blocking, into ch.out[0].
func (ch *compChannel) getEvent() (bool, error) {
	out := uintptr(unsafe.Pointer(ch.out))
	if rc, err := ccallErrno(ibv.getCQEvent, ch.ch, out, out+8); int32(rc) != 0 {
		if err == syscall.EAGAIN {
			return false, nil
		}
		return true, errnoErr("ibv_get_cq_event", err)
	}
	return true, nil
}

func (c *devContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, err
	}
	ch, err := ccallErrno(ibv.createCompChannel, c.h.c)
	if ch == 0 {
		c.lt.DropChild()
		return nil, errnoErr("ibv_create_comp_channel", err)
	}
	w, werr := newFDWaiter(int(*at[int32](ch, offCompChannelFD)), "ibv-comp-channel")
	if werr != nil {
		ccall(ibv.destroyCompChannel, ch)
		c.lt.DropChild()
		return nil, werr
	}
	mem, merr := mapScratch(16)
	if merr != nil {
		w.close()
		ccall(ibv.destroyCompChannel, ch)
		c.lt.DropChild()
		return nil, merr
	}
	cc := &compChannel{ctx: c, ch: ch, waiter: w, cqs: map[uintptr]*cq{}, outMem: mem, out: (*[2]uintptr)(unsafe.Pointer(&mem[0]))}
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
	got := ch.out[0]
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
		if rc := int32(ccall(ibv.destroyCompChannel, ch.ch)); rc != 0 {
			return errnoErr("ibv_destroy_comp_channel", syscall.Errno(rc))
		}
		ch.getMu.Lock()
		unmapScratch(ch.outMem)
		ch.out, ch.outMem = nil, nil
		ch.getMu.Unlock()
		ch.ctx.lt.DropChild()
		return nil
	})
}

// cq is an ibv_cq.
type cq struct {
	lt  verbs.Lifetime
	ctx *devContext
	cq  uintptr      // struct ibv_cq *
	ch  *compChannel // nil without a channel
	n   int

	// pollFn is the CQ's poll_cq op. wc is where it writes, pollMax
	// struct ibv_wc off the Go heap, under pollMu.
	pollFn  uintptr
	pollMu  sync.Mutex
	wc      *[pollMax]ibvWC
	wcMem   []byte
	reqNote uintptr // req_notify_cq op

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
	mem, err := mapScratch(pollMax * int(unsafe.Sizeof(ibvWC{})))
	if err != nil {
		drop()
		return nil, err
	}
	var chp uintptr
	if cch != nil {
		chp = cch.ch
	}
	p, err := ccallErrno(ibv.createCQ, c.h.c, uintptr(cqe), 0, chp, 0)
	if p == 0 {
		unmapScratch(mem)
		drop()
		return nil, errnoErr(fmt.Sprintf("ibv_create_cq %d entries", cqe), err)
	}
	q := &cq{ctx: c, cq: p, ch: cch, n: int(*at[int32](p, offCQCQE)),
		pollFn: *at[uintptr](c.h.c, offOpPollCQ), reqNote: *at[uintptr](c.h.c, offOpReqNotifyCQ),
		wc: (*[pollMax]ibvWC)(unsafe.Pointer(&mem[0])), wcMem: mem}
	if cch != nil {
		cch.mu.Lock()
		cch.cqs[p] = q
		cch.mu.Unlock()
	}
	return q, nil
}

func (q *cq) Len() int { return q.n }

// Poll takes up to len(wc) completions, at most 128 per call into C.
func (q *cq) Poll(wc []verbs.WorkCompletion) (int, error) { return q.PollSpin(wc, 1) }

// PollSpin is verbs.SpinPoller: it polls up to spins times before it
// returns empty. Unlike the cgo build's, each empty poll is a call into
// C: purego has no C side to spin in.
func (q *cq) PollSpin(wc []verbs.WorkCompletion, spins int) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	if !q.lt.Enter() {
		return 0, verbs.ErrClosed
	}
	q.pollMu.Lock()
	total := 0
	for total < len(wc) {
		want := min(len(wc)-total, pollMax)
		var got int
		for {
			got = int(int32(ccall(q.pollFn, q.cq, uintptr(want), uintptr(unsafe.Pointer(q.wc)))))
			spins--
			if got != 0 || spins <= 0 {
				break
			}
		}
		if got < 0 {
			q.pollMu.Unlock()
			q.lt.Exit()
			return total, errnoErr("ibv_poll_cq", syscall.Errno(-got))
		}
		convertWC(wc[total:total+got], q.wc[:got])
		total += got
		if got < want {
			break
		}
		spins = 1
	}
	q.pollMu.Unlock()
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

// convertWC copies completions into the Go layout, as gordma_poll does:
// failed completions carry only the fields valid for them.
func convertWC(out []verbs.WorkCompletion, in []ibvWC) {
	for i := range out {
		w := &in[i]
		o := &out[i]
		*o = verbs.WorkCompletion{WRID: w.wrID, Status: verbs.WCStatus(w.status), VendorErr: w.vendorErr, QPN: w.qpNum}
		if w.status != 0 {
			continue
		}
		o.Opcode = verbs.WCOpcode(w.opcode)
		o.ByteLen = w.byteLen
		o.Flags = verbs.WCFlags(w.wcFlags & (ibvWCGRH | ibvWCWithImm))
		if w.wcFlags&ibvWCWithImm != 0 {
			o.Imm = bits.ReverseBytes32(w.imm)
		}
		o.SrcQP = w.srcQP
		o.PKeyIndex = w.pkeyIndex
		o.SLID = w.slid
		o.SL = w.sl
	}
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	if !q.lt.Enter() {
		return verbs.ErrClosed
	}
	defer q.lt.Exit()
	if q.ch == nil {
		return fmt.Errorf("ibv: req_notify_cq: %w: CQ has no completion channel", verbs.ErrInvalid)
	}
	s := uintptr(0)
	if solicitedOnly {
		s = 1
	}
	if rc := int32(ccall(q.reqNote, q.cq, s)); rc != 0 {
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
		ccall(ibv.ackCQEvents, q.cq, uintptr(n))
	}
}

func (q *cq) Close() error {
	return q.lt.Close(func() error {
		// ibv_destroy_cq waits for every event to be acked: ack the rest.
		q.mu.Lock()
		if q.events > 0 {
			ccall(ibv.ackCQEvents, q.cq, uintptr(q.events))
			q.events = 0
		}
		q.mu.Unlock()
		if rc := int32(ccall(ibv.destroyCQ, q.cq)); rc != 0 {
			return errnoErr("ibv_destroy_cq", syscall.Errno(rc))
		}
		q.pollMu.Lock()
		unmapScratch(q.wcMem)
		q.wc, q.wcMem = nil, nil
		q.pollMu.Unlock()
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
