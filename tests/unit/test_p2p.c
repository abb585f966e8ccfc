/*
 * The data path (p2p.c) and connection setup (conn.c, oob.c) over the fake verbs
 * provider (fake_verbs.h): both ends in this process, the out-of-band TCP on
 * 127.0.0.1. The peer misbehaves by writing into the memory it owns in our
 * process (the sender's clear-to-send FIFO, the receiver's record area and ring)
 * and by completing our receives with immediates of its choosing.
 */
#define _GNU_SOURCE
#include "async.h"
#include "comm.h"
#include "conn.h"
#include "device.h"
#include "fake_verbs.h"
#include "params.h"
#include "mr_cache.h"
#include "net.h"
#include "unit_log.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

/* test() calls after which a request that neither ends nor fails counts as hung */
#define POLL_LIMIT 20000

struct pair {
    struct send_comm *sc;
    struct recv_comm *rc;
};

/* One fake device, the environment given (NULL-terminated, or NULL). */
static int start_one(const char *const *env) {
    unit_log_start();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    return 0;
}

static int setup_one(void **state) {
    return start_one(NULL);
}

static int teardown_env(void **state) {
    int leaked = fake_env_stop();
    erdma_log_set(NULL);
    assert_int_equal(leaked, 0);
    return 0;
}

static void connect_pair(struct pair *p, int send_dev, int recv_dev) {
    void *s, *r;
    int rc = fake_pair_connect(send_dev, recv_dev, &s, &r);
    if (rc) unit_log_print();
    assert_int_equal(rc, 0);
    p->sc = s;
    p->rc = r;
}

static void close_pair(struct pair *p) {
    assert_int_equal(erdma_close_send(p->sc), 0);
    assert_int_equal(erdma_close_recv(p->rc), 0);
}

static void *reg(void *comm, void *buf, size_t len) {
    void *mh = NULL;
    assert_int_equal(erdma_reg_mr(comm, buf, len, NCCL_PTR_HOST, &mh), 0);
    return mh;
}

/* Calls isend until the receiver's clear-to-send lets the message start (a NULL request is
 * "not yet", as in net_ib): its request. */
static void *send_started(void *sc, void *buf, size_t len, int tag, void *mh) {
    void *req = NULL;
    for (int i = 0; i < POLL_LIMIT && !req; i++)
        assert_int_equal(erdma_isend(sc, buf, len, tag, mh, NULL, &req), 0);
    assert_non_null(req);
    return req;
}

/* Calls isend with each post refused with err (armed again each call: a call that posts
 * nothing leaves it) until the send fails or starts: isend's return; *req its request. */
static int send_refused(void *sc, void *buf, size_t len, int tag, void *mh, int err, void **req) {
    int ret = 0;
    *req = NULL;
    for (int i = 0; i < POLL_LIMIT && !*req && !ret; i++) {
        fake_fail_next_post(err);
        ret = erdma_isend(sc, buf, len, tag, mh, NULL, req);
    }
    fake_fail_next_post(0);
    return ret;
}

/* Tests a request until it is done or fails: 1 done, -errno failed, 0 still pending. */
static int wait_req(void *req, int *sizes) {
    for (int i = 0; i < POLL_LIMIT; i++) {
        int done = 0;
        int rc = erdma_test(req, &done, sizes);
        if (rc) return rc;
        if (done) return 1;
    }
    return 0;
}

/* ---- a well-behaved peer: what the hostile cases are measured against ---- */

static void test_roundtrip(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    for (int round = 0; round < 70; round++) { /* wraps the 32-slot FIFO twice */
        size_t len = round % 3 == 0 ? 0 : (size_t)(round * 97 + 1);
        char *src = malloc(len + 1), *dst = calloc(1, len + 64);
        for (size_t i = 0; i < len; i++)
            src[i] = (char)(i * 7 + round);
        void *smh = reg(p.sc, src, len + 1), *rmh = reg(p.rc, dst, len + 64);
        void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
        size_t sizes[1] = {len + 64};
        int tags[1] = {round};
        assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
        assert_non_null(rreq);
        sreq = send_started(p.sc, src, len, round, smh);
        int got[1] = {-1};
        assert_int_equal(wait_req(sreq, NULL), 1);
        assert_int_equal(wait_req(rreq, got), 1);
        assert_int_equal(got[0], (int)len);
        assert_memory_equal(src, dst, len);
        erdma_dereg_mr(p.sc, smh);
        erdma_dereg_mr(p.rc, rmh);
        free(src);
        free(dst);
    }
    assert_int_equal(fake_post_errors(), 0);
    assert_false(fake_cq_overflowed(p.sc->c.cq));
    close_pair(&p);
}

/* "Longest request in flight" (the counters' max_inflight_ns) is stamped from the coarse clock
 * that idle polls cache (conn.h clock_cached_ns), not read on each message's critical path: a
 * receive that waits while its caller polls is counted with its wait, and a cached clock that
 * another thread set a step back never makes the span wrap around into centuries. */
static void test_longest_in_flight_counted(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[64] = "in flight", dst[64];
    void *smh = reg(p.sc, src, sizeof(src)), *rmh = reg(p.rc, dst, sizeof(dst));
    void *data[1] = {dst}, *mhs[1] = {rmh};
    size_t sizes[1] = {sizeof(dst)};
    int tags[1] = {3};
    for (int round = 0; round < 2; round++) {
        void *rreq = NULL, *sreq = NULL;
        assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
        assert_non_null(rreq);
        if (round == 0) { /* the receive waits ~60 ms, polled all along */
            uint64_t t0 = now_ns();
            while (now_ns() - t0 < 60000000ull) {
                int done = 1;
                assert_int_equal(erdma_test(rreq, &done, NULL), 0);
                assert_int_equal(done, 0);
            }
        }
        sreq = send_started(p.sc, src, sizeof(src), 3, smh);
        if (round == 1) /* another thread's older reading lands last: the clock steps back */
            __atomic_store_n(&erdma_clock_ns,
                             ((struct erdma_request *)rreq)->posted_ns - 1000000000ull,
                             __ATOMIC_RELAXED);
        assert_int_equal(wait_req(rreq, NULL), 1);
        assert_int_equal(wait_req(sreq, NULL), 1);
        uint64_t recv_max = p.rc->c.stats.c.max_inflight_ns,
                 send_max = p.sc->c.stats.c.max_inflight_ns;
        print_message("round %d: longest receive %.3f s, send %.3f s\n", round, recv_max / 1e9,
                      send_max / 1e9);
        /* the coarse clock ticks every 1-10 ms */
        assert_true(recv_max >= 40000000ull && recv_max < 5000000000ull);
        assert_true(send_max < 5000000000ull);
    }
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* An arrival's receive goes back on the queue on the next poll that finds nothing, not
 * between the arrival and the caller's answer; a stream whose every poll finds arrivals
 * posts them again once ERDMA_RQ_OWED_MAX are owed, so at most that many are missing from
 * the queue besides those of arrivals not polled yet: it always has room for the FIFO's
 * slots, which is all that can be in flight. */
static void test_receives_posted_again(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    struct ibv_qp *qp = p.rc->c.qps[0].qp;
    enum { N = ERDMA_FIFO_DEPTH };
    static char src[N][64], dst[N][64];
    void *smh = reg(p.sc, src, sizeof(src)), *rmh = reg(p.rc, dst, sizeof(dst));
    void *rreq[N], *sreq[N];
    int got[1];
    for (int round = 0; round < 3; round++) { /* 3 x 32 messages: the queue's 64 and more */
        for (int k = 0; k < N; k++) {
            void *data[1] = {dst[k]}, *mhs[1] = {rmh};
            size_t sizes[1] = {64};
            int tags[1] = {k};
            rreq[k] = sreq[k] = NULL;
            assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq[k]), 0);
            assert_non_null(rreq[k]);
        }
        for (int k = 0; k < N; k++) {
            memset(src[k], 'A' + k, 64);
            assert_int_equal(erdma_isend(p.sc, src[k], 64, k, smh, NULL, &sreq[k]), 0);
            assert_non_null(sreq[k]);
        }
        /* all 32 have landed: each poll of 16 finds arrivals, none finds the CQ empty */
        for (int k = 0; k < N; k++) {
            assert_int_equal(wait_req(rreq[k], got), 1);
            assert_int_equal(got[0], 64);
            assert_int_equal(dst[k][63], 'A' + k);
            /* receives posted, plus those consumed by arrivals not polled yet */
            assert_true(fake_recv_posted(qp) + fake_cq_pending(p.rc->c.cq) >=
                        ERDMA_RQ_DEPTH - ERDMA_RQ_OWED_MAX);
        }
        for (int k = 0; k < N; k++)
            assert_int_equal(wait_req(sreq[k], NULL), 1);
    }
    /* one more: its arrival leaves its receive owed until a poll finds nothing */
    void *data[1] = {dst[0]}, *mhs[1] = {rmh}, *r1 = NULL, *s1 = NULL, *idle = NULL;
    size_t sizes[1] = {64};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &r1), 0);
    assert_int_equal(erdma_isend(p.sc, src[0], 64, 1, smh, NULL, &s1), 0);
    assert_non_null(s1);
    int before = fake_recv_posted(qp); /* the fake consumes the receive as the write lands */
    assert_true(before < ERDMA_RQ_DEPTH);
    int done = 0;
    assert_int_equal(erdma_test(r1, &done, got), 0);
    assert_int_equal(done, 1);
    assert_int_equal(fake_recv_posted(qp), before); /* not posted again by this poll */
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &idle), 0);
    assert_int_equal(erdma_test(idle, &done, got), 0); /* nothing arrives: an idle poll */
    assert_int_equal(done, 0);
    assert_int_equal(fake_recv_posted(qp), ERDMA_RQ_DEPTH);
    assert_int_equal(wait_req(s1, NULL), 1);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    assert_int_equal(fake_post_errors(), 0);
    close_pair(&p);
}

/* ---- defect 1: the peer changes a slot's buffer count between two isends ---- */

struct multi {
    char *src[3], *dst[3];
    void *smh[3], *rmh[3];
    void *rreq;
};

static void multi_post_recv(struct pair *p, struct multi *m, int n) {
    void *data[3], *mhs[3];
    size_t sizes[3];
    int tags[3];
    for (int i = 0; i < n; i++) {
        m->src[i] = calloc(1, 4096);
        m->dst[i] = calloc(1, 4096);
        m->smh[i] = reg(p->sc, m->src[i], 4096);
        m->rmh[i] = reg(p->rc, m->dst[i], 4096);
        data[i] = m->dst[i];
        mhs[i] = m->rmh[i];
        sizes[i] = 4096;
        tags[i] = 100 + i;
    }
    assert_int_equal(erdma_irecv(p->rc, n, data, sizes, tags, mhs, NULL, &m->rreq), 0);
    assert_non_null(m->rreq);
}

static void multi_free(struct pair *p, struct multi *m, int n) {
    for (int i = 0; i < n; i++) {
        erdma_dereg_mr(p->sc, m->smh[i]);
        erdma_dereg_mr(p->rc, m->rmh[i]);
        free(m->src[i]);
        free(m->dst[i]);
    }
}

/* The sender's view of slot 0, buffer 0: where the peer announces the buffer count. */
static volatile struct wire_cts *slot0(struct pair *p) {
    return &p->sc->fifo[cts_index(0, 0)];
}

/* Once the first isend fixed the slot at 3 buffers, the peer says 2: the old code posted
 * the slot with its third entry unmatched and dereferenced its NULL request on completion. */
/* A FIFO slot is used again 32 messages later. The receiver may post that receive as soon as
 * the old message landed, while the sender has not yet seen the old write's completion (its
 * ACK is late, or the caller has not tested): the slot must not be taken over until then,
 * or the old completion would complete the new send before its data left, and the old
 * request would never complete. As net_ib: a send that cannot start yet returns NULL. */
static void test_slot_reused_after_its_completion(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    enum { N = ERDMA_FIFO_DEPTH };
    static char src[N + 1][64], dst[N + 1][64];
    void *smh = reg(p.sc, src, sizeof(src)), *rmh = reg(p.rc, dst, sizeof(dst));
    void *rreq[N + 1], *sreq[N + 1];
    int got[1];
    for (int k = 0; k < N; k++) {
        void *data[1] = {dst[k]}, *mhs[1] = {rmh};
        size_t sizes[1] = {64};
        int tags[1] = {k};
        rreq[k] = sreq[k] = NULL;
        assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq[k]), 0);
        assert_non_null(rreq[k]);
    }
    fake_cq_hold(p.sc->c.cq, true); /* the sender sees none of its completions yet */
    for (int k = 0; k < N; k++) {
        memset(src[k], 'A' + k, 64);
        assert_int_equal(erdma_isend(p.sc, src[k], 64, k, smh, NULL, &sreq[k]), 0);
        assert_non_null(sreq[k]);
    }
    /* message 0 landed: its receive is done, and the next one takes its slot */
    assert_int_equal(wait_req(rreq[0], got), 1);
    void *data[1] = {dst[N]}, *mhs[1] = {rmh};
    size_t sizes[1] = {64};
    int tags[1] = {100};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq[N]), 0);
    assert_non_null(rreq[N]);
    memset(src[N], 'z', 64);
    for (int i = 0; i < 3; i++) { /* slot 0's write is not complete: try again, not an error */
        sreq[N] = (void *)1;
        assert_int_equal(erdma_isend(p.sc, src[N], 64, 100, smh, NULL, &sreq[N]), 0);
        assert_null(sreq[N]);
    }
    fake_cq_hold(p.sc->c.cq, false);
    sreq[N] = send_started(p.sc, src[N], 64, 100, smh);
    for (int k = 0; k <= N; k++) { /* every send completes, each once */
        assert_int_equal(wait_req(sreq[k], NULL), 1);
        if (k > 0) {
            assert_int_equal(wait_req(rreq[k], got), 1);
            assert_int_equal(got[0], 64);
        }
        assert_int_equal(dst[k][63], k < N ? 'A' + k : 'z');
    }
    assert_int_equal(p.sc->c.error, 0);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

static void test_peer_lowers_nreqs(void **state) {
    struct pair p;
    struct multi m;
    connect_pair(&p, 0, 0);
    multi_post_recv(&p, &m, 3);
    void *s0 = send_started(p.sc, m.src[0], 4096, 100, m.smh[0]), *s1 = NULL;
    assert_int_equal(slot0(&p)->nreqs, 3);
    slot0(&p)->nreqs = 2; /* the peer rewrites its clear-to-send */
    unit_log_count = 0;
    int rc = erdma_isend(p.sc, m.src[1], 4096, 101, m.smh[1], NULL, &s1);
    int r0 = wait_req(s0, NULL);
    /* the connection fails with a clear error, and no request completes half-matched */
    assert_true(rc == -EPROTO || r0 == -EPROTO);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "clear-to-send");
    assert_int_equal(erdma_isend(p.sc, m.src[2], 4096, 102, m.smh[2], NULL, &s1), -EPROTO);
    multi_free(&p, &m, 3);
    close_pair(&p);
}

/* The other way round: 2 buffers, then 3: the old code waited for ever for a third isend
 * that, once it came, was never completed. */
static void test_peer_raises_nreqs(void **state) {
    struct pair p;
    struct multi m;
    connect_pair(&p, 0, 0);
    multi_post_recv(&p, &m, 2);
    void *s[3] = {NULL, NULL, NULL};
    s[0] = send_started(p.sc, m.src[0], 4096, 100, m.smh[0]);
    p.sc->fifo[cts_index(0, 2)] = p.sc->fifo[cts_index(0, 1)];
    p.sc->fifo[cts_index(0, 2)].tag = 102;
    for (int b = 0; b < 3; b++)
        p.sc->fifo[cts_index(0, b)].nreqs = 3;
    unit_log_count = 0;
    int rc = erdma_isend(p.sc, m.src[1], 4096, 101, m.smh[1], NULL, &s[1]);
    if (!rc) rc = erdma_isend(p.sc, m.src[1], 4096, 102, m.smh[1], NULL, &s[2]);
    for (int i = 0; i < 3 && !rc; i++)
        if (s[i]) rc = wait_req(s[i], NULL) == 1 ? 0 : -1;
    if (rc != -EPROTO) unit_log_print();
    assert_int_equal(rc, -EPROTO);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "clear-to-send");
    multi_free(&p, &m, 3 - 1);
    close_pair(&p);
}

/* ---- defect 3: the peer's max_msg_sz ---- */

static int setup_tiny_msg_peer(void **state) {
    /* device 1 is the receiver; its REPLY carries its port's max_msg_sz, here 1 byte: the
     * very bytes a hostile peer would send */
    struct fake_dev_cfg cfg[2] = {{.name = "fake0"}, {.name = "fake1", .max_msg_sz = 1}};
    unit_log_start();
    assert_int_equal(fake_env_start(2, cfg, NULL), 2);
    return 0;
}

static void test_peer_max_msg_tiny(void **state) {
    void *s = NULL, *r = NULL;
    int rc = fake_pair_connect(0, 1, &s, &r);
    if (rc == 0) {
        /* the old code accepted it: a 4 KiB isend then needs 4,097 work requests on a
         * 1,024-deep send queue and test() says "not done" for ever */
        struct pair p = {s, r};
        char *src = calloc(1, 4096), *dst = calloc(1, 4096);
        void *smh = reg(s, src, 4096), *rmh = reg(r, dst, 4096);
        void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
        size_t sizes[1] = {4096};
        int tags[1] = {1};
        assert_int_equal(erdma_irecv(r, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
        int ret = 0;
        for (int i = 0; i < POLL_LIMIT && !sreq && !ret; i++)
            ret = erdma_isend(s, src, 4096, 1, smh, NULL, &sreq);
        if (!ret && sreq) ret = wait_req(sreq, NULL);
        erdma_dereg_mr(s, smh);
        erdma_dereg_mr(r, rmh);
        free(src);
        free(dst);
        close_pair(&p);
        fail_msg("a peer's max_msg_sz of 1 was accepted; the 4 KiB send then %s",
                 ret == 0 ? "never completed and never failed (hang)" : "ended");
    }
    assert_int_equal(rc, -EPROTO);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "max message size");
}

/* Our own device may allow fewer bytes per work request than a message needs in one send
 * queue: that is a clear error on the request, never a silent stall. */
static int setup_small_sq(void **state) {
    struct fake_dev_cfg cfg[2] = {{.name = "fake0", .max_msg_sz = 1u << 20, .max_qp_wr = 16},
                                  {.name = "fake1"}};
    unit_log_start();
    assert_int_equal(fake_env_start(2, cfg, NULL), 2);
    return 0;
}

static void test_message_beyond_send_queue(void **state) {
    struct pair p;
    connect_pair(&p, 0, 1);
    size_t len = 32u << 20; /* 32 work requests of 1 MiB, on a 16-deep send queue */
    char *src = calloc(1, len), *dst = calloc(1, len);
    void *smh = reg(p.sc, src, len), *rmh = reg(p.rc, dst, len);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
    size_t sizes[1] = {len};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    int ret = 0;
    for (int i = 0; i < POLL_LIMIT && !sreq && !ret; i++)
        ret = erdma_isend(p.sc, src, len, 1, smh, NULL, &sreq);
    if (!ret && sreq) ret = wait_req(sreq, NULL);
    if (ret != -EMSGSIZE) unit_log_print();
    assert_int_equal(ret, -EMSGSIZE);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "work requests");
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    free(src);
    free(dst);
    close_pair(&p);
}

/* A post the device refuses (a full queue it did not report, a QP the driver moved to error)
 * fails the call that made it with the device's errno, returns no request, names the device,
 * QP and peer, and fails the connection for good: a later call says so again at once. Both
 * clear-to-send paths (one buffer, and a grouped receive's chain) and both payload paths (one
 * write, and the general one of several buffers) are refused once each. */
static void refused_post_case(int nbufs, bool refuse_send) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char *src = calloc(1, 256), *dst = calloc(1, 256 * nbufs);
    void *smh = reg(p.sc, src, 256), *rmh = reg(p.rc, dst, 256 * (size_t)nbufs);
    void *data[2] = {dst, dst + 256}, *mhs[2] = {rmh, rmh}, *rreq = NULL, *sreq = NULL;
    size_t sizes[2] = {256, 256};
    int tags[2] = {1, 2};
    if (!refuse_send) fake_fail_next_post(ENOMEM);
    int ret = erdma_irecv(p.rc, nbufs, data, sizes, tags, mhs, NULL, &rreq);
    if (!refuse_send) {
        if (ret != -ENOMEM) unit_log_print();
        assert_int_equal(ret, -ENOMEM);
        assert_null(rreq);
        assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "clear-to-send");
        assert_int_equal(erdma_irecv(p.rc, nbufs, data, sizes, tags, mhs, NULL, &rreq), -ENOMEM);
        assert_null(rreq);
    } else {
        assert_int_equal(ret, 0);
        assert_non_null(rreq);
        for (int b = 0; b < nbufs - 1; b++) { /* all but the last buffer: nothing posted yet */
            sreq = send_started(p.sc, src, 256, tags[b], smh);
            sreq = NULL;
        }
        ret = send_refused(p.sc, src, 256, tags[nbufs - 1], smh, ENOMEM, &sreq);
        if (ret != -ENOMEM) unit_log_print();
        assert_int_equal(ret, -ENOMEM);
        assert_null(sreq);
        assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "work request");
        assert_int_equal(erdma_isend(p.sc, src, 256, 1, smh, NULL, &sreq), -ENOMEM);
        assert_null(sreq);
    }
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    free(src);
    free(dst);
    close_pair(&p); /* frees the requests the failed comms still hold */
}

static void test_refused_posts_fail_cleanly(void **state) {
    refused_post_case(1, false);
    refused_post_case(2, false);
    refused_post_case(1, true);
    refused_post_case(2, true);
}

/* Calls NCCL never makes, each refused with a WARN that names it and the comms left usable: a
 * buffer without a memory handle (isend, refused before its receive is even posted; irecv),
 * test() of NULL or of a request already reported done. An empty buffer needs no handle, and
 * the refused receive did not take its slot: the next one is matched and moves the data. */
static void test_bad_calls_refused(void **state) {
    (void)state;
    struct pair p;
    connect_pair(&p, 0, 0);
    char *src = malloc(64), *dst = calloc(1, 64);
    memset(src, 0x5a, 64);
    void *smh = reg(p.sc, src, 64), *rmh = reg(p.rc, dst, 64);
    void *sreq = (void *)1, *rreq = (void *)1;
    unit_log_count = 0;
    assert_int_equal(erdma_isend(p.sc, src, 64, 1, NULL, NULL, &sreq), -EINVAL);
    assert_null(sreq);
    assert_logged(NCCL_LOG_WARN, "fake0", "isend of 64 bytes without a memory handle");

    void *data[1] = {dst}, *none[1] = {NULL}, *mhs[1] = {rmh};
    size_t sizes[1] = {64};
    int tags[1] = {1}, done = -1, got[1] = {-1};
    unit_log_count = 0;
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, none, NULL, &rreq), -EINVAL);
    assert_null(rreq);
    assert_logged(NCCL_LOG_WARN, "fake0", "irecv buffer 0 (64 bytes) without a memory handle");
    unit_log_count = 0;
    assert_int_equal(erdma_test(NULL, &done, got), -EINVAL);
    assert_int_equal(done, 0);
    assert_logged(NCCL_LOG_WARN, "test: not a live request");

    /* an empty send needs no handle; the receive after the refused one takes slot 0 */
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    assert_non_null(rreq);
    sreq = send_started(p.sc, src, 0, 1, NULL);
    int sent[1] = {-1};
    assert_int_equal(wait_req(sreq, sent), 1);
    assert_int_equal(wait_req(rreq, got), 1);
    assert_int_equal(sent[0], 0);
    assert_int_equal(got[0], 0);
    /* and a sized one after it, with its handle */
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    assert_non_null(rreq);
    sreq = send_started(p.sc, src, 64, 1, smh);
    assert_int_equal(wait_req(sreq, sent), 1);
    assert_int_equal(wait_req(rreq, got), 1);
    assert_int_equal(sent[0], 64);
    assert_int_equal(got[0], 64);
    assert_memory_equal(src, dst, 64);
    unit_log_count = 0;
    assert_int_equal(erdma_test(rreq, &done, got), -EINVAL); /* already reported and freed */
    assert_logged(NCCL_LOG_WARN, "test: not a live request");
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    free(src);
    free(dst);
    close_pair(&p);
}

/* ---- the receiver's side: records and immediates the peer chooses ---- */

/* One receive of 4 KiB on tag 1, its clear-to-send posted. */
static void *post_one_recv(struct pair *p, char **buf, void **mh) {
    *buf = calloc(1, 4096);
    *mh = reg(p->rc, *buf, 4096);
    void *data[1] = {*buf}, *mhs[1] = {*mh}, *req = NULL;
    size_t sizes[1] = {4096};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p->rc, 1, data, sizes, tags, mhs, NULL, &req), 0);
    assert_non_null(req);
    return req;
}

static void expect_recv_fails(struct pair *p, void *req, int err, const char *what) {
    int rc = wait_req(req, NULL);
    if (rc != err) unit_log_print();
    assert_int_equal(rc, err);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", what);
}

static void hostile_recv_case_err(uint32_t opcode, uint32_t imm, const void *bytes, uint32_t len,
                                  const struct wire_record *rec, int err, const char *what) {
    struct pair p;
    char *buf;
    void *mh;
    connect_pair(&p, 0, 0);
    void *req = post_one_recv(&p, &buf, &mh);
    if (rec) memcpy(&p.rc->rec_area[0], rec, sizeof(*rec));
    unit_log_count = 0;
    assert_int_equal(fake_inject_recv(p.rc->c.qps[0].qp, opcode, imm, bytes, len), 0);
    expect_recv_fails(&p, req, err, what);
    erdma_dereg_mr(p.rc, mh);
    free(buf);
    close_pair(&p);
}

static void hostile_recv_case(uint32_t opcode, uint32_t imm, const void *bytes, uint32_t len,
                              const struct wire_record *rec, const char *what) {
    hostile_recv_case_err(opcode, imm, bytes, len, rec, -EPROTO, what);
}

static void test_peer_imm_size_beyond_buffer(void **state) {
    hostile_recv_case(IBV_WC_RECV_RDMA_WITH_IMM, 4097, NULL, 0, NULL, "4097 bytes into buffer");
}

static void test_peer_imm_record_wrong_seq(void **state) {
    hostile_recv_case(IBV_WC_RECV_RDMA_WITH_IMM, 0x80000000u | 5, NULL, 0, NULL,
                      "unexpected completion");
}

static void test_peer_record_bad_count(void **state) {
    struct wire_record r = {.seq = 0, .n = 200};
    hostile_recv_case(IBV_WC_RECV_RDMA_WITH_IMM, 0x80000000u, NULL, 0, &r, "200 buffers");
}

static void test_peer_record_bad_seq(void **state) {
    struct wire_record r = {.seq = 77, .n = 1, .sizes = {10}};
    hostile_recv_case(IBV_WC_RECV_RDMA_WITH_IMM, 0x80000000u, NULL, 0, &r, "sequence 77");
}

/* Write-with-imm receives have no buffer: a SEND with data fails at the NIC (length
 * error), and the connection with it. */
static void test_peer_send_in_imm_mode(void **state) {
    struct wire_record r = {.seq = 0, .n = 1, .sizes = {10}};
    hostile_recv_case_err(IBV_WC_RECV, 0, &r, sizeof(r), NULL, -EREMOTEIO, "receive on QP");
}

/* With clear-to-sends batched, a receive can be posted while its clear-to-send is still held:
 * a peer that writes into it anyway was not invited. It fails the connection, as a write
 * into no receive does; counted as an arrival it made the held count wrap, and progress
 * then never wrote the held clear-to-sends (a stall with a live peer). */
static int setup_cts_batch(void **state) {
    const char *env[] = {"NCCL_ERDMA_CTS_BATCH=8", NULL};
    unit_log_start();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    return 0;
}

static void test_peer_writes_before_its_cts(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    enum { N = 4 };
    static char dst[N][64];
    void *rmh = reg(p.rc, dst, sizeof(dst)), *rreq[N];
    for (int k = 0; k < N; k++) {
        void *data[1] = {dst[k]}, *mhs[1] = {rmh};
        size_t sizes[1] = {64};
        int tags[1] = {k};
        assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq[k]), 0);
        assert_non_null(rreq[k]);
    }
    uint32_t sent = p.rc->cts_seq; /* the first ones went out, the rest are held */
    assert_true(sent >= 1 && sent < N);
    unit_log_count = 0;
    for (uint32_t k = 0; k <= sent; k++) /* one more than invited: all land in one poll */
        assert_int_equal(fake_inject_recv(p.rc->c.qps[0].qp, IBV_WC_RECV_RDMA_WITH_IMM, 8, NULL, 0),
                         0);
    for (uint32_t k = 0; k < sent; k++)
        assert_int_equal(wait_req(rreq[k], NULL), 1);
    expect_recv_fails(&p, rreq[sent], -EPROTO, "before its clear-to-send was sent");
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

static int setup_send_mode(void **state) {
    const char *env[] = {"NCCL_ERDMA_COMPLETION=send", NULL};
    unit_log_start();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    assert_int_equal(device_get(0)->completion, COMPLETION_SEND);
    return 0;
}

static void test_send_mode_roundtrip_and_hostile_ring(void **state) {
    test_roundtrip(state);
    struct wire_record r = {.seq = 0, .n = 1, .sizes = {5000}};
    hostile_recv_case(IBV_WC_RECV, 0, &r, sizeof(r), NULL, "5000 bytes into buffer");
    hostile_recv_case(IBV_WC_RECV, 0, &r, 5, NULL, "unexpected completion"); /* short */
    r.sizes[0] = 1;
    r.n = 9;
    hostile_recv_case(IBV_WC_RECV, 0, &r, sizeof(r), NULL, "9 buffers");
    hostile_recv_case(IBV_WC_RECV_RDMA_WITH_IMM, 1, NULL, 0, NULL, "unexpected completion");
}

/* ---- the sender's side: FIFO fields out of range ---- */

static void test_peer_fifo_fields(void **state) {
    static const struct {
        int field; /* 0 nreqs, 1 rkey, 2 addr, 3 size */
        uint64_t value;
        int err;
        const char *what;
    } cases[] = {
        {0, 0, -EPROTO, "announces 0 buffers"},
        {0, 9, -EPROTO, "announces 9 buffers"},
        {0, 65535, -EPROTO, "announces 65535 buffers"},
        {1, 0xdeadbeef, -EREMOTEIO, "payload write"}, /* the NIC refuses the key */
        {2, 0x10, -EREMOTEIO, "payload write"},       /* outside the peer's region */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct pair p;
        char *rbuf, *sbuf = calloc(1, 4096);
        void *rmh;
        connect_pair(&p, 0, 0);
        void *rreq = post_one_recv(&p, &rbuf, &rmh);
        void *smh = reg(p.sc, sbuf, 4096), *sreq = NULL;
        volatile struct wire_cts *e = slot0(&p);
        switch (cases[k].field) {
        case 0:
            e->nreqs = (uint16_t)cases[k].value;
            break;
        case 1:
            e->rkey = (uint32_t)cases[k].value;
            break;
        case 2:
            e->addr = cases[k].value;
            break;
        }
        /* a receive smaller than our send is not bad input: net_ib truncates (itest_conform) */
        unit_log_count = 0;
        int rc = erdma_isend(p.sc, sbuf, 4096, 1, smh, NULL, &sreq);
        if (!rc && sreq) rc = wait_req(sreq, NULL);
        if (rc != cases[k].err) unit_log_print();
        assert_int_equal(rc, cases[k].err);
        assert_logged(NCCL_LOG_WARN, "fake0", cases[k].what);
        (void)rreq;
        erdma_dereg_mr(p.sc, smh);
        erdma_dereg_mr(p.rc, rmh);
        free(sbuf);
        free(rbuf);
        close_pair(&p);
    }
}

/* ---- what the peer's key reaches ---- */

/* One RDMA write or read (op) of len bytes at addr with key rkey by the peer's QP, as a
 * hostile peer can post it; returns the completion's status on the peer's side. */
static enum ibv_wc_status peer_rdma(struct conn *from, enum ibv_wr_opcode op, uint64_t addr,
                                    uint32_t rkey, uint32_t len) {
    static uint8_t bytes[512];
    assert_true(len <= sizeof(bytes));
    memset(bytes, 0xC8, sizeof(bytes)); /* a buffer count of 200 where it lands on one */
    struct ibv_mr *mr = vb.reg_mr(from->base.dev->pd, bytes, sizeof(bytes), IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);
    struct ibv_sge sge = {.addr = (uintptr_t)bytes, .length = len, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge,
                             .num_sge = 1,
                             .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = addr, .rkey = rkey}},
                       *bad;
    assert_int_equal(vb.post_send(from->qps[0].qp, &wr, &bad), 0);
    struct ibv_wc wc;
    int n = 0;
    for (int i = 0; i < POLL_LIMIT && n == 0; i++)
        n = vb.poll_cq(from->cq, 1, &wc);
    assert_int_equal(n, 1);
    vb.dereg_mr(mr);
    return wc.status;
}

/* A write with the key we gave the peer, at offset in our control region. */
static enum ibv_wc_status peer_write(struct conn *from, uint64_t offset, uint32_t len) {
    return peer_rdma(from, IBV_WR_RDMA_WRITE, from->remote_ctrl_addr + offset,
                     from->remote_ctrl_rkey, len);
}

/* Each end's key reaches only what the peer writes (the sender's FIFO, the receiver's record
 * area): a receiver read back its own clear-to-send copies, and a buffer count of 200
 * written there sized a work-request array of 8 on the stack. */
static void test_peer_key_reaches_only_its_window(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_int_equal(peer_write(&p.sc->c, RECV_CTRL_RECORDS, sizeof(struct wire_record)),
                     IBV_WC_SUCCESS);
    assert_int_equal(peer_write(&p.rc->c, SEND_CTRL_FIFO, sizeof(struct wire_cts)), IBV_WC_SUCCESS);
    close_pair(&p);

    connect_pair(&p, 0, 0);
    size_t nreqs_at = RECV_CTRL_CTS + offsetof(struct wire_cts, nreqs);
    assert_int_equal(peer_write(&p.sc->c, nreqs_at, 2), IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(p.rc->cts[0].nreqs, 0);
    close_pair(&p); /* a refused write breaks the connection: one case a pair */

    connect_pair(&p, 0, 0);
    assert_int_equal(peer_write(&p.sc->c, RECV_CTRL_PEER_LEN - 1, 2), IBV_WC_REM_ACCESS_ERR);
    close_pair(&p);

    connect_pair(&p, 0, 0);
    assert_int_equal(peer_write(&p.rc->c, SEND_CTRL_RECORDS, 8), IBV_WC_REM_ACCESS_ERR);
    close_pair(&p);
}

/* A peer reads nothing of ours, whatever key it holds: as in net_ib, the QPs of a connection
 * allow only RDMA writes (the payloads, the clear-to-sends); only the flush's loopback QP,
 * which reads our own memory, allows reads. Every QP allowed them, and a registered buffer
 * (registered for reads: the flush needs it) could be read by a peer that guessed its key. */
static void test_peer_reads_nothing(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    static char sbuf[256], rbuf[256];
    struct erdma_mr *smh = reg(p.sc, sbuf, sizeof(sbuf)), *rmh = reg(p.rc, rbuf, sizeof(rbuf));
    assert_int_equal(peer_rdma(&p.rc->c, IBV_WR_RDMA_READ, (uintptr_t)sbuf, smh->rkey, 64),
                     IBV_WC_REM_ACCESS_ERR);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p); /* a refused access breaks the connection: one case a pair */
    connect_pair(&p, 0, 0);
    smh = reg(p.sc, sbuf, sizeof(sbuf));
    rmh = reg(p.rc, rbuf, sizeof(rbuf));
    assert_int_equal(peer_rdma(&p.sc->c, IBV_WR_RDMA_READ, (uintptr_t)rbuf, rmh->rkey, 64),
                     IBV_WC_REM_ACCESS_ERR);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* The peer may rewrite a clear-to-send's size while isend reads it: the size it truncates
 * to must be the one it checked, never more than the caller's. A thread plays the peer,
 * flipping the size between 16 (truncate) and 4096 (larger than the send); a second read
 * of the field sent 4096 bytes for a 64-byte isend within ~40,000 rounds. */
static volatile int flip_stop;
static volatile uint64_t *volatile flip_at;
static void *size_flipper(void *arg) {
    (void)arg;
    while (!flip_stop) {
        volatile uint64_t *at = flip_at;
        if (!at) continue;
        *at = 16;
        for (volatile int i = 0; i < 20; i++) {
        }
        *at = 4096;
        for (volatile int i = 0; i < 20; i++) {
        }
    }
    return NULL;
}

static void test_peer_rewrites_fifo_size(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    static char src[4096], dst[4096];
    void *smh = reg(p.sc, src, sizeof(src)), *rmh = reg(p.rc, dst, sizeof(dst));
    pthread_t t;
    flip_stop = 0;
    assert_int_equal(pthread_create(&t, NULL, size_flipper, NULL), 0);
    int worst = 0, round;
    uint64_t until = now_ns() + 10000000000ull; /* a loaded host runs fewer rounds, not longer */
    for (round = 0; round < 200000 && worst <= 64 && now_ns() < until; round++) {
        void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
        size_t sizes[1] = {sizeof(dst)};
        int tags[1] = {1};
        assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
        assert_non_null(rreq);
        volatile struct wire_cts *e = &p.sc->fifo[cts_index(p.sc->fifo_seq % ERDMA_FIFO_DEPTH, 0)];
        assert_int_equal(e->seq, p.sc->fifo_seq + 1);
        flip_at = &e->size;
        while (e->size != 16) { /* until the flipper has it */
        }
        assert_int_equal(erdma_isend(p.sc, src, 64, 1, smh, NULL, &sreq), 0);
        flip_at = NULL;
        assert_non_null(sreq);
        int ss[1] = {0}, rs[1] = {0};
        assert_int_equal(wait_req(sreq, ss), 1);
        assert_int_equal(wait_req(rreq, rs), 1);
        if (ss[0] > worst) worst = ss[0];
        if (rs[0] > worst) worst = rs[0];
    }
    flip_stop = 1;
    pthread_join(t, NULL);
    print_message("%d rounds, largest size reported %d\n", round, worst);
    assert_in_range(worst, 16, 64);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* ---- shapes: several QPs, split data, the flush read ---- */

/* One iflush of a received 4 KiB buffer: it must give a request, and the request must end. */
static void flush_one(struct pair *p) {
    char *buf = calloc(1, 4096);
    void *mh = reg(p->rc, buf, 4096), *req = NULL, *data[1] = {buf}, *mhs[1] = {mh};
    int sizes[1] = {4096};
    assert_int_equal(erdma_iflush(p->rc, 1, data, sizes, mhs, &req), 0);
    assert_non_null(req);
    assert_int_equal(wait_req(req, NULL), 1);
    erdma_dereg_mr(p->rc, mh);
    free(buf);
}

static int setup_split(void **state) {
    const char *env[] = {"NCCL_IB_QPS_PER_CONNECTION=3", "NCCL_IB_SPLIT_DATA_ON_QPS=1",
                         "NCCL_ERDMA_FORCE_FLUSH=1", NULL};
    return start_one(env);
}

static void test_split_and_flush(void **state) {
    test_roundtrip(state);
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_int_equal(p.sc->c.nqps, 3);
    assert_true(p.rc->flush_ready);
    flush_one(&p);
    close_pair(&p);
}

/* iWARP (eRDMA's standard mode) wants remote write access on the local buffer a read lands
 * in: the flush's target had local write only, which siw does not check and eRDMA may. */
static int setup_read_sink_rw(void **state) {
    const char *env[] = {"NCCL_ERDMA_FORCE_FLUSH=1", NULL};
    struct fake_dev_cfg cfg = {.read_sink_rw = true};
    unit_log_start();
    assert_int_equal(fake_env_start(1, &cfg, env), 1);
    return 0;
}

static void test_flush_target_takes_iwarp_reads(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_true(p.rc->flush_ready);
    flush_one(&p);
    close_pair(&p);
}

/* What NCCL reads as "nothing to flush": an iflush whose receives all have size 0 gives a NULL
 * request (NCCL treats NULL as done) and posts no read; and NCCL_GDR_FLUSH_DISABLE=1 builds no
 * loopback on a GPU Direct device, where NCCL_ERDMA_FORCE_FLUSH=1 still builds it. */
static void test_flush_not_wanted(void **state) {
    struct erdma_device *d = device_get(0);
    d->gdr = true; /* as with peer memory */
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_true(p.rc->flush_ready);
    char *buf = calloc(1, 4096);
    void *mh = reg(p.rc, buf, 4096), *req = (void *)1, *data[2] = {buf, buf}, *mhs[2] = {mh, mh};
    int sizes[2] = {0, 0};
    assert_int_equal(erdma_iflush(p.rc, 2, data, sizes, mhs, &req), 0);
    assert_null(req);
    erdma_dereg_mr(p.rc, mh);
    free(buf);
    close_pair(&p);
    setenv("NCCL_GDR_FLUSH_DISABLE", "1", 1);
    params_load();
    connect_pair(&p, 0, 0);
    assert_false(p.rc->flush_ready);
    close_pair(&p);
    setenv("NCCL_ERDMA_FORCE_FLUSH", "1", 1);
    params_load();
    connect_pair(&p, 0, 0);
    assert_true(p.rc->flush_ready);
    close_pair(&p);
    unsetenv("NCCL_GDR_FLUSH_DISABLE");
    unsetenv("NCCL_ERDMA_FORCE_FLUSH");
    params_load();
    d->gdr = false;
}

/* A flush whose read fails is this node's trouble, not the peer's: the read goes from the NIC
 * to itself (a loopback QP pair), after the data has arrived. The WARN must say so and point
 * at the loopback, not name the sender with "the peer stopped acknowledging: it died", and
 * NCCL must not be told the remote side failed. */
static void test_flush_failure_blames_the_loopback(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_true(p.rc->flush_ready);
    fake_fail_reads(IBV_WC_RETRY_EXC_ERR); /* eRDMA not carrying a read from itself to itself */
    char *buf = calloc(1, 4096);
    void *mh = reg(p.rc, buf, 4096), *req = NULL, *data[1] = {buf}, *mhs[1] = {mh};
    int sizes[1] = {4096};
    assert_int_equal(erdma_iflush(p.rc, 1, data, sizes, mhs, &req), 0);
    assert_non_null(req);
    unit_log_count = 0;
    int rc = wait_req(req, NULL);
    const char *loopback[] = {"flush", "loopback", "NCCL_GDR_FLUSH_DISABLE", NULL};
    const char *blames_peer[] = {"peer stopped acknowledging", NULL};
    if (rc >= 0 || unit_log_count_matching(NCCL_LOG_WARN, loopback) != 1) unit_log_print();
    assert_true(rc < 0);
    assert_int_not_equal(rc, -EREMOTEIO); /* ncclRemoteError: "the other node failed" */
    assert_int_equal(unit_log_count_matching(NCCL_LOG_WARN, loopback), 1);
    assert_int_equal(unit_log_count_matching(NCCL_LOG_WARN, blames_peer), 0);
    fake_fail_reads(IBV_WC_SUCCESS);
    erdma_dereg_mr(p.rc, mh);
    free(buf);
    close_pair(&p);
}

/* A device whose GPU memory comes through dma-buf (no peer memory) flushes GPU receives, as
 * net_ib does: without the flush QP iflush answered NULL, "done", with no read-back to order
 * the NIC's PCIe writes before the GPU reads the buffer. */
static void test_dmabuf_device_flushes(void **state) {
    struct erdma_device *d = device_get(0);
    d->gdr = false;
    d->dmabuf = true; /* what the probe finds on a NIC with dma-buf (eRDMA answers no) */
    struct pair p;
    connect_pair(&p, 0, 0);
    assert_true(p.rc->flush_ready);
    flush_one(&p);
    close_pair(&p);
    d->dmabuf = false;
    connect_pair(&p, 0, 0);
    assert_false(p.rc->flush_ready); /* host memory only: nothing to flush */
    close_pair(&p);
}

static int setup_gdr(void **state) {
    const char *env[] = {"NCCL_ERDMA_GDR=1", NULL};
    return start_one(env);
}

/* Sends from GPU memory never go inline: the CPU copies an inline payload at post time, and
 * a GPU buffer is not readable by the CPU (on a node, SIGSEGV in ibv_post_send for every
 * send of <= 96 bytes: NCCL's LL messages). Host memory still goes inline. Both the one-WR
 * path (one buffer) and the general one (a grouped receive of two) are covered. */
static void test_gpu_payload_never_inline(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    static uint8_t gpu[4096] __attribute__((aligned(4096))), dst[2][256];
    void *gmh = NULL, *rmh[2];
    assert_int_equal(erdma_reg_mr(p.sc, gpu, sizeof(gpu), NCCL_PTR_CUDA, &gmh), 0);
    for (int b = 0; b < 2; b++)
        rmh[b] = reg(p.rc, dst[b], sizeof(dst[b]));
    for (size_t i = 0; i < sizeof(gpu); i++)
        gpu[i] = (uint8_t)(i * 13 + 5);
    fake_set_gpu_memory(gpu, sizeof(gpu));
    fake_watch_inline(gpu, sizeof(gpu));
    const size_t lens[] = {1, 8, 64, 96};
    for (int nb = 1; nb <= 2; nb++) {
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            void *data[2] = {dst[0], dst[1]}, *rreq = NULL, *sreq[2] = {NULL, NULL};
            size_t sizes[2] = {sizeof(dst[0]), sizeof(dst[1])};
            int tags[2] = {1, 2}, got[2] = {-1, -1};
            memset(dst, 0, sizeof(dst));
            assert_int_equal(erdma_irecv(p.rc, nb, data, sizes, tags, rmh, NULL, &rreq), 0);
            assert_non_null(rreq);
            for (int b = 0; b < nb; b++)
                sreq[b] = send_started(p.sc, gpu + 100 * b, lens[k], tags[b], gmh);
            for (int b = 0; b < nb; b++) {
                assert_non_null(sreq[b]);
                assert_int_equal(wait_req(sreq[b], NULL), 1);
            }
            assert_int_equal(wait_req(rreq, got), 1);
            for (int b = 0; b < nb; b++) {
                assert_int_equal(got[b], (int)lens[k]);
                assert_memory_equal(dst[b], gpu + 100 * b, lens[k]);
            }
        }
    }
    assert_int_equal(fake_post_errors(), 0);
    assert_int_equal(fake_inline_watched(), 0); /* the CPU never copied from the GPU */
    fake_set_gpu_memory(NULL, 0);
    /* host memory: the payload still goes inline (NCCL_ERDMA_INLINE_PAYLOAD's default) */
    static uint8_t host[64];
    void *hmh = reg(p.sc, host, sizeof(host)), *data[1] = {dst[0]}, *rreq = NULL, *sreq = NULL;
    size_t sizes[1] = {sizeof(dst[0])};
    int tags[1] = {3};
    fake_watch_inline(host, sizeof(host));
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, rmh, NULL, &rreq), 0);
    sreq = send_started(p.sc, host, 8, 3, hmh);
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    assert_int_equal(fake_inline_watched(), 1);
    erdma_dereg_mr(p.sc, hmh);
    erdma_dereg_mr(p.sc, gmh);
    for (int b = 0; b < 2; b++)
        erdma_dereg_mr(p.rc, rmh[b]);
    close_pair(&p);
}

/* ---- the 32-bit sequence wrapping with a QP count that does not divide 2^32 ---- */

/* Puts both ends of a fresh connection where they stand after s messages: the sender's FIFO
 * and post cursors, the receiver's counters and, round-robin, the next sequence each QP
 * carries (the smallest v >= s with v % nqps == q). */
static void skip_ahead(struct pair *p, uint32_t s) {
    int n = p->rc->c.nqps;
    p->sc->fifo_seq = p->sc->post_seq = s;
    p->rc->seq = p->rc->cts_seq = p->rc->arrived = s;
    p->sc->post_qp = p->rc->post_qp = p->rc->c.split ? 0 : (int)(s % (uint32_t)n);
    for (int q = 0; q < n; q++) {
        uint64_t v = (uint64_t)s - (uint64_t)s % (uint64_t)n + (uint64_t)q;
        if (v < s) v += (uint64_t)n;
        p->rc->next_seq[q] = p->rc->c.split ? s : (uint32_t)v;
    }
}

/* 12 receives posted ahead, then 12 sends of distinct sizes: each receive must report its
 * own message's size. */
static void exchange_across(struct pair *p, uint32_t start) {
    enum { K = 12 };
    static char src[K][256], dst[K][256];
    void *smh = reg(p->sc, src, sizeof(src)), *rmh = reg(p->rc, dst, sizeof(dst));
    void *rreq[K], *sreq[K];
    skip_ahead(p, start);
    for (int k = 0; k < K; k++) {
        void *data[1] = {dst[k]}, *mhs[1] = {rmh};
        size_t sizes[1] = {256};
        int tags[1] = {k};
        rreq[k] = NULL;
        assert_int_equal(erdma_irecv(p->rc, 1, data, sizes, tags, mhs, NULL, &rreq[k]), 0);
        assert_non_null(rreq[k]);
    }
    for (int k = 0; k < K; k++) {
        memset(src[k], 'a' + k, sizeof(src[k]));
        sreq[k] = send_started(p->sc, src[k], 100 + k, k, smh);
    }
    for (int k = 0; k < K; k++) {
        int got[1] = {-1};
        int rc = wait_req(rreq[k], got);
        if (rc != 1) unit_log_print();
        print_message("receive #%d (sequence %u): rc %d, size %d, expected %d\n", k,
                      start + (uint32_t)k, rc, got[0], 100 + k);
        assert_int_equal(rc, 1);
        assert_int_equal(got[0], 100 + k);
    }
    for (int k = 0; k < K; k++)
        assert_int_equal(wait_req(sreq[k], NULL), 1);
    erdma_dereg_mr(p->sc, smh);
    erdma_dereg_mr(p->rc, rmh);
}

static int setup_rr3(void **state) {
    const char *env[] = {"NCCL_IB_QPS_PER_CONNECTION=3", NULL};
    return start_one(env);
}

static int setup_rr4(void **state) {
    const char *env[] = {"NCCL_IB_QPS_PER_CONNECTION=4", NULL};
    return start_one(env);
}

/* control: the same exchange far from the wrap passes */
static void test_rr_no_wrap(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    exchange_across(&p, 1000u);
    close_pair(&p);
}

/* the 2^32 wrap in the middle of the window: fails with 3 QPs (2^32 % 3 == 1), passes with 4 */
static void test_rr_seq_wrap(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    exchange_across(&p, UINT32_MAX - 5u); /* sequences 2^32-6 .. 5 */
    close_pair(&p);
}

static int setup_rr3_send(void **state) {
    const char *env[] = {"NCCL_IB_QPS_PER_CONNECTION=3", "NCCL_ERDMA_COMPLETION=send", NULL};
    return start_one(env);
}

/* ---- a wait with no message moving (p2p.c stall_watch) ---- */

static int setup_stall_1s(void **state) {
    const char *env[] = {"NCCL_ERDMA_STALL_WARN=1", NULL};
    return start_one(env);
}

static int setup_stall_off(void **state) {
    const char *env[] = {"NCCL_ERDMA_STALL_WARN=0", NULL};
    return start_one(env);
}

/* isend for ms milliseconds with no receive to match: each call gives no request. */
static void spin_isend(struct pair *p, void *buf, void *mh, int ms) {
    uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
    while (now_ns() < end) {
        void *req = (void *)1;
        assert_int_equal(erdma_isend(p->sc, buf, 8, 1, mh, NULL, &req), 0);
        assert_null(req);
    }
}

/* test() for ms milliseconds on a request that must stay pending. */
static void spin_test(void *req, int ms) {
    uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
    while (now_ns() < end) {
        int done = 1;
        assert_int_equal(erdma_test(req, &done, NULL), 0);
        assert_int_equal(done, 0);
    }
}

#define STALL_NO_RECEIVE "has posted no receive for our sends"
#define STALL_NO_SEND    "no message has arrived from"
#define STALL_NO_ACK     "have not been acknowledged"

/* A sender whose peer posts no receive: one WARN naming the peer after the limit (not one a
 * health check), then an INFO once messages move and the caller waits again. */
static void test_stall_names_the_peer_once(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[8] = "stalled", dst[8];
    void *smh = reg(p.sc, src, 8), *rmh = reg(p.rc, dst, 8);
    spin_isend(&p, src, smh, 300);
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE)); /* not before the limit */
    spin_isend(&p, src, smh, 2200);
    assert_logged(NCCL_LOG_WARN, "fake", STALL_NO_RECEIVE, p.sc->c.peer, "NCCL_ERDMA_STALL_WARN");
    assert_int_equal(
        unit_log_count_matching(NCCL_LOG_WARN, (const char *const[]){STALL_NO_RECEIVE, NULL}), 1);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL;
    size_t sizes[1] = {8};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    void *sreq = send_started(p.sc, src, 8, 1, smh);
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    spin_isend(&p, src, smh, 300); /* waiting again: the watch sees the message moved */
    assert_logged(NCCL_LOG_INFO, "messages with", p.sc->c.peer, "move again");
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* A receiver waiting for a send that does not come, and a sender whose posted message is not
 * acknowledged (its completion held): each says which, naming the peer. */
static void test_stall_receiver_and_unacknowledged(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[8] = "held", dst[8];
    void *smh = reg(p.sc, src, 8), *rmh = reg(p.rc, dst, 8);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL;
    size_t sizes[1] = {8};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    spin_test(rreq, 1600);
    assert_logged(NCCL_LOG_WARN, STALL_NO_SEND, p.rc->c.peer);
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_ACK));
    fake_cq_hold(p.sc->c.cq, true); /* the sender sees no completion: as no acknowledgement */
    void *sreq = send_started(p.sc, src, 8, 1, smh);
    spin_test(sreq, 1600);
    assert_logged(NCCL_LOG_WARN, STALL_NO_ACK, p.sc->c.peer, "NCCL_IB_TIMEOUT");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE));
    fake_cq_hold(p.sc->c.cq, false);
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* A comm nobody waited on for a while was idle, not stuck: its wait starts afresh. */
static void test_stall_idle_is_no_wait(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[8] = "idle";
    void *smh = reg(p.sc, src, 8);
    spin_isend(&p, src, smh, 700);
    usleep(5500 * 1000);           /* longer than STALL_IDLE_NS */
    spin_isend(&p, src, smh, 400); /* 1.1 s of waiting in all, 0.4 s of this wait */
    if (UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE)) unit_log_print();
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE));
    erdma_dereg_mr(p.sc, smh);
    close_pair(&p);
}

static void test_stall_warn_off(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[8] = "off";
    void *smh = reg(p.sc, src, 8);
    spin_isend(&p, src, smh, 1600);
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE));
    erdma_dereg_mr(p.sc, smh);
    close_pair(&p);
}

/* ---- a child forked with comms open ---- */

/* In the child: every call is refused or is a no-op, since its devices, queues and sockets are
 * the parent's (net.h, erdma_forked). Returns which check failed, 0 when none did. */
static int forked_child_calls(struct pair *p, char *src, char *dst, void *smh, void *rmh,
                              void *rreq) {
    void *req = (void *)1, *lc = (void *)1, *comm = (void *)1, *mh = (void *)1;
    int done = 1, tags[1] = {6};
    void *data[1] = {dst}, *mhs[1] = {rmh};
    size_t sizes[1] = {64};
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    if (erdma_isend(p->sc, src, 8, 5, smh, NULL, &req) != -ENOTSUP || req) return 1;
    if (erdma_test(rreq, &done, NULL) != -ENOTSUP || done) return 2;
    if (erdma_irecv(p->rc, 1, data, sizes, tags, mhs, NULL, &req) != -ENOTSUP || req) return 3;
    if (erdma_listen(0, handle, &lc) != -ENOTSUP || lc) return 4;
    if (erdma_connect(0, -1, handle, &comm) != -ENOTSUP || comm) return 5;
    if (erdma_reg_mr(p->sc, src, 64, NCCL_PTR_HOST, &mh) != -ENOTSUP) return 6;
    if (erdma_dereg_mr(p->sc, smh) || erdma_close_send(p->sc) || erdma_close_recv(p->rc)) return 7;
    if (p->sc->c.base.kind != COMM_SEND || p->rc->c.base.kind != COMM_RECV)
        return 8;     /* not freed */
    erdma_finalize(); /* would stop the parent's threads, and join ones this child lacks */
    if (erdma_init(NULL, NULL) != -ENOTSUP) return 9;
    if (!UNIT_LOG_HAS(NCCL_LOG_WARN, "isend", "forked", "spawn")) return 10;
    return 0;
}

static void test_forked_child_leaves_parent_alone(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char *src = malloc(64), *dst = calloc(1, 64);
    memset(src, 0x5a, 64);
    void *smh = reg(p.sc, src, 64), *rmh = reg(p.rc, dst, 64);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
    size_t sizes[1] = {64};
    int tags[1] = {5};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    assert_non_null(rreq);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(forked_child_calls(&p, src, dst, smh, rmh, rreq));
    int status = 0;
    pid_t w = fake_wait_child(pid, 10, &status);
    assert_int_equal(w, pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* the parent's receive, posted before the fork, still completes */
    sreq = send_started(p.sc, src, 64, 5, smh);
    int got[1] = {-1};
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, got), 1);
    assert_int_equal(got[0], 64);
    assert_memory_equal(src, dst, 64);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    free(src);
    free(dst);
    close_pair(&p);
}

/* ---- the port goes down under a connection ---- */

/* Starts the async-event thread and names the device's netdev, as sysfs would. */
static void watch_port(void) {
    strcpy(device_get(0)->netdev, "eth9");
    assert_int_equal(async_start(), 0);
}

/* Queues a port event for the async thread and waits (bounded) until it took effect. */
static void port_event(enum ibv_event_type type) {
    int want = type == IBV_EVENT_PORT_ERR ? -ENETDOWN : 0;
    fake_async_event(0, type, 1);
    uint64_t until = now_ns() + 5000000000ull;
    while (__atomic_load_n(&device_get(0)->fatal, __ATOMIC_ACQUIRE) != want && now_ns() < until)
        usleep(1000);
    assert_int_equal(device_get(0)->fatal, want);
}

/* One receive of len bytes and tag 1 posted on p, its request returned. */
static void *post_recv_tag1(struct pair *p, char *dst, size_t len, void **mh) {
    *mh = reg(p->rc, dst, len);
    void *data[1] = {dst}, *mhs[1] = {*mh}, *req = NULL;
    size_t sizes[1] = {len};
    int tags[1] = {1};
    assert_int_equal(erdma_irecv(p->rc, 1, data, sizes, tags, mhs, NULL, &req), 0);
    assert_non_null(req);
    return req;
}

/* A link flap shorter than the QPs' retry window fails nothing, as in net_ib (a port error
 * is a "non-fatal" event there): the QPs' retries carry it. A receive posted before the down
 * waits through it (several health checks) and completes once the port is back. Until
 * 2026-12-07 every connection made before a down failed at its next health check, whether or
 * not its QPs survived (on rxe an idle QP does). A connection that does fail after the down
 * says the link is the likely cause, whatever its QP reported. */
static void test_connection_rides_out_a_flap(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    watch_port();
    char src[256], dst[256] = {0};
    memset(src, 0x5A, sizeof(src));
    void *rmh, *smh = reg(p.sc, src, sizeof(src)), *sreq = NULL;
    void *rreq = post_recv_tag1(&p, dst, sizeof(dst), &rmh);
    unit_log_count = 0;
    port_event(IBV_EVENT_PORT_ERR);
    assert_logged(NCCL_LOG_WARN, "fake0", "port went down", "check the link of eth9");
    uint64_t until = now_ns() + 300000000ull; /* three health checks */
    while (now_ns() < until) {
        int done = 0;
        int rc = erdma_test(rreq, &done, NULL);
        if (rc) unit_log_print();
        assert_int_equal(rc, 0);
        assert_false(done);
        usleep(1000);
    }
    port_event(IBV_EVENT_PORT_ACTIVE);
    sreq = send_started(p.sc, src, sizeof(src), 1, smh);
    int got[1] = {-1};
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, got), 1);
    assert_int_equal(got[0], (int)sizeof(src));
    assert_memory_equal(src, dst, sizeof(src));

    /* a failure after the flap names the link */
    rreq = post_recv_tag1(&p, dst, sizeof(dst), &rmh);
    unit_log_count = 0;
    assert_int_equal(send_refused(p.sc, src, sizeof(src), 1, smh, EIO, &sreq), -EIO);
    assert_logged(NCCL_LOG_WARN, "fake0", "port went down during the connection with", "127.0.0.1",
                  "check the link of eth9");
    async_stop();
    close_pair(&p);
}

/* The stall WARN when the peer's next receive carries a tag no send of ours matches (the two
 * ranks disagree), and when our own port is down (the link, not the peer). */
static void test_stall_tag_mismatch_and_port_down(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    watch_port();
    char src[8] = "tags", dst[8];
    void *smh = reg(p.sc, src, 8), *rmh = reg(p.rc, dst, 8);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL;
    size_t sizes[1] = {8};
    int tags[1] = {2};
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    spin_isend(&p, src, smh, 1600); /* tag 1 */
    assert_logged(NCCL_LOG_WARN, "fake0", "the receive", p.sc->c.peer,
                  "(1 buffer(s), 0 matched) waits for a send with tag 2");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_RECEIVE));
    /* our port goes down during the receiver's wait: the peer's text, and the link too */
    spin_test(rreq, 300);
    port_event(IBV_EVENT_PORT_ERR);
    unit_log_count = 0;
    spin_test(rreq, 1400);
    assert_logged(NCCL_LOG_WARN, "fake0", STALL_NO_SEND, "went down during the wait too", "eth9");
    port_event(IBV_EVENT_PORT_ACTIVE);
    void *sreq = send_started(p.sc, src, 8, 2, smh);
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    /* down before the wait began: our link, not the peer */
    port_event(IBV_EVENT_PORT_ERR);
    assert_int_equal(erdma_irecv(p.rc, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    unit_log_count = 0;
    spin_test(rreq, 1600);
    assert_logged(NCCL_LOG_WARN, "fake0", "nothing has moved with", "port is down",
                  "check the link of eth9");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_SEND));
    port_event(IBV_EVENT_PORT_ACTIVE);
    sreq = send_started(p.sc, src, 8, 2, smh);
    assert_int_equal(wait_req(sreq, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    async_stop();
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* A receive of two buffers of which our sends matched one: that send is not posted (it waits
 * for the other buffer's), so the WARN is the receive not matched, not "not acknowledged". */
static void test_stall_partial_match(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    char src[8] = "half", dst[2][8];
    void *smh = reg(p.sc, src, 8), *rmh = reg(p.rc, dst, sizeof(dst));
    void *data[2] = {dst[0], dst[1]}, *mhs[2] = {rmh, rmh}, *rreq = NULL;
    size_t sizes[2] = {8, 8};
    int tags[2] = {1, 2};
    assert_int_equal(erdma_irecv(p.rc, 2, data, sizes, tags, mhs, NULL, &rreq), 0);
    void *s1 = send_started(p.sc, src, 8, 1, smh);
    spin_isend(&p, src, smh, 1600); /* tag 1 again: buffer 0 is taken, buffer 1 wants tag 2 */
    assert_logged(NCCL_LOG_WARN, "(2 buffer(s), 1 matched) waits for a send with tag 2");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, STALL_NO_ACK));
    void *s2 = send_started(p.sc, src, 8, 2, smh);
    assert_int_equal(wait_req(s1, NULL), 1);
    assert_int_equal(wait_req(s2, NULL), 1);
    assert_int_equal(wait_req(rreq, NULL), 1);
    erdma_dereg_mr(p.sc, smh);
    erdma_dereg_mr(p.rc, rmh);
    close_pair(&p);
}

/* With NCCL_IB_TIMEOUT=12 and NCCL_IB_RETRY_CNT=1 the QPs' retry window is 4.096 us * 2^12 * 2
 * = 34 ms. */
static int setup_short_retry(void **state) {
    static const char *const env[] = {"NCCL_IB_TIMEOUT=12", "NCCL_IB_RETRY_CNT=1", NULL};
    return start_one(env);
}

/* A port that stays down longer than the QPs' retry window fails what waits on the peer, with
 * a WARN that names the link (else a receive would wait for good: nothing on the wire can
 * end it), and not before that window. */
static void test_port_down_outlasting_retries_fails_waiters(void **state) {
    struct pair p;
    connect_pair(&p, 0, 0);
    watch_port();
    char dst[256];
    void *rmh, *rreq = post_recv_tag1(&p, dst, sizeof(dst), &rmh);
    unit_log_count = 0;
    uint64_t t0 = now_ns();
    port_event(IBV_EVENT_PORT_ERR);
    int ret = 0, done = 0;
    while (!ret && now_ns() - t0 < 5000000000ull)
        ret = erdma_test(rreq, &done, NULL);
    double waited = (now_ns() - t0) / 1e9;
    assert_int_equal(ret, -ENETDOWN);
    assert_true(waited >= 0.030);
    assert_logged(NCCL_LOG_WARN, "fake0", "127.0.0.1", "port has been down for",
                  "retry window (0.0 s", "check the link of eth9");
    assert_int_equal(erdma_test(rreq, &done, NULL), -ENETDOWN); /* and stays failed */
    async_stop();
    close_pair(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connection_rides_out_a_flap, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_port_down_outlasting_retries_fails_waiters,
                                        setup_short_retry, teardown_env),
        cmocka_unit_test_setup_teardown(test_roundtrip, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_forked_child_leaves_parent_alone, setup_one,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_names_the_peer_once, setup_stall_1s,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_receiver_and_unacknowledged, setup_stall_1s,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_idle_is_no_wait, setup_stall_1s, teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_warn_off, setup_stall_off, teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_tag_mismatch_and_port_down, setup_stall_1s,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_stall_partial_match, setup_stall_1s, teardown_env),
        cmocka_unit_test_setup_teardown(test_receives_posted_again, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_longest_in_flight_counted, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_slot_reused_after_its_completion, setup_one,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_lowers_nreqs, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_raises_nreqs, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_max_msg_tiny, setup_tiny_msg_peer, teardown_env),
        cmocka_unit_test_setup_teardown(test_message_beyond_send_queue, setup_small_sq,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_refused_posts_fail_cleanly, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_bad_calls_refused, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_imm_size_beyond_buffer, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_imm_record_wrong_seq, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_record_bad_count, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_record_bad_seq, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_send_in_imm_mode, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_writes_before_its_cts, setup_cts_batch,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_send_mode_roundtrip_and_hostile_ring, setup_send_mode,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_fifo_fields, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_key_reaches_only_its_window, setup_one,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_reads_nothing, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_peer_rewrites_fifo_size, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_split_and_flush, setup_split, teardown_env),
        cmocka_unit_test_setup_teardown(test_dmabuf_device_flushes, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_flush_failure_blames_the_loopback, setup_split,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_flush_target_takes_iwarp_reads, setup_read_sink_rw,
                                        teardown_env),
        cmocka_unit_test_setup_teardown(test_flush_not_wanted, setup_one, teardown_env),
        cmocka_unit_test_setup_teardown(test_gpu_payload_never_inline, setup_gdr, teardown_env),
        cmocka_unit_test_setup_teardown(test_rr_seq_wrap, setup_rr3_send, teardown_env),
        cmocka_unit_test_setup_teardown(test_rr_no_wrap, setup_rr3, teardown_env),
        cmocka_unit_test_setup_teardown(test_rr_seq_wrap, setup_rr4, teardown_env),
        cmocka_unit_test_setup_teardown(test_rr_seq_wrap, setup_rr3, teardown_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
