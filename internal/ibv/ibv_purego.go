//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"encoding/binary"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The purego binding's calls into libibverbs for devices
// (loader_purego.go's functions and the context's ops); ibv_shared.go
// drives them.

// deviceList is libibverbs' device list.
type deviceList struct {
	l uintptr // struct ibv_device **
	n int
}

func getDeviceList() (deviceList, error) {
	var n int32
	l, err := ccallErrno(ibv.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if l == 0 {
		return deviceList{}, callErr(err)
	}
	return deviceList{l, int(n)}, nil
}

func (d deviceList) len() int             { return d.n }
func (d deviceList) free()                { ccall(ibv.freeDeviceList, d.l) }
func (d deviceList) device(i int) uintptr { return *at[uintptr](d.l, i*8) }
func (d deviceList) name(i int) string    { return goString(ccall(ibv.getDeviceName, d.device(i))) }

func (d deviceList) open(i int) (ctxHandle, error) {
	c, err := ccallErrno(ibv.openDevice, d.device(i))
	if c == 0 {
		return ctxHandle{}, callErr(err)
	}
	return ctxHandle{c}, nil
}

// ctxHandle is an open device, a struct ibv_context.
type ctxHandle struct{ c uintptr }

// close returns -1 on failure (errno, if set, says why), unlike the
// destroy calls, which return the errno.
func (h ctxHandle) close() error { return ccallStatus(ibv.closeDevice, h.c) }

func (h ctxHandle) queryDevice() (verbs.DeviceAttr, error) {
	var a ibvDeviceAttr
	if rc := int32(ccall(ibv.queryDevice, h.c, uintptr(unsafe.Pointer(&a)))); rc != 0 {
		return verbs.DeviceAttr{}, syscall.Errno(rc)
	}
	fw := a.fwVer[:]
	for i, b := range fw {
		if b == 0 {
			fw = fw[:i]
			break
		}
	}
	return verbs.DeviceAttr{
		FWVer:            string(fw),
		NodeGUID:         verbs.GUID(binary.BigEndian.Uint64(a.nodeGUID[:])),
		VendorID:         a.vendorID,
		VendorPartID:     a.vendorPartID,
		MaxMRSize:        a.maxMRSize,
		MaxQP:            int(a.maxQP),
		MaxQPWR:          int(a.maxQPWR),
		MaxSGE:           int(a.maxSGE),
		MaxCQ:            int(a.maxCQ),
		MaxCQE:           int(a.maxCQE),
		MaxMR:            int(a.maxMR),
		MaxPD:            int(a.maxPD),
		MaxQPRdAtom:      int(a.maxQPRdAtom),
		MaxQPInitRdAtom:  int(a.maxQPInitRdAtom),
		MaxSRQ:           int(a.maxSRQ),
		MaxSRQWR:         int(a.maxSRQWR),
		MaxSRQSGE:        int(a.maxSRQSGE),
		MaxSGERd:         int(a.maxSGERd),
		AtomicCap:        int(a.atomicCap),
		PhysPortCnt:      int(a.physPortCnt),
		MaxMcastGrp:      int(a.maxMcastGrp),
		MaxMcastQPAttach: int(a.maxMcastQPAttach),
	}, nil
}

func (h ctxHandle) queryPort(port uint8) (verbs.PortAttr, error) {
	var pa ibvPortAttr
	if rc := h.queryPortAttr(port, &pa); rc != 0 {
		return verbs.PortAttr{}, syscall.Errno(rc)
	}
	return verbs.PortAttr{
		State:       verbs.PortState(pa.state),
		MaxMTU:      verbs.MTU(pa.maxMTU),
		ActiveMTU:   verbs.MTU(pa.activeMTU),
		LID:         pa.lid,
		GIDTableLen: int(pa.gidTblLen),
		LinkLayer:   linkLayer(pa.linkLayer),
		MaxMsgSize:  pa.maxMsgSz,
	}, nil
}

// queryPortAttr is verbs.h's ibv_query_port (loader.c's
// gordma_query_port): the query_port op of an extended context that has
// one, else the compat symbol, which fills the prefix of the struct that
// old providers know.
func (h ctxHandle) queryPortAttr(port uint8, pa *ibvPortAttr) int32 {
	c := h.c
	if *at[uintptr](c, offContextABICompat) == abiIsExtended {
		if *at[uint64](c, offVerbsSz) >= sizeofVerbsFromQP {
			if fn := *at[uintptr](c, offVerbsQueryPort); fn != 0 {
				return int32(ccall(fn, c, uintptr(port), uintptr(unsafe.Pointer(pa)), unsafe.Sizeof(*pa)))
			}
		}
	}
	*pa = ibvPortAttr{}
	return int32(ccall(ibv.queryPort, c, uintptr(port), uintptr(unsafe.Pointer(pa))))
}

func (h ctxHandle) queryGID(port uint8, index int) (verbs.GID, error) {
	var g verbs.GID
	if err := ccallStatus(ibv.queryGID, h.c, uintptr(port), uintptr(index), uintptr(unsafe.Pointer(&g))); err != nil {
		return verbs.GID{}, err
	}
	return g, nil
}

func (h ctxHandle) asyncFD() int { return int(*at[int32](h.c, offContextAsyncFD)) }

// getAsyncEvent reads and acknowledges one async event without blocking
// (EAGAIN when none is ready). It returns the event and, for an SRQ's,
// the key in the SRQ's srq_context.
func (h ctxHandle) getAsyncEvent() (verbs.AsyncEvent, uint64, error) {
	var ev ibvAsyncEvent
	if err := ccallStatus(ibv.getAsyncEvent, h.c, uintptr(unsafe.Pointer(&ev))); err != nil {
		return verbs.AsyncEvent{}, 0, err
	}
	out, srqKey := asyncEvent(&ev)
	ccall(ibv.ackAsyncEvent, uintptr(unsafe.Pointer(&ev)))
	return out, srqKey, nil
}

// asyncEvent reads what names the element of ev, before the ack (which
// lets ibv_destroy_srq and ibv_destroy_qp go on).
func asyncEvent(ev *ibvAsyncEvent) (verbs.AsyncEvent, uint64) {
	out := verbs.AsyncEvent{Type: verbs.AsyncEventType(ev.eventType)}
	var srqKey uint64
	switch ev.eventType {
	case ibvEventQPFatal, ibvEventQPReqErr, ibvEventQPAccessErr, ibvEventCommEst, ibvEventSQDrained,
		ibvEventPathMig, ibvEventPathMigErr, ibvEventQPLastWQE:
		if ev.element != 0 {
			out.QPN = *at[uint32](ev.element, offQPNum)
		}
	case ibvEventPortActive, ibvEventPortErr, ibvEventLIDChange, ibvEventPKeyChange, ibvEventSMChange,
		ibvEventClientReReg, ibvEventGIDChange:
		out.Port = uint8(int32(ev.element))
	case ibvEventSRQErr, ibvEventSRQLimit:
		if ev.element != 0 {
			srqKey = uint64(*at[uintptr](ev.element, offSRQContext))
		}
	}
	return out, srqKey
}
