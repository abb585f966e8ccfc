/* Owns the profiler callback and the events handed to it; see prof.h. */
#include "prof.h"
#include "log.h"

ncclProfilerCallback_t prof_callback;
static int warned; /* a failing profiler is reported once, and never fails the data path */

void prof_set(ncclProfilerCallback_t fn) {
    __atomic_store_n(&prof_callback, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&warned, 0, __ATOMIC_RELAXED);
}

static void prof_failed(ncclResult_t r, const char *what) {
    if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) return;
    WARN("the NCCL profiler callback failed (%d) on a network event %s; its events may be "
         "incomplete, the transfers are not affected",
         (int)r, what);
}

void prof_qp_start(void **ev, void *phandle, int dev, uint32_t qpn, uint64_t wr_id, int opcode,
                   size_t length) {
    ncclProfilerCallback_t fn = __atomic_load_n(&prof_callback, __ATOMIC_RELAXED);
    *ev = NULL;
    if (!fn || !phandle) return;
    /* NCCL hands the descriptor to the profiler during the call; net_ib reuses its copy for
     * the next event at once, so profilers copy what they keep */
    ncclProfilerNetIbDescr_v1_t d = {.type = NCCL_PROF_NET_IB_QP};
    d.qp.device = dev;
    d.qp.wr_id = wr_id;
    d.qp.opcode = opcode;
    d.qp.qpNum = (int)qpn;
    d.qp.length = length;
    int64_t id = (int64_t)(NCCL_PROF_NET_TYPE_IB | NCCL_PROF_NET_IB_VER);
    ncclResult_t r = fn(ev, NCCL_PROF_NET_EVENT_START, phandle, id, &d);
    if (r != ncclSuccess) {
        *ev = NULL;
        prof_failed(r, "start");
    }
}

void prof_qp_stop(void **ev) {
    ncclProfilerCallback_t fn = __atomic_load_n(&prof_callback, __ATOMIC_RELAXED);
    if (!fn || !*ev) return;
    ncclResult_t r = fn(ev, NCCL_PROF_NET_EVENT_STOP, NULL, 0, NULL);
    if (r != ncclSuccess) prof_failed(r, "stop");
    *ev = NULL;
}
