/*
 * Integration: what the plugin shows of its traffic, between two processes through dlopen, on
 * every VM device (ITEST_DEVICES, default "rxe0,siw0") and the API versions that hand init a
 * profiler callback (v10, v11, v12).
 *
 * Each process hands init a recording profiler callback, as NCCL does, and a distinct profiler
 * handle per request. The events must come in start/stop pairs, one per request and QP that
 * carries it, under net_ib's plugin id, with the request's handle, the device, the bytes, and
 * QP numbers that `rdma res show qp` confirms are the two ends of one connection. The
 * counters, read from the stats file (NCCL_ERDMA_STATS_FILE) while the connection is open and
 * after unload, must equal the bytes and messages moved, exactly, and the file must parse with
 * a Prometheus text parser. ITEST_ONLY=<substring> runs only the cases whose name contains it.
 */
#include "netapi.h"
#include "nccl_profiler_net_abi.h"

#include <infiniband/verbs.h> /* opcodes only */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define TMO   120
#define SLACK 64
#define MAXEV 256

struct cfg {
    char dev[16];
    int version;
    int nqps;
    bool split;
    char dir[64]; /* where the stats files go */
};

/* ------------------------------------------------------------ the recording profiler */
struct event {
    int64_t plugin_id;
    void *phandle;
    ncclProfilerNetIbDescr_v1_t d;
    int stops;
};
static struct event events[MAXEV];
static int nstarts, nstops, bad_calls;

static ncclResult_t recorder(void **eh, int type, void *phandle, int64_t plugin_id, void *ext) {
    if (type == NCCL_PROF_NET_EVENT_START) {
        if (nstarts == MAXEV || !ext) {
            bad_calls++;
            return ncclSuccess;
        }
        struct event *e = &events[nstarts++];
        e->plugin_id = plugin_id;
        e->phandle = phandle;
        e->d = *(const ncclProfilerNetIbDescr_v1_t *)ext; /* copied during the call */
        *eh = e;
    } else if (type == NCCL_PROF_NET_EVENT_STOP) {
        struct event *e = *eh;
        nstops++;
        if (e < events || e >= events + nstarts)
            bad_calls++;
        else
            e->stops++;
    } else {
        bad_calls++;
    }
    return ncclSuccess;
}

static char *const PH_BASE = (char *)0x100000;
static char *phandle_of(int msg) {
    return PH_BASE + 16 * msg;
}

static const size_t sizes_list[] = {0, 1, 100, 4096, 65537, 1 << 20};
#define NMSG  ((int)(sizeof(sizes_list) / sizeof(sizes_list[0])))
#define MAXSZ (1u << 20)

/* The bytes of a message that QP u of `used` carries: the plugin's split (128-byte chunks). */
static size_t share(size_t size, int u, int used) {
    if (used == 1) return size;
    size_t chunk = ((size + used - 1) / used + 127) & ~(size_t)127;
    size_t start = chunk * u;
    return start < size ? (size - start < chunk ? size - start : chunk) : 0;
}

/* Every event stopped once; one per message and QP used, with that message's handle and the
 * bytes the QP carries (receiver: of the posted buffer). Fills qpns[event] for the caller. */
static int check_events(const struct cfg *c, int dev, bool sender, uint32_t *qpns) {
    int used = c->split ? c->nqps : 1;
    if (nstarts != NMSG * used || nstops != nstarts || bad_calls)
        fprintf(stderr, "%s: %d starts, %d stops, %d bad calls; expected %d pairs\n",
                sender ? "sender" : "receiver", nstarts, nstops, bad_calls, NMSG * used);
    CHECK(nstarts == NMSG * used);
    CHECK(nstops == nstarts);
    CHECK(bad_calls == 0);
    for (int k = 0; k < NMSG; k++) {
        size_t bytes = sender ? sizes_list[k] : sizes_list[k] + SLACK, sum = 0;
        for (int u = 0; u < used; u++) {
            const struct event *e = &events[k * used + u];
            if (e->d.qp.length != share(bytes, u, used))
                fprintf(stderr, "message %d QP %d: length %zu, expected %zu\n", k, u,
                        e->d.qp.length, share(bytes, u, used));
            CHECK(e->stops == 1);
            CHECK(e->plugin_id == (int64_t)(NCCL_PROF_NET_TYPE_IB | NCCL_PROF_NET_IB_VER));
            CHECK(e->d.type == NCCL_PROF_NET_IB_QP);
            CHECK(e->phandle == phandle_of(k));
            CHECK(e->d.qp.device == dev);
            CHECK(e->d.qp.qpNum > 0);
            CHECK(e->d.qp.length == share(bytes, u, used));
            sum += e->d.qp.length;
            qpns[k * used + u] = (uint32_t)e->d.qp.qpNum;
        }
        CHECK(sum == bytes);
    }
    return 0;
}

/* `rdma res show qp` must list a QP numbered local whose remote end is remote. iWARP QPs
 * (siw) show remote QP number 0 there: both numbers must then be QPs of this device. */
static int qp_pair_listed(const char *dev, uint32_t local, uint32_t remote) {
    char cmd[128], line[1024], pair[64], l_only[32], r_only[32];
    snprintf(cmd, sizeof(cmd), "rdma res show qp link %s 2>&1", dev);
    snprintf(pair, sizeof(pair), "lqpn %u rqpn %u ", local, remote);
    snprintf(l_only, sizeof(l_only), "lqpn %u ", local);
    snprintf(r_only, sizeof(r_only), "lqpn %u ", remote);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    bool found = false, l_seen = false, r_seen = false, l_has_remote = false;
    while (fgets(line, sizeof(line), p)) {
        found |= strstr(line, pair) != NULL;
        if (strstr(line, l_only)) {
            l_seen = true;
            l_has_remote |= strstr(line, "rqpn") && !strstr(line, "rqpn 0 ");
            if (!found) fprintf(stderr, "  %s", line);
        }
        r_seen |= strstr(line, r_only) != NULL;
    }
    pclose(p);
    if (!found && !l_has_remote && l_seen && r_seen) return 0;
    if (!found) fprintf(stderr, "rdma res show qp: no QP with \"%s\"\n", pair);
    return found ? 0 : -1;
}

/* ------------------------------------------------------------ the stats file */
static int stats_path(const struct cfg *c, char *out, size_t len) {
    snprintf(out, len, "%s/obs-%d.prom", c->dir, (int)getpid());
    return 0;
}

static long long stat_value(const char *path, const char *series) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    long long v = -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, series, strlen(series)) && line[strlen(series)] == ' ')
            v = atoll(line + strlen(series) + 1);
    fclose(f);
    return v;
}

/* The writer thread rewrites the file every second (NCCL_ERDMA_STATS_INTERVAL=1). */
static int stat_wait(const char *path, const char *series, long long want) {
    long long v = -1;
    for (int i = 0; i < 300 && v != want; i++) {
        v = stat_value(path, series);
        if (v != want) usleep(10000);
    }
    if (v != want) fprintf(stderr, "%s: %s is %lld, expected %lld\n", path, series, v, want);
    return v == want ? 0 : -1;
}

static int prometheus_parses(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import sys; from prometheus_client.parser import "
             "text_string_to_metric_families as f; n = sum(len(m.samples) for m in "
             "f(open(sys.argv[1]).read())); print(\"parsed\", n, \"samples\"); sys.exit(n < 10)' "
             "%s",
             path);
    return system(cmd) == 0 ? 0 : -1;
}

static int check_counters(const char *path, const char *dev, bool sender, bool device_scope) {
    long long bytes = 0;
    for (int k = 0; k < NMSG; k++)
        bytes += (long long)sizes_list[k];
    char s[256], l[160];
    if (device_scope) snprintf(l, sizeof(l), "{device=\"%s\",pid=\"%d\"}", dev, (int)getpid());
    const char *scope = device_scope ? "device" : "conn";
    char pre[32];
    snprintf(pre, sizeof(pre), "erdma_%s_", scope);
    if (!device_scope) { /* one connection: its series appear at the writer's next pass */
        l[0] = 0;
        for (int i = 0; i < 300 && !l[0]; i++) {
            FILE *f = fopen(path, "r");
            char line[1024];
            while (f && fgets(line, sizeof(line), f)) {
                char *b = strchr(line, '{'), *e = strchr(line, '}');
                if (!strncmp(line, "erdma_conn_bytes_sent_total{", 28) && b && e)
                    snprintf(l, sizeof(l), "%.*s", (int)(e - b + 1), b);
            }
            if (f) fclose(f);
            if (!l[0]) usleep(10000);
        }
        CHECK(l[0]);
        CHECK(strstr(l, sender ? "dir=\"send\"" : "dir=\"recv\""));
        CHECK(strstr(l, "peer=\""));
    }
    snprintf(s, sizeof(s), "%s%s%s", pre, sender ? "bytes_sent_total" : "bytes_received_total", l);
    CHECK(stat_wait(path, s, bytes) == 0);
    snprintf(s, sizeof(s), "%s%s%s", pre,
             sender ? "messages_sent_total" : "messages_received_total", l);
    CHECK(stat_wait(path, s, NMSG) == 0);
    snprintf(s, sizeof(s), "%s%s%s", pre, sender ? "bytes_received_total" : "bytes_sent_total", l);
    CHECK(stat_wait(path, s, 0) == 0);
    snprintf(s, sizeof(s), "%swork_requests_posted_total%s", pre, l);
    CHECK(stat_value(path, s) >= NMSG); /* at least one per message on either side */
    if (device_scope) {
        snprintf(s, sizeof(s), "erdma_device_%s%s", sender ? "connects_total" : "accepts_total", l);
        CHECK(stat_wait(path, s, 1) == 0);
        snprintf(s, sizeof(s), "erdma_device_accept_rejections_total%s", l);
        CHECK(stat_wait(path, s, 0) == 0);
    }
    return 0;
}

/* ------------------------------------------------------------ the two sides */
static int recv_side(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    char handle[NCCL_NET_HANDLE_MAXSIZE], path[256];
    void *lc, *comm, *mh;
    CHECK(net_open_prof(&n, c->version, c->dev, recorder) == 0);
    CHECK(net_listen(&n, handle, &lc) == 0);
    CHECK(duo_send(d, handle, sizeof(handle)) == 0);
    CHECK(net_accept(&n, lc, &comm, TMO) == 0);
    uint8_t *buf = malloc(MAXSZ + SLACK);
    CHECK(buf);
    CHECK(net_regmr(&n, comm, buf, MAXSZ + SLACK, &mh) == 0);
    for (int k = 0; k < NMSG; k++) {
        void *req, *data = buf;
        size_t post = sizes_list[k] + SLACK;
        int tag = 1, got = -1;
        n.phandle = phandle_of(k);
        CHECK(net_irecv(&n, comm, 1, &data, &post, &tag, &mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &got, TMO) == 0);
        CHECK(got == (int)sizes_list[k]);
    }
    uint32_t mine[MAXEV], theirs[MAXEV];
    CHECK(check_events(c, n.dev, false, mine) == 0);
    int nev = nstarts;
    CHECK(duo_recv(d, theirs, sizeof(uint32_t) * nev) == 0);
    for (int i = 0; i < nev; i++)
        CHECK(qp_pair_listed(c->dev, mine[i], theirs[i]) == 0);
    stats_path(c, path, sizeof(path));
    CHECK(check_counters(path, c->dev, false, false) == 0);
    CHECK(duo_barrier(d) == 0);
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_recv(&n, comm) == 0);
    CHECK(net_close_listen(&n, lc) == 0);
    net_close(&n); /* finalize (v11/v12) or unload (v10): the last file and the INFO line */
    CHECK(check_counters(path, c->dev, false, true) == 0);
    CHECK(prometheus_parses(path) == 0);
    char info[96];
    snprintf(info, sizeof(info), "%s: sent 0 B in 0 messages, received 1.1 MiB in %d", c->dev,
             NMSG);
    if (!log_contains(info)) fprintf(stderr, "no INFO line \"%s\"\n", info);
    CHECK(log_contains(info));
    free(buf);
    return 0;
}

static int send_side(struct duo *d, void *arg) {
    const struct cfg *c = arg;
    struct netapi n;
    char handle[NCCL_NET_HANDLE_MAXSIZE], path[256];
    void *comm, *mh;
    CHECK(net_open_prof(&n, c->version, c->dev, recorder) == 0);
    CHECK(duo_recv(d, handle, sizeof(handle)) == 0);
    CHECK(net_connect(&n, handle, &comm, TMO) == 0);
    uint8_t *buf = malloc(MAXSZ);
    CHECK(buf);
    memset(buf, 0x5a, MAXSZ);
    CHECK(net_regmr(&n, comm, buf, MAXSZ, &mh) == 0);
    for (int k = 0; k < NMSG; k++) {
        void *req;
        int done = -1;
        n.phandle = phandle_of(k);
        CHECK(net_isend(&n, comm, buf, sizes_list[k], 1, mh, &req, TMO) == 0);
        CHECK(net_wait(&n, req, &done, TMO) == 0);
        CHECK(done == (int)sizes_list[k]);
    }
    uint32_t mine[MAXEV];
    CHECK(check_events(c, n.dev, true, mine) == 0);
    /* with one buffer, the payload write carries the completion where immediates work */
    int imm = !strncmp(c->dev, "rxe", 3);
    for (int i = 0; i < nstarts; i++) {
        int want = imm ? IBV_WR_RDMA_WRITE_WITH_IMM
                       : (events[i].d.qp.length ? IBV_WR_RDMA_WRITE : IBV_WR_SEND);
        if (events[i].d.qp.opcode != want)
            fprintf(stderr, "sender event %d: opcode %d, expected %d\n", i, events[i].d.qp.opcode,
                    want);
        CHECK(events[i].d.qp.opcode == want);
    }
    CHECK(duo_send(d, mine, sizeof(uint32_t) * nstarts) == 0);
    stats_path(c, path, sizeof(path));
    CHECK(check_counters(path, c->dev, true, false) == 0);
    CHECK(duo_barrier(d) == 0); /* the receiver has looked at the QPs: they may go */
    CHECK(net_deregmr(&n, comm, mh) == 0);
    CHECK(net_close_send(&n, comm) == 0);
    net_close(&n);
    CHECK(check_counters(path, c->dev, true, true) == 0);
    CHECK(prometheus_parses(path) == 0);
    free(buf);
    return 0;
}

/* ------------------------------------------------------------ cmocka glue */
static void run_case(void **state) {
    struct cfg *c = *state;
    assert_true(in_rdma_vm());
    char env[256], tmpl[128];
    snprintf(c->dir, sizeof(c->dir), "/tmp/erdma-observe-XXXXXX");
    assert_non_null(mkdtemp(c->dir));
    snprintf(tmpl, sizeof(tmpl), "%s/obs-%%p.prom", c->dir);
    snprintf(env, sizeof(env),
             "NCCL_ERDMA_STATS_FILE=%s;NCCL_ERDMA_STATS_INTERVAL=1;NCCL_IB_QPS_PER_CONNECTION=%d;"
             "NCCL_IB_SPLIT_DATA_ON_QPS=%d",
             tmpl, c->nqps, c->split);
    env_apply(env, true);
    int rc = duo_run(recv_side, send_side, c, 300);
    env_apply(env, false);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", c->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", c->dir);
    assert_int_equal(rc, 0);
}

int main(void) {
    const char *devs = getenv("ITEST_DEVICES") ? getenv("ITEST_DEVICES") : "rxe0,siw0";
    const char *only = getenv("ITEST_ONLY");
    static const struct {
        int version, nqps;
        bool split;
    } shapes[] = {{10, 1, false}, {11, 1, false}, {12, 1, false}, {12, 2, true}};
    static struct cfg cases[16];
    static char names[16][64];
    struct CMUnitTest tests[16];
    int n = 0;
    char list[128];
    snprintf(list, sizeof(list), "%s", devs);
    for (char *save, *dev = strtok_r(list, ",", &save); dev && n < 12;
         dev = strtok_r(NULL, ",", &save)) {
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            struct cfg *c = &cases[n];
            snprintf(c->dev, sizeof(c->dev), "%s", dev);
            c->version = shapes[s].version;
            c->nqps = shapes[s].nqps;
            c->split = shapes[s].split;
            snprintf(names[n], sizeof(names[n]), "%s/v%d/%dqp%s", dev, c->version, c->nqps,
                     c->split ? "_split" : "");
            if (only && !strstr(names[n], only)) continue;
            tests[n] =
                (struct CMUnitTest){.name = names[n], .test_func = run_case, .initial_state = c};
            n++;
        }
    }
    if (n == 0) {
        fprintf(stderr, "no case matches ITEST_DEVICES/ITEST_ONLY\n");
        return 1;
    }
    return _cmocka_run_group_tests("integration: observability", tests, (size_t)n, NULL, NULL);
}
