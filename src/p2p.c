/*
 * The data path: isend/irecv/iflush/test. Everything it needs (QPs, keys,
 * modes, peer name) was resolved at connect time; it never touches sockets
 * except the cheap liveness poll, nor sysfs, nor the environment.
 *
 * Protocol (net_ib's rendezvous): irecv RDMA-writes a clear-to-send entry per
 * buffer into the sender's FIFO slot (seq % 32); while the sender still holds
 * unused ones, several wait and go in one write (see cts_may_wait). isend
 * matches an entry by tag and RDMA-writes the payload straight into the receive
 * buffer. Each QP's share ends with a completion: a single buffer's last write
 * carries the immediate (imm = size); otherwise a record goes to the receiver's
 * record area by WRITE_WITH_IMM (imm = flag | seq) or, on devices without
 * immediates (siw, some iWARP), by SEND. RC ordering places the payload first.
 */
#include "comm.h"
#include "conn.h"
#include "log.h"
#include "mr_cache.h"
#include "net.h"
#include "oob.h"
#include "prof.h"
#include "qp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define POLL_BATCH     16
#define LIVENESS_POLLS 256           /* empty polls between two looks at the clock */
#define LIVENESS_NS    100000000ull  /* at most one health check per 100 ms */
#define BYE_GRACE_NS   2000000000ull /* a closing peer's last data may still be on the way */
#define STALL_IDLE_NS  5000000000ull /* a comm nobody waited on this long was idle, not stuck */

enum wr_kind { WR_RECORD = 1, WR_CTS = 2, WR_RECV = 3, WR_FLUSH = 4, WR_WARMUP = 5 };

/* Immediate data: the message size (single-buffer receives), or this flag and the sequence
 * when a completion record was written to the receiver's record area. */
#define IMM_RECORD       0x80000000u
#define CTS_SIGNAL_EVERY 16    /* clear-to-send writes per signaled one */
#define CTS_LOW_WATER    2     /* unused clear-to-sends below which the sender gets more at once */
#define CTS_WAIT_MAX     65536 /* larger receives write theirs at once: the transfer dwarfs a post */
#define CTS_QP           0     /* one QP carries them all, so they land in posting order */

static inline uint64_t wr_id(enum wr_kind kind, int qp, uint32_t idx) {
    return ((uint64_t)kind << 60) | ((uint64_t)(unsigned)qp << 32) | idx;
}
static inline enum wr_kind wr_kind_of(uint64_t id) {
    return (enum wr_kind)(id >> 60);
}
static inline int wr_qp(uint64_t id) {
    return (int)((id >> 32) & 0xfffffff);
}
static inline uint32_t wr_idx(uint64_t id) {
    return (uint32_t)id;
}

/* One branch for several tests: `if (any_of(a | b))`. GCC splits `a | b` of comparisons
 * back into a branch each unless the value is first made opaque, and under emulation every
 * branch on a message's path costs more than the instructions around it (bench/README.md,
 * 2026-12-07 05:50). */
static inline bool any_of(unsigned bits) {
    __asm__("" : "+r"(bits));
    return bits != 0;
}

/* p, or fallback where p is NULL, chosen without a branch (GCC compiles the ?: form to
 * one): a stand-in read through it lets a NULL join its path's one combined test. */
static inline const void *ptr_or(const void *p, const void *fallback) {
    uintptr_t none = -(uintptr_t)(p == NULL);
    __asm__("" : "+r"(none)); /* opaque: kept as arithmetic */
    return (const void *)((uintptr_t)p | ((uintptr_t)fallback & none));
}

/* The QP after q in a round-robin over nqps, without a branch (nqps 1 is the common case). */
static inline int qp_next(int q, int nqps) {
    int p = q + 1;
    return p & -(int)(p != nqps);
}

/* A message's QPs: all of them when split (NCCL_IB_SPLIT_DATA_ON_QPS), else one (round
 * robin); split is 0 or 1, so these are arithmetic rather than branches. */
static inline int qps_used(const struct conn *c) {
    return 1 + (c->nqps - 1) * (int)c->split;
}
static inline uint32_t seq_step(const struct conn *c) {
    return (uint32_t)(c->nqps - (c->nqps - 1) * (int)c->split);
}

static const char *wr_kind_name(enum wr_kind k) {
    switch (k) {
    case WR_RECORD:
        return "payload write";
    case WR_CTS:
        return "clear-to-send write";
    case WR_RECV:
        return "receive";
    case WR_FLUSH:
        return "flush read";
    case WR_WARMUP:
        return "warm-up send";
    }
    return "unknown";
}

static const char *wc_hint(enum ibv_wc_status s) {
    switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
        return "the peer stopped acknowledging: it died, or the network dropped it, or the "
               "timeouts are too short for this fabric. Check the peer and the link; on eRDMA "
               "raise NCCL_IB_TIMEOUT (Alibaba suggests 23) and keep NCCL_IB_RETRY_CNT at 7";
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return "the peer had no receive posted: it closed the connection or fell behind";
    case IBV_WC_REM_ACCESS_ERR:
        return "the peer refused our RDMA access: its process exited or closed the connection "
               "(check the peer's log first), or a buffer was not registered, or was "
               "deregistered while in use";
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return "local buffer not registered for this device; for GPU buffers check GPU Direct "
               "(nvidia_peermem loaded) and that PCIe ACS is off (lspci -vvv | grep ACSCtl "
               "shows SrcValid-)";
    case IBV_WC_REM_INV_REQ_ERR:
        return "the peer rejected the request: mismatched plugin versions or a buffer too small";
    case IBV_WC_WR_FLUSH_ERR:
        return "the connection was torn down before this request was matched: the peer closed "
               "it (or its process exited), or an earlier failure put the QP in error";
    default:
        return "see the RDMA driver's messages (dmesg)";
    }
}

static __attribute__((noinline)) int post_send_quiet(struct ibv_qp *qp, struct ibv_send_wr *wr,
                                                     struct ibv_send_wr **bad) {
    struct quiet_pipe q;
    quiet_pipe_begin(&q, true);
    int ret = verbs_errno(vb.post_send(qp, wr, bad));
    quiet_pipe_end(&q);
    return ret;
}

/* Every post of a send-queue work request: siw may raise SIGPIPE in it (verbs.h). Other
 * devices post straight away: this is the hot path. */
static inline int post_send(struct conn *c, struct ibv_qp *qp, struct ibv_send_wr *wr,
                            struct ibv_send_wr **bad) {
    if (!c->sends_in_syscall) return verbs_errno(vb.post_send(qp, wr, bad));
    return post_send_quiet(qp, wr, bad);
}

/* The same, where the caller's fast-path test already ruled siw out (hot_path_off below). */
static inline int post_send_direct(struct ibv_qp *qp, struct ibv_send_wr *wr,
                                   struct ibv_send_wr **bad) {
    return verbs_errno(vb.post_send(qp, wr, bad));
}

/* What takes a message off its common path on any comm, as a 0/1 to fold into that path's
 * one test: siw's posts (post_send) and the profiler's events, each handled by the general
 * path. */
static inline unsigned hot_path_off(const struct conn *c) {
    return (unsigned)c->sends_in_syscall | prof_active();
}

/* A connection that fails after its device's port went down (since it was made, or down
 * now): the failure's own WARN blames what the QP saw (a flush, a local QP error, a
 * disconnect); this names the likely cause. */
static __attribute__((noinline)) void port_down_hint(const struct conn *c) {
    const struct erdma_device *d = c->base.dev;
    if (__atomic_load_n(&d->port_downs, __ATOMIC_ACQUIRE) == c->port_downs &&
        __atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE) != -ENETDOWN)
        return;
    WARN("%s: the port went down during the connection with %s: the likely cause of its "
         "failure; check the link of %s",
         d->name, c->peer, device_netdev_name(d));
}

/* First failure wins: later completions are usually flushes caused by it. */
static int conn_fail(struct conn *c, int err) {
    if (!c->error) {
        c->error = err;
        if (err != -ENETDOWN) port_down_hint(c);
    }
    return c->error;
}

static void report_wc_error(struct conn *c, const struct ibv_wc *wc) {
    if (c->error) return;
    enum wr_kind k = wr_kind_of(wc->wr_id);
    /* our NIC reading from itself, no peer involved (a flushed one only follows an earlier
     * failure, which the port-down or fatal-error hints name) */
    if (k == WR_FLUSH && wc->status != IBV_WC_WR_FLUSH_ERR) {
        WARN("%s: the GPU flush (an RDMA read through the NIC's loopback, from this node to "
             "itself) failed after data from %s arrived: %s (status %d, vendor error 0x%x). "
             "Hint: %s does not carry loopback reads: check the RDMA driver's messages (dmesg) "
             "and that the device reaches its own address (rping -s, then rping -c -a <its "
             "IP>, on this node); NCCL_GDR_FLUSH_DISABLE=1 turns the flush off, at the risk of "
             "the GPU reading received data before it has all landed",
             c->base.dev->name, c->peer, vb.wc_status_str(wc->status), wc->status, wc->vendor_err,
             c->base.dev->name);
        return;
    }
    WARN("%s: %s on QP %u to %s failed: %s (status %d, vendor error 0x%x, %u bytes). Hint: %s",
         c->base.dev->name, wr_kind_name(k), wc->qp_num, c->peer, vb.wc_status_str(wc->status),
         wc->status, wc->vendor_err, wc->byte_len, wc_hint(wc->status));
}

/* ------------------------------------------------------------ requests */
/* The search starts where test() last freed a request (its line still in cache), or after
 * the last one taken, and usually ends at its first look (tested alone: the loop is rare).
 * Only the fields every request reads are cleared (the hot path): sizes[] is written before
 * done is set. n is a power of two. */
static inline struct erdma_request *req_take(struct erdma_request *r, int idx, void *comm,
                                             enum req_type type) {
    r->type = type;
    r->idx = (uint16_t)idx;
    r->comm = comm;
    r->done = false;
    r->n = 0;
    r->seq = 0;
    r->posted_ns = 0;
    r->phandle = NULL;
    return r;
}

static __attribute__((noinline)) struct erdma_request *
req_search(struct erdma_request *pool, int n, int *next, void *comm, enum req_type type) {
    for (int k = 0, i = *next; k < n; k++, i = (i + 1) & (n - 1))
        if (pool[i].type == REQ_FREE) {
            *next = (i + 1) & (n - 1);
            return req_take(&pool[i], i, comm, type);
        }
    return NULL;
}

static inline struct erdma_request *req_alloc(struct erdma_request *pool, int n, int *next,
                                              void *comm, enum req_type type) {
    int i = *next;
    struct erdma_request *r = &pool[i];
    if (__builtin_expect(r->type != REQ_FREE, 0)) return req_search(pool, n, next, comm, type);
    *next = (i + 1) & (n - 1);
    return req_take(r, i, comm, type);
}

/* ------------------------------------------------------------ receiver side */
static __attribute__((cold, noinline)) int post_recv_failed(struct recv_comm *rc, int qp, int ret) {
    WARN("%s: posting a receive on QP %u failed: %s", rc->c.base.dev->name,
         rc->c.qps[qp].qp->qp_num, strerror(-ret));
    return ret;
}

int p2p_post_recv_wr(struct recv_comm *rc, int qp, int slot) {
    /* a record's buffer in send mode; write-with-imm consumes a receive without data: zero
     * SGEs, as eRDMA allows (set without a branch: this runs on every message) */
    struct ibv_sge sge = {.addr = (uintptr_t)&rc->ring[qp * ERDMA_RQ_DEPTH + slot],
                          .length = sizeof(struct wire_record),
                          .lkey = rc->c.ctrl_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id(WR_RECV, qp, (uint32_t)slot),
                             .sg_list = &sge,
                             .num_sge = rc->c.completion == COMPLETION_SEND},
                       *bad;
    int ret = verbs_errno(vb.post_recv(rc->c.qps[qp].qp, &wr, &bad));
    if (__builtin_expect(ret != 0, 0)) return post_recv_failed(rc, qp, ret);
    stats_add(&rc->c.stats.c.wrs_posted, 1);
    return 0;
}

/* Posts again every receive that arrivals consumed. An arrival only notes its receive as
 * owed: posting it is a doorbell (on rxe, a queue write under a lock) that would sit between
 * the arrival and the caller's answer to it; it goes on the next poll that finds nothing,
 * or at once when ERDMA_RQ_OWED_MAX are owed (a stream that leaves no idle poll). */
static int rq_repay(struct recv_comm *rc) {
    while (rc->nowed > 0) {
        int e = rc->owed[--rc->nowed];
        int ret = p2p_post_recv_wr(rc, e / ERDMA_RQ_DEPTH, e % ERDMA_RQ_DEPTH);
        if (ret) return conn_fail(&rc->c, ret);
    }
    return 0;
}

static int rq_owe(struct recv_comm *rc, int q, uint32_t idx) {
    rc->owed[rc->nowed++] = (uint16_t)(q * ERDMA_RQ_DEPTH + (int)idx);
    return rc->nowed == ERDMA_RQ_OWED_MAX ? rq_repay(rc) : 0;
}

int p2p_recv_post_initial(struct recv_comm *rc) {
    for (int q = 0; q < rc->c.nqps; q++)
        for (int i = 0; i < ERDMA_RQ_DEPTH; i++) {
            int ret = p2p_post_recv_wr(rc, q, i);
            if (ret) return ret;
        }
    return 0;
}

/* ------------------------------------------------------------ profiler events */
static void qp_share(const struct conn *c, uint64_t size, int q, int used, uint64_t *off,
                     uint64_t *len);

/* A receive's events: one per buffer and QP that carries it, as net_ib starts one per receive
 * work request; wr_id is the FIFO slot (as net_ib's), the opcode the peer's operation that
 * completes it, the length the bytes of the posted buffer that QP carries. */
static void recv_prof_start(struct recv_comm *rc, uint32_t idx, int n, const size_t *sizes,
                            void **phandles) {
    struct conn *c = &rc->c;
    int used = qps_used(c);
    int first = rc->post_qp * !c->split;
    int op = c->completion == COMPLETION_IMM ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_SEND;
    for (int i = 0; i < n && phandles; i++)
        for (int u = 0; u < used; u++) {
            uint64_t off, len;
            qp_share(c, sizes[i], u, used, &off, &len);
            prof_qp_start(&rc->prof_ev[idx][i][first + u], phandles[i], c->base.dev->index,
                          c->qps[first + u].qp->qp_num, idx, op, len);
        }
}

static void recv_prof_stop(struct recv_comm *rc, uint32_t idx, int n) {
    for (int i = 0; i < n; i++)
        for (int q = 0; q < rc->c.nqps; q++)
            prof_qp_stop(&rc->prof_ev[idx][i][q]);
}

/* A send's events: one per request and QP its slot was posted on (net_ib's granularity: one
 * work request per request per QP unless the device's message size cuts it), with the id and
 * opcode of the work request whose completion ends it, and the bytes it carries there. */
static void send_prof_start(struct send_comm *sc, const struct send_slot *slot, uint32_t idx,
                            int first, int u, int used, bool fast, int done_opcode) {
    struct conn *c = &sc->c;
    int q = first + u;
    for (int i = 0; i < slot->n; i++) {
        uint64_t off, len;
        qp_share(c, slot->sends[i].size, u, used, &off, &len);
        int op = fast || !len ? done_opcode : IBV_WR_RDMA_WRITE;
        prof_qp_start(&sc->prof_ev[idx][i][q], slot->sends[i].req->phandle, c->base.dev->index,
                      c->qps[q].qp->qp_num, wr_id(WR_RECORD, q, idx), op, len);
    }
}

void p2p_prof_close(struct conn *c) {
    if (!prof_on() || (c->base.kind != COMM_SEND && c->base.kind != COMM_RECV)) return;
    void *(*ev)[ERDMA_MAX_RECVS][ERDMA_MAX_QPS] = c->base.kind == COMM_SEND
                                                      ? ((struct send_comm *)c)->prof_ev
                                                      : ((struct recv_comm *)c)->prof_ev;
    for (int s = 0; s < ERDMA_FIFO_DEPTH; s++)
        for (int i = 0; i < ERDMA_MAX_RECVS; i++)
            for (int q = 0; q < ERDMA_MAX_QPS; q++)
                prof_qp_stop(&ev[s][i][q]);
}

/* A request's time in flight, for the counters. Both ends of the span come from the cached
 * clock, which another thread may have just set a step back (conn.h): a span that would wrap
 * around is none. */
static inline void stats_inflight(struct conn *c, uint64_t now, uint64_t posted_ns) {
    stats_max(&c->stats.c.max_inflight_ns, now > posted_ns ? now - posted_ns : 0);
}

/* The end of a receive: its sizes are in req->sizes. */
static inline void recv_finish(struct recv_comm *rc, struct recv_slot *slot,
                               struct erdma_request *req, uint64_t bytes) {
    uint64_t now = clock_cached_ns();
    req->done = true;
    slot->req = NULL;
    rc->arrived++;
    stats_add(&rc->c.stats.c.bytes_recv, bytes);
    stats_add(&rc->c.stats.c.msgs_recv, 1);
    stats_inflight(&rc->c, now, req->posted_ns);
}

static __attribute__((cold, noinline)) void recv_slot_missing(struct recv_comm *rc, uint32_t seq,
                                                              bool posted) {
    if (posted)
        WARN("%s: completion for receive %u from %s arrived before its clear-to-send was sent "
             "(a peer that writes where it was not invited)",
             rc->c.base.dev->name, seq, rc->c.peer);
    else
        WARN("%s: completion for sequence %u from %s matches no posted receive",
             rc->c.base.dev->name, seq, rc->c.peer);
    conn_fail(&rc->c, -EPROTO);
}

/* The slot of sequence seq, or NULL (and the connection failed) when no receive waits there,
 * or its clear-to-send is still held: a sender cannot have written into it (and counting it
 * as arrived would make cts_held wrap, so held ones would never be flushed). */
static inline struct recv_slot *recv_slot_of(struct recv_comm *rc, uint32_t seq) {
    struct recv_slot *slot = &rc->slots[seq % ERDMA_FIFO_DEPTH];
    bool posted = slot->req && slot->seq == seq;
    if (posted && (int32_t)(seq - rc->cts_seq) < 0) return slot;
    recv_slot_missing(rc, seq, posted);
    return NULL;
}

static int recv_complete_one(struct recv_comm *rc, const struct wire_record *rec, uint32_t seq) {
    struct recv_slot *slot = recv_slot_of(rc, seq);
    char why[160];
    if (!slot) return rc->c.error;
    if (++slot->got < slot->expected) return 0;
    struct erdma_request *req = slot->req;
    int ret = wire_record_check(rec, seq, req->n, slot->posted_sizes, why, sizeof(why));
    if (ret) {
        WARN("%s: corrupt completion from %s: %s", rc->c.base.dev->name, rc->c.peer, why);
        return conn_fail(&rc->c, ret);
    }
    uint64_t bytes = 0;
    for (int i = 0; i < req->n; i++)
        bytes += req->sizes[i] = rec->sizes[i];
    recv_finish(rc, slot, req, bytes);
    if (prof_on()) recv_prof_stop(rc, seq % ERDMA_FIFO_DEPTH, req->n);
    return 0;
}

/* A completion whose immediate is the size of a single-buffer receive (the common message):
 * the record check reduced to its two comparisons, without building a record. Anything else
 * goes through the record check, which names what is wrong. */
static __attribute__((noinline)) int recv_complete_size_checked(struct recv_comm *rc, uint32_t size,
                                                                uint32_t seq) {
    if (!recv_slot_of(rc, seq)) return rc->c.error;
    struct wire_record rec = {.seq = seq, .n = 1, .sizes = {size}};
    return recv_complete_one(rc, &rec, seq);
}

static inline __attribute__((always_inline)) int recv_complete_size(struct recv_comm *rc,
                                                                    uint32_t size, uint32_t seq) {
    struct recv_slot *slot = &rc->slots[seq % ERDMA_FIFO_DEPTH];
    struct erdma_request *req = slot->req;
    /* the common arrival, its conditions tested at once: a receive waits in the slot, its
     * clear-to-send went, it has one buffer that holds the size, this is its only completion
     * (one QP), and no profiler event waits for it */
    unsigned common = (req != NULL) & (slot->seq == seq) & ((int32_t)(seq - rc->cts_seq) < 0) &
                      (slot->n == 1) & (size <= slot->posted_sizes[0]) &
                      (slot->got + 1 >= slot->expected) & !prof_active();
    if (__builtin_expect(any_of(common), 1)) {
        slot->got++;
        req->sizes[0] = size;
        recv_finish(rc, slot, req, size);
        return 0;
    }
    /* anything else takes the checks that name what is wrong */
    return recv_complete_size_checked(rc, size, seq);
}

/* Every posted work request costs a doorbell, a packet and its ACK at both ends, and while
 * the receiver's thread posts one it is not polling for the next arrival. So clear-to-sends
 * may wait while the sender still holds CTS_LOW_WATER unused ones (it cannot need these before
 * those arrive), up to cts_batch of them; one RDMA write then carries them all. irecv writes
 * them; progress writes them only once the sender has none left, so that a caller which posts
 * receives and then only tests (as NCCL's proxy does) never stalls, and the write stays off
 * the critical path of a ping-pong. Only receives of up to CTS_WAIT_MAX bytes wait: for
 * larger ones the transfer dwarfs a post, and the sender keeps its deep pipeline.
 * Off by default (cts_batch 1): a held clear-to-send waits for a later call on this comm, and
 * net_ib's callers may post receives and then spin on another comm only (a ring's isend), which
 * would then wait for ever. */
static uint32_t cts_held(const struct recv_comm *rc) {
    return rc->cts_seq - rc->arrived; /* clear-to-sends the sender has and has not used yet */
}
static bool cts_may_wait(const struct recv_comm *rc, uint64_t recv_bytes) {
    /* the batch first: with batching off (the default) the one test a receive pays */
    return rc->seq - rc->cts_seq < (uint32_t)rc->cts_batch && recv_bytes <= CTS_WAIT_MAX &&
           cts_held(rc) >= CTS_LOW_WATER;
}

/* Row r of the clear-to-sends of the FIFO slots from first on: one RDMA write of len bytes
 * (their r-th entries) into the same place of the peer's FIFO. Sets the fields such a write
 * uses, and clears none: wr's others stay as they are (zero in the comm's hot_wr and in the
 * range's cleared arrays); next is the caller's. */
static inline void cts_row(struct recv_comm *rc, const struct qp_ctx *qp, uint32_t first, int r,
                           uint32_t len, bool sig, struct ibv_send_wr *wr, struct ibv_sge *sge) {
    size_t at = cts_index(first, r);
    sge->addr = (uintptr_t)&rc->cts[at];
    sge->length = len;
    sge->lkey = rc->c.ctrl_mr->lkey;
    wr->wr_id = wr_id(WR_CTS, CTS_QP, first);
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->opcode = IBV_WR_RDMA_WRITE;
    unsigned inl = rc->c.inline_cts & ((int)len <= qp->max_inline);
    wr->send_flags = IBV_SEND_SIGNALED * (unsigned)sig | IBV_SEND_INLINE * inl;
    wr->wr.rdma.remote_addr = rc->c.remote_ctrl_addr + at * sizeof(struct wire_cts);
    wr->wr.rdma.rkey = rc->c.remote_ctrl_rkey;
}

static __attribute__((cold, noinline)) int cts_post_failed(struct recv_comm *rc,
                                                           const struct qp_ctx *qp, int ret) {
    WARN("%s: posting clear-to-send on QP %u to %s failed: %s", rc->c.base.dev->name,
         qp->qp->qp_num, rc->c.peer, strerror(-ret));
    return conn_fail(&rc->c, ret);
}

/* Posts a chain of rows clear-to-send writes, the last one signaled when signal. direct: the
 * caller ruled siw out (post_send_direct). */
static inline __attribute__((always_inline)) int cts_post_chain(struct recv_comm *rc,
                                                                struct qp_ctx *qp,
                                                                struct ibv_send_wr *wrs, int rows,
                                                                bool signal, bool direct) {
    struct ibv_send_wr *bad;
    int ret = direct ? post_send_direct(qp->qp, wrs, &bad) : post_send(&rc->c, qp->qp, wrs, &bad);
    if (__builtin_expect(ret != 0, 0)) return cts_post_failed(rc, qp, ret);
    qp_sq_push(qp, rows, signal);
    stats_add(&rc->c.stats.c.wrs_posted, (uint64_t)rows);
    return 0;
}

/* Most clear-to-sends go unsignaled: fewer completions to reap on the critical path; a
 * signaled one (a chain's last) retires every WR before it. */
static bool cts_signal(const struct qp_ctx *qp, int rows) {
    return qp->unsignaled + rows >= CTS_SIGNAL_EVERY;
}

/* Posts the writes of FIFO slots [first, first + count) as one chain: the first entries of
 * every slot, then each further buffer row that some slot in the range uses. */
static int cts_post_range(struct recv_comm *rc, uint32_t first, uint32_t count) {
    struct qp_ctx *qp = &rc->c.qps[CTS_QP];
    struct ibv_send_wr wrs[ERDMA_MAX_RECVS] = {0};
    struct ibv_sge sges[ERDMA_MAX_RECVS];
    int rows = 1;
    for (uint32_t k = 0; k < count; k++) { /* our copies: the peer's key does not reach them */
        int n = rc->cts[cts_index(first + k, 0)].nreqs;
        if (n > rows) rows = n;
    }
    uint32_t len = count * (uint32_t)sizeof(struct wire_cts);
    bool signal = cts_signal(qp, rows);
    for (int r = 0; r < rows; r++) {
        cts_row(rc, qp, first, r, len, signal && r == rows - 1, &wrs[r], &sges[r]);
        if (r > 0) wrs[r - 1].next = &wrs[r];
    }
    return cts_post_chain(rc, qp, wrs, rows, signal, false);
}

/* The common clear-to-send, one slot of one buffer: its one write, in the comm's own work
 * request (comm.h hot_wr), without the range's loops and arrays. */
static inline __attribute__((always_inline)) int cts_post_one(struct recv_comm *rc, uint32_t slot,
                                                              bool direct) {
    struct qp_ctx *qp = &rc->c.qps[CTS_QP];
    bool signal = cts_signal(qp, 1);
    cts_row(rc, qp, slot, 0, sizeof(struct wire_cts), signal, &rc->c.hot_wr, &rc->c.hot_sge);
    return cts_post_chain(rc, qp, &rc->c.hot_wr, 1, signal, direct);
}

/* Writes every clear-to-send not yet posted: one chain per contiguous run of FIFO slots. */
static __attribute__((noinline)) int cts_flush_runs(struct recv_comm *rc) {
    while (rc->cts_seq != rc->seq) {
        uint32_t first = rc->cts_seq % ERDMA_FIFO_DEPTH, count = rc->seq - rc->cts_seq;
        if (first + count > ERDMA_FIFO_DEPTH) count = ERDMA_FIFO_DEPTH - first; /* wraps */
        int ret = cts_post_range(rc, first, count);
        if (ret) return ret;
        rc->cts_seq += count;
    }
    return 0;
}

/* The same, with the common case first: one slot of one buffer waits (each receive's own
 * clear-to-send when none are held), posted as its one write. */
static inline __attribute__((always_inline)) int cts_flush(struct recv_comm *rc) {
    uint32_t first = rc->cts_seq % ERDMA_FIFO_DEPTH;
    if (any_of((rc->seq - rc->cts_seq - 1) | (rc->cts[cts_index(first, 0)].nreqs - 1u)))
        return cts_flush_runs(rc);
    int ret = cts_post_one(rc, first, false);
    if (!ret) rc->cts_seq++;
    return ret;
}

/* Two chains at most (the FIFO wraps once); the margin also covers unsignaled ones. */
static bool cts_room(struct recv_comm *rc) {
    return qp_sq_room(&rc->c.qps[CTS_QP]) >= CTS_SIGNAL_EVERY;
}

static int wc_failed(struct conn *c, const struct ibv_wc *wc);

/* Any completion of a receive comm but the common arrival (recv_handle_wc) */
static __attribute__((noinline)) int recv_handle_wc_general(struct recv_comm *rc,
                                                            const struct ibv_wc *wc) {
    if (wc->status != IBV_WC_SUCCESS) return wc_failed(&rc->c, wc);
    int q = wr_qp(wc->wr_id);
    uint32_t imm = ntohl(wc->imm_data);
    switch (wr_kind_of(wc->wr_id)) {
    case WR_CTS:
        qp_sq_retire(&rc->c.qps[q]);
        return 0;
    case WR_FLUSH:
        qp_sq_retire(&rc->flush_qp);
        rc->reqs[wr_idx(wc->wr_id)].done = true;
        return 0;
    case WR_RECV: {
        struct wire_record rec;
        uint32_t seq = rc->next_seq[q];
        int64_t size = -1; /* the immediate's size of a single-buffer message, else a record */
        if (wc->opcode == IBV_WC_RECV && wc->byte_len == 0) { /* the sender's warm-up */
            rc->warmed |= 1u << q; /* a repeat on one QP does not stand for another's */
            int ret = p2p_post_recv_wr(rc, q, (int)wr_idx(wc->wr_id));
            return ret ? conn_fail(&rc->c, ret) : 0;
        }
        if (rc->c.completion == COMPLETION_IMM) {
            if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM) break;
            if (!(imm & IMM_RECORD)) {
                size = imm;
            } else {
                if ((imm & ~IMM_RECORD) != (seq & ~IMM_RECORD)) break;
                rec = rc->rec_area[seq % ERDMA_FIFO_DEPTH];
            }
        } else {
            if (wc->byte_len != sizeof(rec)) break;
            rec = rc->ring[q * ERDMA_RQ_DEPTH + (int)wr_idx(wc->wr_id)];
        }
        rc->next_seq[q] += seq_step(&rc->c);
        int ret = rq_owe(rc, q, wr_idx(wc->wr_id));
        if (ret) return ret;
        return size >= 0 ? recv_complete_size(rc, (uint32_t)size, seq)
                         : recv_complete_one(rc, &rec, seq);
    }
    default:
        break;
    }
    WARN("%s: unexpected completion (opcode %d, %u bytes, wr 0x%llx) from %s", rc->c.base.dev->name,
         wc->opcode, wc->byte_len, (unsigned long long)wc->wr_id, rc->c.peer);
    return conn_fail(&rc->c, -EPROTO);
}

/* The common arrival, tested at once: a successful write-with-immediate whose immediate is
 * its size, and room to note its receive as owed. */
static inline __attribute__((always_inline)) int recv_handle_wc(struct recv_comm *rc,
                                                                const struct ibv_wc *wc) {
    int q = wr_qp(wc->wr_id);
    uint32_t imm = ntohl(wc->imm_data);
    unsigned sized = (wc->status == IBV_WC_SUCCESS) & (wr_kind_of(wc->wr_id) == WR_RECV) &
                     (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) &
                     (rc->c.completion == COMPLETION_IMM) & !(imm & IMM_RECORD) &
                     (rc->nowed + 1 < ERDMA_RQ_OWED_MAX);
    if (__builtin_expect(!any_of(sized), 0)) return recv_handle_wc_general(rc, wc);
    uint32_t seq = rc->next_seq[q];
    rc->next_seq[q] += seq_step(&rc->c);
    rc->owed[rc->nowed++] = (uint16_t)(q * ERDMA_RQ_DEPTH + (int)wr_idx(wc->wr_id));
    return recv_complete_size(rc, imm, seq);
}

/* ------------------------------------------------------------ sender side */
static inline void send_done(struct send_comm *sc, struct send_slot *slot, int i, uint64_t now) {
    struct erdma_request *req = slot->sends[i].req;
    req->done = true;
    stats_add(&sc->c.stats.c.bytes_sent, slot->sends[i].size);
    stats_add(&sc->c.stats.c.msgs_sent, 1);
    stats_inflight(&sc->c, now, req->posted_ns);
}

/* Any other completion of a slot's writes (send_handle_record_done) */
static __attribute__((noinline)) void send_record_done_general(struct send_comm *sc, int q,
                                                               uint32_t slot_idx) {
    struct send_slot *slot = &sc->slots[slot_idx];
    qp_sq_retire(&sc->c.qps[q]);
    if (prof_on())
        for (int i = 0; i < slot->n; i++)
            prof_qp_stop(&sc->prof_ev[slot_idx][i][q]);
    if (--slot->pending > 0) return;
    uint64_t now = clock_cached_ns();
    send_done(sc, slot, 0, now); /* a slot has at least one buffer */
    for (int i = 1; __builtin_expect(i < slot->n, 0); i++)
        send_done(sc, slot, i, now);
}

static __attribute__((noinline)) int send_handle_wc_general(struct send_comm *sc,
                                                            const struct ibv_wc *wc) {
    if (wc->status != IBV_WC_SUCCESS) return wc_failed(&sc->c, wc);
    if (wr_kind_of(wc->wr_id) == WR_RECORD) {
        send_record_done_general(sc, wr_qp(wc->wr_id), wr_idx(wc->wr_id));
        return 0;
    }
    if (wr_kind_of(wc->wr_id) == WR_WARMUP) {
        qp_sq_retire(&sc->c.qps[wr_qp(wc->wr_id)]);
        return 0;
    }
    WARN("%s: unexpected completion (opcode %d, wr 0x%llx) to %s", sc->c.base.dev->name, wc->opcode,
         (unsigned long long)wc->wr_id, sc->c.peer);
    return conn_fail(&sc->c, -EPROTO);
}

/* A completion of a send comm. Commonly the last write of a slot of one buffer, with no
 * profiler: tested at once. */
static inline __attribute__((always_inline)) int send_handle_wc(struct send_comm *sc,
                                                                const struct ibv_wc *wc) {
    struct send_slot *slot = &sc->slots[wr_idx(wc->wr_id) % ERDMA_FIFO_DEPTH];
    unsigned common = (wc->status == IBV_WC_SUCCESS) & (wr_kind_of(wc->wr_id) == WR_RECORD) &
                      (slot->pending == 1) & (slot->n == 1) & !prof_active();
    if (__builtin_expect(!any_of(common), 0)) return send_handle_wc_general(sc, wc);
    qp_sq_retire(&sc->c.qps[wr_qp(wc->wr_id)]);
    slot->pending = 0;
    send_done(sc, slot, 0, clock_cached_ns());
    return 0;
}

/* The share of a message that QP q carries: everything on one QP, or an even split. */
static void qp_share(const struct conn *c, uint64_t size, int q, int used, uint64_t *off,
                     uint64_t *len) {
    if (used == 1) {
        *off = 0;
        *len = size;
        return;
    }
    uint64_t chunk = ((size + (uint64_t)used - 1) / (uint64_t)used + 127) & ~127ull;
    uint64_t start = chunk * (uint64_t)q;
    *off = start < size ? start : size;
    *len = start < size ? (size - start < chunk ? size - start : chunk) : 0;
}

static uint64_t wrs_for(uint64_t len, uint32_t max_msg) {
    return len ? (len + max_msg - 1) / max_msg : 0;
}

static __attribute__((cold, noinline)) int send_post_failed(struct conn *c, struct qp_ctx *q,
                                                            int nwr, int err) {
    WARN("%s: posting %d work request(s) on QP %u to %s failed: %s", c->base.dev->name, nwr,
         q->qp->qp_num, c->peer, strerror(-err));
    return conn_fail(c, err);
}

/* The common slot: one buffer, on one QP that has room, in one write whose immediate (the
 * size) completes it, not on siw and with no profiler (send_post_slot tests all that at once).
 * Posted as that one work request, without the general path's loops. 1 posted, -errno
 * failed. */
static inline __attribute__((always_inline)) int
send_post_single(struct send_comm *sc, struct send_slot *slot, uint32_t idx, int q) {
    struct conn *c = &sc->c;
    struct qp_ctx *qp = &c->qps[q];
    uint32_t size = (uint32_t)slot->sends[0].size;
    const struct wire_cts *e = &sc->fifo[cts_index(idx, 0)];
    struct ibv_send_wr *wr = &c->hot_wr, *bad;
    struct ibv_sge *sge = &c->hot_sge;
    sge->addr = (uintptr_t)slot->sends[0].data;
    sge->length = size;
    sge->lkey = slot->sends[0].lkey;
    wr->wr_id = wr_id(WR_RECORD, q, idx);
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    unsigned inl =
        c->inline_payload & slot->sends[0].cpu_readable & (size <= (uint32_t)qp->max_inline);
    wr->send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE * inl;
    wr->imm_data = htonl(size);
    wr->wr.rdma.remote_addr = e->addr;
    wr->wr.rdma.rkey = e->rkey;
    int ret = post_send_direct(qp->qp, wr, &bad);
    if (ret) return send_post_failed(c, qp, 1, ret);
    qp_sq_push(qp, 1, true);
    stats_add(&c->stats.c.wrs_posted, 1);
    slot->pending = 1;
    slot->posted = true;
    return 1;
}

/* Any other slot: several buffers, split over QPs, longer than one work request, empty, or
 * completed by a record. Out of line: its arrays (64 work requests) stay off the stack of the
 * common message. */
static __attribute__((noinline)) int send_post_general(struct send_comm *sc, struct send_slot *slot,
                                                       uint32_t idx, int used, int first) {
    struct conn *c = &sc->c;
    const struct wire_cts *fifo = sc->fifo;
    for (int u = 0; u < used; u++) {
        uint64_t need = 1;
        for (int i = 0; i < slot->n; i++) {
            uint64_t off, len;
            qp_share(c, slot->sends[i].size, u, used, &off, &len);
            need += wrs_for(len, c->max_msg);
        }
        struct qp_ctx *q = &c->qps[first + u];
        if (need > (uint64_t)q->sq_depth) { /* would wait for room that never comes */
            WARN("%s: a send of %llu bytes to %s needs %llu work requests of at most %u bytes "
                 "on QP %u, whose send queue holds %d",
                 c->base.dev->name, (unsigned long long)slot->sends[0].size, c->peer,
                 (unsigned long long)need, c->max_msg, q->qp->qp_num, q->sq_depth);
            return conn_fail(c, -EMSGSIZE);
        }
        if ((uint64_t)qp_sq_room(q) < need) return 0;
    }

    /* single buffer, size fits the immediate: no separate completion record */
    bool fast = c->completion == COMPLETION_IMM && slot->n == 1 && slot->sends[0].size < IMM_RECORD;
    struct wire_record *rec = &sc->records[idx];
    rec->seq = slot->seq;
    rec->n = (uint16_t)slot->n;
    for (int i = 0; i < slot->n; i++)
        rec->sizes[i] = slot->sends[i].size;

    for (int u = 0; u < used; u++) {
        struct qp_ctx *q = &c->qps[first + u];
        struct ibv_send_wr wrs[64], *bad;
        struct ibv_sge sges[64];
        int nwr = 0, total = 0;
        for (int i = 0; i < slot->n; i++) {
            uint64_t off, len;
            qp_share(c, slot->sends[i].size, u, used, &off, &len);
            while (len > 0) {
                uint32_t piece = len < c->max_msg ? (uint32_t)len : c->max_msg;
                if (nwr == 63) { /* keep one entry for the record */
                    int ret = post_send(c, q->qp, wrs, &bad);
                    if (ret) return send_post_failed(c, q, total, ret);
                    nwr = 0;
                }
                sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)slot->sends[i].data + off,
                                             .length = piece,
                                             .lkey = slot->sends[i].lkey};
                wrs[nwr] = (struct ibv_send_wr){
                    .wr_id = wr_id(WR_RECORD, first + u, idx),
                    .sg_list = &sges[nwr],
                    .num_sge = 1,
                    .opcode = IBV_WR_RDMA_WRITE,
                    .wr.rdma = {.remote_addr = fifo[cts_index(idx, i)].addr + off,
                                .rkey = fifo[cts_index(idx, i)].rkey},
                };
                if (piece <= (uint32_t)q->max_inline && c->inline_payload &&
                    slot->sends[i].cpu_readable)
                    wrs[nwr].send_flags = IBV_SEND_INLINE;
                if (nwr > 0) wrs[nwr - 1].next = &wrs[nwr];
                nwr++;
                total++;
                off += piece;
                len -= piece;
            }
        }
        struct ibv_send_wr *w;
        if (fast && nwr > 0) {
            /* the last payload write carries the completion: one WR per message */
            w = &wrs[nwr - 1];
            w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            w->imm_data = htonl((uint32_t)slot->sends[0].size);
            w->send_flags |= IBV_SEND_SIGNALED;
        } else {
            w = &wrs[nwr];
            sges[nwr] = (struct ibv_sge){
                .addr = (uintptr_t)rec, .length = sizeof(*rec), .lkey = c->ctrl_mr->lkey};
            *w = (struct ibv_send_wr){
                .wr_id = wr_id(WR_RECORD, first + u, idx),
                .sg_list = &sges[nwr],
                .num_sge = 1,
                .send_flags = IBV_SEND_SIGNALED,
            };
            if ((int)sizeof(*rec) <= q->max_inline) w->send_flags |= IBV_SEND_INLINE;
            if (fast) { /* nothing of the payload on this QP: a zero-length write-with-imm */
                w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                w->num_sge = 0;
                w->imm_data = htonl((uint32_t)slot->sends[0].size);
                w->wr.rdma.remote_addr = fifo[cts_index(idx, 0)].addr;
                w->wr.rdma.rkey = fifo[cts_index(idx, 0)].rkey;
            } else if (c->completion == COMPLETION_IMM) {
                w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                w->imm_data = htonl(IMM_RECORD | (slot->seq & ~IMM_RECORD));
                w->wr.rdma.remote_addr = c->remote_ctrl_addr + idx * sizeof(*rec);
                w->wr.rdma.rkey = c->remote_ctrl_rkey;
            } else {
                w->opcode = IBV_WR_SEND;
            }
            if (nwr > 0) wrs[nwr - 1].next = w;
            total++;
        }
        int ret = post_send(c, q->qp, wrs, &bad);
        if (ret) return send_post_failed(c, q, total, ret);
        qp_sq_push(q, total, true);
        stats_add(&c->stats.c.wrs_posted, (uint64_t)total);
        if (prof_on()) send_prof_start(sc, slot, idx, first, u, used, fast, w->opcode);
    }
    slot->pending = used;
    slot->posted = true;
    return 1;
}

/* Posts one matched slot, the one at post_seq. 1 posted, 0 no send-queue room yet, -errno
 * failed. */
static inline __attribute__((always_inline)) int send_post_slot(struct send_comm *sc,
                                                                struct send_slot *slot) {
    struct conn *c = &sc->c;
    uint32_t idx = slot->seq % ERDMA_FIFO_DEPTH;
    int used = qps_used(c);
    int first = sc->post_qp * !c->split;
    unsigned single = (used == 1) & (slot->n == 1) & (c->completion == COMPLETION_IMM) &
                      (slot->sends[0].size - 1 < (uint64_t)c->max_msg) & /* 1 .. max_msg bytes */
                      !hot_path_off(c) & (qp_sq_room(&c->qps[first]) >= 1);
    if (__builtin_expect(any_of(single), 1)) return send_post_single(sc, slot, idx, first);
    return send_post_general(sc, slot, idx, used, first);
}

/* Posts the matched slots from post_seq on; called only when there is one (post_seq !=
 * fifo_seq). */
static inline __attribute__((always_inline)) int send_post_ready(struct send_comm *sc) {
    do {
        int ret = send_post_slot(sc, &sc->slots[sc->post_seq % ERDMA_FIFO_DEPTH]);
        if (ret <= 0) return ret;
        sc->post_seq++;
        sc->post_qp = qp_next(sc->post_qp, sc->c.nqps);
    } while (sc->post_seq != sc->fifo_seq);
    return 0;
}

/* ------------------------------------------------------------ progress */
/* Whether anything in flight needs the peer. A receiver's flush reads its own memory over
 * the loopback QP: NCCL's receiver flushes what has landed while its sender, whose sends are
 * complete, may already have closed (on iWARP that close also flushes our receive ring). */
static bool conn_needs_peer(struct conn *c) {
    if (c->base.kind != COMM_RECV) return true;
    struct recv_comm *rc = (struct recv_comm *)c;
    for (int i = 0; i < ERDMA_RECV_REQS; i++)
        if (rc->reqs[i].type == REQ_RECV && !rc->reqs[i].done) return true;
    return false;
}

/* The port is down by the async thread's word. As in net_ib, that alone fails nothing: the
 * QPs' retries carry a short flap, and a QP the down broke fails its work requests (named by
 * port_down_hint). A port down for longer than the QPs' retry window fails what waits on the
 * peer, naming the link: a receive would otherwise wait for good. */
static __attribute__((noinline)) int port_down_outlasted(struct conn *c, uint64_t t) {
    const struct erdma_device *d = c->base.dev;
    uint64_t since = __atomic_load_n(&d->port_down_ns, __ATOMIC_ACQUIRE);
    uint64_t window = qp_retry_window_ns();
    if (since > t || t - since < window || !conn_needs_peer(c)) return 0;
    WARN("%s: connection with %s fails: the port has been down for %.1f s, longer than its QPs' "
         "retry window (%.1f s: NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT); check the link of %s",
         d->name, c->peer, (t - since) / 1e9, window / 1e9, device_netdev_name(d));
    return -ENETDOWN;
}

/* Whether a send of ours is posted and not yet complete (acknowledged). A matched send whose
 * slot is not posted yet (before post_seq: its receive's other buffers are still unmatched, or
 * the send queue is full) is no such send. */
static bool sends_in_flight(const struct send_comm *sc) {
    for (int i = 0; i < ERDMA_SEND_REQS; i++) {
        const struct erdma_request *r = &sc->reqs[i];
        if (r->type == REQ_SEND && !r->done && (int32_t)(r->seq - sc->post_seq) < 0) return true;
    }
    return false;
}

static inline volatile struct wire_cts *fifo_entry(struct send_comm *sc, uint32_t idx, int buf);

/* What the peer of a comm that waited `waited` ns with nothing moving has not done. */
static __attribute__((cold, noinline)) void stall_warn(struct conn *c, uint64_t waited) {
    const struct erdma_device *d = c->base.dev;
    unsigned every = c->stall_warn_s;
    double s = waited / 1e9;
    bool down = __atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE) == -ENETDOWN;
    char also[160] = "";
    if (down)
        snprintf(also, sizeof(also),
                 " This device's port went down during the wait too: check "
                 "the link of %s.",
                 device_netdev_name(d));
    if (down && __atomic_load_n(&d->port_down_ns, __ATOMIC_ACQUIRE) <= c->wait_since_ns) {
        /* our own link, down since before the wait began: not the peer. The connection fails
         * once the down outlasts the QPs' retry window (port_down_outlasted). A down that came
         * during the wait is only the latest news: the peer's text below, which says it too. */
        WARN("%s: nothing has moved with %s for %.0f s: this device's port is down (check the "
             "link of %s); connections fail once it stays down longer than their QPs' retry "
             "window (%.1f s)",
             d->name, c->peer, s, device_netdev_name(d), qp_retry_window_ns() / 1e9);
        return;
    }
    if (c->base.kind == COMM_RECV) {
        WARN("%s: for %.0f s no message has arrived from %s, whose receives are posted here: "
             "that rank has not sent (it may be waiting on another rank itself: the one whose "
             "senders say it posted no receive holds the job). Still waiting (said once per "
             "wait after NCCL_ERDMA_STALL_WARN=%u s; 0 never).%s",
             d->name, s, c->peer, every, also);
        return;
    }
    struct send_comm *sc = (struct send_comm *)c;
    uint32_t idx = sc->fifo_seq % ERDMA_FIFO_DEPTH;
    volatile struct wire_cts *head = fifo_entry(sc, idx, 0);
    const struct send_slot *slot = &sc->slots[idx];
    int n = head->nreqs, matched = slot->seq == sc->fifo_seq ? slot->matched : 0, open = 0;
    if (n > ERDMA_MAX_RECVS) n = ERDMA_MAX_RECVS; /* the peer writes it: a text's bound only */
    while (open < n && matched > 0 && slot->sends[open].req)
        open++; /* the first buffer no send of ours has taken */
    if (open >= n) open = 0;
    if (sends_in_flight(sc))
        WARN("%s: messages to %s have not been acknowledged for %.0f s: its NIC or the network "
             "between does not deliver them (the QPs retry for %.1f s, NCCL_IB_TIMEOUT and "
             "NCCL_IB_RETRY_CNT, then fail); check the link and that node.%s",
             d->name, c->peer, s, qp_retry_window_ns() / 1e9, also);
    else if (head->seq == sc->fifo_seq + 1)
        WARN("%s: for %.0f s the receive %s posted next (%d buffer(s), %d matched) waits for a "
             "send with tag %d that we do not make: the two ranks disagree on the operation "
             "(collectives called in another order, or a mismatched send/recv). Still waiting "
             "(said once per wait after NCCL_ERDMA_STALL_WARN=%u s; 0 never).%s",
             d->name, s, c->peer, n, matched, (int)fifo_entry(sc, idx, open)->tag, every, also);
    else
        WARN("%s: for %.0f s the peer %s has posted no receive for our sends: that rank has not "
             "reached this operation (hung, still busy elsewhere, or calling collectives in "
             "another order; or, with NCCL_ERDMA_CTS_BATCH above 1 there, it holds its "
             "clear-to-sends); it is the rank the others wait for. Still waiting (said once per "
             "wait after NCCL_ERDMA_STALL_WARN=%u s; 0 never).%s",
             d->name, s, c->peer, every, also);
}

/* A caller that keeps waiting on this comm (an isend that finds no receive to match, a test
 * of a request that does not complete) while no message moves for NCCL_ERDMA_STALL_WARN
 * seconds: a hung job otherwise says nothing until NCCL's or the framework's timeout, and
 * then not which peer it waits for. Said once per wait, and when messages move again. Runs
 * with the health check, which only a caller that polls reaches (at most every 100 ms): a
 * comm nobody waited on for STALL_IDLE_NS was idle, and its wait starts afresh. */
static void stall_watch(struct conn *c, uint64_t t) {
    uint64_t mark = c->stats.c.msgs_sent + c->stats.c.msgs_recv;
    bool idle = t - c->wait_seen_ns > STALL_IDLE_NS;
    c->wait_seen_ns = t;
    if (mark != c->wait_mark || idle) {
        if (c->wait_warned && !idle)
            INFO(NCCL_NET, "%s: messages with %s move again, after %.0f s", c->base.dev->name,
                 c->peer, (t - c->wait_since_ns) / 1e9);
        c->wait_mark = mark;
        c->wait_since_ns = t;
        c->wait_warned = false;
        return;
    }
    if (c->wait_warned || c->stall_warn_s == 0 ||
        t - c->wait_since_ns < (uint64_t)c->stall_warn_s * 1000000000ull)
        return;
    c->wait_warned = true;
    stall_warn(c, t - c->wait_since_ns);
}

/* A dead peer closes its out-of-band socket (the kernel does it for a killed process) and,
 * with rdma_cm, disconnects: both show up long before RC retries run out (~30 s). */
static int conn_check_health(struct conn *c) {
    uint64_t t = now_coarse_ns();
    if (t - c->last_check_ns < LIVENESS_NS) return 0;
    c->last_check_ns = t;
    int fatal = __atomic_load_n(&c->base.dev->fatal, __ATOMIC_ACQUIRE);
    if (fatal == -ENETDOWN)
        fatal = port_down_outlasted(c, t);
    else if (fatal)
        WARN("%s: connection with %s fails because the device reported a fatal error",
             c->base.dev->name, c->peer);
    if (fatal) return conn_fail(c, fatal);
    int ret = oob_peer_alive(c->fd);
    if (ret == OOB_PEER_CLOSING) {
        /* A goodbye is a normal close after the peer's last send completed. On iWARP a send
         * completes once it is in TCP, so its payload, on the QP's own stream, can arrive
         * after this byte: keep completing what lands. A torn-down QP flushes what never
         * will; the grace bounds a peer that closed with our receives still unmatched. */
        if (!c->peer_bye_ns) c->peer_bye_ns = t;
        /* its rdma_cm disconnects follow the goodbye and are not read here: they flush our
         * receives, and those flushes complete behind any payload that did land */
        if (t - c->peer_bye_ns < BYE_GRACE_NS || !conn_needs_peer(c)) return 0;
        WARN("%s: the peer %s closed its connection normally, but requests were still waiting "
             "for it %.1f s later (the two ranks disagree on the messages to move)",
             c->base.dev->name, c->peer, BYE_GRACE_NS / 1e9);
        return conn_fail(c, -ECONNRESET);
    }
    if (ret && conn_needs_peer(c)) { /* the socket stays closed: seen again when needed */
        WARN("%s: the peer %s closed its connection (process exited or node died) while "
             "requests were in flight",
             c->base.dev->name, c->peer);
        return conn_fail(c, ret == -EPROTO ? -EPROTO : -ECONNRESET);
    }
    if (ret) return 0;
    ret = cm_poll_disconnect(c);
    if (ret) return conn_fail(c, ret);
    stall_watch(c, t);
    return 0;
}

/* A completion that is not a success. A flushed receive means the peer's QP is gone: that
 * fails only what still needs the peer (conn_progress, once the CQ is drained). */
static __attribute__((noinline)) int wc_failed(struct conn *c, const struct ibv_wc *wc) {
    if (wc->status == IBV_WC_WR_FLUSH_ERR && wr_kind_of(wc->wr_id) == WR_RECV) {
        if (!c->peer_gone) c->peer_gone_wc = *wc;
        c->peer_gone = true;
        return 0;
    }
    stats_wc_error(&c->stats, wc->status);
    report_wc_error(c, wc);
    if (wr_kind_of(wc->wr_id) == WR_FLUSH) return conn_fail(c, -EIO); /* ours, not the peer's */
    return conn_fail(c, wc->status == IBV_WC_WR_FLUSH_ERR ? -ECONNABORTED : -EREMOTEIO);
}

/* A poll that found nothing (n == 0) or failed: off every message's critical path, so the
 * place to read the clock. */
static inline int conn_poll_empty(struct conn *c, int n) {
    if (n < 0) {
        WARN("%s: polling the completion queue failed (%d)", c->base.dev->name, n);
        return conn_fail(c, -EIO);
    }
    if ((++c->polls_since_check & 15) == 0) clock_refresh();
    return 0;
}

static __attribute__((noinline)) int conn_peer_gone(struct conn *c, int n) {
    /* with the CQ drained, whatever landed before the peer went away has completed */
    if (c->peer_gone && !c->error && n < POLL_BATCH && conn_needs_peer(c)) {
        stats_wc_error(&c->stats, c->peer_gone_wc.status);
        report_wc_error(c, &c->peer_gone_wc);
        conn_fail(c, -ECONNABORTED);
    }
    return c->error;
}

/* A poll that found several completions, none, or failed (n < 0): each completion in turn,
 * or conn_poll_empty. Off the common path, so one copy for both kinds. */
static __attribute__((noinline)) int poll_other(struct conn *c, const struct ibv_wc *wcs, int n) {
    if (n <= 0) return conn_poll_empty(c, n);
    for (int i = 0; i < n; i++) {
        int ret = c->base.kind == COMM_SEND ? send_handle_wc((struct send_comm *)c, &wcs[i])
                                            : recv_handle_wc((struct recv_comm *)c, &wcs[i]);
        if (ret) return ret;
    }
    return 0;
}

/* The rest of progress after its poll, off the common path (one copy for both kinds): the
 * completions' failure, the peer gone, then a sender's matched slots that waited for room, or
 * a receiver's consumed receives (posted again on a poll that found nothing) and its held
 * clear-to-sends once the sender has none left. */
static __attribute__((noinline)) int progress_rest(struct conn *c, int n, int handled) {
    if (handled) return handled;
    if (c->error || c->peer_gone) {
        int ret = conn_peer_gone(c, n);
        if (ret) return ret;
    }
    if (c->base.kind == COMM_SEND) {
        struct send_comm *sc = (struct send_comm *)c;
        return sc->post_seq != sc->fifo_seq ? send_post_ready(sc) : 0;
    }
    struct recv_comm *rc = (struct recv_comm *)c;
    if (n == 0 && rc->nowed > 0) {
        int ret = rq_repay(rc);
        if (ret) return ret;
    }
    if (rc->cts_seq != rc->seq && cts_held(rc) == 0 && cts_room(rc)) return cts_flush(rc);
    return 0;
}

/* Every test() of a pending request comes here, with the comm's kind known at compile time
 * (send_progress, recv_progress). Under emulation a branch costs more than the instructions
 * around it, so the rare cases (failure, health check, the peer gone, an empty or failed
 * poll) leave the path in as few tests as they can. */
static inline __attribute__((always_inline)) int conn_progress_kind(struct conn *c,
                                                                    enum comm_kind kind) {
    struct ibv_wc wcs[POLL_BATCH];
    if (__builtin_expect(any_of((unsigned)c->error | (c->polls_since_check >= LIVENESS_POLLS)),
                         0)) {
        if (c->error) return c->error;
        /* Health is looked at before the CQ is polled, not after: a completion reaches our
         * CQ before the peer's close or death can be seen, so this poll still completes
         * whatever landed first, even when the thread was preempted between the two. */
        c->polls_since_check = 0;
        conn_check_health(c); /* a failure is sticky in c->error */
    }
    int n = vb.poll_cq(c->cq, POLL_BATCH, wcs), ret;
    if (__builtin_expect(n == 1, 1)) /* what a test() that completes usually finds */
        ret = kind == COMM_SEND ? send_handle_wc((struct send_comm *)c, &wcs[0])
                                : recv_handle_wc((struct recv_comm *)c, &wcs[0]);
    else
        ret = poll_other(c, wcs, n);
    /* after the poll: the rare cases, and what a poll may have to post next */
    unsigned more;
    if (kind == COMM_SEND) {
        struct send_comm *sc = (struct send_comm *)c;
        more = sc->post_seq != sc->fifo_seq;
    } else {
        struct recv_comm *rc = (struct recv_comm *)c;
        more = ((n == 0) & (rc->nowed > 0)) | (rc->cts_seq != rc->seq);
    }
    if (__builtin_expect(any_of((unsigned)ret | (unsigned)c->error | c->peer_gone | more), 0))
        return progress_rest(c, n, ret);
    return 0;
}

static __attribute__((noinline)) int send_progress(struct send_comm *sc) {
    return conn_progress_kind(&sc->c, COMM_SEND);
}

static __attribute__((noinline)) int recv_progress(struct recv_comm *rc) {
    return conn_progress_kind(&rc->c, COMM_RECV);
}

/* On siw, a warm-up that reaches the passive side just as its QP comes up is now and then
 * not delivered until more data arrives on that QP (a missed socket wake-up; about one
 * connection in 4,000 in the VM, one in a hundred when a listen comm accepts several at once),
 * and the receiver, which posts no clear-to-send before it has seen the warm-up, would wait
 * for ever. So the sender's connect waits for the receiver to say it has seen every warm-up
 * (MSG_WARMED, conn.c), and meanwhile says the warm-up again at growing intervals, a few
 * times: each one costs the receiver a receive it posts again, and its queue has room for
 * them even when it is not polled. */
#define WARMUP_REPEAT_NS 200000000ull
#define WARMUP_REPEATS   8

static int post_warmups(struct send_comm *sc) {
    for (int q = 0; q < sc->c.nqps; q++) {
        struct ibv_send_wr wr = {.wr_id = wr_id(WR_WARMUP, q, 0),
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        int ret = post_send(&sc->c, sc->c.qps[q].qp, &wr, &bad);
        if (ret) {
            WARN("%s: posting the warm-up send on QP %u to %s failed: %s", sc->c.base.dev->name,
                 sc->c.qps[q].qp->qp_num, sc->c.peer, strerror(-ret));
            return ret;
        }
        qp_sq_push(&sc->c.qps[q], 1, true);
        stats_add(&sc->c.stats.c.wrs_posted, 1);
    }
    sc->warmup_at_ns = now_coarse_ns();
    return 0;
}

int p2p_send_warmup(struct send_comm *sc) {
    sc->warmup_repeats = 0;
    return post_warmups(sc);
}

int p2p_send_warmup_again(struct send_comm *sc) {
    if (sc->warmup_repeats >= WARMUP_REPEATS) return 0;
    /* 200 ms, then twice as long each time: a receiver that is slow to call accept is not
     * flooded, and its receive queue (ERDMA_RQ_DEPTH) outlasts every repeat */
    uint64_t wait = WARMUP_REPEAT_NS << sc->warmup_repeats;
    if (now_coarse_ns() - sc->warmup_at_ns < wait) return 0;
    /* their completions wait for the first isend: the send queue holds all of them */
    for (int q = 0; q < sc->c.nqps; q++)
        if (qp_sq_room(&sc->c.qps[q]) < 1) return 0;
    if (++sc->warmup_repeats == 1)
        INFO(NCCL_NET,
             "%s: %s has not confirmed the warm-up %d ms after it was sent: saying it again, up "
             "to %d times (a receiver slow to call accept, or siw sitting on a SEND that landed "
             "as its QP came up)",
             sc->c.base.dev->name, sc->c.peer, (int)(WARMUP_REPEAT_NS / 1000000), WARMUP_REPEATS);
    return post_warmups(sc);
}

int p2p_recv_warmup_done(struct recv_comm *rc) {
    int ret = recv_progress(rc);
    if (ret) return ret;
    return rc->warmed == (1u << rc->c.nqps) - 1;
}

/* ------------------------------------------------------------ API */
/* The peer writes the FIFO by RDMA: read it through volatile. */
static inline volatile struct wire_cts *fifo_entry(struct send_comm *sc, uint32_t idx, int buf) {
    return &sc->fifo[cts_index(idx, buf)];
}

static __attribute__((cold, noinline)) int isend_refused(struct send_comm *sc, size_t size) {
    if (erdma_forked) return erdma_forked_refuse("isend");
    if (!sc || sc->c.base.kind != COMM_SEND) {
        WARN("isend: not a send comm (%p)", (void *)sc);
        return -EINVAL;
    }
    if (sc->c.error) return sc->c.error;
    WARN("%s: isend of %zu bytes without a memory handle", sc->c.base.dev->name, size);
    return -EINVAL;
}

/* Stands for a missing memory handle, which only an empty buffer may have (checked first):
 * read through it, the common path needs no branch for that case. */
static const struct erdma_mr no_mr = {.type = NCCL_PTR_HOST};

/* A fresh slot for the receive at fifo_seq, of n buffers: only what they use is cleared (the
 * hot path); the caller clears or sets their reqs. */
static inline void slot_start(struct send_comm *sc, struct send_slot *slot, int n) {
    slot->seq = sc->fifo_seq;
    slot->n = n;
    slot->matched = 0;
    slot->pending = 0;
    slot->posted = false;
}

/* isend's matching in general: a receive of several buffers, a slot already started, one
 * whose old completion is pending, or a tag not at the head. The buffer index, or -1 with
 * what isend returns in *ret. */
static __attribute__((noinline)) int isend_match(struct send_comm *sc, struct send_slot *slot,
                                                 uint32_t idx, int tag, int *ret) {
    uint32_t want = sc->fifo_seq + 1;
    int n = fifo_entry(sc, idx, 0)->nreqs;
    *ret = 0;
    if (n < 1 || n > ERDMA_MAX_RECVS) {
        WARN("%s: clear-to-send from %s announces %d buffers", sc->c.base.dev->name, sc->c.peer, n);
        *ret = conn_fail(&sc->c, -EPROTO);
        return -1;
    }
    for (int i = 1; i < n; i++)
        if (fifo_entry(sc, idx, i)->seq != want) return -1; /* rest of the entry in flight */
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* and read those rows after their seq */
    if (slot->seq != sc->fifo_seq || !slot->matched) {
        /* The message that used this slot FIFO_DEPTH ago landed (its receive was posted
         * again), but its writes' completions may not have reached us: they name the slot,
         * so it is not taken over before them. Not an error: the caller tries again. */
        if (slot->pending > 0) {
            *ret = send_progress(sc);
            if (*ret || slot->pending > 0) return -1;
        }
        slot_start(sc, slot, n);
        for (int k = 0; k < n; k++)
            slot->sends[k].req = NULL;
    } else if (n != slot->n) {
        /* the slot's shape was fixed by its first isend: a peer that rewrites it would get
         * a slot posted with unmatched entries, or one that never completes */
        WARN("%s: %s rewrote its clear-to-send #%u from %d to %d buffers while we were "
             "sending into it",
             sc->c.base.dev->name, sc->c.peer, sc->fifo_seq, slot->n, n);
        *ret = conn_fail(&sc->c, -EPROTO);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (fifo_entry(sc, idx, i)->tag == tag && !slot->sends[i].req) return i;
    /* As net_ib: a tag that no free buffer of the receive now at the head carries is not an
     * error; it may belong to a later receive, so the caller is asked to try again (NULL). */
    *ret = send_progress(sc);
    return -1;
}

/* The match found: buffer i of the slot at idx takes this send. single: the common slot of
 * one buffer, just started (erdma_isend), known at compile time. */
static inline __attribute__((always_inline)) int
isend_take(struct send_comm *sc, struct send_slot *slot, uint32_t idx, int i, void *data,
           size_t size, struct erdma_mr *mhandle, void *phandle, void **request, bool single) {
    /* As net_ib: a send larger than the matched buffer is truncated to it, and both ends'
     * test() report the bytes that landed. */
    uint64_t room = fifo_entry(sc, idx, i)->size; /* read once: the peer may rewrite it */
    if (size > room) size = (size_t)room;
    const struct erdma_mr *mr = ptr_or(mhandle, &no_mr);
    struct erdma_request *req = req_alloc(sc->reqs, ERDMA_SEND_REQS, &sc->c.req_next, sc, REQ_SEND);
    if (!req) return 0;
    req->n = 1;
    req->sizes[0] = size;
    req->seq = sc->fifo_seq;
    req->posted_ns = clock_cached_ns();
    req->phandle = phandle;
    slot->sends[i].req = req;
    slot->sends[i].data = data;
    slot->sends[i].size = size;
    slot->sends[i].lkey = mr->lkey;
    /* inline copies with the CPU: host memory only (comm.h) */
    slot->sends[i].cpu_readable = mr->type == NCCL_PTR_HOST;
    *request = req;
    if (single)
        slot->matched = 1;
    else if (++slot->matched < slot->n)
        return 0;
    sc->fifo_seq++;
    int ret = send_post_ready(sc);
    if (ret) *request = NULL; /* the connection is broken; close frees the request */
    return ret;
}

/* Under emulation each branch of a message's path costs more than the instructions around
 * it (bench/README.md): the common send (one buffer, a slot it starts, its tag, a memory
 * handle) is recognised in a few combined tests, and isend_match handles the rest. */
int erdma_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                void **request) {
    struct send_comm *sc = send_comm;
    *request = NULL;
    if (__builtin_expect(!sc, 0) ||
        __builtin_expect(any_of((unsigned)erdma_forked | (sc->c.base.kind ^ COMM_SEND) |
                                (uint32_t)sc->c.error | ((mhandle == NULL) & (size > 0))),
                         0))
        return isend_refused(sc, size);
    uint32_t idx = sc->fifo_seq % ERDMA_FIFO_DEPTH;
    volatile struct wire_cts *head = fifo_entry(sc, idx, 0);
    if (head->seq != sc->fifo_seq + 1) /* receiver not ready: not an error */
        return send_progress(sc);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    struct send_slot *slot = &sc->slots[idx];
    unsigned single = (head->nreqs == 1) & (head->tag == tag) &
                      ((slot->seq != sc->fifo_seq) | (slot->matched == 0)) & (slot->pending <= 0);
    if (__builtin_expect(any_of(single), 1)) {
        slot_start(sc, slot, 1); /* its one buffer's req is set by isend_take */
        return isend_take(sc, slot, idx, 0, data, size, mhandle, phandle, request, true);
    }
    int ret;
    int i = isend_match(sc, slot, idx, tag, &ret);
    if (i < 0) return ret;
    return isend_take(sc, slot, idx, i, data, size, mhandle, phandle, request, false);
}

static __attribute__((cold, noinline)) int irecv_refused(struct recv_comm *rc, int n) {
    if (erdma_forked) return erdma_forked_refuse("irecv");
    if (!rc || rc->c.base.kind != COMM_RECV) {
        WARN("irecv: not a recv comm (%p)", (void *)rc);
        return -EINVAL;
    }
    if (n < 1 || n > ERDMA_MAX_RECVS) {
        WARN("%s: irecv of %d buffers (1..%d allowed)", rc->c.base.dev->name, n, ERDMA_MAX_RECVS);
        return -EINVAL;
    }
    return rc->c.error;
}

static __attribute__((cold, noinline)) int irecv_no_handle(struct recv_comm *rc, int n,
                                                           const size_t *sizes, void **mhandles) {
    for (int i = 0; i < n; i++)
        if (sizes[i] > 0 && !mhandles[i]) {
            WARN("%s: irecv buffer %d (%zu bytes) without a memory handle", rc->c.base.dev->name, i,
                 sizes[i]);
            break;
        }
    return -EINVAL;
}

/* irecv's less common end: a receive of several buffers, batching on, siw, or the
 * profiler. The request is posted (the slot holds it); its clear-to-send may wait. */
static __attribute__((noinline)) int irecv_finish_general(struct recv_comm *rc, uint32_t idx, int n,
                                                          const size_t *sizes, void **phandles,
                                                          uint64_t total) {
    if (prof_on()) recv_prof_start(rc, idx, n, sizes, phandles);
    rc->post_qp = qp_next(rc->post_qp, rc->c.nqps);
    return cts_may_wait(rc, total) ? 0 : cts_flush(rc);
}

int erdma_irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                void **mhandles, void **phandles, void **request) {
    struct recv_comm *rc = recv_comm;
    *request = NULL;
    if (__builtin_expect(!rc, 0) ||
        __builtin_expect(any_of((unsigned)erdma_forked | (rc->c.base.kind ^ COMM_RECV) |
                                (uint32_t)rc->c.error | ((unsigned)(n - 1) >= ERDMA_MAX_RECVS)),
                         0))
        return irecv_refused(rc, n);
    uint32_t seq = rc->seq, idx = seq % ERDMA_FIFO_DEPTH;
    struct recv_slot *slot = &rc->slots[idx];
    if (any_of((slot->req != NULL) | !cts_room(rc))) return recv_progress(rc);
    /* The slot is free: its staging may be written before the checks below, which then
     * leave it unposted. */
    uint64_t total = 0;
    unsigned missing = 0;
    int i = 0;
    do { /* n >= 1 */
        const struct erdma_mr *mr = ptr_or(mhandles[i], &no_mr);
        missing |= (sizes[i] > 0) & (mhandles[i] == NULL);
        total += sizes[i];
        rc->cts[cts_index(idx, i)] = (struct wire_cts){.addr = (uintptr_t)data[i],
                                                       .size = sizes[i],
                                                       .rkey = mr->rkey,
                                                       .tag = tags[i],
                                                       .nreqs = (uint16_t)n,
                                                       .seq = seq + 1};
        slot->posted_sizes[i] = sizes[i];
    } while (++i < n);
    if (__builtin_expect(missing, 0)) return irecv_no_handle(rc, n, sizes, mhandles);
    struct erdma_request *req = req_alloc(rc->reqs, ERDMA_RECV_REQS, &rc->c.req_next, rc, REQ_RECV);
    if (!req) return 0;
    req->n = n;
    req->seq = seq;
    req->posted_ns = clock_cached_ns();
    slot->seq = seq;
    slot->n = n;
    slot->req = req;
    slot->expected = qps_used(&rc->c);
    slot->got = 0;
    rc->seq++;
    *request = req;
    /* the common receive: one buffer, its own clear-to-send the only one waiting (batching
     * off, the default), not siw, no profiler: that one write, posted at once */
    unsigned one =
        (n == 1) & (rc->seq - rc->cts_seq == 1) & (rc->cts_batch <= 1) & !hot_path_off(&rc->c);
    int ret;
    if (__builtin_expect(any_of(one), 1)) {
        rc->post_qp = qp_next(rc->post_qp, rc->c.nqps);
        ret = cts_post_one(rc, idx, true);
        rc->cts_seq += ret == 0;
    } else {
        ret = irecv_finish_general(rc, idx, n, sizes, phandles, total);
    }
    if (ret) *request = NULL; /* the connection is broken; close frees the request */
    return ret;
}

int erdma_iflush(void *recv_comm, int n, void **data, const int *sizes, void **mhandles,
                 void **request) {
    struct recv_comm *rc = recv_comm;
    *request = NULL;
    if (erdma_forked) return erdma_forked_refuse("iflush");
    if (!rc || rc->c.base.kind != COMM_RECV) return -EINVAL;
    if (!rc->flush_ready) return 0; /* nothing to flush: NCCL treats NULL as done */
    if (rc->c.error) return rc->c.error;
    int last = -1;
    for (int i = 0; i < n; i++)
        if (sizes[i] > 0 && mhandles[i]) last = i;
    if (last < 0) return 0;
    /* NCCL reads a NULL flush request as "done", so "try again" cannot be said here; with
     * at most NCCL_NET_MAX_REQUESTS receives and as many flushes in flight neither limit is
     * reached: a caller that does is misusing the API (ENOBUFS: ncclInvalidUsage). */
    struct erdma_request *req = NULL;
    if (qp_sq_room(&rc->flush_qp) >= 1)
        req = req_alloc(rc->reqs, ERDMA_RECV_REQS, &rc->c.req_next, rc, REQ_FLUSH);
    if (!req) {
        WARN("%s: iflush with %d receives and flushes already in flight (at most %d each): "
             "test() the earlier requests first",
             rc->c.base.dev->name, ERDMA_RECV_REQS, ERDMA_FIFO_DEPTH);
        return -ENOBUFS;
    }
    struct erdma_mr *mr = mhandles[last];
    /* An RDMA read of our own buffer completes only after earlier PCIe writes into it did. */
    struct ibv_sge sge = {
        .addr = (uintptr_t)rc->flush_buf, .length = 1, .lkey = rc->c.peer_mr->lkey};
    struct ibv_send_wr wr =
                           {
                               .wr_id = wr_id(WR_FLUSH, 0, (uint32_t)(req - rc->reqs)),
                               .sg_list = &sge,
                               .num_sge = 1,
                               .opcode = IBV_WR_RDMA_READ,
                               .send_flags = IBV_SEND_SIGNALED,
                               .wr.rdma = {.remote_addr = (uintptr_t)data[last], .rkey = mr->rkey},
                           },
                       *bad;
    int ret = post_send(&rc->c, rc->flush_qp.qp, &wr, &bad);
    if (ret) {
        req->type = REQ_FREE;
        WARN("%s: posting the flush read failed: %s", rc->c.base.dev->name, strerror(-ret));
        return conn_fail(&rc->c, ret);
    }
    qp_sq_push(&rc->flush_qp, 1, true);
    stats_add(&rc->c.stats.c.wrs_posted, 1);
    stats_add(&rc->c.stats.c.flushes, 1);
    *request = req;
    return 0;
}

static __attribute__((cold, noinline)) int test_refused(void *request) {
    if (erdma_forked) return erdma_forked_refuse("test");
    WARN("test: not a live request (%p)", request);
    return -EINVAL;
}

static inline int size_reported(uint64_t size) {
    return size > INT_MAX ? INT_MAX : (int)size;
}

/* The sizes of a receive of several buffers; none for a flush (as net_ib) */
static __attribute__((noinline)) void test_sizes(const struct erdma_request *req, int *sizes) {
    if (!sizes || req->type == REQ_FLUSH) return;
    for (int i = 0; i < req->n; i++)
        sizes[i] = size_reported(req->sizes[i]);
}

/* A NULL request reads as a freed one: test() refuses both in one test. */
static const struct erdma_request no_request = {.type = REQ_FREE};

/* Every branch here is paid on each message (under emulation, per branch rather than per
 * instruction): the refusals are tested together, and a single size is copied without the
 * loop. */
int erdma_test(void *request, int *done, int *sizes) {
    struct erdma_request *req = (struct erdma_request *)ptr_or(request, &no_request);
    *done = 0;
    if (__builtin_expect(any_of((unsigned)erdma_forked | (req->type == REQ_FREE)), 0))
        return test_refused(request);
    if (!req->done) {
        int ret = req->type == REQ_SEND ? send_progress(req->comm) : recv_progress(req->comm);
        /* a request that completed before the connection failed did move its data */
        if (!req->done) return ret;
    }
    *done = 1;
    /* the common report: one size (a send, or a receive of one buffer) */
    if (__builtin_expect(any_of((sizes == NULL) | (req->type == REQ_FLUSH) | (req->n > 1)), 0))
        test_sizes(req, sizes);
    else
        sizes[0] = size_reported(req->sizes[0]);
    /* the next request taken is this one, its line still in cache (req_alloc) */
    ((struct conn *)req->comm)->req_next = req->idx;
    req->type = REQ_FREE;
    return 0;
}
