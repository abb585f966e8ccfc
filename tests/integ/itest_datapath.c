/*
 * Integration: the data path between two processes through dlopen, on every
 * VM device (ITEST_DEVICES, default "rxe0,siw0") and API version (v8, v12).
 * Every byte is checked, and so are the bytes just past each message.
 * ITEST_ONLY=<substring> runs only the cases whose name contains it.
 */
#include "netapi.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#define TMO    120
#define CANARY 0xEE
#define SLACK  64

struct cfg {
    char dev[16];
    int version;
    const char *env; /* "NAME=VALUE;NAME=VALUE" applied before the scenario */
};

static void *page_alloc(size_t len) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1)) return NULL;
    return p;
}

/* ------------------------------------------------------------ connection helpers */
struct side {
    struct netapi n;
    void *lc, *comm;
};

static int recv_side_open(struct duo *d, const struct cfg *c, struct side *s) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&s->n, c->version, c->dev) == 0);
    CHECK(net_listen(&s->n, handle, &s->lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&s->n, s->lc, &s->comm, TMO) == 0);
    return 0;
}

static int send_side_open(struct duo *d, const struct cfg *c, struct side *s) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&s->n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&s->n, handle, &s->comm, TMO) == 0);
    return 0;
}

static int recv_side_close(struct side *s) {
    CHECK(net_close_recv(&s->n, s->comm) == 0);
    CHECK(net_close_listen(&s->n, s->lc) == 0);
    net_close(&s->n);
    return 0;
}

static int send_side_close(struct side *s) {
    CHECK(net_close_send(&s->n, s->comm) == 0);
    net_close(&s->n);
    return 0;
}

/* ------------------------------------------------------------ scenario: sizes */
static const size_t sizes_list[] = {
    0, 1, 7, 4095, 4096, 4097, 65536 + 3, 1 << 20, (8 << 20) + 5, 16 << 20, (64 << 20)};
#define NSIZES (sizeof(sizes_list) / sizeof(sizes_list[0]))
#define MAXSZ  (64u << 20)

static int sizes_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(MAXSZ + SLACK);
    CHECK(buf);
    CHECK(net_regmr(&s.n, s.comm, buf, MAXSZ + SLACK, &mh) == 0);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t sz = sizes_list[i];
        /* odd rounds post exactly the size, even rounds a larger buffer */
        size_t post = (i % 2) ? sz : sz + SLACK;
        memset(buf, CANARY, sz + SLACK);
        void *req, *data = buf;
        int tag = 1, got = -1;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &post, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got, TMO) == 0);
        if (got != (int)sz) fprintf(stderr, "size %zu: test reported %d\n", sz, got);
        CHECK(got == (int)sz);
        long bad = pattern_check(buf, sz, (uint32_t)sz);
        if (bad >= 0) fprintf(stderr, "size %zu: first wrong byte at %ld\n", sz, bad);
        CHECK(bad < 0);
        for (size_t k = sz; k < sz + SLACK; k++)
            CHECK(buf[k] == CANARY);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return recv_side_close(&s);
}

static int sizes_send(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(MAXSZ);
    CHECK(buf);
    CHECK(net_regmr(&s.n, s.comm, buf, MAXSZ, &mh) == 0);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t sz = sizes_list[i];
        pattern_fill(buf, sz, (uint32_t)sz);
        void *req;
        int done_size = -1;
        CHECK(net_isend(&s.n, s.comm, buf, sz, 1, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &done_size, TMO) == 0);
        CHECK(done_size == (int)sz);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: multi-receive with tags */
static const size_t multi_sizes[4] = {1000, 5000, 0, 70001};
static const size_t multi_sent[4] = {999, 5000, 0, 3};
static const int multi_tags[4] = {7, 3, 9, 5};

static int multi_recv(struct duo *d, void *arg) {
    struct side s;
    CHECK(recv_side_open(d, arg, &s) == 0);
    for (int round = 0; round < 3; round++) {
        void *data[4], *mh[4], *req;
        size_t sz[4];
        int tags[4], got[4];
        for (int i = 0; i < 4; i++) {
            sz[i] = multi_sizes[i];
            tags[i] = multi_tags[i];
            data[i] = page_alloc(sz[i] + SLACK);
            memset(data[i], CANARY, sz[i] + SLACK);
            CHECK(net_regmr(&s.n, s.comm, data[i], sz[i] + SLACK, &mh[i]) == 0);
        }
        CHECK(net_irecv(&s.n, s.comm, 4, data, sz, tags, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, got, TMO) == 0);
        for (int i = 0; i < 4; i++) {
            CHECK(got[i] == (int)multi_sent[i]);
            CHECK(pattern_check(data[i], multi_sent[i], (uint32_t)(tags[i] + round)) < 0);
            for (size_t k = multi_sent[i]; k < sz[i] + SLACK; k++)
                CHECK(((uint8_t *)data[i])[k] == CANARY);
            CHECK(net_deregmr(&s.n, s.comm, mh[i]) == 0);
            free(data[i]);
        }
    }
    return recv_side_close(&s);
}

static int multi_send(struct duo *d, void *arg) {
    struct side s;
    CHECK(send_side_open(d, arg, &s) == 0);
    static const int order[4] = {2, 3, 0, 1}; /* tags 9, 5, 7, 3: not the receive order */
    for (int round = 0; round < 3; round++) {
        void *data[4], *mh[4], *req[4];
        for (int j = 0; j < 4; j++) {
            int i = order[j];
            data[i] = page_alloc(multi_sent[i]);
            pattern_fill(data[i], multi_sent[i], (uint32_t)(multi_tags[i] + round));
            CHECK(net_regmr(&s.n, s.comm, data[i], multi_sent[i], &mh[i]) == 0);
            CHECK(net_isend(&s.n, s.comm, data[i], multi_sent[i], multi_tags[i], mh[i], &req[i],
                            TMO) == 0);
        }
        for (int i = 0; i < 4; i++) {
            int got;
            CHECK(net_wait(&s.n, req[i], &got, TMO) == 0);
            CHECK(got == (int)multi_sent[i]);
            CHECK(net_deregmr(&s.n, s.comm, mh[i]) == 0);
            free(data[i]);
        }
    }
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: multi-receives in flight
 * Many receives of 1..4 buffers posted at once, over the FIFO's wrap: clear-to-sends that
 * wait go out together, every buffer row of the batch with them. */
#define PIPE_RECVS     20
#define PIPE_ROUNDS    3
#define PIPE_BUFS(k)   (1 + (k) % 4)
#define PIPE_SZ(k, i)  (size_t)(97 * ((k) + 1) + 13 * (i))
#define PIPE_TAG(k, i) ((k)*10 + (i))

static int pipe_recv(struct duo *d, void *arg) {
    struct side s;
    CHECK(recv_side_open(d, arg, &s) == 0);
    size_t stride = PIPE_SZ(PIPE_RECVS, 4) + SLACK;
    uint8_t *buf = page_alloc(PIPE_RECVS * 4 * stride);
    void *mh;
    CHECK(net_regmr(&s.n, s.comm, buf, PIPE_RECVS * 4 * stride, &mh) == 0);
    for (int round = 0; round < PIPE_ROUNDS; round++) {
        void *req[PIPE_RECVS];
        memset(buf, CANARY, PIPE_RECVS * 4 * stride);
        for (int k = 0; k < PIPE_RECVS; k++) {
            void *data[4], *mhs[4] = {mh, mh, mh, mh};
            size_t sz[4];
            int tags[4];
            for (int i = 0; i < PIPE_BUFS(k); i++) {
                data[i] = buf + (size_t)(k * 4 + i) * stride;
                sz[i] = PIPE_SZ(k, i) + SLACK / 2; /* larger than what is sent */
                tags[i] = PIPE_TAG(k, i);
            }
            CHECK(net_irecv(&s.n, s.comm, PIPE_BUFS(k), data, sz, tags, mhs, &req[k], TMO) == 0);
        }
        for (int k = PIPE_RECVS - 1; k >= 0; k--) {
            int got[4];
            CHECK(net_wait(&s.n, req[k], got, TMO) == 0);
            for (int i = 0; i < PIPE_BUFS(k); i++) {
                uint8_t *b = buf + (size_t)(k * 4 + i) * stride;
                CHECK(got[i] == (int)PIPE_SZ(k, i));
                CHECK(pattern_check(b, PIPE_SZ(k, i), (uint32_t)(PIPE_TAG(k, i) + round)) < 0);
                for (size_t x = PIPE_SZ(k, i); x < stride; x++)
                    CHECK(b[x] == CANARY);
            }
        }
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return recv_side_close(&s);
}

static int pipe_send(struct duo *d, void *arg) {
    struct side s;
    CHECK(send_side_open(d, arg, &s) == 0);
    size_t stride = PIPE_SZ(PIPE_RECVS, 4);
    uint8_t *buf = page_alloc(PIPE_RECVS * 4 * stride);
    void *mh;
    CHECK(net_regmr(&s.n, s.comm, buf, PIPE_RECVS * 4 * stride, &mh) == 0);
    for (int round = 0; round < PIPE_ROUNDS; round++) {
        void *req[PIPE_RECVS][4];
        for (int k = 0; k < PIPE_RECVS; k++) {
            for (int i = PIPE_BUFS(k) - 1; i >= 0; i--) { /* not the receive's tag order */
                uint8_t *b = buf + (size_t)(k * 4 + i) * stride;
                pattern_fill(b, PIPE_SZ(k, i), (uint32_t)(PIPE_TAG(k, i) + round));
                CHECK(net_isend(&s.n, s.comm, b, PIPE_SZ(k, i), PIPE_TAG(k, i), mh, &req[k][i],
                                TMO) == 0);
            }
        }
        for (int k = 0; k < PIPE_RECVS; k++)
            for (int i = 0; i < PIPE_BUFS(k); i++)
                CHECK(net_wait(&s.n, req[k][i], NULL, TMO) == 0);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: 32 in flight, out of order
 */
#define INFLIGHT    32
#define INFLIGHT_SZ 12345

static int inflight_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req[INFLIGHT];
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(INFLIGHT * INFLIGHT_SZ);
    memset(buf, CANARY, INFLIGHT * INFLIGHT_SZ);
    CHECK(net_regmr(&s.n, s.comm, buf, INFLIGHT * INFLIGHT_SZ, &mh) == 0);
    for (int i = 0; i < INFLIGHT; i++) {
        void *data = buf + i * INFLIGHT_SZ;
        size_t sz = INFLIGHT_SZ;
        int tag = 0;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh, &req[i], TMO) == 0);
    }
    for (int i = INFLIGHT - 1; i >= 0; i--) {
        int got;
        CHECK(net_wait(&s.n, req[i], &got, TMO) == 0);
        CHECK(got == INFLIGHT_SZ - i);
        CHECK(pattern_check(buf + i * INFLIGHT_SZ, (size_t)got, (uint32_t)i) < 0);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return recv_side_close(&s);
}

static int inflight_send(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req[INFLIGHT];
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(INFLIGHT * INFLIGHT_SZ);
    CHECK(net_regmr(&s.n, s.comm, buf, INFLIGHT * INFLIGHT_SZ, &mh) == 0);
    for (int i = 0; i < INFLIGHT; i++) {
        pattern_fill(buf + i * INFLIGHT_SZ, INFLIGHT_SZ - i, (uint32_t)i);
        CHECK(net_isend(&s.n, s.comm, buf + i * INFLIGHT_SZ, INFLIGHT_SZ - i, 0, mh, &req[i],
                        TMO) == 0);
    }
    for (int i = INFLIGHT - 1; i >= 0; i--)
        CHECK(net_wait(&s.n, req[i], NULL, TMO) == 0);
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: sender first */
static int sendfirst_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req;
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(4096);
    CHECK(net_regmr(&s.n, s.comm, buf, 4096, &mh) == 0);
    CHECK(duo_barrier(d) == 0); /* the sender has already tried */
    void *data = buf;
    size_t sz = 4096;
    int tag = 5, got;
    CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh, &req, TMO) == 0);
    CHECK(net_wait(&s.n, req, &got, TMO) == 0);
    CHECK(got == 100 && pattern_check(buf, 100, 77) < 0);
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return recv_side_close(&s);
}

static int sendfirst_send(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req = (void *)1;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(4096);
    pattern_fill(buf, 100, 77);
    CHECK(net_regmr(&s.n, s.comm, buf, 4096, &mh) == 0);
    /* no clear-to-send yet: success with a NULL request, as NCCL expects */
    int rc = ((struct netapi *)&s.n)->version == 12
                 ? s.n.p.v12->isend(s.comm, buf, 100, 5, mh, NULL, &req)
                 : s.n.p.v8->isend(s.comm, buf, 100, 5, mh, &req);
    CHECK(rc == 0 && req == NULL);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_isend(&s.n, s.comm, buf, 100, 5, mh, &req, TMO) == 0);
    CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: a late first receive
 * The receiver posts nothing for 2.5 s after accept: the sender's first isends come back
 * NULL, and no warm-up SEND (rdma_cm mode) said again while connect waited for its
 * confirmation may cost the receiver anything. */
#define LATE_MSGS 40

static int late_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(4096 + SLACK);
    CHECK(net_regmr(&s.n, s.comm, buf, 4096 + SLACK, &mh) == 0);
    usleep(2500 * 1000);
    for (int i = 0; i < LATE_MSGS; i++) {
        void *data = buf, *req;
        size_t sz = 4096;
        int tag = 0, got;
        memset(buf, CANARY, 4096 + SLACK);
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got, TMO) == 0);
        CHECK(got == 1 + 100 * i && pattern_check(buf, (size_t)got, (uint32_t)i) < 0);
        for (size_t k = (size_t)got; k < 4096 + SLACK; k++)
            CHECK(buf[k] == CANARY);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return recv_side_close(&s);
}

static int late_send(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(4096);
    CHECK(net_regmr(&s.n, s.comm, buf, 4096, &mh) == 0);
    for (int i = 0; i < LATE_MSGS; i++) {
        void *req;
        pattern_fill(buf, (size_t)(1 + 100 * i), (uint32_t)i);
        CHECK(net_isend(&s.n, s.comm, buf, (size_t)(1 + 100 * i), 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: several comms at once */
#define NCOMMS 3
static int multicomm_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc[NCOMMS], *rc[NCOMMS], *mh[NCOMMS], *req[NCOMMS];
    uint8_t *buf[NCOMMS];
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i < NCOMMS; i++) {
        CHECK(net_listen(&n, handle, &lc[i]) == 0);
        CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    }
    /* NCCL progresses many accepts at once: poll them all, never block on one */
    int pending = NCOMMS;
    memset(rc, 0, sizeof(rc));
    for (int spins = 0; pending > 0; spins++) {
        CHECK(spins < 10000000);
        for (int i = NCOMMS - 1; i >= 0; i--) {
            if (rc[i]) continue;
            ncclNetDeviceHandle_t *dh = NULL;
            int r = c->version == 12 ? n.p.v12->accept(lc[i], &rc[i], &dh)
                                     : n.p.v8->accept(lc[i], &rc[i], &dh);
            CHECK(r == 0);
            if (rc[i]) pending--;
        }
    }
    for (int i = 0; i < NCOMMS; i++) {
        buf[i] = page_alloc(300000);
        CHECK(net_regmr(&n, rc[i], buf[i], 300000, &mh[i]) == 0);
    }
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < NCOMMS; i++) {
            void *data = buf[i];
            size_t sz = 300000;
            int tag = i;
            CHECK(net_irecv(&n, rc[i], 1, &data, &sz, &tag, &mh[i], &req[i], TMO) == 0);
        }
        for (int i = 0; i < NCOMMS; i++) {
            int got;
            CHECK(net_wait(&n, req[i], &got, TMO) == 0);
            CHECK(got == 100000 * (i + 1) &&
                  pattern_check(buf[i], (size_t)got, (uint32_t)(i * 10 + round)) < 0);
        }
    }
    for (int i = 0; i < NCOMMS; i++) {
        CHECK(net_deregmr(&n, rc[i], mh[i]) == 0);
        CHECK(net_close_recv(&n, rc[i]) == 0);
        CHECK(net_close_listen(&n, lc[i]) == 0);
        free(buf[i]);
    }
    net_close(&n);
    return 0;
}

static int multicomm_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *sc[NCOMMS], *mh[NCOMMS], *req[NCOMMS];
    uint8_t *buf[NCOMMS];
    char handle[NCOMMS][NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i < NCOMMS; i++)
        CHECK(duo_recv(d, handle[i], NCCL_NET_HANDLE_MAXSIZE) == 0);
    int pending = NCOMMS;
    memset(sc, 0, sizeof(sc));
    for (int spins = 0; pending > 0; spins++) {
        CHECK(spins < 10000000);
        for (int i = 0; i < NCOMMS; i++) {
            if (sc[i]) continue;
            ncclNetDeviceHandle_t *dh = NULL;
            int r = c->version == 12 ? n.p.v12->connect(n.ctx, n.dev, handle[i], &sc[i], &dh)
                                     : n.p.v8->connect(n.dev, handle[i], &sc[i], &dh);
            CHECK(r == 0);
            if (sc[i]) pending--;
        }
    }
    for (int i = 0; i < NCOMMS; i++) {
        buf[i] = page_alloc(300000);
        CHECK(net_regmr(&n, sc[i], buf[i], 300000, &mh[i]) == 0);
    }
    for (int round = 0; round < 4; round++) {
        for (int i = NCOMMS - 1; i >= 0; i--) {
            pattern_fill(buf[i], 100000 * (size_t)(i + 1), (uint32_t)(i * 10 + round));
            CHECK(net_isend(&n, sc[i], buf[i], 100000 * (size_t)(i + 1), i, mh[i], &req[i], TMO) ==
                  0);
        }
        for (int i = 0; i < NCOMMS; i++)
            CHECK(net_wait(&n, req[i], NULL, TMO) == 0);
    }
    for (int i = 0; i < NCOMMS; i++) {
        CHECK(net_deregmr(&n, sc[i], mh[i]) == 0);
        CHECK(net_close_send(&n, sc[i]) == 0);
        free(buf[i]);
    }
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ scenario: flush */
static int flush_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req, *freq = NULL;
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(65536);
    CHECK(net_regmr(&s.n, s.comm, buf, 65536, &mh) == 0);
    for (int round = 0; round < 40; round++) {
        void *data = buf;
        size_t sz = 65536;
        int tag = 0, got;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got, TMO) == 0);
        CHECK(pattern_check(buf, (size_t)got, (uint32_t)round) < 0);
        CHECK(net_iflush(&s.n, s.comm, 1, &data, &got, &mh, &freq) == 0);
        /* NCCL_ERDMA_FORCE_FLUSH=1: a real RDMA read must be issued and complete */
        CHECK(freq != NULL);
        CHECK(net_wait(&s.n, freq, NULL, TMO) == 0);
    }
    /* more flushes in flight than the API allows: a usage error (not a system error, not a
     * NULL request NCCL would read as done), and the comm still flushes afterwards */
    void *many[4 * NCCL_NET_MAX_REQUESTS];
    int nf = 0, frc = 0, one = 1;
    void *data = buf;
    while (nf < 4 * NCCL_NET_MAX_REQUESTS) {
        frc = net_iflush(&s.n, s.comm, 1, &data, &one, &mh, &many[nf]);
        if (frc) break;
        CHECK(many[nf] != NULL);
        nf++;
    }
    CHECK(frc == ncclInvalidUsage);
    CHECK(nf >= NCCL_NET_MAX_REQUESTS);
    for (int i = 0; i < nf; i++)
        CHECK(net_wait(&s.n, many[i], NULL, TMO) == 0);
    CHECK(net_iflush(&s.n, s.comm, 1, &data, &one, &mh, &freq) == 0 && freq);
    CHECK(net_wait(&s.n, freq, NULL, TMO) == 0);
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    /* flushes after the sender's close: flush_after_sender_closed */
    CHECK(duo_barrier(d) == 0);
    return recv_side_close(&s);
}

static int flush_send(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(65536);
    CHECK(net_regmr(&s.n, s.comm, buf, 65536, &mh) == 0);
    for (int round = 0; round < 40; round++) {
        pattern_fill(buf, 1000 + (size_t)round * 100, (uint32_t)round);
        CHECK(net_isend(&s.n, s.comm, buf, 1000 + (size_t)round * 100, 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    CHECK(duo_barrier(d) == 0);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ scenario: flush after the
 * sender closed. NCCL's sender finishes (and may destroy its communicator) once its sends
 * complete, while the receiver still flushes what landed. A flush reads our own memory over
 * the loopback QP and needs nothing from the peer: on iWARP the peer's close disconnects our
 * QPs and flushes the idle receive ring, and that must not fail these flushes. */
#define CLOSED_MSGS 4
static int closed_flush_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh[CLOSED_MSGS], *req, *freq[CLOSED_MSGS];
    uint8_t *buf[CLOSED_MSGS];
    int got[CLOSED_MSGS];
    CHECK(recv_side_open(d, arg, &s) == 0);
    for (int i = 0; i < CLOSED_MSGS; i++) {
        buf[i] = page_alloc(65536);
        CHECK(net_regmr(&s.n, s.comm, buf[i], 65536, &mh[i]) == 0);
        void *data = buf[i];
        size_t sz = 65536;
        int tag = 0;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh[i], &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got[i], TMO) == 0);
        CHECK(pattern_check(buf[i], (size_t)got[i], (uint32_t)i) < 0);
    }
    CHECK(duo_barrier(d) == 0); /* the sender has closed and finalized */
    usleep(300 * 1000);         /* its disconnect has reached our QPs by now */
    for (int i = 0; i < CLOSED_MSGS; i++) {
        void *data = buf[i];
        CHECK(net_iflush(&s.n, s.comm, 1, &data, &got[i], &mh[i], &freq[i]) == 0);
        CHECK(freq[i] != NULL); /* NCCL_ERDMA_FORCE_FLUSH=1: a real read */
    }
    for (int i = 0; i < CLOSED_MSGS; i++)
        CHECK(net_wait(&s.n, freq[i], NULL, TMO) == 0);
    /* a receive that needs the gone peer fails (no hang) */
    void *data = buf[0];
    size_t sz = 65536;
    int tag = 0, done = 0;
    int rc = net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh[0], &req, TMO);
    for (int polls = 0; rc == ncclSuccess && !done && polls < 100000000; polls++)
        rc = net_test(&s.n, req, &done, NULL); /* not net_wait: its timeout is an error too */
    CHECK(rc != ncclSuccess && !done);
    for (int i = 0; i < CLOSED_MSGS; i++) {
        CHECK(net_deregmr(&s.n, s.comm, mh[i]) == 0);
        free(buf[i]);
    }
    return recv_side_close(&s);
}

static int closed_flush_send(struct duo *d, void *arg) {
    struct side s;
    void *mh, *req;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf = page_alloc(65536);
    CHECK(net_regmr(&s.n, s.comm, buf, 65536, &mh) == 0);
    for (int i = 0; i < CLOSED_MSGS; i++) {
        pattern_fill(buf, 5000 + (size_t)i, (uint32_t)i);
        CHECK(net_isend(&s.n, s.comm, buf, 5000 + (size_t)i, 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    }
    CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
    free(buf);
    CHECK(send_side_close(&s) == 0);
    return duo_barrier(d);
}

/* ------------------------------------------------------------ scenario: second round after
 * finalize */
static int rounds_recv(struct duo *d, void *arg) {
    for (int r = 0; r < 2; r++) {
        struct side s;
        void *mh, *req;
        CHECK(recv_side_open(d, arg, &s) == 0);
        uint8_t *buf = page_alloc(100000);
        CHECK(net_regmr(&s.n, s.comm, buf, 100000, &mh) == 0);
        void *data = buf;
        size_t sz = 100000;
        int tag = 0, got;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &sz, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got, TMO) == 0);
        CHECK(got == 99999 && pattern_check(buf, 99999, (uint32_t)r + 100) < 0);
        CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
        free(buf);
        CHECK(recv_side_close(&s) == 0);
    }
    return 0;
}

static int rounds_send(struct duo *d, void *arg) {
    for (int r = 0; r < 2; r++) {
        struct side s;
        void *mh, *req;
        CHECK(send_side_open(d, arg, &s) == 0);
        uint8_t *buf = page_alloc(100000);
        pattern_fill(buf, 99999, (uint32_t)r + 100);
        CHECK(net_regmr(&s.n, s.comm, buf, 100000, &mh) == 0);
        CHECK(net_isend(&s.n, s.comm, buf, 99999, 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
        CHECK(net_deregmr(&s.n, s.comm, mh) == 0);
        free(buf);
        CHECK(send_side_close(&s) == 0);
    }
    return 0;
}

/* ------------------------------------------------------------ scenario: GPU memory. A GPU
 * buffer is the NIC's to read and write, never the CPU's. Registered as NCCL_PTR_CUDA
 * (NCCL_ERDMA_GDR=1 stands in for peer memory), host pages with no access at all
 * (PROT_NONE) behave as one does: the device reaches them through the pages the
 * registration pinned, and any CPU copy of the payload (an inline send) faults. The small
 * sizes, those NCCL's LL protocol moves, are the ones that would go inline.
 * RoCE devices only: siw's kernel itself copies a small payload from user space
 * (copy_from_user) when the post's system call runs the send, which no-access pages fail;
 * a NIC does not. */
static const size_t gpu_sizes[] = {1, 8, 64, 96, 97, 4096, 60000};
#define NGPU      (sizeof(gpu_sizes) / sizeof(gpu_sizes[0]))
#define GPU_SLOT  65536
#define GPU_BYTES (NGPU * GPU_SLOT)

/* Maps the buffer, lets fill() write it while the CPU still may, registers it as GPU memory
 * and takes every CPU access away. */
static int gpu_like_open(struct side *s, uint8_t **buf, void **mh, void (*fill)(uint8_t *buf)) {
    void *p = mmap(NULL, GPU_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    *buf = p;
    fill(p);
    CHECK(net_regmr_type(&s->n, s->comm, p, GPU_BYTES, NCCL_PTR_CUDA, mh) == 0);
    CHECK(mprotect(p, GPU_BYTES, PROT_NONE) == 0);
    return 0;
}

static int gpu_like_close(struct side *s, uint8_t *buf, void *mh) {
    CHECK(net_deregmr(&s->n, s->comm, mh) == 0);
    munmap(buf, GPU_BYTES);
    return 0;
}

static void gpu_canaries(uint8_t *buf) {
    memset(buf, CANARY, GPU_BYTES);
}

static void gpu_patterns(uint8_t *buf) {
    for (size_t i = 0; i < NGPU; i++)
        pattern_fill(buf + i * GPU_SLOT, gpu_sizes[i], (uint32_t)i);
}

static int gpu_recv(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(recv_side_open(d, arg, &s) == 0);
    uint8_t *buf;
    CHECK(gpu_like_open(&s, &buf, &mh, gpu_canaries) == 0);
    for (size_t i = 0; i < NGPU; i++) {
        void *req, *freq = NULL, *data = buf + i * GPU_SLOT;
        size_t post = GPU_SLOT;
        int tag = (int)i, got = -1;
        CHECK(net_irecv(&s.n, s.comm, 1, &data, &post, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&s.n, req, &got, TMO) == 0);
        CHECK(got == (int)gpu_sizes[i]);
        /* NCCL flushes what lands in GPU memory: an RDMA read, by the NIC too */
        CHECK(net_iflush(&s.n, s.comm, 1, &data, &got, &mh, &freq) == 0);
        if (freq) CHECK(net_wait(&s.n, freq, NULL, TMO) == 0);
    }
    CHECK(mprotect(buf, GPU_BYTES, PROT_READ | PROT_WRITE) == 0);
    for (size_t i = 0; i < NGPU; i++) {
        long bad = pattern_check(buf + i * GPU_SLOT, gpu_sizes[i], (uint32_t)i);
        if (bad >= 0) fprintf(stderr, "size %zu: first wrong byte at %ld\n", gpu_sizes[i], bad);
        CHECK(bad < 0);
        CHECK(buf[i * GPU_SLOT + gpu_sizes[i]] == CANARY);
    }
    CHECK(gpu_like_close(&s, buf, mh) == 0);
    return recv_side_close(&s);
}

static int gpu_send(struct duo *d, void *arg) {
    struct side s;
    void *mh;
    CHECK(send_side_open(d, arg, &s) == 0);
    uint8_t *buf;
    CHECK(gpu_like_open(&s, &buf, &mh, gpu_patterns) == 0);
    for (size_t i = 0; i < NGPU; i++) {
        void *req;
        int done_size = -1;
        CHECK(net_isend(&s.n, s.comm, buf + i * GPU_SLOT, gpu_sizes[i], (int)i, mh, &req, TMO) ==
              0);
        CHECK(net_wait(&s.n, req, &done_size, TMO) == 0);
        CHECK(done_size == (int)gpu_sizes[i]);
    }
    CHECK(mprotect(buf, GPU_BYTES, PROT_READ | PROT_WRITE) == 0);
    CHECK(gpu_like_close(&s, buf, mh) == 0);
    return send_side_close(&s);
}

/* ------------------------------------------------------------ cmocka glue */
struct scenario {
    const char *name;
    duo_fn recv, send;
    const char *env;
    bool roce_only; /* not generated for siw devices (the scenario says why) */
};

static const struct scenario scenarios[] = {
    {"sizes", sizes_recv, sizes_send, NULL, false},
    {"multirecv_tags", multi_recv, multi_send, NULL, false},
    {"inflight32_out_of_order", inflight_recv, inflight_send, NULL, false},
    {"multirecv_pipelined", pipe_recv, pipe_send, NULL, false},
    {"sender_first", sendfirst_recv, sendfirst_send, NULL, false},
    {"late_first_receive", late_recv, late_send, NULL, false},
    {"several_comms", multicomm_recv, multicomm_send, NULL, false},
    {"close_and_reconnect", rounds_recv, rounds_send, NULL, false},
    {"forced_flush", flush_recv, flush_send, "NCCL_ERDMA_FORCE_FLUSH=1", false},
    {"gpu_memory_cpu_unreadable", gpu_recv, gpu_send, "NCCL_ERDMA_GDR=1", true},
    {"flush_after_sender_closed", closed_flush_recv, closed_flush_send, "NCCL_ERDMA_FORCE_FLUSH=1",
     false},
    {"sizes_4qps_roundrobin", sizes_recv, sizes_send, "NCCL_IB_QPS_PER_CONNECTION=4", false},
    {"sizes_4qps_split", sizes_recv, sizes_send,
     "NCCL_IB_QPS_PER_CONNECTION=4;NCCL_IB_SPLIT_DATA_ON_QPS=1", false},
    {"multirecv_3qps_split", multi_recv, multi_send,
     "NCCL_IB_QPS_PER_CONNECTION=3;NCCL_IB_SPLIT_DATA_ON_QPS=1", false},
    /* clear-to-sends one write each (net_ib's way), and batches of up to 16 */
    {"sizes_cts_unbatched", sizes_recv, sizes_send, "NCCL_ERDMA_CTS_BATCH=1", false},
    {"multirecv_pipelined_batch16", pipe_recv, pipe_send, "NCCL_ERDMA_CTS_BATCH=16", false},
    {"multirecv_pipelined_3qps", pipe_recv, pipe_send, "NCCL_IB_QPS_PER_CONNECTION=3", false},
    /* The out-of-band TCP on another interface than the device's (NCCL_SOCKET_IFNAME): rdma_cm
     * requests still go to the device's address (siw0 is on eth1, rxe0 on eth0) */
    {"sizes_oob_on_eth0", sizes_recv, sizes_send, "NCCL_SOCKET_IFNAME=eth0", false},
    {"sizes_rdmacm_oob_on_eth1", sizes_recv, sizes_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_SOCKET_IFNAME=eth1", false},
    /* rdma_cm on a RoCE device: warm-ups with write-with-imm completions */
    {"late_first_receive_rdmacm_3qps", late_recv, late_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_IB_QPS_PER_CONNECTION=3", false},
};

struct test_case {
    const struct scenario *sc;
    struct cfg cfg;
    char name[96];
};

static void run_case(void **state) {
    struct test_case *tc = *state;
    assert_true(in_rdma_vm());
    env_apply(tc->sc->env, true);
    int rc = duo_run(tc->sc->recv, tc->sc->send, &tc->cfg, 600);
    env_apply(tc->sc->env, false);
    assert_int_equal(rc, 0);
}

int main(void) {
    const char *devs = getenv("ITEST_DEVICES") ? getenv("ITEST_DEVICES") : "rxe0,siw0";
    const char *only = getenv("ITEST_ONLY"); /* runs only the cases whose name contains it */
    static const int versions[] = {8, 12};
    size_t nsc = sizeof(scenarios) / sizeof(scenarios[0]);
    struct test_case *cases = calloc(64 * nsc, sizeof(*cases));
    struct CMUnitTest *tests = calloc(64 * nsc, sizeof(*tests));
    int n = 0;
    char list[128];
    snprintf(list, sizeof(list), "%s", devs);
    for (char *save, *dev = strtok_r(list, ",", &save); dev; dev = strtok_r(NULL, ",", &save)) {
        for (size_t v = 0; v < 2; v++) {
            for (size_t s = 0; s < nsc; s++) {
                /* the option matrix runs on v12 only; v8 covers the base scenarios */
                if (versions[v] == 8 && scenarios[s].env) continue;
                if (scenarios[s].roce_only && !strncmp(dev, "siw", 3)) continue;
                struct test_case *tc = &cases[n];
                tc->sc = &scenarios[s];
                snprintf(tc->cfg.dev, sizeof(tc->cfg.dev), "%s", dev);
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
    if (n == 0) { /* cmocka passes an empty group: a filter that matches nothing must not */
        fprintf(stderr, "no case matches ITEST_ONLY=%s\n", only ? only : "");
        return 1;
    }
    return _cmocka_run_group_tests("integration: data path", tests, (size_t)n, NULL, NULL);
}
