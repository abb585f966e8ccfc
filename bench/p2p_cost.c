/*
 * p2p_cost: the CPU cost of the plugin's data path per message, on the host, without
 * RDMA: the plugin's own code (erdma_core) over the fake verbs provider of the unit
 * tests (tests/unit/fake_verbs.h), both ends in this process. Each message is one
 * irecv, one isend (retried while it says "not yet"), and tests until both are done;
 * every message's reported size and first and last bytes are checked.
 *
 *   build-ci/tests/p2p_cost [MESSAGES (100000)] [SIZE (8)]
 *   valgrind --tool=callgrind build-ci/tests/p2p_cost 20000   # instructions per function
 *
 * The fake provider's own work (copies, queues) is in the time too: read the time as an
 * upper bound, and callgrind's counts of the plugin's functions as its cost. Under the
 * test VM's emulation each instruction costs ~15 times what it does natively, which is
 * why this cost shows in bench/run-vm-bench.sh's small-message latencies.
 */
#define _GNU_SOURCE
#include "fake_verbs.h"
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const char *what, long i) {
    fprintf(stderr, "p2p_cost: %s at message %ld\n", what, i);
    return 1;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100000;
    long size = argc > 2 ? strtol(argv[2], NULL, 10) : 8;
    if (n < 1 || size < 1 || size > (1l << 26)) {
        fprintf(stderr, "usage: p2p_cost [MESSAGES >= 1] [SIZE 1..64M]\n");
        return 2;
    }
    if (fake_env_start(1, NULL, NULL) != 1) return fail("no fake device", 0);
    void *sc, *rc;
    if (fake_pair_connect(0, 0, &sc, &rc)) return fail("connect", 0);
    unsigned char *src = calloc(1, (size_t)size), *dst = calloc(1, (size_t)size);
    void *smh = NULL, *rmh = NULL;
    if (!src || !dst || erdma_reg_mr(sc, src, (size_t)size, NCCL_PTR_HOST, &smh) ||
        erdma_reg_mr(rc, dst, (size_t)size, NCCL_PTR_HOST, &rmh))
        return fail("buffers", 0);
    void *data[1] = {dst}, *mhs[1] = {rmh};
    size_t sizes[1] = {(size_t)size};
    int tags[1] = {7};
    long tests = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) {
        void *rreq = NULL, *sreq = NULL;
        src[0] = src[size - 1] = (unsigned char)(i + 1);
        if (erdma_irecv(rc, 1, data, sizes, tags, mhs, NULL, &rreq) || !rreq)
            return fail("irecv", i);
        for (int k = 0; !sreq; k++)
            if (k == 1000 || erdma_isend(sc, src, (size_t)size, 7, smh, NULL, &sreq))
                return fail("isend", i);
        int sdone = 0, rdone = 0, got[1] = {-1}, sent = -1; /* NCCL asks both for sizes */
        for (int k = 0; !sdone || !rdone; k++) {
            if (k == 100000) return fail("no completion", i);
            if (!sdone && (tests++, erdma_test(sreq, &sdone, &sent))) return fail("test (send)", i);
            if (!rdone && (tests++, erdma_test(rreq, &rdone, got))) return fail("test (recv)", i);
        }
        if (got[0] != size || sent != size || dst[0] != src[0] || dst[size - 1] != src[size - 1])
            return fail("wrong data or size", i);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns =
        ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n;
    printf("%ld messages of %ld bytes: %.1f ns per message (irecv, isend, %.2f test calls)\n", n,
           size, ns, (double)tests / (double)n);
    erdma_dereg_mr(sc, smh);
    erdma_dereg_mr(rc, rmh);
    if (erdma_close_send(sc) || erdma_close_recv(rc)) return fail("close", n);
    free(src);
    free(dst);
    return fake_env_stop() ? fail("objects leaked", n) : 0;
}
