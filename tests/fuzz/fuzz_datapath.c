/*
 * libFuzzer target over the data path (p2p.c) as a hostile peer drives it: a real
 * send/recv comm pair over the fake verbs provider (tests/unit/fake_verbs.h), and an
 * input that interleaves NCCL's calls (irecv, isend, test) with what the peer can do
 * to us: write any bytes into the memory it owns in our process (the sender's
 * clear-to-send FIFO, the receiver's record area and send-mode ring) and complete our
 * receives with any opcode, immediate and length.
 *
 * Input: byte 0 picks the connection's shape (QPs, split, completion mode); then
 * operations, one selector byte each followed by its arguments. Checked after every
 * operation: nothing the NIC would refuse was posted, no CQ overflowed, a finished
 * receive never reports more bytes than its buffer; at the end, close releases every
 * QP, CQ and registration (the fake counts them).
 */
#define _GNU_SOURCE
#include "comm.h"
#include "fake_verbs.h"
#include "log.h"
#include "mr_cache.h"
#include "net.h"
#include "params.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define ARENA     (64 * 1024)
#define MAX_OUT   64
#define MAX_STEPS 96

struct input {
    const uint8_t *p;
    size_t left;
};

static uint8_t u8(struct input *in) {
    if (!in->left) return 0;
    in->left--;
    return *in->p++;
}
static uint16_t u16(struct input *in) {
    return (uint16_t)(u8(in) | u8(in) << 8);
}
static uint32_t u32(struct input *in) {
    return (uint32_t)u16(in) | (uint32_t)u16(in) << 16;
}
static uint64_t u64(struct input *in) {
    return (uint64_t)u32(in) | (uint64_t)u32(in) << 32;
}

struct outstanding {
    void *req;
    bool recv;
    int n;
    size_t sizes[ERDMA_MAX_RECVS];
};

static struct outstanding out[MAX_OUT];
static int nout;
static uint8_t *send_arena, *recv_arena;
static int cur_shape = -1;

static void quiet_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...) {}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    erdma_log_set(getenv("FUZZ_VERBOSE") ? NULL : quiet_logger);
    if (fake_env_start(1, NULL, NULL) != 1) abort();
    erdma_log_set(getenv("FUZZ_VERBOSE") ? NULL : quiet_logger);
    send_arena = aligned_alloc(4096, ARENA);
    recv_arena = aligned_alloc(4096, ARENA);
    return 0;
}

/* Shape: QPs per connection (1..3), split or not, write-with-imm or send completions. */
static void apply_shape(uint8_t b) {
    int shape = b % 12;
    if (shape == cur_shape) return;
    cur_shape = shape;
    char qps[4];
    snprintf(qps, sizeof(qps), "%d", 1 + shape % 3);
    setenv("NCCL_IB_QPS_PER_CONNECTION", qps, 1);
    setenv("NCCL_IB_SPLIT_DATA_ON_QPS", (shape / 3) % 2 ? "1" : "0", 1);
    params_load();
    /* what discovery decides from NCCL_ERDMA_COMPLETION, set on the device directly */
    device_get(0)->completion = shape / 6 ? COMPLETION_SEND : COMPLETION_IMM;
}

static void check_invariants(struct send_comm *sc, struct recv_comm *rc) {
    if (fake_post_errors()) abort();           /* posted something a NIC refuses */
    if (fake_cq_overflowed(sc->c.cq)) abort(); /* more completions than the CQ holds */
    if (fake_cq_overflowed(rc->c.cq)) abort();
}

static void forget(int i) {
    out[i] = out[--nout];
}

static void peer_write(struct input *in, void *base, size_t len) {
    size_t off = u16(in) % len;
    size_t n = u8(in) % 40;
    for (size_t i = 0; i < n && off + i < len; i++)
        ((volatile uint8_t *)base)[off + i] = u8(in);
}

static void op_irecv(struct input *in, struct recv_comm *rc, void *rmh) {
    int n = 1 + u8(in) % ERDMA_MAX_RECVS;
    void *bufs[ERDMA_MAX_RECVS], *mhs[ERDMA_MAX_RECVS], *req = NULL;
    size_t sizes[ERDMA_MAX_RECVS];
    int tags[ERDMA_MAX_RECVS];
    for (int i = 0; i < n; i++) {
        sizes[i] = u16(in) % 4097;
        tags[i] = (int8_t)u8(in);
        bufs[i] = recv_arena + (size_t)((rc->seq * ERDMA_MAX_RECVS + (uint32_t)i) % 16) * 4096;
        mhs[i] = rmh;
    }
    if (erdma_irecv(rc, n, bufs, sizes, tags, mhs, NULL, &req) == 0 && req && nout < MAX_OUT) {
        out[nout] = (struct outstanding){.req = req, .recv = true, .n = n};
        memcpy(out[nout].sizes, sizes, sizeof(sizes));
        nout++;
    }
}

static void op_isend(struct input *in, struct send_comm *sc, void *smh) {
    size_t size = u16(in) % 4097;
    int tag = (int8_t)u8(in);
    void *req = NULL;
    uint8_t *buf = send_arena + (size_t)(u8(in) % 15) * 4096;
    if (erdma_isend(sc, buf, size, tag, smh, NULL, &req) == 0 && req && nout < MAX_OUT)
        out[nout++] = (struct outstanding){.req = req, .recv = false, .n = 1};
}

static void op_test(struct input *in) {
    if (!nout) return;
    int i = u8(in) % nout;
    int done = 0, sizes[ERDMA_MAX_RECVS];
    memset(sizes, 0xff, sizeof(sizes));
    int rc = erdma_test(out[i].req, &done, sizes);
    if (rc) { /* the connection is broken: NCCL gives up on the request */
        forget(i);
        return;
    }
    if (!done) return;
    if (out[i].recv)
        for (int k = 0; k < out[i].n; k++)
            if (sizes[k] < 0 || (size_t)sizes[k] > out[i].sizes[k]) abort();
    forget(i);
}

/* A field of a FIFO entry the sender is about to read, set to the peer's value. */
static void op_fifo_field(struct input *in, struct send_comm *sc) {
    uint32_t slot = (sc->fifo_seq + u8(in) % 2) % ERDMA_FIFO_DEPTH;
    int buf = u8(in) % ERDMA_MAX_RECVS;
    volatile struct wire_cts *e = &sc->fifo[cts_index(slot, buf)];
    switch (u8(in) % 7) {
    case 0:
        e->addr = u64(in);
        break;
    case 1:
        e->size = u64(in);
        break;
    case 2:
        e->rkey = u32(in);
        break;
    case 3:
        e->tag = (int8_t)u8(in);
        break;
    case 4:
        e->nreqs = u16(in);
        break;
    case 5:
        e->seq = sc->fifo_seq + 1 + (u8(in) % 3 == 0); /* "ready", or one ahead */
        break;
    default:
        e->seq = u32(in);
    }
}

/* A completion record where the receiver will look for its next one. */
static void op_record(struct input *in, struct recv_comm *rc) {
    uint32_t seq = rc->arrived + u8(in) % 2;
    struct wire_record r = {.seq = u8(in) % 4 ? seq : u32(in), .n = u8(in) % 10};
    for (int i = 0; i < ERDMA_MAX_RECVS; i++)
        r.sizes[i] = u8(in) % 2 ? u16(in) : u64(in);
    int where = u8(in) % 2;
    if (where == 0 || rc->c.completion == COMPLETION_IMM) {
        memcpy((void *)&rc->rec_area[seq % ERDMA_FIFO_DEPTH], &r, sizeof(r));
    } else {
        int q = u8(in) % rc->c.nqps;
        memcpy((void *)&rc->ring[q * ERDMA_RQ_DEPTH + u8(in) % ERDMA_RQ_DEPTH], &r, sizeof(r));
    }
}

/* A receive completed as the peer chose (the NIC fills in only our wr_id and QP). */
static void op_inject(struct input *in, struct recv_comm *rc) {
    int q = u8(in) % rc->c.nqps;
    uint8_t kind = u8(in);
    uint32_t imm;
    switch (kind % 4) {
    case 0:
        imm = 0x80000000u | ((rc->arrived + u8(in) % 3) & 0x7fffffffu); /* a record's */
        break;
    case 1:
        imm = u16(in); /* a size */
        break;
    default:
        imm = u32(in);
    }
    struct wire_record r;
    memset(&r, 0, sizeof(r));
    uint32_t len = kind & 0x10 ? sizeof(r) : u8(in);
    r.seq = rc->arrived;
    r.n = 1;
    r.sizes[0] = u16(in);
    enum ibv_wc_opcode op = kind & 0x20 ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
    uint8_t bytes[256];
    memcpy(bytes, &r, sizeof(r));
    for (size_t i = sizeof(r); i < sizeof(bytes); i++)
        bytes[i] = (uint8_t)i;
    (void)fake_inject_recv(rc->c.qps[q].qp, op, imm, bytes, len);
}

/* A connection is costly to build (TCP, and 300 KB of comm state under ASan), so one is
 * reused while it is healthy and quiescent: no error, nothing outstanding, both ends at
 * the same sequence. Its peer-written memory is then cleared, which leaves it as a fresh
 * one but for its sequence numbers. Every RECONNECT_EVERY inputs, and after any input
 * that broke it, a new pair is built; FUZZ_FRESH=1 builds one for every input (to
 * reproduce a finding exactly). */
#define RECONNECT_EVERY 64
static struct send_comm *sc;
static struct recv_comm *rc;
static void *smh, *rmh;
static int uses;

static void pair_close(void) {
    if (!sc) return;
    /* a reset, not a close: no TIME_WAIT per pair, or a long run exhausts loopback ports */
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(sc->c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    setsockopt(rc->c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    erdma_dereg_mr(sc, smh);
    erdma_dereg_mr(rc, rmh);
    if (erdma_close_send(sc) || erdma_close_recv(rc)) abort();
    if (mr_cache_count(device_get(0)->mrs) != 0) abort(); /* a registration leaked */
    if (fake_live_qps_cqs() != 0) abort();                /* close left a QP or CQ */
    sc = NULL;
    rc = NULL;
}

static bool pair_reusable(void) {
    return !sc->c.error && !rc->c.error && nout == 0 && sc->fifo_seq == sc->post_seq &&
           sc->fifo_seq == rc->seq && rc->seq == rc->arrived && rc->cts_seq == rc->seq &&
           ++uses < RECONNECT_EVERY && !getenv("FUZZ_FRESH");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct input in = {data, size};
    int shape = cur_shape;
    apply_shape(u8(&in));
    if (sc && shape != cur_shape) pair_close();
    if (!sc) {
        void *s = NULL, *r = NULL;
        if (fake_pair_connect(0, 0, &s, &r)) abort(); /* a clean pair always connects */
        sc = s;
        rc = r;
        uses = 0;
        if (erdma_reg_mr(sc, send_arena, ARENA, NCCL_PTR_HOST, &smh)) abort();
        if (erdma_reg_mr(rc, recv_arena, ARENA, NCCL_PTR_HOST, &rmh)) abort();
    }
    nout = 0;
    for (int step = 0; step < MAX_STEPS && in.left; step++) {
        switch (u8(&in) % 10) {
        case 0:
        case 1:
            op_irecv(&in, rc, rmh);
            break;
        case 2:
        case 3:
            op_isend(&in, sc, smh);
            break;
        case 4:
        case 5:
            op_test(&in);
            break;
        case 6:
            op_fifo_field(&in, sc);
            break;
        case 7:
            op_record(&in, rc);
            break;
        case 8:
            op_inject(&in, rc);
            break;
        default:
            switch (u8(&in) % 3) {
            case 0:
                peer_write(&in, sc->fifo, ERDMA_FIFO_DEPTH * ERDMA_MAX_RECVS * sizeof(*sc->fifo));
                break;
            case 1:
                peer_write(&in, rc->rec_area, ERDMA_FIFO_DEPTH * sizeof(*rc->rec_area));
                break;
            default:
                peer_write(&in, rc->ring, (size_t)rc->c.nqps * ERDMA_RQ_DEPTH * sizeof(*rc->ring));
            }
        }
        check_invariants(sc, rc);
    }
    /* drain: a well-behaved run ends with every request done; a hostile one may not */
    for (int round = 0; round < 4 && nout; round++)
        for (int i = nout - 1; i >= 0; i--) {
            int done = 0, sizes[ERDMA_MAX_RECVS];
            int ret = erdma_test(out[i].req, &done, sizes);
            if (ret || done) {
                if (!ret && out[i].recv)
                    for (int k = 0; k < out[i].n; k++)
                        if (sizes[k] < 0 || (size_t)sizes[k] > out[i].sizes[k]) abort();
                forget(i);
            }
        }
    check_invariants(sc, rc);
    if (pair_reusable()) {
        memset(sc->fifo, 0, ERDMA_FIFO_DEPTH * ERDMA_MAX_RECVS * sizeof(*sc->fifo));
        memset(rc->rec_area, 0, ERDMA_FIFO_DEPTH * sizeof(*rc->rec_area));
        memset(rc->ring, 0, (size_t)rc->c.nqps * ERDMA_RQ_DEPTH * sizeof(*rc->ring));
    } else {
        pair_close();
    }
    return 0;
}
