/*
 * Network events for NCCL's profiler: the callback NCCL hands init (v10+), and one start/stop
 * pair per work request posted for a request, with the fields net_ib's QP events carry
 * (device, QP number, work-request id, opcode, length), under net_ib's plugin id, so a profiler
 * that understands net_ib understands us. The profiler takes the timestamps at start and stop.
 *
 * With no profiler attached every hook is one predictable branch on prof_on().
 */
#ifndef ERDMA_PROF_H
#define ERDMA_PROF_H

#include "nccl_profiler_net_abi.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern ncclProfilerCallback_t prof_callback;

/* Set by init (NULL for v8/v9 or when NCCL gives none); cleared at the last finalize. */
void prof_set(ncclProfilerCallback_t fn);

/* 0 or 1, to fold into a fast path's one combined test (p2p.c any_of) */
static inline unsigned prof_active(void) {
    return __atomic_load_n(&prof_callback, __ATOMIC_RELAXED) != NULL;
}
static inline bool prof_on(void) {
    return __builtin_expect(prof_active(), 0);
}

/* Starts a QP event under the request's profiler handle; *ev receives the profiler's event
 * handle (NULL when the profiler declined or failed). No event without a phandle: NCCL's
 * callback dereferences it. */
void prof_qp_start(void **ev, void *phandle, int dev, uint32_t qpn, uint64_t wr_id, int opcode,
                   size_t length);
/* Stops the event in *ev, if any, and clears it. */
void prof_qp_stop(void **ev);

#endif
