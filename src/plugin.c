/*
 * The API edge: the exported ncclNetPlugin_v8 ... _v12 tables, argument
 * conversion between versions, and the single place where internal -errno
 * results become ncclResult_t. No logic lives here.
 */
#include "device.h"
#include "log.h"
#include "net.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT      __attribute__((visibility("default")))
#define PLUGIN_NAME "eRDMA"

static ncclResult_t to_nccl(int rc) {
    if (rc >= 0) return ncclSuccess;
    switch (-rc) {
    case EINVAL:
    case EMSGSIZE:
    case ERANGE:
        return ncclInvalidArgument;
    case EBADMSG: /* a handle that is not ours, or corrupted */
    case EALREADY:
    case ENOBUFS: /* more requests in flight than the API allows */
        return ncclInvalidUsage;
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EREMOTEIO:
    case EPROTO:
        return ncclRemoteError;
    case ENOTRECOVERABLE:
        return ncclInternalError;
    default:
        return ncclSystemError;
    }
}

/* ------------------------------------------------------------ shared entries */
static ncclResult_t api_devices(int *ndev) {
    return to_nccl(erdma_devices(ndev));
}

static ncclResult_t api_accept(void *lc, void **rc, ncclNetDeviceHandle_t **devh) {
    return to_nccl(erdma_accept(lc, rc));
}

static ncclResult_t api_reg_mr(void *comm, void *data, size_t size, int type, void **mh) {
    return to_nccl(erdma_reg_mr(comm, data, size, type, mh));
}

static ncclResult_t api_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                      uint64_t offset, int fd, void **mh) {
    return to_nccl(erdma_reg_mr_dmabuf(comm, data, size, type, offset, fd, mh));
}

static ncclResult_t api_dereg_mr(void *comm, void *mh) {
    return to_nccl(erdma_dereg_mr(comm, mh));
}

static ncclResult_t api_iflush(void *rc, int n, void **data, int *sizes, void **mh, void **req) {
    return to_nccl(erdma_iflush(rc, n, data, sizes, mh, req));
}

static ncclResult_t api_test(void *req, int *done, int *sizes) {
    return to_nccl(erdma_test(req, done, sizes));
}

static ncclResult_t api_close_send(void *c) {
    return to_nccl(erdma_close_send(c));
}

static ncclResult_t api_close_recv(void *c) {
    return to_nccl(erdma_close_recv(c));
}

static ncclResult_t api_close_listen(void *c) {
    return to_nccl(erdma_close_listen(c));
}

static ncclResult_t api_get_device_mr(void *comm, void *mh, void **dptr) {
    *dptr = NULL; /* no device offload */
    return ncclSuccess;
}

static ncclResult_t api_irecv_consumed(void *rc, int n, void *req) {
    return ncclSuccess;
}

static ncclResult_t api_make_vdevice(int *d, int ndevs, const int *devs) {
    /* NIC fusion is not offered: each eRDMA NIC is its own NCCL device. */
    if (ndevs == 1 && d) {
        *d = devs[0];
        return ncclSuccess;
    }
    WARN("makeVDevice: merging %d NICs into one virtual device is not supported", ndevs);
    return ncclInvalidUsage;
}

static ncclResult_t api_make_vdevice_v9(int *d, ncclNetVDeviceProps_v9_t *props) {
    return api_make_vdevice(d, props->ndevs, props->devs);
}

static ncclResult_t api_make_vdevice_v12(int *d, ncclNetVDeviceProps_v12_t *props) {
    return api_make_vdevice(d, props->ndevs, props->devs);
}

static ncclResult_t api_listen(int dev, void *handle, void **lc) {
    return to_nccl(erdma_listen(dev, handle, lc));
}

static ncclResult_t api_isend(void *sc, void *data, size_t size, int tag, void *mh, void **req) {
    return to_nccl(erdma_isend(sc, data, size, tag, mh, NULL, req));
}

static ncclResult_t api_irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                              void **req) {
    return to_nccl(erdma_irecv(rc, n, data, sizes, tags, mh, NULL, req));
}

/* ------------------------------------------------------------ properties */
static int props_common(int dev, struct erdma_props *p) {
    return erdma_get_properties(dev, p);
}

#define FILL_V8_FIELDS(out, p)                                                                     \
    do {                                                                                           \
        (out)->name = (char *)(p).name;                                                            \
        (out)->pciPath = (char *)(p).pci_path;                                                     \
        (out)->guid = (p).guid;                                                                    \
        (out)->ptrSupport = (p).ptr_support;                                                       \
        (out)->regIsGlobal = (p).reg_is_global;                                                    \
        (out)->speed = (p).speed;                                                                  \
        (out)->port = (p).port;                                                                    \
        (out)->latency = (p).latency;                                                              \
        (out)->maxComms = (p).max_comms;                                                           \
        (out)->maxRecvs = (p).max_recvs;                                                           \
        (out)->netDeviceType = NCCL_NET_DEVICE_HOST;                                               \
        (out)->netDeviceVersion = 0;                                                               \
    } while (0)

#define FILL_V9_FIELDS(out, p, dev)                                                                \
    do {                                                                                           \
        FILL_V8_FIELDS(out, p);                                                                    \
        (out)->forceFlush = (p).force_flush;                                                       \
        (out)->vProps.ndevs = 1;                                                                   \
        (out)->vProps.devs[0] = (dev);                                                             \
        (out)->maxP2pBytes = (p).max_p2p_bytes;                                                    \
        (out)->maxCollBytes = (p).max_coll_bytes;                                                  \
    } while (0)

static ncclResult_t api_get_properties_v8(int dev, ncclNetProperties_v8_t *out) {
    struct erdma_props p;
    int rc = props_common(dev, &p);
    if (rc) return to_nccl(rc);
    memset(out, 0, sizeof(*out));
    FILL_V8_FIELDS(out, p);
    return ncclSuccess;
}

static ncclResult_t api_get_properties_v9(int dev, ncclNetProperties_v9_t *out) {
    struct erdma_props p;
    int rc = props_common(dev, &p);
    if (rc) return to_nccl(rc);
    memset(out, 0, sizeof(*out));
    FILL_V9_FIELDS(out, p, dev);
    return ncclSuccess;
}

static ncclResult_t api_get_properties_v11(int dev, ncclNetProperties_v11_t *out) {
    struct erdma_props p;
    int rc = props_common(dev, &p);
    if (rc) return to_nccl(rc);
    memset(out, 0, sizeof(*out));
    FILL_V9_FIELDS(out, p, dev);
    out->maxMultiRequestSize = p.max_multi_request_size;
    return ncclSuccess;
}

static ncclResult_t api_get_properties_v12(int dev, ncclNetProperties_v12_t *out) {
    struct erdma_props p;
    int rc = props_common(dev, &p);
    if (rc) return to_nccl(rc);
    memset(out, 0, sizeof(*out));
    FILL_V9_FIELDS(out, p, dev);
    out->maxMultiRequestSize = p.max_multi_request_size;
    /* as net_ib: undefined unless NCCL_IB_HCA gives them (dev:port:rail:plane); NCCL's search
     * treats an undefined rail differently from a numbered one */
    out->railId = (int16_t)p.rail_id;
    out->planeId = (int16_t)p.plane_id;
    return ncclSuccess;
}

/* ------------------------------------------------------------ v8 (int sizes) */
/* Each table's init says which ncclNet version NCCL picked: NCCL takes the newest it knows, so
 * v8 means NCCL 2.23 or older (v9 came with 2.24), whose graph model differs (topo.c's graph
 * selection). */
static ncclResult_t api_init_v8(ncclDebugLogger_t logger) {
    erdma_set_net_version(8);
    return to_nccl(erdma_init(logger, NULL));
}

static ncclResult_t api_init_v9(ncclDebugLogger_t logger) {
    erdma_set_net_version(9);
    return to_nccl(erdma_init(logger, NULL));
}

static ncclResult_t api_connect_v8(int dev, void *handle, void **sc, ncclNetDeviceHandle_t **devh) {
    return to_nccl(erdma_connect(dev, NCCL_NET_TRAFFIC_CLASS_UNDEF, handle, sc));
}

static ncclResult_t api_isend_v8(void *sc, void *data, int size, int tag, void *mh, void **req) {
    if (size < 0) {
        WARN("isend: negative size %d", size);
        return ncclInvalidArgument;
    }
    return to_nccl(erdma_isend(sc, data, (size_t)size, tag, mh, NULL, req));
}

static ncclResult_t api_irecv_v8(void *rc, int n, void **data, int *sizes, int *tags, void **mh,
                                 void **req) {
    size_t wide[ERDMA_MAX_RECVS];
    if (n < 1 || n > ERDMA_MAX_RECVS) {
        WARN("irecv: %d buffers requested, maxRecvs is %d", n, ERDMA_MAX_RECVS);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0) {
            WARN("irecv: negative size %d", sizes[i]);
            return ncclInvalidArgument;
        }
        wide[i] = (size_t)sizes[i];
    }
    return to_nccl(erdma_irecv(rc, n, data, wide, tags, mh, NULL, req));
}

/* ------------------------------------------------------------ v10 (profiler, tc at connect) */
static ncclResult_t api_init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
    erdma_set_net_version(10);
    return to_nccl(erdma_init(logger, prof));
}

static ncclResult_t api_connect_v10(int dev, ncclNetCommConfig_t *config, void *handle, void **sc,
                                    ncclNetDeviceHandle_t **devh) {
    int tc = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    return to_nccl(erdma_connect(dev, tc, handle, sc));
}

static ncclResult_t api_isend_v10(void *sc, void *data, size_t size, int tag, void *mh,
                                  void *phandle, void **req) {
    return to_nccl(erdma_isend(sc, data, size, tag, mh, phandle, req));
}

static ncclResult_t api_irecv_v10(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                                  void **phandles, void **req) {
    return to_nccl(erdma_irecv(rc, n, data, sizes, tags, mh, phandles, req));
}

/* ------------------------------------------------------------ v11/v12 (per-communicator context)
 */
struct plugin_ctx {
    uint64_t comm_id;
    int traffic_class;
};

static ncclResult_t api_init_v11(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config,
                                 ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
    struct plugin_ctx *c = calloc(1, sizeof(*c));
    if (!c) return ncclSystemError;
    erdma_set_net_version(11); /* v12 too: shares this init */
    int rc = erdma_init(logger, prof);
    if (rc) {
        free(c);
        return to_nccl(rc);
    }
    c->comm_id = comm_id;
    c->traffic_class = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    *ctx = c;
    return ncclSuccess;
}

static ncclResult_t api_finalize_v11(void *ctx) {
    free(ctx);
    erdma_finalize();
    return ncclSuccess;
}

static ncclResult_t api_listen_v11(void *ctx, int dev, void *handle, void **lc) {
    return api_listen(dev, handle, lc);
}

static ncclResult_t api_connect_v11(void *ctx, int dev, void *handle, void **sc,
                                    ncclNetDeviceHandle_t **devh) {
    const struct plugin_ctx *c = ctx;
    return to_nccl(
        erdma_connect(dev, c ? c->traffic_class : NCCL_NET_TRAFFIC_CLASS_UNDEF, handle, sc));
}

static ncclResult_t api_set_net_attr(void *ctx, ncclNetAttr_t *attr) {
    return ncclSuccess; /* hints about concurrency; nothing to tune yet */
}

/* ------------------------------------------------------------ exported tables */
EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = PLUGIN_NAME,
    .init = api_init_v8,
    .devices = api_devices,
    .getProperties = api_get_properties_v8,
    .listen = api_listen,
    .connect = api_connect_v8,
    .accept = api_accept,
    .regMr = api_reg_mr,
    .regMrDmaBuf = api_reg_mr_dmabuf,
    .deregMr = api_dereg_mr,
    .isend = api_isend_v8,
    .irecv = api_irecv_v8,
    .iflush = api_iflush,
    .test = api_test,
    .closeSend = api_close_send,
    .closeRecv = api_close_recv,
    .closeListen = api_close_listen,
    .getDeviceMr = api_get_device_mr,
    .irecvConsumed = api_irecv_consumed,
};

EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = PLUGIN_NAME,
    .init = api_init_v9,
    .devices = api_devices,
    .getProperties = api_get_properties_v9,
    .listen = api_listen,
    .connect = api_connect_v8,
    .accept = api_accept,
    .regMr = api_reg_mr,
    .regMrDmaBuf = api_reg_mr_dmabuf,
    .deregMr = api_dereg_mr,
    .isend = api_isend,
    .irecv = api_irecv,
    .iflush = api_iflush,
    .test = api_test,
    .closeSend = api_close_send,
    .closeRecv = api_close_recv,
    .closeListen = api_close_listen,
    .getDeviceMr = api_get_device_mr,
    .irecvConsumed = api_irecv_consumed,
    .makeVDevice = api_make_vdevice_v9,
};

EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = PLUGIN_NAME,
    .init = api_init_v10,
    .devices = api_devices,
    .getProperties = api_get_properties_v9,
    .listen = api_listen,
    .connect = api_connect_v10,
    .accept = api_accept,
    .regMr = api_reg_mr,
    .regMrDmaBuf = api_reg_mr_dmabuf,
    .deregMr = api_dereg_mr,
    .isend = api_isend_v10,
    .irecv = api_irecv_v10,
    .iflush = api_iflush,
    .test = api_test,
    .closeSend = api_close_send,
    .closeRecv = api_close_recv,
    .closeListen = api_close_listen,
    .getDeviceMr = api_get_device_mr,
    .irecvConsumed = api_irecv_consumed,
    .makeVDevice = api_make_vdevice_v9,
};

EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = PLUGIN_NAME,
    .init = api_init_v11,
    .devices = api_devices,
    .getProperties = api_get_properties_v11,
    .listen = api_listen_v11,
    .connect = api_connect_v11,
    .accept = api_accept,
    .regMr = api_reg_mr,
    .regMrDmaBuf = api_reg_mr_dmabuf,
    .deregMr = api_dereg_mr,
    .isend = api_isend_v10,
    .irecv = api_irecv_v10,
    .iflush = api_iflush,
    .test = api_test,
    .closeSend = api_close_send,
    .closeRecv = api_close_recv,
    .closeListen = api_close_listen,
    .getDeviceMr = api_get_device_mr,
    .irecvConsumed = api_irecv_consumed,
    .makeVDevice = api_make_vdevice_v9,
    .finalize = api_finalize_v11,
    .setNetAttr = api_set_net_attr,
};

EXPORT const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = PLUGIN_NAME,
    .init = api_init_v11,
    .devices = api_devices,
    .getProperties = api_get_properties_v12,
    .listen = api_listen_v11,
    .connect = api_connect_v11,
    .accept = api_accept,
    .regMr = api_reg_mr,
    .regMrDmaBuf = api_reg_mr_dmabuf,
    .deregMr = api_dereg_mr,
    .isend = api_isend_v10,
    .irecv = api_irecv_v10,
    .iflush = api_iflush,
    .test = api_test,
    .closeSend = api_close_send,
    .closeRecv = api_close_recv,
    .closeListen = api_close_listen,
    .getDeviceMr = api_get_device_mr,
    .irecvConsumed = api_irecv_consumed,
    .makeVDevice = api_make_vdevice_v12,
    .finalize = api_finalize_v11,
    .setNetAttr = api_set_net_attr,
};
