//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/go-rdma/rdma/internal/sysfs"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The verbs logic both bindings share, as cm_shared.go is rdma_cm's: the
// cgo binding (ibv.go, mr.go, cq.go, qp.go, srq.go) and the purego one
// (the *_purego.go files) each supply handles to the libibverbs objects
// (ctxHandle, pdHandle, cqHandle, ...) and the calls into libibverbs on
// them, taking and returning Go values; the checks, lifetimes, state and
// error texts are here and in the other *_shared.go files.

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
	defer c.close()
	if d.Usable = fillPorts(c, d); !d.Usable {
		d.Why = "no port is ACTIVE"
	}
}

// fillPorts sets each port's state and MTUs from ibv_query_port and
// reports whether one of them is ACTIVE.
func fillPorts(c ctxHandle, d *verbs.DeviceInfo) bool {
	active := false
	for i := range d.Ports {
		pa, err := c.queryPort(d.Ports[i].Port)
		if err != nil {
			continue
		}
		d.Ports[i].State = pa.State
		d.Ports[i].ActiveMTU = pa.ActiveMTU
		d.Ports[i].MaxMTU = pa.MaxMTU
		if d.Ports[i].State == verbs.PortActive {
			active = true
		}
	}
	return active
}

// linkLayer names a port's link_layer.
func linkLayer(v uint8) string {
	if v == ibvLinkLayerEthernet {
		return "Ethernet"
	}
	return "InfiniBand"
}

// ibvLinkLayerEthernet is IBV_LINK_LAYER_ETHERNET (abi_cgo.go checks it).
const ibvLinkLayerEthernet = 2

// devList caches libibverbs' device list. Building it scans sysfs and
// loads provider libraries, which is slow on an emulated machine; a name
// that is not in the cache makes it rebuild (a hot-plugged device).
var devList struct {
	sync.Mutex
	list deviceList // the zero deviceList until the first build
}

// openByName opens the libibverbs device called name. It is the one way
// to a device, so it is where libibverbs is loaded.
func openByName(name string) (ctxHandle, error) {
	if err := loadVerbs(); err != nil {
		return ctxHandle{}, err
	}
	devList.Lock()
	defer devList.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if devList.list == (deviceList{}) || attempt == 1 {
			if devList.list != (deviceList{}) {
				devList.list.free()
				devList.list = deviceList{}
			}
			list, err := getDeviceList()
			if err != nil {
				return ctxHandle{}, errnoErr("ibv_get_device_list", err)
			}
			devList.list = list
		}
		for i := range devList.list.len() {
			if devList.list.name(i) != name {
				continue
			}
			c, err := devList.list.open(i)
			if err != nil {
				return ctxHandle{}, errnoErr("ibv_open_device "+name, err)
			}
			return c, nil
		}
	}
	return ctxHandle{}, fmt.Errorf("ibv: device %q: %w (libibverbs lists %d devices; is ibverbs-providers installed?)", name, verbs.ErrNoDevice, devList.list.len())
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
	ctx := &devContext{h: c, info: info}
	if ctx.attr, err = c.queryDevice(); err != nil {
		c.close()
		return nil, errnoErr("ibv_query_device", err)
	}
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

// devContext is an open device.
type devContext struct {
	lt    verbs.Lifetime
	h     ctxHandle
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
	pa, err := c.h.queryPort(port)
	if err != nil {
		return verbs.PortAttr{}, errnoErr(fmt.Sprintf("ibv_query_port %d", port), err)
	}
	return pa, nil
}

func (c *devContext) QueryGID(port uint8, index int) (verbs.GID, error) {
	if !c.lt.Enter() {
		return verbs.GID{}, verbs.ErrClosed
	}
	defer c.lt.Exit()
	g, err := c.h.queryGID(port, index)
	if err != nil {
		return verbs.GID{}, errnoErr(fmt.Sprintf("ibv_query_gid port %d index %d", port, index), err)
	}
	return g, nil
}

func (c *devContext) AsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	if !c.lt.Enter() {
		return verbs.AsyncEvent{}, verbs.ErrClosed
	}
	if c.async == nil {
		w, err := newFDWaiter(c.h.asyncFD(), "ibv-async")
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
		var err error
		out, srqKey, err = c.h.getAsyncEvent()
		if err == syscall.EAGAIN {
			return false, nil
		}
		if err != nil {
			return true, errnoErr("ibv_get_async_event", err)
		}
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

func (c *devContext) Close() error {
	return c.lt.Close(func() error {
		if c.async != nil {
			c.async.close()
		}
		if err := c.h.close(); err != nil {
			return errnoErr("ibv_close_device", err)
		}
		return nil
	})
}
