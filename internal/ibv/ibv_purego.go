//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"context"
	"encoding/binary"
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
	defer ccall(ibv.closeDevice, c)
	if d.Usable = fillPorts(c, d); !d.Usable {
		d.Why = "no port is ACTIVE"
	}
}

// fillPorts sets each port's state and MTUs from ibv_query_port and
// reports whether one of them is ACTIVE.
func fillPorts(c uintptr, d *verbs.DeviceInfo) bool {
	active := false
	for i := range d.Ports {
		var pa ibvPortAttr
		if queryPort(c, d.Ports[i].Port, &pa) != 0 {
			continue
		}
		d.Ports[i].State = verbs.PortState(pa.state)
		d.Ports[i].ActiveMTU = verbs.MTU(pa.activeMTU)
		d.Ports[i].MaxMTU = verbs.MTU(pa.maxMTU)
		if d.Ports[i].State == verbs.PortActive {
			active = true
		}
	}
	return active
}

// queryPort is verbs.h's ibv_query_port (loader.c's gordma_query_port):
// the query_port op of an extended context that has one, else the compat
// symbol, which fills the prefix of the struct that old providers know.
func queryPort(c uintptr, port uint8, pa *ibvPortAttr) int32 {
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

// devList caches libibverbs' device list. Building it scans sysfs and
// loads provider libraries, which is slow on an emulated machine; a name
// that is not in the cache makes it rebuild (a hot-plugged device).
var devList struct {
	sync.Mutex
	list uintptr // struct ibv_device **
	n    int
}

// openByName opens the libibverbs device called name. It is the one way
// to a device, so it is where libibverbs is loaded.
func openByName(name string) (uintptr, error) {
	if err := loadVerbs(); err != nil {
		return 0, err
	}
	devList.Lock()
	defer devList.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if devList.list == 0 || attempt == 1 {
			if devList.list != 0 {
				ccall(ibv.freeDeviceList, devList.list)
				devList.list, devList.n = 0, 0
			}
			var n int32
			list, err := ccallErrno(ibv.getDeviceList, uintptr(unsafe.Pointer(&n)))
			if list == 0 {
				return 0, errnoErr("ibv_get_device_list", err)
			}
			devList.list, devList.n = list, int(n)
		}
		for i := 0; i < devList.n; i++ {
			d := *at[uintptr](devList.list, i*8)
			if goString(ccall(ibv.getDeviceName, d)) != name {
				continue
			}
			c, err := ccallErrno(ibv.openDevice, d)
			if c == 0 {
				return 0, errnoErr("ibv_open_device "+name, err)
			}
			return c, nil
		}
	}
	return 0, fmt.Errorf("ibv: device %q: %w (libibverbs lists %d devices; is ibverbs-providers installed?)", name, verbs.ErrNoDevice, devList.n)
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
	var da ibvDeviceAttr
	if rc := ccall(ibv.queryDevice, c, uintptr(unsafe.Pointer(&da))); rc != 0 {
		ccall(ibv.closeDevice, c)
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

func deviceAttr(a *ibvDeviceAttr) verbs.DeviceAttr {
	fw := a.fwVer[:]
	for i, b := range fw {
		if b == 0 {
			fw = fw[:i]
			break
		}
	}
	return verbs.DeviceAttr{
		FWVer:           string(fw),
		NodeGUID:        verbs.GUID(binary.BigEndian.Uint64(a.nodeGUID[:])),
		VendorID:        a.vendorID,
		VendorPartID:    a.vendorPartID,
		MaxMRSize:       a.maxMRSize,
		MaxQP:           int(a.maxQP),
		MaxQPWR:         int(a.maxQPWR),
		MaxSGE:          int(a.maxSGE),
		MaxCQ:           int(a.maxCQ),
		MaxCQE:          int(a.maxCQE),
		MaxMR:           int(a.maxMR),
		MaxPD:           int(a.maxPD),
		MaxQPRdAtom:     int(a.maxQPRdAtom),
		MaxQPInitRdAtom: int(a.maxQPInitRdAtom),
		MaxSRQ:          int(a.maxSRQ),
		MaxSRQWR:        int(a.maxSRQWR),
		MaxSRQSGE:       int(a.maxSRQSGE),
		MaxSGERd:        int(a.maxSGERd),
		AtomicCap:       int(a.atomicCap),
		PhysPortCnt:     int(a.physPortCnt),
	}
}

// devContext is an open device.
type devContext struct {
	lt    verbs.Lifetime
	c     uintptr // struct ibv_context *
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
	var pa ibvPortAttr
	if rc := queryPort(c.c, port, &pa); rc != 0 {
		return verbs.PortAttr{}, errnoErr(fmt.Sprintf("ibv_query_port %d", port), syscall.Errno(rc))
	}
	ll := "InfiniBand"
	if pa.linkLayer == ibvLinkLayerEthernet {
		ll = "Ethernet"
	}
	return verbs.PortAttr{
		State:       verbs.PortState(pa.state),
		MaxMTU:      verbs.MTU(pa.maxMTU),
		ActiveMTU:   verbs.MTU(pa.activeMTU),
		LID:         pa.lid,
		GIDTableLen: int(pa.gidTblLen),
		LinkLayer:   ll,
		MaxMsgSize:  pa.maxMsgSz,
	}, nil
}

func (c *devContext) QueryGID(port uint8, index int) (verbs.GID, error) {
	if !c.lt.Enter() {
		return verbs.GID{}, verbs.ErrClosed
	}
	defer c.lt.Exit()
	var g verbs.GID
	if rc, err := ccallErrno(ibv.queryGID, c.c, uintptr(port), uintptr(index), uintptr(unsafe.Pointer(&g))); rc != 0 {
		return verbs.GID{}, errnoErr(fmt.Sprintf("ibv_query_gid port %d index %d", port, index), err)
	}
	return g, nil
}

func (c *devContext) AsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	if !c.lt.Enter() {
		return verbs.AsyncEvent{}, verbs.ErrClosed
	}
	if c.async == nil {
		w, err := newFDWaiter(int(*at[int32](c.c, offContextAsyncFD)), "ibv-async")
		if err != nil {
			c.lt.Exit()
			return verbs.AsyncEvent{}, err
		}
		c.async = w
	}
	w := c.async
	c.lt.Exit() // waiting must not hold off Close; Close wakes us
	var out verbs.AsyncEvent
	var srqKey uint64
	err := w.wait(ctx, func() (bool, error) {
		var ev ibvAsyncEvent
		rc, err := ccallErrno(ibv.getAsyncEvent, c.c, uintptr(unsafe.Pointer(&ev)))
		if rc != 0 {
			if err == syscall.EAGAIN {
				return false, nil
			}
			return true, errnoErr("ibv_get_async_event", err)
		}
		out, srqKey = asyncEvent(&ev)
		ccall(ibv.ackAsyncEvent, uintptr(unsafe.Pointer(&ev)))
		return true, nil
	})
	if err != nil {
		return verbs.AsyncEvent{}, err
	}
	if srqKey != 0 {
		if s, ok := c.srqs.Load(srqKey); ok {
			out.SRQ = s.(*srq) // only when found: a nil *srq would make a non-nil interface
		}
	}
	return out, nil
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

func (c *devContext) Close() error {
	return c.lt.Close(func() error {
		if c.async != nil {
			c.async.close()
		}
		// ibv_close_device returns -1 on failure (errno, if set, says
		// why), unlike the destroy calls, which return the errno.
		if rc, err := ccallErrno(ibv.closeDevice, c.c); int32(rc) != 0 {
			return errnoErr("ibv_close_device", err)
		}
		return nil
	})
}
