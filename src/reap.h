/*
 * Deferred teardown: a closed comm whose end of the connection still has a handshake to
 * finish with its peer (rdma_cm mode: the goodbye, then the graceful disconnect) is handed
 * here, so close returns at once and NCCL's thread never waits for the peer. One thread,
 * started at the first hand-off, steps every item until it is done; finalize waits for all.
 */
#ifndef ERDMA_REAP_H
#define ERDMA_REAP_H

#include <stdint.h>

struct reap_item {
    struct reap_item *next;
    /* Runs on the reaper thread until it returns 1 (done: it may have freed the item). 0: call
     * again once *fd (preset to -1: none) is readable or at *wake_ns (now_ns() clock, preset
     * to UINT64_MAX: never). Must never block. */
    int (*step)(struct reap_item *it, int *fd, uint64_t *wake_ns);
};

/* Hands an item over; it is no longer the caller's. Never fails: without a thread the item
 * is finished in place (blocking, as a close did before). */
void reap_defer(struct reap_item *it);
/* Finishes every item handed over and stops the thread. Bounded by the items' own deadlines. */
void reap_drain(void);
/* Items handed over and not finished yet (tests). */
int reap_pending(void);

#endif
