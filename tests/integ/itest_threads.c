/*
 * Integration: the calls NCCL makes from several threads at once, for the ThreadSanitizer
 * pass of tests/run-all.sh (it also passes in the plain build). NCCL registers and
 * deregisters buffers from one thread while its proxy thread sends on the same comm, and
 * with v11's per-communicator init, several communicators init and finalize at once; the
 * async-event thread runs behind all of it (and itest_async flaps the port under TSan too).
 */
#include "netapi.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define TMO      60
#define MSGS     200
#define MSG_SIZE 65536
#define REG_BUFS 4

struct cfg {
    const char *dev;
};

static void *page_alloc(size_t len) {
    void *p = NULL;
    return posix_memalign(&p, 4096, len) ? NULL : p;
}

static int receiver(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *rc, *mh;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, 12, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &rc, TMO) == 0);
    uint8_t *buf = page_alloc(MSG_SIZE);
    CHECK(buf);
    CHECK(net_regmr(&n, rc, buf, MSG_SIZE, &mh) == 0);
    for (int i = 0; i < MSGS; i++) {
        void *data = buf, *req;
        size_t sz = MSG_SIZE;
        int tag = 0, got = -1;
        CHECK(net_irecv(&n, rc, 1, &data, &sz, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(got == MSG_SIZE - i && pattern_check(buf, (size_t)got, (uint32_t)i) < 0);
    }
    CHECK(net_deregmr(&n, rc, mh) == 0);
    CHECK(duo_barrier(d) == 0);
    net_close_recv(&n, rc);
    net_close_listen(&n, lc);
    net_close(&n);
    free(buf);
    return 0;
}

struct registrar {
    struct netapi *n;
    void *sc;
    uint8_t *send_buf; /* registered again while the other thread sends from it */
    volatile int stop;
    int rounds, failures;
};

static void *registrar_main(void *arg) {
    struct registrar *r = arg;
    uint8_t *bufs[REG_BUFS];
    for (int i = 0; i < REG_BUFS; i++)
        bufs[i] = page_alloc((size_t)(i + 1) << 16);
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE) || r->rounds < 20) {
        void *mh[REG_BUFS + 1];
        for (int i = 0; i < REG_BUFS; i++)
            if (net_regmr(r->n, r->sc, bufs[i], (size_t)(i + 1) << 16, &mh[i])) r->failures++;
        if (net_regmr(r->n, r->sc, r->send_buf, MSG_SIZE, &mh[REG_BUFS])) r->failures++;
        for (int i = REG_BUFS; i >= 0; i--)
            if (net_deregmr(r->n, r->sc, mh[i])) r->failures++;
        r->rounds++;
    }
    for (int i = 0; i < REG_BUFS; i++)
        free(bufs[i]);
    return NULL;
}

static int sender(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *sc, *mh;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, 12, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &sc, TMO) == 0);
    uint8_t *buf = page_alloc(MSG_SIZE);
    CHECK(buf);
    CHECK(net_regmr(&n, sc, buf, MSG_SIZE, &mh) == 0);
    struct registrar r = {.n = &n, .sc = sc, .send_buf = buf};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, registrar_main, &r) == 0);
    int rc = 0;
    for (int i = 0; i < MSGS && !rc; i++) {
        void *req;
        pattern_fill(buf, (size_t)(MSG_SIZE - i), (uint32_t)i);
        rc = net_isend(&n, sc, buf, (size_t)(MSG_SIZE - i), 0, mh, &req, TMO);
        if (!rc) rc = net_wait(&n, req, NULL, TMO);
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    fprintf(stderr,
            "FIGURE: %d x %d B sent on %s while another thread did %d regMr/deregMr "
            "rounds of %d buffers\n",
            MSGS, MSG_SIZE, c->dev, r.rounds, REG_BUFS + 1);
    CHECK(rc == 0);
    CHECK(r.failures == 0);
    CHECK(net_deregmr(&n, sc, mh) == 0);
    CHECK(duo_barrier(d) == 0);
    net_close_send(&n, sc);
    net_close(&n);
    free(buf);
    return 0;
}

static void test_regmr_while_sending(void **state) {
    assert_true(in_rdma_vm());
    struct cfg *c = *state;
    assert_int_equal(duo_run(receiver, sender, c, 300), 0);
}

/* ------------------------------------------------------------ v11 per-comm init */
#define COMMS  4
#define ROUNDS 5

struct comm_thread {
    const struct plugin *p;
    const char *dev;
    uint64_t comm_id;
    int failures;
};

static void *comm_main(void *arg) {
    struct comm_thread *t = arg;
    for (int i = 0; i < ROUNDS; i++) {
        void *ctx = NULL, *lc = NULL;
        ncclNetCommConfig_t cfg = {.trafficClass = -1};
        int ndev = 0, dev = -1;
        char handle[NCCL_NET_HANDLE_MAXSIZE];
        if (t->p->v11->init(&ctx, t->comm_id * 100 + (uint64_t)i, &cfg, log_capture, NULL) ||
            t->p->v11->devices(&ndev)) {
            t->failures++;
            continue;
        }
        for (int k = 0; k < ndev; k++) {
            ncclNetProperties_v11_t pr;
            if (t->p->v11->getProperties(k, &pr) == 0 && !strcmp(pr.name, t->dev)) dev = k;
        }
        if (dev < 0 || t->p->v11->listen(ctx, dev, handle, &lc) || t->p->v11->closeListen(lc))
            t->failures++;
        if (t->p->v11->finalize(ctx)) t->failures++;
    }
    return NULL;
}

static void test_v11_comms_at_once(void **state) {
    assert_true(in_rdma_vm());
    struct cfg *c = *state;
    struct plugin p;
    assert_int_equal(plugin_open(&p), 0);
    assert_non_null(p.v11);
    struct comm_thread t[COMMS];
    pthread_t th[COMMS];
    for (int i = 0; i < COMMS; i++) {
        t[i] = (struct comm_thread){.p = &p, .dev = c->dev, .comm_id = (uint64_t)i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, comm_main, &t[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < COMMS; i++) {
        pthread_join(th[i], NULL);
        failures += t[i].failures;
    }
    fprintf(stderr,
            "FIGURE: %d communicators x %d v11 init/listen/finalize rounds at once on %s: "
            "%d failure(s)\n",
            COMMS, ROUNDS, c->dev, failures);
    plugin_close(&p);
    assert_int_equal(failures, 0);
}

int main(void) {
    static struct cfg rxe = {"rxe0"}, siw = {"siw0"};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_regmr_while_sending, &rxe),
        cmocka_unit_test_prestate(test_regmr_while_sending, &siw),
        cmocka_unit_test_prestate(test_v11_comms_at_once, &rxe),
        cmocka_unit_test_prestate(test_v11_comms_at_once, &siw),
    };
    return cmocka_run_group_tests_name("integration: threads", tests, NULL, NULL);
}
