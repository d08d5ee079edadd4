// C helpers for package ibv. Everything here is static so each cgo file
// that includes it gets its own copy; nothing keeps a pointer into Go
// memory past the call that passed it. The library functions they call
// are loader.h's trampolines, except the inline verbs of the hot path.
#include "loader.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

// gordma_wc mirrors verbs.WorkCompletion field by field; ibv checks the
// layout at compile time.
typedef struct {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t  sl;
	uint8_t  pad[3];
} gordma_wc;

#define GORDMA_POLL_MAX 128

// The hot-path helpers (poll, post send, post receive) take the verbs
// objects as uintptr_t handles: a C pointer to a struct that holds
// pointers makes cgo check at every call whether it points into Go
// memory, which showed up in the profiles of the spinning loops
// (docs/performance.md). Only pointer-free Go arrays are passed as
// pointers.

// gordma_poll polls up to n (<= GORDMA_POLL_MAX) completions in one call
// and converts them into the Go layout. Failed completions copy only the
// fields valid for them.
//
// It polls up to spins times (at least once) and returns at the first
// poll that finds completions: a spinning loop then pays one cgo call per
// spins empty polls instead of one per poll. Under emulation (rxe in
// TCG) a cgo call costs about a microsecond and a C poll a few hundred
// nanoseconds (docs/performance.md). Keep spins small: the goroutine
// holds its thread for the whole call.
static int gordma_poll(uintptr_t cqh, int n, gordma_wc *out, int spins) {
	struct ibv_cq *cq = (struct ibv_cq *)cqh;
	struct ibv_wc wc[GORDMA_POLL_MAX];
	if (n > GORDMA_POLL_MAX) n = GORDMA_POLL_MAX;
	int got;
	do {
		got = ibv_poll_cq(cq, n, wc);
	} while (got == 0 && --spins > 0);
	for (int i = 0; i < got; i++) {
		gordma_wc *o = &out[i];
		memset(o, 0, sizeof(*o));
		o->wr_id = wc[i].wr_id;
		o->status = wc[i].status;
		o->vendor_err = wc[i].vendor_err;
		o->qp_num = wc[i].qp_num;
		if (wc[i].status != IBV_WC_SUCCESS) {
			continue;
		}
		o->opcode = wc[i].opcode;
		o->byte_len = wc[i].byte_len;
		o->flags = wc[i].wc_flags & (IBV_WC_GRH | IBV_WC_WITH_IMM);
		if (wc[i].wc_flags & IBV_WC_WITH_IMM) o->imm = ntohl(wc[i].imm_data);
		o->src_qp = wc[i].src_qp;
		o->pkey_index = wc[i].pkey_index;
		o->slid = wc[i].slid;
		o->sl = wc[i].sl;
	}
	return got;
}

// gordma_send_wr is a send WR without pointers, so Go can pass an array
// of them. Its SGEs are the next num_sge entries of the SGE array.
typedef struct {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint64_t ah; // struct ibv_ah * (C memory) as an integer
	uint32_t rkey;
	uint32_t imm;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t send_flags;
	uint16_t num_sge;
	uint8_t  opcode;
	uint8_t  pad;
} gordma_send_wr;

typedef struct {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
} gordma_recv_wr;

// gordma_post_send builds the chain in scratch (C memory owned by the QP,
// room for n WRs) and posts it with one ibv_post_send. It returns the
// errno and sets *posted to the number of WRs before bad_wr.
static int gordma_post_send(uintptr_t qph, uintptr_t scratchh, const gordma_send_wr *w, int n, struct ibv_sge *sges, int *posted) {
	struct ibv_qp *qp = (struct ibv_qp *)qph;
	struct ibv_send_wr *scratch = (struct ibv_send_wr *)scratchh;
	int s = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *d = &scratch[i];
		memset(d, 0, sizeof(*d));
		d->wr_id = w[i].wr_id;
		d->next = (i + 1 < n) ? &scratch[i + 1] : NULL;
		d->sg_list = w[i].num_sge ? &sges[s] : NULL;
		d->num_sge = w[i].num_sge;
		s += w[i].num_sge;
		d->opcode = (enum ibv_wr_opcode)w[i].opcode;
		d->send_flags = w[i].send_flags;
		d->imm_data = htonl(w[i].imm);
		switch (d->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			d->wr.rdma.remote_addr = w[i].remote_addr;
			d->wr.rdma.rkey = w[i].rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			d->wr.atomic.remote_addr = w[i].remote_addr;
			d->wr.atomic.rkey = w[i].rkey;
			d->wr.atomic.compare_add = w[i].compare_add;
			d->wr.atomic.swap = w[i].swap;
			break;
		default:
			if (w[i].ah) {
				d->wr.ud.ah = (struct ibv_ah *)(uintptr_t)w[i].ah;
				d->wr.ud.remote_qpn = w[i].remote_qpn;
				d->wr.ud.remote_qkey = w[i].remote_qkey;
			}
		}
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, scratch, &bad);
	*posted = rc == 0 ? n : (bad ? (int)(bad - scratch) : 0);
	return rc;
}

// gordma_post_recv posts a receive chain to a QP (srq == NULL) or an SRQ.
static int gordma_post_recv(uintptr_t qph, uintptr_t srqh, uintptr_t scratchh, const gordma_recv_wr *w, int n, struct ibv_sge *sges, int *posted) {
	struct ibv_qp *qp = (struct ibv_qp *)qph;
	struct ibv_srq *srq = (struct ibv_srq *)srqh;
	struct ibv_recv_wr *scratch = (struct ibv_recv_wr *)scratchh;
	int s = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr *d = &scratch[i];
		memset(d, 0, sizeof(*d));
		d->wr_id = w[i].wr_id;
		d->next = (i + 1 < n) ? &scratch[i + 1] : NULL;
		d->sg_list = w[i].num_sge ? &sges[s] : NULL;
		d->num_sge = w[i].num_sge;
		s += w[i].num_sge;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = srq ? ibv_post_srq_recv(srq, scratch, &bad) : ibv_post_recv(qp, scratch, &bad);
	*posted = rc == 0 ? n : (bad ? (int)(bad - scratch) : 0);
	return rc;
}

static int gordma_req_notify(struct ibv_cq *cq, int solicited) {
	return ibv_req_notify_cq(cq, solicited);
}

// gordma_get_cq_event returns 0 and the CQ, or an errno (EAGAIN when no
// event is ready).
static int gordma_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq) {
	void *ctx;
	if (gordma_ibv_get_cq_event(ch, cq, &ctx) == 0) return 0;
	return errno ? errno : EIO;
}

typedef struct {
	uint64_t srq_key; // srq_context of an SRQ event's SRQ: the Go side's key
	uint32_t type;
	uint32_t qp_num;
	uint32_t port;
	uint32_t pad;
} gordma_async_event;

// gordma_get_async_event reads and acknowledges one async event.
static int gordma_get_async_event(struct ibv_context *ctx, gordma_async_event *out) {
	struct ibv_async_event ev;
	if (gordma_ibv_get_async_event(ctx, &ev) != 0) return errno ? errno : EIO;
	out->type = ev.event_type;
	out->qp_num = 0;
	out->port = 0;
	out->srq_key = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		if (ev.element.qp) out->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED:
		// Read before the ack: ibv_destroy_srq waits for the acks of
		// the SRQ's events, so the SRQ is still there.
		if (ev.element.srq) out->srq_key = (uint64_t)(uintptr_t)ev.element.srq->srq_context;
		break;
	default:
		break;
	}
	gordma_ibv_ack_async_event(&ev);
	return 0;
}

// gordma_create_srq creates an SRQ whose srq_context is key, an integer
// the Go side maps back to its SRQ when an event names it, so C keeps no
// Go pointer.
static struct ibv_srq *gordma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr, uint64_t key) {
	attr->srq_context = (void *)(uintptr_t)key;
	return gordma_ibv_create_srq(pd, attr);
}
