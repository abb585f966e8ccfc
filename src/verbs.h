/*
 * The one boundary to libibverbs and librdmacm. Both are dlopen()ed at init so
 * the plugin loads (and fails with a clear message) in images that lack them,
 * and so unit tests can install fakes. Nothing outside verbs.c calls ibv_* or
 * rdma_* functions directly; everyone goes through `vb`.
 */
#ifndef ERDMA_VERBS_H
#define ERDMA_VERBS_H

#include <infiniband/verbs.h>
#include <signal.h>
#include <stdbool.h>
#include <rdma/rdma_cma.h>

struct verbs_api {
    /* libibverbs */
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    /* optional (NULL in old rdma-core) */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                    int fd, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *ch, int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                    struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);
    const char *(*wc_status_str)(enum ibv_wc_status status);
    const char *(*event_type_str)(enum ibv_event_type type);
    /* data path: inline in verbs.h, wrapped so fakes can replace them */
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);

    /* librdmacm (all NULL when it could not be opened) */
    struct rdma_event_channel *(*cm_create_event_channel)(void);
    void (*cm_destroy_event_channel)(struct rdma_event_channel *ch);
    int (*cm_create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx,
                        enum rdma_port_space ps);
    int (*cm_destroy_id)(struct rdma_cm_id *id);
    int (*cm_bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
    int (*cm_listen)(struct rdma_cm_id *id, int backlog);
    int (*cm_resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
                           int timeout_ms);
    int (*cm_resolve_route)(struct rdma_cm_id *id, int timeout_ms);
    int (*cm_create_qp)(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    void (*cm_destroy_qp)(struct rdma_cm_id *id);
    int (*cm_connect)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*cm_accept)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*cm_reject)(struct rdma_cm_id *id, const void *data, uint8_t len);
    int (*cm_disconnect)(struct rdma_cm_id *id);
    int (*cm_get_cm_event)(struct rdma_event_channel *ch, struct rdma_cm_event **ev);
    int (*cm_ack_cm_event)(struct rdma_cm_event *ev);
    const char *(*cm_event_str)(enum rdma_cm_event_type ev);
    int (*cm_migrate_id)(struct rdma_cm_id *id, struct rdma_event_channel *ch);
    uint16_t (*cm_get_src_port)(struct rdma_cm_id *id);
    struct ibv_context **(*cm_get_devices)(int *num);
    void (*cm_free_devices)(struct ibv_context **list);
};

extern struct verbs_api vb;

/* Opens both libraries (names from NCCL_ERDMA_IBVERBS_LIB / _RDMACM_LIB).
 * libibverbs is required: -ENOENT with one WARN naming the library and its
 * package. librdmacm is optional: without it vb.cm_* stay NULL (iWARP unusable). */
int verbs_open(void);
void verbs_close(void);
/* Unit tests: use this table instead of the libraries. */
void verbs_install_fake(const struct verbs_api *fake);
int verbs_have_rdmacm(void);

/* siw (soft-iWARP) sends on its TCP socket inside the caller's own ibv_post_send, rdma_connect
 * and rdma_accept, without MSG_NOSIGNAL: when the peer's socket has just gone, the kernel
 * raises SIGPIPE in the calling thread, which kills a process that does not ignore it (C
 * programs do not; Python does). The failure itself reaches us anyway, as a completion error
 * or a connection event. So for such devices the call runs with SIGPIPE blocked, and one
 * raised during it is discarded. `on` false: nothing is done (every other device). */
struct quiet_pipe {
    bool on, was_pending;
    sigset_t old;
};
void quiet_pipe_begin(struct quiet_pipe *q, bool on);
void quiet_pipe_end(struct quiet_pipe *q);

/* Provider calls have been seen to return negative errno values: normalise to -errno. */
static inline int verbs_errno(int rc) {
    return rc > 0 ? -rc : rc;
}

#endif
