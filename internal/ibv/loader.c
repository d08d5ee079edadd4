//go:build linux && cgo

// Resolves the functions of loader.h with dlopen and dlvsym. See
// loader.h for why, and loader.go for when.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "loader.h"

// Each pointer has the type of the function verbs.h or rdma_cma.h
// declares (abi.h declares the types, not the functions). They are set
// once, after every symbol of the library resolved.
struct ibv_fns {
	struct ibv_device **(*get_device_list)(int *num_devices);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *device);
	struct ibv_context *(*open_device)(struct ibv_device *device);
	int (*close_device)(struct ibv_context *context);
	int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
	// The compat symbol, which fills the prefix of struct ibv_port_attr
	// that old providers know: see gordma_query_port.
	int (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
	int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
	void (*ack_async_event)(struct ibv_async_event *event);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
	int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
		struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	struct ibv_srq *(*create_srq)(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
	int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask);
	int (*destroy_srq)(struct ibv_srq *srq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *attr);
	int (*destroy_ah)(struct ibv_ah *ah);
	int (*attach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
	int (*detach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
};

struct rdmacm_fns {
	struct rdma_event_channel *(*create_event_channel)(void);
	void (*destroy_event_channel)(struct rdma_event_channel *channel);
	int (*create_id)(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		enum rdma_port_space ps);
	int (*destroy_id)(struct rdma_cm_id *id);
	int (*migrate_id)(struct rdma_cm_id *id, struct rdma_event_channel *channel);
	int (*get_cm_event)(struct rdma_event_channel *channel, struct rdma_cm_event **event);
	int (*ack_cm_event)(struct rdma_cm_event *event);
	int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
	int (*listen)(struct rdma_cm_id *id, int backlog);
	int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
		int timeout_ms);
	int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
	int (*init_qp_attr)(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask);
	int (*connect)(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
	int (*accept)(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
	int (*establish)(struct rdma_cm_id *id);
	int (*reject)(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
	int (*disconnect)(struct rdma_cm_id *id);
};

static struct ibv_fns ibv;
static struct rdmacm_fns rdmacm;

// sym names a function, the symbol version to bind and where to store it.
// The versions are those a link against rdma-core's libraries binds: the
// default version of each symbol. libibverbs also exports IBVERBS_1.0
// versions of most functions with the old ABI, which a plain dlsym would
// not pick today, but naming the version keeps a future default from
// changing the ABI under these callers.
struct sym {
	const char *name;
	const char *version;
	void **slot;
};

#define SYM(table, prefix, field, version) {prefix #field, version, (void **)&(table).field}

// load dlopens path and resolves syms. The library is never closed after
// a successful load: the verbs objects point into it.
static int load(const char *what, const char *path, const struct sym *syms, size_t n, char *err, size_t errlen) {
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		void *p = dlvsym(h, syms[i].name, syms[i].version);
		if (!p) {
			snprintf(err, errlen, "%s (%s) has no %s@%s: rdma-core too old?", what, path, syms[i].name,
				syms[i].version);
			dlclose(h);
			return -1;
		}
		*syms[i].slot = p;
	}
	return 0;
}

int gordma_load_ibv(const char *path, char *err, size_t errlen) {
	static const char *v10 = "IBVERBS_1.0", *v11 = "IBVERBS_1.1";
	// Resolved into next, so a failed load leaves ibv as it was.
	struct ibv_fns next;
	const struct sym syms[] = {
		SYM(next, "ibv_", get_device_list, v11),
		SYM(next, "ibv_", free_device_list, v11),
		SYM(next, "ibv_", get_device_name, v11),
		SYM(next, "ibv_", open_device, v11),
		SYM(next, "ibv_", close_device, v11),
		SYM(next, "ibv_", query_device, v11),
		SYM(next, "ibv_", query_port, v11),
		SYM(next, "ibv_", query_gid, v11),
		SYM(next, "ibv_", get_async_event, v11),
		SYM(next, "ibv_", ack_async_event, v11),
		SYM(next, "ibv_", alloc_pd, v11),
		SYM(next, "ibv_", dealloc_pd, v11),
		// ibv_reg_mr@1.1 is ibv_reg_mr_iova2 with the address as iova,
		// which is what verbs.h's ibv_reg_mr macro calls for flags
		// that are not compile-time constants.
		SYM(next, "ibv_", reg_mr, v11),
		SYM(next, "ibv_", dereg_mr, v11),
		// The completion channel functions never changed: 1.0 only.
		SYM(next, "ibv_", create_comp_channel, v10),
		SYM(next, "ibv_", destroy_comp_channel, v10),
		SYM(next, "ibv_", create_cq, v11),
		SYM(next, "ibv_", destroy_cq, v11),
		SYM(next, "ibv_", get_cq_event, v11),
		SYM(next, "ibv_", ack_cq_events, v11),
		SYM(next, "ibv_", create_srq, v11),
		SYM(next, "ibv_", modify_srq, v11),
		SYM(next, "ibv_", destroy_srq, v11),
		SYM(next, "ibv_", create_qp, v11),
		SYM(next, "ibv_", query_qp, v11),
		SYM(next, "ibv_", modify_qp, v11),
		SYM(next, "ibv_", destroy_qp, v11),
		SYM(next, "ibv_", create_ah, v11),
		SYM(next, "ibv_", destroy_ah, v11),
		SYM(next, "ibv_", attach_mcast, v11),
		SYM(next, "ibv_", detach_mcast, v11),
	};
	if (load("libibverbs", path, syms, sizeof(syms) / sizeof(syms[0]), err, errlen) != 0) return -1;
	ibv = next;
	return 0;
}

int gordma_load_rdmacm(const char *path, char *err, size_t errlen) {
	static const char *v10 = "RDMACM_1.0", *v12 = "RDMACM_1.2";
	struct rdmacm_fns next;
	const struct sym syms[] = {
		SYM(next, "rdma_", create_event_channel, v10),
		SYM(next, "rdma_", destroy_event_channel, v10),
		SYM(next, "rdma_", create_id, v10),
		SYM(next, "rdma_", destroy_id, v10),
		SYM(next, "rdma_", migrate_id, v10),
		SYM(next, "rdma_", get_cm_event, v10),
		SYM(next, "rdma_", ack_cm_event, v10),
		SYM(next, "rdma_", bind_addr, v10),
		SYM(next, "rdma_", listen, v10),
		SYM(next, "rdma_", resolve_addr, v10),
		SYM(next, "rdma_", resolve_route, v10),
		SYM(next, "rdma_", init_qp_attr, v12),
		SYM(next, "rdma_", connect, v10),
		SYM(next, "rdma_", accept, v10),
		SYM(next, "rdma_", establish, v12),
		SYM(next, "rdma_", reject, v10),
		SYM(next, "rdma_", disconnect, v10),
	};
	if (load("librdmacm", path, syms, sizeof(syms) / sizeof(syms[0]), err, errlen) != 0) return -1;
	rdmacm = next;
	return 0;
}

int gordma_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr) {
	// verbs.h's verbs_get_ctx_op(context, query_port): a provider with
	// an extended context whose ops reach query_port (sz counts the
	// bytes from its first op to the end) and that sets it.
	if (context->abi_compat == GORDMA_VERBS_ABI_IS_EXTENDED) {
		struct verbs_context *vctx =
			(struct verbs_context *)((char *)context - offsetof(struct verbs_context, context));
		if (vctx->sz >= sizeof(*vctx) - offsetof(struct verbs_context, query_port) && vctx->query_port)
			return vctx->query_port(context, port_num, attr, sizeof(*attr));
	}
	memset(attr, 0, sizeof(*attr));
	return ibv.query_port(context, port_num, attr);
}

// The trampolines.

struct ibv_device **gordma_ibv_get_device_list(int *num_devices) { return ibv.get_device_list(num_devices); }
void gordma_ibv_free_device_list(struct ibv_device **list) { ibv.free_device_list(list); }
const char *gordma_ibv_get_device_name(struct ibv_device *device) { return ibv.get_device_name(device); }
struct ibv_context *gordma_ibv_open_device(struct ibv_device *device) { return ibv.open_device(device); }
int gordma_ibv_close_device(struct ibv_context *context) { return ibv.close_device(context); }
int gordma_ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr) {
	return ibv.query_device(context, attr);
}
int gordma_ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid) {
	return ibv.query_gid(context, port_num, index, gid);
}
int gordma_ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event) {
	return ibv.get_async_event(context, event);
}
void gordma_ibv_ack_async_event(struct ibv_async_event *event) { ibv.ack_async_event(event); }
struct ibv_pd *gordma_ibv_alloc_pd(struct ibv_context *context) { return ibv.alloc_pd(context); }
int gordma_ibv_dealloc_pd(struct ibv_pd *pd) { return ibv.dealloc_pd(pd); }
struct ibv_mr *gordma_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
	return ibv.reg_mr(pd, addr, length, access);
}
int gordma_ibv_dereg_mr(struct ibv_mr *mr) { return ibv.dereg_mr(mr); }
struct ibv_comp_channel *gordma_ibv_create_comp_channel(struct ibv_context *context) {
	return ibv.create_comp_channel(context);
}
int gordma_ibv_destroy_comp_channel(struct ibv_comp_channel *channel) { return ibv.destroy_comp_channel(channel); }
struct ibv_cq *gordma_ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
		struct ibv_comp_channel *channel, int comp_vector) {
	return ibv.create_cq(context, cqe, cq_context, channel, comp_vector);
}
int gordma_ibv_destroy_cq(struct ibv_cq *cq) { return ibv.destroy_cq(cq); }
int gordma_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) {
	return ibv.get_cq_event(channel, cq, cq_context);
}
void gordma_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) { ibv.ack_cq_events(cq, nevents); }
struct ibv_srq *gordma_ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr) {
	return ibv.create_srq(pd, attr);
}
int gordma_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask) {
	return ibv.modify_srq(srq, attr, attr_mask);
}
int gordma_ibv_destroy_srq(struct ibv_srq *srq) { return ibv.destroy_srq(srq); }
struct ibv_qp *gordma_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) { return ibv.create_qp(pd, attr); }
int gordma_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr) {
	return ibv.query_qp(qp, attr, attr_mask, init_attr);
}
int gordma_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
	return ibv.modify_qp(qp, attr, attr_mask);
}
int gordma_ibv_destroy_qp(struct ibv_qp *qp) { return ibv.destroy_qp(qp); }
struct ibv_ah *gordma_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr) { return ibv.create_ah(pd, attr); }
int gordma_ibv_destroy_ah(struct ibv_ah *ah) { return ibv.destroy_ah(ah); }
int gordma_ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
	return ibv.attach_mcast(qp, gid, lid);
}
int gordma_ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
	return ibv.detach_mcast(qp, gid, lid);
}

struct rdma_event_channel *gordma_rdma_create_event_channel(void) { return rdmacm.create_event_channel(); }
void gordma_rdma_destroy_event_channel(struct rdma_event_channel *channel) { rdmacm.destroy_event_channel(channel); }
int gordma_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		enum rdma_port_space ps) {
	return rdmacm.create_id(channel, id, context, ps);
}
int gordma_rdma_destroy_id(struct rdma_cm_id *id) { return rdmacm.destroy_id(id); }
int gordma_rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel) {
	return rdmacm.migrate_id(id, channel);
}
int gordma_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event) {
	return rdmacm.get_cm_event(channel, event);
}
int gordma_rdma_ack_cm_event(struct rdma_cm_event *event) { return rdmacm.ack_cm_event(event); }
int gordma_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr) { return rdmacm.bind_addr(id, addr); }
int gordma_rdma_listen(struct rdma_cm_id *id, int backlog) { return rdmacm.listen(id, backlog); }
int gordma_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
		int timeout_ms) {
	return rdmacm.resolve_addr(id, src_addr, dst_addr, timeout_ms);
}
int gordma_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms) { return rdmacm.resolve_route(id, timeout_ms); }
int gordma_rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask) {
	return rdmacm.init_qp_attr(id, qp_attr, qp_attr_mask);
}
int gordma_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param) {
	return rdmacm.connect(id, conn_param);
}
int gordma_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param) {
	return rdmacm.accept(id, conn_param);
}
int gordma_rdma_establish(struct rdma_cm_id *id) { return rdmacm.establish(id); }
int gordma_rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len) {
	return rdmacm.reject(id, private_data, private_data_len);
}
int gordma_rdma_disconnect(struct rdma_cm_id *id) { return rdmacm.disconnect(id); }
