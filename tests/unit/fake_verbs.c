/*
 * The fake verbs provider (see fake_verbs.h). One global lock: the async thread and
 * the test thread may both be inside. Objects live in small tables so that a test
 * can count what was never released.
 */
#define _GNU_SOURCE
#include "fake_verbs.h"
#include "conn.h"
#include "device.h"
#include "net.h"
#include "params.h"
#include "sysfs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAKE_MAX_MRS    4096
#define FAKE_MAX_QPS    1024
#define FAKE_RQ_MAX     1024
#define FAKE_ASYNC_MAX  16
#define FAKE_MAX_INLINE 96

struct fake_dev {
    struct ibv_device ibdev;
    struct ibv_device_attr attr;
    struct ibv_port_attr port;
    union ibv_gid gids[2];
    bool dmabuf;
    bool read_sink_rw;
};

struct fake_ctx {
    struct ibv_context ctx;
    int dev;
    int pipe_wr;
    struct ibv_async_event events[FAKE_ASYNC_MAX];
    int nevents;
};

struct fake_mr {
    struct ibv_mr mr;
    int access;
};

struct fake_cq {
    struct ibv_cq cq;
    struct ibv_wc *ring; /* allocated: alloc entries, grown on demand up to cap */
    uint32_t *release;   /* per entry: send-queue position it frees (send completions) */
    struct fake_qp **owner;
    int cap, alloc, head, count;
    bool overflowed;
    bool held; /* fake_cq_hold: completions wait, as when the peer's ACKs are late */
};

struct fake_recv {
    uint64_t wr_id;
    uint64_t addr;
    uint32_t len, lkey;
    int nsge;
};

struct fake_qp {
    struct ibv_qp qp;
    struct ibv_qp_cap cap;
    uint32_t dest_qpn;
    int access; /* qp_access_flags: what a peer's RDMA may do to us through this QP */
    bool error;
    uint32_t posted, released; /* send-queue positions: WRs posted / freed by polled CQEs */
    struct fake_recv *rq;      /* cap.max_recv_wr entries */
    int rq_head, rq_count;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_dev devs[FAKE_MAX_DEVICES];
static int ndevs;
static struct fake_mr *mrs[FAKE_MAX_MRS];
static struct fake_qp *qps[FAKE_MAX_QPS];
static int mrs_hi, qps_hi; /* one past the highest slot ever used: loops stop there */
static uint32_t next_key = 0x1000, next_qpn = 0x11;
static int live_ctx, live_pd, live_mr, live_cq, live_qp;
static int post_errors, fail_next_post, fail_next_reg;
static enum ibv_wc_status reads_fail;
/* GPU memory as the CPU sees it (fake_set_gpu_memory): the NIC reads it, an inline copy,
 * which the CPU makes at post time, would fault */
static uintptr_t gpu_lo, gpu_hi;
static uintptr_t watch_lo, watch_hi; /* fake_watch_inline */
static int inline_watched;

/* ---------------------------------------------------------------- devices */
static struct ibv_device **f_get_device_list(int *num) {
    struct ibv_device **list = calloc(FAKE_MAX_DEVICES + 1, sizeof(*list));
    for (int i = 0; i < ndevs; i++)
        list[i] = &devs[i].ibdev;
    if (num) *num = ndevs;
    return list;
}

static void f_free_device_list(struct ibv_device **list) {
    free(list);
}

static const char *f_get_device_name(struct ibv_device *d) {
    return d->name;
}

static struct ibv_context *f_open_device(struct ibv_device *d) {
    struct fake_ctx *c = calloc(1, sizeof(*c));
    int p[2];
    if (!c || pipe2(p, O_CLOEXEC)) {
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    c->ctx.device = d;
    c->ctx.async_fd = p[0];
    c->pipe_wr = p[1];
    c->dev = (int)((struct fake_dev *)((char *)d - offsetof(struct fake_dev, ibdev)) - devs);
    pthread_mutex_lock(&lock);
    live_ctx++;
    pthread_mutex_unlock(&lock);
    return &c->ctx;
}

/* fake_call_gate: the next reg_mr of gate_addr, or close_device of the context at gate_addr,
 * waits until the gate opens, as a large registration (pinning gigabytes) holds its caller,
 * or as a test holds a finalize inside the device's release. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static const void *gate_addr;
static bool gate_closed, gate_waiting;

void fake_call_gate(const void *addr) {
    pthread_mutex_lock(&gate_lock);
    gate_addr = addr;
    gate_closed = addr != NULL;
    gate_waiting = false;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

bool fake_call_gate_waiting(void) {
    pthread_mutex_lock(&gate_lock);
    bool w = gate_waiting;
    pthread_mutex_unlock(&gate_lock);
    return w;
}

static void gate_pass(const void *addr) {
    pthread_mutex_lock(&gate_lock);
    if (gate_closed && addr == gate_addr) {
        gate_addr = NULL; /* the next call with it passes */
        gate_waiting = true;
        while (gate_closed)
            pthread_cond_wait(&gate_cond, &gate_lock);
        gate_waiting = false;
    }
    pthread_mutex_unlock(&gate_lock);
}

static int f_close_device(struct ibv_context *ctx) {
    gate_pass(ctx);
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    close(c->ctx.async_fd);
    if (c->pipe_wr >= 0) close(c->pipe_wr);
    free(c);
    pthread_mutex_lock(&lock);
    live_ctx--;
    pthread_mutex_unlock(&lock);
    return 0;
}

static struct fake_dev *dev_of(struct ibv_context *ctx) {
    return &devs[((struct fake_ctx *)ctx)->dev];
}

static int f_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
    *a = dev_of(ctx)->attr;
    return 0;
}

static int f_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a) {
    if (port != 1) return EINVAL;
    *a = dev_of(ctx)->port;
    return 0;
}

static int f_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
    if (port != 1 || index < 0 || index >= 2) {
        errno = EINVAL;
        return -1;
    }
    *gid = dev_of(ctx)->gids[index];
    return 0;
}

static struct ibv_pd *f_alloc_pd(struct ibv_context *ctx) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = ctx;
    pthread_mutex_lock(&lock);
    live_pd++;
    pthread_mutex_unlock(&lock);
    return pd;
}

static int f_dealloc_pd(struct ibv_pd *pd) {
    free(pd);
    pthread_mutex_lock(&lock);
    live_pd--;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* ---------------------------------------------------------------- memory */
static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
    gate_pass(addr);
    if (fail_next_reg) {
        errno = fail_next_reg;
        fail_next_reg = 0;
        return NULL;
    }
    struct fake_mr *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    pthread_mutex_lock(&lock);
    int i;
    for (i = 0; i < FAKE_MAX_MRS && mrs[i]; i++)
        ;
    if (i == FAKE_MAX_MRS) {
        pthread_mutex_unlock(&lock);
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = m->mr.rkey = next_key;
    next_key += 0x101;
    m->access = access;
    mrs[i] = m;
    if (i >= mrs_hi) mrs_hi = i + 1;
    live_mr++;
    pthread_mutex_unlock(&lock);
    return &m->mr;
}

/* The dma-buf stands for the memory at iova, so the copies of post_send reach it. */
static struct ibv_mr *f_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                      int fd, int access) {
    (void)offset;
    if (!dev_of(pd->context)->dmabuf) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) { /* not an open descriptor */
        errno = EBADF;
        return NULL;
    }
    return f_reg_mr(pd, (void *)(uintptr_t)iova, len, access);
}

static int f_dereg_mr(struct ibv_mr *mr) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < mrs_hi; i++)
        if (mrs[i] == (struct fake_mr *)mr) mrs[i] = NULL;
    live_mr--;
    pthread_mutex_unlock(&lock);
    free(mr);
    return 0;
}

/* The region of pd that key names and that covers [addr, addr + len) with access. */
static struct fake_mr *mr_find(struct ibv_pd *pd, uint32_t key, uint64_t addr, uint64_t len,
                               int access) {
    for (int i = 0; i < mrs_hi; i++) {
        struct fake_mr *m = mrs[i];
        if (!m || m->mr.lkey != key || m->mr.pd != pd) continue;
        uint64_t lo = (uintptr_t)m->mr.addr, hi = lo + m->mr.length;
        if (addr < lo || addr > hi || len > hi - addr) return NULL;
        if ((m->access & access) != access) return NULL;
        return m;
    }
    return NULL;
}

/* ---------------------------------------------------------------- CQs */
static struct ibv_cq *f_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                  struct ibv_comp_channel *ch, int vector) {
    struct fake_cq *c = calloc(1, sizeof(*c));
    if (!c || cqe < 1) {
        free(c);
        errno = EINVAL;
        return NULL;
    }
    c->cap = cqe;
    c->cq.context = ctx;
    c->cq.cqe = cqe;
    pthread_mutex_lock(&lock);
    live_cq++;
    pthread_mutex_unlock(&lock);
    return &c->cq;
}

static int f_destroy_cq(struct ibv_cq *cq) {
    struct fake_cq *c = (struct fake_cq *)cq;
    free(c->ring);
    free(c->release);
    free(c->owner);
    free(c);
    pthread_mutex_lock(&lock);
    live_cq--;
    pthread_mutex_unlock(&lock);
    return 0;
}

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc, struct fake_qp *sq_owner,
                    uint32_t release) {
    struct fake_cq *c = (struct fake_cq *)cq;
    if (c->count == c->cap) {
        c->overflowed = true; /* a NIC raises IBV_EVENT_CQ_ERR and the QPs die */
        return;
    }
    if (c->count == c->alloc) { /* grow, unrolling the ring to start at 0 */
        int n = c->alloc ? 2 * c->alloc : 64;
        if (n > c->cap) n = c->cap;
        struct ibv_wc *ring = calloc((size_t)n, sizeof(*ring));
        uint32_t *rel = calloc((size_t)n, sizeof(*rel));
        struct fake_qp **owner = calloc((size_t)n, sizeof(*owner));
        for (int i = 0; i < c->count; i++) {
            int from = (c->head + i) % c->alloc;
            ring[i] = c->ring[from];
            rel[i] = c->release[from];
            owner[i] = c->owner[from];
        }
        free(c->ring);
        free(c->release);
        free(c->owner);
        c->ring = ring;
        c->release = rel;
        c->owner = owner;
        c->alloc = n;
        c->head = 0;
    }
    int at = (c->head + c->count) % c->alloc;
    c->ring[at] = *wc;
    c->owner[at] = sq_owner;
    c->release[at] = release;
    c->count++;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    struct fake_cq *c = (struct fake_cq *)cq;
    pthread_mutex_lock(&lock);
    if (c->overflowed) {
        pthread_mutex_unlock(&lock);
        return -EIO;
    }
    int got = 0;
    while (got < n && c->count > 0 && !c->held) {
        wc[got++] = c->ring[c->head];
        if (c->owner[c->head]) c->owner[c->head]->released = c->release[c->head];
        c->head = (c->head + 1) % c->alloc;
        c->count--;
    }
    pthread_mutex_unlock(&lock);
    return got;
}

/* ---------------------------------------------------------------- QPs */
static struct fake_qp *qp_by_num(uint32_t qpn) {
    for (int i = 0; i < qps_hi; i++)
        if (qps[i] && qps[i]->qp.qp_num == qpn) return qps[i];
    return NULL;
}

static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    if (a->qp_type != IBV_QPT_RC || a->cap.max_inline_data > FAKE_MAX_INLINE ||
        a->cap.max_recv_wr > FAKE_RQ_MAX || a->cap.max_recv_sge > 1 || !a->send_cq || !a->recv_cq) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_qp *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->rq = calloc(a->cap.max_recv_wr ? a->cap.max_recv_wr : 1, sizeof(*q->rq));
    pthread_mutex_lock(&lock);
    int i;
    for (i = 0; i < FAKE_MAX_QPS && qps[i]; i++)
        ;
    if (i == FAKE_MAX_QPS) {
        pthread_mutex_unlock(&lock);
        free(q->rq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_num = next_qpn++;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.state = IBV_QPS_RESET;
    q->cap = a->cap;
    qps[i] = q;
    if (i >= qps_hi) qps_hi = i + 1;
    live_qp++;
    pthread_mutex_unlock(&lock);
    return &q->qp;
}

static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
    struct fake_qp *q = (struct fake_qp *)qp;
    pthread_mutex_lock(&lock);
    if (mask & IBV_QP_DEST_QPN) q->dest_qpn = attr->dest_qp_num;
    if (mask & IBV_QP_ACCESS_FLAGS) q->access = (int)attr->qp_access_flags;
    if (mask & IBV_QP_STATE) q->qp.state = attr->qp_state;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int f_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                      struct ibv_qp_init_attr *init) {
    memset(attr, 0, sizeof(*attr));
    attr->qp_state = qp->state;
    if (init) memset(init, 0, sizeof(*init));
    return 0;
}

static int f_destroy_qp(struct ibv_qp *qp) {
    pthread_mutex_lock(&lock);
    struct fake_cq *c = (struct fake_cq *)qp->send_cq; /* its completions outlive it */
    for (int i = 0; i < c->count; i++)
        if (c->owner[(c->head + i) % c->alloc] == (struct fake_qp *)qp)
            c->owner[(c->head + i) % c->alloc] = NULL;
    for (int i = 0; i < qps_hi; i++)
        if (qps[i] == (struct fake_qp *)qp) qps[i] = NULL;
    live_qp--;
    pthread_mutex_unlock(&lock);
    free(((struct fake_qp *)qp)->rq);
    free(qp);
    return 0;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    struct fake_qp *q = (struct fake_qp *)qp;
    pthread_mutex_lock(&lock);
    for (; wr; wr = wr->next) {
        if (q->rq_count >= (int)q->cap.max_recv_wr || wr->num_sge > 1 || wr->num_sge < 0) {
            post_errors++;
            *bad = wr;
            pthread_mutex_unlock(&lock);
            return ENOMEM;
        }
        struct fake_recv *r = &q->rq[(q->rq_head + q->rq_count++) % (int)q->cap.max_recv_wr];
        *r = (struct fake_recv){.wr_id = wr->wr_id, .nsge = wr->num_sge};
        if (wr->num_sge) {
            r->addr = wr->sg_list[0].addr;
            r->len = wr->sg_list[0].length;
            r->lkey = wr->sg_list[0].lkey;
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

static bool rq_pop(struct fake_qp *q, struct fake_recv *out) {
    if (!q->rq_count) return false;
    *out = q->rq[q->rq_head];
    q->rq_head = (q->rq_head + 1) % (int)q->cap.max_recv_wr;
    q->rq_count--;
    return true;
}

/* Places len bytes into a posted receive: 0 or a completion status for the receiver. */
static enum ibv_wc_status recv_place(struct fake_qp *q, const struct fake_recv *r, const void *data,
                                     uint32_t len) {
    if (len == 0) return IBV_WC_SUCCESS;
    if (len > r->len || !r->nsge) return IBV_WC_LOC_LEN_ERR;
    if (!mr_find(q->qp.pd, r->lkey, r->addr, len, IBV_ACCESS_LOCAL_WRITE))
        return IBV_WC_LOC_PROT_ERR;
    memmove((void *)(uintptr_t)r->addr, data, len);
    return IBV_WC_SUCCESS;
}

static void recv_complete(struct fake_qp *q, const struct fake_recv *r, enum ibv_wc_opcode op,
                          enum ibv_wc_status st, uint32_t imm_net, bool with_imm, uint32_t len) {
    struct ibv_wc wc = {.wr_id = r->wr_id,
                        .status = st,
                        .opcode = op,
                        .byte_len = len,
                        .imm_data = imm_net,
                        .qp_num = q->qp.qp_num,
                        .wc_flags = with_imm ? IBV_WC_WITH_IMM : 0};
    if (st != IBV_WC_SUCCESS) q->error = true;
    cq_push(q->qp.recv_cq, &wc, NULL, 0);
}

/* Executes one send WR; returns the sender's completion status. */
static enum ibv_wc_status exec_send_wr(struct fake_qp *q, struct ibv_send_wr *wr) {
    struct fake_qp *peer = qp_by_num(q->dest_qpn);
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; i++)
        len += wr->sg_list[i].length;
    bool is_read = wr->opcode == IBV_WR_RDMA_READ;
    if (is_read && reads_fail != IBV_WC_SUCCESS) return reads_fail;
    /* gather (inline data was copied at post time: lkeys are ignored) */
    uint8_t *buf = malloc(len ? len : 1);
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge; i++) {
        const struct ibv_sge *s = &wr->sg_list[i];
        if (!(wr->send_flags & IBV_SEND_INLINE) || is_read) {
            int sink = IBV_ACCESS_LOCAL_WRITE;
            if (dev_of(q->qp.context)->read_sink_rw) sink |= IBV_ACCESS_REMOTE_WRITE;
            if (s->length && !mr_find(q->qp.pd, s->lkey, s->addr, s->length, is_read ? sink : 0)) {
                free(buf);
                return IBV_WC_LOC_PROT_ERR;
            }
        }
        if (!is_read) memcpy(buf + off, (void *)(uintptr_t)s->addr, s->length);
        off += s->length;
    }
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    if (!peer || peer->qp.state < IBV_QPS_RTR || peer->dest_qpn != q->qp.qp_num) {
        st = IBV_WC_RETRY_EXC_ERR; /* nobody answers */
        goto out;
    }
    if (peer->error) {
        st = IBV_WC_REM_OP_ERR;
        goto out;
    }
    /* the responder's QP must allow the access, whatever the key (a NIC checks both) */
    int need = wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ
               : wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM
                   ? IBV_ACCESS_REMOTE_WRITE
                   : 0;
    if ((peer->access & need) != need) {
        st = IBV_WC_REM_ACCESS_ERR;
        peer->error = true;
        goto out;
    }
    switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
        if (len) {
            struct fake_mr *m = mr_find(peer->qp.pd, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len,
                                        IBV_ACCESS_REMOTE_WRITE);
            if (!m) {
                st = IBV_WC_REM_ACCESS_ERR;
                peer->error = true;
                goto out;
            }
            memmove((void *)(uintptr_t)wr->wr.rdma.remote_addr, buf, len);
        }
        if (wr->opcode == IBV_WR_RDMA_WRITE) break;
        struct fake_recv r;
        if (!rq_pop(peer, &r)) {
            st = IBV_WC_RNR_RETRY_EXC_ERR;
            goto out;
        }
        recv_complete(peer, &r, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS, wr->imm_data, true,
                      (uint32_t)len);
        break;
    }
    case IBV_WR_SEND: {
        struct fake_recv r;
        if (!rq_pop(peer, &r)) {
            st = IBV_WC_RNR_RETRY_EXC_ERR;
            goto out;
        }
        enum ibv_wc_status rs = recv_place(peer, &r, buf, (uint32_t)len);
        recv_complete(peer, &r, IBV_WC_RECV, rs, 0, false, (uint32_t)len);
        if (rs != IBV_WC_SUCCESS) st = IBV_WC_REM_INV_REQ_ERR;
        break;
    }
    case IBV_WR_RDMA_READ: {
        struct fake_mr *m = mr_find(peer->qp.pd, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len,
                                    IBV_ACCESS_REMOTE_READ);
        if (len && !m) {
            st = IBV_WC_REM_ACCESS_ERR;
            goto out;
        }
        off = 0;
        for (int i = 0; i < wr->num_sge; i++) {
            const struct ibv_sge *s = &wr->sg_list[i];
            memmove((void *)(uintptr_t)s->addr,
                    (const uint8_t *)(uintptr_t)wr->wr.rdma.remote_addr + off, s->length);
            off += s->length;
        }
        break;
    }
    default:
        st = IBV_WC_LOC_QP_OP_ERR;
    }
out:
    free(buf);
    return st;
}

static enum ibv_wc_opcode wc_opcode_of(enum ibv_wr_opcode op) {
    switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    default:
        return IBV_WC_SEND;
    }
}

static bool sges_touch(const struct ibv_send_wr *w, uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < w->num_sge; i++) {
        uintptr_t a = (uintptr_t)w->sg_list[i].addr;
        if (w->sg_list[i].length && a < hi && a + w->sg_list[i].length > lo) return true;
    }
    return false;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    struct fake_qp *q = (struct fake_qp *)qp;
    pthread_mutex_lock(&lock);
    if (fail_next_post) {
        int err = fail_next_post;
        fail_next_post = 0;
        *bad = wr;
        pthread_mutex_unlock(&lock);
        return err;
    }
    int nwr = 0;
    for (struct ibv_send_wr *w = wr; w; w = w->next) {
        uint64_t len = 0;
        for (int i = 0; i < w->num_sge; i++)
            len += w->sg_list[i].length;
        /* what a provider refuses at post time */
        if (q->qp.state != IBV_QPS_RTS || w->num_sge < 0 ||
            w->num_sge > (int)q->cap.max_send_sge + (w->send_flags & IBV_SEND_INLINE ? 1 : 0) ||
            ((w->send_flags & IBV_SEND_INLINE) && len > q->cap.max_inline_data) ||
            ((w->send_flags & IBV_SEND_INLINE) && sges_touch(w, gpu_lo, gpu_hi)) ||
            q->posted - q->released + (uint32_t)nwr + 1 > q->cap.max_send_wr) {
            post_errors++;
            *bad = w;
            pthread_mutex_unlock(&lock);
            return q->qp.state != IBV_QPS_RTS ? EINVAL : ENOMEM;
        }
        nwr++;
    }
    for (; wr; wr = wr->next) {
        if ((wr->send_flags & IBV_SEND_INLINE) && sges_touch(wr, watch_lo, watch_hi))
            inline_watched++;
        q->posted++;
        enum ibv_wc_status st = q->error ? IBV_WC_WR_FLUSH_ERR : exec_send_wr(q, wr);
        if (st != IBV_WC_SUCCESS) q->error = true;
        if (st != IBV_WC_SUCCESS || (wr->send_flags & IBV_SEND_SIGNALED)) {
            struct ibv_wc wc = {.wr_id = wr->wr_id,
                                .status = st,
                                .opcode = wc_opcode_of(wr->opcode),
                                .qp_num = q->qp.qp_num};
            cq_push(q->qp.send_cq, &wc, q, q->posted);
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

/* ---------------------------------------------------------------- async events */
static int f_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev) {
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    char b;
    pthread_mutex_lock(&lock);
    if (!c->nevents) {
        pthread_mutex_unlock(&lock);
        errno = EAGAIN;
        return -1;
    }
    *ev = c->events[0];
    memmove(c->events, c->events + 1, sizeof(c->events[0]) * (size_t)--c->nevents);
    pthread_mutex_unlock(&lock);
    (void)!read(c->ctx.async_fd, &b, 1);
    return 0;
}

static unsigned async_acks; /* events the plugin has handled: it acks each after handling it */

static void f_ack_async_event(struct ibv_async_event *ev) {
    __atomic_add_fetch(&async_acks, 1, __ATOMIC_ACQ_REL);
}

static const char *f_wc_status_str(enum ibv_wc_status s) {
    return s == IBV_WC_SUCCESS ? "success" : "fake error status";
}

static const char *f_event_type_str(enum ibv_event_type t) {
    return "fake event";
}

/* ---------------------------------------------------------------- public */

void fake_async_channel_fails(int dev) {
    struct erdma_device *d = device_get(dev);
    if (!d) return;
    struct fake_ctx *c = (struct fake_ctx *)d->ctx;
    close(c->pipe_wr); /* the read end polls as POLLHUP from now on */
    c->pipe_wr = -1;
}

unsigned fake_async_acked(void) {
    return __atomic_load_n(&async_acks, __ATOMIC_ACQUIRE);
}

void fake_async_event(int dev, enum ibv_event_type type, int port) {
    struct erdma_device *d = device_get(dev);
    if (!d) return;
    struct fake_ctx *c = (struct fake_ctx *)d->ctx;
    pthread_mutex_lock(&lock);
    if (c->nevents < FAKE_ASYNC_MAX) {
        struct ibv_async_event *ev = &c->events[c->nevents++];
        memset(ev, 0, sizeof(*ev));
        ev->event_type = type;
        if (type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE ||
            type == IBV_EVENT_LID_CHANGE || type == IBV_EVENT_GID_CHANGE)
            ev->element.port_num = port; /* other events name a QP/CQ: left NULL */
    }
    pthread_mutex_unlock(&lock);
    (void)!write(c->pipe_wr, "e", 1);
}

void fake_verbs_install(int ndev, const struct fake_dev_cfg *cfg) {
    static char names[FAKE_MAX_DEVICES][16];
    memset(devs, 0, sizeof(devs));
    ndevs = ndev < FAKE_MAX_DEVICES ? ndev : FAKE_MAX_DEVICES;
    for (int i = 0; i < ndevs; i++) {
        struct fake_dev *d = &devs[i];
        const struct fake_dev_cfg *c = cfg ? &cfg[i] : NULL;
        snprintf(names[i], sizeof(names[i]), "fake%d", i);
        snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", c && c->name ? c->name : names[i]);
        d->ibdev.node_type = IBV_NODE_CA;
        d->ibdev.transport_type = IBV_TRANSPORT_IB;
        d->attr.node_guid = 0x0200000000000000ull + (uint64_t)i;
        d->attr.phys_port_cnt = 1;
        d->attr.max_qp_wr = c && c->max_qp_wr ? c->max_qp_wr : 16384;
        d->attr.max_cqe = c && c->max_cqe ? c->max_cqe : 1 << 20;
        d->dmabuf = c && c->dmabuf;
        d->read_sink_rw = c && c->read_sink_rw;
        d->port.state = IBV_PORT_ACTIVE;
        d->port.link_layer = IBV_LINK_LAYER_ETHERNET;
        d->port.active_mtu = IBV_MTU_1024;
        d->port.max_msg_sz = c && c->max_msg_sz ? c->max_msg_sz : 1u << 30;
        d->port.gid_tbl_len = 2;
        d->port.active_speed = 32;
        d->port.active_width = 2;
        inet_pton(AF_INET6, "fe80::216:3eff:fe00:1", d->gids[0].raw);
        inet_pton(AF_INET6, "::ffff:127.0.0.1", d->gids[1].raw);
    }
    memset(mrs, 0, sizeof(mrs));
    memset(qps, 0, sizeof(qps));
    mrs_hi = qps_hi = 0;
    live_ctx = live_pd = live_mr = live_cq = live_qp = 0;
    post_errors = fail_next_post = fail_next_reg = inline_watched = 0;
    reads_fail = IBV_WC_SUCCESS;
    gpu_lo = gpu_hi = watch_lo = watch_hi = 0;
    struct verbs_api api = {
        .get_device_list = f_get_device_list,
        .free_device_list = f_free_device_list,
        .get_device_name = f_get_device_name,
        .open_device = f_open_device,
        .close_device = f_close_device,
        .query_device = f_query_device,
        .query_port = f_query_port,
        .query_gid = f_query_gid,
        .alloc_pd = f_alloc_pd,
        .dealloc_pd = f_dealloc_pd,
        .reg_mr = f_reg_mr,
        .reg_dmabuf_mr = f_reg_dmabuf_mr,
        .dereg_mr = f_dereg_mr,
        .create_cq = f_create_cq,
        .destroy_cq = f_destroy_cq,
        .create_qp = f_create_qp,
        .modify_qp = f_modify_qp,
        .query_qp = f_query_qp,
        .destroy_qp = f_destroy_qp,
        .get_async_event = f_get_async_event,
        .ack_async_event = f_ack_async_event,
        .wc_status_str = f_wc_status_str,
        .event_type_str = f_event_type_str,
        .post_send = f_post_send,
        .post_recv = f_post_recv,
        .poll_cq = f_poll_cq,
    };
    verbs_install_fake(&api);
}

int fake_verbs_uninstall(void) {
    verbs_install_fake(NULL);
    for (int i = 0; i < mrs_hi; i++)
        if (mrs[i]) free(mrs[i]), mrs[i] = NULL;
    for (int i = 0; i < qps_hi; i++)
        if (qps[i]) free(qps[i]->rq), free(qps[i]), qps[i] = NULL;
    mrs_hi = qps_hi = 0;
    return live_ctx + live_pd + live_mr + live_cq + live_qp;
}

int fake_env_start(int ndev, const struct fake_dev_cfg *cfg, const char *const *env) {
    for (int id = 0; id < PARAM_COUNT; id++)
        unsetenv(param_name(id));
    for (int i = 0; env && env[i]; i++) {
        char name[128];
        const char *eq = strchr(env[i], '=');
        if (!eq || eq - env[i] >= (long)sizeof(name)) continue;
        memcpy(name, env[i], (size_t)(eq - env[i]));
        name[eq - env[i]] = 0;
        setenv(name, eq + 1, 1);
    }
    params_load();
    sysfs_set_root("/nonexistent-erdma-fake-sysfs");
    fake_verbs_install(ndev, cfg);
    int n = devices_discover();
    /* the fake devices have no netdev in sysfs: give them lo's address, as find_ipv4 would */
    for (int i = 0; i < n; i++) {
        struct erdma_device *d = device_get(i);
        d->ip.sin_family = AF_INET;
        d->ip.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    return n;
}

int fake_env_stop(void) {
    devices_release();
    sysfs_set_root(NULL);
    return fake_verbs_uninstall();
}

int fake_wait_child(int pid, int seconds, int *status) {
    pid_t w = 0;
    for (int i = 0; i < seconds * 100 && !w; i++, usleep(10000))
        w = waitpid(pid, status, WNOHANG);
    if (!w) {
        kill(pid, SIGKILL);
        waitpid(pid, status, 0);
    }
    return w;
}

int fake_pair_connect(int send_dev, int recv_dev, void **send_comm, void **recv_comm) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL;
    *send_comm = *recv_comm = NULL;
    int rc = erdma_listen(recv_dev, handle, &lc);
    if (rc) return rc;
    uint64_t deadline = now_ns() + 10000000000ull;
    while (!rc && (!*send_comm || !*recv_comm) && now_ns() < deadline) {
        if (!*send_comm) rc = erdma_connect(send_dev, -1, handle, send_comm);
        if (!rc && !*recv_comm) rc = erdma_accept(lc, recv_comm);
    }
    if (!rc && (!*send_comm || !*recv_comm)) rc = -ETIMEDOUT;
    erdma_close_listen(lc);
    if (rc) {
        erdma_close_send(*send_comm);
        erdma_close_recv(*recv_comm);
        *send_comm = *recv_comm = NULL;
    }
    return rc;
}

int fake_inject_recv(struct ibv_qp *qp, enum ibv_wc_opcode op, uint32_t imm, const void *data,
                     uint32_t len) {
    struct fake_qp *q = (struct fake_qp *)qp;
    struct fake_recv r;
    pthread_mutex_lock(&lock);
    if (!rq_pop(q, &r)) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    enum ibv_wc_status st = op == IBV_WC_RECV ? recv_place(q, &r, data, len) : IBV_WC_SUCCESS;
    recv_complete(q, &r, op, st, htonl(imm), op == IBV_WC_RECV_RDMA_WITH_IMM, len);
    pthread_mutex_unlock(&lock);
    return 0;
}

void fake_port_set_state(int dev, enum ibv_port_state state) {
    pthread_mutex_lock(&lock);
    devs[dev].port.state = state;
    pthread_mutex_unlock(&lock);
}

void fake_gid_set(int dev, int index, const union ibv_gid *gid) {
    pthread_mutex_lock(&lock);
    devs[dev].gids[index] = *gid;
    pthread_mutex_unlock(&lock);
}

int fake_recv_posted(struct ibv_qp *qp) {
    return ((struct fake_qp *)qp)->rq_count;
}

int fake_cq_pending(struct ibv_cq *cq) {
    return ((struct fake_cq *)cq)->count;
}

void fake_cq_hold(struct ibv_cq *cq, bool hold) {
    pthread_mutex_lock(&lock);
    ((struct fake_cq *)cq)->held = hold;
    pthread_mutex_unlock(&lock);
}

bool fake_cq_overflowed(struct ibv_cq *cq) {
    return ((struct fake_cq *)cq)->overflowed;
}

int fake_live_qps_cqs(void) {
    pthread_mutex_lock(&lock);
    int n = live_qp + live_cq;
    pthread_mutex_unlock(&lock);
    return n;
}

int fake_post_errors(void) {
    return post_errors;
}

void fake_set_gpu_memory(const void *addr, size_t len) {
    pthread_mutex_lock(&lock);
    gpu_lo = (uintptr_t)addr;
    gpu_hi = (uintptr_t)addr + len;
    pthread_mutex_unlock(&lock);
}

void fake_watch_inline(const void *addr, size_t len) {
    pthread_mutex_lock(&lock);
    watch_lo = (uintptr_t)addr;
    watch_hi = (uintptr_t)addr + len;
    inline_watched = 0;
    pthread_mutex_unlock(&lock);
}

int fake_inline_watched(void) {
    return inline_watched;
}

void fake_fail_reads(enum ibv_wc_status st) {
    pthread_mutex_lock(&lock);
    reads_fail = st;
    pthread_mutex_unlock(&lock);
}

void fake_fail_next_reg(int err) {
    fail_next_reg = err;
}

void fake_fail_next_post(int err) {
    fail_next_post = err;
}
