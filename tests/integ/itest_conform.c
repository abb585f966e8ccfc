/*
 * Conformance: the behaviours of NCCL's own net_ib (transport/net_ib/p2p.cc and connect.cc,
 * NCCL 2.21-2.30) that callers depend on, each held against this plugin as one case, between
 * two processes through dlopen, on every VM device (ITEST_DEVICES, default "rxe0,siw0") and
 * through API v11 and v12. Each case names the net_ib behaviour in its comment and its output.
 * Both processes are ranks of a ring of two where a case needs it: each listens, connects to
 * the other and accepts, so it holds a send comm and a receive comm at once.
 * ITEST_ONLY=<substring> runs only the cases whose name contains it.
 */
#define _GNU_SOURCE
#include "netapi.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define TMO       120 /* seconds any one wait may take before the case fails */
#define CANARY    0xEE
#define NTHREADS  4 /* threads on the device under test (the case adds 2 on the other one) */
#define NXTHREADS 2
#define MAXLINKS  (NTHREADS + NXTHREADS)
#define NACCEPTS  8

struct cfg {
    char dev[16];
    char other[16]; /* the other VM device, for the threads case */
    int version;
};

/* Handles cross between the two processes through memory both inherit (one slot per link). */
struct xchg {
    int ready[2][MAXLINKS];
    char handle[2][MAXLINKS][NCCL_NET_HANDLE_MAXSIZE];
};

struct run {
    struct cfg cfg;
    struct xchg *x;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *page_alloc(size_t len) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1)) return NULL;
    return p;
}

static int dev_index(struct netapi *n, const char *name) {
    int ndev = 0;
    if (n->t12->devices(&ndev)) return -1;
    for (int i = 0; i < ndev; i++) {
        ncclNetProperties_v8_t pr;
        n->p.v8->getProperties(i, &pr);
        if (!strcmp(pr.name, name)) return i;
    }
    return -1;
}

/* One call each, as NCCL's proxy makes them: NULL means "not yet, call again". */
static int isend_once(struct netapi *n, void *sc, void *data, size_t size, int tag, void *mh,
                      void **req) {
    *req = NULL;
    return n->t12->isend(sc, data, size, tag, mh, NULL, req);
}

/* ------------------------------------------------------------ ring links */
struct link {
    struct netapi n; /* a copy with this link's device; the tables and context are shared */
    void *lc, *sc, *rc;
};

static int xchg_publish(struct xchg *x, int role, int idx, const void *handle) {
    memcpy(x->handle[role][idx], handle, NCCL_NET_HANDLE_MAXSIZE);
    __atomic_store_n(&x->ready[role][idx], 1, __ATOMIC_RELEASE);
    return 0;
}

static int xchg_take(struct xchg *x, int role, int idx, void *handle) {
    double end = now_s() + TMO;
    while (!__atomic_load_n(&x->ready[role][idx], __ATOMIC_ACQUIRE)) {
        if (now_s() > end) {
            fprintf(stderr, "link %d: the peer published no handle in %d s\n", idx, TMO);
            return -1;
        }
        usleep(1000);
    }
    memcpy(handle, x->handle[role][idx], NCCL_NET_HANDLE_MAXSIZE);
    return 0;
}

/* Listens, publishes the handle, then connects to the peer's and accepts the peer in turns. */
static int link_open(struct link *L, const struct netapi *n, int dev, struct xchg *x, int role,
                     int idx) {
    char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
    memset(L, 0, sizeof(*L));
    L->n = *n;
    L->n.dev = dev;
    CHECK(net_listen(&L->n, mine, &L->lc) == 0);
    CHECK(xchg_publish(x, role, idx, mine) == 0);
    CHECK(xchg_take(x, !role, idx, theirs) == 0);
    double end = now_s() + TMO;
    while (!L->sc || !L->rc) {
        ncclNetDeviceHandle_t *dh = NULL;
        if (!L->sc) CHECK(L->n.t12->connect(L->n.ctx, dev, theirs, &L->sc, &dh) == 0);
        if (!L->rc) CHECK(L->n.t12->accept(L->lc, &L->rc, &dh) == 0);
        if (now_s() > end) {
            fprintf(stderr, "link %d: not connected both ways after %d s\n", idx, TMO);
            return -1;
        }
    }
    return 0;
}

static int link_close(struct link *L) {
    CHECK(net_close_send(&L->n, L->sc) == 0);
    CHECK(net_close_recv(&L->n, L->rc) == 0);
    CHECK(net_close_listen(&L->n, L->lc) == 0);
    return 0;
}

/* ------------------------------------------------------------ case: spin without test
 * net_ib: ncclIbIrecv posts the clear-to-send (ncclIbPostFifo) inside irecv, so a posted
 * receive reaches the sender with no further call on any comm. Both ranks post 32 receives,
 * then spin on isend alone until each returns a request (a ring's two ranks do this), and only
 * then test. Any clear-to-send held back until a later call on the receive comm hangs both. */
#define SPIN_MSGS   32
#define SPIN_ROUNDS 4
static size_t spin_size(int round, int k) {
    static const size_t sz[] = {8, 100, 4096, 65536};
    return sz[(round + k) % 4];
}

static int spin_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child;
    struct netapi n;
    struct link L;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 0) == 0);
    size_t cap = 65536;
    uint8_t *sbuf = page_alloc(cap * SPIN_MSGS), *rbuf = page_alloc(cap * SPIN_MSGS);
    void *smh, *rmh;
    CHECK(net_regmr(&n, L.sc, sbuf, cap * SPIN_MSGS, &smh) == 0);
    CHECK(net_regmr(&n, L.rc, rbuf, cap * SPIN_MSGS, &rmh) == 0);
    for (int round = 0; round < SPIN_ROUNDS; round++) {
        void *rreq[SPIN_MSGS], *sreq[SPIN_MSGS];
        memset(rbuf, CANARY, cap * SPIN_MSGS);
        for (int k = 0; k < SPIN_MSGS; k++) {
            void *data = rbuf + k * cap;
            size_t sz = cap;
            int tag = k;
            CHECK(net_irecv(&n, L.rc, 1, &data, &sz, &tag, &rmh, &rreq[k], TMO) == 0);
        }
        for (int k = 0; k < SPIN_MSGS; k++) {
            uint8_t *p = sbuf + k * cap;
            pattern_fill(p, spin_size(round, k), (uint32_t)(round * 1000 + k + role * 77));
            double end = now_s() + TMO;
            do {
                CHECK(isend_once(&n, L.sc, p, spin_size(round, k), k, smh, &sreq[k]) == 0);
                if (!sreq[k] && now_s() > end) {
                    fprintf(stderr,
                            "round %d: isend %d still NULL after %d s, nothing else "
                            "called: a clear-to-send waits for a later call\n",
                            round, k, TMO);
                    return -1;
                }
            } while (!sreq[k]);
        }
        for (int k = 0; k < SPIN_MSGS; k++) {
            int got = -1;
            CHECK(net_wait(&n, sreq[k], NULL, TMO) == 0);
            CHECK(net_wait(&n, rreq[k], &got, TMO) == 0);
            CHECK(got == (int)spin_size(round, k));
            CHECK(pattern_check(rbuf + k * cap, (size_t)got,
                                (uint32_t)(round * 1000 + k + (!role) * 77)) < 0);
            CHECK((size_t)got == cap || rbuf[k * cap + (size_t)got] == CANARY);
        }
    }
    CHECK(net_deregmr(&n, L.sc, smh) == 0);
    CHECK(net_deregmr(&n, L.rc, rmh) == 0);
    CHECK(link_close(&L) == 0);
    free(sbuf);
    free(rbuf);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: sends tested late
 * net_ib: a send's completion names its request, so sends complete once each however late
 * the caller tests them. Here a completion names a FIFO slot, and the slot comes round again
 * 32 messages later: both ranks send 32 without testing any, take each arrival and post the
 * receive that reuses its slot at once, wait until those clear-to-sends have landed, then
 * send 32 more into the same slots, the first 32 still untested. An isend whose slot still
 * waits for the old completion must return NULL (try again) and every send must complete
 * once, each receive getting its own bytes. */
#define LATE_MSGS 32
#define LATE_SIZE 4096
static int late_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child;
    struct netapi n;
    struct link L;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 0) == 0);
    size_t bytes = (size_t)LATE_SIZE * 2 * LATE_MSGS;
    uint8_t *sbuf = page_alloc(bytes), *rbuf = page_alloc(bytes);
    void *smh, *rmh, *rreq[2 * LATE_MSGS], *sreq[2 * LATE_MSGS];
    CHECK(net_regmr(&n, L.sc, sbuf, bytes, &smh) == 0);
    CHECK(net_regmr(&n, L.rc, rbuf, bytes, &rmh) == 0);
    memset(rbuf, CANARY, bytes);
    for (int k = 0; k < 2 * LATE_MSGS; k++)
        pattern_fill(sbuf + (size_t)k * LATE_SIZE, LATE_SIZE, (uint32_t)(k + role * 500));
    for (int k = 0; k < LATE_MSGS; k++) {
        void *data = rbuf + (size_t)k * LATE_SIZE;
        size_t sz = LATE_SIZE;
        int tag = k;
        CHECK(net_irecv(&n, L.rc, 1, &data, &sz, &tag, &rmh, &rreq[k], TMO) == 0);
    }
    for (int k = 0; k < 2 * LATE_MSGS; k++) {
        if (k == LATE_MSGS) { /* the first 32 landed both ways; their slots' next receives too */
            for (int j = 0; j < LATE_MSGS; j++) {
                int got = -1;
                CHECK(net_wait(&n, rreq[j], &got, TMO) == 0);
                CHECK(got == LATE_SIZE);
                void *data = rbuf + (size_t)(LATE_MSGS + j) * LATE_SIZE;
                size_t sz = LATE_SIZE;
                int tag = LATE_MSGS + j;
                CHECK(net_irecv(&n, L.rc, 1, &data, &sz, &tag, &rmh, &rreq[LATE_MSGS + j], TMO) ==
                      0);
            }
            CHECK(duo_barrier(d) == 0);
            usleep(200000); /* the peer's clear-to-sends and our first sends' ACKs are in */
        }
        double end = now_s() + TMO;
        do {
            CHECK(isend_once(&n, L.sc, sbuf + (size_t)k * LATE_SIZE, LATE_SIZE, k, smh, &sreq[k]) ==
                  0);
            CHECK(sreq[k] || now_s() < end);
        } while (!sreq[k]);
    }
    for (int k = 0; k < 2 * LATE_MSGS; k++) {
        int got = -1;
        CHECK(net_wait(&n, sreq[k], &got, TMO) == 0);
        CHECK(got == LATE_SIZE);
    }
    for (int k = LATE_MSGS; k < 2 * LATE_MSGS; k++) {
        int got = -1;
        CHECK(net_wait(&n, rreq[k], &got, TMO) == 0);
        CHECK(got == LATE_SIZE);
    }
    for (int k = 0; k < 2 * LATE_MSGS; k++)
        CHECK(pattern_check(rbuf + (size_t)k * LATE_SIZE, LATE_SIZE,
                            (uint32_t)(k + (!role) * 500)) < 0);
    CHECK(net_deregmr(&n, L.sc, smh) == 0);
    CHECK(net_deregmr(&n, L.rc, rmh) == 0);
    CHECK(link_close(&L) == 0);
    free(sbuf);
    free(rbuf);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: truncation
 * net_ib: ncclIbIsend truncates a send larger than the matched receive buffer to its size
 * (`if (size > slots[r].size) size = slots[r].size;`); the sender's test reports that size,
 * the receiver's test the bytes that landed (immediate or completion record). Nothing is
 * written past the receive buffer. One single-buffer receive (the immediate path) and one
 * grouped receive (the completion record path), one buffer of it truncated, one not. */
struct trunc_step {
    int n;
    size_t posted[2], sent[2];
};
static const struct trunc_step trunc_steps[] = {
    {1, {4096, 0}, {8192, 0}},
    {1, {65536 + 3, 0}, {1 << 20, 0}},
    {2, {4096, 100}, {1 << 16, 50}},
    {1, {0, 0}, {300, 0}},
};
#define TRUNC_STEPS (int)(sizeof(trunc_steps) / sizeof(trunc_steps[0]))
#define TRUNC_CAP   (1u << 20)
#define TRUNC_GUARD 256

static size_t min_sz(size_t a, size_t b) {
    return a < b ? a : b;
}

static int trunc_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child; /* 0 receives, 1 sends */
    struct netapi n;
    struct link L;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 0) == 0);
    size_t len = 2 * (TRUNC_CAP + TRUNC_GUARD);
    uint8_t *buf = page_alloc(len);
    void *mh;
    CHECK(net_regmr(&n, role ? L.sc : L.rc, buf, len, &mh) == 0);
    for (int s = 0; s < TRUNC_STEPS; s++) {
        const struct trunc_step *t = &trunc_steps[s];
        uint8_t *at[2] = {buf, buf + TRUNC_CAP + TRUNC_GUARD};
        int tags[2] = {10 + s, 20 + s};
        if (role == 0) {
            void *data[2] = {at[0], at[1]}, *mhs[2] = {mh, mh}, *req;
            size_t sz[2] = {t->posted[0], t->posted[1]};
            int got[2] = {-1, -1};
            memset(buf, CANARY, len);
            CHECK(net_irecv(&n, L.rc, t->n, data, sz, tags, mhs, &req, TMO) == 0);
            CHECK(net_wait(&n, req, got, TMO) == 0);
            for (int i = 0; i < t->n; i++) {
                size_t want = min_sz(t->posted[i], t->sent[i]);
                if (got[i] != (int)want)
                    fprintf(stderr,
                            "step %d buffer %d: receiver's test says %d bytes, %zu landed\n", s, i,
                            got[i], want);
                CHECK(got[i] == (int)want);
                CHECK(pattern_check(at[i], want, (uint32_t)(s * 10 + i)) < 0);
                for (size_t g = want; g < t->posted[i] + TRUNC_GUARD; g++)
                    CHECK(at[i][g] == CANARY);
            }
            CHECK(duo_barrier(d) == 0);
        } else {
            void *req[2];
            for (int i = 0; i < t->n; i++) {
                pattern_fill(at[i], t->sent[i], (uint32_t)(s * 10 + i));
                CHECK(net_isend(&n, L.sc, at[i], t->sent[i], tags[i], mh, &req[i], TMO) == 0);
            }
            for (int i = 0; i < t->n; i++) {
                int got = -1;
                size_t want = min_sz(t->posted[i], t->sent[i]);
                CHECK(net_wait(&n, req[i], &got, TMO) == 0);
                if (got != (int)want)
                    fprintf(stderr, "step %d buffer %d: sender's test says %d bytes, %zu landed\n",
                            s, i, got, want);
                CHECK(got == (int)want);
            }
            CHECK(duo_barrier(d) == 0);
        }
    }
    CHECK(net_deregmr(&n, role ? L.sc : L.rc, mh) == 0);
    CHECK(link_close(&L) == 0);
    free(buf);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: out-of-order tags
 * net_ib: ncclIbIsend matches a tag only against the receive at the head of the FIFO
 * (fifoHead); a tag it does not hold returns a NULL request (`*request = NULL; return
 * ncclSuccess;`) and the caller tries again later: not an error. The receiver posts a grouped
 * receive of tags {4, 5}, then one of tags {0, 1, 2, 3}; the sender offers 0..5 in that order,
 * sweep after sweep, until every send has a request. */
#define OOO_SZ 1000
static const int ooo_first[2] = {4, 5}, ooo_second[4] = {0, 1, 2, 3};

static int ooo_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child;
    struct netapi n;
    struct link L;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 0) == 0);
    uint8_t *buf = page_alloc(6 * OOO_SZ);
    void *mh;
    CHECK(net_regmr(&n, role ? L.sc : L.rc, buf, 6 * OOO_SZ, &mh) == 0);
    for (int round = 0; round < 3; round++) {
        if (role == 0) {
            void *d1[2], *d2[4], *m[4] = {mh, mh, mh, mh}, *req1, *req2;
            size_t s1[2] = {OOO_SZ, OOO_SZ}, s2[4] = {OOO_SZ, OOO_SZ, OOO_SZ, OOO_SZ};
            int t1[2] = {ooo_first[0], ooo_first[1]};
            int t2[4] = {ooo_second[0], ooo_second[1], ooo_second[2], ooo_second[3]};
            int g1[2], g2[4];
            for (int i = 0; i < 2; i++)
                d1[i] = buf + t1[i] * OOO_SZ;
            for (int i = 0; i < 4; i++)
                d2[i] = buf + t2[i] * OOO_SZ;
            memset(buf, CANARY, 6 * OOO_SZ);
            CHECK(net_irecv(&n, L.rc, 2, d1, s1, t1, m, &req1, TMO) == 0);
            CHECK(net_irecv(&n, L.rc, 4, d2, s2, t2, m, &req2, TMO) == 0);
            CHECK(net_wait(&n, req1, g1, TMO) == 0);
            CHECK(net_wait(&n, req2, g2, TMO) == 0);
            for (int t = 0; t < 6; t++)
                CHECK(pattern_check(buf + t * OOO_SZ, OOO_SZ, (uint32_t)(round * 100 + t)) < 0);
            CHECK(g1[0] == OOO_SZ && g1[1] == OOO_SZ && g2[0] == OOO_SZ && g2[3] == OOO_SZ);
            CHECK(duo_barrier(d) == 0);
        } else {
            void *req[6] = {0};
            int order[6], matched = 0, nulls_before_head = 0;
            for (int t = 0; t < 6; t++)
                pattern_fill(buf + t * OOO_SZ, OOO_SZ, (uint32_t)(round * 100 + t));
            double end = now_s() + TMO;
            while (matched < 6) {
                for (int t = 0; t < 6; t++) {
                    if (req[t]) continue;
                    CHECK(isend_once(&n, L.sc, buf + t * OOO_SZ, OOO_SZ, t, mh, &req[t]) == 0);
                    if (req[t])
                        order[matched++] = t;
                    else if (t < 4 && matched < 2)
                        nulls_before_head++;
                }
                if (matched < 6 && now_s() > end) {
                    fprintf(stderr, "round %d: %d of 6 sends started after %d s\n", round, matched,
                            TMO);
                    return -1;
                }
            }
            /* tags 4 and 5 (the head receive) start first, whatever order they were offered in */
            CHECK((order[0] == 4 && order[1] == 5) || (order[0] == 5 && order[1] == 4));
            CHECK(nulls_before_head > 0); /* tags 0..3 were refused (NULL) while 4/5 were due */
            for (int t = 0; t < 6; t++) {
                int got = -1;
                CHECK(net_wait(&n, req[t], &got, TMO) == 0);
                CHECK(got == OOO_SZ);
            }
            CHECK(duo_barrier(d) == 0);
        }
    }
    CHECK(net_deregmr(&n, role ? L.sc : L.rc, mh) == 0);
    CHECK(link_close(&L) == 0);
    free(buf);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: close in flight
 * net_ib: ncclIbDeregMr and ncclIbCloseSend/ncclIbCloseRecv never wait for outstanding
 * requests (NCCL aborts this way): they succeed with receives posted and sends on the wire,
 * and the plugin keeps working for the next connection. */
#define INFLIGHT_SZ (16u << 20)

static int close_inflight(struct link *L, uint32_t seed) {
    struct netapi *n = &L->n;
    uint8_t *sbuf = page_alloc(INFLIGHT_SZ), *rbuf = page_alloc(2 * INFLIGHT_SZ);
    void *smh, *rmh, *rreq[2], *sreq;
    CHECK(sbuf && rbuf);
    pattern_fill(sbuf, 4096, seed);
    CHECK(net_regmr(n, L->sc, sbuf, INFLIGHT_SZ, &smh) == 0);
    CHECK(net_regmr(n, L->rc, rbuf, 2 * INFLIGHT_SZ, &rmh) == 0);
    for (int i = 0; i < 2; i++) {
        void *data = rbuf + i * INFLIGHT_SZ;
        size_t sz = INFLIGHT_SZ;
        int tag = 7;
        CHECK(net_irecv(n, L->rc, 1, &data, &sz, &tag, &rmh, &rreq[i], TMO) == 0);
    }
    CHECK(net_isend(n, L->sc, sbuf, INFLIGHT_SZ, 7, smh, &sreq, TMO) == 0);
    /* no test: deregister and close with all three requests outstanding */
    CHECK(net_deregmr(n, L->sc, smh) == 0);
    CHECK(net_deregmr(n, L->rc, rmh) == 0);
    CHECK(link_close(L) == 0);
    free(sbuf);
    free(rbuf);
    return 0;
}

/* One message each way on a fresh link: the plugin still works. */
static int ping_once(struct link *L, int role, uint32_t seed) {
    struct netapi *n = &L->n;
    uint8_t *sbuf = page_alloc(8192), *rbuf = page_alloc(8192);
    void *smh, *rmh, *sreq, *rreq, *data = rbuf;
    size_t sz = 8192;
    int tag = 3, got = -1;
    pattern_fill(sbuf, 5000, seed + (uint32_t)role);
    CHECK(net_regmr(n, L->sc, sbuf, 8192, &smh) == 0);
    CHECK(net_regmr(n, L->rc, rbuf, 8192, &rmh) == 0);
    CHECK(net_irecv(n, L->rc, 1, &data, &sz, &tag, &rmh, &rreq, TMO) == 0);
    CHECK(net_isend(n, L->sc, sbuf, 5000, 3, smh, &sreq, TMO) == 0);
    CHECK(net_wait(n, sreq, NULL, TMO) == 0);
    CHECK(net_wait(n, rreq, &got, TMO) == 0);
    CHECK(got == 5000);
    CHECK(pattern_check(rbuf, 5000, seed + (uint32_t)!role) < 0);
    CHECK(net_deregmr(n, L->sc, smh) == 0);
    CHECK(net_deregmr(n, L->rc, rmh) == 0);
    free(sbuf);
    free(rbuf);
    return 0;
}

static int inflight_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child;
    struct netapi n;
    struct link L;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 0) == 0);
    CHECK(close_inflight(&L, 5) == 0);
    CHECK(link_open(&L, &n, n.dev, r->x, role, 1) == 0);
    CHECK(ping_once(&L, role, 9) == 0);
    CHECK(link_close(&L) == 0);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: threads
 * net_ib: every comm is independent and NCCL drives comms from several threads at once (one
 * proxy thread per communicator, several communicators per process): device state, memory
 * registration and connection setup are safe across threads. Four threads on the device under
 * test and two on the other one each open their own links, move data, and close, the last
 * time with requests in flight. */
#define THREAD_CYCLES 3
#define THREAD_PINGS  20

struct thread_arg {
    const struct netapi *n;
    int dev, role, idx;
    struct xchg *x;
    int rc;
};

static int thread_body(struct thread_arg *a) {
    for (int cycle = 0; cycle < THREAD_CYCLES; cycle++) {
        struct link L;
        /* each cycle uses its own handle slot set: a slot is published once */
        CHECK(link_open(&L, a->n, a->dev, &a->x[cycle], a->role, a->idx) == 0);
        for (int p = 0; p < THREAD_PINGS; p++)
            CHECK(ping_once(&L, a->role, (uint32_t)(a->idx * 1000 + cycle * 100 + p)) == 0);
        if (cycle == THREAD_CYCLES - 1)
            CHECK(close_inflight(&L, (uint32_t)a->idx) == 0);
        else
            CHECK(link_close(&L) == 0);
    }
    return 0;
}

static void *thread_main(void *p) {
    struct thread_arg *a = p;
    a->rc = thread_body(a);
    if (a->rc) fprintf(stderr, "thread %d (device %d) failed\n", a->idx, a->dev);
    return NULL;
}

static int threads_case(struct duo *d, void *arg) {
    struct run *r = arg;
    struct netapi n;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    int other = dev_index(&n, r->cfg.other);
    if (other < 0) fprintf(stderr, "%s not found: all threads on %s\n", r->cfg.other, r->cfg.dev);
    pthread_t th[MAXLINKS];
    struct thread_arg ta[MAXLINKS];
    for (int i = 0; i < MAXLINKS; i++) {
        ta[i] = (struct thread_arg){.n = &n,
                                    .dev = i < NTHREADS || other < 0 ? n.dev : other,
                                    .role = d->is_child,
                                    .idx = i,
                                    .x = r->x};
        CHECK(pthread_create(&th[i], NULL, thread_main, &ta[i]) == 0);
    }
    int bad = 0;
    for (int i = 0; i < MAXLINKS; i++) {
        pthread_join(th[i], NULL);
        bad += ta[i].rc != 0;
    }
    CHECK(bad == 0);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: one listen, many accepts
 * net_ib: a listen comm stays open for any number of accepts (NCCL keeps one per peer and
 * accepts every connection to it there); connections arriving together are told apart. The
 * child connects eight times at once to one handle; each accepted comm carries its own data. */
static int accepts_case(struct duo *d, void *arg) {
    struct run *r = arg;
    struct netapi n;
    CHECK(net_open(&n, r->cfg.version, r->cfg.dev) == 0);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    if (!d->is_child) {
        void *lc, *rc[NACCEPTS] = {0};
        CHECK(net_listen(&n, handle, &lc) == 0);
        CHECK(xchg_publish(r->x, 0, 0, handle) == 0);
        for (int k = 0; k < NACCEPTS; k++)
            CHECK(net_accept(&n, lc, &rc[k], TMO) == 0);
        uint8_t *buf = page_alloc(NACCEPTS * 4096);
        void *mh[NACCEPTS], *req[NACCEPTS];
        int seen = 0;
        memset(buf, CANARY, NACCEPTS * 4096);
        for (int k = 0; k < NACCEPTS; k++) {
            void *data = buf + k * 4096;
            size_t sz = 4096;
            int tag = 1;
            CHECK(net_regmr(&n, rc[k], data, 4096, &mh[k]) == 0);
            CHECK(net_irecv(&n, rc[k], 1, &data, &sz, &tag, &mh[k], &req[k], TMO) == 0);
        }
        for (int k = 0; k < NACCEPTS; k++) {
            int got = -1;
            uint32_t id;
            CHECK(net_wait(&n, req[k], &got, TMO) == 0);
            CHECK(got == 2048);
            memcpy(&id, buf + k * 4096, sizeof(id));
            CHECK(id < NACCEPTS && !(seen & (1 << id)));
            seen |= 1 << id;
            CHECK(pattern_check(buf + k * 4096 + 4, 2044, id) < 0);
            CHECK(buf[k * 4096 + 2048] == CANARY);
        }
        CHECK(seen == (1 << NACCEPTS) - 1);
        CHECK(duo_barrier(d) == 0);
        for (int k = 0; k < NACCEPTS; k++) {
            CHECK(net_deregmr(&n, rc[k], mh[k]) == 0);
            CHECK(net_close_recv(&n, rc[k]) == 0);
        }
        CHECK(net_close_listen(&n, lc) == 0);
        free(buf);
    } else {
        char h[NACCEPTS][NCCL_NET_HANDLE_MAXSIZE];
        void *sc[NACCEPTS] = {0};
        CHECK(xchg_take(r->x, 0, 0, handle) == 0);
        for (int k = 0; k < NACCEPTS; k++)
            memcpy(h[k], handle, sizeof(handle)); /* a connect in progress owns its buffer */
        double end = now_s() + TMO;
        for (int left = NACCEPTS; left > 0;) {
            for (int k = 0; k < NACCEPTS; k++) {
                if (sc[k]) continue;
                ncclNetDeviceHandle_t *dh = NULL;
                CHECK(n.t12->connect(n.ctx, n.dev, h[k], &sc[k], &dh) == 0);
                left -= sc[k] != NULL;
            }
            CHECK(now_s() < end);
        }
        uint8_t *buf = page_alloc(NACCEPTS * 2048);
        void *mh[NACCEPTS], *req[NACCEPTS];
        for (int k = 0; k < NACCEPTS; k++) {
            uint8_t *p = buf + k * 2048;
            uint32_t id = (uint32_t)k;
            memcpy(p, &id, sizeof(id));
            pattern_fill(p + 4, 2044, id);
            CHECK(net_regmr(&n, sc[k], p, 2048, &mh[k]) == 0);
            CHECK(net_isend(&n, sc[k], p, 2048, 1, mh[k], &req[k], TMO) == 0);
        }
        for (int k = 0; k < NACCEPTS; k++)
            CHECK(net_wait(&n, req[k], NULL, TMO) == 0);
        CHECK(duo_barrier(d) == 0);
        for (int k = 0; k < NACCEPTS; k++) {
            CHECK(net_deregmr(&n, sc[k], mh[k]) == 0);
            CHECK(net_close_send(&n, sc[k]) == 0);
        }
        free(buf);
    }
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ case: traffic class
 * net_ib (connect.cc): the sender's QPs take NCCL_IB_TC when set, else the communicator's
 * traffic class; the sender sends it in its connection metadata and the receiver's QPs (which
 * carry the clear-to-sends and the ACKs) take it too, unless NCCL_IB_FIFO_TC is set there.
 * RoCE only (GID mode): iWARP has no traffic class. The QPs log their settings (TRACE). */
static int tc_case(struct duo *d, void *arg) {
    struct run *r = arg;
    int role = d->is_child; /* 0 receives, 1 sends with the communicator's traffic class 106 */
    for (int step = 0; step < 2; step++) {
        struct netapi n;
        void *lc = NULL, *comm = NULL;
        char handle[NCCL_NET_HANDLE_MAXSIZE];
        if (role == 0 && step == 1) setenv("NCCL_IB_FIFO_TC", "12", 1);
        CHECK(net_open_tc(&n, r->cfg.version, r->cfg.dev, role ? 106 : -1) == 0);
        log_reset();
        if (role == 0) {
            CHECK(net_listen(&n, handle, &lc) == 0);
            CHECK(duo_send(d, handle, sizeof(handle)) == 0);
            CHECK(net_accept(&n, lc, &comm, TMO) == 0);
            const char *want = step == 0 ? "tc 106, sl 0" : "tc 12, sl 0";
            if (!log_contains(want))
                fprintf(stderr, "receiver: no \"%s\" in:\n%s", want, log_text());
            CHECK(log_contains(want));
            CHECK(!log_contains(step == 0 ? "tc 0," : "tc 106,"));
            CHECK(duo_barrier(d) == 0);
            CHECK(net_close_recv(&n, comm) == 0);
            CHECK(net_close_listen(&n, lc) == 0);
            unsetenv("NCCL_IB_FIFO_TC");
        } else {
            CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
            CHECK(net_connect(&n, handle, &comm, TMO) == 0);
            CHECK(log_contains("tc 106, sl 0"));
            CHECK(duo_barrier(d) == 0);
            CHECK(net_close_send(&n, comm) == 0);
        }
        net_close(&n);
    }
    return 0;
}

/* ------------------------------------------------------------ cmocka glue */
struct scenario {
    const char *name;
    duo_fn fn;
    const char *net_ib; /* the behaviour it holds us to, printed with the case */
    int slots;          /* xchg blocks it needs */
    bool roce_only;     /* registered for rxe0 only: the behaviour does not exist on iWARP */
};

static const struct scenario scenarios[] = {
    {"spin_isend_without_test", spin_case,
     "a posted receive reaches the sender with no further call (irecv posts the CTS)", 1, false},
    {"sends_tested_late", late_case,
     "each send completes once however late it is tested; one whose FIFO slot still waits for "
     "an earlier send's completion returns NULL (try again)",
     1, false},
    {"send_larger_than_receive", trunc_case,
     "isend truncates to the receive's size; both tests report the bytes that landed", 1, false},
    {"out_of_order_tags", ooo_case,
     "isend of a tag the head receive does not hold returns NULL (try again), not an error", 1,
     false},
    /* On siw0 this case found siw's bad mmap key: a create failing with no errno now and
     * then once enough queues were mapped (device.c, docs/failures.md). */
    {"threads_own_comms", threads_case,
     "comms are independent: 4+ threads open, use and close their own at once", THREAD_CYCLES,
     false},
    {"close_with_requests_in_flight", inflight_case,
     "deregMr/closeSend/closeRecv succeed with requests outstanding; the plugin works after", 1,
     false},
    /* On siw0 this case found a stall: accept waited for a warm-up SEND siw had not
     * delivered, said again only from isend while this sender was still connecting its other
     * comms. The sender's connect now waits for the receiver's confirmation (docs/failures.md). */
    {"one_listen_many_accepts", accepts_case,
     "one listen comm accepts any number of connections, each kept apart", 1, false},
    {"traffic_class_both_ends", tc_case,
     "the communicator's traffic class reaches both ends' QPs; NCCL_IB_FIFO_TC the receiver's", 1,
     true},
};

struct test_case {
    const struct scenario *sc;
    struct cfg cfg;
    char name[96];
};

static void run_case(void **state) {
    struct test_case *tc = *state;
    assert_true(in_rdma_vm());
    printf("[ net_ib ] %s: %s\n", tc->name, tc->sc->net_ib);
    fflush(stdout);
    size_t len = (size_t)tc->sc->slots * sizeof(struct xchg);
    struct xchg *x = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(x != MAP_FAILED);
    struct run r = {.cfg = tc->cfg, .x = x};
    int rc = duo_run(tc->sc->fn, tc->sc->fn, &r, 600);
    munmap(x, len);
    assert_int_equal(rc, 0);
}

int main(void) {
    const char *devs = getenv("ITEST_DEVICES") ? getenv("ITEST_DEVICES") : "rxe0,siw0";
    const char *only = getenv("ITEST_ONLY");
    static const int versions[] = {11, 12};
    size_t nsc = sizeof(scenarios) / sizeof(scenarios[0]);
    struct test_case *cases = calloc(16 * nsc, sizeof(*cases));
    struct CMUnitTest *tests = calloc(16 * nsc, sizeof(*tests));
    int n = 0;
    char list[128];
    snprintf(list, sizeof(list), "%s", devs);
    for (char *save, *dev = strtok_r(list, ",", &save); dev && n < 14 * (int)nsc;
         dev = strtok_r(NULL, ",", &save)) {
        for (size_t v = 0; v < 2; v++) {
            for (size_t s = 0; s < nsc; s++) {
                if (scenarios[s].roce_only && strcmp(dev, "rxe0")) continue;
                struct test_case *tc = &cases[n];
                tc->sc = &scenarios[s];
                snprintf(tc->cfg.dev, sizeof(tc->cfg.dev), "%s", dev);
                snprintf(tc->cfg.other, sizeof(tc->cfg.other), "%s",
                         strcmp(dev, "rxe0") ? "rxe0" : "siw0");
                tc->cfg.version = versions[v];
                snprintf(tc->name, sizeof(tc->name), "%s/v%d/%s", dev, versions[v],
                         scenarios[s].name);
                if (only && !strstr(tc->name, only)) continue;
                tests[n] = (struct CMUnitTest){
                    .name = tc->name, .test_func = run_case, .initial_state = tc};
                n++;
            }
        }
    }
    if (n == 0) {
        fprintf(stderr, "no case matches ITEST_ONLY=%s\n", only ? only : "");
        return 1;
    }
    return _cmocka_run_group_tests("integration: net_ib conformance", tests, (size_t)n, NULL, NULL);
}
