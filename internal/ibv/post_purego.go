//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"fmt"
	"math/bits"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// chain is the scratch a queue posts from: room for its WRs, their SGEs
// and bad_wr, mapped off the Go heap. A post writes the chain there and
// hands it to the queue's post op in one call, so C sees only memory
// that is not Go's. The owner serialises posts.
type chain[WR ibvSendWR | ibvRecvWR] struct {
	mem  []byte
	wrs  []WR
	sges []verbs.SGE // same layout as struct ibv_sge (abi_cgo.go)
	bad  *uintptr
}

func newChain[WR ibvSendWR | ibvRecvWR](maxWR, maxSGE int) (*chain[WR], error) {
	wrSize := int(unsafe.Sizeof(*new(WR)))
	sgeSize := int(unsafe.Sizeof(verbs.SGE{}))
	n := maxWR*wrSize + maxWR*maxSGE*sgeSize + 8
	mem, err := mapScratch(n)
	if err != nil {
		return nil, err
	}
	c := &chain[WR]{mem: mem}
	c.wrs = unsafe.Slice((*WR)(unsafe.Pointer(&mem[0])), maxWR)
	if maxSGE > 0 {
		c.sges = unsafe.Slice((*verbs.SGE)(unsafe.Pointer(&mem[maxWR*wrSize])), maxWR*maxSGE)
	}
	c.bad = (*uintptr)(unsafe.Pointer(&mem[n-8]))
	return c, nil
}

func (c *chain[WR]) free() {
	if c != nil {
		unmapScratch(c.mem)
		c.mem, c.wrs, c.sges, c.bad = nil, nil, nil, nil
	}
}

// post calls the post op fn on obj (a QP or SRQ) with the first n WRs
// and returns how many it took and the errno.
func (c *chain[WR]) post(fn, obj uintptr, n int) (int, syscall.Errno) {
	*c.bad = 0
	first := uintptr(unsafe.Pointer(&c.wrs[0]))
	rc := int32(ccall(fn, obj, first, uintptr(unsafe.Pointer(c.bad))))
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
			u.ah, u.remoteQPN, u.remoteQKey = h.ah, w.RemoteQPN, w.RemoteQKey
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

// postRecv builds and posts a receive chain for a QP or an SRQ through
// fn, its post_recv or post_srq_recv op.
func postRecv(fn, obj uintptr, c *chain[ibvRecvWR], maxSGE int, wrs []verbs.RecvWR) (int, error) {
	n, nsge := 0, 0
	var bad error
	for i := range wrs {
		w := &wrs[i]
		if i >= len(c.wrs) {
			bad = fmt.Errorf("%w: chain longer than the %d WRs the receive queue holds", verbs.ErrQueueFull, len(c.wrs))
			break
		}
		if len(w.SGL) > maxSGE {
			bad = fmt.Errorf("%w: %d SGEs, the queue was granted %d", verbs.ErrInvalid, len(w.SGL), maxSGE)
			break
		}
		c.fillRecv(i, nsge, w)
		nsge += len(w.SGL)
		n++
	}
	if n > 0 {
		if posted, errno := c.post(fn, obj, n); errno != 0 {
			return posted, &verbs.PostError{Op: "post_recv", Posted: posted, Err: errnoErr("ibv_post_recv", errno)}
		}
	}
	if bad != nil {
		return n, &verbs.PostError{Op: "post_recv", Posted: n, Err: bad}
	}
	return n, nil
}
