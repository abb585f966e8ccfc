/*
 * Comm objects shared by conn.c (building them) and p2p.c (moving data).
 * A send comm and a recv comm are the two ends of one connection: the same
 * RC QPs carry payload one way and clear-to-send records the other.
 */
#ifndef ERDMA_COMM_H
#define ERDMA_COMM_H

#include "device.h"
#include "reap.h"
#include "stats.h"
#include "wire.h"

#include <stdbool.h>
#include <stdint.h>

enum comm_kind { COMM_LISTEN = 0x4c49534e, COMM_SEND = 0x53454e44, COMM_RECV = 0x52454356 };

#define ERDMA_RQ_DEPTH  64 /* per QP: >= 2 completions per FIFO slot */
#define ERDMA_SEND_REQS (ERDMA_FIFO_DEPTH * ERDMA_MAX_RECVS)
#define ERDMA_RECV_REQS (2 * ERDMA_FIFO_DEPTH) /* receives and flushes */
_Static_assert((ERDMA_SEND_REQS & (ERDMA_SEND_REQS - 1)) == 0 &&
                   (ERDMA_RECV_REQS & (ERDMA_RECV_REQS - 1)) == 0,
               "request pools wrap by masking (p2p.c req_alloc)");

/* Receives consumed and not posted again yet, at most (recv_comm.owed). A QP's queue then
 * still holds RQ_DEPTH - RQ_OWED_MAX = 48 receives: more than the FIFO_DEPTH (32) slots
 * whose completion can be on the way to it, plus the sender's warm-up repeats (9). */
#define ERDMA_RQ_OWED_MAX 16

struct comm_base {
    uint32_t kind;
    struct erdma_device *dev;
};

/* Returns the device of a listen/send/recv comm, or NULL (WARNed) for anything else. */
struct erdma_device *comm_device(void *comm);

/* Signaled send-queue entries in flight, at most: one per WR at worst, and no QP's send queue
 * is deeper (conn_sq_depth). A power of two: the ring wraps by masking. */
#define ERDMA_SQ_RING 1024
_Static_assert((ERDMA_SQ_RING & (ERDMA_SQ_RING - 1)) == 0, "the ring wraps by masking");
_Static_assert(ERDMA_SQ_RING > 4 * ERDMA_FIFO_DEPTH, "room for every signaled WR (qp.h)");

struct qp_ctx {
    struct ibv_qp *qp;
    struct rdma_cm_id *cm_id; /* rdma_cm mode only */
    int sq_depth;
    int sq_used;
    bool up; /* rdma_cm mode: ESTABLISHED seen */
    int max_inline;
    int sig_head, sig_tail;
    int unsignaled; /* WRs posted since the last signaled one */
    /* WRs retired by each signaled completion still in flight, in posting order; last, so
     * that the fields above share a cache line */
    uint16_t sig_ring[ERDMA_SQ_RING];
};

enum req_type { REQ_FREE = 0, REQ_SEND, REQ_RECV, REQ_FLUSH };

/* Aligned, with what every request reads first: one cache line a message */
struct erdma_request {
    uint32_t type;
    bool done;
    uint16_t idx; /* its place in the comm's pool: test() points the comm's req_next at it */
    int n;
    uint32_t seq;
    void *comm;
    uint64_t posted_ns; /* clock_cached_ns(): the longest time in flight, for the counters */
    void *phandle;      /* isend: NCCL's profiler handle (v10+), NULL otherwise */
    uint64_t sizes[ERDMA_MAX_RECVS];
} __attribute__((aligned(64)));

/* A peer's "a.b.c.d:port" (the out-of-band socket is IPv4: at most 22 bytes with its NUL). */
#define ERDMA_PEER_LEN 32

/* One connection end: what conn.c sets up and p2p.c uses. The fields each message reads or
 * writes come first, together: under emulation a message's cost follows the cache lines it
 * touches more than its instructions (bench/README.md). */
struct conn {
    struct comm_base base;
    int error; /* sticky -errno once the connection is broken */
    uint32_t polls_since_check;
    /* A receive ring flush (the peer's QPs are gone) when nothing needed the peer: it fails
     * only what still needs the peer, not the receiver's local flushes */
    bool peer_gone;
    enum completion_mode completion;
    bool split;
    bool inline_payload;   /* NCCL_ERDMA_INLINE_PAYLOAD: payloads <= max_inline go inline */
    bool inline_cts;       /* NCCL_IB_USE_INLINE: clear-to-sends go inline */
    bool sends_in_syscall; /* the device's (siw: p2p.c post_send), here on the hot line */
    int nqps;
    int req_next;     /* where the search for a free request starts (p2p.c req_alloc) */
    uint32_t max_msg; /* largest single RDMA write, both ends agree */
    struct ibv_cq *cq;
    struct ibv_mr *ctrl_mr; /* all of the control region, for our own posts: no remote access */
    uint64_t remote_ctrl_addr;
    uint32_t remote_ctrl_rkey;
    /* The one work request of a common post (a small payload, a clear-to-send): zeroed with
     * the comm, each post sets the fields it uses. A request built on the stack is cleared
     * first, and under emulation that clear costs more than the rest of the post. */
    struct ibv_send_wr hot_wr;
    struct ibv_sge hot_sge;
    struct stats_conn stats; /* registered once the connection is up; its counters first */
    /* ---- the rest: setup, health checks, teardown */
    int fd; /* out-of-band TCP, kept open to notice a dead peer */
    /* The stall watch (p2p.c): NCCL_ERDMA_STALL_WARN, messages moved at its last look, since
     * when the caller has waited with none moving, when it last looked, and whether this wait
     * was WARNed. In the 32 bytes peer[] no longer takes (it held 64): every field after
     * them, and the data path's layout, stay where they were. */
    uint32_t stall_warn_s;
    char peer[ERDMA_PEER_LEN];
    uint64_t wait_mark, wait_since_ns, wait_seen_ns;
    bool wait_warned;
    int cq_depth;
    void *ctrl; /* registered control region (FIFO / records / ring) */
    size_t ctrl_len;
    struct ibv_mr *peer_mr; /* its head, the only part the peer may write (its key goes out) */
    uint64_t last_check_ns;
    uint64_t peer_bye_ns; /* when the peer's goodbye was first seen; 0 before */
    struct ibv_wc peer_gone_wc;
    /* the device's port_downs when this connection was made (p2p.c's port_down_hint) */
    unsigned port_downs;
    struct rdma_event_channel *cm_ch;
    /* rdma_cm mode: the teardown after close, finished on the reaper thread (conn.c) */
    struct reap_item reap;
    int td_stage;
    int td_pending; /* disconnects still to be reported */
    uint64_t td_deadline;
    void (*td_release)(struct conn *c); /* destroys and frees the comm once that is done */
    struct qp_ctx qps[ERDMA_MAX_QPS];
};

/* Aligned: a single-buffer slot's fields and its first buffer share one cache line */
struct send_slot {
    uint32_t seq;
    int n;       /* buffers in the peer's receive */
    int matched; /* isends posted against it */
    int pending; /* completions still expected (one per QP used) */
    bool posted;
    struct {
        struct erdma_request *req;
        void *data;
        uint64_t size;
        uint32_t lkey;
        /* host memory: the CPU may copy it into the work request (inline). A GPU buffer
         * is the NIC's to read: a CPU copy of it faults (SIGSEGV) */
        bool cpu_readable;
    } sends[ERDMA_MAX_RECVS];
} __attribute__((aligned(64)));

struct send_comm {
    struct conn c;
    struct wire_cts *fifo;       /* [MAX_RECVS][FIFO_DEPTH] (cts_index), written by the peer */
    struct wire_record *records; /* [FIFO_DEPTH] staging for non-inline records */
    uint32_t fifo_seq;           /* next slot isends match against */
    uint32_t post_seq;           /* next slot to post */
    /* round-robin: the QP of the slot at post_seq, counted on its own (post_seq % nqps is
     * wrong once post_seq wraps unless nqps divides 2^32; the receiver counts per QP) */
    int post_qp;
    struct send_slot slots[ERDMA_FIFO_DEPTH];
    struct erdma_request reqs[ERDMA_SEND_REQS];
    int cm_retries;        /* rdma_cm connects retried (EADDRINUSE) */
    int warmup_repeats;    /* rdma_cm mode: warm-ups said again while connect waits for */
    uint64_t warmup_at_ns; /* the receiver to confirm them; when the last one was posted */
    struct rdma_cm_id *cm_retired[ERDMA_MAX_QPS]; /* ids to destroy once their event is acked */
    /* profiler events of each slot's buffers on each QP, NULL when none is open (outside the
     * slots: isend clears a slot on the hot path, these stay cleared by their stops) */
    void *prof_ev[ERDMA_FIFO_DEPTH][ERDMA_MAX_RECVS][ERDMA_MAX_QPS];
};

struct recv_slot { /* aligned, as the sender's */
    uint32_t seq;
    int n; /* buffers of its receive (req->n, readable before req is known to be there) */
    struct erdma_request *req;
    int expected;
    int got;
    uint64_t posted_sizes[ERDMA_MAX_RECVS];
} __attribute__((aligned(64)));

struct recv_comm {
    struct conn c;
    struct wire_record *rec_area; /* [FIFO_DEPTH], written by the peer (imm mode) */
    struct wire_cts *cts;         /* [MAX_RECVS][FIFO_DEPTH] (cts_index) staging */
    struct wire_record *ring;     /* [nqps][RQ_DEPTH] send-mode receive buffers */
    uint8_t *flush_buf;
    uint32_t seq;     /* receives posted */
    uint32_t cts_seq; /* receives whose clear-to-send is posted; the rest wait for a batch */
    uint32_t arrived; /* receives whose payload has landed */
    int cts_batch;    /* NCCL_ERDMA_CTS_BATCH */
    /* RC keeps each QP's completions in posting order, so the sequence a completion belongs
     * to follows from its QP: round-robin gives QP q every nqps-th slot, split gives it all */
    uint32_t next_seq[ERDMA_MAX_QPS];
    int post_qp;     /* round-robin: the QP that carries receive seq (for the profiler's events) */
    unsigned warmed; /* rdma_cm mode: bit q set once QP q's warm-up SEND came */
    /* receive work requests consumed by arrivals and not yet posted again, as
     * q * RQ_DEPTH + index: they go back on an idle poll (p2p.c, rq_repay) */
    uint16_t owed[ERDMA_RQ_OWED_MAX];
    int nowed;
    struct recv_slot slots[ERDMA_FIFO_DEPTH];
    struct qp_ctx flush_qp;
    bool flush_ready;
    /* rdma_cm mode: the loopback is a QP pair through a private listener */
    struct qp_ctx flush_peer;
    struct rdma_cm_id *flush_listen;
    struct rdma_event_channel *flush_ch;
    int flush_up;      /* rdma_cm loopback: ends established (2 = ready) */
    int flush_retries; /* rdma_cm loopback: connects given up for a port already taken */
    struct erdma_request reqs[ERDMA_RECV_REQS];
    void *prof_ev[ERDMA_FIFO_DEPTH][ERDMA_MAX_RECVS][ERDMA_MAX_QPS]; /* as the sender's */
};

/* Clear-to-send entries, in the sender's FIFO and the receiver's staging copy, are stored
 * buffer-major ([MAX_RECVS][FIFO_DEPTH]): the first entries of consecutive slots sit side by
 * side, so one RDMA write of 32 bytes per slot carries a batch of single-buffer receives. */
static inline size_t cts_index(uint32_t slot, int buf) {
    return (size_t)buf * ERDMA_FIFO_DEPTH + slot;
}

/* Control region layouts (offsets inside conn.ctrl). Each starts with what the peer
 * RDMA-writes (a sender's FIFO, a receiver's record area), the only part its key reaches:
 * the rest (our clear-to-send copies, records to send, receive ring) is ours. The flush
 * read's target sits in the receiver's peer-writable head: iWARP requires remote write
 * access on the local buffer a read lands in (its response is a tagged write; Linux's rw.c
 * and svcrdma grant it for iWARP), and its byte is never read, so a peer's write there
 * changes nothing. */
#define SEND_CTRL_FIFO    0
#define SEND_CTRL_RECORDS (ERDMA_FIFO_DEPTH * ERDMA_MAX_RECVS * sizeof(struct wire_cts))
#define SEND_CTRL_LEN     (SEND_CTRL_RECORDS + ERDMA_FIFO_DEPTH * sizeof(struct wire_record))
#define RECV_CTRL_RECORDS 0
#define RECV_CTRL_FLUSH   (ERDMA_FIFO_DEPTH * sizeof(struct wire_record))
#define RECV_CTRL_CTS     (RECV_CTRL_FLUSH + 64)
#define RECV_CTRL_RING                                                                             \
    (RECV_CTRL_CTS + ERDMA_FIFO_DEPTH * ERDMA_MAX_RECVS * sizeof(struct wire_cts))
#define SEND_CTRL_PEER_LEN SEND_CTRL_RECORDS /* the FIFO */
#define RECV_CTRL_PEER_LEN RECV_CTRL_CTS     /* the record area and the flush target */
#define RECV_CTRL_LEN(nqps)                                                                        \
    (RECV_CTRL_RING + (size_t)(nqps)*ERDMA_RQ_DEPTH * sizeof(struct wire_record))

/* p2p.c, called by conn.c once a connection is up */
int p2p_recv_post_initial(struct recv_comm *rc);
int p2p_post_recv_wr(struct recv_comm *rc, int qp, int slot);
/* rdma_cm mode: iWARP lets the passive side send only after the active side has (MPA's
 * ready-to-receive); the sender opens every QP with a zero-length SEND, and the receiver
 * does not complete accept (so posts no clear-to-send) before it has seen them all. The sender's
 * connect says them again, from time to time, until the receiver confirms (MSG_WARMED). */
int p2p_send_warmup(struct send_comm *sc);
int p2p_send_warmup_again(struct send_comm *sc); /* when due; 0 or -errno */
int p2p_recv_warmup_done(struct recv_comm *rc);  /* 1 done, 0 not yet, -errno */
/* Stops the profiler events still open on a send or recv comm being closed (before its kind
 * is cleared: the kind says which events it has). */
void p2p_prof_close(struct conn *c);
/* Closes a connection end: what is NCCL's (counters, profiler events) at once, then the rest
 * through release(): at once too, or on the reaper thread when an rdma_cm peer is owed a
 * graceful goodbye. */
void conn_release(struct conn *c, void (*release)(struct conn *c));
/* Destroys what conn_alloc_common and the connect/accept paths made; never waits. */
void conn_destroy_common(struct conn *c);

#endif
