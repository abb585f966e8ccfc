/*
 * Integration: failure handling, on every VM device (ITEST_DEVICES, default
 * "rxe0,siw0"), API v12. A dead peer, a late or missing listener, bytes that
 * are not ours, memory that cannot be registered, and many connect/close
 * cycles must each end in a clear error or clean success: never a hang, a
 * crash or a leak. Measured figures are printed as "FIGURE: ..." lines.
 *
 * ITEST_ONLY=<substring> runs only the cases whose name contains it;
 * ITEST_CYCLES=<n> sets the connect/close cycles (default 1000).
 */
#define _GNU_SOURCE
#include "netapi.h"
#include "verbs.h"
#include "wire.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define TMO          60
#define DETECT_LIMIT 2.0 /* seconds a survivor may take to notice a dead peer */
#define BIG          (64u << 20)
#define SMALL        4096

struct cfg {
    char dev[16];
    int version;
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

static void handle_ip(const void *handle, char *ip, size_t len) {
    const struct wire_handle *h = handle;
    inet_ntop(AF_INET, &h->addr.sin_addr, ip, (socklen_t)len);
}

static void handle_addr(const void *handle, char *out, size_t len) {
    const struct wire_handle *h = handle;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &h->addr.sin_addr, ip, sizeof(ip));
    snprintf(out, len, "%s:%u", ip, ntohs(h->addr.sin_port));
}

static void figure(const char *fmt, ...) {
    va_list ap;
    char line[256];
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    printf("FIGURE: %s\n", line);
    fflush(stdout);
    const char *path = getenv("ITEST_FIGURES");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%s\n", line);
        fclose(f);
    }
}

/* ------------------------------------------------------------ a survivor and a victim
 * The survivor kills the victim with SIGKILL, so duo_run (which wants both to exit 0)
 * does not fit: both run in fresh processes forked here before the plugin is loaded. */
static pid_t victim_pid;

static int pair_run(duo_fn survivor, duo_fn victim, void *arg, int timeout_s) {
    struct duo d = {0};
    if (pipe(d.to_child) || pipe(d.to_parent)) return -1;
    fflush(NULL);
    pid_t v = fork();
    if (v == 0) {
        d.is_child = 1;
        alarm((unsigned)timeout_s);
        int rc = victim(&d, arg);
        fflush(NULL);
        _exit(rc == 0 ? 0 : 1);
    }
    victim_pid = v;
    pid_t s = fork();
    if (s == 0) {
        d.is_child = 0;
        alarm((unsigned)timeout_s + ROLE_BACKSTOP_S);
        int rc = survivor(&d, arg);
        fflush(NULL);
        _exit(rc == 0 ? 0 : 1);
    }
    close(d.to_child[0]);
    close(d.to_child[1]);
    close(d.to_parent[0]);
    close(d.to_parent[1]);
    int ok = s > 0 && role_reap(s, now_s() + timeout_s, "survivor") == 0;
    if (v > 0) {
        kill(v, SIGKILL);
        waitpid(v, NULL, 0);
    }
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------ scenarios: peer death */
struct side {
    struct netapi n;
    void *lc, *comm, *mh;
    uint8_t *buf;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    char ip[INET_ADDRSTRLEN];
};

static int recv_open(struct duo *d, const struct cfg *c, struct side *s, size_t len) {
    CHECK(net_open(&s->n, c->version, c->dev) == 0);
    CHECK(net_listen(&s->n, s->handle, &s->lc) == 0);
    handle_ip(s->handle, s->ip, sizeof(s->ip));
    CHECK(duo_send(d, s->handle, sizeof(s->handle)) == 0);
    CHECK(net_accept(&s->n, s->lc, &s->comm, TMO) == 0);
    CHECK((s->buf = page_alloc(len)) != NULL);
    CHECK(net_regmr(&s->n, s->comm, s->buf, len, &s->mh) == 0);
    return 0;
}

static int send_open(struct duo *d, const struct cfg *c, struct side *s, size_t len) {
    CHECK(net_open(&s->n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, s->handle, sizeof(s->handle)) == 0);
    handle_ip(s->handle, s->ip, sizeof(s->ip));
    CHECK(net_connect(&s->n, s->handle, &s->comm, TMO) == 0);
    CHECK((s->buf = page_alloc(len)) != NULL);
    pattern_fill(s->buf, len, 1);
    CHECK(net_regmr(&s->n, s->comm, s->buf, len, &s->mh) == 0);
    return 0;
}

static int post_recv(struct side *s, size_t len, void **req) {
    void *data = s->buf;
    int tag = 0;
    return net_irecv(&s->n, s->comm, 1, &data, &len, &tag, &s->mh, req, TMO);
}

static int kill_victim(double *t0) {
    CHECK(kill(victim_pid, SIGKILL) == 0);
    *t0 = now_s();
    return 0;
}

/* After the kill: the survivor's next calls must fail with ncclRemoteError within
 * DETECT_LIMIT, and the WARN must name the peer's address and the device. */
static int expect_detected(struct side *s, const struct cfg *c, double t0, int rc,
                           const char *what) {
    double dt = now_s() - t0;
    fprintf(stderr, "%s on %s: rc %d after %.3f s\n", what, c->dev, rc, dt);
    CHECK(rc != 0);
    CHECK(rc == ncclRemoteError);
    CHECK(dt < DETECT_LIMIT);
    if (!log_contains(s->ip) || !log_contains(c->dev))
        fprintf(stderr, "log does not name the peer %s and the device %s:\n%s", s->ip, c->dev,
                log_text());
    CHECK(log_contains(s->ip));
    CHECK(log_contains(c->dev));
    figure("peer-death detection on %s, %s: %.2f s", c->dev, what, dt);
    return 0;
}

/* test() a request until it fails or the limit passes; a request that completes (the
 * transfer beat the kill) is replaced by a fresh receive/send through repost. */
static int wait_for_error(struct side *s, void *req, int (*repost)(struct side *, void **),
                          double t0, int *rc_out) {
    int rc = 0, done = 0, sizes[8];
    while (now_s() - t0 < 5 * DETECT_LIMIT) {
        rc = net_test(&s->n, req, &done, sizes);
        if (rc) break;
        if (done) {
            fprintf(stderr, "  (the request completed before the kill took effect; reposting)\n");
            done = 0;
            req = NULL;
            rc = repost(s, &req);
            if (rc) break;
            if (!req) continue;
        }
    }
    *rc_out = rc;
    return 0;
}

static int repost_recv(struct side *s, void **req) {
    void *data = s->buf;
    size_t len = BIG;
    int tag = 0;
    *req = NULL;
    double end = now_s() + 5 * DETECT_LIMIT;
    while (!*req && now_s() < end) {
        void *ph[8] = {0};
        int rc = s->n.p.v12->irecv(s->comm, 1, &data, &len, &tag, &s->mh, ph, req);
        if (rc) return rc;
    }
    return 0;
}

static int repost_send(struct side *s, void **req) {
    *req = NULL;
    double end = now_s() + 5 * DETECT_LIMIT;
    while (!*req && now_s() < end) {
        int rc = s->n.p.v12->isend(s->comm, s->buf, BIG, 0, s->mh, NULL, req);
        if (rc) return rc;
    }
    return 0;
}

/* Receiver survives; the sender dies while a 64 MiB message is on the wire. */
static int death_rs_mid_recv(struct duo *d, void *arg) {
    struct side s;
    void *req;
    double t0;
    int rc;
    char b;
    CHECK(recv_open(d, arg, &s, BIG) == 0);
    CHECK(post_recv(&s, BIG, &req) == 0);
    CHECK(duo_recv(d, &b, 1) == 0); /* the sender has posted its isend */
    log_reset();
    CHECK(kill_victim(&t0) == 0);
    CHECK(wait_for_error(&s, req, repost_recv, t0, &rc) == 0);
    return expect_detected(&s, arg, t0, rc, "sender killed mid-transfer, receiver survives");
}

static int death_rs_mid_send(struct duo *d, void *arg) {
    struct side s;
    void *req;
    CHECK(send_open(d, arg, &s, BIG) == 0);
    CHECK(net_isend(&s.n, s.comm, s.buf, BIG, 0, s.mh, &req, TMO) == 0);
    CHECK(duo_send(d, "x", 1) == 0);
    for (int i = 0; i < 100000; i++) /* keep the transfer going until the kill */
        net_test(&s.n, req, &(int){0}, NULL);
    pause();
    return 0;
}

/* Receiver survives with a receive posted; the sender dies between messages. */
static int death_rs_idle_recv(struct duo *d, void *arg) {
    struct side s;
    void *req;
    double t0;
    int rc;
    char b;
    CHECK(recv_open(d, arg, &s, SMALL) == 0);
    CHECK(post_recv(&s, SMALL, &req) == 0);
    CHECK(duo_recv(d, &b, 1) == 0);
    log_reset();
    CHECK(kill_victim(&t0) == 0);
    CHECK(wait_for_error(&s, req, repost_recv, t0, &rc) == 0);
    return expect_detected(&s, arg, t0, rc, "sender killed between messages, receiver survives");
}

static int death_rs_idle_send(struct duo *d, void *arg) {
    struct side s;
    CHECK(send_open(d, arg, &s, SMALL) == 0);
    CHECK(duo_send(d, "x", 1) == 0);
    pause();
    return 0;
}

/* Sender survives; the receiver dies while the sender's 64 MiB are on the wire. */
static int death_sr_mid_send(struct duo *d, void *arg) {
    struct side s;
    void *req;
    double t0;
    int rc;
    char b;
    CHECK(send_open(d, arg, &s, BIG) == 0);
    CHECK(duo_recv(d, &b, 1) == 0); /* the receiver has posted its irecv */
    CHECK(net_isend(&s.n, s.comm, s.buf, BIG, 0, s.mh, &req, TMO) == 0);
    log_reset();
    CHECK(kill_victim(&t0) == 0);
    CHECK(wait_for_error(&s, req, repost_send, t0, &rc) == 0);
    return expect_detected(&s, arg, t0, rc, "receiver killed mid-transfer, sender survives");
}

static int death_sr_mid_recv(struct duo *d, void *arg) {
    struct side s;
    void *req;
    CHECK(recv_open(d, arg, &s, BIG) == 0);
    CHECK(post_recv(&s, BIG, &req) == 0);
    CHECK(duo_send(d, "x", 1) == 0);
    for (;;)
        net_test(&s.n, req, &(int){0}, NULL);
    return 0;
}

/* Sender survives and keeps trying to send; the receiver dies without posting. */
static int death_sr_idle_send(struct duo *d, void *arg) {
    struct side s;
    void *req = NULL;
    double t0;
    int rc = 0;
    char b;
    CHECK(send_open(d, arg, &s, SMALL) == 0);
    CHECK(duo_recv(d, &b, 1) == 0);
    log_reset();
    CHECK(kill_victim(&t0) == 0);
    while (now_s() - t0 < 5 * DETECT_LIMIT) {
        rc = s.n.p.v12->isend(s.comm, s.buf, SMALL, 0, s.mh, NULL, &req);
        CHECK(req == NULL); /* nobody could have sent a clear-to-send */
        if (rc) break;
    }
    return expect_detected(&s, arg, t0, rc, "receiver killed between messages, sender survives");
}

static int death_sr_idle_recv(struct duo *d, void *arg) {
    struct side s;
    CHECK(recv_open(d, arg, &s, SMALL) == 0);
    CHECK(duo_send(d, "x", 1) == 0);
    pause();
    return 0;
}

/* A peer that dies inside the rdma_cm part of the handshake: the victim loads librdmacm
 * through tests/integ/cm_shim.c with CM_SHIM_DIE_IN naming the call it dies in (SIGKILL, as
 * the OOM killer would). The survivor's accept or connect must fail within
 * HANDSHAKE_DEATH_LIMIT with a WARN that names the device and the peer, not after
 * NCCL_ERDMA_CONNECT_TIMEOUT (60 s here); the survivor gives up looking at 20 s. The time runs
 * from the handle's hand-over, so it holds the victim's own handshake up to its death: 0.1 s
 * idle, up to 1.5 s with the host's two cores busy. */
#define HANDSHAKE_DEATH_LIMIT 10.0
/* Makes the plugin load librdmacm through tests/integ/cm_shim.c (ITEST_CM_SHIM, set by CMake:
 * a case that needs it cannot run without it) and returns the test's own handle to the shim,
 * for its controls; NULL when it cannot. */
static void *cm_shim_load(void) {
    const char *path = getenv("ITEST_CM_SHIM");
    if (!path) {
        fprintf(stderr, "ITEST_CM_SHIM is not set\n");
        return NULL;
    }
    setenv("NCCL_ERDMA_RDMACM_LIB", path, 1);
    return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

static int cm_victim_env(const char *die_in) {
    const char *path = getenv("ITEST_CM_SHIM");
    CHECK(path != NULL); /* set by CMake: the case cannot run without it */
    setenv("NCCL_ERDMA_RDMACM_LIB", path, 1);
    setenv("CM_SHIM_DIE_IN", die_in, 1);
    return 0;
}

static int handshake_death_seen(const struct cfg *c, const struct side *s, double t0, int rc,
                                const char *what, const char *why) {
    double dt = now_s() - t0;
    fprintf(stderr, "%s on %s: rc %d after %.3f s\n", what, c->dev, rc, dt);
    if (rc == 0 || !log_contains(why)) fprintf(stderr, "log:\n%s", log_text());
    CHECK(rc == ncclRemoteError);
    CHECK(dt < HANDSHAKE_DEATH_LIMIT);
    CHECK(log_contains(c->dev) && log_contains(s->ip) && log_contains(why));
    figure("peer death in the rdma_cm handshake on %s, %s: failed after %.2f s", c->dev, what, dt);
    return 0;
}

/* A receiver whose sender dies in the handshake: accept must fail, saying `why`. */
static int cm_sender_death_seen(struct duo *d, const struct cfg *c, const char *what,
                                const char *why) {
    struct side s;
    void *comm = NULL;
    int rc = 0;
    CHECK(net_open(&s.n, c->version, c->dev) == 0);
    CHECK(net_listen(&s.n, s.handle, &s.lc) == 0);
    handle_ip(s.handle, s.ip, sizeof(s.ip));
    log_reset();
    CHECK(duo_send(d, s.handle, sizeof(s.handle)) == 0);
    double t0 = now_s();
    while (!comm && !rc && now_s() - t0 < 20) {
        ncclNetDeviceHandle_t *dh = NULL;
        rc = s.n.t12->accept(s.lc, &comm, &dh);
    }
    CHECK(comm == NULL);
    return handshake_death_seen(c, &s, t0, rc, what, why);
}

/* The sender dies as it starts its rdma_cm requests, after the receiver's reply. */
static int cm_death_sender_survivor(struct duo *d, void *arg) {
    return cm_sender_death_seen(d, arg, "sender died starting its rdma_cm requests",
                                "closed the connection after our reply");
}

/* A sender that connects and dies in it, where CM_SHIM_DIE_IN=die_in says. */
static int cm_sender_dies_in(struct duo *d, const struct cfg *c, const char *die_in) {
    struct side s;
    void *comm;
    CHECK(cm_victim_env(die_in) == 0);
    CHECK(net_open(&s.n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, s.handle, sizeof(s.handle)) == 0);
    net_connect(&s.n, s.handle, &comm, TMO); /* dies in it */
    fprintf(stderr, "the victim's connect returned: CM_SHIM_DIE_IN did not apply\n");
    return -1;
}

static int cm_death_sender_victim(struct duo *d, void *arg) {
    return cm_sender_dies_in(d, arg, "rdma_resolve_addr");
}

/* The sender's QPs are up and its ready message is out, but its warm-ups are lost (as siw
 * now and then sits on one), and it dies before it says them again: the receiver waits for
 * them with nothing to tell it the sender is gone but the socket's end. */
static int cm_death_warmup_survivor(struct duo *d, void *arg) {
    return cm_sender_death_seen(d, arg, "sender died before its warm-ups arrived",
                                "closed the connection after its ready message");
}

static int cm_death_warmup_victim(struct duo *d, void *arg) {
    return cm_sender_dies_in(d, arg, "warmup_repeat"); /* at the warm-up's repeat */
}

/* The same wait, ended by the sender's rdma_cm disconnect while its socket stays open: the
 * path a killed sender takes when its DREQ overtakes its socket's end. The user is told the
 * same thing either way. */
static int cm_disconnect_warmup_survivor(struct duo *d, void *arg) {
    CHECK(cm_sender_death_seen(d, arg, "sender disconnected before its warm-ups arrived",
                               "closed the connection after its ready message") == 0);
    CHECK(log_contains("rdma_cm reports")); /* the disconnect, not the socket, was seen */
    return 0;
}

static int cm_disconnect_warmup_victim(struct duo *d, void *arg) {
    return cm_sender_dies_in(d, arg, "warmup_disconnect"); /* hangs; the runner kills it */
}

/* The receiver dies as it accepts the sender's rdma_cm request. */
static int cm_death_receiver_survivor(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct side s;
    void *comm = NULL;
    int rc = 0;
    CHECK(net_open(&s.n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, s.handle, sizeof(s.handle)) == 0);
    handle_ip(s.handle, s.ip, sizeof(s.ip));
    log_reset();
    double t0 = now_s();
    while (!comm && !rc && now_s() - t0 < 20) {
        ncclNetDeviceHandle_t *dh = NULL;
        rc = s.n.p.v12->connect(s.n.ctx, s.n.dev, s.handle, &comm, &dh);
    }
    CHECK(comm == NULL);
    return handshake_death_seen(c, &s, t0, rc, "receiver died accepting our rdma_cm request",
                                "rdma_cm");
}

static int cm_death_receiver_victim(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct side s;
    CHECK(cm_victim_env("rdma_accept") == 0);
    CHECK(net_open(&s.n, c->version, c->dev) == 0);
    CHECK(net_listen(&s.n, s.handle, &s.lc) == 0);
    CHECK(duo_send(d, s.handle, sizeof(s.handle)) == 0);
    net_accept(&s.n, s.lc, &s.comm, TMO); /* dies in it */
    fprintf(stderr, "the victim's accept returned: CM_SHIM_DIE_IN did not apply\n");
    return -1;
}

/* ------------------------------------------------------------ scenarios: start-up order */
/* A small transfer over a fresh connection proves it really works. */
static int small_exchange_recv(struct netapi *n, void *comm) {
    uint8_t *buf = page_alloc(SMALL);
    void *mh, *req, *data = buf;
    size_t len = SMALL;
    int tag = 0, got = -1;
    CHECK(buf);
    CHECK(net_regmr(n, comm, buf, SMALL, &mh) == 0);
    CHECK(net_irecv(n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
    CHECK(net_wait(n, req, &got, TMO) == 0);
    CHECK(got == 1000 && pattern_check(buf, 1000, 9) < 0);
    CHECK(net_deregmr(n, comm, mh) == 0);
    free(buf);
    return 0;
}

static int small_exchange_send(struct netapi *n, void *comm) {
    uint8_t *buf = page_alloc(SMALL);
    void *mh, *req;
    CHECK(buf);
    pattern_fill(buf, 1000, 9);
    CHECK(net_regmr(n, comm, buf, SMALL, &mh) == 0);
    CHECK(net_isend(n, comm, buf, 1000, 0, mh, &req, TMO) == 0);
    CHECK(net_wait(n, req, NULL, TMO) == 0);
    CHECK(net_deregmr(n, comm, mh) == 0);
    free(buf);
    return 0;
}

/* A TCP relay whose listening socket appears late: the handle points at it, so the
 * connecting side finds no listener for the first second (ECONNREFUSED). */
struct relay {
    int lfd, a, b;
    struct sockaddr_in to;
    pthread_t th;
    volatile int stop;
};

static void *relay_main(void *arg) {
    struct relay *r = arg;
    r->a = accept(r->lfd, NULL, NULL);
    if (r->a < 0) return NULL;
    r->b = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(r->b, (struct sockaddr *)&r->to, sizeof(r->to))) return NULL;
    char buf[4096];
    while (!r->stop) {
        struct pollfd p[2] = {{.fd = r->a, .events = POLLIN}, {.fd = r->b, .events = POLLIN}};
        if (poll(p, 2, 100) <= 0) continue;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents) continue;
            ssize_t n = read(p[i].fd, buf, sizeof(buf));
            if (n <= 0) return NULL;
            if (write(i ? r->a : r->b, buf, (size_t)n) != n) return NULL;
        }
    }
    return NULL;
}

static int late_listener_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    struct relay r = {.lfd = -1, .a = -1, .b = -1};
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    struct wire_handle *h = (struct wire_handle *)handle;
    r.to = h->addr;
    /* reserve a port but do not listen on it yet: connects to it are refused */
    struct sockaddr_in late = h->addr;
    socklen_t alen = sizeof(late);
    late.sin_port = 0;
    r.lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(bind(r.lfd, (struct sockaddr *)&late, sizeof(late)) == 0);
    CHECK(getsockname(r.lfd, (struct sockaddr *)&late, &alen) == 0);
    h->addr.sin_port = late.sin_port;
    wire_handle_seal(h);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    char go;
    CHECK(duo_recv(d, &go, 1) == 0); /* the sender is connecting: refuse it for a second */
    sleep(1);
    double listen_at = now_s(); /* CLOCK_MONOTONIC: one clock for both processes */
    CHECK(listen(r.lfd, 4) == 0);
    CHECK(duo_send(d, &listen_at, sizeof(listen_at)) == 0);
    CHECK(pthread_create(&r.th, NULL, relay_main, &r) == 0);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    CHECK(small_exchange_recv(&n, comm) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_close_recv(&n, comm) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    r.stop = 1;
    pthread_join(r.th, NULL);
    close(r.lfd);
    close(r.a);
    close(r.b);
    net_close(&n);
    return 0;
}

static int late_listener_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    /* The receiver listens a second after this word, whatever the load: the connect is
     * refused for that long by construction (timing it from the handle's arrival failed
     * on a loaded host, the handle having come late). */
    double t0 = now_s();
    CHECK(duo_send(d, "c", 1) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    double t1 = now_s(), listen_at = 0;
    CHECK(duo_recv(d, &listen_at, sizeof(listen_at)) == 0);
    figure("connect before the listener exists on %s: refused for %.2f s, connected %.2f s "
           "after the listener came up",
           c->dev, listen_at - t0, t1 - listen_at);
    CHECK(listen_at - t0 >= 1.0 && t1 >= listen_at);
    CHECK(small_exchange_send(&n, comm) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    return 0;
}

/* The listener exists but accept() starts a second late. */
static int late_accept_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    sleep(1);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    CHECK(small_exchange_recv(&n, comm) == 0);
    CHECK(net_close_recv(&n, comm) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

static int late_accept_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    CHECK(small_exchange_send(&n, comm) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ scenarios: normal close
 * A sender that closes as soon as its last send completes. On iWARP a send completes once it
 * is in TCP, and the closing side says goodbye on the out-of-band socket: the receiver must
 * take the goodbye for a normal close and still complete what lands, not fail with "the peer
 * closed". Several rounds, small and big messages, one listen comm. */
#define CLOSE_ROUNDS 6

static size_t close_round_size(int r) {
    return r % 2 ? (8u << 20) : 1000;
}

static int close_at_once_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(8u << 20);
    CHECK(buf);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    for (int r = 0; r < CLOSE_ROUNDS; r++) {
        void *comm, *mh, *req, *data = buf;
        size_t len = close_round_size(r);
        int tag = 0, got = -1;
        memset(buf, 0, len);
        CHECK(net_accept(&n, lc, &comm, TMO) == 0);
        CHECK(net_regmr(&n, comm, buf, len, &mh) == 0);
        CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(got == (int)len && pattern_check(buf, len, 5 + r) < 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(net_close_recv(&n, comm) == 0);
    }
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

static int close_at_once_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(8u << 20);
    CHECK(buf);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    for (int r = 0; r < CLOSE_ROUNDS; r++) {
        void *comm, *mh, *req;
        size_t len = close_round_size(r);
        int got = -1;
        pattern_fill(buf, len, 5 + r);
        CHECK(net_connect(&n, handle, &comm, TMO) == 0);
        CHECK(net_regmr(&n, comm, buf, len, &mh) == 0);
        CHECK(net_isend(&n, comm, buf, len, 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(net_close_send(&n, comm) == 0);
    }
    net_close(&n);
    free(buf);
    return 0;
}

/* How long NCCL's thread spends in each close in rdma_cm mode (siw0, and rxe0 with
 * NCCL_ERDMA_CONNECT_MODE=rdmacm). Odd cycles: the receiver closes while the sender still
 * holds its end (NCCL's ranks close in no common order), then the sender closes; even
 * cycles: both close at once. Then finalize right after a close, which waits for the
 * teardown still running in the background. Figures only. */
#define CLOSE_LAT_CYCLES 12

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void close_figure(const struct cfg *c, const char *what, double *ms, int n) {
    qsort(ms, (size_t)n, sizeof(*ms), cmp_double);
    figure("%s on %s (rdma_cm mode), %d comms: median %.2f ms, max %.2f ms", what, c->dev, n,
           ms[n / 2], ms[n - 1]);
}

static int close_lat_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    double first_ms[CLOSE_LAT_CYCLES / 2], both_ms[CLOSE_LAT_CYCLES / 2],
        listen_ms[CLOSE_LAT_CYCLES];
    uint8_t *buf = page_alloc(SMALL);
    CHECK(buf);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i < CLOSE_LAT_CYCLES; i++) {
        void *lc, *comm, *mh, *req, *data = buf;
        size_t len = SMALL;
        int tag = 0, got = -1;
        CHECK(net_listen(&n, handle, &lc) == 0);
        CHECK(duo_send(d, handle, sizeof(handle)) == 0);
        CHECK(net_accept(&n, lc, &comm, TMO) == 0);
        CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
        CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(got == 100 + i && pattern_check(buf, (size_t)got, (uint32_t)i) < 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(duo_barrier(d) == 0);
        double t0 = now_s();
        CHECK(net_close_recv(&n, comm) == 0);
        double t1 = now_s();
        CHECK(net_close_listen(&n, lc) == 0);
        (i % 2 ? first_ms : both_ms)[i / 2] = 1000 * (t1 - t0);
        listen_ms[i] = 1000 * (now_s() - t1);
        CHECK(duo_barrier(d) == 0);
    }
    close_figure(c, "closeRecv, the peer still open", first_ms, CLOSE_LAT_CYCLES / 2);
    close_figure(c, "closeRecv, the peer closing too", both_ms, CLOSE_LAT_CYCLES / 2);
    close_figure(c, "closeListen", listen_ms, CLOSE_LAT_CYCLES);
    /* a last comm closed while the peer holds its end, then finalize at once: it waits for
     * that teardown */
    void *lc, *comm;
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    CHECK(duo_barrier(d) == 0);
    double t0 = now_s();
    CHECK(net_close_recv(&n, comm) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    double t1 = now_s();
    net_close(&n);
    figure("closeRecv + closeListen with the peer still open on %s: %.2f ms; finalize right "
           "after: %.1f ms",
           c->dev, 1000 * (t1 - t0), 1000 * (now_s() - t1));
    CHECK(duo_barrier(d) == 0);
    free(buf);
    return 0;
}

static int close_lat_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    double after_ms[CLOSE_LAT_CYCLES / 2], both_ms[CLOSE_LAT_CYCLES / 2];
    uint8_t *buf = page_alloc(SMALL);
    CHECK(buf);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i < CLOSE_LAT_CYCLES; i++) {
        void *comm, *mh, *req;
        CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
        CHECK(net_connect(&n, handle, &comm, TMO) == 0);
        pattern_fill(buf, 100 + (size_t)i, (uint32_t)i);
        CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
        CHECK(net_isend(&n, comm, buf, 100 + (size_t)i, 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, NULL, TMO) == 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(duo_barrier(d) == 0);
        if (i % 2) CHECK(duo_barrier(d) == 0); /* the receiver has closed */
        double t0 = now_s();
        CHECK(net_close_send(&n, comm) == 0);
        (i % 2 ? after_ms : both_ms)[i / 2] = 1000 * (now_s() - t0);
        if (!(i % 2)) CHECK(duo_barrier(d) == 0);
    }
    close_figure(c, "closeSend, the peer closed before", after_ms, CLOSE_LAT_CYCLES / 2);
    close_figure(c, "closeSend, the peer closing too", both_ms, CLOSE_LAT_CYCLES / 2);
    void *comm;
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(duo_barrier(d) == 0); /* the receiver has closed and finalized */
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

/* A sender that closes normally without sending what the receiver waits for: the receive must
 * fail (the ranks disagree), within a bound and with a WARN naming the peer, never hang. */
#define CLOSE_UNMATCHED_LIMIT 5.0

static int close_unmatched_recv(struct duo *d, void *arg) {
    struct side s;
    void *req;
    int got = -1;
    CHECK(recv_open(d, arg, &s, SMALL) == 0);
    CHECK(post_recv(&s, SMALL, &req) == 0);
    log_reset();
    CHECK(duo_barrier(d) == 0); /* the sender closes now */
    double t0 = now_s();
    int rc = net_wait(&s.n, req, &got, TMO);
    double dt = now_s() - t0;
    figure("peer closed normally with a receive unmatched on %s: error %d after %.2f s",
           ((const struct cfg *)arg)->dev, rc, dt);
    CHECK(rc == ncclRemoteError);
    CHECK(dt < CLOSE_UNMATCHED_LIMIT);
    CHECK(log_contains(s.ip));
    /* a normal close says goodbye in every mode: never reported as a death */
    CHECK(!log_contains("node died"));
    return 0;
}

static int close_unmatched_send(struct duo *d, void *arg) {
    struct side s;
    CHECK(send_open(d, arg, &s, SMALL) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_deregmr(&s.n, s.comm, s.mh) == 0);
    CHECK(net_close_send(&s.n, s.comm) == 0);
    net_close(&s.n);
    return 0;
}

/* A wait with no message moving (NCCL_ERDMA_STALL_WARN=1 here): a sender whose peer posts no
 * receive, then a receiver whose peer does not send, each WARNs once, naming the device and the
 * peer, and the transfer goes on once the peer acts (no error: the plugin keeps waiting). */
static int stall_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct side s;
    void *req;
    int got = -1;
    CHECK(recv_open(d, c, &s, SMALL) == 0);
    CHECK(duo_barrier(d) == 0); /* the sender waits for a receive */
    CHECK(duo_barrier(d) == 0); /* it has WARNed: now post it */
    CHECK(post_recv(&s, SMALL, &req) == 0);
    CHECK(net_wait(&s.n, req, &got, TMO) == 0 && got == SMALL);
    log_reset();
    CHECK(post_recv(&s, SMALL, &req) == 0);
    double t0 = now_s();
    while (!log_contains("no message has arrived from") && now_s() - t0 < 30) {
        int done = 0;
        CHECK(net_test(&s.n, req, &done, &got) == 0 && !done);
    }
    figure("receiver on %s: stall WARN after %.2f s (NCCL_ERDMA_STALL_WARN=1)", c->dev,
           now_s() - t0);
    if (!log_contains(s.ip) || !log_contains(c->dev)) fprintf(stderr, "%s", log_text());
    CHECK(log_contains("no message has arrived from") && log_contains(s.ip));
    CHECK(log_contains(c->dev));
    CHECK(duo_barrier(d) == 0); /* now the sender sends */
    CHECK(net_wait(&s.n, req, &got, TMO) == 0 && got == SMALL);
    CHECK(pattern_check(s.buf, SMALL, 1) == -1);
    CHECK(net_deregmr(&s.n, s.comm, s.mh) == 0);
    CHECK(net_close_recv(&s.n, s.comm) == 0);
    CHECK(net_close_listen(&s.n, s.lc) == 0);
    net_close(&s.n);
    return 0;
}

static int stall_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct side s;
    void *req = NULL;
    CHECK(send_open(d, c, &s, SMALL) == 0);
    CHECK(duo_barrier(d) == 0);
    log_reset();
    double t0 = now_s();
    int rc = net_isend(&s.n, s.comm, s.buf, SMALL, 0, s.mh, &req, 3); /* none posted: 3 s */
    figure("sender on %s: isend without a receive gave %d after %.2f s", c->dev, rc, now_s() - t0);
    CHECK(rc == ncclSystemError && req == NULL); /* the harness's timeout: no request came */
    char peer[64]; /* the listener's address and port: both ranks share the VM's address */
    handle_addr(s.handle, peer, sizeof(peer));
    if (!log_contains(peer) || !log_contains(c->dev)) fprintf(stderr, "%s", log_text());
    CHECK(log_contains("has posted no receive for our sends") && log_contains(peer));
    CHECK(log_contains(c->dev));
    CHECK(duo_barrier(d) == 0);
    CHECK(net_isend(&s.n, s.comm, s.buf, SMALL, 0, s.mh, &req, TMO) == 0);
    CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    CHECK(duo_barrier(d) == 0); /* the receiver has WARNed of this send's absence */
    CHECK(net_isend(&s.n, s.comm, s.buf, SMALL, 0, s.mh, &req, TMO) == 0);
    CHECK(net_wait(&s.n, req, NULL, TMO) == 0);
    CHECK(net_deregmr(&s.n, s.comm, s.mh) == 0);
    CHECK(net_close_send(&s.n, s.comm) == 0);
    net_close(&s.n);
    return 0;
}

/* connect() to a handle nobody listens on any more must fail after
 * NCCL_ERDMA_CONNECT_TIMEOUT (2 s here), naming the address. */
static int try_dead_handle(struct netapi *n, const struct cfg *c, char *handle, const char *what) {
    char addr[64];
    void *comm = NULL;
    handle_addr(handle, addr, sizeof(addr));
    log_reset();
    double t0 = now_s();
    int rc = net_connect(n, handle, &comm, 30);
    double dt = now_s() - t0;
    fprintf(stderr, "%s: connect rc %d after %.2f s\n", what, rc, dt);
    CHECK(rc == ncclRemoteError && comm == NULL);
    /* at the timeout, not before; the upper bound leaves a starved host seconds, and still
     * tells the knob from the 120 s default */
    CHECK(dt >= 1.5 && dt < 10.0);
    if (!log_contains(addr)) fprintf(stderr, "WARN does not name %s:\n%s", addr, log_text());
    CHECK(log_contains(addr));
    CHECK(log_contains(c->dev));
    figure("%s on %s: error after %.2f s (NCCL_ERDMA_CONNECT_TIMEOUT=2)", what, c->dev, dt);
    return 0;
}

static int dead_handle_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc;
    char handle[NCCL_NET_HANDLE_MAXSIZE], other[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    memcpy(other, handle, sizeof(other));
    CHECK(try_dead_handle(&n, c, handle, "stale handle (listen comm closed)") == 0);
    /* a port that is bound but never listens: refused on every try */
    struct wire_handle *h = (struct wire_handle *)other;
    struct sockaddr_in a = h->addr;
    socklen_t alen = sizeof(a);
    a.sin_port = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    h->addr.sin_port = a.sin_port;
    wire_handle_seal(h);
    CHECK(try_dead_handle(&n, c, other, "closed port") == 0);
    close(fd);
    net_close(&n);
    return 0;
}

static int nothing(struct duo *d, void *arg) {
    return 0;
}

/* ------------------------------------------------------------ scenarios: bad input */
static int bad_handle_one(struct netapi *n, const void *bytes, const char *expect,
                          const char *what) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *comm = (void *)1;
    memcpy(handle, bytes, sizeof(handle));
    log_reset();
    double t0 = now_s();
    int rc = n->p.v12->connect(n->ctx, n->dev, handle, &comm, &(ncclNetDeviceHandle_t *){NULL});
    if (rc == ncclSuccess || !log_contains(expect))
        fprintf(stderr, "%s: connect rc %d in %.3f s\n", what, rc, now_s() - t0);
    CHECK(rc != ncclSuccess && comm == NULL);
    CHECK(now_s() - t0 < 1.0);
    if (!log_contains(expect)) fprintf(stderr, "expected \"%s\" in:\n%s", expect, log_text());
    CHECK(log_contains(expect));
    return 0;
}

static int bad_handles_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc;
    uint8_t bytes[NCCL_NET_HANDLE_MAXSIZE], good[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, good, &lc) == 0);

    srand(7);
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < sizeof(bytes); i++)
            bytes[i] = (uint8_t)rand();
        CHECK(bad_handle_one(&n, bytes, "not an eRDMA plugin handle", "garbage handle") == 0);
    }
    memset(bytes, 0, sizeof(bytes));
    CHECK(bad_handle_one(&n, bytes, "not an eRDMA plugin handle", "all-zero handle") == 0);

    /* NCCL's IB transport handle: a socket address first, then its own magic */
    const struct wire_handle *gh = (const struct wire_handle *)good;
    memset(bytes, 0, sizeof(bytes));
    memcpy(bytes, &gh->addr, sizeof(gh->addr));
    uint64_t ib_magic = 0xa3bfc9d6b1e45a6eull;
    memcpy(bytes + 28, &ib_magic, sizeof(ib_magic));
    CHECK(bad_handle_one(&n, bytes, "not an eRDMA plugin handle", "another plugin's handle") == 0);

    memcpy(bytes, good, sizeof(bytes));
    ((struct wire_handle *)bytes)->addr.sin_port ^= 0x0101; /* flipped in transit */
    CHECK(bad_handle_one(&n, bytes, "checksum", "corrupted handle") == 0);

    memcpy(bytes, good, sizeof(bytes));
    struct wire_handle *vh = (struct wire_handle *)bytes;
    vh->version = WIRE_VERSION + 1;
    vh->checksum = wire_checksum(vh, offsetof(struct wire_handle, checksum));
    CHECK(bad_handle_one(&n, bytes, "version", "newer plugin's handle") == 0);

    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    figure("bad handles on %s: 20 random, zero, foreign, corrupted, wrong version: each a clean "
           "error",
           c->dev);
    return 0;
}

/* A raw TCP client on the listener's address that is not an eRDMA peer. */
enum stray { STRAY_GARBAGE, STRAY_SHORT, STRAY_OVERSIZED, STRAY_EMPTY, STRAY_HOLD, STRAY_NSTRAYS };
static const char *const stray_names[] = {"garbage", "short message then close",
                                          "oversized message", "connect then close",
                                          "short message, connection held"};

static int stray_connect(const void *handle, enum stray kind) {
    const struct wire_handle *h = handle;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (const struct sockaddr *)&h->addr, sizeof(h->addr)) == 0);
    uint8_t buf[65536];
    size_t len = 0;
    srand(11);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)rand();
    switch (kind) {
    case STRAY_GARBAGE:
        len = 300;
        break;
    case STRAY_SHORT:
    case STRAY_HOLD: {
        struct wire_conn_msg m = {0};
        wire_msg_seal(&m, MSG_HELLO);
        memcpy(buf, &m, 10);
        len = 10;
        break;
    }
    case STRAY_OVERSIZED: {
        /* a real-looking header announcing a huge message, and lots of bytes after it */
        struct wire_conn_msg m = {0};
        wire_msg_seal(&m, MSG_HELLO);
        m.length = 1u << 30;
        memcpy(buf, &m, sizeof(m));
        len = sizeof(buf);
        break;
    }
    default:
        break;
    }
    if (len) CHECK(write(fd, buf, len) == (ssize_t)len);
    if (kind == STRAY_HOLD) return fd;
    close(fd);
    return -2;
}

/* One process, both ends: a stray client first, then a real eRDMA peer on the same
 * listen comm. The design we assert (NCCL's own bootstrap sockets do the same): a
 * stray connection is dropped with a WARN naming it, and accept keeps waiting for a
 * real peer: one bad client must not fail the whole communicator. */
static int stray_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *sc = NULL, *rc = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    for (int k = 0; k < STRAY_NSTRAYS; k++) {
        int accept_failures = 0;
        log_reset();
        int fd = stray_connect(handle, (enum stray)k);
        CHECK(fd != -1);
        /* let the listener look at the stray for a while (past the 2 s handshake limit
         * for the client that holds its connection) */
        double t0 = now_s(), end = t0 + (k == STRAY_HOLD ? 3.0 : 0.5);
        while (now_s() < end) {
            int r = n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL});
            CHECK(rc == NULL);
            if (r) {
                fprintf(stderr, "%s: accept returned %d after %.2f s\n", stray_names[k], r,
                        now_s() - t0);
                accept_failures++;
            }
        }
        CHECK(log_has_warn()); /* the stray was noticed and named */
        CHECK(log_contains(c->dev));
        fprintf(stderr, "%s: %d accept error(s); log:\n%s", stray_names[k], accept_failures,
                log_text());
        CHECK(accept_failures == 0);
        /* the same listen comm still accepts a real peer */
        sc = rc = NULL;
        double deadline = now_s() + TMO;
        while ((!sc || !rc) && now_s() < deadline) {
            if (!sc)
                CHECK(n.p.v12->connect(n.ctx, n.dev, handle, &sc,
                                       &(ncclNetDeviceHandle_t *){NULL}) == 0);
            if (!rc) CHECK(n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL}) == 0);
        }
        CHECK(sc && rc);
        if (fd >= 0) close(fd); /* held until the real peer got through */
        uint8_t *sb = page_alloc(SMALL), *rb = page_alloc(SMALL);
        void *smh, *rmh, *sreq = NULL, *rreq = NULL, *data = rb;
        size_t len = SMALL;
        int tag = 0, got = -1;
        pattern_fill(sb, 999, (uint32_t)k);
        CHECK(net_regmr(&n, sc, sb, SMALL, &smh) == 0);
        CHECK(net_regmr(&n, rc, rb, SMALL, &rmh) == 0);
        CHECK(net_irecv(&n, rc, 1, &data, &len, &tag, &rmh, &rreq, TMO) == 0);
        CHECK(net_isend(&n, sc, sb, 999, 0, smh, &sreq, TMO) == 0);
        CHECK(net_wait(&n, sreq, NULL, TMO) == 0);
        CHECK(net_wait(&n, rreq, &got, TMO) == 0);
        CHECK(got == 999 && pattern_check(rb, 999, (uint32_t)k) < 0);
        CHECK(net_deregmr(&n, sc, smh) == 0);
        CHECK(net_deregmr(&n, rc, rmh) == 0);
        CHECK(net_close_send(&n, sc) == 0);
        CHECK(net_close_recv(&n, rc) == 0);
        free(sb);
        free(rb);
        figure("stray TCP client (%s) on %s: dropped, listener still accepts a real peer",
               stray_names[k], c->dev);
    }
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

/* Port scanners and health probes connect and say nothing. With the default connect timeout,
 * a real peer behind 8 such idle clients (held open all along) and two half-open ones (a
 * partial hello, garbage) must get through in well under the timeout: accept serves every
 * candidate at once instead of waiting on the first one. */
#define IDLE_STRAYS 8
static int idle_strays_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *sc = NULL, *rc = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    int fds[IDLE_STRAYS + 2];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    const struct wire_handle *h = (const void *)handle;
    for (int i = 0; i < IDLE_STRAYS; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(fds[i] >= 0);
        CHECK(connect(fds[i], (const struct sockaddr *)&h->addr, sizeof(h->addr)) == 0);
    }
    fds[IDLE_STRAYS] = stray_connect(handle, STRAY_HOLD); /* a partial hello, held */
    CHECK(fds[IDLE_STRAYS] >= 0);
    fds[IDLE_STRAYS + 1] = socket(AF_INET, SOCK_STREAM, 0); /* garbage, held */
    CHECK(fds[IDLE_STRAYS + 1] >= 0);
    CHECK(connect(fds[IDLE_STRAYS + 1], (const struct sockaddr *)&h->addr, sizeof(h->addr)) == 0);
    static const char junk[200] = "GET / HTTP/1.0";
    CHECK(write(fds[IDLE_STRAYS + 1], junk, sizeof(junk)) == (ssize_t)sizeof(junk));
    /* the listener takes the strays in first */
    double t0 = now_s();
    while (now_s() < t0 + 0.3) {
        CHECK(n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL}) == 0);
        CHECK(rc == NULL);
    }
    t0 = now_s();
    double deadline = t0 + TMO;
    while ((!sc || !rc) && now_s() < deadline) {
        if (!sc)
            CHECK(n.p.v12->connect(n.ctx, n.dev, handle, &sc, &(ncclNetDeviceHandle_t *){NULL}) ==
                  0);
        if (!rc) CHECK(n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL}) == 0);
    }
    double t = now_s() - t0;
    figure("real peer behind %d idle TCP clients + 2 half-open ones on %s (default timeout): "
           "connected in %.2f s",
           IDLE_STRAYS, c->dev, t);
    CHECK(sc && rc);
    CHECK(t < 2.0);
    uint8_t *sb = page_alloc(SMALL), *rb = page_alloc(SMALL);
    void *smh, *rmh, *sreq = NULL, *rreq = NULL, *data = rb;
    size_t len = SMALL;
    int tag = 0, got = -1;
    pattern_fill(sb, 777, 5);
    CHECK(net_regmr(&n, sc, sb, SMALL, &smh) == 0);
    CHECK(net_regmr(&n, rc, rb, SMALL, &rmh) == 0);
    CHECK(net_irecv(&n, rc, 1, &data, &len, &tag, &rmh, &rreq, TMO) == 0);
    CHECK(net_isend(&n, sc, sb, 777, 0, smh, &sreq, TMO) == 0);
    CHECK(net_wait(&n, sreq, NULL, TMO) == 0);
    CHECK(net_wait(&n, rreq, &got, TMO) == 0);
    CHECK(got == 777 && pattern_check(rb, 777, 5) < 0);
    CHECK(net_deregmr(&n, sc, smh) == 0);
    CHECK(net_deregmr(&n, rc, rmh) == 0);
    CHECK(net_close_send(&n, sc) == 0);
    CHECK(net_close_recv(&n, rc) == 0);
    free(sb);
    free(rb);
    for (int i = 0; i < IDLE_STRAYS + 2; i++)
        close(fds[i]);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

/* A peer that knows the handle (so its hello is valid) but then lies: a READY for another
 * connection (wrong nonce) must fail the accept; a REPLY announcing the other connect mode
 * must fail the connect. GID mode: the handshake is all on the TCP socket. */
static int read_full(int fd, void *buf, size_t len) {
    for (size_t got = 0; got < len;) {
        ssize_t r = read(fd, (char *)buf + got, len - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static int forged_handshake_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *rc = NULL, *sc = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    const struct wire_handle *h = (const void *)handle;
    static const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};

    /* 1. a READY with the wrong nonce */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (const struct sockaddr *)&h->addr, sizeof(h->addr)) == 0);
    struct wire_conn_msg m = {.nonce = h->nonce, .nqps = 1, .connect_mode = 0, .mtu = 3};
    m.qpn[0] = 4242;
    memcpy(m.gid, gid, 16);
    m.ctrl_addr = 0x10000;
    m.ctrl_rkey = 1;
    m.max_msg_sz = 1u << 30;
    wire_msg_seal(&m, MSG_HELLO);
    CHECK(write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m));
    double end = now_s() + 10;
    int r = 0;
    for (;;) { /* accept until the reply is on the socket */
        r = n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL});
        CHECK(r == 0 && rc == NULL);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) == 1) break;
        CHECK(now_s() < end);
    }
    CHECK(read_full(fd, &m, sizeof(m)) == 0);
    memset(&m, 0, sizeof(m));
    m.nonce = h->nonce ^ 1;
    wire_msg_seal(&m, MSG_READY);
    CHECK(write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m));
    log_reset();
    end = now_s() + 5;
    r = 0;
    while (!r && !rc && now_s() < end)
        r = n.p.v12->accept(lc, &rc, &(ncclNetDeviceHandle_t *){NULL});
    fprintf(stderr, "READY with a wrong nonce: accept returned %d, comm %p\n%s", r, rc, log_text());
    CHECK(rc == NULL);
    CHECK(r != 0);
    CHECK(log_contains("ready"));
    close(fd);

    /* 2. a REPLY in the other connect mode, from a listener of our own */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = h->addr;
    socklen_t alen = sizeof(a);
    a.sin_port = 0;
    CHECK(ls >= 0 && bind(ls, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(ls, 1) == 0);
    CHECK(getsockname(ls, (struct sockaddr *)&a, &alen) == 0);
    char fake[NCCL_NET_HANDLE_MAXSIZE] = {0};
    struct wire_handle *fh = (void *)fake;
    fh->connect_mode = 0;
    fh->nonce = 0x1234;
    fh->addr = a;
    wire_handle_seal(fh);
    fd = -1;
    end = now_s() + 10;
    r = 0;
    log_reset();
    while (!r && !sc && now_s() < end) {
        r = n.p.v12->connect(n.ctx, n.dev, fake, &sc, &(ncclNetDeviceHandle_t *){NULL});
        if (fd < 0) {
            struct pollfd p = {.fd = ls, .events = POLLIN};
            if (poll(&p, 1, 0) == 1) {
                fd = accept(ls, NULL, NULL);
                CHECK(fd >= 0);
                CHECK(read_full(fd, &m, sizeof(m)) == 0); /* the hello */
                m.connect_mode = 1;                       /* rdma_cm */
                m.qpn[0] = 4243;
                wire_msg_seal(&m, MSG_REPLY);
                CHECK(write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m));
            }
        }
    }
    fprintf(stderr, "REPLY in rdma_cm mode to a GID-mode connect: connect returned %d, comm %p\n%s",
            r, sc, log_text());
    CHECK(sc == NULL);
    CHECK(r != 0);
    CHECK(log_contains("reply"));
    close(fd);
    close(ls);
    figure("forged handshake on %s: READY with a wrong nonce fails accept, REPLY in the other "
           "connect mode fails connect",
           c->dev);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

/* NCCL applications fork (data loaders, launchers): a child that exits normally runs the
 * plugin's unload destructor. It must leave the parent alone: the parent's async-event thread
 * keeps running and its device still connects and moves data. */
static int count_threads(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A v12 connection of the process to itself: listen, then connect and accept in turn. */
static int connect_to_self(struct netapi *n, void **lc, void **sc, void **rc) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    *sc = *rc = NULL;
    CHECK(net_listen(n, handle, lc) == 0);
    double deadline = now_s() + TMO;
    while ((!*sc || !*rc) && now_s() < deadline) {
        if (!*sc)
            CHECK(n->p.v12->connect(n->ctx, n->dev, handle, sc, &(ncclNetDeviceHandle_t *){NULL}) ==
                  0);
        if (!*rc) CHECK(n->p.v12->accept(*lc, rc, &(ncclNetDeviceHandle_t *){NULL}) == 0);
    }
    CHECK(*sc && *rc);
    return 0;
}

/* Undoes connect_to_self and the two registrations on it. */
static int release_self(struct netapi *n, void *lc, void *sc, void *rc, void *smh, void *rmh) {
    CHECK(net_deregmr(n, sc, smh) == 0);
    CHECK(net_deregmr(n, rc, rmh) == 0);
    CHECK(net_close_send(n, sc) == 0);
    CHECK(net_close_recv(n, rc) == 0);
    CHECK(net_close_listen(n, lc) == 0);
    return 0;
}

/* Waits up to 10 s for a forked child, which must exit 0; one that hangs (joining a thread it
 * does not have) is killed. The parent must still have its `before` threads afterwards (the
 * async-event thread among them). */
static int child_exited_cleanly(pid_t pid, int before) {
    pid_t w = 0;
    int status = 0;
    for (double end = now_s() + 10; !w && now_s() < end; usleep(10000))
        w = waitpid(pid, &status, WNOHANG);
    if (!w) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    fprintf(stderr, "child: %s %d\n", WIFSIGNALED(status) ? "killed by signal" : "exit status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    CHECK(w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    usleep(200000);
    int after = count_threads();
    fprintf(stderr, "threads before the child: %d, after it exited: %d\n", before, after);
    CHECK(after == before);
    return 0;
}

static int forked_child_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *sc = NULL, *rc = NULL;
    CHECK(net_open(&n, c->version, c->dev) == 0);
    int before = count_threads();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) exit(0); /* runs the destructors, as a child that returns from main does */
    CHECK(child_exited_cleanly(pid, before) == 0);
    CHECK(connect_to_self(&n, &lc, &sc, &rc) == 0);
    uint8_t *sb = page_alloc(SMALL), *rb = page_alloc(SMALL);
    void *smh, *rmh, *sreq = NULL, *rreq = NULL, *data = rb;
    size_t len = SMALL;
    int tag = 0, got = -1;
    pattern_fill(sb, 555, 9);
    CHECK(net_regmr(&n, sc, sb, SMALL, &smh) == 0);
    CHECK(net_regmr(&n, rc, rb, SMALL, &rmh) == 0);
    CHECK(net_irecv(&n, rc, 1, &data, &len, &tag, &rmh, &rreq, TMO) == 0);
    CHECK(net_isend(&n, sc, sb, 555, 0, smh, &sreq, TMO) == 0);
    CHECK(net_wait(&n, sreq, NULL, TMO) == 0);
    CHECK(net_wait(&n, rreq, &got, TMO) == 0);
    CHECK(got == 555 && pattern_check(rb, 555, 9) < 0);
    CHECK(release_self(&n, lc, sc, rc, smh, rmh) == 0);
    free(sb);
    free(rb);
    figure("forked child exited on %s: parent's async thread and device unaffected", c->dev);
    net_close(&n);
    return 0;
}

/* A child forked with comms open that calls the plugin (a worker that inherits the trainer's
 * state, an atexit path that closes what it sees): its devices, queues and sockets are the
 * parent's. Every call must be refused or be a no-op there, and the parent's connection,
 * pending receive and async-event thread must be untouched. Returns only when a step failed. */
static int forked_calls_child(struct netapi *n, void *lc, void *sc, void *rc, void *smh, void *rmh,
                              void *rreq, uint8_t *sb) {
    int done = 0;
    void *req = (void *)1;
    log_reset();
    int t = net_test(n, rreq, &done, NULL);
    fprintf(stderr, "child: test of the parent's receive: rc %d done %d\n", t, done);
    CHECK(t != ncclSuccess && !done); /* it would poll the parent's completion queue */
    int i = n->p.v12->isend(sc, sb, SMALL, 0, smh, NULL, &req);
    fprintf(stderr, "child: isend: rc %d request %p\n%s", i, req, log_text());
    CHECK(i != ncclSuccess && !req); /* it would post on the parent's QP */
    CHECK(log_contains("forked") && log_contains("spawn"));
    /* the closes would say goodbye on the parent's sockets */
    CHECK(release_self(n, lc, sc, rc, smh, rmh) == 0);
    net_close(n); /* finalize: would stop the parent's thread and join one it lacks */
    return 0;
}

static int forked_calls_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *sc = NULL, *rc = NULL;
    CHECK(net_open(&n, 12, c->dev) == 0);
    CHECK(connect_to_self(&n, &lc, &sc, &rc) == 0);
    uint8_t *sb = page_alloc(SMALL), *rb = page_alloc(SMALL);
    void *smh, *rmh, *sreq = NULL, *rreq = NULL, *data = rb;
    size_t len = SMALL;
    int tag = 0, got = -1;
    CHECK(net_regmr(&n, sc, sb, SMALL, &smh) == 0);
    CHECK(net_regmr(&n, rc, rb, SMALL, &rmh) == 0);
    for (int m = 0; m < 2; m++) { /* one message before the fork, one after */
        memset(rb, 0, SMALL);
        CHECK(net_irecv(&n, rc, 1, &data, &len, &tag, &rmh, &rreq, TMO) == 0);
        if (m == 1) {
            int before = count_threads();
            pid_t pid = fork();
            CHECK(pid >= 0);
            if (pid == 0) exit(forked_calls_child(&n, lc, sc, rc, smh, rmh, rreq, sb) ? 3 : 0);
            CHECK(child_exited_cleanly(pid, before) == 0);
        }
        pattern_fill(sb, 700 + m, 11 + m);
        CHECK(net_isend(&n, sc, sb, 700 + m, 0, smh, &sreq, TMO) == 0);
        CHECK(net_wait(&n, sreq, NULL, TMO) == 0);
        CHECK(net_wait(&n, rreq, &got, TMO) == 0);
        CHECK(got == 700 + m && pattern_check(rb, 700 + m, 11 + m) < 0);
    }
    CHECK(release_self(&n, lc, sc, rc, smh, rmh) == 0);
    free(sb);
    free(rb);
    figure(
        "forked child's calls on %s: refused or no-ops; the parent's comms and thread unaffected",
        c->dev);
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ scenario: exit, data path busy
 * A process that exits with its comms open and no finalize (ncclNet v8-v10 have none; scripts
 * often exit without destroying their communicators) while NCCL's proxy thread still tests a
 * receive: the plugin's exit-time cleanup must leave the devices and the verbs library to that
 * thread (it released them: SIGSEGV in the exit). */
struct busy_spin {
    struct netapi *n;
    void *req;
};

/* Tests for ever, as NCCL's proxy thread does (yielding when nothing progressed) and as one
 * with other work would go on calling in: an error is said once, not a reason to stop. */
static void *busy_spin_main(void *p) {
    struct busy_spin *s = p;
    bool said = false;
    for (int done = 0; !done; sched_yield()) {
        int rc = net_test(s->n, s->req, &done, NULL);
        if (rc && !said) fprintf(stderr, "test() failed during the exit: %d\n", rc);
        said |= rc != 0;
    }
    return NULL;
}

struct busy_connect {
    struct netapi *n;
    char *handle;
    void *sc;
    int rc;
};

static void *busy_connect_main(void *p) {
    struct busy_connect *b = p;
    b->rc = net_connect(b->n, b->handle, &b->sc, TMO);
    return NULL;
}

/* In a fresh child: a connection to itself, a receive that never completes, a thread testing
 * it, then exit(0) from main. Returns only when a step failed. */
static int exit_busy_child(int version, const char *dev) {
    struct netapi n;
    void *lc, *rc = NULL, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    void *data = buf;
    size_t len = SMALL;
    int tag = 0;
    pthread_t t;
    CHECK(net_open(&n, version, dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    struct busy_connect bc = {.n = &n, .handle = handle, .rc = -1};
    CHECK(pthread_create(&t, NULL, busy_connect_main, &bc) == 0);
    CHECK(net_accept(&n, lc, &rc, TMO) == 0);
    CHECK(pthread_join(t, NULL) == 0 && bc.rc == 0 && bc.sc);
    CHECK(net_regmr(&n, rc, buf, SMALL, &mh) == 0);
    CHECK(net_irecv(&n, rc, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
    struct busy_spin spin = {.n = &n, .req = req};
    CHECK(pthread_create(&t, NULL, busy_spin_main, &spin) == 0);
    usleep(200000); /* the thread is in test() */
    exit(0);
}

/* In a fresh child with nothing open: a thread connecting to a listener that has closed (a
 * peer that went away before accepting: connect retries until NCCL_ERDMA_CONNECT_TIMEOUT),
 * then exit(0) from main. An unfinished connect is no open object, so the exit-time cleanup
 * released the devices and the verbs library under the connecting thread. */
static int exit_connecting_child(int version, const char *dev) {
    struct netapi n;
    void *lc;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    pthread_t t;
    CHECK(net_open(&n, version, dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    struct busy_connect bc = {.n = &n, .handle = handle, .rc = -1};
    CHECK(pthread_create(&t, NULL, busy_connect_main, &bc) == 0);
    usleep(200000);               /* the thread is in connect() */
    CHECK(bc.rc == -1 && !bc.sc); /* still trying */
    exit(0);
}

static int exit_busy_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    static const int versions[] = {10, 12}; /* without a finalize, and with one not called */
    /* the connecting thread is inside connect() at a release only some of the time: three
     * children a version (a crash in about one in six, before) */
    for (int k = 0; k < 8; k++) {
        int v = k % 2;
        bool connecting = k >= 2;
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) { /* cmocka's handlers would turn a crash into an exit status */
            signal(SIGSEGV, SIG_DFL);
            signal(SIGBUS, SIG_DFL);
            signal(SIGILL, SIG_DFL);
            signal(SIGFPE, SIG_DFL);
            int bad = connecting ? exit_connecting_child(versions[v], c->dev)
                                 : exit_busy_child(versions[v], c->dev);
            _exit(bad ? 3 : 4);
        }
        int status = 0;
        pid_t w = 0;
        for (double end = now_s() + 30; !w && now_s() < end; usleep(10000))
            w = waitpid(pid, &status, WNOHANG);
        if (!w) { /* its exit hangs */
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        fprintf(stderr, "v%d child (%s): %s %d\n", versions[v],
                connecting ? "connecting" : "testing a receive",
                WIFSIGNALED(status) ? "killed by signal" : "exit status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        CHECK(w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    figure("exit(0) with a receive being tested, and with a connect under way, on %s (v10, v12 "
           "without finalize): exit status 0",
           c->dev);
    return 0;
}

/* regMr of memory that is not there: an error with a reason, and nothing broken after. */
static int regmr_bad_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *mh = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    const size_t len = 1 << 20;
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);

    void *none = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(none != MAP_FAILED);
    log_reset();
    int rc = net_regmr(&n, lc, none, len, &mh);
    fprintf(stderr, "regMr of PROT_NONE: rc %d\n%s", rc, log_text());
    CHECK(rc != ncclSuccess);
    CHECK(log_contains("cannot register") && log_contains(c->dev));
    munmap(none, len);

    void *gone = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(gone != MAP_FAILED);
    munmap(gone, len);
    log_reset();
    rc = net_regmr(&n, lc, gone, len, &mh);
    fprintf(stderr, "regMr of an unmapped range: rc %d\n%s", rc, log_text());
    CHECK(rc != ncclSuccess);
    CHECK(log_contains("cannot register") && log_contains("not mapped"));

    /* a good registration still works afterwards */
    void *ok = page_alloc(len);
    CHECK(net_regmr(&n, lc, ok, len, &mh) == 0);
    CHECK(net_deregmr(&n, lc, mh) == 0);
    free(ok);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

/* Root in the VM ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it first. */
static int drop_ipc_lock(void) {
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    CHECK(syscall(SYS_capget, &hdr, data) == 0);
    for (int i = 0; i < 2; i++) {
        uint32_t mask = i == CAP_TO_INDEX(CAP_IPC_LOCK) ? CAP_TO_MASK(CAP_IPC_LOCK) : 0;
        data[i].effective &= ~mask;
        data[i].permitted &= ~mask;
        data[i].inheritable &= ~mask;
    }
    prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
    CHECK(syscall(SYS_capset, &hdr, data) == 0);
    return 0;
}

static int memlock_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *mh = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(drop_ipc_lock() == 0);
    struct rlimit rl = {.rlim_cur = 64 << 10, .rlim_max = 64 << 10};
    CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    uint8_t *buf = page_alloc(BIG);
    CHECK(buf);
    memset(buf, 1, BIG);
    log_reset();
    int rc = net_regmr(&n, lc, buf, BIG, &mh);
    fprintf(stderr, "regMr of 64 MiB with memlock 64 KiB: rc %d\n%s", rc, log_text());
    CHECK(rc != ncclSuccess);
    CHECK(log_contains("ulimit -l unlimited"));
    CHECK(log_contains(c->dev));
    figure("memlock 64 KiB on %s: regMr of 64 MiB fails, WARN says `ulimit -l unlimited`", c->dev);
    free(buf);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    return 0;
}

/* rdma_cm ends finish their teardown on the plugin's reaper thread after close: bounded to
 * 0.3 s + 1 s each, in parallel. */
#define REAP_SETTLE_S 5.0
#define REAP_BOUND_US 1500000

/* ------------------------------------------------------------ a raw rdma_cm client
 * Talks to our rdma_cm listeners the way a stranger would: its own id and QP, any private
 * data. It uses erdma_core's verbs table, linked into this binary (the plugin has its own). */
struct raw_cm {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
};

/* The next event's type (acked), or -1 when none came within timeout_ms. */
static int raw_event(struct raw_cm *r, int timeout_ms) {
    struct pollfd p = {.fd = r->ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev;
    if (poll(&p, 1, timeout_ms) <= 0 || vb.cm_get_cm_event(r->ch, &ev)) return -1;
    int type = ev->event;
    vb.cm_ack_cm_event(ev);
    return type;
}

static void raw_close(struct raw_cm *r) {
    if (r->id && r->id->qp) vb.cm_destroy_qp(r->id);
    if (r->id) vb.cm_destroy_id(r->id);
    if (r->ch) vb.cm_destroy_event_channel(r->ch);
    r->id = NULL;
    r->ch = NULL;
}

/* Sends a connect request from src (NULL: any) to dst carrying priv; 0 once it is sent. */
static int raw_connect_once(struct raw_cm *r, const struct sockaddr_in *src,
                            const struct sockaddr_in *dst, const void *priv, uint8_t len) {
    struct ibv_qp_init_attr qa = {
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    struct rdma_conn_param cp = {.private_data = priv,
                                 .private_data_len = len,
                                 .responder_resources = 1,
                                 .initiator_depth = 1,
                                 .retry_count = 7,
                                 .rnr_retry_count = 7};
    memset(r, 0, sizeof(*r));
    CHECK((r->ch = vb.cm_create_event_channel()) != NULL);
    CHECK(vb.cm_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP) == 0);
    CHECK(vb.cm_resolve_addr(r->id, (struct sockaddr *)src, (struct sockaddr *)dst, 2000) == 0);
    int ev = raw_event(r, 5000);
    if (ev != RDMA_CM_EVENT_ADDR_RESOLVED) {
        fprintf(stderr, "raw rdma_cm client: address resolution gave event %d\n", ev);
        return -1;
    }
    CHECK(vb.cm_resolve_route(r->id, 2000) == 0);
    CHECK(raw_event(r, 5000) == RDMA_CM_EVENT_ROUTE_RESOLVED);
    CHECK(vb.cm_create_qp(r->id, NULL, &qa) == 0);
    if (vb.cm_connect(r->id, &cp)) {
        int err = errno;
        fprintf(stderr, "raw rdma_cm client: rdma_connect failed: %s (port %u)\n", strerror(err),
                ntohs(vb.cm_get_src_port(r->id)));
        return err == EADDRINUSE ? -EADDRINUSE : -1;
    }
    return 0;
}

/* On siw, rdma_cm picks the source port without asking TCP and siw's kernel socket then binds
 * it: a port some TCP socket holds fails rdma_connect with EADDRINUSE (one full suite in ~3,
 * with hundreds of the plugin's sockets about). The plugin takes a new id for it (cm.c); so
 * does this client, as any rdma_cm client must on siw. Any other failure fails the case. */
static int raw_connect(struct raw_cm *r, const struct sockaddr_in *src,
                       const struct sockaddr_in *dst, const void *priv, uint8_t len) {
    int rc = -1;
    for (int attempt = 0; attempt < 4; attempt++) {
        rc = raw_connect_once(r, src, dst, priv, len);
        if (rc != -EADDRINUSE) break;
        raw_close(r);
    }
    return rc == 0 ? 0 : -1;
}

/* rdma_cm ids in `rdma res show cm_id` whose line holds every given string. */
static int cm_ids_with(const char *a, const char *b, const char *c) {
    FILE *f = popen("rdma res show cm_id 2>&1", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c));
    if (f) pclose(f);
    return n;
}

static int cm_ids_of_pid(pid_t pid) {
    char p[32];
    snprintf(p, sizeof(p), " pid %d ", (int)pid);
    return cm_ids_with(p, NULL, NULL);
}

/* ------------------------------------------------------------ scenario: rejected requests
 * Connect requests to a listen comm's rdma_cm port that are not its peer's QPs (no, short or
 * forged private data, another accept's token) are rejected when the next accept reads them (the
 * last one took the real peer's QP once, and its connect failed); their ids must be
 * destroyed (they leaked once), and the real peer behind them still connects. */
#define REJECTS 6

static int rejects_listen(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *comm, *mh, *req, *data;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    size_t len = SMALL;
    int tag = 0, got = -1;
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    int base = cm_ids_of_pid(getpid()), now = -1;
    CHECK(base >= 1); /* the listener's own */
    log_reset();
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(duo_barrier(d) == 0); /* the stranger's requests are sent */
    /* the kernel makes a listener-side id for each request once it arrives */
    for (double t0 = now_s(); now_s() - t0 < 10; usleep(20000))
        if ((now = cm_ids_of_pid(getpid())) >= base + REJECTS) break;
    fprintf(stderr, "cm ids of the listener: %d, %d with the requests pending\n", base, now);
    CHECK(now == base + REJECTS);
    CHECK(duo_barrier(d) == 0); /* the real peer connects now */
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
    data = buf;
    CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
    CHECK(net_wait(&n, req, &got, TMO) == 0);
    CHECK(got == 777 && pattern_check(buf, 777, 77) < 0);
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_recv(&n, comm) == 0);
    /* the comm's own ids go with its teardown, in the background */
    for (double t0 = now_s(); now_s() - t0 < REAP_SETTLE_S; usleep(20000))
        if ((now = cm_ids_of_pid(getpid())) == base) break;
    figure("%d rejected rdma_cm requests on %s: listener-side cm ids %d before, %d after, the "
           "listen comm still open",
           REJECTS, c->dev, base, now);
    if (now != base && system("rdma res show cm_id")) fprintf(stderr, "(no rdma tool)\n");
    CHECK(now == base);
    CHECK(log_contains("rejecting an rdma_cm connection"));
    CHECK(duo_barrier(d) == 0); /* the stranger saw its rejections */
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

static int rejects_connect(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    struct raw_cm r[REJECTS];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(verbs_open() == 0 && verbs_have_rdmacm());
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    const struct wire_handle *h = (const struct wire_handle *)handle;
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = h->cm_port, .sin_addr = h->cm_ip};
    const struct wire_cm_private good = {
        .magic = WIRE_MAGIC,
        .qp_index = 0,
        .nqps = 1,
        .nonce = h->nonce,
        .token = 1}; /* a listen's first accept has token 1: each variant fails its own check */
    struct wire_cm_private bad[REJECTS];
    uint8_t lens[REJECTS] = {0, 3, sizeof(good), sizeof(good), sizeof(good), sizeof(good)};
    for (int k = 0; k < REJECTS; k++)
        bad[k] = good;
    bad[2].magic ^= 1;        /* not ours */
    bad[3].nonce++;           /* a stale listen */
    bad[4].qp_index = 0x7fff; /* no such QP */
    bad[5].token = 2; /* right listen and QP, another accept's: requests of a peer that gave up */
    for (int k = 0; k < REJECTS; k++)
        CHECK(raw_connect(&r[k], NULL, &dst, lens[k] ? &bad[k] : NULL, lens[k]) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    pattern_fill(buf, 777, 77);
    CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
    CHECK(net_isend(&n, comm, buf, 777, 0, mh, &req, TMO) == 0);
    CHECK(net_wait(&n, req, NULL, TMO) == 0);
    for (int k = 0; k < REJECTS; k++) {
        int ev = raw_event(&r[k], 10000);
        if (ev != RDMA_CM_EVENT_REJECTED) fprintf(stderr, "request %d: event %d\n", k, ev);
        CHECK(ev == RDMA_CM_EVENT_REJECTED);
        raw_close(&r[k]);
    }
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    CHECK(duo_barrier(d) == 0);
    net_close(&n);
    verbs_close();
    free(buf);
    return 0;
}

/* ------------------------------------------------------------ scenario: the flush loopback
 * In rdma_cm mode a receiver that flushes connects a QP to one of its own through a listener
 * of its own, bound to the device's address. Once the loopback is up that listener must be
 * gone: left open, requests from anywhere queued on it for the comm's whole life. */
static int listeners_of_pid(const char *ip) {
    char pid[32], at[64];
    snprintf(pid, sizeof(pid), " pid %d ", (int)getpid());
    snprintf(at, sizeof(at), "src-addr %s:", ip);
    return cm_ids_with(pid, "LISTEN", at);
}

/* The receiver's end of both flush-listener cases: flush_listener_send's message arrives and
 * a flush through the loopback completes; then the receiver closes everything but n. */
static int loopback_receive_and_flush(struct duo *d, struct netapi *n, void *comm, void *lc) {
    void *mh, *req, *freq = NULL, *data;
    uint8_t *buf = page_alloc(SMALL);
    size_t len = SMALL;
    int tag = 0, got = -1;
    CHECK(net_regmr(n, comm, buf, SMALL, &mh) == 0);
    data = buf;
    CHECK(net_irecv(n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
    CHECK(net_wait(n, req, &got, TMO) == 0);
    CHECK(got == SMALL && pattern_check(buf, SMALL, 78) < 0);
    CHECK(net_iflush(n, comm, 1, &data, &got, &mh, &freq) == 0 && freq);
    CHECK(net_wait(n, freq, NULL, TMO) == 0);
    CHECK(net_deregmr(n, comm, mh) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_close_recv(n, comm) == 0);
    CHECK(net_close_listen(n, lc) == 0);
    free(buf);
    return 0;
}

static int flush_listener_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE], ip[INET_ADDRSTRLEN];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    handle_ip(handle, ip, sizeof(ip));
    CHECK(listeners_of_pid(ip) == 1);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    int after = listeners_of_pid(ip);
    figure("listening rdma_cm ids of a receiver on %s once its flush loopback is up: %d (its "
           "listen comm's)",
           c->dev, after);
    CHECK(after == 1);
    /* the loopback works */
    CHECK(loopback_receive_and_flush(d, &n, comm, lc) == 0);
    net_close(&n);
    return 0;
}

static int flush_listener_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    pattern_fill(buf, SMALL, 78);
    CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
    CHECK(net_isend(&n, comm, buf, SMALL, 0, mh, &req, TMO) == 0);
    CHECK(net_wait(&n, req, NULL, TMO) == 0);
    CHECK(duo_barrier(d) == 0); /* the receiver's flush is done */
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

/* A stranger's request reaching the flush listener while the loopback is being set up: the
 * receiver loads librdmacm through tests/integ/cm_shim.c, whose rdma_listen hook sends, the
 * moment the flush listener is up, a connect request from a second address of this host
 * (added for the case), or from the device's own address as another process on this host
 * would, and waits until it is queued on the plugin's channel. The plugin must refuse it (by
 * its address, or by its port), still connect its own loopback, and flush. */
struct stranger {
    int listens;
    struct sockaddr_in src, dst;
    struct raw_cm cm;
    int queued; /* 1: the request reached the plugin's listener before it went on */
};

static void stranger_at_flush_listen(struct rdma_cm_id *id, int backlog, void *arg) {
    struct stranger *st = arg;
    (void)backlog;
    if (++st->listens != 1) return; /* set after the listen comm's: the next is the flush's */
    st->dst.sin_port = vb.cm_get_src_port(id);
    if (raw_connect(&st->cm, &st->src, &st->dst, NULL, 0)) {
        fprintf(stderr, "the stranger could not send its request\n");
        return;
    }
    struct pollfd p = {.fd = id->channel->fd, .events = POLLIN};
    st->queued = poll(&p, 1, 5000) == 1;
}

/* Adds (add) or removes a second IPv4 address, base + 8 in the last byte, on ip's netdev. */
static int second_address(const char *ip, char *second, size_t len, bool add) {
    struct in_addr a;
    if (inet_pton(AF_INET, ip, &a) != 1) return -1;
    a.s_addr = htonl(ntohl(a.s_addr) + 8);
    inet_ntop(AF_INET, &a, second, (socklen_t)len);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "dev=$(ip -o -4 addr show | awk '$4 ~ \"^%s/\" {print $2; exit}'); "
             "[ -n \"$dev\" ] && ip addr %s %s/24 dev $dev",
             ip, add ? "add" : "del", second);
    if (system(cmd) != 0) return -1;
    if (add) usleep(500000); /* rxe adds the address's RoCE GID on a netdev event */
    return 0;
}

static int flush_stranger_recv_inner(struct duo *d, const struct cfg *c, struct stranger *st,
                                     void *shim, bool local) {
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE], ip[INET_ADDRSTRLEN], second[INET_ADDRSTRLEN];
    void (*set_hook)(void (*)(struct rdma_cm_id *, int, void *), void *) = (void (*)(
        void (*)(struct rdma_cm_id *, int, void *), void *))dlsym(shim, "cm_shim_set_listen_hook");
    CHECK(set_hook != NULL);
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(verbs_open() == 0 && verbs_have_rdmacm()); /* the stranger's own, through the shim */
    CHECK(net_listen(&n, handle, &lc) == 0);
    handle_ip(handle, ip, sizeof(ip));
    const char *from = local ? ip : second;
    if (!local) CHECK(second_address(ip, second, sizeof(second), true) == 0);
    st->src = (struct sockaddr_in){.sin_family = AF_INET};
    inet_pton(AF_INET, from, &st->src.sin_addr);
    st->dst = (struct sockaddr_in){.sin_family = AF_INET};
    inet_pton(AF_INET, ip, &st->dst.sin_addr);
    set_hook(stranger_at_flush_listen, st);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    int accepted = net_accept(&n, lc, &comm, TMO) == 0;
    set_hook(NULL, NULL);
    if (!local) second_address(ip, second, sizeof(second), false);
    if (!accepted) fprintf(stderr, "log:\n%s", log_text());
    CHECK(accepted);
    figure("a stranger from %s at the flush listener on %s during its setup: %s", from, c->dev,
           st->queued ? "queued ahead of the loopback" : "NOT queued");
    CHECK(st->queued);
    char warn[96];
    snprintf(warn, sizeof(warn), "rejecting an rdma_cm connection from %s:%u", from,
             ntohs(vb.cm_get_src_port(st->cm.id)));
    CHECK(log_contains(warn));
    int ev = raw_event(&st->cm, 10000);
    if (ev != RDMA_CM_EVENT_REJECTED) fprintf(stderr, "the stranger got event %d\n", ev);
    CHECK(ev == RDMA_CM_EVENT_REJECTED);
    raw_close(&st->cm);
    /* the loopback is ours, and works */
    CHECK(loopback_receive_and_flush(d, &n, comm, lc) == 0);
    net_close(&n);
    verbs_close();
    return 0;
}

static int flush_stranger_recv_from(struct duo *d, void *arg, bool local) {
    void *shim = cm_shim_load();
    CHECK(shim != NULL);
    struct stranger st = {0};
    return flush_stranger_recv_inner(d, arg, &st, shim, local);
}

static int flush_stranger_recv(struct duo *d, void *arg) {
    return flush_stranger_recv_from(d, arg, false);
}

static int flush_local_stranger_recv(struct duo *d, void *arg) {
    return flush_stranger_recv_from(d, arg, true);
}

/* The flush loopback's ports: rdma_cm picks them without asking TCP, and on siw a port some
 * TCP socket holds fails rdma_listen or rdma_connect with EADDRINUSE (see raw_connect). The
 * receiver loads librdmacm through the shim, which refuses the flush listener's first listen
 * and the loopback's first connect that way: accept must take new ports, as the listen comm
 * and the sender's connect do, and the loopback must then flush. */
static int flush_port_taken_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    void *shim = cm_shim_load();
    CHECK(shim != NULL);
    void (*port_taken)(int, int) = (void (*)(int, int))dlsym(shim, "cm_shim_port_taken");
    int (*left)(void) = (int (*)(void))dlsym(shim, "cm_shim_port_taken_left");
    CHECK(port_taken != NULL && left != NULL);
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    port_taken(1, 1); /* the next listen is the flush listener's, the next connect its peer's */
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    int accepted = net_accept(&n, lc, &comm, TMO) == 0;
    int unused = left();
    port_taken(0, 0);
    if (!accepted) fprintf(stderr, "log:\n%s", log_text());
    figure("flush loopback on %s with its first listen and connect refused (port taken): %s",
           c->dev, accepted ? "accepted" : "FAILED");
    CHECK(accepted);
    CHECK(unused == 0); /* both refusals reached the plugin */
    CHECK(loopback_receive_and_flush(d, &n, comm, lc) == 0);
    net_close(&n);
    return 0;
}

/* A connection's ids move from the listener's rdma_cm channel to the comm's own once every QP
 * is up. When a move fails after the first (the shim fails the second), accept fails; the
 * ids not moved still reported to the listener's channel, and the failed comm's teardown
 * destroyed them on the reaper thread after the test's closeListen had destroyed that
 * channel: a use after free in librdmacm, which the shim turns into an abort. */
static int migrate_fails_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    void *shim = cm_shim_load();
    CHECK(shim != NULL);
    void (*migrate_fails)(int) = (void (*)(int))dlsym(shim, "cm_shim_migrate_fails");
    CHECK(migrate_fails != NULL);
    struct netapi n;
    void *lc, *comm;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    migrate_fails(2);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    int failed = net_accept(&n, lc, &comm, TMO) != 0;
    int warned = strstr(log_text(), "failed: Cannot allocate memory") != NULL;
    if (!failed || !warned) fprintf(stderr, "log:\n%s", log_text());
    figure("second rdma_migrate_id failed on %s: accept %s, %s", c->dev,
           failed ? "failed" : "SUCCEEDED", warned ? "said why" : "NO WARN");
    CHECK(failed && warned);
    CHECK(net_close_listen(&n, lc) == 0); /* the listener's channel goes now */
    net_close(&n); /* finalize: the failed comm's teardown has run when this returns */
    return 0;
}

static int migrate_fails_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm = NULL;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    int rc = net_connect(&n, handle, &comm, TMO); /* the receiver gave up: this fails */
    if (rc == 0) CHECK(net_close_send(&n, comm) == 0);
    figure("sender's connect to it: %s", rc ? "failed" : "connected");
    net_close(&n);
    return 0;
}

/* ------------------------------------------------------------ scenario: resource hygiene */
struct usage {
    int fds;
    long rss_kib;
    char rdma[512]; /* "rxe0: pd 1 cq 2 qp 3 ..." lines of `rdma resource show` */
};

static int count_own_fds(void) {
    char path[64];
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (access(path, F_OK) == 0) n++;
    }
    return n;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

static void rdma_counts(char *out, size_t len) {
    FILE *f = popen("rdma resource show 2>&1", "r");
    size_t used = 0;
    out[0] = 0;
    char line[256];
    while (f && fgets(line, sizeof(line), f)) {
        int n = snprintf(out + used, len - used, "%s", line);
        if (n > 0 && used + (size_t)n < len) used += (size_t)n;
    }
    if (f) pclose(f);
}

static void usage_take(struct usage *u, int with_rdma) {
    u->fds = count_own_fds();
    u->rss_kib = rss_kib();
    if (with_rdma)
        rdma_counts(u->rdma, sizeof(u->rdma));
    else
        u->rdma[0] = 0;
}

/* Takes b once what was closed last is released: rdma_cm ends finish their teardown on the
 * plugin's reaper thread (up to ~1.3 s each, in parallel), so b is retaken until it matches a
 * or REAP_SETTLE_S pass; the wait is a figure. */

static void usage_settled(const struct cfg *c, struct usage *b, const struct usage *a,
                          int with_rdma) {
    double t0 = now_s();
    for (;;) {
        usage_take(b, with_rdma);
        if ((b->fds == a->fds && !strcmp(b->rdma, a->rdma)) || now_s() - t0 > REAP_SETTLE_S) break;
        usleep(20000);
    }
    figure("resources on %s settled %.0f ms after the last close", c->dev, 1000 * (now_s() - t0));
}

/* 1000 cycles by default; ITEST_CYCLES overrides. */
static int cycles_wanted(const struct cfg *c) {
    const char *s = getenv("ITEST_CYCLES");
    if (s) return atoi(s);
    return 1000;
}

#define RSS_SLACK_KIB 4096

static int usage_compare(const char *role, const struct cfg *c, int cycles, const struct usage *a,
                         const struct usage *b, double secs) {
    figure("%d cycles on %s (%s, %.1f s, %.1f ms/cycle): fds %d -> %d, VmRSS %ld -> %ld KiB",
           cycles, c->dev, role, secs, 1000 * secs / cycles, a->fds, b->fds, a->rss_kib,
           b->rss_kib);
    if (a->rdma[0]) {
        char x[512], y[512];
        snprintf(x, sizeof(x), "%s", a->rdma);
        snprintf(y, sizeof(y), "%s", b->rdma);
        for (char *p = x; *p; p++)
            if (*p == '\n') *p = ';';
        for (char *p = y; *p; p++)
            if (*p == '\n') *p = ';';
        figure("rdma resources before: %s", x);
        figure("rdma resources after:  %s", y);
    }
    CHECK(a->fds == b->fds);
    if (getenv("ITEST_NO_RSS")) /* ASan's allocator keeps freed memory in quarantine */
        fprintf(stderr, "NOTE: VmRSS growth not judged in this build (ITEST_NO_RSS)\n");
    else
        CHECK(b->rss_kib - a->rss_kib <= RSS_SLACK_KIB);
    CHECK(!strcmp(a->rdma, b->rdma));
    return 0;
}

static int cycles_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    struct usage a, b;
    int cycles = cycles_wanted(c);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    double t0 = 0;
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i <= cycles; i++) {
        void *lc, *comm, *mh, *req, *data = buf;
        size_t len = SMALL;
        int tag = 0, got = -1;
        if (i == 1) { /* after one warm-up cycle: lazy one-time allocations are done */
            CHECK(duo_barrier(d) == 0);
            usleep(REAP_BOUND_US); /* both ends' teardown of the warm-up cycle is over */
            usage_take(&a, 1);
            t0 = now_s();
        }
        if (net_listen(&n, handle, &lc) != 0) {
            fprintf(stderr, "listen failed in cycle %d after %.1f s; rdma_cm ids and TCP:\n", i,
                    now_s() - t0);
            fflush(NULL);
            if (system("rdma resource show cm_id | wc -l; ss -tan | awk '{print $1}' | sort | "
                       "uniq -c"))
                fprintf(stderr, "(diagnostics failed)\n");
            return -1;
        }
        CHECK(duo_send(d, handle, sizeof(handle)) == 0);
        CHECK(net_accept(&n, lc, &comm, TMO) == 0);
        CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
        CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(got == 100 + i % 1000 && pattern_check(buf, (size_t)got, (uint32_t)i) < 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(net_close_recv(&n, comm) == 0);
        CHECK(net_close_listen(&n, lc) == 0);
    }
    double secs = now_s() - t0;
    CHECK(duo_barrier(d) == 0); /* the sender has closed everything too */
    usage_settled(c, &b, &a, 1);
    CHECK(duo_barrier(d) == 0); /* the sender keeps its plugin open until counted */
    CHECK(usage_compare("receiver", c, cycles, &a, &b, secs) == 0);
    free(buf);
    net_close(&n);
    return 0;
}

static int cycles_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    struct usage a, b;
    int cycles = cycles_wanted(c);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    uint8_t *buf = page_alloc(SMALL);
    double t0 = 0;
    CHECK(net_open(&n, c->version, c->dev) == 0);
    for (int i = 0; i <= cycles; i++) {
        void *comm, *mh, *req;
        if (i == 1) {
            CHECK(duo_barrier(d) == 0);
            usleep(REAP_BOUND_US);
            usage_take(&a, 0);
            t0 = now_s();
        }
        CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
        if (net_connect(&n, handle, &comm, TMO) != 0) {
            fprintf(stderr, "connect failed in cycle %d after %.1f s\n", i, now_s() - t0);
            fflush(NULL);
            if (system("ss -tan | awk '{print $1}' | sort | uniq -c")) fprintf(stderr, "(no ss)\n");
            return -1;
        }
        if (i % 100 == 0) fprintf(stderr, "  cycle %d at %.1f s\n", i, now_s() - t0);
        pattern_fill(buf, 100 + (size_t)(i % 1000), (uint32_t)i);
        CHECK(net_regmr(&n, comm, buf, SMALL, &mh) == 0);
        CHECK(net_isend(&n, comm, buf, 100 + (size_t)(i % 1000), 0, mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, NULL, TMO) == 0);
        CHECK(net_deregmr(&n, comm, mh) == 0);
        CHECK(net_close_send(&n, comm) == 0);
    }
    double secs = now_s() - t0;
    usage_settled(c, &b, &a, 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(usage_compare("sender", c, cycles, &a, &b, secs) == 0);
    free(buf);
    net_close(&n);
    return 0;
}

/* NCCL >= 2.26 dlclose()s the plugin after its last communicator and may load it again:
 * init/listen/finalize/dlclose cycles must not leave fds or device contexts behind. */
static int reload_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct usage a, b;
    const int cycles = 20;
    for (int i = 0; i <= cycles; i++) {
        struct netapi n;
        void *lc;
        char handle[NCCL_NET_HANDLE_MAXSIZE];
        if (i == 1) usage_take(&a, 1);
        CHECK(net_open(&n, c->version, c->dev) == 0);
        CHECK(net_listen(&n, handle, &lc) == 0);
        CHECK(net_close_listen(&n, lc) == 0);
        net_close(&n);
    }
    usage_take(&b, 1);
    return usage_compare("init/finalize/dlclose", c, cycles, &a, &b, 0);
}

/* NCCL abandons a connect on abort: it stops calling connect() before it completes. The
 * socket, QPs, CQ and control region of that connect are released at finalize. */
static int abandoned_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct usage a, b;
    const int cycles = 5;
    for (int i = 0; i <= cycles; i++) {
        struct netapi n;
        void *lc, *sc = NULL;
        char handle[NCCL_NET_HANDLE_MAXSIZE];
        if (i == 1) usage_take(&a, 1);
        CHECK(net_open(&n, c->version, c->dev) == 0);
        CHECK(net_listen(&n, handle, &lc) == 0);
        for (int k = 0; k < 20; k++) { /* the hello goes out; accept is never called */
            CHECK(n.p.v12->connect(n.ctx, n.dev, handle, &sc, &(ncclNetDeviceHandle_t *){NULL}) ==
                  0);
            CHECK(sc == NULL);
            usleep(5000);
        }
        CHECK(net_close_listen(&n, lc) == 0);
        net_close(&n);
    }
    usage_take(&b, 1);
    return usage_compare("abandoned connect, finalize", c, cycles, &a, &b, 0);
}

/* NCCL's abort may finalize before it closes (net_ib never releases its devices, so there that
 * order is harmless). A last finalize with comms and registrations open must keep what their
 * handles point into, release it when the last is closed, and let a later init use the devices
 * that are still open. Both ends in this process. */
struct solo_pair {
    void *lc, *sc, *rc, *smh, *rmh;
    uint8_t *sbuf, *rbuf;
};

static int solo_pair_open(struct netapi *n, struct solo_pair *p) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    memset(p, 0, sizeof(*p));
    CHECK(net_listen(n, handle, &p->lc) == 0);
    double end = now_s() + TMO;
    while ((!p->sc || !p->rc) && now_s() < end) {
        ncclNetDeviceHandle_t *dh = NULL;
        if (!p->sc) CHECK(n->p.v12->connect(n->ctx, n->dev, handle, &p->sc, &dh) == 0);
        if (!p->rc) CHECK(n->t12->accept(p->lc, &p->rc, &dh) == 0);
    }
    CHECK(p->sc && p->rc);
    CHECK((p->sbuf = page_alloc(SMALL)) && (p->rbuf = page_alloc(SMALL)));
    CHECK(net_regmr(n, p->sc, p->sbuf, SMALL, &p->smh) == 0);
    CHECK(net_regmr(n, p->rc, p->rbuf, SMALL, &p->rmh) == 0);
    return 0;
}

static int solo_exchange(struct netapi *n, struct solo_pair *p, uint8_t seed) {
    void *data = p->rbuf, *rreq, *sreq;
    size_t len = SMALL;
    int tag = 0, got = -1;
    pattern_fill(p->sbuf, SMALL, seed);
    memset(p->rbuf, 0, SMALL);
    CHECK(net_irecv(n, p->rc, 1, &data, &len, &tag, &p->rmh, &rreq, TMO) == 0);
    CHECK(net_isend(n, p->sc, p->sbuf, SMALL, 0, p->smh, &sreq, TMO) == 0);
    CHECK(net_wait(n, sreq, NULL, TMO) == 0);
    CHECK(net_wait(n, rreq, &got, TMO) == 0);
    CHECK(got == SMALL && pattern_check(p->rbuf, SMALL, seed) < 0);
    return 0;
}

static int solo_pair_close_send(struct netapi *n, struct solo_pair *p) {
    CHECK(net_deregmr(n, p->sc, p->smh) == 0);
    CHECK(net_close_send(n, p->sc) == 0);
    free(p->sbuf);
    return 0;
}

static int solo_pair_close_rest(struct netapi *n, struct solo_pair *p) {
    CHECK(net_deregmr(n, p->rc, p->rmh) == 0);
    CHECK(net_close_recv(n, p->rc) == 0);
    CHECK(net_close_listen(n, p->lc) == 0);
    free(p->rbuf);
    return 0;
}

static int finalize_open_main(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    struct solo_pair p1, p2;
    struct usage a, b;
    (void)d;
    CHECK(net_open(&n, c->version, c->dev) == 0); /* a first cycle: what loading keeps */
    CHECK(solo_pair_open(&n, &p1) == 0);
    CHECK(solo_pair_close_send(&n, &p1) == 0 && solo_pair_close_rest(&n, &p1) == 0);
    net_close(&n);
    usage_take(&a, 1);

    /* finalize first, then a later init while the first pair is half open */
    CHECK(net_open(&n, c->version, c->dev) == 0);
    CHECK(solo_pair_open(&n, &p1) == 0);
    CHECK(solo_exchange(&n, &p1, 3) == 0);
    log_reset();
    CHECK(n.t12->finalize(n.ctx) == 0);
    CHECK(log_contains("still open: the devices are released when the last of them is closed"));
    CHECK(solo_pair_close_send(&n, &p1) == 0);
    void *ctx2 = NULL;
    ncclNetCommConfig_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
    CHECK(n.t12->init(&ctx2, 43, &cfg, log_capture, NULL) == 0);
    n.ctx = ctx2;
    CHECK(solo_pair_open(&n, &p2) == 0);
    CHECK(solo_exchange(&n, &p2, 4) == 0);
    CHECK(solo_pair_close_rest(&n, &p1) == 0); /* init holds the devices: nothing released */
    CHECK(solo_exchange(&n, &p2, 5) == 0);
    CHECK(solo_pair_close_send(&n, &p2) == 0 && solo_pair_close_rest(&n, &p2) == 0);
    CHECK(n.t12->finalize(n.ctx) == 0); /* nothing open: released here */

    /* finalize first, then every close: the last one releases the devices */
    CHECK(n.t12->init(&n.ctx, 44, &cfg, log_capture, NULL) == 0);
    CHECK(solo_pair_open(&n, &p1) == 0);
    CHECK(solo_exchange(&n, &p1, 6) == 0);
    CHECK(n.t12->finalize(n.ctx) == 0);
    n.ctx = NULL;
    log_reset();
    CHECK(solo_pair_close_send(&n, &p1) == 0 && solo_pair_close_rest(&n, &p1) == 0);
    CHECK(log_contains("releasing the devices"));
    usage_settled(c, &b, &a, 1); /* with the plugin still loaded: the last close released */
    net_close(&n);
    CHECK(a.fds == b.fds);
    CHECK(!strcmp(a.rdma, b.rdma));
    figure("finalize before close on %s: every close worked, the last released the devices "
           "(fds %d -> %d)",
           c->dev, a.fds, b.fds);
    return 0;
}

/* ------------------------------------------------------------ scenarios: packet loss
 * Needs tests/vm/loss_setup.sh (run by tests/vm/loss_test.sh inside the VM): rxl0 on vl0
 * (10.79.0.1) and rxl1 on vl1 (10.79.0.2), a veth pair. RoCE packets rxl0 -> rxl1 leave
 * through vl0's qdisc, the answers through lo: netem on both drops both directions.
 * ITEST_LOSS=1 selects these cases instead of the default ones. */
#define LOSS_SEND_DEV "rxl0"
#define LOSS_RECV_DEV "rxl1"

static long retry_counter(void) {
    FILE *f = fopen(
        "/sys/class/infiniband/" LOSS_SEND_DEV "/ports/1/hw_counters/completer_retry_err", "r");
    long v = -1;
    if (f && fscanf(f, "%ld", &v) != 1) v = -1;
    if (f) fclose(f);
    return v;
}

static int set_loss(int pct) {
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "tc qdisc replace dev vl0 root netem loss %d%% && tc qdisc replace dev lo root netem "
             "loss %d%%",
             pct, pct);
    if (pct == 0) snprintf(cmd, sizeof(cmd), "tc qdisc del dev vl0 root; tc qdisc del dev lo root");
    int rc = system(cmd);
    return pct == 0 ? 0 : rc;
}

static int loss_pct(const struct cfg *c) {
    return atoi(strrchr(c->dev, '/') ? strrchr(c->dev, '/') + 1 : "0");
}

#define LOSS_MSGS 8
#define LOSS_SZ   (256u << 10)

static int loss_recv(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *lc, *comm, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    int pct = loss_pct(c);
    CHECK(net_open(&n, c->version, LOSS_RECV_DEV) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    uint8_t *buf = page_alloc(LOSS_SZ);
    CHECK(net_regmr(&n, comm, buf, LOSS_SZ, &mh) == 0);
    if (pct == 100) { /* a clear-to-send reaches the sender, then the wire goes dark */
        void *data = buf;
        size_t len = LOSS_SZ;
        int tag = 0;
        CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
        usleep(500000);
        CHECK(duo_barrier(d) == 0);
        CHECK(duo_barrier(d) == 0); /* the sender has seen its error */
    } else {
        for (int i = 0; i < LOSS_MSGS; i++) {
            void *data = buf;
            size_t len = LOSS_SZ;
            int tag = 0, got = -1;
            memset(buf, 0, LOSS_SZ);
            CHECK(net_irecv(&n, comm, 1, &data, &len, &tag, &mh, &req, TMO) == 0);
            CHECK(net_wait(&n, req, &got, TMO) == 0);
            CHECK(got == (int)LOSS_SZ - i);
            long bad = pattern_check(buf, (size_t)got, (uint32_t)i + 500);
            if (bad >= 0) fprintf(stderr, "message %d: first wrong byte at %ld\n", i, bad);
            CHECK(bad < 0);
        }
        CHECK(duo_barrier(d) == 0);
    }
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_recv(&n, comm) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

static int loss_send(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    void *comm, *mh, *req;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    int pct = loss_pct(c);
    CHECK(net_open(&n, c->version, LOSS_SEND_DEV) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    uint8_t *buf = page_alloc(LOSS_SZ);
    CHECK(net_regmr(&n, comm, buf, LOSS_SZ, &mh) == 0);
    long r0 = retry_counter();
    if (pct == 100) {
        /* one exchange first so a clear-to-send is waiting, then the wire goes dark */
        long timeout = atol(getenv("NCCL_IB_TIMEOUT")), retry = atol(getenv("NCCL_IB_RETRY_CNT"));
        double expect = 4.096e-6 * (double)(1L << timeout) * (double)(retry + 1);
        CHECK(duo_barrier(d) == 0);
        CHECK(set_loss(100) == 0);
        log_reset();
        double t0 = now_s();
        int rc = net_isend(&n, comm, buf, 4096, 0, mh, &req, TMO);
        if (rc == 0) rc = net_wait(&n, req, NULL, 60);
        double dt = now_s() - t0;
        set_loss(0);
        fprintf(stderr, "100%% loss: rc %d after %.2f s (expected ~%.2f s)\n%s", rc, dt, expect,
                log_text());
        figure("100%% loss on %s: error after %.2f s; NCCL_IB_TIMEOUT=%ld NCCL_IB_RETRY_CNT=%ld "
               "imply %.2f s; retries counted %ld",
               LOSS_SEND_DEV, dt, timeout, retry, expect, retry_counter() - r0);
        CHECK(rc == ncclRemoteError);
        CHECK(dt < 4 * expect + 2.0);
        CHECK(duo_barrier(d) == 0);
        CHECK(log_contains("NCCL_IB_TIMEOUT") && log_contains("NCCL_IB_RETRY_CNT"));
    } else {
        CHECK(set_loss(pct) == 0);
        double t0 = now_s();
        for (int i = 0; i < LOSS_MSGS; i++) {
            pattern_fill(buf, LOSS_SZ - i, (uint32_t)i + 500);
            CHECK(net_isend(&n, comm, buf, LOSS_SZ - i, 0, mh, &req, TMO) == 0);
            CHECK(net_wait(&n, req, NULL, TMO) == 0);
        }
        double dt = now_s() - t0;
        set_loss(0);
        long retries = retry_counter() - r0;
        figure("%d%% loss on %s->%s: %d x 256 KiB intact in %.1f s, %ld RC retransmission "
               "timeouts counted",
               pct, LOSS_SEND_DEV, LOSS_RECV_DEV, LOSS_MSGS, dt, retries);
        CHECK(retries > 0); /* the loss was really applied to RDMA traffic */
        CHECK(duo_barrier(d) == 0);
    }
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    free(buf);
    return 0;
}

/* ------------------------------------------------------------ cmocka glue */
enum runner { RUN_DUO, RUN_KILL, RUN_SOLO };

struct scenario {
    const char *name;
    enum runner runner;
    duo_fn a, b; /* DUO: receiver, sender; KILL: survivor, victim; SOLO: a only */
    const char *env;
};

static const struct scenario scenarios[] = {
    {"death/sender_killed_mid_transfer", RUN_KILL, death_rs_mid_recv, death_rs_mid_send, NULL},
    {"death/sender_killed_between_messages", RUN_KILL, death_rs_idle_recv, death_rs_idle_send,
     NULL},
    {"death/receiver_killed_mid_transfer", RUN_KILL, death_sr_mid_send, death_sr_mid_recv, NULL},
    {"death/receiver_killed_between_messages", RUN_KILL, death_sr_idle_send, death_sr_idle_recv,
     NULL},
    {"death/sender_killed_in_rdmacm_handshake", RUN_KILL, cm_death_sender_survivor,
     cm_death_sender_victim, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_CONNECT_TIMEOUT=60"},
    {"death/sender_killed_before_warmups_arrived", RUN_KILL, cm_death_warmup_survivor,
     cm_death_warmup_victim, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_CONNECT_TIMEOUT=60"},
    {"death/sender_disconnected_before_warmups_arrived", RUN_KILL, cm_disconnect_warmup_survivor,
     cm_disconnect_warmup_victim, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_CONNECT_TIMEOUT=60"},
    {"death/receiver_killed_in_rdmacm_handshake", RUN_KILL, cm_death_receiver_survivor,
     cm_death_receiver_victim, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_CONNECT_TIMEOUT=60"},
    {"startup/connect_before_listener", RUN_DUO, late_listener_recv, late_listener_send, NULL},
    {"startup/accept_late", RUN_DUO, late_accept_recv, late_accept_send, NULL},
    {"close/sender_closes_after_last_completion", RUN_DUO, close_at_once_recv, close_at_once_send,
     NULL},
    {"close/peer_closes_with_receive_unmatched", RUN_DUO, close_unmatched_recv,
     close_unmatched_send, NULL},
    {"stall/peer_posts_no_receive_then_sends_nothing", RUN_DUO, stall_recv, stall_send,
     "NCCL_ERDMA_STALL_WARN=1"},
    {"close/latency_per_comm_rdmacm", RUN_DUO, close_lat_recv, close_lat_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm"},
    {"startup/stale_handle_and_closed_port", RUN_SOLO, dead_handle_main, NULL,
     "NCCL_ERDMA_CONNECT_TIMEOUT=2"},
    {"input/bad_handles", RUN_SOLO, bad_handles_main, NULL, NULL},
    {"input/stray_tcp_clients", RUN_SOLO, stray_main, NULL, "NCCL_ERDMA_CONNECT_TIMEOUT=2"},
    {"input/real_peer_behind_idle_clients", RUN_SOLO, idle_strays_main, NULL, NULL},
    {"input/forged_handshake_gid", RUN_SOLO, forged_handshake_main, NULL, NULL},
    {"input/rejected_rdmacm_requests", RUN_DUO, rejects_listen, rejects_connect,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm"},
    {"input/flush_listener_closed_after_setup", RUN_DUO, flush_listener_recv, flush_listener_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_FORCE_FLUSH=1"},
    {"input/stranger_at_flush_listener_during_setup", RUN_DUO, flush_stranger_recv,
     flush_listener_send, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_FORCE_FLUSH=1"},
    {"input/local_stranger_at_flush_listener_during_setup", RUN_DUO, flush_local_stranger_recv,
     flush_listener_send, "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_FORCE_FLUSH=1"},
    {"input/flush_loopback_port_taken", RUN_DUO, flush_port_taken_recv, flush_listener_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_ERDMA_FORCE_FLUSH=1"},
    {"input/rdmacm_migrate_fails", RUN_DUO, migrate_fails_recv, migrate_fails_send,
     "NCCL_ERDMA_CONNECT_MODE=rdmacm;NCCL_IB_QPS_PER_CONNECTION=2"},
    {"input/regmr_unmapped", RUN_SOLO, regmr_bad_main, NULL, NULL},
    {"input/memlock_too_low", RUN_SOLO, memlock_main, NULL, NULL},
    {"hygiene/connect_transfer_close_cycles", RUN_DUO, cycles_recv, cycles_send, NULL},
    {"hygiene/forked_child_exits", RUN_SOLO, forked_child_main, NULL, NULL},
    {"hygiene/forked_child_calls", RUN_SOLO, forked_calls_main, NULL, NULL},
    {"hygiene/exit_while_testing", RUN_SOLO, exit_busy_main, NULL, NULL},
    {"hygiene/abandoned_connect", RUN_SOLO, abandoned_main, NULL, NULL},
    {"hygiene/finalize_before_close", RUN_SOLO, finalize_open_main, NULL, NULL},
    {"hygiene/plugin_reload_cycles", RUN_SOLO, reload_main, NULL, NULL},
};

static const struct scenario loss_scenarios[] = {
    {"loss/1", RUN_DUO, loss_recv, loss_send, "NCCL_IB_TIMEOUT=12;NCCL_IB_RETRY_CNT=7"},
    {"loss/5", RUN_DUO, loss_recv, loss_send, "NCCL_IB_TIMEOUT=12;NCCL_IB_RETRY_CNT=7"},
    {"loss/100", RUN_DUO, loss_recv, loss_send, "NCCL_IB_TIMEOUT=14;NCCL_IB_RETRY_CNT=2"},
};

struct test_case {
    const struct scenario *sc;
    struct cfg cfg;
    char name[128];
};

static void run_case(void **state) {
    struct test_case *tc = *state;
    assert_true(in_rdma_vm());
    env_apply(tc->sc->env, true);
    int rc;
    double t0 = now_s();
    switch (tc->sc->runner) {
    case RUN_KILL:
        rc = pair_run(tc->sc->a, tc->sc->b, &tc->cfg, 120);
        break;
    case RUN_SOLO:
        rc = duo_run(tc->sc->a, nothing, &tc->cfg, 120);
        break;
    default:
        rc = duo_run(tc->sc->a, tc->sc->b, &tc->cfg, 300);
        break;
    }
    env_apply(tc->sc->env, false);
    fprintf(stderr, "  %s: %.1f s\n", tc->name, now_s() - t0);
    assert_int_equal(rc, 0);
}

int main(void) {
    const char *devs = getenv("ITEST_DEVICES") ? getenv("ITEST_DEVICES") : "rxe0,siw0";
    const char *only = getenv("ITEST_ONLY");
    size_t nsc = sizeof(scenarios) / sizeof(scenarios[0]);
    const struct scenario *table = scenarios;
    if (getenv("ITEST_LOSS")) { /* tests/vm/loss_test.sh: one pseudo-device per loss level */
        table = loss_scenarios;
        nsc = sizeof(loss_scenarios) / sizeof(loss_scenarios[0]);
        devs = "rxl";
    }
    struct test_case *cases = calloc(8 * nsc, sizeof(*cases));
    struct CMUnitTest *tests = calloc(8 * nsc, sizeof(*tests));
    int n = 0;
    char list[128];
    snprintf(list, sizeof(list), "%s", devs);
    for (char *save, *dev = strtok_r(list, ",", &save); dev && n < 7 * (int)nsc;
         dev = strtok_r(NULL, ",", &save)) {
        for (size_t s = 0; s < nsc; s++) {
            struct test_case *tc = &cases[n];
            tc->sc = &table[s];
            snprintf(tc->cfg.dev, sizeof(tc->cfg.dev), "%s",
                     table == scenarios ? dev : table[s].name);
            tc->cfg.version = 12;
            snprintf(tc->name, sizeof(tc->name), "%s/v12/%s", dev, table[s].name);
            if (only && !strstr(tc->name, only)) continue;
            /* "_gid": scripts the whole handshake over TCP, which siw's rdma_cm mode is not */
            if (strstr(table[s].name, "_gid") && !strncmp(dev, "siw", 3)) continue;
            tests[n] =
                (struct CMUnitTest){.name = tc->name, .test_func = run_case, .initial_state = tc};
            n++;
        }
    }
    if (n == 0) {
        fprintf(stderr, "no case matches ITEST_ONLY=%s\n", only ? only : "");
        return 1;
    }
    return _cmocka_run_group_tests("integration: failures", tests, (size_t)n, NULL, NULL);
}
