//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"math/bits"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The purego binding's post path: qp_shared.go and srq_shared.go post
// through a sendChain or a recvChain.

// chain is the scratch a queue posts from: room for its WRs, their SGEs
// and bad_wr, mapped off the Go heap. A post writes the chain there and
// hands it to the queue's post op in one call, so C sees only memory
// that is not Go's. The owner serialises posts.
type chain[WR ibvSendWR | ibvRecvWR] struct {
	op   uintptr // the context's post_send, post_recv or post_srq_recv
	obj  uintptr // the QP or SRQ it posts to
	mem  []byte
	wrs  []WR
	sges []verbs.SGE // same layout as struct ibv_sge (abi_cgo.go)
	bad  *uintptr
}

type (
	sendChain = chain[ibvSendWR]
	recvChain = chain[ibvRecvWR] // a QP's or an SRQ's
)

func newSendChain(ctx ctxHandle, h qpHandle, maxWR, maxSGE int) (*sendChain, error) {
	return newChain[ibvSendWR](*at[uintptr](ctx.c, offOpPostSend), h.qp, maxWR, maxSGE)
}

func newRecvChain(ctx ctxHandle, h qpHandle, maxWR, maxSGE int) (*recvChain, error) {
	return newChain[ibvRecvWR](*at[uintptr](ctx.c, offOpPostRecv), h.qp, maxWR, maxSGE)
}

func newSRQRecvChain(ctx ctxHandle, h srqHandle, maxWR, maxSGE int) (*recvChain, error) {
	return newChain[ibvRecvWR](*at[uintptr](ctx.c, offOpPostSRQRecv), h.srq, maxWR, maxSGE)
}

func newChain[WR ibvSendWR | ibvRecvWR](op, obj uintptr, maxWR, maxSGE int) (*chain[WR], error) {
	wrSize := int(unsafe.Sizeof(*new(WR)))
	sgeSize := int(unsafe.Sizeof(verbs.SGE{}))
	n := maxWR*wrSize + maxWR*maxSGE*sgeSize + 8
	mem, err := mapScratch(n)
	if err != nil {
		return nil, err
	}
	c := &chain[WR]{op: op, obj: obj, mem: mem}
	c.wrs = unsafe.Slice((*WR)(unsafe.Pointer(&mem[0])), maxWR)
	if maxSGE > 0 {
		c.sges = unsafe.Slice((*verbs.SGE)(unsafe.Pointer(&mem[maxWR*wrSize])), maxWR*maxSGE)
	}
	c.bad = (*uintptr)(unsafe.Pointer(&mem[n-8]))
	return c, nil
}

func (c *chain[WR]) free() {
	unmapScratch(c.mem)
	c.mem, c.wrs, c.sges, c.bad = nil, nil, nil, nil
}

// post calls the post op with the first n WRs (their SGEs are already
// linked from them) and returns how many it took and the errno.
func (c *chain[WR]) post(n, _ int) (int, syscall.Errno) {
	*c.bad = 0
	first := uintptr(unsafe.Pointer(&c.wrs[0]))
	rc := int32(ccall(c.op, c.obj, first, uintptr(unsafe.Pointer(c.bad))))
	if rc == 0 {
		return n, 0
	}
	posted := 0
	if b := *c.bad; b != 0 {
		posted = int((b - first) / unsafe.Sizeof(*new(WR)))
	}
	return posted, syscall.Errno(rc)
}

// sgeAt is the address of the i-th SGE, or 0 when the WR has none.
func (c *chain[WR]) sgeAt(i, n int) uintptr {
	if n == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&c.sges[i]))
}

// fillSend writes w as the i-th send WR of the chain, its SGEs from
// nsge on, and links it to the one before.
func (c *chain[WR]) fillSend(i, nsge int, w *verbs.SendWR) {
	d := (*ibvSendWR)(unsafe.Pointer(&c.wrs[i]))
	copy(c.sges[nsge:], w.SGL)
	*d = ibvSendWR{
		wrID:      w.ID,
		sgList:    c.sgeAt(nsge, len(w.SGL)),
		numSGE:    int32(len(w.SGL)),
		opcode:    uint32(w.Opcode),
		sendFlags: uint32(w.Flags),
		imm:       bits.ReverseBytes32(w.Imm),
	}
	switch d.opcode {
	case ibvWROpRDMAWrite, ibvWROpRDMAWriteImm, ibvWROpRDMARead:
		r := (*wrRDMA)(unsafe.Pointer(&d.wr))
		r.remoteAddr, r.rkey = w.RemoteAddr, w.RKey
	case ibvWROpAtomicCmpSwp, ibvWROpAtomicFetchAdd:
		a := (*wrAtomic)(unsafe.Pointer(&d.wr))
		a.remoteAddr, a.rkey, a.compareAdd, a.swap = w.RemoteAddr, w.RKey, w.CompareAdd, w.Swap
	default:
		if h, ok := w.AH.(*ah); ok && h != nil {
			u := (*wrUD)(unsafe.Pointer(&d.wr))
			u.ah, u.remoteQPN, u.remoteQKey = h.h.ah, w.RemoteQPN, w.RemoteQKey
		}
	}
	if i > 0 {
		(*ibvSendWR)(unsafe.Pointer(&c.wrs[i-1])).next = uintptr(unsafe.Pointer(d))
	}
}

// fillRecv is fillSend for a receive WR.
func (c *chain[WR]) fillRecv(i, nsge int, w *verbs.RecvWR) {
	d := (*ibvRecvWR)(unsafe.Pointer(&c.wrs[i]))
	copy(c.sges[nsge:], w.SGL)
	*d = ibvRecvWR{wrID: w.ID, sgList: c.sgeAt(nsge, len(w.SGL)), numSGE: int32(len(w.SGL))}
	if i > 0 {
		(*ibvRecvWR)(unsafe.Pointer(&c.wrs[i-1])).next = uintptr(unsafe.Pointer(d))
	}
}
