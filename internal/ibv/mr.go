//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The cgo binding's calls into libibverbs for protection domains and
// memory regions; mr_shared.go drives them.

// pdHandle is a struct ibv_pd.
type pdHandle struct{ p *C.struct_ibv_pd }

func (h ctxHandle) allocPD() (pdHandle, error) {
	p, err := C.gordma_ibv_alloc_pd(h.c)
	if p == nil {
		return pdHandle{}, callErr(err)
	}
	return pdHandle{p}, nil
}

func (h pdHandle) dealloc() error { return rcErr(int32(C.gordma_ibv_dealloc_pd(h.p))) }

// mrHandle is a struct ibv_mr.
type mrHandle struct{ m *C.struct_ibv_mr }

// regMR registers buf, which is off the Go heap: C keeps its address.
func (h pdHandle) regMR(buf []byte, access verbs.Access) (mrHandle, error) {
	m, err := C.gordma_ibv_reg_mr(h.p, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access))
	if m == nil {
		return mrHandle{}, callErr(err)
	}
	return mrHandle{m}, nil
}

func (h mrHandle) keys() (lkey, rkey uint32) { return uint32(h.m.lkey), uint32(h.m.rkey) }
func (h mrHandle) dereg() error              { return rcErr(int32(C.gordma_ibv_dereg_mr(h.m))) }
