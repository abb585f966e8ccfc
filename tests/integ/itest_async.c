/*
 * Integration: asynchronous device events. A connection's netdev is taken down while a
 * receive waits on it: a 1 s flap fails nothing the QPs carried (rxe0) and names the link
 * where they did not (siw0); a link that stays down fails the receive once it outlasts the
 * QPs' retry window (not a hang); after each, a new connection in the same init moves data,
 * and a fresh finalize/dlclose and init work. Then, on rxe0 and siw0, a connect begun while
 * the link is down, and one whose hello waits for the accept through a flap, wait for the
 * link and connect once it is back.
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

/* Port events under an established connection, each case with a receive waiting on it:
 * - flap: the link goes down for 1 s. As in net_ib (a port error is a "non-fatal" event
 *   there), that alone fails nothing: on rxe0 the idle QPs carry it and the receive completes
 *   once the sender sends after it (until 2026-12-07 it failed at once, and the connection
 *   stayed failed); siw0 moves its QPs to error when its netdev goes down, so the receive
 *   fails, with a WARN that names the link as the likely cause.
 * - stays down (rxe0): the receive fails once the port has been down longer than the QPs'
 *   retry window (NCCL_IB_TIMEOUT=14, NCCL_IB_RETRY_CNT=1 here: 0.13 s), naming the link.
 * After each, a new connection in the same init moves data (a link flap does not poison the
 * device), and finalize, dlclose and a fresh init work. */
struct under {
    const char *dev, *netdev;
    bool stays_down; /* else a 1 s flap */
    bool survives;   /* the waiting receive completes after the flap */
};

/* Waits until dev's port is ACTIVE again, so that what runs next finds the link up. */
static int wait_port_active(const char *dev, double limit_s) {
    char path[128];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", dev);
    return wait_file_holds(path, "ACTIVE", limit_s) >= 0 ? 0 : -1;
}

/* Waits for the link's return: the port ACTIVE, and on rxe0 its GID back at index 1. */
static int link_back(const struct under *u) {
    if (wait_port_active(u->dev, 30) < 0) return -1;
    return strcmp(u->dev, "rxe0") ? 0 : wait_gid_back(30);
}

static int under_receiver(struct duo *d, void *arg) {
    const struct under *u = arg;
    struct netapi n;
    void *lc, *rc;
    char handle[NCCL_NET_HANDLE_MAXSIZE], cmd[128];
    if (u->stays_down) {
        setenv("NCCL_IB_TIMEOUT", "14", 1);
        setenv("NCCL_IB_RETRY_CNT", "1", 1);
    }
    CHECK(net_open(&n, 12, u->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &rc, 60) == 0);
    CHECK(recv_msg(&n, rc, 41) == 0); /* connected and moving data */
    static uint8_t buf[FLAP_MSG];
    void *mh, *req, *data = buf;
    size_t sz = sizeof(buf);
    int tag = 0, done = 0, r = 0, got = -1;
    CHECK(net_regmr(&n, rc, buf, sizeof(buf), &mh) == 0);
    CHECK(net_irecv(&n, rc, 1, &data, &sz, &tag, &mh, &req, 60) == 0);
    log_reset();
    snprintf(cmd, sizeof(cmd), "ip link set %s down", u->netdev);
    CHECK(system(cmd) == 0);
    double t0 = now_s(), limit = u->stays_down ? 10 : 1;
    while (!done && !r && now_s() - t0 < limit)
        r = net_test(&n, req, &done, NULL);
    double t = now_s() - t0;
    snprintf(cmd, sizeof(cmd), "ip link set %s up", u->netdev);
    CHECK(system(cmd) == 0);
    CHECK(link_back(u) == 0);
    CHECK(log_contains("port went down"));
    CHECK(log_contains(u->netdev));
    CHECK(!done);
    if (u->stays_down) {
        fprintf(stderr, "FIGURE: %s: a receive with the link down failed after %.2f s (rc %d)\n",
                u->dev, t, r);
        CHECK(r == ncclRemoteError);
        CHECK(t >= 0.12 && t < 2.0); /* the window, give or take the coarse clock's tick */
        CHECK(log_contains("longer than its QPs' retry window"));
    } else {
        if (!r && u->survives) { /* the link is back: the sender sends now */
            CHECK(duo_send(d, "g", 1) == 0);
            t0 = now_s();
            r = net_wait(&n, req, &got, 30);
            t = now_s() - t0;
        } else if (!r) {
            r = net_wait(&n, req, &got, 10); /* the QPs' flush is on its way */
        }
        if (u->survives) {
            fprintf(stderr,
                    "FIGURE: %s: a receive waiting through a 1 s link flap: rc %d, %d bytes, "
                    "%.2f s after the sender sent once the link was back\n",
                    u->dev, r, got, t);
            CHECK(r == 0 && got == FLAP_MSG && pattern_check(buf, FLAP_MSG, 42) < 0);
        } else {
            fprintf(stderr,
                    "FIGURE: %s: a receive waiting through a 1 s link flap: rc %d after %.2f s\n",
                    u->dev, r, t);
            CHECK(r == ncclRemoteError);
            CHECK(log_contains("port went down during the connection with"));
            CHECK(duo_send(d, "f", 1) == 0);
        }
    }
    /* a new connection in the same init moves data */
    void *lc2, *rc2;
    CHECK(net_listen(&n, handle, &lc2) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc2, &rc2, 60) == 0);
    CHECK(recv_msg(&n, rc2, 43) == 0);
    fprintf(stderr,
            "FIGURE: %s: after the link's return a new connection in the same init "
            "moved %d bytes intact\n",
            u->dev, FLAP_MSG);
    net_close_recv(&n, rc2);
    net_close_listen(&n, lc2);
    CHECK(net_deregmr(&n, rc, mh) == 0);
    net_close_recv(&n, rc);
    net_close_listen(&n, lc);
    net_close(&n); /* finalize (joins the async thread) and dlclose */
    CHECK(duo_barrier(d) == 0);
    /* a second init after the event and the unload works */
    CHECK(net_open(&n, 12, u->dev) == 0);
    net_close(&n);
    return 0;
}

static int under_sender(struct duo *d, void *arg) {
    const struct under *u = arg;
    struct netapi n;
    void *sc;
    char handle[NCCL_NET_HANDLE_MAXSIZE], go;
    CHECK(net_open(&n, 12, u->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &sc, 60) == 0);
    CHECK(send_msg(&n, sc, 41) == 0);
    if (!u->stays_down) {
        CHECK(duo_recv(d, &go, 1) == 0);
        if (go == 'g') CHECK(send_msg(&n, sc, 42) == 0);
    }
    /* the receiver listens again once the port is back */
    void *sc2;
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &sc2, 60) == 0);
    CHECK(send_msg(&n, sc2, 43) == 0);
    CHECK(duo_barrier(d) == 0); /* hold the connections until the receiver is done */
    net_close_send(&n, sc2);
    net_close_send(&n, sc);
    net_close(&n);
    return 0;
}

static void test_port_down(void **state) {
    assert_true(in_rdma_vm());
    static const struct under cases[] = {{"rxe0", "eth0", false, true},
                                         {"siw0", "eth1", false, false},
                                         {"rxe0", "eth0", true, false}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(duo_run(under_receiver, under_sender, (void *)&cases[i], 120), 0);
}

/* A connection set up across a link flap: the sender's connect starts with the device's
 * netdev down, and the link comes back 2 s later. The plugin waits for the port (and, on
 * RoCE, its GID) within NCCL_ERDMA_CONNECT_TIMEOUT; before, both ends failed at once in the
 * QPs' RTR ("A wrong NCCL_IB_GID_INDEX is the usual cause"). */
struct flap {
    const char *dev, *netdev;
    bool mid;
};

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
