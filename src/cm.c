/*
 * Owns the rdma_cm path: eRDMA's standard (iWARP) mode connects QPs only
 * through rdma_cm (iw_cm/MPA over TCP), so GID exchange cannot work there.
 * The out-of-band TCP handshake in conn.c still swaps the control-region keys;
 * this file only wires each QP with a CM connect carrying a private-data
 * record (listen nonce + QP index) that the listener checks before accepting.
 * Event channels are non-blocking, so every step fits NCCL's retry loop.
 */
#include "conn.h"
#include "log.h"
#include "oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#define CM_RESOLVE_MS   5000
#define CM_PORT_RETRIES 16
/* iw_cm holds no more pending requests than the listener's backlog: with 1, a request queued
 * ahead of our own loopback's would crowd it out; a few slots let strangers be rejected */
#define FLUSH_BACKLOG 8

static int cm_channel_open(struct rdma_event_channel **out) {
    struct rdma_event_channel *ch = vb.cm_create_event_channel();
    if (!ch) return errno ? -errno : -ENOMEM;
    if (fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK)) {
        int err = -errno;
        vb.cm_destroy_event_channel(ch);
        return err;
    }
    *out = ch;
    return 0;
}

/* 1 with an event, 0 when none is pending, -errno on failure. */
static int cm_next_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev) {
    if (vb.cm_get_cm_event(ch, ev) == 0) return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -errno;
}

static int cm_fail(const struct erdma_device *dev, const char *peer, struct rdma_cm_event *ev,
                   const char *doing) {
    int status = ev->status;
    enum rdma_cm_event_type type = ev->event;
    WARN("%s: rdma_cm %s with %s failed: event %s, status %d (%s). Check that the peer is "
         "alive, that %s is reachable over the eRDMA interface, and that both nodes run eRDMA "
         "in the same mode.",
         dev->name, doing, peer, vb.cm_event_str(type), status,
         status < 0 ? strerror(-status) : "see the peer's log", peer);
    switch (type) {
    case RDMA_CM_EVENT_REJECTED:
        return -ECONNREFUSED;
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
        return -EHOSTUNREACH;
    default:
        return -ECONNABORTED;
    }
}

/* rdma_connect / rdma_accept: siw sends its MPA exchange inside them (verbs.h). */
static int cm_connect_quiet(const struct erdma_device *dev, struct rdma_cm_id *id,
                            struct rdma_conn_param *param, bool accept) {
    struct quiet_pipe q;
    quiet_pipe_begin(&q, dev->sends_in_syscall);
    int ret = accept ? vb.cm_accept(id, param) : vb.cm_connect(id, param);
    quiet_pipe_end(&q);
    return ret;
}

struct cm_qp_maker {
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
};

static struct ibv_qp *make_cm_qp(void *arg, struct ibv_qp_init_attr *a) {
    struct cm_qp_maker *m = arg;
    return vb.cm_create_qp(m->id, m->pd, a) == 0 ? m->id->qp : NULL;
}

/* A QP on an rdma_cm id, with the same caps as GID mode's (qp_create_stepped). */
static int cm_create_qp(struct rdma_cm_id *id, struct conn *c, bool sender, struct qp_ctx *q) {
    struct erdma_device *dev = c->base.dev;
    struct cm_qp_maker m = {.id = id, .pd = dev->pd};
    int err = qp_create_stepped(q, c->cq, conn_sq_depth(dev, sender), sender ? 1 : ERDMA_RQ_DEPTH,
                                make_cm_qp, &m);
    if (err) {
        WARN("%s: rdma_create_qp failed: %s", dev->name, strerror(-err));
        return err;
    }
    q->cm_id = id;
    return 0;
}

static void conn_param(struct rdma_conn_param *p, const struct wire_cm_private *priv) {
    memset(p, 0, sizeof(*p));
    p->private_data = priv;
    p->private_data_len = priv ? sizeof(*priv) : 0;
    p->responder_resources = 1;
    p->initiator_depth = 1;
    p->retry_count = 7;
    p->rnr_retry_count = 7;
}

/* ------------------------------------------------------------ listener */
/* A listening id on addr's address, at a port rdma_cm picks: 0 or -errno (*id NULL). On
 * iWARP, rdma_cm picks the port without asking TCP, and the iWARP device then binds a
 * kernel socket to it; a port still held by a TCP socket (TIME-WAIT) fails with EADDRINUSE.
 * Another random port is the cure. */
static int cm_listen_any_port(struct rdma_event_channel *ch, void *ctx,
                              const struct sockaddr_in *addr, int backlog, struct rdma_cm_id **id) {
    struct sockaddr_in a = *addr;
    a.sin_port = 0;
    for (int attempt = 0;; attempt++) {
        if (vb.cm_create_id(ch, id, ctx, RDMA_PS_TCP) == 0 &&
            vb.cm_bind_addr(*id, (struct sockaddr *)&a) == 0 && vb.cm_listen(*id, backlog) == 0)
            return 0;
        int rc = errno ? -errno : -EINVAL;
        if (*id) vb.cm_destroy_id(*id);
        *id = NULL;
        if (rc != -EADDRINUSE || attempt >= CM_PORT_RETRIES) return rc;
    }
}

int cm_listen(struct listen_comm *lc) {
    struct erdma_device *dev = lc->base.dev;
    int rc = cm_channel_open(&lc->cm_ch);
    if (rc) {
        WARN("%s: cannot create an rdma_cm event channel: %s (is rdma_ucm loaded and "
             "/dev/infiniband/rdma_cm passed to the container?)",
             dev->name, strerror(-rc));
        return rc;
    }
    struct sockaddr_in addr = dev->ip;
    addr.sin_port = 0;
    rc = cm_listen_any_port(lc->cm_ch, lc, &addr, 128, &lc->cm_id);
    if (rc) {
        char a[64];
        oob_format(&addr, a, sizeof(a));
        WARN("%s: rdma_cm cannot listen on %s: %s", dev->name, a, strerror(-rc));
        return rc;
    }
    lc->cm_addr = addr;
    lc->cm_addr.sin_port = vb.cm_get_src_port(lc->cm_id); /* already network order */
    TRACE(NCCL_NET, "%s: rdma_cm listening on port %u", dev->name, ntohs(lc->cm_addr.sin_port));
    return 0;
}

void cm_close_listen(struct listen_comm *lc) {
    if (lc->cm_id) vb.cm_destroy_id(lc->cm_id);
    if (lc->cm_ch) vb.cm_destroy_event_channel(lc->cm_ch);
    lc->cm_id = NULL;
    lc->cm_ch = NULL;
}

/* ------------------------------------------------------------ sender */
enum { CM_START = 0, CM_WAIT };

/* Starts (or restarts) the rdma_cm connection of QP i: a fresh id, address resolution. */
static int connect_start_qp(struct conn *c, int i, const struct sockaddr_in *dst) {
    struct erdma_device *dev = c->base.dev;
    struct sockaddr_in src = dev->ip;
    struct rdma_cm_id *id;
    src.sin_port = 0;
    if (vb.cm_create_id(c->cm_ch, &id, (void *)(intptr_t)i, RDMA_PS_TCP)) return -errno;
    c->qps[i].cm_id = id;
    if (vb.cm_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)dst, CM_RESOLVE_MS)) {
        int rc = -errno;
        WARN("%s: rdma_resolve_addr to %s failed: %s", dev->name, c->peer, strerror(-rc));
        return rc;
    }
    return 0;
}

static int connect_handle_event(struct send_comm *sc, struct rdma_cm_event *ev, uint64_t nonce,
                                uint32_t token, const struct sockaddr_in *dst, int *established) {
    struct conn *c = &sc->c;
    struct erdma_device *dev = c->base.dev;
    int i = (int)(intptr_t)ev->id->context;
    struct rdma_conn_param param;
    struct wire_cm_private priv = {.magic = WIRE_MAGIC,
                                   .qp_index = (uint16_t)i,
                                   .nqps = (uint16_t)c->nqps,
                                   .nonce = nonce,
                                   .token = token};
    int rc = 0;
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (vb.cm_resolve_route(ev->id, CM_RESOLVE_MS)) {
            rc = -errno;
            WARN("%s: rdma_resolve_route to %s failed: %s", dev->name, c->peer, strerror(-rc));
        }
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (ev->id->verbs != dev->ctx) {
            WARN("%s: rdma_cm routes %s through %s, not this device: use one IP subnet per "
                 "eRDMA interface",
                 dev->name, c->peer, vb.get_device_name(ev->id->verbs->device));
            rc = -EHOSTUNREACH;
            break;
        }
        rc = cm_create_qp(ev->id, c, true, &c->qps[i]);
        if (rc) break;
        conn_param(&param, &priv);
        if (cm_connect_quiet(dev, ev->id, &param, false)) {
            rc = -errno;
            /* the source port rdma_cm chose is held by a TIME-WAIT socket: new id, new port */
            if (rc == -EADDRINUSE && ++sc->cm_retries <= CM_PORT_RETRIES) {
                ev->id->context = (void *)(intptr_t)-1; /* retired: acked, then destroyed */
                sc->cm_retired[i] = ev->id;
                c->qps[i].qp = NULL;
                c->qps[i].cm_id = NULL;
                return connect_start_qp(c, i, dst);
            }
            WARN("%s: rdma_connect to %s failed: %s", dev->name, c->peer, strerror(-rc));
        }
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        (*established)++;
        break;
    default:
        rc = cm_fail(dev, c->peer, ev, "connect");
        break;
    }
    return rc;
}

int cm_connect_progress(struct send_comm *sc, const struct sockaddr_in *dst, uint64_t nonce,
                        uint32_t token, int *stage) {
    struct conn *c = &sc->c;
    int rc;
    if (*stage == CM_START) {
        rc = cm_channel_open(&c->cm_ch);
        if (rc) return rc;
        for (int i = 0; i < c->nqps; i++) {
            rc = connect_start_qp(c, i, dst);
            if (rc) return rc;
        }
        *stage = CM_WAIT;
    }
    int established = 0;
    for (int i = 0; i < c->nqps; i++)
        established += c->qps[i].qp && c->qps[i].up;
    struct rdma_cm_event *ev;
    while ((rc = cm_next_event(c->cm_ch, &ev)) == 1) {
        int before = established;
        int i = (int)(intptr_t)ev->id->context;
        rc = connect_handle_event(sc, ev, nonce, token, dst, &established);
        vb.cm_ack_cm_event(ev);
        if (i >= 0 && i < c->nqps && sc->cm_retired[i]) { /* an id given up after EADDRINUSE */
            vb.cm_destroy_qp(sc->cm_retired[i]);
            vb.cm_destroy_id(sc->cm_retired[i]);
            sc->cm_retired[i] = NULL;
        }
        if (rc) return rc;
        if (established > before) c->qps[i].up = true;
    }
    if (rc < 0) return rc;
    return established == c->nqps;
}

/* ------------------------------------------------------------ receiver */
#define CM_EVENTS_PER_CALL 64

/* A rejected request's id is ours to destroy (after its event is acked): *drop is set to it. */
static int accept_request(struct listen_comm *lc, struct recv_comm *rc, struct rdma_cm_event *ev,
                          uint64_t nonce, uint32_t token, struct rdma_cm_id **drop) {
    struct erdma_device *dev = lc->base.dev;
    char peer[64], why[160];
    int i = -1;
    oob_format((struct sockaddr_in *)&ev->id->route.addr.dst_addr, peer, sizeof(peer));
    int bad = wire_cm_private_check(ev->param.conn.private_data, ev->param.conn.private_data_len,
                                    nonce, token, rc->c.nqps, &i, why, sizeof(why));
    if (!bad && rc->c.qps[i].cm_id) {
        snprintf(why, sizeof(why), "its QP %d is already connected", i);
        bad = -EPROTO;
    }
    if (bad) {
        WARN("%s: rejecting an rdma_cm connection from %s: %s", dev->name, peer, why);
        vb.cm_reject(ev->id, NULL, 0);
        *drop = ev->id;
        return 0;
    }
    struct qp_ctx *q = &rc->c.qps[i];
    if (ev->id->verbs != dev->ctx) {
        WARN("%s: rdma_cm delivered %s's connection on another device", dev->name, peer);
        vb.cm_reject(ev->id, NULL, 0);
        *drop = ev->id;
        return -EHOSTUNREACH;
    }
    int ret = cm_create_qp(ev->id, &rc->c, false, q);
    if (ret) {
        vb.cm_reject(ev->id, NULL, 0);
        *drop = ev->id;
        return ret;
    }
    ev->id->context = (void *)(intptr_t)i;
    /* receives first: the peer may send as soon as the connection is up */
    for (int k = 0; k < ERDMA_RQ_DEPTH; k++) {
        ret = p2p_post_recv_wr(rc, i, k);
        if (ret) return ret;
    }
    struct rdma_conn_param param;
    conn_param(&param, NULL);
    if (cm_connect_quiet(dev, ev->id, &param, true)) {
        ret = -errno;
        WARN("%s: rdma_accept for %s failed: %s", dev->name, peer, strerror(-ret));
        return ret;
    }
    return 0;
}

int cm_accept_progress(struct listen_comm *lc, struct recv_comm *rc, uint64_t nonce,
                       uint32_t token) {
    struct rdma_cm_event *ev;
    int ret = 0;
    /* at most CM_EVENTS_PER_CALL: a flood of stray requests must not keep NCCL's thread in
     * one call (the rest wait in the channel for the next) */
    for (int k = 0; k < CM_EVENTS_PER_CALL && (ret = cm_next_event(lc->cm_ch, &ev)) == 1; k++) {
        struct rdma_cm_id *drop = NULL;
        switch (ev->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
            ret = accept_request(lc, rc, ev, nonce, token, &drop);
            break;
        case RDMA_CM_EVENT_ESTABLISHED: {
            int i = (int)(intptr_t)ev->id->context;
            if (i >= 0 && i < rc->c.nqps && rc->c.qps[i].cm_id == ev->id) rc->c.qps[i].up = true;
            ret = 0;
            break;
        }
        default:
            ret = cm_fail(lc->base.dev, rc->c.peer, ev, "accept");
            break;
        }
        vb.cm_ack_cm_event(ev);
        if (drop) vb.cm_destroy_id(drop);
        if (ret) return ret;
    }
    if (ret < 0) return ret;
    for (int i = 0; i < rc->c.nqps; i++)
        if (!rc->c.qps[i].up) return 0;
    /* every QP is up: later events (disconnects) belong to this comm, not the listener */
    ret = cm_channel_open(&rc->c.cm_ch);
    if (ret) return ret;
    for (int i = 0; i < rc->c.nqps; i++) {
        if (vb.cm_migrate_id(rc->c.qps[i].cm_id, rc->c.cm_ch)) {
            int err = errno ? -errno : -EIO; /* erdma_accept WARNs it, naming the peer */
            /* The ids not moved still report to the listener's channel, which a closeListen
             * may destroy before this comm's teardown runs on the reaper: they go now, while
             * it lives (the teardown skips them). */
            for (int j = i; j < rc->c.nqps; j++)
                qp_destroy(&rc->c.qps[j]);
            return err;
        }
    }
    return 1;
}

/* ------------------------------------------------------------ flush loopback */
/* The loopback listener is bound to the device's address, reachable from the network while it
 * is set up: only one request is taken, from our own address and from the port our active id
 * holds (any other process on this host shares the address; rdma_cm gave that port to our id
 * alone, at rdma_resolve_addr, before any request of ours left). Anything else is rejected
 * and its id destroyed. */
static bool flush_request_is_ours(struct recv_comm *rc, struct rdma_cm_event *ev) {
    const struct sockaddr_in *from = (const struct sockaddr_in *)&ev->id->route.addr.dst_addr;
    const struct erdma_device *dev = rc->c.base.dev;
    return !rc->flush_peer.qp && from->sin_family == AF_INET &&
           from->sin_addr.s_addr == dev->ip.sin_addr.s_addr && rc->flush_qp.cm_id &&
           from->sin_port == vb.cm_get_src_port(rc->flush_qp.cm_id);
}

/* The loopback's active end: a new id, resolving its way to the flush listener. It is
 * flush_qp's id from now on (released with it whatever happens next). */
static int flush_connect_start(struct recv_comm *rc) {
    struct sockaddr_in src = rc->c.base.dev->ip, dst;
    struct rdma_cm_id *active;
    src.sin_port = 0;
    dst = src;
    dst.sin_port = vb.cm_get_src_port(rc->flush_listen);
    if (vb.cm_create_id(rc->flush_ch, &active, NULL, RDMA_PS_TCP)) return errno ? -errno : -EINVAL;
    rc->flush_qp.cm_id = active;
    if (vb.cm_resolve_addr(active, (struct sockaddr *)&src, (struct sockaddr *)&dst, CM_RESOLVE_MS))
        return errno ? -errno : -EINVAL;
    return 0;
}

static int flush_event(struct recv_comm *rc, struct rdma_cm_event *ev, struct rdma_cm_id **drop) {
    struct conn *c = &rc->c;
    struct rdma_conn_param param;
    int ret = 0;
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (vb.cm_resolve_route(ev->id, CM_RESOLVE_MS)) ret = -errno;
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        ret = cm_create_qp(ev->id, c, false, &rc->flush_qp);
        conn_param(&param, NULL);
        if (!ret && cm_connect_quiet(c->base.dev, ev->id, &param, false)) {
            ret = -errno;
            /* the port rdma_cm chose is held by a TCP socket (iWARP): new id, new port, as
             * the sender's connect does; this one goes once its event is acked */
            if (ret == -EADDRINUSE && ++rc->flush_retries <= CM_PORT_RETRIES) {
                vb.cm_destroy_qp(ev->id);
                rc->flush_qp.qp = NULL;
                rc->flush_qp.cm_id = NULL;
                *drop = ev->id;
                ret = flush_connect_start(rc);
            }
        }
        break;
    case RDMA_CM_EVENT_CONNECT_REQUEST:
        if (!flush_request_is_ours(rc, ev)) {
            char peer[64];
            oob_format((struct sockaddr_in *)&ev->id->route.addr.dst_addr, peer, sizeof(peer));
            WARN("%s: rejecting an rdma_cm connection from %s to the flush loopback",
                 c->base.dev->name, peer);
            vb.cm_reject(ev->id, NULL, 0);
            *drop = ev->id;
            break;
        }
        ret = cm_create_qp(ev->id, c, false, &rc->flush_peer);
        if (ret) { /* no QP took the id: it is ours to refuse and destroy, as in accept */
            vb.cm_reject(ev->id, NULL, 0);
            *drop = ev->id;
            break;
        }
        conn_param(&param, NULL);
        if (cm_connect_quiet(c->base.dev, ev->id, &param, true)) ret = -errno;
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        if (ev->id == rc->flush_qp.cm_id || ev->id == rc->flush_peer.cm_id) rc->flush_up++;
        break;
    default:
        ret = cm_fail(c->base.dev, "itself (flush loopback)", ev, "loopback");
        break;
    }
    return ret;
}

/* Starts the loopback; cm_flush_progress() finishes it, one non-blocking step per accept(). */
int cm_flush_start(struct recv_comm *rc) {
    struct erdma_device *dev = rc->c.base.dev;
    int ret = cm_channel_open(&rc->flush_ch);
    if (ret) return ret;
    ret = cm_listen_any_port(rc->flush_ch, NULL, &dev->ip, FLUSH_BACKLOG, &rc->flush_listen);
    if (!ret) {
        rc->flush_up = 0;
        rc->flush_retries = 0;
        ret = flush_connect_start(rc);
    }
    if (!ret) return 0;
    WARN("%s: cannot set up the flush loopback through rdma_cm: %s", dev->name, strerror(-ret));
    return ret;
}

int cm_flush_progress(struct recv_comm *rc) {
    int ret;
    struct rdma_cm_event *ev;
    while (rc->flush_up < 2 && (ret = cm_next_event(rc->flush_ch, &ev)) == 1) {
        struct rdma_cm_id *drop = NULL;
        ret = flush_event(rc, ev, &drop);
        vb.cm_ack_cm_event(ev);
        if (drop) vb.cm_destroy_id(drop);
        if (ret) {
            WARN("%s: cannot set up the flush loopback through rdma_cm: %s", rc->c.base.dev->name,
                 strerror(-ret));
            return ret;
        }
    }
    if (rc->flush_up < 2) return ret < 0 ? ret : 0;
    /* its listener goes now: for the rest of the comm's life nothing can knock at it, and
     * requests still queued there are refused with it */
    vb.cm_destroy_id(rc->flush_listen);
    rc->flush_listen = NULL;
    rc->flush_ready = true;
    return 1;
}

void cm_flush_release(struct recv_comm *rc) {
    qp_destroy(&rc->flush_peer);
    if (rc->flush_listen) vb.cm_destroy_id(rc->flush_listen);
    if (rc->flush_ch) vb.cm_destroy_event_channel(rc->flush_ch);
    rc->flush_listen = NULL;
    rc->flush_ch = NULL;
}

int cm_poll_disconnect(struct conn *c) {
    struct rdma_cm_event *ev;
    int ret, broken = 0;
    if (!c->cm_ch) return 0;
    while ((ret = cm_next_event(c->cm_ch, &ev)) == 1) {
        enum rdma_cm_event_type type = ev->event;
        vb.cm_ack_cm_event(ev);
        if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            type == RDMA_CM_EVENT_TIMEWAIT_EXIT || type == RDMA_CM_EVENT_CONNECT_ERROR) {
            if (!broken)
                WARN("%s: rdma_cm reports %s for the connection with %s", c->base.dev->name,
                     vb.cm_event_str(type), c->peer);
            broken = 1;
        }
    }
    return broken ? -ECONNRESET : 0;
}

/* iWARP completes a send once it is handed to TCP, not when the peer has it: tearing the
 * connection down abruptly (destroy_id alone resets it) can lose the last messages. The close
 * asks for a graceful disconnect and gives its handshake a bounded moment (conn.c, on the
 * reaper thread). */
int cm_disconnect_start(struct conn *c) {
    int pending = 0;
    for (int i = 0; i < c->nqps; i++) {
        if (c->qps[i].cm_id && c->qps[i].qp && vb.cm_disconnect(c->qps[i].cm_id) == 0) pending++;
    }
    return c->cm_ch ? pending : 0;
}

int cm_disconnect_progress(struct conn *c, int pending) {
    struct rdma_cm_event *ev;
    while (pending > 0 && cm_next_event(c->cm_ch, &ev) == 1) {
        if (ev->event == RDMA_CM_EVENT_DISCONNECTED) pending--;
        vb.cm_ack_cm_event(ev);
    }
    return pending;
}
