/*
 * Integration: asynchronous device events. The netdev under rxe0 is taken down while a
 * connection waits for data; the async-event thread must turn the PORT_ERR into an error
 * on the next call (not a hang); after the port is back that connection stays failed, a new
 * one in the same init moves data, and a fresh finalize/dlclose and init work. Then, on rxe0
 * and siw0, a connect begun while the link is down, and one whose hello waits for the accept
 * through a flap, wait for the link and connect once it is back.
 * Runs last in the VM (it takes eth0 and eth1 down and up again).
 */
#include "netapi.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define FLAP_MSG 65536

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Polls path until it holds want: the seconds that took, or -1 after limit_s (saying what
 * it held). */
static double wait_file_holds(const char *path, const char *want, double limit_s) {
    char buf[64] = "";
    double t0 = now_s();
    while (now_s() - t0 < limit_s) {
        FILE *f = fopen(path, "r");
        buf[0] = 0;
        if (f) {
            if (!fgets(buf, sizeof(buf), f)) buf[0] = 0;
            fclose(f);
        }
        if (strstr(buf, want)) return now_s() - t0;
        usleep(100000);
    }
    fprintf(stderr, "%s does not hold \"%s\" after %.0f s: \"%s\"\n", path, want, limit_s, buf);
    return -1;
}

/* Waits until rxe0's IPv4-mapped GID is back at index 1 after the link comes up (the kernel
 * re-adds it from a work queue); shows the link and GID table when it is not. */
static int wait_gid_back(double limit_s) {
    double t =
        wait_file_holds("/sys/class/infiniband/rxe0/ports/1/gids/1", "ffff:0a4d:0001", limit_s);
    if (t >= 0) {
        fprintf(stderr, "FIGURE: rxe0's GID 1 back %.2f s after the link came up\n", t);
        return 0;
    }
    if (system("ip addr show dev eth0 >&2; cat /sys/class/infiniband/rxe0/ports/1/state >&2; "
               "head -n1 /sys/class/infiniband/rxe0/ports/1/gids/[0-3] >&2"))
        fprintf(stderr, "(could not show the link and GID table)\n");
    return -1;
}

/* One FLAP_MSG message of pattern seed sent on sc and completed: 0, or -1 (a CHECK said). */
static int send_msg(struct netapi *n, void *sc, uint32_t seed) {
    static uint8_t buf[FLAP_MSG];
    void *mh, *req;
    pattern_fill(buf, FLAP_MSG, seed);
    CHECK(net_regmr(n, sc, buf, sizeof(buf), &mh) == 0);
    CHECK(net_isend(n, sc, buf, FLAP_MSG, 0, mh, &req, 60) == 0);
    CHECK(net_wait(n, req, NULL, 30) == 0);
    CHECK(net_deregmr(n, sc, mh) == 0);
    return 0;
}

/* One FLAP_MSG message received on rc, whole and of pattern seed: 0, or -1 (a CHECK said). */
static int recv_msg(struct netapi *n, void *rc, uint32_t seed) {
    static uint8_t buf[FLAP_MSG];
    void *mh, *req, *data = buf;
    size_t sz = sizeof(buf);
    int tag = 0, got = -1;
    CHECK(net_regmr(n, rc, buf, sizeof(buf), &mh) == 0);
    CHECK(net_irecv(n, rc, 1, &data, &sz, &tag, &mh, &req, 60) == 0);
    CHECK(net_wait(n, req, &got, 30) == 0);
    CHECK(got == FLAP_MSG && pattern_check(buf, FLAP_MSG, seed) < 0);
    CHECK(net_deregmr(n, rc, mh) == 0);
    return 0;
}

static int receiver(struct duo *d, void *arg) {
    struct netapi n;
    void *lc, *rc, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, 12, "rxe0") == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &rc, 60) == 0);
    static char buf[4096];
    CHECK(net_regmr(&n, rc, buf, sizeof(buf), &mh) == 0);
    void *data = buf;
    size_t sz = sizeof(buf);
    int tag = 0, done = 0, r = 0;
    CHECK(net_irecv(&n, rc, 1, &data, &sz, &tag, &mh, &req, 60) == 0);
    log_reset();
    CHECK(system("ip link set eth0 down") == 0);
    double t0 = now_s();
    while (!done && now_s() - t0 < 10) {
        r = net_test(&n, req, &done, NULL);
        if (r) break;
    }
    double t = now_s() - t0;
    fprintf(stderr, "FIGURE: port down on rxe0 seen by test() after %.2f s (rc %d)\n", t, r);
    CHECK(system("ip link set eth0 up") == 0);
    CHECK(wait_gid_back(30) == 0);
    CHECK(r == ncclRemoteError);
    CHECK(t < 2.0);
    CHECK(log_contains("port went down"));
    CHECK(log_contains("eth0"));
    /* the connection the down broke stays failed once the port is back */
    usleep(300000);
    CHECK(net_test(&n, req, &done, NULL) == ncclRemoteError);
    /* a new connection in the same init moves data (a link flap does not poison the device) */
    void *lc2, *rc2;
    CHECK(net_listen(&n, handle, &lc2) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc2, &rc2, 60) == 0);
    CHECK(recv_msg(&n, rc2, 42) == 0);
    fprintf(stderr,
            "FIGURE: after a port down/up on rxe0 a new connection in the same init "
            "moved %d bytes intact\n",
            FLAP_MSG);
    net_close_recv(&n, rc2);
    net_close_listen(&n, lc2);
    net_close_recv(&n, rc);
    net_close_listen(&n, lc);
    net_close(&n); /* finalize (joins the async thread) and dlclose */
    CHECK(duo_barrier(d) == 0);
    /* a second init after the event and the unload works, and sees the port ACTIVE again */
    CHECK(net_open(&n, 12, "rxe0") == 0);
    net_close(&n);
    return 0;
}

static int sender(struct duo *d, void *arg) {
    struct netapi n;
    void *sc;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, 12, "rxe0") == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &sc, 60) == 0);
    /* the receiver listens again once the port is back */
    void *sc2;
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &sc2, 60) == 0);
    CHECK(send_msg(&n, sc2, 42) == 0);
    CHECK(duo_barrier(d) == 0); /* hold the connections until the receiver is done */
    net_close_send(&n, sc2);
    net_close_send(&n, sc);
    net_close(&n);
    return 0;
}

static void test_port_down(void **state) {
    assert_true(in_rdma_vm());
    assert_int_equal(duo_run(receiver, sender, NULL, 120), 0);
}

/* A connection set up across a link flap: the sender's connect starts with the device's
 * netdev down, and the link comes back 2 s later. The plugin waits for the port (and, on
 * RoCE, its GID) within NCCL_ERDMA_CONNECT_TIMEOUT; before, both ends failed at once in the
 * QPs' RTR ("A wrong NCCL_IB_GID_INDEX is the usual cause"). */
struct flap {
    const char *dev, *netdev;
    bool mid;
};

/* Waits until dev's port is ACTIVE again, so that what runs next finds the link up. */
static int wait_port_active(const char *dev, double limit_s) {
    char path[128];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", dev);
    return wait_file_holds(path, "ACTIVE", limit_s) >= 0 ? 0 : -1;
}

/* mid: the link goes down and up while the sender's hello waits for the receiver's accept
 * (NCCL calls accept when it gets to it); else the sender's connect starts with it down. */
static int flap_receiver(struct duo *d, void *arg) {
    const struct flap *f = arg;
    struct netapi n;
    void *lc, *rc;
    char handle[NCCL_NET_HANDLE_MAXSIZE], cmd[128], sent;
    CHECK(net_open(&n, 12, f->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    if (f->mid) {
        CHECK(duo_recv(d, &sent, 1) == 0); /* its hello is in our socket */
        snprintf(cmd, sizeof(cmd), "ip link set %s down; sleep 1; ip link set %s up", f->netdev,
                 f->netdev);
        CHECK(system(cmd) == 0);
        CHECK(wait_port_active(f->dev, 30) == 0);
    }
    CHECK(net_accept(&n, lc, &rc, 60) == 0);
    CHECK(recv_msg(&n, rc, 43) == 0);
    CHECK(duo_barrier(d) == 0);
    net_close_recv(&n, rc);
    net_close_listen(&n, lc);
    net_close(&n);
    return 0;
}

static int flap_sender(struct duo *d, void *arg) {
    const struct flap *f = arg;
    struct netapi n;
    void *sc;
    char handle[NCCL_NET_HANDLE_MAXSIZE], cmd[128];
    CHECK(net_open(&n, 12, f->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    log_reset();
    if (f->mid) {
        CHECK(net_connect(&n, handle, &sc, 1) != 0); /* hello sent, no reply: the peer waits */
        CHECK(duo_send(d, "s", 1) == 0);
    } else {
        snprintf(cmd, sizeof(cmd), "ip link set %s down", f->netdev);
        CHECK(system(cmd) == 0);
        snprintf(cmd, sizeof(cmd), "(sleep 2; ip link set %s up) &", f->netdev);
        CHECK(system(cmd) == 0);
    }
    double t0 = now_s();
    int r = net_connect(&n, handle, &sc, 60); /* mid: the same connect, on */
    double t = now_s() - t0;
    fprintf(stderr, "FIGURE: %s: a connect %s: rc %d after %.2f s\n", f->dev,
            f->mid ? "whose reply came after a 1 s flap" : "begun with the link down for 2 s", r,
            t);
    CHECK(wait_port_active(f->dev, 30) == 0);
    CHECK(r == 0);
    if (!f->mid) {
        CHECK(t >= 1.5); /* it did wait for the link */
        CHECK(log_contains("waits for it"));
    }
    CHECK(send_msg(&n, sc, 43) == 0);
    CHECK(duo_barrier(d) == 0);
    net_close_send(&n, sc);
    net_close(&n);
    return 0;
}

static void test_connect_across_a_flap(void **state) {
    assert_true(in_rdma_vm());
    static const struct flap flaps[] = {{"rxe0", "eth0", false},
                                        {"siw0", "eth1", false},
                                        {"rxe0", "eth0", true},
                                        {"siw0", "eth1", true}};
    for (size_t i = 0; i < sizeof(flaps) / sizeof(flaps[0]); i++)
        assert_int_equal(duo_run(flap_receiver, flap_sender, (void *)&flaps[i], 120), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_port_down),
                                       cmocka_unit_test(test_connect_across_a_flap)};
    return cmocka_run_group_tests_name("integration: async events", tests, NULL, NULL);
}
