/*
 * Our profiler descriptor (include/nccl_profiler_net_abi.h) against NCCL's own net_ib_v1.h,
 * compiled from the NCCL sources beside the checkout (../shared/third_party/nccl): the same
 * offsets, size and version, or the build fails.
 */
#include "nccl_profiler_net_abi.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* NCCL's header declares the same typedef name: read it under another one. */
#define ncclProfilerNetIbDescr_v1_t nccl_theirs_t
#include "net_ib_v1.h"
#undef ncclProfilerNetIbDescr_v1_t

#define SAME(f)                                                                                    \
    _Static_assert(offsetof(ncclProfilerNetIbDescr_v1_t, f) == offsetof(nccl_theirs_t, f), #f)
SAME(type);
SAME(qp.device);
SAME(qp.wr_id);
SAME(qp.opcode);
SAME(qp.qpNum);
SAME(qp.length);
_Static_assert(sizeof(ncclProfilerNetIbDescr_v1_t) == sizeof(nccl_theirs_t), "size");
_Static_assert(NCCL_PROF_NET_IB_VER == NCCL_PROFILER_NET_IB_VER, "version");
_Static_assert(NCCL_PROF_NET_IB_QP == ncclProfileQp, "QP event type");

int main(void) {
    printf("OK: our IB profiler descriptor matches NCCL's net_ib_v1.h (%zu bytes)\n",
           sizeof(nccl_theirs_t));
    return 0;
}
