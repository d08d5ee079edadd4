// The libibverbs and librdmacm functions package ibv calls, loaded at run
// time (loader.c) instead of linked: a binary built where rdma-core is
// installed then starts where it is not, and there uses the soft
// provider. Building needs no rdma-core headers either: abi.h declares
// the part of their ABI that is used.
//
// Each gordma_ibv_NAME and gordma_rdma_NAME calls ibv_NAME or rdma_NAME
// through a pointer that gordma_load_ibv or gordma_load_rdmacm resolved,
// so it returns what the library returns and leaves errno as the library
// left it. Call them only after the load succeeded: the Go side loads at
// the two ways in (openByName for devices, createCM for rdma_cm), and
// every other call takes an object that only a loaded library can have
// made.
//
// The verbs that verbs.h defines as static inline functions dispatching
// through the context's ops table (ibv_post_send, ibv_post_recv,
// ibv_post_srq_recv, ibv_poll_cq, ibv_req_notify_cq) need no symbol:
// abi.h defines them the same way, and the hot-path helpers of shim.h
// call them directly.
#ifndef GORDMA_LOADER_H
#define GORDMA_LOADER_H

#include <stddef.h>
#include <stdint.h>
#include "abi.h"

// gordma_load_ibv dlopens libibverbs from path (a soname or a file) and
// resolves every function below. It returns 0, or -1 with the reason in
// err; a failed load changes nothing.
int gordma_load_ibv(const char *path, char *err, size_t errlen);

// gordma_load_rdmacm does the same for librdmacm. Load libibverbs first,
// so that librdmacm's dependency on libibverbs.so.1 finds the copy
// already loaded rather than another one.
int gordma_load_rdmacm(const char *path, char *err, size_t errlen);

// libibverbs.
struct ibv_device **gordma_ibv_get_device_list(int *num_devices);
void gordma_ibv_free_device_list(struct ibv_device **list);
const char *gordma_ibv_get_device_name(struct ibv_device *device);
struct ibv_context *gordma_ibv_open_device(struct ibv_device *device);
int gordma_ibv_close_device(struct ibv_context *context);
int gordma_ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr);
int gordma_ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
int gordma_ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event);
void gordma_ibv_ack_async_event(struct ibv_async_event *event);
struct ibv_pd *gordma_ibv_alloc_pd(struct ibv_context *context);
int gordma_ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *gordma_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
int gordma_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_comp_channel *gordma_ibv_create_comp_channel(struct ibv_context *context);
int gordma_ibv_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *gordma_ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
		struct ibv_comp_channel *channel, int comp_vector);
int gordma_ibv_destroy_cq(struct ibv_cq *cq);
int gordma_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
void gordma_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);
struct ibv_srq *gordma_ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int gordma_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask);
int gordma_ibv_destroy_srq(struct ibv_srq *srq);
struct ibv_qp *gordma_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int gordma_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr);
int gordma_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int gordma_ibv_destroy_qp(struct ibv_qp *qp);
struct ibv_ah *gordma_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int gordma_ibv_destroy_ah(struct ibv_ah *ah);
int gordma_ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
int gordma_ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);

// gordma_query_port is verbs.h's ibv_query_port, a macro around an
// inline function that calls the context's query_port op or, for an old
// provider without one, the compat symbol; cgo cannot call the macro.
int gordma_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);

// librdmacm.
struct rdma_event_channel *gordma_rdma_create_event_channel(void);
void gordma_rdma_destroy_event_channel(struct rdma_event_channel *channel);
int gordma_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		enum rdma_port_space ps);
int gordma_rdma_destroy_id(struct rdma_cm_id *id);
int gordma_rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel);
int gordma_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event);
int gordma_rdma_ack_cm_event(struct rdma_cm_event *event);
int gordma_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr);
int gordma_rdma_listen(struct rdma_cm_id *id, int backlog);
int gordma_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
		int timeout_ms);
int gordma_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int gordma_rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask);
int gordma_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int gordma_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int gordma_rdma_establish(struct rdma_cm_id *id);
int gordma_rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
int gordma_rdma_disconnect(struct rdma_cm_id *id);

#endif
