/*
 * Our declaration of the ncclNet ABI (include/nccl_net_abi.h) against the one NCCL compiles
 * itself with: NCCL's own nccl_net.h, from the sources beside the checkout, at the release
 * this executable is built for. Every member of every table, property and handle struct that
 * the release declares, for each ncclNet version from 8 to the newest it has: the same
 * offset, the same size and the same type, where a function pointer's type is compared
 * parameter by parameter and a struct counts as the same only when its own members do. Also
 * the enum values and constants we share with NCCL. A mismatch is what NCCL would misread:
 * a shifted property, a table entry called with the wrong arguments.
 *
 * NCCL's declarations live in the global namespace, ours in namespace `ours`; the two never
 * mix. Every mismatch is printed, and the exit status is 1 if there is one.
 */
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "nccl_net.h" /* NCCL's */

#ifndef THEIRS_NET_MAX
#error "THEIRS_NET_MAX: the newest ncclNet version of this NCCL release"
#endif

/* NCCL's constants that our header defines too: their values, before ours replace them. */
static const long long theirs_handle_max = NCCL_NET_HANDLE_MAXSIZE;
static const long long theirs_max_requests = NCCL_NET_MAX_REQUESTS;
static const long long theirs_ptr[3] = {NCCL_PTR_HOST, NCCL_PTR_CUDA, NCCL_PTR_DMABUF};
#undef NCCL_NET_HANDLE_MAXSIZE
#undef NCCL_NET_MAX_REQUESTS
#undef NCCL_PTR_HOST
#undef NCCL_PTR_CUDA
#undef NCCL_PTR_DMABUF
#if THEIRS_NET_MAX >= 9
static const long long theirs_max_net_size = NCCL_MAX_NET_SIZE_BYTES;
#undef NCCL_MAX_NET_SIZE_BYTES
#endif
/* the vProps size of v9 to v11: NCCL_NET_MAX_DEVS_PER_NIC_V11 from 2.28, _V9 before (ours) */
#if defined(NCCL_NET_MAX_DEVS_PER_NIC_V11)
static const long long theirs_devs_per_nic_v9 = NCCL_NET_MAX_DEVS_PER_NIC_V11;
#elif defined(NCCL_NET_MAX_DEVS_PER_NIC_V9)
static const long long theirs_devs_per_nic_v9 = NCCL_NET_MAX_DEVS_PER_NIC_V9;
#undef NCCL_NET_MAX_DEVS_PER_NIC_V9
#endif
#if THEIRS_NET_MAX >= 10
static const long long theirs_tc_undef = NCCL_NET_TRAFFIC_CLASS_UNDEF;
#undef NCCL_NET_TRAFFIC_CLASS_UNDEF
#endif
#if THEIRS_NET_MAX >= 12
static const long long theirs_devs_per_nic_v12 = NCCL_NET_MAX_DEVS_PER_NIC_V12;
static const long long theirs_id_undef = NCCL_NET_ID_UNDEF;
#undef NCCL_NET_MAX_DEVS_PER_NIC_V12
#undef NCCL_NET_ID_UNDEF
#endif

namespace ours {
#define _Static_assert static_assert
#include "nccl_net_abi.h"
#undef _Static_assert
} // namespace ours

/* ------------------------------------------------------------ type shapes */
/* Two types are the same when they are one type, or pointers to / arrays of / const the same,
 * or functions whose return and parameters are the same one by one, or a pair of our struct
 * and NCCL's registered below (each such pair's members are compared in main). */
template <class A, class B> struct same : std::is_same<A, B> {};
template <class A, class B> struct same<A *, B *> : same<A, B> {};
template <class A, class B> struct same<const A, const B> : same<A, B> {};
template <class A, class B, size_t N> struct same<A[N], B[N]> : same<A, B> {};

template <class... T> struct list {};
template <class LA, class LB> struct same_each;
template <class... A, class... B>
struct same_each<list<A...>, list<B...>> : std::bool_constant<(same<A, B>::value && ...)> {};
template <class RA, class RB, class LA, class LB, bool equal_arity>
struct same_fn : std::false_type {};
template <class RA, class RB, class LA, class LB>
struct same_fn<RA, RB, LA, LB, true>
    : std::bool_constant<same<RA, RB>::value && same_each<LA, LB>::value> {};
template <class RA, class... A, class RB, class... B>
struct same<RA(A...), RB(B...)>
    : same_fn<RA, RB, list<A...>, list<B...>, sizeof...(A) == sizeof...(B)> {};
template <class RA, class... A, class RB, class... B>
struct same<RA(A..., ...), RB(B..., ...)>
    : same_fn<RA, RB, list<A...>, list<B...>, sizeof...(A) == sizeof...(B)> {};

#define PAIR(OURS, THEIRS)                                                                         \
    template <> struct same<ours::OURS, THEIRS> : std::true_type {}
PAIR(ncclResult_t, ncclResult_t);
PAIR(ncclDebugLogLevel, ncclDebugLogLevel);
PAIR(ncclNetDeviceType, ncclNetDeviceType);
PAIR(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t);
PAIR(ncclNetProperties_v8_t, ncclNetProperties_v8_t);
#if THEIRS_NET_MAX >= 9
PAIR(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v9_t);
PAIR(ncclNetProperties_v9_t, ncclNetProperties_v9_t);
#endif
#if THEIRS_NET_MAX >= 10
PAIR(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v10_t);
PAIR(ncclNetProperties_v9_t, ncclNetProperties_v10_t);
PAIR(ncclNetCommConfig_t, ncclNetCommConfig_v10_t);
#endif
#if THEIRS_NET_MAX >= 11
PAIR(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v11_t);
PAIR(ncclNetProperties_v11_t, ncclNetProperties_v11_t);
PAIR(ncclNetCommConfig_t, ncclNetCommConfig_v11_t);
PAIR(ncclNetCommAttr_t, ncclNetCommAttr_v11_t);
PAIR(ncclNetAttr_t, ncclNetAttr_v11_t);
#endif
#if THEIRS_NET_MAX >= 12
PAIR(ncclNetVDeviceProps_v12_t, ncclNetVDeviceProps_v12_t);
PAIR(ncclNetProperties_v12_t, ncclNetProperties_v12_t);
PAIR(ncclNetCommConfig_t, ncclNetCommConfig_v12_t);
PAIR(ncclNetCommAttr_t, ncclNetCommAttr_v12_t);
PAIR(ncclNetAttr_t, ncclNetAttr_v12_t);
#endif

/* The comparison itself must be able to say no. */
static_assert(!same<int (*)(int, size_t), int (*)(int, int)>::value, "parameter types");
static_assert(!same<int (*)(int), int (*)(int, int)>::value, "arity");
static_assert(!same<ours::ncclNetProperties_v8_t *, ncclNetProperties_v8_t **>::value, "depth");
static_assert(same<void (*)(const char *, ...), void (*)(const char *, ...)>::value, "variadic");

/* ------------------------------------------------------------ checks */
static int checked, failed;

static void check(bool ok, const char *what, long long ours_v, long long theirs_v) {
    checked++;
    if (ok) return;
    failed++;
    printf("MISMATCH %s: ours %lld, NCCL's %lld\n", what, ours_v, theirs_v);
}

static void check_type(bool ok, const char *what) {
    checked++;
    if (ok) return;
    failed++;
    printf("MISMATCH %s: not the same type\n", what);
}

/* One member: offset, size and type. */
#define MEMBER(OURS, THEIRS, m)                                                                    \
    do {                                                                                           \
        check(offsetof(ours::OURS, m) == offsetof(THEIRS, m), #THEIRS "." #m " offset",            \
              (long long)offsetof(ours::OURS, m), (long long)offsetof(THEIRS, m));                 \
        check(sizeof(ours::OURS::m) == sizeof(THEIRS::m), #THEIRS "." #m " size",                  \
              (long long)sizeof(ours::OURS::m), (long long)sizeof(THEIRS::m));                     \
        check_type(same<decltype(ours::OURS::m), decltype(THEIRS::m)>::value, #THEIRS "." #m);     \
    } while (0)
/* The whole struct: a member NCCL has and we lack shows up here (or in a later offset). */
#define SIZE(OURS, THEIRS)                                                                         \
    check(sizeof(ours::OURS) == sizeof(THEIRS), #THEIRS " size", (long long)sizeof(ours::OURS),    \
          (long long)sizeof(THEIRS))
#define VALUE(what, ours_v, theirs_v)                                                              \
    check((long long)(ours_v) == (long long)(theirs_v), what, (long long)(ours_v),                 \
          (long long)(theirs_v))

#define PROPS_V8_MEMBERS(O, T)                                                                     \
    MEMBER(O, T, name);                                                                            \
    MEMBER(O, T, pciPath);                                                                         \
    MEMBER(O, T, guid);                                                                            \
    MEMBER(O, T, ptrSupport);                                                                      \
    MEMBER(O, T, regIsGlobal);                                                                     \
    MEMBER(O, T, speed);                                                                           \
    MEMBER(O, T, port);                                                                            \
    MEMBER(O, T, latency);                                                                         \
    MEMBER(O, T, maxComms);                                                                        \
    MEMBER(O, T, maxRecvs);                                                                        \
    MEMBER(O, T, netDeviceType);                                                                   \
    MEMBER(O, T, netDeviceVersion);                                                                \
    SIZE(O, T)
#define PROPS_V9_MEMBERS(O, T)                                                                     \
    MEMBER(O, T, forceFlush);                                                                      \
    MEMBER(O, T, vProps);                                                                          \
    MEMBER(O, T, maxP2pBytes);                                                                     \
    MEMBER(O, T, maxCollBytes);                                                                    \
    PROPS_V8_MEMBERS(O, T)
#define VPROPS_MEMBERS(O, T)                                                                       \
    MEMBER(O, T, ndevs);                                                                           \
    MEMBER(O, T, devs);                                                                            \
    SIZE(O, T)
#define TABLE_V8_MEMBERS(O, T)                                                                     \
    MEMBER(O, T, name);                                                                            \
    MEMBER(O, T, init);                                                                            \
    MEMBER(O, T, devices);                                                                         \
    MEMBER(O, T, getProperties);                                                                   \
    MEMBER(O, T, listen);                                                                          \
    MEMBER(O, T, connect);                                                                         \
    MEMBER(O, T, accept);                                                                          \
    MEMBER(O, T, regMr);                                                                           \
    MEMBER(O, T, regMrDmaBuf);                                                                     \
    MEMBER(O, T, deregMr);                                                                         \
    MEMBER(O, T, isend);                                                                           \
    MEMBER(O, T, irecv);                                                                           \
    MEMBER(O, T, iflush);                                                                          \
    MEMBER(O, T, test);                                                                            \
    MEMBER(O, T, closeSend);                                                                       \
    MEMBER(O, T, closeRecv);                                                                       \
    MEMBER(O, T, closeListen);                                                                     \
    MEMBER(O, T, getDeviceMr);                                                                     \
    MEMBER(O, T, irecvConsumed);                                                                   \
    SIZE(O, T)
#define TABLE_V11_MEMBERS(O, T)                                                                    \
    MEMBER(O, T, makeVDevice);                                                                     \
    MEMBER(O, T, finalize);                                                                        \
    MEMBER(O, T, setNetAttr);                                                                      \
    TABLE_V8_MEMBERS(O, T)
#define CONFIG_MEMBERS(O, T)                                                                       \
    MEMBER(O, T, trafficClass);                                                                    \
    SIZE(O, T)
#define ATTR_MEMBERS(O, T, CA, CT)                                                                 \
    MEMBER(CA, CT, maxConcurrentPeers);                                                            \
    MEMBER(CA, CT, minConcurrentPeers);                                                            \
    MEMBER(CA, CT, maxFlowsPerPeer);                                                               \
    MEMBER(CA, CT, minFlowsPerPeer);                                                               \
    SIZE(CA, CT);                                                                                  \
    MEMBER(O, T, sendCommAttr);                                                                    \
    MEMBER(O, T, recvCommAttr);                                                                    \
    MEMBER(O, T, op);                                                                              \
    MEMBER(O, T, algo);                                                                            \
    MEMBER(O, T, proto);                                                                           \
    SIZE(O, T)

int main() {
    /* shared enums and constants */
    VALUE("ncclSuccess", ours::ncclSuccess, ncclSuccess);
    VALUE("ncclUnhandledCudaError", ours::ncclUnhandledCudaError, ncclUnhandledCudaError);
    VALUE("ncclSystemError", ours::ncclSystemError, ncclSystemError);
    VALUE("ncclInternalError", ours::ncclInternalError, ncclInternalError);
    VALUE("ncclInvalidArgument", ours::ncclInvalidArgument, ncclInvalidArgument);
    VALUE("ncclInvalidUsage", ours::ncclInvalidUsage, ncclInvalidUsage);
    VALUE("ncclRemoteError", ours::ncclRemoteError, ncclRemoteError);
    VALUE("ncclInProgress", ours::ncclInProgress, ncclInProgress);
    VALUE("sizeof(ncclResult_t)", sizeof(ours::ncclResult_t), sizeof(ncclResult_t));
    VALUE("NCCL_LOG_NONE", ours::NCCL_LOG_NONE, NCCL_LOG_NONE);
    VALUE("NCCL_LOG_VERSION", ours::NCCL_LOG_VERSION, NCCL_LOG_VERSION);
    VALUE("NCCL_LOG_WARN", ours::NCCL_LOG_WARN, NCCL_LOG_WARN);
    VALUE("NCCL_LOG_INFO", ours::NCCL_LOG_INFO, NCCL_LOG_INFO);
    VALUE("NCCL_LOG_ABORT", ours::NCCL_LOG_ABORT, NCCL_LOG_ABORT);
    VALUE("NCCL_LOG_TRACE", ours::NCCL_LOG_TRACE, NCCL_LOG_TRACE);
    VALUE("NCCL_INIT", ours::NCCL_INIT, NCCL_INIT);
    VALUE("NCCL_NET", ours::NCCL_NET, NCCL_NET);
    VALUE("NCCL_ENV", ours::NCCL_ENV, NCCL_ENV);
    VALUE("NCCL_ALL", ours::NCCL_ALL, NCCL_ALL);
    VALUE("NCCL_NET_DEVICE_HOST", ours::NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_HOST);
    VALUE("NCCL_NET_DEVICE_UNPACK", ours::NCCL_NET_DEVICE_UNPACK, NCCL_NET_DEVICE_UNPACK);
    VALUE("NCCL_NET_HANDLE_MAXSIZE", NCCL_NET_HANDLE_MAXSIZE, theirs_handle_max);
    VALUE("NCCL_NET_MAX_REQUESTS", NCCL_NET_MAX_REQUESTS, theirs_max_requests);
    VALUE("NCCL_PTR_HOST", NCCL_PTR_HOST, theirs_ptr[0]);
    VALUE("NCCL_PTR_CUDA", NCCL_PTR_CUDA, theirs_ptr[1]);
    VALUE("NCCL_PTR_DMABUF", NCCL_PTR_DMABUF, theirs_ptr[2]);
    check_type(same<ours::ncclDebugLogger_t, ncclDebugLogger_t>::value, "ncclDebugLogger_t");

    MEMBER(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t, netDeviceType);
    MEMBER(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t, netDeviceVersion);
    MEMBER(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t, handle);
    MEMBER(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t, size);
    MEMBER(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t, needsProxyProgress);
    SIZE(ncclNetDeviceHandle_t, ncclNetDeviceHandle_v7_t);

    PROPS_V8_MEMBERS(ncclNetProperties_v8_t, ncclNetProperties_v8_t);
    TABLE_V8_MEMBERS(ncclNet_v8_t, ncclNet_v8_t);
#if THEIRS_NET_MAX >= 9
    VALUE("NCCL_MAX_NET_SIZE_BYTES", NCCL_MAX_NET_SIZE_BYTES, theirs_max_net_size);
    VALUE("NCCL_NET_MAX_DEVS_PER_NIC_V9", NCCL_NET_MAX_DEVS_PER_NIC_V9, theirs_devs_per_nic_v9);
    VPROPS_MEMBERS(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v9_t);
    PROPS_V9_MEMBERS(ncclNetProperties_v9_t, ncclNetProperties_v9_t);
    MEMBER(ncclNet_v9_t, ncclNet_v9_t, makeVDevice);
    TABLE_V8_MEMBERS(ncclNet_v9_t, ncclNet_v9_t);
#endif
#if THEIRS_NET_MAX >= 10
    check_type(same<ours::ncclProfilerCallback_t, ncclProfilerCallback_t>::value,
               "ncclProfilerCallback_t");
    VALUE("NCCL_NET_TRAFFIC_CLASS_UNDEF", NCCL_NET_TRAFFIC_CLASS_UNDEF, theirs_tc_undef);
    VPROPS_MEMBERS(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v10_t);
    PROPS_V9_MEMBERS(ncclNetProperties_v10_t, ncclNetProperties_v10_t);
    CONFIG_MEMBERS(ncclNetCommConfig_t, ncclNetCommConfig_v10_t);
    MEMBER(ncclNet_v10_t, ncclNet_v10_t, makeVDevice);
    TABLE_V8_MEMBERS(ncclNet_v10_t, ncclNet_v10_t);
#endif
#if THEIRS_NET_MAX >= 11
    VPROPS_MEMBERS(ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v11_t);
    MEMBER(ncclNetProperties_v11_t, ncclNetProperties_v11_t, maxMultiRequestSize);
    PROPS_V9_MEMBERS(ncclNetProperties_v11_t, ncclNetProperties_v11_t);
    CONFIG_MEMBERS(ncclNetCommConfig_t, ncclNetCommConfig_v11_t);
    ATTR_MEMBERS(ncclNetAttr_t, ncclNetAttr_v11_t, ncclNetCommAttr_t, ncclNetCommAttr_v11_t);
    TABLE_V11_MEMBERS(ncclNet_v11_t, ncclNet_v11_t);
#endif
#if THEIRS_NET_MAX >= 12
    VALUE("NCCL_NET_MAX_DEVS_PER_NIC_V12", NCCL_NET_MAX_DEVS_PER_NIC_V12, theirs_devs_per_nic_v12);
    VALUE("NCCL_NET_ID_UNDEF", NCCL_NET_ID_UNDEF, theirs_id_undef);
    VPROPS_MEMBERS(ncclNetVDeviceProps_v12_t, ncclNetVDeviceProps_v12_t);
    MEMBER(ncclNetProperties_v12_t, ncclNetProperties_v12_t, maxMultiRequestSize);
    MEMBER(ncclNetProperties_v12_t, ncclNetProperties_v12_t, railId);
    MEMBER(ncclNetProperties_v12_t, ncclNetProperties_v12_t, planeId);
    PROPS_V9_MEMBERS(ncclNetProperties_v12_t, ncclNetProperties_v12_t);
    CONFIG_MEMBERS(ncclNetCommConfig_t, ncclNetCommConfig_v12_t);
    ATTR_MEMBERS(ncclNetAttr_t, ncclNetAttr_v12_t, ncclNetCommAttr_t, ncclNetCommAttr_v12_t);
    TABLE_V11_MEMBERS(ncclNet_v12_t, ncclNet_v12_t);
#endif
    if (failed) {
        printf("FAIL: %d of %d checks differ from NCCL %s's nccl_net.h (ncclNet v8..v%d)\n", failed,
               checked, NCCL_RELEASE, THEIRS_NET_MAX);
        return 1;
    }
    printf("OK: %d checks, ncclNet v8..v%d as NCCL %s's nccl_net.h declares them\n", checked,
           THEIRS_NET_MAX, NCCL_RELEASE);
    return 0;
}
