/* Owns QP creation, state transitions and send-queue accounting. */
#include "qp.h"
#include "log.h"
#include "params.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* A communicator's traffic class that is neither undefined nor a traffic class: said once. */
static void warn_bad_traffic_class(int traffic_class) {
    static int warned;
    if (__atomic_exchange_n(&warned, 1, __ATOMIC_ACQ_REL)) return;
    WARN("the communicator's traffic class %d (NCCL config trafficClass) is outside 0..255; "
         "its connections use NCCL_IB_TC's, else 0",
         traffic_class);
}

void qp_params_from_env(struct qp_params *p, int traffic_class) {
    bool have_tc = traffic_class >= 0 && traffic_class <= 255;
    if (!have_tc && traffic_class != NCCL_NET_TRAFFIC_CLASS_UNDEF)
        warn_bad_traffic_class(traffic_class);
    /* -1 is unset, as net_ib's defaults: the communicator's, else 0 */
    long env_tc = param_int(P_IB_TC);
    p->tc = env_tc >= 0 ? (int)env_tc : have_tc ? traffic_class : 0;
    p->sl = param_int(P_IB_SL) >= 0 ? (int)param_int(P_IB_SL) : 0;
    p->timeout = (int)param_int(P_IB_TIMEOUT);
    p->retry_cnt = (int)param_int(P_IB_RETRY_CNT);
}

uint64_t qp_retry_window_ns(void) {
    return (4096ull << param_int(P_IB_TIMEOUT)) * (uint64_t)(param_int(P_IB_RETRY_CNT) + 1);
}

void qp_init_attr(struct ibv_qp_init_attr *a, struct ibv_cq *cq, int sq_depth, int rq_depth,
                  int max_inline) {
    memset(a, 0, sizeof(*a));
    a->send_cq = cq;
    a->recv_cq = cq;
    a->qp_type = IBV_QPT_RC;
    a->cap.max_send_wr = sq_depth;
    a->cap.max_recv_wr = rq_depth;
    a->cap.max_send_sge = 1;
    a->cap.max_recv_sge = 1; /* eRDMA: one receive SGE */
    a->cap.max_inline_data = max_inline;
}

void qp_params_for_receiver(struct qp_params *p, bool peer_set, int peer_tc, int peer_sl) {
    qp_params_from_env(p, -1);
    if (peer_set) {
        p->tc = peer_tc;
        p->sl = peer_sl;
    }
    if (param_int(P_IB_FIFO_TC) >= 0) p->tc = (int)param_int(P_IB_FIFO_TC);
}

int qp_create_stepped(struct qp_ctx *q, struct ibv_cq *cq, int sq_depth, int rq_depth,
                      qp_maker make, void *arg) {
    /* eRDMA inlines 96 bytes; some soft devices less: step down rather than fail */
    static const int inline_try[] = {ERDMA_MAX_INLINE, 64, 0};
    struct ibv_qp_init_attr a;
    int err = 0;
    for (size_t i = 0; i < sizeof(inline_try) / sizeof(inline_try[0]); i++) {
        qp_init_attr(&a, cq, sq_depth, rq_depth, inline_try[i]);
        errno = 0; /* a provider may fail without setting it (siw: see device.c) */
        struct ibv_qp *qp = make(arg, &a);
        if (!qp) {
            err = errno ? errno : EIO; /* not the stale errno of the first, inline, attempt */
            continue;
        }
        q->qp = qp;
        q->sq_depth = (int)a.cap.max_send_wr < sq_depth ? (int)a.cap.max_send_wr : sq_depth;
        /* the accounting ring holds one entry per WR at worst (comm.h) */
        if (q->sq_depth > ERDMA_SQ_RING) q->sq_depth = ERDMA_SQ_RING;
        q->max_inline = (int)a.cap.max_inline_data > ERDMA_MAX_INLINE ? ERDMA_MAX_INLINE
                                                                      : (int)a.cap.max_inline_data;
        return 0;
    }
    return -err;
}

static struct ibv_qp *make_verbs_qp(void *pd, struct ibv_qp_init_attr *a) {
    return vb.create_qp(pd, a);
}

int qp_create(struct erdma_device *dev, struct ibv_cq *cq, int sq_depth, int rq_depth, int access,
              struct qp_ctx *q) {
    memset(q, 0, sizeof(*q));
    int rc = qp_create_stepped(q, cq, sq_depth, rq_depth, make_verbs_qp, dev->pd);
    if (rc) {
        WARN("%s: ibv_create_qp(RC, send %d, recv %d) failed: %s", dev->name, sq_depth, rq_depth,
             strerror(-rc));
        return rc;
    }

    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)dev->port,
        .qp_access_flags = (unsigned)access,
    };
    rc = verbs_errno(vb.modify_qp(
        q->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    if (rc) {
        WARN("%s: QP %u to INIT failed: %s", dev->name, q->qp->qp_num, strerror(-rc));
        vb.destroy_qp(q->qp);
        q->qp = NULL;
        return rc;
    }
    return 0;
}

int qp_connect_gid(struct erdma_device *dev, struct qp_ctx *q, uint32_t remote_qpn,
                   const uint8_t remote_gid[16], enum ibv_mtu mtu, const struct qp_params *p,
                   const char *peer) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtu;
    attr.dest_qp_num = remote_qpn;
    attr.rq_psn = 0;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.is_global = 1;
    memcpy(attr.ah_attr.grh.dgid.raw, remote_gid, 16);
    attr.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
    attr.ah_attr.grh.hop_limit = 255;
    attr.ah_attr.grh.traffic_class = (uint8_t)p->tc;
    attr.ah_attr.sl = (uint8_t)p->sl;
    attr.ah_attr.port_num = (uint8_t)dev->port;
    int rc = verbs_errno(vb.modify_qp(q->qp, &attr,
                                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                          IBV_QP_MIN_RNR_TIMER));
    const char *down = rc ? device_port_unusable(dev) : NULL;
    if (down) { /* the link flapped in the middle of the handshake */
        WARN("%s: QP %u to RTR towards %s failed: %s (%s): check the link of %s; connections "
             "made once it is back work",
             dev->name, q->qp->qp_num, peer, strerror(-rc), down, device_netdev_name(dev));
        return rc;
    }
    if (rc) {
        WARN("%s: QP %u to RTR towards %s (remote QP %u, GID index %d) failed: %s. A wrong "
             "NCCL_IB_GID_INDEX is the usual cause; eRDMA compat mode wants 1.",
             dev->name, q->qp->qp_num, peer, remote_qpn, dev->gid_index, strerror(-rc));
        return rc;
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = (uint8_t)p->timeout;
    attr.retry_cnt = (uint8_t)p->retry_cnt;
    attr.rnr_retry = 7;
    attr.sq_psn = 0;
    attr.max_rd_atomic = 1;
    rc = verbs_errno(vb.modify_qp(q->qp, &attr,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
    if (rc) {
        WARN("%s: QP %u to RTS failed: %s", dev->name, q->qp->qp_num, strerror(-rc));
        return rc;
    }
    TRACE(NCCL_NET,
          "%s: QP %u -> %s (QP %u): mtu %d, tc %d, sl %d, timeout %d (%.3f s per try), retry %d",
          dev->name, q->qp->qp_num, peer, remote_qpn, 128 << mtu, p->tc, p->sl, p->timeout,
          4.096e-6 * (double)(1ull << p->timeout), p->retry_cnt);
    return 0;
}

void qp_destroy(struct qp_ctx *q) {
    if (q->cm_id) {
        if (q->qp) vb.cm_destroy_qp(q->cm_id);
        vb.cm_destroy_id(q->cm_id);
    } else if (q->qp) {
        vb.destroy_qp(q->qp);
    }
    q->qp = NULL;
    q->cm_id = NULL;
}
