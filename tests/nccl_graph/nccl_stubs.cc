/*
 * The parts of NCCL that its graph code calls and that are not in src/graph,
 * for tests that run NCCL 2.30's topology code on a fake sysfs tree: logging,
 * environment and parameters, the OS layer (sysfs under a fake root), NVML
 * and CUDA (answers for the tree's GPUs), the intra-node allgather (ranks are
 * threads), and the net plugin's device count. Everything the graph code may
 * call but these tests must never reach aborts, so a case cannot pass by
 * silently skipping work.
 */
#include "ng_world.h"

#include "bootstrap.h"
#include "comm.h"
#include "gdrwrap.h"
#include "graph.h"
#include "net.h"
#include "nvmlwrap.h"
#if NCCL_VERSION_CODE >= 23000
#include "os.h"
#endif
#include "transport.h"
#include "utils.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NG_UNREACHABLE()                                                                           \
    do {                                                                                           \
        fprintf(stderr, "nccl_graph test: NCCL called %s, which this test does not model\n",       \
                __func__);                                                                         \
        abort();                                                                                   \
    } while (0)

/* ---------- logging ---------- */
int ncclDebugLevel = NCCL_LOG_WARN;
uint64_t ncclDebugMask = ~0ull;
thread_local int ncclDebugNoWarn = 0;

static void log_line(ncclDebugLogLevel level, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (level == NCCL_LOG_WARN && ncclDebugNoWarn == 0) ng_record_warn(msg);
    if (level == NCCL_LOG_WARN || ng_verbose())
        fprintf(stderr, "[rank %d] %s %s\n", ng_thread_rank(),
                level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
}

#if NCCL_VERSION_CODE >= 23000
void ncclDebugLogInternal(ncclDebugLogLevel level, unsigned long flags, const char *file,
                          const char *func, int line, const char *fmt, ...) {
#else
void ncclDebugLog(ncclDebugLogLevel level, unsigned long flags, const char *filefunc, int line,
                  const char *fmt, ...) {
#endif
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap);
    va_end(ap);
}

/* ---------- environment and parameters (read every time: cases change them) ---------- */
const char *ncclGetEnv(const char *name) {
    return getenv(name);
}

static int64_t param(const char *env, int64_t deftVal) {
    const char *s = getenv(env);
    return s && *s ? strtoll(s, NULL, 0) : deftVal;
}

#if NCCL_VERSION_CODE >= 23000
int64_t ncclLoadParam(char const *env, int64_t deftVal, int64_t, int64_t *, int8_t *) {
    return param(env, deftVal);
}
#else
/* Before 2.30 the caller reads the value from its cache: the tests set no NCCL parameter. */
void ncclLoadParam(char const *env, int64_t deftVal, int64_t, int64_t *cache) {
    *cache = param(env, deftVal);
}
#endif

/* ---------- utils (NCCL's misc/utils.cc is not in ../shared) ---------- */
ncclResult_t int64ToBusId(int64_t id, char *busId) {
    sprintf(busId, "%04lx:%02lx:%02lx.%01lx", (long)(id >> 20), (long)((id & 0xff000) >> 12),
            (long)((id & 0xff0) >> 4), (long)(id & 0xf));
    return ncclSuccess;
}

ncclResult_t busIdToInt64(const char *busId, int64_t *id) {
    char hex[17];
    int n = 0;
    for (const char *c = busId; *c && n < 16; c++) {
        if (*c == '.' || *c == ':') continue;
        if (!isxdigit((unsigned char)*c)) break;
        hex[n++] = *c;
    }
    hex[n] = 0;
    *id = strtol(hex, NULL, 16);
    return ncclSuccess;
}

uint64_t getHostHash() {
    return ng_host_hash();
}
int parseStringList(const char *, struct netIf *, int) {
    NG_UNREACHABLE();
}
#if NCCL_VERSION_CODE >= 23000
bool matchIfList(const char *, int, struct netIf *, int, bool, int *) {
    NG_UNREACHABLE();
}
#else
bool matchIfList(const char *, int, struct netIf *, int, bool) {
    NG_UNREACHABLE();
}
#endif

/* ---------- OS layer: sysfs under the fake root ---------- */
static bool read_file(const char *path, char *out, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(out, 1, len - 1, f);
    fclose(f);
    out[n] = 0;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = 0;
    return true;
}

#if NCCL_VERSION_CODE >= 23000
/* 2.30 reaches sysfs through its OS layer: these are its Linux functions, under the fake root. */
char *ncclOsRealpath(const char *path, char *resolved) {
    return realpath(path, resolved);
}

ncclResult_t ncclOsGetPciPath(const char *busId, char **path) {
    char p[PATH_MAX], lower[32];
    snprintf(lower, sizeof(lower), "%s", busId);
    for (char *c = lower; *c; c++)
        *c = tolower(*c);
    snprintf(p, sizeof(p), "%s/sys/bus/pci/devices/%s", ng_sysfs_root(), lower);
    *path = realpath(p, NULL);
    if (*path == NULL) {
        WARN("Could not find real path of %s", p);
        return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t ncclOsTopoGetStrFromSys(const char *path, const char *fileName, char *strValue,
                                     int maxLen) {
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", path, fileName);
    if (!read_file(p, strValue, (size_t)maxLen)) strValue[0] = 0;
    return ncclSuccess;
}

ncclResult_t ncclOsGetNumaNodeAffinity(unsigned int node, char *affinityStr, size_t maxLen) {
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/sys/devices/system/node/node%u/cpumap", ng_sysfs_root(), node);
    if (!read_file(p, affinityStr, maxLen)) {
        WARN("no cpumap for NUMA node %u", node);
        return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t ncclOsGetPciDeviceClassByBusId(const char *busId, char *deviceClass, size_t maxLen) {
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/sys/bus/pci/devices/%s/class", ng_sysfs_root(), busId);
    return read_file(p, deviceClass, maxLen) ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclOsGetBcmLinks(const char *, int *nlinks, char **peers) {
    *nlinks = 0; /* no Broadcom virtual switch links on these nodes */
    *peers = NULL;
    return ncclSuccess;
}

void ncclOsCpuZero(ncclAffinity &a) {
    CPU_ZERO(&a);
}
int ncclOsCpuCount(const ncclAffinity &a) {
    return CPU_COUNT(&a);
}
void ncclOsCpuSet(ncclAffinity &a, int cpu) {
    CPU_SET(cpu, &a);
}
bool ncclOsCpuIsSet(const ncclAffinity &a, int cpu) {
    return CPU_ISSET(cpu, &a);
}
ncclAffinity ncclOsCpuAnd(const ncclAffinity &a, const ncclAffinity &b) {
    ncclAffinity r;
    CPU_AND(&r, &a, &b);
    return r;
}
ncclResult_t ncclOsGetAffinity(ncclAffinity *a) {
    CPU_ZERO(a);
    for (int i = 0; i < 256; i++)
        CPU_SET(i, a);
    return ncclSuccess;
}
#else
/* Before 2.30 the graph code calls realpath/fopen/opendir on "/sys/..." itself: the test links
 * with --wrap for them, and these put the fake root in front of such paths. */
extern "C" char *__real_realpath(const char *path, char *resolved);
extern "C" FILE *__real_fopen(const char *path, const char *mode);
extern "C" DIR *__real_opendir(const char *path);

static const char *under_root(const char *path, char *buf, size_t len) {
    if (strncmp(path, "/sys/", 5) != 0) return path;
    snprintf(buf, len, "%s%s", ng_sysfs_root(), path);
    return buf;
}

extern "C" char *__wrap_realpath(const char *path, char *resolved) {
    char buf[PATH_MAX];
    return __real_realpath(under_root(path, buf, sizeof(buf)), resolved);
}

extern "C" FILE *__wrap_fopen(const char *path, const char *mode) {
    char buf[PATH_MAX];
    return __real_fopen(under_root(path, buf, sizeof(buf)), mode);
}

extern "C" DIR *__wrap_opendir(const char *path) {
    char buf[PATH_MAX];
    return __real_opendir(under_root(path, buf, sizeof(buf)));
}
#endif

/* ---------- NVML: the tree's GPUs, indexed in bus ID order ---------- */
int ncclNvmlDeviceCount = 0;
ncclNvmlDeviceInfo ncclNvmlDevices[ncclNvmlMaxDevices];
ncclNvmlDevicePairInfo ncclNvmlDevicePairs[ncclNvmlMaxDevices][ncclNvmlMaxDevices];

static int handle_index(nvmlDevice_t d) {
    return (int)(uintptr_t)d - 1;
}

ncclResult_t ncclNvmlEnsureInitialized() {
    return ncclSuccess;
}
ncclResult_t ncclNvmlDeviceGetHandleByPciBusId(const char *busId, nvmlDevice_t *device) {
    int i = ng_gpu_index(busId);
    if (i < 0) return ncclSystemError;
    *device = (nvmlDevice_t)(uintptr_t)(i + 1);
    return ncclSuccess;
}
ncclResult_t ncclNvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index) {
    *index = (unsigned)handle_index(device);
    return ncclSuccess;
}
ncclResult_t ncclNvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int *major, int *minor) {
    *major = 9; /* Hopper-class GPUs */
    *minor = 0;
    return ncclSuccess;
}
/* No NVLink on these nodes: every link query fails, as NVML's does for a link that is absent. */
ncclResult_t ncclNvmlDeviceGetNvLinkCapability(nvmlDevice_t, unsigned, nvmlNvLinkCapability_t,
                                               unsigned *) {
    return ncclSystemError;
}
ncclResult_t ncclNvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned, nvmlEnableState_t *) {
    return ncclSystemError;
}
ncclResult_t ncclNvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t, unsigned, nvmlPciInfo_t *) {
    return ncclSystemError;
}
ncclResult_t ncclNvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    /* Same figures sysfs holds for the function. */
    memset(pci, 0, sizeof(*pci));
    const struct ng_pci_ids *ids = ng_gpu_ids(handle_index(device));
    pci->pciDeviceId = (ids->device << 16) | ids->vendor;
    pci->pciSubSystemId = (ids->subsystem_device << 16) | ids->subsystem_vendor;
    return ncclSuccess;
}
ncclResult_t ncclNvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t, unsigned *gen) {
    *gen = 5;
    return ncclSuccess;
}
ncclResult_t ncclNvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t, unsigned *width) {
    *width = 16;
    return ncclSuccess;
}

/* ---------- CUDA and the rest of NCCL: never reached by the graph code on these trees ----------
 */
cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t) {
    return "cuda stub";
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *) {
    NG_UNREACHABLE();
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *, int) {
    NG_UNREACHABLE();
}
cudaError_t cudaFree(void *) {
    NG_UNREACHABLE();
}
int ncclCuMemEnable() {
    NG_UNREACHABLE();
}
gdr_t ncclGdrCopy = NULL;
ncclResult_t wrap_gdr_symbols(void) {
    NG_UNREACHABLE();
}
gdr_t wrap_gdr_open(void) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_close(gdr_t) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_unpin_buffer(gdr_t, gdr_mh_t) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_unmap(gdr_t, gdr_mh_t, void *, size_t) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_runtime_get_version(int *, int *) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_driver_get_version(gdr_t, int *, int *) {
    NG_UNREACHABLE();
}
ncclResult_t wrap_gdr_copy_from_mapping(gdr_mh_t, void *, const void *, size_t) {
    NG_UNREACHABLE();
}
ncclResult_t initChannel(struct ncclComm *, int) {
    NG_UNREACHABLE();
}
int64_t ncclParamWorkArgsBytes() {
    NG_UNREACHABLE();
}
ncclResult_t ncclCollNetGetDevCount(int, int *, int *) {
    NG_UNREACHABLE();
}
ncclResult_t ncclCollNetSetVirtDevCount(int, int) {
    NG_UNREACHABLE();
}
ncclResult_t ncclGinGetDevCount(int, int *, int *) {
    NG_UNREACHABLE();
}
ncclResult_t ncclRmaGetDevCount(int, int *, int *) {
    NG_UNREACHABLE();
}

/* ---------- the net plugin's device count ---------- */
ncclResult_t ncclNetGetDevCount(int, int *nPhysDev, int *nVirtDev) {
    *nPhysDev = ng_net_count();
    *nVirtDev = ng_virt_count();
    return ncclSuccess;
}
ncclResult_t ncclNetSetVirtDevCount(int, int nVirtDev) {
    ng_set_virt_count(nVirtDev);
    return ncclSuccess;
}

#if NCCL_VERSION_CODE < 22200
/* The plugin speaks ncclNet v8 to NCCL 2.21 (v4 would change how NCCL reads GPU Direct). */
int ncclNetVersion(struct ncclComm *) {
    return 8;
}
#endif

/* ---------- transports: GPUs of one node always reach each other (P2P or SHM) ---------- */
#if NCCL_VERSION_CODE >= 22200
static ncclResult_t can_connect(int *ret, struct ncclComm *, struct ncclTopoGraph *,
#else
static ncclResult_t can_connect(int *ret, struct ncclTopoSystem *, struct ncclTopoGraph *,
#endif
                                struct ncclPeerInfo *, struct ncclPeerInfo *) {
    *ret = 1;
    return ncclSuccess;
}
static struct ncclTransport p2p_transport = {"P2P", can_connect, {}, {}};
static struct ncclTransport shm_transport = {"SHM", can_connect, {}, {}};
struct ncclTransport *ncclTransports[NTRANSPORTS] = {&p2p_transport, &shm_transport, NULL, NULL};

/* ---------- bootstrap: the node's ranks are threads ---------- */
ncclResult_t bootstrapIntraNodeAllGather(void *, int *, int rank, int nranks, void *allData,
                                         int size) {
    ng_allgather(rank, nranks, allData, size);
    return ncclSuccess;
}
