//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The cgo binding's calls into libibverbs for devices (loader.c's
// trampolines and shim.h's helpers); ibv_shared.go drives them.

// deviceList is libibverbs' device list.
type deviceList struct {
	l **C.struct_ibv_device
	n int
}

func getDeviceList() (deviceList, error) {
	var n C.int
	l, err := C.gordma_ibv_get_device_list(&n)
	if l == nil {
		return deviceList{}, callErr(err)
	}
	return deviceList{l, int(n)}, nil
}

func (d deviceList) len() int { return d.n }
func (d deviceList) free()    { C.gordma_ibv_free_device_list(d.l) }

func (d deviceList) name(i int) string {
	return C.GoString(C.gordma_ibv_get_device_name(unsafe.Slice(d.l, d.n)[i]))
}

func (d deviceList) open(i int) (ctxHandle, error) {
	c, err := C.gordma_ibv_open_device(unsafe.Slice(d.l, d.n)[i])
	if c == nil {
		return ctxHandle{}, callErr(err)
	}
	return ctxHandle{c}, nil
}

// ctxHandle is an open device, a struct ibv_context.
type ctxHandle struct{ c *C.struct_ibv_context }

// close returns -1 on failure (errno, if set, says why), unlike the
// destroy calls, which return the errno.
func (h ctxHandle) close() error {
	if rc, err := C.gordma_ibv_close_device(h.c); rc != 0 {
		return callErr(err)
	}
	return nil
}

func (h ctxHandle) queryDevice() (verbs.DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if rc := C.gordma_ibv_query_device(h.c, &a); rc != 0 {
		return verbs.DeviceAttr{}, syscall.Errno(rc)
	}
	return verbs.DeviceAttr{
		FWVer:            C.GoString(&a.fw_ver[0]),
		NodeGUID:         verbs.GUID(be64(uint64(a.node_guid))),
		VendorID:         uint32(a.vendor_id),
		VendorPartID:     uint32(a.vendor_part_id),
		MaxMRSize:        uint64(a.max_mr_size),
		MaxQP:            int(a.max_qp),
		MaxQPWR:          int(a.max_qp_wr),
		MaxSGE:           int(a.max_sge),
		MaxCQ:            int(a.max_cq),
		MaxCQE:           int(a.max_cqe),
		MaxMR:            int(a.max_mr),
		MaxPD:            int(a.max_pd),
		MaxQPRdAtom:      int(a.max_qp_rd_atom),
		MaxQPInitRdAtom:  int(a.max_qp_init_rd_atom),
		MaxSRQ:           int(a.max_srq),
		MaxSRQWR:         int(a.max_srq_wr),
		MaxSRQSGE:        int(a.max_srq_sge),
		MaxSGERd:         int(a.max_sge_rd),
		AtomicCap:        int(a.atomic_cap),
		PhysPortCnt:      int(a.phys_port_cnt),
		MaxMcastGrp:      int(a.max_mcast_grp),
		MaxMcastQPAttach: int(a.max_mcast_qp_attach),
	}, nil
}

// be64 converts a big-endian field (__be64) to host order.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b)) = v
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 | uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

func (h ctxHandle) queryPort(port uint8) (verbs.PortAttr, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.gordma_query_port(h.c, C.uint8_t(port), &pa); rc != 0 {
		return verbs.PortAttr{}, syscall.Errno(rc)
	}
	return verbs.PortAttr{
		State:       verbs.PortState(pa.state),
		MaxMTU:      verbs.MTU(pa.max_mtu),
		ActiveMTU:   verbs.MTU(pa.active_mtu),
		LID:         uint16(pa.lid),
		GIDTableLen: int(pa.gid_tbl_len),
		LinkLayer:   linkLayer(uint8(pa.link_layer)),
		MaxMsgSize:  uint32(pa.max_msg_sz),
	}, nil
}

func (h ctxHandle) queryGID(port uint8, index int) (verbs.GID, error) {
	var g C.union_ibv_gid
	if rc, err := C.gordma_ibv_query_gid(h.c, C.uint8_t(port), C.int(index), &g); rc != 0 {
		return verbs.GID{}, callErr(err)
	}
	return *(*verbs.GID)(unsafe.Pointer(&g)), nil
}

func (h ctxHandle) asyncFD() int { return int(h.c.async_fd) }

// getAsyncEvent reads and acknowledges one async event without blocking
// (EAGAIN when none is ready). It returns the event and, for an SRQ's,
// the key in the SRQ's srq_context.
func (h ctxHandle) getAsyncEvent() (verbs.AsyncEvent, uint64, error) {
	var ev C.gordma_async_event
	if rc := C.gordma_get_async_event(h.c, &ev); rc != 0 {
		return verbs.AsyncEvent{}, 0, syscall.Errno(rc)
	}
	return verbs.AsyncEvent{Type: verbs.AsyncEventType(ev._type), QPN: uint32(ev.qp_num), Port: uint8(ev.port)}, uint64(ev.srq_key), nil
}
