/*
 * The NCCL network plugin ABI, versions 8 to 12, declared by this project.
 *
 * Layouts follow NCCL's public plugin headers (plugins/net/example/nccl/ in
 * NCCL >= 2.29, ext-net/ before): member order, types and the 128-byte handle
 * limit are facts of the ABI. The static asserts at the bottom pin the x86-64
 * sizes and offsets that NCCL reads, so a typo here fails the build instead of
 * corrupting NCCL's view of a device; tests/nccl_graph/net_abi_test.cc compares every
 * member, type and constant with NCCL's own nccl_net.h of each release checked.
 */
#ifndef NCCL_NET_ABI_H
#define NCCL_NET_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum {
    NCCL_LOG_NONE = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN = 2,
    NCCL_LOG_INFO = 3,
    NCCL_LOG_ABORT = 4,
    NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

/* Subsystem flags NCCL filters INFO lines with (NCCL_DEBUG_SUBSYS). */
enum {
    NCCL_INIT = 0x1,
    NCCL_NET = 0x10,
    NCCL_ENV = 0x80,
    NCCL_ALL = ~0,
};

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *phandle,
                                               int64_t pluginId, void *extData);

#define NCCL_NET_HANDLE_MAXSIZE       128
#define NCCL_NET_MAX_REQUESTS         32
#define NCCL_PTR_HOST                 0x1
#define NCCL_PTR_CUDA                 0x2
#define NCCL_PTR_DMABUF               0x4
#define NCCL_MAX_NET_SIZE_BYTES       (1ULL << 40)
#define NCCL_NET_MAX_DEVS_PER_NIC_V9  4 /* v9..v11 */
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

typedef struct {
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} ncclNetDeviceHandle_t; /* identical from v7 to v12 */

/* ------------------------------------------------------------ properties */
typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int speed; /* Mb/s */
    int port;
    float latency; /* us */
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v9_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
} ncclNetProperties_v9_t;

typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v9_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v12_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
    int16_t railId;
    int16_t planeId;
} ncclNetProperties_v12_t;
#define NCCL_NET_ID_UNDEF (-1) /* railId/planeId: not set by the user */

#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
typedef struct {
    int trafficClass;
} ncclNetCommConfig_t; /* v10 (connect) and v11/v12 (init) */

typedef struct {
    int32_t maxConcurrentPeers;
    int32_t minConcurrentPeers;
    int32_t maxFlowsPerPeer;
    int32_t minFlowsPerPeer;
} ncclNetCommAttr_t;

typedef struct {
    ncclNetCommAttr_t sendCommAttr;
    ncclNetCommAttr_t recvCommAttr;
    uint32_t op;
    uint32_t algo;
    uint32_t proto;
} ncclNetAttr_t; /* v11/v12 setNetAttr */

/* ------------------------------------------------------------ tables */
typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v9_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, ncclNetCommConfig_t *config, void *handle, void **sendComm,
                            ncclNetDeviceHandle_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v10_t;

/* v11 and v12 share the function list; only the property and vProps types differ. */
#define NCCL_NET_V11_TABLE(props_t, vprops_t)                                                      \
    struct {                                                                                       \
        const char *name;                                                                          \
        ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_t *config,             \
                             ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);  \
        ncclResult_t (*devices)(int *ndev);                                                        \
        ncclResult_t (*getProperties)(int dev, props_t *props);                                    \
        ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);               \
        ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,                 \
                                ncclNetDeviceHandle_t **sendDevComm);                              \
        ncclResult_t (*accept)(void *listenComm, void **recvComm,                                  \
                               ncclNetDeviceHandle_t **recvDevComm);                               \
        ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);      \
        ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,                 \
                                    uint64_t offset, int fd, void **mhandle);                      \
        ncclResult_t (*deregMr)(void *comm, void *mhandle);                                        \
        ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,     \
                              void *phandle, void **request);                                      \
        ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,        \
                              void **mhandles, void **phandles, void **request);                   \
        ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,    \
                               void **request);                                                    \
        ncclResult_t (*test)(void *request, int *done, int *sizes);                                \
        ncclResult_t (*closeSend)(void *sendComm);                                                 \
        ncclResult_t (*closeRecv)(void *recvComm);                                                 \
        ncclResult_t (*closeListen)(void *listenComm);                                             \
        ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);               \
        ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);                       \
        ncclResult_t (*makeVDevice)(int *d, vprops_t *props);                                      \
        ncclResult_t (*finalize)(void *ctx);                                                       \
        ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_t *netAttr);                             \
    }

typedef NCCL_NET_V11_TABLE(ncclNetProperties_v11_t, ncclNetVDeviceProps_v9_t) ncclNet_v11_t;
typedef NCCL_NET_V11_TABLE(ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t) ncclNet_v12_t;

/* ------------------------------------------------------------ layout checks (LP64) */
#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(ncclNetDeviceHandle_t) == 32, "device handle layout");
_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties size");
_Static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "v8 speed offset");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 tail");
_Static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "v9 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 vProps");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 maxP2pBytes");
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties size");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 tail");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties size");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 railId");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties size");
_Static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void *), "v8 table");
_Static_assert(sizeof(ncclNet_v9_t) == 20 * sizeof(void *), "v9 table");
_Static_assert(sizeof(ncclNet_v10_t) == 20 * sizeof(void *), "v10 table");
_Static_assert(sizeof(ncclNet_v11_t) == 22 * sizeof(void *), "v11 table");
_Static_assert(sizeof(ncclNet_v12_t) == 22 * sizeof(void *), "v12 table");
#endif

#endif /* NCCL_NET_ABI_H */
