//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The purego binding's calls into libibverbs for protection domains and
// memory regions; mr_shared.go drives them.

// pdHandle is a struct ibv_pd.
type pdHandle struct{ p uintptr }

func (h ctxHandle) allocPD() (pdHandle, error) {
	p, err := ccallErrno(ibv.allocPD, h.c)
	if p == 0 {
		return pdHandle{}, callErr(err)
	}
	return pdHandle{p}, nil
}

func (h pdHandle) dealloc() error { return rcErr(int32(ccall(ibv.deallocPD, h.p))) }

// mrHandle is a struct ibv_mr.
type mrHandle struct{ m uintptr }

// regMR registers buf, which is off the Go heap: C keeps its address.
func (h pdHandle) regMR(buf []byte, access verbs.Access) (mrHandle, error) {
	m, err := ccallErrno(ibv.regMR, h.p, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(access))
	if m == 0 {
		return mrHandle{}, callErr(err)
	}
	return mrHandle{m}, nil
}

func (h mrHandle) keys() (lkey, rkey uint32) {
	return *at[uint32](h.m, offMRLKey), *at[uint32](h.m, offMRRKey)
}
func (h mrHandle) dereg() error { return rcErr(int32(ccall(ibv.deregMR, h.m))) }
