//go:build linux && !cgo && (amd64 || arm64)

package ibv

import "unsafe"

// The purego binding's calls into libibverbs for SRQs; srq_shared.go
// drives them, and posts through a recvChain (post_purego.go).

// srqHandle is a struct ibv_srq.
type srqHandle struct{ srq uintptr }

// createSRQ creates an SRQ whose srq_context is key and returns it and
// the WRs and SGEs granted.
func (h pdHandle) createSRQ(maxWR, maxSGE int, key uint64) (srqHandle, int, int, error) {
	ia := ibvSRQInitAttr{srqContext: uintptr(key), attr: ibvSRQAttr{maxWR: uint32(maxWR), maxSGE: uint32(maxSGE)}}
	s, err := ccallErrno(ibv.createSRQ, h.p, uintptr(unsafe.Pointer(&ia)))
	if s == 0 {
		return srqHandle{}, 0, 0, callErr(err)
	}
	return srqHandle{s}, int(ia.attr.maxWR), int(ia.attr.maxSGE), nil
}

func (h srqHandle) setLimit(limit int) error {
	attr := ibvSRQAttr{srqLimit: uint32(limit)}
	return rcErr(int32(ccall(ibv.modifySRQ, h.srq, uintptr(unsafe.Pointer(&attr)), ibvSRQLimit)))
}

func (h srqHandle) destroy() error { return rcErr(int32(ccall(ibv.destroySRQ, h.srq))) }
