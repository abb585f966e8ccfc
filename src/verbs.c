/*
 * Owns the dlopen handles of libibverbs and librdmacm and the function table
 * `vb`. Does not interpret results: callers turn them into messages.
 */
#define _GNU_SOURCE
#include "verbs.h"
#include "log.h"
#include "params.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

struct verbs_api vb;
static void *ibverbs_handle;
static void *rdmacm_handle;
static int faked;

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    return ibv_post_send(qp, wr, bad);
}

static int wrap_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    return ibv_post_recv(qp, wr, bad);
}

static int wrap_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    return ibv_poll_cq(cq, n, wc);
}

static sigset_t just_sigpipe(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    return s;
}

void quiet_pipe_begin(struct quiet_pipe *q, bool on) {
    q->on = on;
    if (!on) return;
    sigset_t pipe = just_sigpipe(), pending;
    pthread_sigmask(SIG_BLOCK, &pipe, &q->old);
    sigpending(&pending);
    q->was_pending = sigismember(&pending, SIGPIPE); /* not ours to discard */
}

void quiet_pipe_end(struct quiet_pipe *q) {
    if (!q->on) return;
    int saved = errno; /* the caller reads the call's errno after this */
    sigset_t pipe = just_sigpipe(), pending;
    sigpending(&pending);
    if (!q->was_pending && sigismember(&pending, SIGPIPE)) {
        struct timespec now = {0, 0};
        while (sigtimedwait(&pipe, NULL, &now) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &q->old, NULL);
    errno = saved;
}

#define LOAD(handle, field, sym, required)                                                         \
    do {                                                                                           \
        *(void **)&vb.field = dlsym(handle, sym);                                                  \
        if (!vb.field && (required)) {                                                             \
            missing = sym;                                                                         \
            goto err_sym;                                                                          \
        }                                                                                          \
    } while (0)

static int load_ibverbs(void) {
    const char *lib = param_str(P_ERDMA_IBVERBS_LIB);
    const char *missing = NULL;

    /* NODELETE: rdma-core keeps per-process device state (librdmacm opens every device
     * once and never closes it); unloading it on NCCL's plugin dlclose() would leak those
     * contexts and fds on every reload. Loaded once, reused by the next init. */
    ibverbs_handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!ibverbs_handle) {
        WARN("cannot load %s (%s): the image lacks the RDMA user-space libraries; install "
             "libibverbs1 and ibverbs-providers (Debian/Ubuntu) or libibverbs and rdma-core "
             "(RHEL/Alinux). NCCL will fall back to another network.",
             lib, dlerror());
        return -ENOENT;
    }
    LOAD(ibverbs_handle, get_device_list, "ibv_get_device_list", 1);
    LOAD(ibverbs_handle, free_device_list, "ibv_free_device_list", 1);
    LOAD(ibverbs_handle, get_device_name, "ibv_get_device_name", 1);
    LOAD(ibverbs_handle, open_device, "ibv_open_device", 1);
    LOAD(ibverbs_handle, close_device, "ibv_close_device", 1);
    LOAD(ibverbs_handle, query_device, "ibv_query_device", 1);
    LOAD(ibverbs_handle, query_port, "ibv_query_port", 1);
    LOAD(ibverbs_handle, query_gid, "ibv_query_gid", 1);
    LOAD(ibverbs_handle, alloc_pd, "ibv_alloc_pd", 1);
    LOAD(ibverbs_handle, dealloc_pd, "ibv_dealloc_pd", 1);
    LOAD(ibverbs_handle, reg_mr, "ibv_reg_mr", 1);
    LOAD(ibverbs_handle, reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 0);
    LOAD(ibverbs_handle, dereg_mr, "ibv_dereg_mr", 1);
    LOAD(ibverbs_handle, create_cq, "ibv_create_cq", 1);
    LOAD(ibverbs_handle, destroy_cq, "ibv_destroy_cq", 1);
    LOAD(ibverbs_handle, create_qp, "ibv_create_qp", 1);
    LOAD(ibverbs_handle, modify_qp, "ibv_modify_qp", 1);
    LOAD(ibverbs_handle, query_qp, "ibv_query_qp", 1);
    LOAD(ibverbs_handle, destroy_qp, "ibv_destroy_qp", 1);
    LOAD(ibverbs_handle, get_async_event, "ibv_get_async_event", 1);
    LOAD(ibverbs_handle, ack_async_event, "ibv_ack_async_event", 1);
    LOAD(ibverbs_handle, wc_status_str, "ibv_wc_status_str", 1);
    LOAD(ibverbs_handle, event_type_str, "ibv_event_type_str", 1);
    vb.post_send = wrap_post_send;
    vb.post_recv = wrap_post_recv;
    vb.poll_cq = wrap_poll_cq;
    return 0;
err_sym:
    WARN("%s has no symbol %s: rdma-core is too old (need v28 or newer)", lib, missing);
    dlclose(ibverbs_handle);
    ibverbs_handle = NULL;
    return -ENOENT;
}

static void load_rdmacm(void) {
    const char *lib = param_str(P_ERDMA_RDMACM_LIB);
    const char *missing = NULL;

    rdmacm_handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!rdmacm_handle) {
        WARN("cannot load %s (%s): iWARP devices (eRDMA standard mode) need it; install "
             "librdmacm1 (Debian/Ubuntu) or librdmacm (RHEL/Alinux)",
             lib, dlerror());
        return;
    }
    LOAD(rdmacm_handle, cm_create_event_channel, "rdma_create_event_channel", 1);
    LOAD(rdmacm_handle, cm_destroy_event_channel, "rdma_destroy_event_channel", 1);
    LOAD(rdmacm_handle, cm_create_id, "rdma_create_id", 1);
    LOAD(rdmacm_handle, cm_destroy_id, "rdma_destroy_id", 1);
    LOAD(rdmacm_handle, cm_bind_addr, "rdma_bind_addr", 1);
    LOAD(rdmacm_handle, cm_listen, "rdma_listen", 1);
    LOAD(rdmacm_handle, cm_resolve_addr, "rdma_resolve_addr", 1);
    LOAD(rdmacm_handle, cm_resolve_route, "rdma_resolve_route", 1);
    LOAD(rdmacm_handle, cm_create_qp, "rdma_create_qp", 1);
    LOAD(rdmacm_handle, cm_destroy_qp, "rdma_destroy_qp", 1);
    LOAD(rdmacm_handle, cm_connect, "rdma_connect", 1);
    LOAD(rdmacm_handle, cm_accept, "rdma_accept", 1);
    LOAD(rdmacm_handle, cm_reject, "rdma_reject", 1);
    LOAD(rdmacm_handle, cm_disconnect, "rdma_disconnect", 1);
    LOAD(rdmacm_handle, cm_get_cm_event, "rdma_get_cm_event", 1);
    LOAD(rdmacm_handle, cm_ack_cm_event, "rdma_ack_cm_event", 1);
    LOAD(rdmacm_handle, cm_event_str, "rdma_event_str", 1);
    LOAD(rdmacm_handle, cm_migrate_id, "rdma_migrate_id", 1);
    LOAD(rdmacm_handle, cm_get_src_port, "rdma_get_src_port", 1);
    LOAD(rdmacm_handle, cm_get_devices, "rdma_get_devices", 1);
    LOAD(rdmacm_handle, cm_free_devices, "rdma_free_devices", 1);
    return;
err_sym:
    WARN("%s has no symbol %s; iWARP devices are disabled", lib, missing);
    dlclose(rdmacm_handle);
    rdmacm_handle = NULL;
    vb.cm_create_event_channel = NULL;
}

int verbs_open(void) {
    if (faked || ibverbs_handle) return 0;
    memset(&vb, 0, sizeof(vb));
    int rc = load_ibverbs();
    if (rc) return rc;
    load_rdmacm();
    return 0;
}

void verbs_close(void) {
    if (faked) return;
    if (rdmacm_handle) dlclose(rdmacm_handle);
    if (ibverbs_handle) dlclose(ibverbs_handle);
    rdmacm_handle = ibverbs_handle = NULL;
    memset(&vb, 0, sizeof(vb));
}

void verbs_install_fake(const struct verbs_api *fake) {
    faked = fake != NULL;
    if (fake)
        vb = *fake;
    else
        memset(&vb, 0, sizeof(vb));
}

int verbs_have_rdmacm(void) {
    return vb.cm_create_event_channel != NULL;
}
