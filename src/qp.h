/*
 * RC queue pairs: creation within eRDMA's limits (1 receive SGE, 96-byte
 * inline, send queue <= 8192, no SRQ) and the INIT->RTR->RTS walk for GID
 * addressing. rdma_cm-managed QPs are created in cm.c with the same caps.
 */
#ifndef ERDMA_QP_H
#define ERDMA_QP_H

#include "comm.h"

struct qp_params {
    int tc; /* traffic class */
    int sl;
    int timeout;
    int retry_cnt;
};

/* The sender's QPs, in net_ib's order: NCCL_IB_TC when set, else the communicator's traffic
 * class (NCCL_NET_TRAFFIC_CLASS_UNDEF = none; another value outside 0..255 is WARNed once), else 0.
 * NCCL_IB_TC and NCCL_IB_SL of -1 are unset, as net_ib's defaults. */
void qp_params_from_env(struct qp_params *p, int traffic_class);
/* The receiver's QPs (clear-to-sends, ACKs): NCCL_IB_FIFO_TC when set, else the traffic class
 * and service level the sender announced (peer_set), else as qp_params_from_env. */
void qp_params_for_receiver(struct qp_params *p, bool peer_set, int peer_tc, int peer_sl);
void qp_init_attr(struct ibv_qp_init_attr *a, struct ibv_cq *cq, int sq_depth, int rq_depth,
                  int max_inline);
/* Makes one QP from attr (ibv_create_qp, or rdma_create_qp on a cm_id): NULL + errno on failure. */
typedef struct ibv_qp *(*qp_maker)(void *arg, struct ibv_qp_init_attr *a);
/* Creates an RC QP with eRDMA's 96-byte inline, stepping down for devices that allow less,
 * and records its send depth and inline limit in q. 0 or -errno (not logged). */
int qp_create_stepped(struct qp_ctx *q, struct ibv_cq *cq, int sq_depth, int rq_depth,
                      qp_maker make, void *arg);
/* What a QP lets the other end do to our memory, as net_ib (connect.cc): a connection's QPs
 * take RDMA writes only (payloads, clear-to-sends), so a peer that learnt or guessed a key
 * reads nothing; the flush's loopback QP reads our own memory. (rdma_cm sets iWARP QPs' own.) */
#define QP_ACCESS_PEER  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define QP_ACCESS_FLUSH (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)
/* Create an RC QP with those access flags and move it to INIT (GID mode). */
int qp_create(struct erdma_device *dev, struct ibv_cq *cq, int sq_depth, int rq_depth, int access,
              struct qp_ctx *q);
/* RTR + RTS towards (remote_qpn, remote_gid). */
int qp_connect_gid(struct erdma_device *dev, struct qp_ctx *q, uint32_t remote_qpn,
                   const uint8_t remote_gid[16], enum ibv_mtu mtu, const struct qp_params *p,
                   const char *peer);
void qp_destroy(struct qp_ctx *q);
/* How long a QP keeps retrying an unacknowledged send before it fails it (IB's transport
 * timer, 4.096 us * 2^NCCL_IB_TIMEOUT, tried NCCL_IB_RETRY_CNT + 1 times): ~34 s by default. */
uint64_t qp_retry_window_ns(void);
/* Send-queue accounting: room for n more WRs? Record a signaled batch; retire one. */
static inline int qp_sq_room(const struct qp_ctx *q) {
    return q->sq_depth - q->sq_used;
}
/* nwr WRs were posted; the last one signaled or not. Inline and without a branch, as
 * qp_sq_retire: every message pays them. The entry at sig_tail is free, so it is written
 * whether or not it is then kept: the ring outsizes the signaled WRs a QP can have outstanding
 * (one per FIFO slot and QP, a flush per receive, the warm-ups, every 16th clear-to-send of a
 * queue of at most 4 * FIFO_DEPTH). */
static inline void qp_sq_push(struct qp_ctx *q, int nwr, bool signaled) {
    unsigned sig = signaled, total = (unsigned)q->unsignaled + (unsigned)nwr;
    q->sq_used += nwr;
    q->sig_ring[q->sig_tail] = (uint16_t)total;
    q->sig_tail = (q->sig_tail + sig) & (ERDMA_SQ_RING - 1);
    q->unsignaled = (int)(total & (sig - 1));
}
/* A signaled completion: the WRs it and the unsignaled ones before it held are free again
 * (none when no signaled one is outstanding: a completion we cannot account for). */
static inline void qp_sq_retire(struct qp_ctx *q) {
    unsigned some = q->sig_head != q->sig_tail;
    q->sq_used -= q->sig_ring[q->sig_head] * (int)some;
    q->sig_head = (q->sig_head + some) & (ERDMA_SQ_RING - 1);
}

#endif
