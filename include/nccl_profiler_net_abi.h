/*
 * What a network plugin hands NCCL's profiler callback (ncclNet v10+ init), declared by this
 * project.
 *
 * Facts from NCCL's profiler headers (src/include/plugin/profiler/, nccl_common.h): the callback
 * is called with one of four event kinds (start, stop, update, update-and-stop); a start passes
 * the per-request profiler handle NCCL gave isend/irecv, a plugin id and a plugin-defined
 * descriptor. The plugin id carries the event source in its upper bits (IB = 1 << 16, socket =
 * 2 << 16) and the descriptor's version in the lower 16. NCCL hands the id and the descriptor
 * to the profiler plugin as a "network plugin" event (ncclProfileNetPlugin, 1 << 7), so a
 * profiler that decodes net_ib's QP events decodes these too: we emit them as IB, version 1.
 * The layout checks at the bottom pin the x86-64 offsets a profiler reads.
 */
#ifndef NCCL_PROFILER_NET_ABI_H
#define NCCL_PROFILER_NET_ABI_H

#include "nccl_net_abi.h"

#include <stddef.h>
#include <stdint.h>

/* The type argument of ncclProfilerCallback_t. */
enum {
    NCCL_PROF_NET_EVENT_START = 0,
    NCCL_PROF_NET_EVENT_STOP = 1,
    NCCL_PROF_NET_EVENT_UPDATE = 2,
    NCCL_PROF_NET_EVENT_UPDATE_AND_STOP = 3,
};

/* The event type NCCL gives these events in the profiler's descriptor. */
#define NCCL_PROF_EVENT_NET_PLUGIN (1 << 7)

/* pluginId = source type | descriptor version */
#define NCCL_PROF_NET_VER_BITS  16
#define NCCL_PROF_NET_VER_MASK  (~0U >> NCCL_PROF_NET_VER_BITS)
#define NCCL_PROF_NET_TYPE_MASK (~0U << NCCL_PROF_NET_VER_BITS)
#define NCCL_PROF_NET_TYPE_IB   (1U << NCCL_PROF_NET_VER_BITS)
#define NCCL_PROF_NET_IB_VER    1

/* IB descriptor v1: the one event type, a work request on a QP. */
#define NCCL_PROF_NET_IB_QP 1

typedef struct {
    uint8_t type; /* NCCL_PROF_NET_IB_QP */
    union {
        struct {
            int device;     /* the plugin's device index */
            uint64_t wr_id; /* as posted */
            int opcode;     /* enum ibv_wr_opcode */
            int qpNum;
            size_t length; /* bytes the work request carries */
        } qp;
    };
} ncclProfilerNetIbDescr_v1_t;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, qp.device) == 8, "IB descr device");
_Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, qp.wr_id) == 16, "IB descr wr_id");
_Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, qp.opcode) == 24, "IB descr opcode");
_Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, qp.qpNum) == 28, "IB descr qpNum");
_Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, qp.length) == 32, "IB descr length");
_Static_assert(sizeof(ncclProfilerNetIbDescr_v1_t) == 40, "IB descr size");
#endif

#endif /* NCCL_PROFILER_NET_ABI_H */
