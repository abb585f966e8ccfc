/*
 * verbs_floor: the latency floor of the plugin's protocol, in raw verbs, on one
 * RoCE device addressed by GID (rxe0 in the test VM; eRDMA's compat mode on a
 * node). A ping-pong between two processes, timed as ib_write_lat times it (the
 * gap between two posts on the client, halved), in one of three ways:
 *   write    an RDMA write polled in memory: ib_write_lat's own method, a check
 *            that this program matches perftest
 *   imm      an RDMA write with immediate, polled on the CQ, the receive posted
 *            again: the completion that net_ib and the plugin use
 *   imm+cts  imm, plus on each side one more RDMA write of (D-1) 32-byte entries
 *            every D-1 messages: the batched clear-to-send of a receiver that
 *            keeps D receives posted (NCCL_STEPS = 8) and writes them in batches
 *   netib    net_ib's own algorithm (transport/net_ib/p2p.cc): imm, plus one inlined
 *            clear-to-send write of one 32-byte entry for every receive, posted
 *            as soon as the receive is (no batching; -D does not change it)
 * So `imm+cts` and `netib` are what a rendezvous protocol costs on this device
 * with no software of its own, and the plugin's figure is read against them.
 *
 * Unlike the plugin it links libibverbs and calls it directly: it is the
 * reference the plugin is measured against, not a part of it.
 */
#include "bench_clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITERS  100000
#define WARMUP     50
#define QUEUE      64
#define CTS_ENTRY  32 /* bytes per clear-to-send entry, as the plugin's wire_cts */
#define MAX_INLINE 96 /* eRDMA's inline limit, which the plugin respects */
#define BUF_BYTES  (1 << 20)

enum mode { MODE_WRITE, MODE_IMM, MODE_IMM_CTS, MODE_NETIB };
enum wr_kind { WR_DATA = 1, WR_CTS = 2 };

struct opts {
    const char *dev;
    int gid_index;
    size_t size;
    int iters;
    int depth;
    enum mode mode;
};

struct endpoint_info { /* what one side tells the other through a pipe */
    uint32_t qpn;
    union ibv_gid gid;
    uint64_t addr;
    uint32_t rkey;
};

struct side {
    const struct opts *o;
    bool client;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf; /* [0, size): receive area; [size, 2 size): send; then the CTS entries */
    struct endpoint_info peer;
    uint64_t recvs, sends; /* completions seen so far */
};

static const char *g_role = "verbs_floor";

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", g_role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* A whole decimal number in [lo, hi], or die naming the option. */
static long parse_num(const char *opt, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("%s wants a number in %ld .. %ld, not \"%s\"", opt, lo, hi, s);
    return v;
}

static void xfer(int fd, void *p, size_t len, bool out) {
    ssize_t r = out ? write(fd, p, len) : read(fd, p, len);
    if (r != (ssize_t)len) die("the other process is gone (pipe %s)", out ? "write" : "read");
}

static void post_recv(struct side *s) {
    struct ibv_recv_wr wr = {0}, *bad; /* write-with-imm consumes a receive without data */
    if (ibv_post_recv(s->qp, &wr, &bad)) die("ibv_post_recv failed");
}

static void post_write(struct side *s, enum wr_kind kind, uint32_t seq) {
    bool data = kind == WR_DATA;
    uint32_t len = data                       ? (uint32_t)s->o->size
                   : s->o->mode == MODE_NETIB ? CTS_ENTRY
                                              : (uint32_t)(s->o->depth - 1) * CTS_ENTRY;
    uint64_t off = data ? s->o->size : 2 * s->o->size;
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = kind,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = data && s->o->mode != MODE_WRITE ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
        /* The data write is signaled, as each of the plugin's is; the others retire with it.
         * Up to 96 bytes go inline, as the plugin's payloads (NCCL_ERDMA_INLINE_PAYLOAD=1) and
         * clear-to-sends (NCCL_IB_USE_INLINE=1) do by default. */
        .send_flags = (data ? IBV_SEND_SIGNALED : 0) | (len <= MAX_INLINE ? IBV_SEND_INLINE : 0),
        .imm_data = htonl(seq),
        .wr.rdma = {.remote_addr = s->peer.addr + (data ? 0 : 2 * s->o->size),
                    .rkey = s->peer.rkey},
    };
    if (data && len > 0) s->buf[off + len - 1] = (uint8_t)seq; /* ib_write_lat's flag byte */
    struct ibv_send_wr *bad;
    int ret = ibv_post_send(s->qp, &wr, &bad);
    if (ret) die("ibv_post_send failed: %s", strerror(ret < 0 ? -ret : ret));
}

/* Polls until `recvs` and `sends` completions have been seen. */
static void poll_until(struct side *s, uint64_t recvs, uint64_t sends) {
    struct ibv_wc wc[16];
    while (s->recvs < recvs || s->sends < sends) {
        int n = ibv_poll_cq(s->cq, 16, wc);
        if (n < 0) die("ibv_poll_cq failed");
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                die("completion failed: %s", ibv_wc_status_str(wc[i].status));
            if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                s->recvs++;
                post_recv(s);
            } else if (wc[i].wr_id == WR_DATA) {
                s->sends++;
            }
        }
    }
}

/* Waits for message `seq` from the peer: its flag byte in memory, or its completion. */
static void wait_message(struct side *s, uint32_t seq) {
    if (s->o->mode != MODE_WRITE) {
        poll_until(s, seq, 0);
        return;
    }
    volatile uint8_t *flag = s->buf + s->o->size - 1;
    while (*flag != (uint8_t)seq) {
    }
}

static void side_setup(struct side *s, int in_fd, int out_fd) {
    const struct opts *o = s->o;
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list) die("no RDMA devices (ibv_get_device_list: %s)", strerror(errno));
    for (int i = 0; list[i] && !s->ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), o->dev)) s->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!s->ctx) die("cannot open RDMA device %s", o->dev);
    s->pd = ibv_alloc_pd(s->ctx);
    s->cq = s->pd ? ibv_create_cq(s->ctx, 2 * QUEUE, NULL, NULL, 0) : NULL;
    s->buf = aligned_alloc(4096, BUF_BYTES);
    if (!s->cq || !s->buf) die("cannot create a PD, CQ or buffer on %s", o->dev);
    memset(s->buf, 0, BUF_BYTES);
    s->mr = ibv_reg_mr(s->pd, s->buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!s->mr) die("ibv_reg_mr failed: %s (memlock limit? ulimit -l unlimited)", strerror(errno));
    struct ibv_qp_init_attr init = {
        .send_cq = s->cq,
        .recv_cq = s->cq,
        .cap = {.max_send_wr = QUEUE,
                .max_recv_wr = QUEUE,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = MAX_INLINE},
        .qp_type = IBV_QPT_RC,
    };
    s->qp = ibv_create_qp(s->pd, &init);
    if (!s->qp) die("ibv_create_qp failed: %s", strerror(errno));

    struct endpoint_info me = {
        .qpn = s->qp->qp_num, .addr = (uintptr_t)s->buf, .rkey = s->mr->rkey};
    if (ibv_query_gid(s->ctx, 1, o->gid_index, &me.gid))
        die("no GID %d on %s", o->gid_index, o->dev);
    xfer(out_fd, &me, sizeof(me), true);
    xfer(in_fd, &s->peer, sizeof(s->peer), false);

    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    int ret = ibv_modify_qp(s->qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    a = (struct ibv_qp_attr){
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = s->peer.qpn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1,
                    .port_num = 1,
                    .grh = {.dgid = s->peer.gid,
                            .sgid_index = (uint8_t)o->gid_index,
                            .hop_limit = 64}},
    };
    ret = ret ? ret
              : ibv_modify_qp(s->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    a = (struct ibv_qp_attr){
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    ret = ret ? ret
              : ibv_modify_qp(s->qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (ret) die("cannot bring the QP to RTS: %s", strerror(ret < 0 ? -ret : ret));
    for (int i = 0; i < QUEUE; i++)
        post_recv(s);
    char ready = 1; /* both QPs are up before the first write */
    xfer(out_fd, &ready, 1, true);
    xfer(in_fd, &ready, 1, false);
}

/* One ping-pong run. Each side keeps one data write in flight, like ib_write_lat (TX depth
 * 1), and in imm+cts mode writes a batch of clear-to-sends after every depth-1 messages; in
 * netib mode each side posts the receive that replaces the one a message consumed, with its
 * clear-to-send, as soon as the message is in (the server before it answers, as NCCL posts its
 * next irecv before it sends; the client's lands inside its round trip). */
static void side_run(struct side *s) {
    const struct opts *o = s->o;
    static double rtt[MAX_ITERS];
    uint32_t total = (uint32_t)(WARMUP + o->iters + 1);
    double prev = 0;
    for (uint32_t seq = 1; seq <= total; seq++) {
        if (s->client) {
            double t = tick_s();
            if (seq > WARMUP + 1) rtt[seq - WARMUP - 2] = t - prev;
            prev = t;
        } else {
            wait_message(s, seq);
            if (o->mode == MODE_NETIB) post_write(s, WR_CTS, 0);
        }
        post_write(s, WR_DATA, seq);
        if (s->client) {
            wait_message(s, seq);
            if (o->mode == MODE_NETIB) post_write(s, WR_CTS, 0);
        }
        if (o->mode == MODE_IMM_CTS && seq % (uint32_t)(o->depth - 1) == 0)
            post_write(s, WR_CTS, 0);
        poll_until(s, 0, seq);
    }
    if (s->client) {
        static const char *names[] = {"write", "imm", "imm+cts", "netib"};
        lat_print_row(names[o->mode], o->size, rtt, (uint64_t)o->iters);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: verbs_floor -d DEV [-m write|imm|imm+cts|netib] [-x GID_INDEX (1)] [-s SIZE "
               "(8)]\n"
               "                   [-n ITERS (1000)] [-D RECEIVES_POSTED (8)] [--header]\n"
               "A raw-verbs ping-pong on a RoCE device (GID addressing); see the source's "
               "header.\n");
}

int main(int argc, char **argv) {
    struct opts o = {.gid_index = 1, .size = 8, .iters = 1000, .depth = 8, .mode = MODE_IMM};
    static const struct option longopts[] = {
        {"header", no_argument, NULL, 'H'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    bool header = false;
    int c;
    while ((c = getopt_long(argc, argv, "d:m:x:s:n:D:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            o.dev = optarg;
            break;
        case 'x':
            o.gid_index = (int)parse_num("-x", optarg, 0, 255);
            break;
        case 's':
            o.size = (size_t)parse_num("-s", optarg, 1, BUF_BYTES / 4);
            break;
        case 'n':
            o.iters = (int)parse_num("-n", optarg, 1, MAX_ITERS);
            break;
        case 'D':
            o.depth = (int)parse_num("-D", optarg, 2, 32);
            break;
        case 'H':
            header = true;
            break;
        case 'm':
            if (!strcmp(optarg, "write"))
                o.mode = MODE_WRITE;
            else if (!strcmp(optarg, "imm"))
                o.mode = MODE_IMM;
            else if (!strcmp(optarg, "imm+cts"))
                o.mode = MODE_IMM_CTS;
            else if (!strcmp(optarg, "netib"))
                o.mode = MODE_NETIB;
            else
                die("unknown mode %s (write, imm, imm+cts or netib)", optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!o.dev) die("-d DEV is required");

    int to_client[2], to_server[2];
    if (pipe(to_client) || pipe(to_server)) die("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    alarm(120); /* in both processes: a lost message must not hang the caller's script */
    struct side s = {.o = &o, .client = pid > 0};
    g_role = s.client ? "verbs_floor[client]" : "verbs_floor[server]";
    if (s.client) {
        tick_calibrate();
        side_setup(&s, to_client[0], to_server[1]);
        if (header) lat_print_header();
    } else {
        side_setup(&s, to_server[0], to_client[1]);
    }
    side_run(&s);
    if (!s.client) return 0;
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
        die("the server side failed");
    return 0;
}
