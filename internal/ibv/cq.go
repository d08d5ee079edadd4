//go:build linux && cgo

package ibv

/*
#cgo noescape gordma_poll
#cgo nocallback gordma_poll
#include "shim.h"
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The cgo binding's calls into libibverbs for completion channels and
// CQs; cq_shared.go drives them.

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
	// pollMax is GORDMA_POLL_MAX, the size of gordma_poll's array.
	_ = uint(pollMax - C.GORDMA_POLL_MAX)
	_ = uint(C.GORDMA_POLL_MAX - pollMax)
)

// chanHandle is a struct ibv_comp_channel.
type chanHandle struct {
	ch  *C.struct_ibv_comp_channel
	got *C.struct_ibv_cq // where getEvent has C write the event's CQ
}

func (h ctxHandle) createCompChannel() (chanHandle, error) {
	ch, err := C.gordma_ibv_create_comp_channel(h.c)
	if ch == nil {
		return chanHandle{}, callErr(err)
	}
	return chanHandle{ch: ch}, nil
}

func (h *chanHandle) fd() int        { return int(h.ch.fd) }
func (h *chanHandle) destroy() error { return rcErr(int32(C.gordma_ibv_destroy_comp_channel(h.ch))) }

// mapScratch and unmapScratch have nothing to do: getEvent's out
// parameter is a field of the channel.
func (h *chanHandle) mapScratch() error { return nil }
func (h *chanHandle) unmapScratch()     {}

// getEvent takes one event off the channel without blocking (EAGAIN
// when none is ready) and returns the id of its CQ (cqHandle.id).
func (h *chanHandle) getEvent() (uintptr, syscall.Errno) {
	if rc := C.gordma_get_cq_event(h.ch, &h.got); rc != 0 {
		return 0, syscall.Errno(rc)
	}
	return uintptr(unsafe.Pointer(h.got)), 0
}

// cqHandle is a struct ibv_cq.
type cqHandle struct{ cq *C.struct_ibv_cq }

// mapScratch and unmapScratch have nothing to do: gordma_poll polls into
// an array on the C stack.
func (h *cqHandle) mapScratch() error { return nil }
func (h *cqHandle) unmapScratch()     {}

// create creates the CQ, reporting to ch unless it is nil, and returns
// how many entries it has.
func (h *cqHandle) create(ctx ctxHandle, cqe int, ch *chanHandle) (int, error) {
	var chp *C.struct_ibv_comp_channel
	if ch != nil {
		chp = ch.ch
	}
	p, err := C.gordma_ibv_create_cq(ctx.c, C.int(cqe), nil, chp, 0)
	if p == nil {
		return 0, callErr(err)
	}
	h.cq = p
	return int(p.cqe), nil
}

// id is what chanHandle.getEvent returns for an event of this CQ.
func (h *cqHandle) id() uintptr { return uintptr(unsafe.Pointer(h.cq)) }

// poll takes up to len(wc) <= pollMax completions into wc in one call
// and returns how many, or -errno. The C helper polls up to spins times
// before it returns empty.
func (h *cqHandle) poll(wc []verbs.WorkCompletion, spins int) int {
	return int(C.gordma_poll(handle(unsafe.Pointer(h.cq)), C.int(len(wc)), (*C.gordma_wc)(unsafe.Pointer(&wc[0])), C.int(spins)))
}

func (h *cqHandle) reqNotify(solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	return rcErr(int32(C.gordma_req_notify(h.cq, s)))
}

func (h *cqHandle) ackEvents(n int) { C.gordma_ibv_ack_cq_events(h.cq, C.uint(n)) }
func (h *cqHandle) destroy() error  { return rcErr(int32(C.gordma_ibv_destroy_cq(h.cq))) }
