//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"syscall"
	"unsafe"
)

// The purego binding's calls into librdmacm; cm_shared.go drives them.
// Memory C reads during a call is Go memory that ccall keeps in place for
// the call (a socket address, a struct rdma_conn_param, an out-pointer);
// the private data a struct rdma_conn_param points to is pinned for the
// call. librdmacm copies both into its command and keeps neither.

// rdmacmFns holds the resolved librdmacm functions, as loader.c's struct
// rdmacm_fns does.
type rdmacmFns struct {
	createEventChannel, destroyEventChannel, createID, destroyID, migrateID uintptr
	getCMEvent, ackCMEvent, bindAddr, listen, resolveAddr, resolveRoute     uintptr
	initQPAttr, connect, accept, establish, reject, disconnect              uintptr
}

var rdmacm rdmacmFns

// loadRDMACM dlopens librdmacm from path and resolves every function
// into rdmacm, at the versions loader.c binds.
func loadRDMACM(path string) error {
	const v10, v12 = "RDMACM_1.0", "RDMACM_1.2"
	var next rdmacmFns
	syms := []sym{
		{"rdma_create_event_channel", v10, &next.createEventChannel},
		{"rdma_destroy_event_channel", v10, &next.destroyEventChannel},
		{"rdma_create_id", v10, &next.createID},
		{"rdma_destroy_id", v10, &next.destroyID},
		{"rdma_migrate_id", v10, &next.migrateID},
		{"rdma_get_cm_event", v10, &next.getCMEvent},
		{"rdma_ack_cm_event", v10, &next.ackCMEvent},
		{"rdma_bind_addr", v10, &next.bindAddr},
		{"rdma_listen", v10, &next.listen},
		{"rdma_resolve_addr", v10, &next.resolveAddr},
		{"rdma_resolve_route", v10, &next.resolveRoute},
		{"rdma_init_qp_attr", v12, &next.initQPAttr},
		{"rdma_connect", v10, &next.connect},
		{"rdma_accept", v10, &next.accept},
		{"rdma_establish", v12, &next.establish},
		{"rdma_reject", v10, &next.reject},
		{"rdma_disconnect", v10, &next.disconnect},
	}
	if err := dlopenSyms(path, syms); err != nil {
		return err
	}
	rdmacm = next
	return nil
}

// cmHandles is an rdma_cm id and its event channel.
type cmHandles struct {
	ch uintptr // struct rdma_event_channel *
	id uintptr // struct rdma_cm_id *
}

func cmCreateChannel() (cmHandles, error) {
	ch, err := ccallErrno(rdmacm.createEventChannel)
	if ch == 0 {
		if err == nil {
			err = syscall.EIO
		}
		return cmHandles{}, err
	}
	return cmHandles{ch: ch}, nil
}

func (h cmHandles) fd() int { return int(*at[int32](h.ch, offCMChannelFD)) }

func (h *cmHandles) createID() error {
	var id uintptr
	if err := ccallStatus(rdmacm.createID, h.ch, uintptr(unsafe.Pointer(&id)), 0, rdmaPSTCP); err != nil {
		return err
	}
	h.id = id
	return nil
}

func (h cmHandles) destroyID() error { return ccallStatus(rdmacm.destroyID, h.id) }

func (h cmHandles) destroyChannel() { ccall(rdmacm.destroyEventChannel, h.ch) }

// getEvent reads one event without blocking (EAGAIN when none is ready),
// copies it out, gives the id of a connection request its own event
// channel and acknowledges the event, which frees it and its private
// data.
func (h cmHandles) getEvent() (cmEvent, error) {
	var p uintptr
	if err := ccallStatus(rdmacm.getCMEvent, h.ch, uintptr(unsafe.Pointer(&p))); err != nil {
		return cmEvent{}, err
	}
	ev := at[rdmaCMEvent](p, 0)
	out := cmEvent{typ: int(ev.event), status: int(ev.status), h: cmHandles{id: ev.id}}
	// Multicast events carry UD parameters, not a connection's.
	if ev.event != cmMulticastJoin && ev.event != cmMulticastError {
		out.rr, out.depth = ev.conn.responderResources, ev.conn.initiatorDepth
		if n := int(ev.conn.privateDataLen); n > 0 && ev.conn.privateData != 0 {
			out.priv = append([]byte(nil), unsafe.Slice(at[byte](ev.conn.privateData, 0), n)...)
		}
	}
	if ev.event == cmConnectRequest {
		if nch, err := cmCreateChannel(); err != nil {
			out.migrateErr = errnoOf(err)
		} else if err := ccallStatus(rdmacm.migrateID, ev.id, nch.ch); err != nil {
			out.migrateErr = errnoOf(err)
			nch.destroyChannel()
		} else {
			out.h.ch = nch.ch
		}
	}
	ccall(rdmacm.ackCMEvent, p)
	if out.migrateErr != 0 {
		out.h.reject(nil)
		out.h.destroyID()
		out.h = cmHandles{}
	}
	return out, nil
}

// errnoOf is err's errno, EIO when it has none.
func errnoOf(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return syscall.EIO
}

// sockaddrStorage is a struct sockaddr_storage, 8-byte aligned as in C.
type sockaddrStorage [sizeofSockaddrStorage / 8]uint64

func (s *sockaddrStorage) bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(s)), sizeofSockaddrStorage)
}

// fillSockaddr builds an IPv4 (for an IPv4 or v4-mapped a) or IPv6
// socket address, as cm.go's gordma_fill_sockaddr does.
func fillSockaddr(s *sockaddrStorage, a netip.AddrPort) {
	*s = sockaddrStorage{}
	b := s.bytes()
	ip := a.Addr()
	if ip.Is4() || ip.Is4In6() {
		binary.NativeEndian.PutUint16(b, afInet)
		binary.BigEndian.PutUint16(b[offSinPort:], a.Port())
		v4 := ip.Unmap().As4()
		copy(b[offSinAddr:], v4[:])
		return
	}
	binary.NativeEndian.PutUint16(b, afInet6)
	binary.BigEndian.PutUint16(b[offSin6Port:], a.Port())
	v6 := ip.As16()
	copy(b[offSin6Addr:], v6[:])
	binary.NativeEndian.PutUint32(b[offSin6ScopeID:], cmScope(a))
}

func (h cmHandles) bind(a netip.AddrPort) error {
	var s sockaddrStorage
	fillSockaddr(&s, a)
	return ccallStatus(rdmacm.bindAddr, h.id, uintptr(unsafe.Pointer(&s)))
}

func (h cmHandles) listen(backlog int) error {
	return ccallStatus(rdmacm.listen, h.id, uintptr(backlog))
}

func (h cmHandles) resolveAddr(src, dst netip.AddrPort, ms int) error {
	var s, d sockaddrStorage
	fillSockaddr(&d, dst)
	if !src.IsValid() {
		return ccallStatus(rdmacm.resolveAddr, h.id, 0, uintptr(unsafe.Pointer(&d)), uintptr(ms))
	}
	fillSockaddr(&s, src)
	return ccallStatus(rdmacm.resolveAddr, h.id, uintptr(unsafe.Pointer(&s)), uintptr(unsafe.Pointer(&d)), uintptr(ms))
}

func (h cmHandles) resolveRoute(ms int) error {
	return ccallStatus(rdmacm.resolveRoute, h.id, uintptr(ms))
}

// sockAddr reads the id's local or peer socket address (the source or
// destination of route.addr).
func (h cmHandles) sockAddr(peer bool) CMAddr {
	off := offCMIDSrcAddr
	if peer {
		off = offCMIDDstAddr
	}
	b := unsafe.Slice(at[byte](h.id, off), sizeofSockaddrStorage)
	var ip [16]byte
	switch binary.NativeEndian.Uint16(b) {
	case afInet:
		ip[10], ip[11] = 0xff, 0xff
		copy(ip[12:], b[offSinAddr:offSinAddr+4])
		return cmAddrFrom(ip, binary.BigEndian.Uint16(b[offSinPort:]), true)
	case afInet6:
		copy(ip[:], b[offSin6Addr:offSin6Addr+16])
		return cmAddrFrom(ip, binary.BigEndian.Uint16(b[offSin6Port:]), false)
	}
	return CMAddr{}
}

// device is the name of the device the id is bound to, its port and
// whether the port's link layer is InfiniBand; ok is false when the id
// is bound to none.
func (h cmHandles) device() (name string, port uint8, ibLink, ok bool) {
	v := *at[uintptr](h.id, offCMIDVerbs)
	if v == 0 {
		return "", 0, false, false
	}
	dev := *at[uintptr](v, offContextDevice)
	if dev == 0 {
		return "", 0, false, false
	}
	name = goString(ccall(ibv.getDeviceName, dev))
	port = *at[uint8](h.id, offCMIDPortNum)
	var pa ibvPortAttr
	if (ctxHandle{v}).queryPortAttr(port, &pa) == 0 {
		ibLink = pa.linkLayer == ibvLinkLayerIB
	}
	return name, port, ibLink, true
}

// establish calls rdma_accept (accept) or rdma_connect with p.
func (h cmHandles) establish(accept bool, p cmConnParams) error {
	cp := rdmaConnParam{
		privateDataLen:     uint8(len(p.data)),
		responderResources: p.rr,
		initiatorDepth:     p.depth,
		rnrRetryCount:      p.rnr,
		qpNum:              p.qpn,
	}
	if !accept {
		cp.retryCount = p.retry
	}
	if p.srq {
		cp.srq = 1
	}
	// cp holds the data's address as a uintptr, which keeps nothing
	// alive or in place: the pin does, until librdmacm has copied it.
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(p.data) > 0 {
		data := append([]byte(nil), p.data...)
		pin.Pin(&data[0])
		cp.privateData = uintptr(unsafe.Pointer(&data[0]))
	}
	fn := rdmacm.connect
	if accept {
		fn = rdmacm.accept
	}
	return ccallStatus(fn, h.id, uintptr(unsafe.Pointer(&cp)))
}

func (h cmHandles) rdmaEstablish() error { return ccallStatus(rdmacm.establish, h.id) }

func (h cmHandles) reject(data []byte) error {
	if len(data) == 0 {
		return ccallStatus(rdmacm.reject, h.id, 0, 0)
	}
	return ccallStatus(rdmacm.reject, h.id, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)))
}

func (h cmHandles) disconnect() error { return ccallStatus(rdmacm.disconnect, h.id) }

// initQPAttr asks rdma_cm for the attributes of the state attr holds
// and returns the mask of those to apply.
func (h cmHandles) initQPAttr(attr *qpAttr) (int, error) {
	var mask int32
	if err := ccallStatus(rdmacm.initQPAttr, h.id, uintptr(unsafe.Pointer(attr)), uintptr(unsafe.Pointer(&mask))); err != nil {
		return 0, err
	}
	return int(mask), nil
}
