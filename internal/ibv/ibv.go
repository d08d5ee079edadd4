//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/sysfs"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Provider is the libibverbs provider.
var Provider verbs.Provider = provider{}

type provider struct{}

func (provider) Name() string { return "verbs" }

// Devices lists devices from sysfs and marks those this process can open
// and that have an ACTIVE port as usable. It fills the port MTUs from
// ibv_query_port, which sysfs lacks. Without libibverbs every device is
// unusable, and Why says that the library could not be loaded.
func (provider) Devices() ([]verbs.DeviceInfo, error) {
	devs, err := sysfs.Devices()
	if err != nil || len(devs) == 0 {
		return devs, err
	}
	if err := loadVerbs(); err != nil {
		for i := range devs {
			devs[i].Usable, devs[i].Why = false, err.Error()
		}
		return devs, nil
	}
	for i := range devs {
		probe(&devs[i])
	}
	return devs, nil
}

// probe opens d to learn whether it is usable and what its MTUs are.
func probe(d *verbs.DeviceInfo) {
	c, err := openByName(d.Name)
	if err != nil {
		d.Why = err.Error()
		return
	}
	defer C.gordma_ibv_close_device(c)
	if d.Usable = fillPorts(c, d); !d.Usable {
		d.Why = "no port is ACTIVE"
	}
}

// fillPorts sets each port's state and MTUs from ibv_query_port and
// reports whether one of them is ACTIVE.
func fillPorts(c *C.struct_ibv_context, d *verbs.DeviceInfo) bool {
	active := false
	for i := range d.Ports {
		var pa C.struct_ibv_port_attr
		if C.gordma_query_port(c, C.uint8_t(d.Ports[i].Port), &pa) != 0 {
			continue
		}
		d.Ports[i].State = verbs.PortState(pa.state)
		d.Ports[i].ActiveMTU = verbs.MTU(pa.active_mtu)
		d.Ports[i].MaxMTU = verbs.MTU(pa.max_mtu)
		if d.Ports[i].State == verbs.PortActive {
			active = true
		}
	}
	return active
}

// devList caches libibverbs' device list. Building it scans sysfs and
// loads provider libraries, which is slow on an emulated machine; a name
// that is not in the cache makes it rebuild (a hot-plugged device).
var devList struct {
	sync.Mutex
	list **C.struct_ibv_device
	n    int
}

// openByName opens the libibverbs device called name. It is the one way
// to a device, so it is where libibverbs is loaded.
func openByName(name string) (*C.struct_ibv_context, error) {
	if err := loadVerbs(); err != nil {
		return nil, err
	}
	devList.Lock()
	defer devList.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if devList.list == nil || attempt == 1 {
			if devList.list != nil {
				C.gordma_ibv_free_device_list(devList.list)
				devList.list, devList.n = nil, 0
			}
			var n C.int
			list, err := C.gordma_ibv_get_device_list(&n)
			if list == nil {
				return nil, errnoErr("ibv_get_device_list", err)
			}
			devList.list, devList.n = list, int(n)
		}
		for _, d := range unsafe.Slice(devList.list, devList.n) {
			if C.GoString(C.gordma_ibv_get_device_name(d)) != name {
				continue
			}
			c, err := C.gordma_ibv_open_device(d)
			if c == nil {
				return nil, errnoErr("ibv_open_device "+name, err)
			}
			return c, nil
		}
	}
	return nil, fmt.Errorf("ibv: device %q: %w (libibverbs lists %d devices; is ibverbs-providers installed?)", name, verbs.ErrNoDevice, devList.n)
}

func (p provider) Open(name string) (verbs.Context, error) {
	// Before choosing a device: without the library the answer is
	// ErrNotSupported whichever device was asked for.
	if err := loadVerbs(); err != nil {
		return nil, err
	}
	if name == "" {
		d, err := p.firstUsable()
		if err != nil {
			return nil, err
		}
		name = d.Name
	}
	info, err := sysfs.Device(name)
	if err != nil {
		return nil, fmt.Errorf("ibv: %w", err)
	}
	c, err := openByName(name)
	if err != nil {
		return nil, err
	}
	ctx := &devContext{c: c, info: info}
	var da C.struct_ibv_device_attr
	if rc := C.gordma_ibv_query_device(c, &da); rc != 0 {
		C.gordma_ibv_close_device(c)
		return nil, errnoErr("ibv_query_device", syscall.Errno(rc))
	}
	ctx.attr = deviceAttr(&da)
	// Fill what sysfs lacks from the open device, as Devices does.
	ctx.info.Usable = fillPorts(c, &ctx.info)
	if !ctx.info.Usable {
		ctx.info.Why = "no port is ACTIVE"
	}
	return ctx, nil
}

// firstUsable is the first device Devices marks usable.
func (p provider) firstUsable() (verbs.DeviceInfo, error) {
	devs, err := p.Devices()
	if err != nil {
		return verbs.DeviceInfo{}, err
	}
	for _, d := range devs {
		if d.Usable {
			return d, nil
		}
	}
	return verbs.DeviceInfo{}, fmt.Errorf("ibv: %w: no usable device among %d", verbs.ErrNoDevice, len(devs))
}

func deviceAttr(a *C.struct_ibv_device_attr) verbs.DeviceAttr {
	return verbs.DeviceAttr{
		FWVer:           C.GoString(&a.fw_ver[0]),
		NodeGUID:        verbs.GUID(be64(uint64(a.node_guid))),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MaxSRQ:          int(a.max_srq),
		MaxSRQWR:        int(a.max_srq_wr),
		MaxSRQSGE:       int(a.max_srq_sge),
		MaxSGERd:        int(a.max_sge_rd),
		AtomicCap:       int(a.atomic_cap),
		PhysPortCnt:     int(a.phys_port_cnt),
	}
}

// be64 converts a big-endian field (__be64) to host order.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b)) = v
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 | uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// devContext is an open device.
type devContext struct {
	lt    verbs.Lifetime
	c     *C.struct_ibv_context
	info  verbs.DeviceInfo
	attr  verbs.DeviceAttr
	async *fdWaiter // created on the first AsyncEvent call

	qps sync.Map // QP number -> *qp, so a failed completion can mark its QP

	// srqs maps the key CreateSRQ puts in srq_context to the *srq, so an
	// SRQ event finds its SRQ while C holds only an integer. Keys are
	// never reused: an event read after its SRQ closed finds nothing
	// rather than a newer SRQ that libibverbs put at the same address.
	srqs   sync.Map // uint64 -> *srq
	srqKey atomic.Uint64
}

func (c *devContext) Info() verbs.DeviceInfo { return c.info }

func (c *devContext) QueryDevice() (verbs.DeviceAttr, error) {
	if !c.lt.Enter() {
		return verbs.DeviceAttr{}, verbs.ErrClosed
	}
	defer c.lt.Exit()
	return c.attr, nil
}

func (c *devContext) QueryPort(port uint8) (verbs.PortAttr, error) {
	if !c.lt.Enter() {
		return verbs.PortAttr{}, verbs.ErrClosed
	}
	defer c.lt.Exit()
	var pa C.struct_ibv_port_attr
	if rc := C.gordma_query_port(c.c, C.uint8_t(port), &pa); rc != 0 {
		return verbs.PortAttr{}, errnoErr(fmt.Sprintf("ibv_query_port %d", port), syscall.Errno(rc))
	}
	ll := "InfiniBand"
	if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		ll = "Ethernet"
	}
	return verbs.PortAttr{
		State:       verbs.PortState(pa.state),
		MaxMTU:      verbs.MTU(pa.max_mtu),
		ActiveMTU:   verbs.MTU(pa.active_mtu),
		LID:         uint16(pa.lid),
		GIDTableLen: int(pa.gid_tbl_len),
		LinkLayer:   ll,
		MaxMsgSize:  uint32(pa.max_msg_sz),
	}, nil
}

func (c *devContext) QueryGID(port uint8, index int) (verbs.GID, error) {
	if !c.lt.Enter() {
		return verbs.GID{}, verbs.ErrClosed
	}
	defer c.lt.Exit()
	var g C.union_ibv_gid
	if rc, err := C.gordma_ibv_query_gid(c.c, C.uint8_t(port), C.int(index), &g); rc != 0 {
		return verbs.GID{}, errnoErr(fmt.Sprintf("ibv_query_gid port %d index %d", port, index), err)
	}
	return *(*verbs.GID)(unsafe.Pointer(&g)), nil
}

func (c *devContext) AsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	if !c.lt.Enter() {
		return verbs.AsyncEvent{}, verbs.ErrClosed
	}
	if c.async == nil {
		w, err := newFDWaiter(int(c.c.async_fd), "ibv-async")
		if err != nil {
			c.lt.Exit()
			return verbs.AsyncEvent{}, err
		}
		c.async = w
	}
	w := c.async
	c.lt.Exit() // waiting must not hold off Close; Close wakes us
	var ev C.gordma_async_event
	err := w.wait(ctx, func() (bool, error) {
		rc := C.gordma_get_async_event(c.c, &ev)
		if rc == C.EAGAIN {
			return false, nil
		}
		if rc != 0 {
			return true, errnoErr("ibv_get_async_event", syscall.Errno(rc))
		}
		return true, nil
	})
	if err != nil {
		return verbs.AsyncEvent{}, err
	}
	out := verbs.AsyncEvent{Type: verbs.AsyncEventType(ev._type), QPN: uint32(ev.qp_num), Port: uint8(ev.port)}
	if ev.srq_key != 0 {
		if s, ok := c.srqs.Load(uint64(ev.srq_key)); ok {
			out.SRQ = s.(*srq) // only when found: a nil *srq would make a non-nil interface
		}
	}
	return out, nil
}

func (c *devContext) Close() error {
	return c.lt.Close(func() error {
		if c.async != nil {
			c.async.close()
		}
		// ibv_close_device returns -1 on failure (errno, if set, says
		// why), unlike the destroy calls, which return the errno.
		if rc, err := C.gordma_ibv_close_device(c.c); rc != 0 {
			return errnoErr("ibv_close_device", err)
		}
		return nil
	})
}
