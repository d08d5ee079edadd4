//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"math/bits"
	"sync"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The purego binding's calls into libibverbs for completion channels and
// CQs; cq_shared.go drives them.

// chanHandle is a struct ibv_comp_channel.
type chanHandle struct {
	ch uintptr // struct ibv_comp_channel *
	// The CQ and context of the event getEvent takes (ibv_get_cq_event
	// writes them): scratch off the Go heap.
	out    *[2]uintptr
	outMem []byte
}

func (h ctxHandle) createCompChannel() (chanHandle, error) {
	ch, err := ccallErrno(ibv.createCompChannel, h.c)
	if ch == 0 {
		return chanHandle{}, callErr(err)
	}
	return chanHandle{ch: ch}, nil
}

func (h *chanHandle) fd() int        { return int(*at[int32](h.ch, offCompChannelFD)) }
func (h *chanHandle) destroy() error { return rcErr(int32(ccall(ibv.destroyCompChannel, h.ch))) }

func (h *chanHandle) mapScratch() error {
	mem, err := mapScratch(16)
	if err != nil {
		return err
	}
	h.outMem, h.out = mem, (*[2]uintptr)(unsafe.Pointer(&mem[0]))
	return nil
}

func (h *chanHandle) unmapScratch() {
	unmapScratch(h.outMem)
	h.out, h.outMem = nil, nil
}

// getEvent takes one event off the channel without blocking (EAGAIN
// when none is ready) and returns the id of its CQ (cqHandle.id).
func (h *chanHandle) getEvent() (uintptr, syscall.Errno) {
	out := uintptr(unsafe.Pointer(h.out))
	if rc, err := ccallErrno(ibv.getCQEvent, h.ch, out, out+8); int32(rc) != 0 {
		if errno, ok := err.(syscall.Errno); ok && errno != 0 {
			return 0, errno
		}
		return 0, syscall.EIO
	}
	return h.out[0], 0
}

// cqHandle is a struct ibv_cq.
type cqHandle struct {
	cq uintptr // struct ibv_cq *

	// pollFn is the CQ's poll_cq op. wc is where it writes, pollMax
	// struct ibv_wc off the Go heap, under pollMu.
	pollFn  uintptr
	pollMu  sync.Mutex
	wc      *[pollMax]ibvWC
	wcMem   []byte
	reqNote uintptr // req_notify_cq op
}

func (h *cqHandle) mapScratch() error {
	mem, err := mapScratch(pollMax * int(unsafe.Sizeof(ibvWC{})))
	if err != nil {
		return err
	}
	h.wcMem, h.wc = mem, (*[pollMax]ibvWC)(unsafe.Pointer(&mem[0]))
	return nil
}

func (h *cqHandle) unmapScratch() {
	h.pollMu.Lock()
	unmapScratch(h.wcMem)
	h.wc, h.wcMem = nil, nil
	h.pollMu.Unlock()
}

// create creates the CQ, reporting to ch unless it is nil, and returns
// how many entries it has.
func (h *cqHandle) create(ctx ctxHandle, cqe int, ch *chanHandle) (int, error) {
	var chp uintptr
	if ch != nil {
		chp = ch.ch
	}
	p, err := ccallErrno(ibv.createCQ, ctx.c, uintptr(cqe), 0, chp, 0)
	if p == 0 {
		return 0, callErr(err)
	}
	h.cq = p
	h.pollFn, h.reqNote = *at[uintptr](ctx.c, offOpPollCQ), *at[uintptr](ctx.c, offOpReqNotifyCQ)
	return int(*at[int32](p, offCQCQE)), nil
}

// id is what chanHandle.getEvent returns for an event of this CQ.
func (h *cqHandle) id() uintptr { return h.cq }

// poll takes up to len(wc) <= pollMax completions into wc and returns
// how many, or -errno. It polls up to spins times before it returns
// empty; unlike the cgo binding's, each empty poll is a call into C:
// purego has no C side to spin in.
func (h *cqHandle) poll(wc []verbs.WorkCompletion, spins int) int {
	h.pollMu.Lock()
	var got int
	for {
		got = int(int32(ccall(h.pollFn, h.cq, uintptr(len(wc)), uintptr(unsafe.Pointer(h.wc)))))
		spins--
		if got != 0 || spins <= 0 {
			break
		}
	}
	if got > 0 {
		convertWC(wc[:got], h.wc[:got])
	}
	h.pollMu.Unlock()
	return got
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

func (h *cqHandle) reqNotify(solicitedOnly bool) error {
	s := uintptr(0)
	if solicitedOnly {
		s = 1
	}
	return rcErr(int32(ccall(h.reqNote, h.cq, s)))
}

func (h *cqHandle) ackEvents(n int) { ccall(ibv.ackCQEvents, h.cq, uintptr(n)) }
func (h *cqHandle) destroy() error  { return rcErr(int32(ccall(ibv.destroyCQ, h.cq))) }
