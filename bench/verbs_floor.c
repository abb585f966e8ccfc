/*
 * verbs_floor: the floor of the plugin's protocol, in raw verbs, on one RoCE
 * device addressed by GID (rxe0 in the test VM; eRDMA's compat mode on a node).
 *
 * Latency (default): a ping-pong between two processes, timed as ib_write_lat
 * times it (the gap between two posts on the client, halved), in one of four ways:
 *   write    an RDMA write polled in memory: ib_write_lat's own method, a check
 *            that this program matches perftest
 *   imm      an RDMA write with immediate, polled on the CQ, the receive posted
 *            again: the completion that net_ib and the plugin use
 *   imm+cts  imm, plus on each side one more RDMA write of (D-1) 32-byte entries
 *            every D-1 messages: the batched clear-to-send of a receiver that
 *            keeps D receives posted (NCCL_STEPS = 8) and writes them in batches
 *            (the cost only: its sender does not read them)
 *   netib    net_ib's own algorithm (transport/net_ib/p2p.cc): each side keeps D
 *            receives posted (-D, 1 to 32), and every receive is announced by one
 *            inlined RDMA write of a clear-to-send entry (address, key, size,
 *            sequence number) into the peer's FIFO, posted with it (no batching).
 *            A sender writes message i only once it has seen the entry of
 *            receive i in its FIFO, and writes it where that entry says. Each
 *            side posts the receive that replaces the one a message consumed in
 *            the order erdma_bench's ping-pong does (the client after the pong
 *            arrived, the server after its pong is posted), so at depth 1 the
 *            client's wait for the server's next clear-to-send is in every round
 *            trip, as it is for the plugin.
 *
 * Bandwidth (-b, netib only): the client receives, the server sends. The client
 * keeps D receives posted, each announced by its inlined clear-to-send write, and
 * on each data completion posts the next receive and its clear-to-send, until N
 * messages have arrived; the server streams: it takes each new entry from its
 * FIFO, writes SIZE bytes with immediate to the address in it, and keeps up to D
 * writes in flight. As erdma_bench's window, every receive uses the same buffer.
 * Timed on the receiver from its first clear-to-send to its last data completion,
 * after a short warmup; printed in decimal MB/s like ib_write_bw's "BW average".
 *
 * Connections (-c): 1 (default) runs everything over one RC QP pair with one CQ a side;
 * 2 gives each direction its own QP pair and CQs, as NCCL's send and receive comms have
 * (net_ib's and the plugin's): a side's messages go on one, its receives and the
 * clear-to-sends that announce them on the other, and it polls the CQ of what it awaits.
 *
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
#define WARMUP     50        /* latency: round trips before the timed ones */
#define BW_WARMUP  4         /* bandwidth: messages before the timed ones, as erdma_bench */
#define QUEUE      64        /* receives kept posted; send queue entries besides data chunks */
#define MAX_DEPTH  32        /* receives posted ahead, at most: NCCL_NET_MAX_REQUESTS */
#define FIFO_SLOTS MAX_DEPTH /* entry k+D reuses a slot only after message k is in */
#define CTS_SIGNAL 16        /* a receiver that only writes clear-to-sends signals one in 16 */
#define MAX_INLINE 96        /* eRDMA's inline limit, which the plugin respects */
#define MAX_SIZE   (1 << 28)

enum mode { MODE_WRITE, MODE_IMM, MODE_IMM_CTS, MODE_NETIB };
enum wr_kind { WR_DATA = 1, WR_CTS = 2 };
static const char *const mode_names[] = {"write", "imm", "imm+cts", "netib"};

/* One clear-to-send: where receive `seq` lands. The sequence number is at both ends, and
 * an entry counts only when both say the receive the sender waits for: an older entry in
 * the slot, or one whose write is still landing, is never used. 32 bytes, as the
 * plugin's wire_cts. */
struct cts_entry {
    uint64_t seq;
    uint64_t addr;
    uint32_t rkey;
    uint32_t size;
    uint64_t seq_end;
};
#define FIFO_BYTES (FIFO_SLOTS * sizeof(struct cts_entry))

struct opts {
    const char *dev;
    int gid_index;
    size_t size;
    int iters;
    int depth;
    enum mode mode;
    bool bw;
    uint32_t max_msg; /* -M: split above this many bytes, if under the device's limit */
    int conns;        /* -c: QP pairs, 1 (both directions on one) or 2 (one per direction) */
};

struct endpoint_info { /* what one side tells the other through a pipe */
    uint32_t qpn[2];
    union ibv_gid gid;
    uint64_t addr;
    uint32_t rkey;
};

struct side {
    const struct opts *o;
    bool client;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    /* Connection 0 carries the client's messages, 1 the server's (with -c 2; with -c 1 both
     * are connection 0). A side writes its messages on `out`; its receives, and the
     * clear-to-sends that announce them, are on `in`: NCCL's send comm and receive comm. */
    struct ibv_cq *cq[2];
    struct ibv_qp *qp[2];
    int out, in;
    struct ibv_mr *mr;
    /* [0, size): receive area; [size, 2 size): send area; then FIFO_BYTES of clear-to-send
     * staging (what this side writes to the peer) and FIFO_BYTES of FIFO (what the peer
     * writes here). Both sides have the same layout, so offsets name the peer's too. */
    uint8_t *buf;
    size_t buf_bytes;
    struct cts_entry *staging;
    volatile struct cts_entry *fifo;
    uint32_t max_msg; /* the device's max_msg_sz: larger messages go in several writes */
    struct endpoint_info peer;
    uint64_t recvs, sends; /* completions seen so far */
    uint64_t cts_posted;
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

static size_t ctrl_offset(const struct side *s) { /* aligned for the entries' uint64_t */
    return (2 * s->o->size + 63) & ~(size_t)63;
}

static void post_recv(struct side *s) {
    struct ibv_recv_wr wr = {0}, *bad; /* write-with-imm consumes a receive without data */
    if (ibv_post_recv(s->qp[s->in], &wr, &bad)) die("ibv_post_recv failed");
}

static void post_send(struct ibv_qp *qp, struct ibv_send_wr *wr) {
    struct ibv_send_wr *bad;
    int ret = ibv_post_send(qp, wr, &bad);
    if (ret) die("ibv_post_send failed: %s", strerror(ret < 0 ? -ret : ret));
}

/* Message `seq`: `len` bytes of the send area to (raddr, rkey). A message above the
 * device's max_msg_sz goes as plain writes of max_msg_sz and a last one that carries the
 * immediate (the plugin splits the same way); only the last is signaled, as each of the
 * plugin's messages signals once. Up to 96 bytes go inline, as the plugin's payloads do
 * by default (NCCL_ERDMA_INLINE_PAYLOAD=1). */
static void post_data(struct side *s, uint32_t seq, uint64_t raddr, uint32_t rkey, size_t len) {
    uint8_t *src = s->buf + s->o->size;
    src[0] = (uint8_t)seq;       /* the first and last bytes (the first and last write of a */
    src[len - 1] = (uint8_t)seq; /* split message) say which message landed last; the last
                                  * one is ib_write_lat's flag byte (mode write) */
    size_t off = 0;
    do {
        size_t chunk = len - off > s->max_msg ? s->max_msg : len - off;
        bool last = off + chunk == len;
        struct ibv_sge sge = {
            .addr = (uintptr_t)src + off, .length = (uint32_t)chunk, .lkey = s->mr->lkey};
        struct ibv_send_wr wr = {
            .wr_id = WR_DATA,
            .sg_list = &sge,
            .num_sge = chunk ? 1 : 0,
            .opcode =
                last && s->o->mode != MODE_WRITE ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
            .send_flags =
                (last ? IBV_SEND_SIGNALED : 0) | (len <= MAX_INLINE ? IBV_SEND_INLINE : 0),
            .imm_data = htonl(seq),
            .wr.rdma = {.remote_addr = raddr + off, .rkey = rkey},
        };
        post_send(s->qp[s->out], &wr);
        off += chunk;
    } while (off < len);
}

/* Writes `count` clear-to-send entries from this side's staging, slot `slot` on, into the
 * same slots of the peer's FIFO. Up to 96 bytes go inline, as the plugin's clear-to-sends
 * (NCCL_IB_USE_INLINE=1) and net_ib's do; inline data is copied at the post, so staging
 * may change right after. */
static void post_ctrl(struct side *s, unsigned slot, unsigned count, bool signaled) {
    size_t off = ctrl_offset(s) + slot * sizeof(struct cts_entry);
    uint32_t len = count * (uint32_t)sizeof(struct cts_entry);
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = WR_CTS,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = IBV_WR_RDMA_WRITE,
        .send_flags =
            (signaled ? IBV_SEND_SIGNALED : 0) | (len <= MAX_INLINE ? IBV_SEND_INLINE : 0),
        .wr.rdma = {.remote_addr = s->peer.addr + off + FIFO_BYTES, .rkey = s->peer.rkey},
    };
    post_send(s->qp[s->in], &wr);
}

/* net_ib's clear-to-send for receive `seq` (the next one): one entry, one inlined write.
 * In a ping-pong the data writes are signaled and retire it; a receiver that only writes
 * clear-to-sends (bandwidth) must signal now and then or its send queue fills up. */
static void post_cts(struct side *s, uint64_t seq) {
    if (seq != s->cts_posted + 1) die("clear-to-send %llu out of order", (unsigned long long)seq);
    unsigned slot = (unsigned)(seq % FIFO_SLOTS);
    s->staging[slot] = (struct cts_entry){.seq = seq,
                                          .addr = (uintptr_t)s->buf,
                                          .rkey = s->mr->rkey,
                                          .size = (uint32_t)s->o->size,
                                          .seq_end = seq};
    post_ctrl(s, slot, 1, s->o->bw && seq % CTS_SIGNAL == 0);
    s->cts_posted = seq;
}

/* Spins until the peer's clear-to-send for its receive `seq` is in the FIFO, and returns
 * it, checked: the peer is another process here, but its entry is still input. */
static struct cts_entry wait_cts(struct side *s, uint64_t seq) {
    volatile struct cts_entry *e = &s->fifo[seq % FIFO_SLOTS];
    while (e->seq != seq || e->seq_end != seq) {
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the fields after the sequence numbers */
    struct cts_entry c = {.seq = seq, .addr = e->addr, .rkey = e->rkey, .size = e->size};
    if (e->seq != seq || e->seq_end != seq)
        die("clear-to-send %llu overwritten while read", (unsigned long long)seq);
    if (!c.addr || !c.rkey)
        die("clear-to-send %llu has no address or key", (unsigned long long)seq);
    return c;
}

/* Polls until `recvs` and `sends` completions have been seen. Messages arrive in order on
 * the one RC QP, so each immediate must be the next sequence number. */
static void poll_until(struct side *s, uint64_t recvs, uint64_t sends) {
    struct ibv_wc wc[16];
    while (s->recvs < recvs || s->sends < sends) {
        /* the CQ of what is awaited, as a caller tests the request of one comm */
        struct ibv_cq *cq = s->cq[s->recvs < recvs ? s->in : s->out];
        int n = ibv_poll_cq(cq, 16, wc);
        if (n < 0) die("ibv_poll_cq failed");
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                die("completion failed: %s", ibv_wc_status_str(wc[i].status));
            if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                if (ntohl(wc[i].imm_data) != (uint32_t)(s->recvs + 1))
                    die("message %u arrived where %llu was due", ntohl(wc[i].imm_data),
                        (unsigned long long)s->recvs + 1);
                s->recvs++;
                post_recv(s);
            } else if (wc[i].wr_id == WR_DATA) {
                s->sends++;
            } /* a signaled clear-to-send only retires the writes before it */
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

/* INIT, RTR (to the peer's QP `qpn`), RTS. */
static void qp_connect(struct side *s, struct ibv_qp *qp, uint32_t qpn) {
    const struct opts *o = s->o;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    int ret =
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    a = (struct ibv_qp_attr){
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = qpn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1,
                    .port_num = 1,
                    .grh = {.dgid = s->peer.gid,
                            .sgid_index = (uint8_t)o->gid_index,
                            .hop_limit = 64}},
    };
    ret = ret ? ret
              : ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    a = (struct ibv_qp_attr){
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    ret = ret ? ret
              : ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (ret) die("cannot bring the QP to RTS: %s", strerror(ret < 0 ? -ret : ret));
}

static void side_setup(struct side *s, int in_fd, int out_fd) {
    const struct opts *o = s->o;
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list) die("no RDMA devices (ibv_get_device_list: %s)", strerror(errno));
    for (int i = 0; list[i] && !s->ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), o->dev)) s->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!s->ctx) die("cannot open RDMA device %s", o->dev);
    struct ibv_port_attr port;
    if (ibv_query_port(s->ctx, 1, &port)) die("cannot query port 1 of %s", o->dev);
    s->max_msg = port.max_msg_sz ? port.max_msg_sz : 1u << 30;
    if (o->max_msg && o->max_msg < s->max_msg) s->max_msg = o->max_msg;
    /* A message takes ceil(size / max_msg) send queue entries; D of them in flight. */
    size_t chunks = (o->size + s->max_msg - 1) / s->max_msg;
    uint32_t sq = (uint32_t)(QUEUE + (size_t)o->depth * chunks);

    int conns = o->conns;
    s->out = conns == 2 && !s->client ? 1 : 0;
    s->in = conns == 2 && s->client ? 1 : 0;
    s->pd = ibv_alloc_pd(s->ctx);
    for (int k = 0; k < conns && s->pd; k++)
        if (!(s->cq[k] = ibv_create_cq(s->ctx, 2 * QUEUE + MAX_DEPTH, NULL, NULL, 0))) break;
    /* Sized for this run's messages: a 64 MiB bandwidth run needs 128 MiB and more. */
    s->buf_bytes = (ctrl_offset(s) + 2 * FIFO_BYTES + 4095) & ~(size_t)4095;
    s->buf = aligned_alloc(4096, s->buf_bytes);
    if (!s->cq[conns - 1] || !s->buf)
        die("cannot create a PD, CQ or %zu-byte buffer on %s", s->buf_bytes, o->dev);
    memset(s->buf, 0, s->buf_bytes);
    s->staging = (struct cts_entry *)(s->buf + ctrl_offset(s));
    s->fifo = (volatile struct cts_entry *)(s->buf + ctrl_offset(s) + FIFO_BYTES);
    s->mr =
        ibv_reg_mr(s->pd, s->buf, s->buf_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!s->mr) die("ibv_reg_mr failed: %s (memlock limit? ulimit -l unlimited)", strerror(errno));
    struct endpoint_info me = {.addr = (uintptr_t)s->buf, .rkey = s->mr->rkey};
    for (int k = 0; k < conns; k++) {
        struct ibv_qp_init_attr init = {
            .send_cq = s->cq[k],
            .recv_cq = s->cq[k],
            .cap = {.max_send_wr = sq,
                    .max_recv_wr = QUEUE,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = MAX_INLINE},
            .qp_type = IBV_QPT_RC,
        };
        s->qp[k] = ibv_create_qp(s->pd, &init);
        if (!s->qp[k]) die("ibv_create_qp (%u send entries) failed: %s", sq, strerror(errno));
        me.qpn[k] = s->qp[k]->qp_num;
    }
    if (ibv_query_gid(s->ctx, 1, o->gid_index, &me.gid))
        die("no GID %d on %s", o->gid_index, o->dev);
    xfer(out_fd, &me, sizeof(me), true);
    xfer(in_fd, &s->peer, sizeof(s->peer), false);
    for (int k = 0; k < conns; k++)
        qp_connect(s, s->qp[k], s->peer.qpn[k]);
    for (int i = 0; i < QUEUE; i++)
        post_recv(s);
    char ready = 1; /* both QPs are up before the first write */
    xfer(out_fd, &ready, 1, true);
    xfer(in_fd, &ready, 1, false);
}

/* Sends message `seq` of a ping-pong: in netib mode only into a receive whose
 * clear-to-send has arrived, and where that entry says (truncated to its size, as net_ib
 * does); otherwise into the peer's receive area, assumed posted. */
static void send_message(struct side *s, uint32_t seq) {
    if (s->o->mode != MODE_NETIB) {
        post_data(s, seq, s->peer.addr, s->peer.rkey, s->o->size);
        return;
    }
    struct cts_entry c = wait_cts(s, seq);
    post_data(s, seq, c.addr, c.rkey, c.size < s->o->size ? c.size : s->o->size);
}

/* One ping-pong run. Each side keeps one data write in flight, like ib_write_lat (TX depth
 * 1), and in imm+cts mode writes a batch of clear-to-sends after every depth-1 messages.
 * In netib mode each side first announces D receives, and posts the receive that replaces
 * the one a message consumed, with its clear-to-send, where erdma_bench's ping-pong posts
 * its next irecv: the client once the pong is in, the server once its pong is posted. */
static void side_run(struct side *s) {
    const struct opts *o = s->o;
    static double rtt[MAX_ITERS];
    uint32_t total = (uint32_t)(WARMUP + o->iters + 1);
    uint32_t depth = (uint32_t)o->depth;
    double prev = 0;
    if (o->mode == MODE_NETIB)
        for (uint32_t k = 1; k <= depth && k <= total; k++)
            post_cts(s, k);
    for (uint32_t seq = 1; seq <= total; seq++) {
        if (s->client) {
            double t = tick_s();
            if (seq > WARMUP + 1) rtt[seq - WARMUP - 2] = t - prev;
            prev = t;
            send_message(s, seq);
            wait_message(s, seq);
        } else {
            wait_message(s, seq);
            send_message(s, seq);
        }
        if (o->mode == MODE_NETIB && seq + depth <= total) post_cts(s, seq + depth);
        if (o->mode == MODE_IMM_CTS && seq % (depth - 1) == 0) post_ctrl(s, 0, depth - 1, false);
        poll_until(s, 0, seq);
    }
    if (s->client) lat_print_row(mode_names[o->mode], o->size, rtt, (uint64_t)o->iters);
}

/* Bandwidth, receiver: messages first .. first+count-1, D receives announced ahead; a
 * receive is re-posted (poll_until) and the next one announced as each message lands.
 * Returns the seconds from the first clear-to-send to the last data completion. */
static double bw_receive(struct side *s, uint64_t first, uint64_t count) {
    uint64_t last = first + count - 1, depth = (uint64_t)s->o->depth;
    double t0 = now_s();
    while (s->recvs < last) {
        while (s->cts_posted < last && s->cts_posted < s->recvs + depth)
            post_cts(s, s->cts_posted + 1);
        poll_until(s, s->recvs + 1, 0);
    }
    return now_s() - t0;
}

/* Bandwidth, sender: for each message, at most D-1 others in flight, and its receive's
 * clear-to-send seen. */
static void bw_send(struct side *s, uint64_t first, uint64_t count) {
    uint64_t depth = (uint64_t)s->o->depth;
    for (uint64_t seq = first; seq < first + count; seq++) {
        if (seq > depth) poll_until(s, 0, seq - depth);
        send_message(s, (uint32_t)seq);
    }
    poll_until(s, 0, first + count - 1);
}

static void side_run_bw(struct side *s, bool header) {
    const struct opts *o = s->o;
    uint64_t n = (uint64_t)o->iters, warm = n / 4 < BW_WARMUP ? (n / 4 ? n / 4 : 1) : BW_WARMUP;
    if (!s->client) { /* the server sends */
        bw_send(s, 1, warm);
        bw_send(s, warm + 1, n);
        return;
    }
    bw_receive(s, 1, warm);
    double t = bw_receive(s, warm + 1, n);
    uint8_t last = (uint8_t)(warm + n);
    if (s->buf[0] != last || s->buf[o->size - 1] != last)
        die("after message %llu the receive area holds bytes of %u .. %u",
            (unsigned long long)(warm + n), s->buf[0], s->buf[o->size - 1]);
    double mbs = (double)o->size * (double)n / t / 1e6;
    if (header)
        printf("# bandwidth: %d receives posted ahead, %d messages after %llu warmup, timed on "
               "the receiver\n%-10s %12s %10s %14s %12s\n",
               o->depth, o->iters, (unsigned long long)warm, "#mode", "bytes", "iters",
               "BW_avg[MB/s]", "Gb/s");
    char name[16];
    snprintf(name, sizeof(name), "%s-bw", mode_names[o->mode]);
    printf("%-10s %12zu %10d %14.2f %12.3f\n", name, o->size, o->iters, mbs, mbs * 8 / 1000);
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: verbs_floor -d DEV [-m write|imm|imm+cts|netib] [-b] [-x GID_INDEX (1)]\n"
            "                   [-s SIZE (8)] [-n ITERS (1000)] [-D RECEIVES_POSTED (8)] "
            "[--header]\n"
            "                   [-M SPLIT_ABOVE (the device's max_msg_sz)] [-c CONNECTIONS (1)]\n"
            "A raw-verbs ping-pong on a RoCE device (GID addressing), or with -b (netib "
            "only) a stream\nof SIZE-byte messages; see the source's header.\n");
}

int main(int argc, char **argv) {
    struct opts o = {
        .gid_index = 1, .size = 8, .iters = 1000, .depth = 8, .mode = MODE_IMM, .conns = 1};
    static const struct option longopts[] = {
        {"header", no_argument, NULL, 'H'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    bool header = false;
    int c;
    while ((c = getopt_long(argc, argv, "d:m:bx:s:n:D:M:c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            o.dev = optarg;
            break;
        case 'b':
            o.bw = true;
            break;
        case 'x':
            o.gid_index = (int)parse_num("-x", optarg, 0, 255);
            break;
        case 's':
            o.size = (size_t)parse_num("-s", optarg, 1, MAX_SIZE);
            break;
        case 'n':
            o.iters = (int)parse_num("-n", optarg, 1, MAX_ITERS);
            break;
        case 'M':
            o.max_msg = (uint32_t)parse_num("-M", optarg, 4096, 1L << 31);
            break;
        case 'c':
            o.conns = (int)parse_num("-c", optarg, 1, 2);
            break;
        case 'D':
            o.depth = (int)parse_num("-D", optarg, 1, MAX_DEPTH);
            break;
        case 'H':
            header = true;
            break;
        case 'm':
            o.mode = MODE_WRITE;
            while (o.mode <= MODE_NETIB && strcmp(optarg, mode_names[o.mode]))
                o.mode++;
            if (o.mode > MODE_NETIB) die("unknown mode %s (write, imm, imm+cts or netib)", optarg);
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
    if (o.mode == MODE_IMM_CTS && o.depth < 2)
        die("-m imm+cts batches depth-1 entries: -D 2 or more");
    if (o.bw && o.mode != MODE_NETIB) die("-b (bandwidth) runs net_ib's algorithm only: -m netib");

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
        if (header && !o.bw) lat_print_header();
    } else {
        side_setup(&s, to_server[0], to_client[1]);
    }
    if (o.bw)
        side_run_bw(&s, header);
    else
        side_run(&s);
    if (!s.client) return 0;
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
        die("the server side failed");
    return 0;
}
