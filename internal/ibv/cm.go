//go:build linux && cgo

package ibv

/*
#include "shim.h"
#include <netinet/in.h>
#include <sys/socket.h>

#define GORDMA_CM_DATA_MAX 256

// gordma_cm_event is an rdma_cm event copied out of librdmacm's memory,
// so the event can be acknowledged before Go looks at it.
typedef struct {
	struct rdma_cm_id *id;
	// CONNECT_REQUEST: the event channel the new id was moved to.
	struct rdma_event_channel *channel;
	int32_t  event;
	int32_t  status;
	// CONNECT_REQUEST: errno when the new id could not be moved to its
	// own channel; the request was then rejected and its id destroyed.
	int32_t  migrate_err;
	uint32_t qp_num;
	uint8_t  responder_resources;
	uint8_t  initiator_depth;
	uint8_t  private_data_len;
	uint8_t  pad;
	uint8_t  private_data[GORDMA_CM_DATA_MAX];
} gordma_cm_event;

// gordma_cm_get_event reads one event (EAGAIN when none is ready), copies
// it, gives the id of a connection request its own event channel, and
// acknowledges the event before returning.
static int gordma_cm_get_event(struct rdma_event_channel *ch, gordma_cm_event *out) {
	struct rdma_cm_event *ev = NULL;
	memset(out, 0, sizeof(*out));
	errno = 0;
	if (gordma_rdma_get_cm_event(ch, &ev) != 0) return errno ? errno : EIO;
	out->id = ev->id;
	out->event = ev->event;
	out->status = ev->status;
	if (ev->event != RDMA_CM_EVENT_MULTICAST_JOIN && ev->event != RDMA_CM_EVENT_MULTICAST_ERROR) {
		const struct rdma_conn_param *p = &ev->param.conn;
		out->qp_num = p->qp_num;
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		if (p->private_data && p->private_data_len) {
			out->private_data_len = p->private_data_len;
			memcpy(out->private_data, p->private_data, p->private_data_len);
		}
	}
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct rdma_event_channel *nch = gordma_rdma_create_event_channel();
		if (!nch) {
			out->migrate_err = errno ? errno : EIO;
		} else if (gordma_rdma_migrate_id(ev->id, nch) != 0) {
			out->migrate_err = errno ? errno : EIO;
			gordma_rdma_destroy_event_channel(nch);
		} else {
			out->channel = nch;
		}
	}
	gordma_rdma_ack_cm_event(ev);
	if (out->migrate_err) {
		gordma_rdma_reject(out->id, NULL, 0);
		gordma_rdma_destroy_id(out->id);
		out->id = NULL;
	}
	return 0;
}

// gordma_fill_sockaddr builds an IPv4 (for a v4-mapped ip) or IPv6
// socket address.
static void gordma_fill_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, uint16_t port, uint32_t scope) {
	static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	memset(ss, 0, sizeof(*ss));
	if (memcmp(ip, v4mapped, 12) == 0) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip + 12, 4);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		s->sin6_scope_id = scope;
		memcpy(&s->sin6_addr, ip, 16);
	}
}

// gordma_get_sockaddr reads a socket address into a 16-byte (v4-mapped
// for IPv4) address and a port; it returns 4, 6, or 0 for none.
static int gordma_get_sockaddr(const struct sockaddr *sa, uint8_t *ip, uint16_t *port) {
	memset(ip, 0, 16);
	*port = 0;
	if (!sa) return 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		ip[10] = ip[11] = 0xff;
		memcpy(ip + 12, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 6;
	}
	return 0;
}

static int gordma_cm_addr(struct rdma_cm_id *id, int peer, uint8_t *ip, uint16_t *port) {
	return gordma_get_sockaddr(peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id), ip, port);
}

static int gordma_cm_bind(struct rdma_cm_id *id, const uint8_t *ip, uint16_t port, uint32_t scope) {
	struct sockaddr_storage ss;
	gordma_fill_sockaddr(&ss, ip, port, scope);
	errno = 0;
	if (gordma_rdma_bind_addr(id, (struct sockaddr *)&ss) != 0) return errno ? errno : EIO;
	return 0;
}

static int gordma_cm_resolve_addr(struct rdma_cm_id *id, int has_src, const uint8_t *sip, uint16_t sport, uint32_t sscope,
		const uint8_t *dip, uint16_t dport, uint32_t dscope, int timeout_ms) {
	struct sockaddr_storage src, dst;
	gordma_fill_sockaddr(&src, sip, sport, sscope);
	gordma_fill_sockaddr(&dst, dip, dport, dscope);
	errno = 0;
	if (gordma_rdma_resolve_addr(id, has_src ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst, timeout_ms) != 0)
		return errno ? errno : EIO;
	return 0;
}

// gordma_cm_establish builds rdma_conn_param in C memory and calls
// rdma_connect (active side) or rdma_accept (passive side; retry is the
// active side's and ignored); librdmacm copies the private data into its
// command.
static int gordma_cm_establish(struct rdma_cm_id *id, int accept, uint32_t qpn, int srq, uint8_t rr, uint8_t depth,
		uint8_t retry, uint8_t rnr, const void *data, uint8_t len) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.qp_num = qpn;
	p.srq = srq ? 1 : 0;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.retry_count = accept ? 0 : retry;
	p.rnr_retry_count = rnr;
	p.private_data = len ? data : NULL;
	p.private_data_len = len;
	errno = 0;
	if ((accept ? gordma_rdma_accept(id, &p) : gordma_rdma_connect(id, &p)) != 0) return errno ? errno : EIO;
	return 0;
}

static int gordma_cm_reject(struct rdma_cm_id *id, const void *data, uint8_t len) {
	errno = 0;
	if (gordma_rdma_reject(id, len ? data : NULL, len) != 0) return errno ? errno : EIO;
	return 0;
}
*/
import "C"

import (
	"net/netip"
	"syscall"
	"unsafe"
)

// The cgo binding's calls into librdmacm (loader.c's trampolines and the
// helpers above); cm_shared.go drives them.

// cmHandles is an rdma_cm id and its event channel.
type cmHandles struct {
	ch *C.struct_rdma_event_channel
	id *C.struct_rdma_cm_id
}

func cmCreateChannel() (cmHandles, error) {
	ch, err := C.gordma_rdma_create_event_channel()
	if ch == nil {
		return cmHandles{}, err
	}
	return cmHandles{ch: ch}, nil
}

func (h cmHandles) fd() int { return int(h.ch.fd) }

func (h *cmHandles) createID() error {
	if rc, err := C.gordma_rdma_create_id(h.ch, &h.id, nil, C.RDMA_PS_TCP); rc != 0 {
		return err
	}
	return nil
}

func (h cmHandles) destroyID() error {
	if rc, err := C.gordma_rdma_destroy_id(h.id); rc != 0 {
		return err
	}
	return nil
}

func (h cmHandles) destroyChannel() { C.gordma_rdma_destroy_event_channel(h.ch) }

// getEvent reads one event without blocking (EAGAIN when none is ready).
func (h cmHandles) getEvent() (cmEvent, error) {
	var ev C.gordma_cm_event
	if rc := C.gordma_cm_get_event(h.ch, &ev); rc != 0 {
		return cmEvent{}, syscall.Errno(rc)
	}
	out := cmEvent{
		typ:        int(ev.event),
		status:     int(ev.status),
		rr:         uint8(ev.responder_resources),
		depth:      uint8(ev.initiator_depth),
		h:          cmHandles{ch: ev.channel, id: ev.id},
		migrateErr: syscall.Errno(ev.migrate_err),
	}
	if n := int(ev.private_data_len); n > 0 {
		out.priv = C.GoBytes(unsafe.Pointer(&ev.private_data[0]), C.int(n))
	}
	return out, nil
}

// sockArgs is an address in the form the C helpers take.
func sockArgs(a netip.AddrPort) (ip [16]byte, port C.uint16_t, scope C.uint32_t) {
	return a.Addr().As16(), C.uint16_t(a.Port()), C.uint32_t(cmScope(a))
}

func (h cmHandles) bind(a netip.AddrPort) error {
	ip, port, scope := sockArgs(a)
	if rc := C.gordma_cm_bind(h.id, (*C.uint8_t)(unsafe.Pointer(&ip[0])), port, scope); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

func (h cmHandles) listen(backlog int) error {
	if rc, err := C.gordma_rdma_listen(h.id, C.int(backlog)); rc != 0 {
		return err
	}
	return nil
}

func (h cmHandles) resolveAddr(src, dst netip.AddrPort, ms int) error {
	sip, sport, sscope := sockArgs(src)
	dip, dport, dscope := sockArgs(dst)
	hasSrc := C.int(0)
	if src.IsValid() {
		hasSrc = 1
	}
	if rc := C.gordma_cm_resolve_addr(h.id, hasSrc, (*C.uint8_t)(unsafe.Pointer(&sip[0])), sport, sscope,
		(*C.uint8_t)(unsafe.Pointer(&dip[0])), dport, dscope, C.int(ms)); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

func (h cmHandles) resolveRoute(ms int) error {
	if rc, err := C.gordma_rdma_resolve_route(h.id, C.int(ms)); rc != 0 {
		return err
	}
	return nil
}

func (h cmHandles) sockAddr(peer bool) CMAddr {
	var ip [16]byte
	var port C.uint16_t
	p := C.int(0)
	if peer {
		p = 1
	}
	switch C.gordma_cm_addr(h.id, p, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &port) {
	case 4:
		return cmAddrFrom(ip, uint16(port), true)
	case 6:
		return cmAddrFrom(ip, uint16(port), false)
	}
	return CMAddr{}
}

// device is the name of the device the id is bound to, its port and
// whether the port's link layer is InfiniBand; ok is false when the id
// is bound to none.
func (h cmHandles) device() (name string, port uint8, ibLink, ok bool) {
	v := h.id.verbs
	if v == nil || v.device == nil {
		return "", 0, false, false
	}
	name = C.GoString(C.gordma_ibv_get_device_name(v.device))
	port = uint8(h.id.port_num)
	var pa C.struct_ibv_port_attr
	if C.gordma_query_port(v, C.uint8_t(port), &pa) == 0 {
		ibLink = pa.link_layer == C.IBV_LINK_LAYER_INFINIBAND
	}
	return name, port, ibLink, true
}

func dataArg(b []byte) (unsafe.Pointer, C.uint8_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), C.uint8_t(len(b))
}

// establish calls rdma_accept (accept) or rdma_connect with p.
func (h cmHandles) establish(accept bool, p cmConnParams) error {
	a, srq := C.int(0), C.int(0)
	if accept {
		a = 1
	}
	if p.srq {
		srq = 1
	}
	data, n := dataArg(p.data)
	if rc := C.gordma_cm_establish(h.id, a, C.uint32_t(p.qpn), srq, C.uint8_t(p.rr), C.uint8_t(p.depth),
		C.uint8_t(p.retry), C.uint8_t(p.rnr), data, n); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

func (h cmHandles) rdmaEstablish() error {
	if rc, err := C.gordma_rdma_establish(h.id); rc != 0 {
		return err
	}
	return nil
}

func (h cmHandles) reject(data []byte) error {
	d, n := dataArg(data)
	if rc := C.gordma_cm_reject(h.id, d, n); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

func (h cmHandles) disconnect() error {
	if rc, err := C.gordma_rdma_disconnect(h.id); rc != 0 {
		return err
	}
	return nil
}

// initQPAttr asks rdma_cm for the attributes of the state attr holds
// and returns the mask of those to apply.
func (h cmHandles) initQPAttr(attr *qpAttr) (int, error) {
	var mask C.int
	if rc, err := C.gordma_rdma_init_qp_attr(h.id, (*C.struct_ibv_qp_attr)(attr), &mask); rc != 0 {
		return 0, callErr(err)
	}
	return int(mask), nil
}
