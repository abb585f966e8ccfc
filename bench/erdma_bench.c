/*
 * erdma_bench: a plugin-level benchmark that drives the built
 * libnccl-net-erdma.so through dlopen() and the ncclNet tables, the way
 * NCCL's proxy thread does: host buffers registered with regMr, a window of
 * isend/irecv requests in flight (NULL request = "try again"), completion by
 * test(). It links nothing of the plugin, so it measures exactly what NCCL
 * would get.
 *
 * Two processes: the server is the receiver, the client the sender. By
 * default one fork()s the other and the listen handle travels through a pipe;
 * --server/--client split them across hosts (the handle printed as hex).
 * The client's options rule: it ships them to the server over the plugin
 * connection itself, together with the handle of a second, reverse
 * connection that latency mode needs for the pong.
 *
 * Output mirrors perftest: bandwidth as "BW average" in decimal MB/s, latency
 * as t_avg = round trip / 2 in microseconds. The first iteration of every size
 * carries a pattern that the receiver checks (and the bytes after the message
 * must stay untouched), so a broken transfer cannot produce a number.
 */
#define _GNU_SOURCE
#include "bench_clock.h"
#include "nccl_net_abi.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAGIC  0x45424e43u /* "EBNC" */
#define BENCH_TAG    0x5a
#define CTRL_BYTES   4096
#define GUARD_BYTES  64
#define GUARD_FILL   0xee
#define MAX_WINDOW   NCCL_NET_MAX_REQUESTS
#define MAX_LAT_ITER 100000
#define MAX_SIZES    40

enum bench_mode { MODE_BW = 1, MODE_LAT = 2, MODE_BOTH = 3 };
enum bench_role { ROLE_FORK, ROLE_SERVER, ROLE_CLIENT };

/* Everything both sides must agree on; the client sends it to the server. */
struct bench_cfg {
    uint32_t magic;
    uint32_t mode;
    uint32_t window;
    uint32_t verify;
    uint32_t nbw, nlat;
    uint64_t bw_sizes[MAX_SIZES];
    uint64_t bw_total; /* timed bytes per size */
    uint64_t bw_min_iters, bw_warmup;
    uint64_t lat_sizes[MAX_SIZES];
    uint64_t lat_iters, lat_warmup;
    uint32_t lat_depth; /* receives kept posted in ping-pong */
    uint32_t reserved;
};

struct ctrl_msg {
    struct bench_cfg cfg;
    char reverse_handle[NCCL_NET_HANDLE_MAXSIZE];
};
_Static_assert(sizeof(struct ctrl_msg) <= CTRL_BYTES, "control message too large");

struct opts {
    struct bench_cfg cfg;
    enum bench_role role;
    int api; /* 8 or 12 */
    const char *dev_name;
    const char *plugin_path;
    const char *handle_out; /* --server: where the hex handle goes ("-" = stdout) */
    const char *handle_in;  /* --client: hex, or @file */
    int timeout_s;
    int verbose;
    int breakdown;
    int poll_sleep_us; /* diagnostic: yield the CPU between empty tests (bandwidth) */
    uint64_t bw_min, bw_max, bw_factor; /* ranges that fill the size lists ... */
    uint64_t lat_min, lat_max, lat_factor;
    const char *bw_list, *lat_list; /* ... unless given as lists */
};

/* ------------------------------------------------------------ plugin adapter */

/* One calling convention over the v8 and v12 tables. */
struct net {
    int api;
    void *dl;
    const ncclNet_v8_t *v8;
    const ncclNet_v12_t *v12;
    void *ctx; /* v12 per-communicator context */
};

static struct opts g_opt;
static const char *g_side = "bench";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "erdma_bench[%s]: ", g_side);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void plugin_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                       const char *fmt, ...) {
    if (level > NCCL_LOG_WARN && level != NCCL_LOG_ABORT && g_opt.verbose < (level == 3 ? 1 : 2))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *lv = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE";
    fprintf(stderr, "[%s] NET/eRDMA %s %s\n", g_side, lv, msg);
}

#define NCHECK(call)                                                                               \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) die("%s failed: ncclResult %d (line %d)", #call, r_, __LINE__);     \
    } while (0)

static void net_open(struct net *n, const struct opts *o) {
    memset(n, 0, sizeof(*n));
    n->api = o->api;
    const char *path = o->plugin_path ? o->plugin_path : "libnccl-net-erdma.so";
    n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!n->dl) die("dlopen %s: %s", path, dlerror());
    if (n->api == 8) {
        n->v8 = dlsym(n->dl, "ncclNetPlugin_v8");
        if (!n->v8) die("%s exports no ncclNetPlugin_v8", path);
        NCHECK(n->v8->init(plugin_log));
    } else {
        n->v12 = dlsym(n->dl, "ncclNetPlugin_v12");
        if (!n->v12) die("%s exports no ncclNetPlugin_v12", path);
        ncclNetCommConfig_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
        NCHECK(n->v12->init(&n->ctx, 0x62656e6368ull, &cfg, plugin_log, NULL));
    }
}

static void net_close(struct net *n) {
    if (n->v12 && n->v12->finalize) NCHECK(n->v12->finalize(n->ctx));
    dlclose(n->dl);
}

/* The plugin's index of the device named `name`; dies if it is not offered. */
static int net_find_dev(struct net *n, const char *name) {
    int ndev = 0;
    NCHECK(n->v8 ? n->v8->devices(&ndev) : n->v12->devices(&ndev));
    for (int i = 0; i < ndev; i++) {
        const char *dn;
        ncclNetProperties_v8_t p8;
        ncclNetProperties_v12_t p12;
        if (n->v8) {
            NCHECK(n->v8->getProperties(i, &p8));
            dn = p8.name;
        } else {
            NCHECK(n->v12->getProperties(i, &p12));
            dn = p12.name;
        }
        if (!name || !strcmp(dn, name)) return i;
    }
    die("device %s not offered by the plugin (%d devices; NCCL_IB_HCA=%s)", name ? name : "any",
        ndev, getenv("NCCL_IB_HCA") ? getenv("NCCL_IB_HCA") : "");
}

static void net_listen(struct net *n, int dev, void *handle, void **lc) {
    NCHECK(n->v8 ? n->v8->listen(dev, handle, lc) : n->v12->listen(n->ctx, dev, handle, lc));
}

static ncclResult_t net_connect(struct net *n, int dev, void *handle, void **sc) {
    ncclNetDeviceHandle_t *devh = NULL;
    return n->v8 ? n->v8->connect(dev, handle, sc, &devh)
                 : n->v12->connect(n->ctx, dev, handle, sc, &devh);
}

static ncclResult_t net_accept(struct net *n, void *lc, void **rc) {
    ncclNetDeviceHandle_t *devh = NULL;
    return n->v8 ? n->v8->accept(lc, rc, &devh) : n->v12->accept(lc, rc, &devh);
}

static void *net_reg(struct net *n, void *comm, void *buf, size_t len) {
    void *mh = NULL;
    NCHECK(n->v8 ? n->v8->regMr(comm, buf, len, NCCL_PTR_HOST, &mh)
                 : n->v12->regMr(comm, buf, len, NCCL_PTR_HOST, &mh));
    return mh;
}

static void net_dereg(struct net *n, void *comm, void *mh) {
    NCHECK(n->v8 ? n->v8->deregMr(comm, mh) : n->v12->deregMr(comm, mh));
}

static ncclResult_t net_isend(struct net *n, void *sc, void *buf, size_t len, void *mh,
                              void **req) {
    if (n->v8) return n->v8->isend(sc, buf, (int)len, BENCH_TAG, mh, req);
    return n->v12->isend(sc, buf, len, BENCH_TAG, mh, NULL, req);
}

static ncclResult_t net_irecv(struct net *n, void *rc, void *buf, size_t len, void *mh,
                              void **req) {
    int tag = BENCH_TAG;
    if (n->v8) {
        int sz = (int)len;
        return n->v8->irecv(rc, 1, &buf, &sz, &tag, &mh, req);
    }
    size_t sz = len;
    void *ph = NULL;
    return n->v12->irecv(rc, 1, &buf, &sz, &tag, &mh, &ph, req);
}

static ncclResult_t net_test(struct net *n, void *req, int *done, int *size) {
    return n->v8 ? n->v8->test(req, done, size) : n->v12->test(req, done, size);
}

static void net_close_send(struct net *n, void *sc) {
    NCHECK(n->v8 ? n->v8->closeSend(sc) : n->v12->closeSend(sc));
}
static void net_close_recv(struct net *n, void *rc) {
    NCHECK(n->v8 ? n->v8->closeRecv(rc) : n->v12->closeRecv(rc));
}
static void net_close_listen(struct net *n, void *lc) {
    NCHECK(n->v8 ? n->v8->closeListen(lc) : n->v12->closeListen(lc));
}

/* ------------------------------------------------------------ buffers and patterns */

struct buf {
    void *ptr;
    size_t len; /* registered length */
    void *mh;
    void *comm;
};

static void buf_alloc(struct net *n, struct buf *b, void *comm, size_t len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    b->len = (len + GUARD_BYTES + page - 1) / page * page;
    if (posix_memalign(&b->ptr, page, b->len)) die("cannot allocate %zu bytes", b->len);
    memset(b->ptr, 0, b->len);
    b->comm = comm;
    b->mh = net_reg(n, comm, b->ptr, b->len);
}

static void buf_free(struct net *n, struct buf *b) {
    net_dereg(n, b->comm, b->mh);
    free(b->ptr);
}

/* A pattern that differs per size and per direction, so a stale or misplaced buffer shows. */
static inline uint8_t pattern_byte(size_t i, size_t size, unsigned salt) {
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + size * 31u + salt;
    return (uint8_t)(x >> 56 ^ x >> 17 ^ x);
}

static void pattern_fill(uint8_t *p, size_t size, unsigned salt) {
    for (size_t i = 0; i < size; i++)
        p[i] = pattern_byte(i, size, salt);
}

static void recv_prepare(uint8_t *p, size_t size) {
    memset(p, GUARD_FILL ^ 0x11, size);
    memset(p + size, GUARD_FILL, GUARD_BYTES);
}

/* 0 when the pattern and the guard are intact; else explains the first bad byte. */
static int pattern_check(const uint8_t *p, size_t size, unsigned salt, int got_size, char *why,
                         size_t whylen) {
    if ((size_t)got_size != size) {
        snprintf(why, whylen, "test() reported %d bytes, sent %zu", got_size, size);
        return -1;
    }
    for (size_t i = 0; i < size; i++) {
        if (p[i] != pattern_byte(i, size, salt)) {
            size_t bad = 0;
            for (size_t j = i; j < size; j++)
                bad += p[j] != pattern_byte(j, size, salt);
            snprintf(why, whylen, "byte %zu is 0x%02x, expected 0x%02x (%zu of %zu bytes wrong)", i,
                     p[i], pattern_byte(i, size, salt), bad, size);
            return -1;
        }
    }
    for (size_t i = size; i < size + GUARD_BYTES; i++) {
        if (p[i] != GUARD_FILL) {
            snprintf(why, whylen, "byte %zu past the end was overwritten (0x%02x)", i - size, p[i]);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ request helpers */

static double g_deadline;

/* Called from every spin loop: looks at the cycle counter (tick_s) once per 64 calls. Not
 * clock_gettime: in the emulated VM that is a system call (see bench_clock.h), which
 * verbs_floor's spin loops never make. g_deadline is in tick_s()'s seconds. */
static void check_deadline(const char *what, size_t size, uint64_t done, uint64_t total) {
    static unsigned calls;
    if ((++calls & 63) == 0 && tick_s() > g_deadline)
        die("timeout after %d s in %s, size %zu: %" PRIu64 " of %" PRIu64
            " requests completed (plugin stalled?)",
            g_opt.timeout_s, what, size, done, total);
}

/* Posts until the plugin hands out a request; NULL means "not now", as NCCL retries. */
static void *post_send(struct net *n, void *sc, void *buf, size_t len, void *mh) {
    void *req = NULL;
    for (;;) {
        ncclResult_t r = net_isend(n, sc, buf, len, mh, &req);
        if (r != ncclSuccess) die("isend of %zu bytes failed: ncclResult %d", len, r);
        if (req) return req;
        check_deadline("isend", len, 0, 1);
    }
}

static void *post_recv(struct net *n, void *rc, void *buf, size_t len, void *mh) {
    void *req = NULL;
    for (;;) {
        ncclResult_t r = net_irecv(n, rc, buf, len, mh, &req);
        if (r != ncclSuccess) die("irecv of %zu bytes failed: ncclResult %d", len, r);
        if (req) return req;
        check_deadline("irecv", len, 0, 1);
    }
}

static int wait_req(struct net *n, void *req, const char *what, size_t len) {
    int done = 0, size = -1;
    for (;;) {
        ncclResult_t r = net_test(n, req, &done, &size);
        if (r != ncclSuccess) die("test of %s (%zu bytes) failed: ncclResult %d", what, len, r);
        if (done) return size;
        check_deadline(what, len, 0, 1);
    }
}

/* ------------------------------------------------------------ the benchmarks */

struct peer {
    struct net *net;
    void *send_comm; /* client: to the server; server: the reverse (pong) direction */
    void *recv_comm;
    struct buf data_send, data_recv;
};

static void verify_one(struct peer *p, bool sender, size_t size, unsigned salt) {
    char why[256];
    if (sender) {
        pattern_fill(p->data_send.ptr, size, salt);
        void *req = post_send(p->net, p->send_comm, p->data_send.ptr, size, p->data_send.mh);
        wait_req(p->net, req, "verify send", size);
        return;
    }
    recv_prepare(p->data_recv.ptr, size);
    void *req = post_recv(p->net, p->recv_comm, p->data_recv.ptr, size, p->data_recv.mh);
    int got = wait_req(p->net, req, "verify recv", size);
    if (pattern_check(p->data_recv.ptr, size, salt, got, why, sizeof(why)))
        die("DATA CHECK FAILED at %zu bytes: %s", size, why);
}

/*
 * Keeps `window` requests in flight and completes them in posting order, as
 * NCCL's proxy does. Returns the elapsed seconds from the first post.
 */
static double stream(struct peer *p, bool sender, size_t size, uint64_t iters, unsigned window) {
    void *ring[MAX_WINDOW];
    uint64_t posted = 0, done = 0;
    struct buf *b = sender ? &p->data_send : &p->data_recv;
    double t0 = now_s();
    while (done < iters) {
        while (posted < iters && posted - done < window) {
            void *req = NULL;
            ncclResult_t r = sender ? net_isend(p->net, p->send_comm, b->ptr, size, b->mh, &req)
                                    : net_irecv(p->net, p->recv_comm, b->ptr, size, b->mh, &req);
            if (r != ncclSuccess)
                die("%s #%" PRIu64 " of %zu bytes failed: ncclResult %d",
                    sender ? "isend" : "irecv", posted, size, r);
            if (!req) break; /* "try again": go complete something first */
            ring[posted++ % MAX_WINDOW] = req;
        }
        if (posted == done) {
            check_deadline(sender ? "isend" : "irecv", size, done, iters);
            continue;
        }
        int fin = 0, got = -1;
        ncclResult_t r = net_test(p->net, ring[done % MAX_WINDOW], &fin, &got);
        if (r != ncclSuccess)
            die("test of %s #%" PRIu64 " (%zu bytes) failed: ncclResult %d",
                sender ? "send" : "recv", done, size, r);
        if (fin) {
            if ((size_t)got != size)
                die("%s #%" PRIu64 ": test() reported %d bytes, expected %zu",
                    sender ? "send" : "recv", done, got, size);
            done++;
        } else {
            check_deadline(sender ? "send" : "recv", size, done, iters);
            if (g_opt.poll_sleep_us) usleep((useconds_t)g_opt.poll_sleep_us);
        }
    }
    return now_s() - t0;
}

static uint64_t bw_iters(const struct bench_cfg *c, size_t size) {
    uint64_t it = c->bw_total / size;
    return it < c->bw_min_iters ? c->bw_min_iters : it;
}

/* Warmup is capped at a quarter of the timed bytes so that large sizes stay affordable. */
static uint64_t bw_warmup_iters(const struct bench_cfg *c, size_t size) {
    uint64_t cap = c->bw_total / size / 4;
    if (cap < 1) cap = 1;
    return c->bw_warmup < cap ? c->bw_warmup : cap;
}

static void run_bw(struct peer *p, const struct bench_cfg *c, bool sender) {
    if (sender) {
        printf("# bandwidth: window %u, %" PRIu64 " bytes per size (min %" PRIu64
               " iterations), %" PRIu64 " warmup\n",
               c->window, c->bw_total, c->bw_min_iters, c->bw_warmup);
        printf("#   (warmup capped at a quarter of the timed bytes)\n");
        printf("%-6s %12s %10s %14s %12s\n", "#mode", "bytes", "iters", "BW_avg[MB/s]", "Gb/s");
        fflush(stdout);
    }
    for (uint32_t k = 0; k < c->nbw; k++) {
        uint64_t size = c->bw_sizes[k];
        g_deadline = tick_s() + g_opt.timeout_s;
        if (c->verify) verify_one(p, sender, size, 0x100 + (unsigned)(size & 0xff));
        uint64_t iters = bw_iters(c, size);
        if (c->bw_warmup) stream(p, sender, size, bw_warmup_iters(c, size), c->window);
        double t = stream(p, sender, size, iters, c->window);
        if (sender) {
            double mbs = (double)size * (double)iters / t / 1e6;
            printf("%-6s %12" PRIu64 " %10" PRIu64 " %14.2f %12.3f\n", "bw", size, iters, mbs,
                   mbs * 8 / 1000);
            fflush(stdout);
        }
    }
}

/*
 * Ping-pong. Like NCCL's proxy, which posts receives for its NCCL_STEPS (8)
 * steps ahead, each side keeps --lat-depth (default 8) receives posted:
 * receive i+depth is posted right after message i is sent, so its
 * clear-to-send never sits on the critical path (and the plugin may batch
 * them). The client (pinger) times round trips.
 */
#define LAT_DEPTH_DEFAULT 8
static void run_lat(struct peer *p, const struct bench_cfg *c, bool client) {
    static double rtt[MAX_LAT_ITER];
    double phase[4] = {0};
    struct net *n = p->net;
    if (client) {
        printf("# latency: ping-pong, %" PRIu64 " iterations, %" PRIu64
               " warmup, %d receives pre-posted; one-way = round trip / 2\n",
               c->lat_iters, c->lat_warmup, c->lat_depth);
        lat_print_header();
        fflush(stdout);
    }
    for (uint32_t k = 0; k < c->nlat; k++) {
        uint64_t size = c->lat_sizes[k];
        g_deadline = tick_s() + g_opt.timeout_s;
        uint64_t total = c->lat_warmup + c->lat_iters + 1;
        char why[256];
        void *rreq[MAX_WINDOW];
        const uint64_t depth = c->lat_depth;
        if (c->verify) recv_prepare(p->data_recv.ptr, size); /* before the CTS can leave */
        for (uint64_t d = 0; d < depth && d < total; d++)
            rreq[d] = post_recv(n, p->recv_comm, p->data_recv.ptr, size, p->data_recv.mh);
        double prev_t0 = 0;
        for (uint64_t i = 0; i < total; i++) {
            bool check = c->verify && i == 0;
            unsigned ping_salt = 0x200 + (unsigned)size, pong_salt = 0x300 + (unsigned)size;
            if (check) pattern_fill(p->data_send.ptr, size, client ? ping_salt : pong_salt);
            /* the phase stamps only with --breakdown: verbs_floor reads the clock once per
             * round trip, and each read is a helper call under emulation */
            const bool bd = g_opt.breakdown;
            double t0 = tick_s(), ta = 0, tb = 0, tc = 0, t1 = 0;
            /* a round trip is the time from one ping's post to the next one's, as ib_write_lat
             * takes it: everything the client does per message counts, its next irecv too */
            if (client && i > c->lat_warmup) rtt[i - c->lat_warmup - 1] = t0 - prev_t0;
            prev_t0 = t0;
            void *cur = rreq[i % depth];
            if (client) {
                void *sreq = post_send(n, p->send_comm, p->data_send.ptr, size, p->data_send.mh);
                if (bd) ta = tick_s();
                int got = wait_req(n, cur, "pong recv", size);
                if (bd) t1 = tick_s();
                if (check &&
                    pattern_check(p->data_recv.ptr, size, pong_salt, got, why, sizeof(why)))
                    die("DATA CHECK FAILED (pong) at %zu bytes: %s", size, why);
                if (i + depth < total)
                    rreq[i % depth] =
                        post_recv(n, p->recv_comm, p->data_recv.ptr, size, p->data_recv.mh);
                if (bd) tb = tick_s();
                wait_req(n, sreq, "ping send", size);
                if (bd && i >= c->lat_warmup && i + 1 < total) {
                    tc = tick_s();
                    phase[0] += ta - t0, phase[1] += t1 - ta, phase[2] += tb - t1,
                        phase[3] += tc - tb;
                }
            } else {
                int got = wait_req(n, cur, "ping recv", size);
                if (bd) ta = tick_s();
                if (check &&
                    pattern_check(p->data_recv.ptr, size, ping_salt, got, why, sizeof(why)))
                    die("DATA CHECK FAILED (ping) at %zu bytes: %s", size, why);
                void *sreq = post_send(n, p->send_comm, p->data_send.ptr, size, p->data_send.mh);
                if (bd) tb = tick_s();
                if (i + depth < total)
                    rreq[i % depth] =
                        post_recv(n, p->recv_comm, p->data_recv.ptr, size, p->data_recv.mh);
                if (bd) tc = tick_s();
                wait_req(n, sreq, "pong send", size);
                if (bd && i > c->lat_warmup) {
                    phase[0] += ta - t0, phase[1] += tb - ta, phase[2] += tc - tb;
                    phase[3] += tick_s() - tc;
                }
            }
        }
        if (g_opt.breakdown) {
            double m = (double)c->lat_iters / 1e6;
            fprintf(stderr,
                    client ? "breakdown %7" PRIu64 " B client: isend %.1f us, pong arrival "
                             "%.1f, next irecv %.1f, send completion %.1f\n"
                           : "breakdown %7" PRIu64 " B server: wait for ping %.1f us, isend "
                             "%.1f, next irecv %.1f, send completion %.1f\n",
                    size, phase[0] / m, phase[1] / m, phase[2] / m, phase[3] / m);
        }
        memset(phase, 0, sizeof(phase));
        if (client) lat_print_row("lat", size, rtt, c->lat_iters);
    }
}

/* ------------------------------------------------------------ setup */

static void hex_encode(const void *src, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    const uint8_t *s = src;
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[s[i] >> 4];
        out[2 * i + 1] = digits[s[i] & 15];
    }
    out[2 * len] = 0;
}

static int hex_decode(const char *hex, void *dst, size_t len) {
    uint8_t *d = dst;
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        d[i] = (uint8_t)v;
    }
    return 0;
}

static void *connect_until(struct net *n, int dev, void *handle, const char *what) {
    void *sc = NULL;
    while (!sc) {
        ncclResult_t r = net_connect(n, dev, handle, &sc);
        if (r != ncclSuccess) die("connect (%s) failed: ncclResult %d", what, r);
        check_deadline(what, 0, 0, 1);
        if (!sc) usleep(100);
    }
    return sc;
}

static void *accept_until(struct net *n, void *lc, const char *what) {
    void *rc = NULL;
    while (!rc) {
        ncclResult_t r = net_accept(n, lc, &rc);
        if (r != ncclSuccess) die("accept (%s) failed: ncclResult %d", what, r);
        check_deadline(what, 0, 0, 1);
        if (!rc) usleep(100);
    }
    return rc;
}

static size_t max_size(const struct bench_cfg *c) {
    size_t m = 0;
    for (uint32_t i = 0; (c->mode & MODE_BW) && i < c->nbw; i++)
        m = c->bw_sizes[i] > m ? c->bw_sizes[i] : m;
    for (uint32_t i = 0; (c->mode & MODE_LAT) && i < c->nlat; i++)
        m = c->lat_sizes[i] > m ? c->lat_sizes[i] : m;
    return m;
}

/*
 * Server: listen, hand out the handle, accept; learn the config and the
 * reverse handle from the client's first message; connect back.
 */
static int run_server(struct net *n, int dev, int handle_fd) {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
    void *lc = NULL;
    net_listen(n, dev, handle, &lc);
    if (handle_fd >= 0) {
        if (write(handle_fd, handle, sizeof(handle)) != (ssize_t)sizeof(handle))
            die("cannot pass the handle: %s", strerror(errno));
        close(handle_fd);
    } else {
        char hex[2 * NCCL_NET_HANDLE_MAXSIZE + 1];
        hex_encode(handle, sizeof(handle), hex);
        FILE *f = strcmp(g_opt.handle_out, "-") ? fopen(g_opt.handle_out, "w") : stdout;
        if (!f) die("cannot write %s: %s", g_opt.handle_out, strerror(errno));
        fprintf(f, "%s\n", hex);
        if (f == stdout)
            fflush(f);
        else
            fclose(f);
    }
    g_deadline = tick_s() + g_opt.timeout_s;
    struct peer p = {.net = n};
    p.recv_comm = accept_until(n, lc, "accept");

    struct buf ctrl;
    buf_alloc(n, &ctrl, p.recv_comm, CTRL_BYTES);
    void *req = post_recv(n, p.recv_comm, ctrl.ptr, CTRL_BYTES, ctrl.mh);
    int got = wait_req(n, req, "control recv", CTRL_BYTES);
    struct ctrl_msg msg;
    memcpy(&msg, ctrl.ptr, sizeof(msg));
    if (got != (int)sizeof(msg) || msg.cfg.magic != BENCH_MAGIC)
        die("bad control message from the client (%d bytes, magic 0x%x)", got, msg.cfg.magic);
    buf_free(n, &ctrl);
    p.send_comm = connect_until(n, dev, msg.reverse_handle, "reverse connect");

    size_t max = max_size(&msg.cfg);
    buf_alloc(n, &p.data_recv, p.recv_comm, max);
    buf_alloc(n, &p.data_send, p.send_comm, max);
    if (msg.cfg.mode & MODE_BW) run_bw(&p, &msg.cfg, false);
    if (msg.cfg.mode & MODE_LAT) run_lat(&p, &msg.cfg, false);

    buf_free(n, &p.data_send);
    buf_free(n, &p.data_recv);
    net_close_send(n, p.send_comm);
    net_close_recv(n, p.recv_comm);
    net_close_listen(n, lc);
    return 0;
}

static int run_client(struct net *n, int dev, const void *server_handle) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    memcpy(handle, server_handle, sizeof(handle));
    g_deadline = tick_s() + g_opt.timeout_s;
    struct peer p = {.net = n};
    p.send_comm = connect_until(n, dev, handle, "connect");

    /* The reverse connection's handle rides on the first message. */
    struct ctrl_msg msg = {.cfg = g_opt.cfg};
    void *lc = NULL;
    net_listen(n, dev, msg.reverse_handle, &lc);
    struct buf ctrl;
    buf_alloc(n, &ctrl, p.send_comm, CTRL_BYTES);
    memcpy(ctrl.ptr, &msg, sizeof(msg));
    void *req = post_send(n, p.send_comm, ctrl.ptr, sizeof(msg), ctrl.mh);
    /* Accept while the control send completes: the server connects back only after it lands. */
    int fin = 0, got;
    while (!p.recv_comm || !fin) {
        if (!fin) NCHECK(net_test(n, req, &fin, &got));
        if (!p.recv_comm) {
            ncclResult_t r = net_accept(n, lc, &p.recv_comm);
            if (r != ncclSuccess) die("accept (reverse) failed: ncclResult %d", r);
        }
        check_deadline("control exchange", sizeof(msg), 0, 1);
    }
    buf_free(n, &ctrl);

    size_t max = max_size(&g_opt.cfg);
    buf_alloc(n, &p.data_send, p.send_comm, max);
    buf_alloc(n, &p.data_recv, p.recv_comm, max);
    if (g_opt.cfg.mode & MODE_BW) run_bw(&p, &g_opt.cfg, true);
    if (g_opt.cfg.mode & MODE_LAT) run_lat(&p, &g_opt.cfg, true);

    buf_free(n, &p.data_send);
    buf_free(n, &p.data_recv);
    net_close_send(n, p.send_comm);
    net_close_recv(n, p.recv_comm);
    net_close_listen(n, lc);
    return 0;
}

/* ------------------------------------------------------------ options */

static uint64_t parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) die("bad size '%s'", s);
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        end++;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        end++;
        break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end) die("bad size '%s'", s);
    return (uint64_t)v;
}

/* Fills out[] from "4K,1M,..." or, without a list, from min * factor^i up to max. */
static uint32_t size_list(const char *list, uint64_t min, uint64_t max, uint64_t factor,
                          uint64_t *out) {
    uint32_t n = 0;
    if (list) {
        char *copy = strdup(list), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n == MAX_SIZES) die("at most %d sizes", MAX_SIZES);
            out[n] = parse_size(t);
            if (out[n] < 1) die("sizes must be >= 1");
            n++;
        }
        free(copy);
        return n;
    }
    if (min < 1 || factor < 2) die("sizes must be >= 1 and factors >= 2");
    for (uint64_t s = min; s <= max; s *= factor) {
        if (n == MAX_SIZES) die("at most %d sizes", MAX_SIZES);
        out[n++] = s;
    }
    return n;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: erdma_bench [options]\n"
        "  -d, --dev NAME        RDMA device (sets NCCL_IB_HCA==NAME); default: first\n"
        "  -m, --mode bw|lat|both  what to measure (default both)\n"
        "  -a, --api 8|12        ncclNet table to use (default 12)\n"
        "  -w, --window N        requests in flight, 1..32 (default 16)\n"
        "  -b, --min SIZE        bandwidth sizes from (default 4K)\n"
        "  -e, --max SIZE        ... to (default 64M)\n"
        "  -f, --factor N        ... multiplying by (default 4)\n"
        "  -s, --sizes LIST      bandwidth sizes as a list (e.g. 1M,4M,16M,64M)\n"
        "  -B, --bytes SIZE      timed bytes per bandwidth size (default 64M)\n"
        "  -i, --min-iters N     at least N timed messages per size (default 16)\n"
        "  -W, --warmup N        warmup messages per bandwidth size (default 4)\n"
        "  -l, --lat-min SIZE    latency sizes from (default 8)\n"
        "  -L, --lat-max SIZE    ... to (default 64K)\n"
        "  -F, --lat-factor N    ... multiplying by (default 2)\n"
        "  -S, --lat-sizes LIST  latency sizes as a list (e.g. 8,64,4K)\n"
        "  -n, --lat-iters N     timed round trips per size (default 1000)\n"
        "  -N, --lat-warmup N    warmup round trips per size (default 50)\n"
        "  -D, --lat-depth N     receives kept posted in ping-pong, 1..32 (default 8, NCCL_STEPS)\n"
        "      --no-verify       skip the first-iteration data check\n"
        "  -p, --plugin PATH     the plugin .so (default libnccl-net-erdma.so)\n"
        "  -t, --timeout SEC     give up when one size takes longer (default 120)\n"
        "      --server[=FILE]   only the receiver: write the hex handle to FILE or stdout\n"
        "      --client=HEX|@FILE  only the sender, connecting to that handle\n"
        "      --breakdown       latency: where each side's time goes, per phase (stderr)\n"
        "      --poll-sleep US   bandwidth: sleep between empty tests (diagnostic: frees the\n"
        "                        CPU for a software RDMA device; NCCL's proxy spins)\n"
        "  -v, --verbose         plugin INFO lines (twice: TRACE)\n"
        "Without --server/--client one process forks the other (handle through a pipe).\n");
}

static void parse_opts(int argc, char **argv, struct opts *o) {
    *o = (struct opts){
        .cfg = {.magic = BENCH_MAGIC,
                .mode = MODE_BOTH,
                .window = 16,
                .verify = 1,
                .bw_total = 64 << 20,
                .bw_min_iters = 16,
                .bw_warmup = 4,
                .lat_iters = 1000,
                .lat_warmup = 50,
                .lat_depth = LAT_DEPTH_DEFAULT},
        .api = 12,
        .bw_min = 4096,
        .bw_max = 64 << 20,
        .bw_factor = 4,
        .lat_min = 8,
        .lat_max = 64 << 10,
        .lat_factor = 2,
        .timeout_s = 120,
        .role = ROLE_FORK,
    };
    enum { OPT_NO_VERIFY = 256, OPT_SERVER, OPT_CLIENT, OPT_BREAKDOWN, OPT_POLL_SLEEP };
    static const struct option lo[] = {{"dev", 1, 0, 'd'},
                                       {"mode", 1, 0, 'm'},
                                       {"api", 1, 0, 'a'},
                                       {"window", 1, 0, 'w'},
                                       {"min", 1, 0, 'b'},
                                       {"max", 1, 0, 'e'},
                                       {"factor", 1, 0, 'f'},
                                       {"bytes", 1, 0, 'B'},
                                       {"min-iters", 1, 0, 'i'},
                                       {"warmup", 1, 0, 'W'},
                                       {"lat-min", 1, 0, 'l'},
                                       {"lat-max", 1, 0, 'L'},
                                       {"lat-factor", 1, 0, 'F'},
                                       {"sizes", 1, 0, 's'},
                                       {"lat-sizes", 1, 0, 'S'},
                                       {"lat-iters", 1, 0, 'n'},
                                       {"lat-warmup", 1, 0, 'N'},
                                       {"lat-depth", 1, 0, 'D'},
                                       {"no-verify", 0, 0, OPT_NO_VERIFY},
                                       {"plugin", 1, 0, 'p'},
                                       {"timeout", 1, 0, 't'},
                                       {"server", 2, 0, OPT_SERVER},
                                       {"client", 1, 0, OPT_CLIENT},
                                       {"verbose", 0, 0, 'v'},
                                       {"breakdown", 0, 0, OPT_BREAKDOWN},
                                       {"poll-sleep", 1, 0, OPT_POLL_SLEEP},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "d:m:a:w:b:e:f:s:B:i:W:l:L:F:S:n:N:D:p:t:vh", lo, NULL)) !=
           -1) {
        switch (c) {
        case 'd':
            o->dev_name = optarg;
            break;
        case 'm':
            o->cfg.mode = !strcmp(optarg, "bw")     ? MODE_BW
                          : !strcmp(optarg, "lat")  ? MODE_LAT
                          : !strcmp(optarg, "both") ? MODE_BOTH
                                                    : (die("mode must be bw, lat or both"), 0);
            break;
        case 'a':
            o->api = atoi(optarg);
            if (o->api != 8 && o->api != 12) die("api must be 8 or 12");
            break;
        case 'w':
            o->cfg.window = (uint32_t)atoi(optarg);
            if (o->cfg.window < 1 || o->cfg.window > MAX_WINDOW)
                die("window must be 1..%d (NCCL_NET_MAX_REQUESTS)", MAX_WINDOW);
            break;
        case 'b':
            o->bw_min = parse_size(optarg);
            break;
        case 'e':
            o->bw_max = parse_size(optarg);
            break;
        case 'f':
            o->bw_factor = parse_size(optarg);
            break;
        case 's':
            o->bw_list = optarg;
            break;
        case 'S':
            o->lat_list = optarg;
            break;
        case 'B':
            o->cfg.bw_total = parse_size(optarg);
            break;
        case 'i':
            o->cfg.bw_min_iters = parse_size(optarg);
            break;
        case 'W':
            o->cfg.bw_warmup = parse_size(optarg);
            break;
        case 'l':
            o->lat_min = parse_size(optarg);
            break;
        case 'L':
            o->lat_max = parse_size(optarg);
            break;
        case 'F':
            o->lat_factor = parse_size(optarg);
            break;
        case 'n':
            o->cfg.lat_iters = parse_size(optarg);
            break;
        case 'N':
            o->cfg.lat_warmup = parse_size(optarg);
            break;
        case 'D':
            o->cfg.lat_depth = (uint32_t)atoi(optarg);
            if (o->cfg.lat_depth < 1 || o->cfg.lat_depth > MAX_WINDOW)
                die("lat-depth must be 1..%d (NCCL_NET_MAX_REQUESTS)", MAX_WINDOW);
            break;
        case OPT_NO_VERIFY:
            o->cfg.verify = 0;
            break;
        case 'p':
            o->plugin_path = optarg;
            break;
        case 't':
            o->timeout_s = atoi(optarg);
            break;
        case OPT_SERVER:
            o->role = ROLE_SERVER;
            o->handle_out = optarg ? optarg : "-";
            break;
        case OPT_CLIENT:
            o->role = ROLE_CLIENT;
            o->handle_in = optarg;
            break;
        case OPT_POLL_SLEEP:
            o->poll_sleep_us = atoi(optarg);
            break;
        case OPT_BREAKDOWN:
            o->breakdown = 1;
            break;
        case 'v':
            o->verbose++;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind < argc) die("unexpected argument '%s' (try --help)", argv[optind]);
    struct bench_cfg *k = &o->cfg;
    k->nbw = size_list(o->bw_list, o->bw_min, o->bw_max, o->bw_factor, k->bw_sizes);
    k->nlat = size_list(o->lat_list, o->lat_min, o->lat_max, o->lat_factor, k->lat_sizes);
    if (k->lat_iters < 1 || k->lat_iters > MAX_LAT_ITER)
        die("lat-iters must be 1..%d", MAX_LAT_ITER);
    if (o->api == 8 && max_size(k) > INT32_MAX) die("API v8 sizes are int: at most 2 GiB - 1");
    if (o->timeout_s < 1) die("timeout must be >= 1 s");
}

static void read_client_handle(const char *arg, char *handle) {
    char hex[4 * NCCL_NET_HANDLE_MAXSIZE] = {0};
    if (arg[0] == '@') {
        FILE *f = fopen(arg + 1, "r");
        if (!f || !fgets(hex, sizeof(hex), f)) die("cannot read a handle from %s", arg + 1);
        fclose(f);
    } else {
        snprintf(hex, sizeof(hex), "%s", arg);
    }
    if (strlen(hex) < 2 * NCCL_NET_HANDLE_MAXSIZE ||
        hex_decode(hex, handle, NCCL_NET_HANDLE_MAXSIZE))
        die("the handle must be %d hex digits", 2 * NCCL_NET_HANDLE_MAXSIZE);
}

static volatile sig_atomic_t g_child_reaped;
static volatile int g_child_status;
static pid_t g_child;

/* A client that fails must not leave the server spinning until its timeout. */
static void on_sigchld(int sig) {
    int st;
    if (waitpid(g_child, &st, WNOHANG) != g_child) return;
    g_child_status = st;
    g_child_reaped = 1;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        static const char msg[] = "erdma_bench[server]: the client failed; stopping\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 3);
    }
}

static int side_main(int handle_fd, const char *handle) {
    struct net n;
    net_open(&n, &g_opt);
    int dev = net_find_dev(&n, g_opt.dev_name);
    int rc = handle ? run_client(&n, dev, handle) : run_server(&n, dev, handle_fd);
    net_close(&n);
    return rc;
}

int main(int argc, char **argv) {
    parse_opts(argc, argv, &g_opt);
    tick_calibrate();
    if (g_opt.dev_name) {
        /* "=" makes NCCL_IB_HCA an exact match: rxe0 must not also pick rxe01. */
        char hca[256];
        snprintf(hca, sizeof(hca), "=%s", g_opt.dev_name);
        setenv("NCCL_IB_HCA", hca, 1);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    char handle[NCCL_NET_HANDLE_MAXSIZE];
    if (g_opt.role == ROLE_SERVER) {
        g_side = "server";
        return side_main(-1, NULL);
    }
    if (g_opt.role == ROLE_CLIENT) {
        g_side = "client";
        read_client_handle(g_opt.handle_in, handle);
        return side_main(-1, handle);
    }

    printf("# erdma_bench: device %s, API v%d, plugin %s\n",
           g_opt.dev_name ? g_opt.dev_name : "(first)", g_opt.api,
           g_opt.plugin_path ? g_opt.plugin_path : "libnccl-net-erdma.so");
    int fds[2];
    if (pipe(fds)) die("pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) die("fork: %s", strerror(errno));
    if (child == 0) {
        /* The client dies with the server; the server notices a dead client by its exit. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(2);
        g_side = "client";
        close(fds[1]);
        ssize_t got = 0;
        while (got < (ssize_t)sizeof(handle)) {
            ssize_t r = read(fds[0], handle + got, sizeof(handle) - (size_t)got);
            if (r <= 0) die("the server died before it listened");
            got += r;
        }
        close(fds[0]);
        exit(side_main(-1, handle));
    }
    g_side = "server";
    close(fds[0]);
    g_child = child;
    struct sigaction sa = {.sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &sa, NULL);
    int rc = side_main(fds[1], NULL);
    while (!g_child_reaped)
        usleep(1000);
    int st = g_child_status;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) return rc ? rc : 1;
    return rc;
}
