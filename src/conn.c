/*
 * Owns listen/connect/accept: non-blocking state machines over the
 * out-of-band TCP socket that swap QP numbers, GIDs and control-region keys,
 * then wire the QPs (GID mode here, rdma_cm mode in cm.c). Also owns comm
 * teardown. Does not move data (p2p.c).
 */
#define _GNU_SOURCE
#include "conn.h"
#include "log.h"
#include "net.h"
#include "oob.h"
#include "params.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* oob_peer_hung_up takes a goodbye during the handshake for a peer that gave up: no message
 * may start with that byte, in either byte order. */
_Static_assert((WIRE_MAGIC & 0xff) != OOB_BYE && (WIRE_MAGIC >> 24) != OOB_BYE,
               "a handshake message would read as a goodbye");

#define MAX_MSG_CAP (1u << 30) /* one RDMA write never exceeds 1 GiB */

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* For the data path's liveness checks, which need ~10 ms resolution: the coarse clock is
 * read from the vDSO page alone, where CLOCK_MONOTONIC may be a system call (a VM whose
 * clocksource has no vDSO path, like the HPET under emulation). */
uint64_t now_coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t erdma_clock_ns;

struct erdma_device *comm_device(void *comm) {
    struct comm_base *b = comm;
    if (!b || (b->kind != COMM_LISTEN && b->kind != COMM_SEND && b->kind != COMM_RECV)) {
        WARN("called with an object that is not an eRDMA comm (%p)", comm);
        return NULL;
    }
    return b->dev;
}

static int qps_per_connection(const struct erdma_device *dev) {
    long n = param_int(P_IB_QPS_PER_CONNECTION);
    return n < 1 ? 1 : n > ERDMA_MAX_QPS ? ERDMA_MAX_QPS : (int)n;
}

/* A send or recv comm, zeroed: its slots and requests are cache-line aligned (comm.h), and
 * calloc promises only 16 bytes. */
static void *comm_zalloc(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 64, size)) return NULL;
    return memset(p, 0, size);
}

int conn_sq_depth(const struct erdma_device *dev, bool sender) {
    /* sender: payload chunks + records for 32 slots; receiver: CTS writes */
    int want = sender ? ERDMA_SQ_RING : 4 * ERDMA_FIFO_DEPTH;
    return want < dev->max_qp_wr ? want : dev->max_qp_wr;
}

static struct ibv_mr *ctrl_reg(struct erdma_device *dev, void *addr, size_t len, int access) {
    errno = 0;
    struct ibv_mr *mr = vb.reg_mr(dev->pd, addr, len, access);
    if (!mr) {
        int err = errno ? errno : ENOMEM;
        WARN("%s: cannot register a %zu-byte control region: %s%s", dev->name, len, strerror(err),
             err == ENOMEM ? " (memlock limit too low? run with `ulimit -l unlimited`; in "
                             "containers grant IPC_LOCK)"
                           : "");
        errno = err;
    }
    return mr;
}

int conn_alloc_common(struct conn *c, struct erdma_device *dev, int nqps, size_t ctrl_len,
                      size_t peer_len) {
    c->base.dev = dev;
    c->sends_in_syscall = dev->sends_in_syscall;
    c->fd = -1;
    clock_refresh(); /* the data path's stamps start from a fresh reading */
    c->port_downs = __atomic_load_n(&dev->port_downs, __ATOMIC_ACQUIRE);
    c->stall_warn_s = (uint32_t)param_int(P_ERDMA_STALL_WARN);
    c->nqps = nqps;
    c->cq_depth = nqps * (conn_sq_depth(dev, true) + ERDMA_RQ_DEPTH) + 2 * ERDMA_FIFO_DEPTH;
    if (dev->max_cqe > 0 && c->cq_depth > dev->max_cqe) c->cq_depth = dev->max_cqe;
    errno = 0; /* a provider may fail without setting it (siw: see device.c) */
    c->cq = vb.create_cq(dev->ctx, c->cq_depth, NULL, NULL, 0);
    if (!c->cq) {
        int err = errno ? errno : EIO;
        WARN("%s: ibv_create_cq(%d) failed: %s", dev->name, c->cq_depth, strerror(err));
        return -err;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    c->ctrl_len = (ctrl_len + page - 1) & ~(page - 1);
    if (posix_memalign(&c->ctrl, page, c->ctrl_len)) return -ENOMEM;
    memset(c->ctrl, 0, c->ctrl_len);
    /* Two registrations of one region: the peer gets the key of its head only, so what it
     * writes can never reach the state we read back to post (a clear-to-send's buffer count
     * sizes a work-request array). */
    c->ctrl_mr = ctrl_reg(dev, c->ctrl, c->ctrl_len, IBV_ACCESS_LOCAL_WRITE);
    if (!c->ctrl_mr) return -errno;
    c->peer_mr = ctrl_reg(dev, c->ctrl, peer_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!c->peer_mr) return -errno;
    return 0;
}

void conn_destroy_common(struct conn *c) {
    for (int i = 0; i < c->nqps; i++)
        qp_destroy(&c->qps[i]);
    if (c->peer_mr) vb.dereg_mr(c->peer_mr);
    if (c->ctrl_mr) vb.dereg_mr(c->ctrl_mr);
    free(c->ctrl);
    if (c->cq) vb.destroy_cq(c->cq);
    if (c->cm_ch) vb.cm_destroy_event_channel(c->cm_ch);
    if (c->fd >= 0) close(c->fd);
    c->ctrl_mr = NULL;
    c->peer_mr = NULL;
    c->ctrl = NULL;
    c->cq = NULL;
    c->cm_ch = NULL;
    c->fd = -1;
}

#define GOODBYE_WAIT_NS    300000000ull  /* for the peer's goodbye */
#define DISCONNECT_WAIT_NS 1000000000ull /* for the disconnect handshake */

enum { TD_BYE = 0, TD_WAIT_BYE, TD_DISCONNECT, TD_WAIT_DISCONNECT };

/* iWARP completes a send when it reaches TCP, so a peer that tears its QPs down right after
 * its last completion can flush a message the other side has not finished with: in rdma_cm
 * mode both ends say goodbye and wait (bounded) for the other's, then disconnect gracefully
 * and give that a bounded moment too. Up to ~1.3 s when the peer has not closed yet: this
 * runs on the reaper thread, never in NCCL's. */
static int conn_teardown_step(struct reap_item *it, int *fd, uint64_t *wake_ns) {
    struct conn *c = (struct conn *)((char *)it - offsetof(struct conn, reap));
    uint64_t t = now_ns();
    switch (c->td_stage) {
    case TD_BYE:
        c->td_stage = TD_DISCONNECT;
        if (c->fd >= 0 && !c->error && oob_goodbye_send(c->fd) == 0) {
            c->td_stage = TD_WAIT_BYE;
            c->td_deadline = t + GOODBYE_WAIT_NS;
        }
        /* fall through */
    case TD_WAIT_BYE:
        if (c->td_stage == TD_WAIT_BYE) {
            if (!oob_goodbye_seen(c->fd) && t < c->td_deadline) {
                *fd = c->fd;
                *wake_ns = c->td_deadline;
                return 0;
            }
            c->td_stage = TD_DISCONNECT;
        }
        /* fall through */
    case TD_DISCONNECT:
        c->td_pending = cm_disconnect_start(c);
        c->td_deadline = t + DISCONNECT_WAIT_NS;
        c->td_stage = TD_WAIT_DISCONNECT;
        /* fall through */
    case TD_WAIT_DISCONNECT:
        c->td_pending = cm_disconnect_progress(c, c->td_pending);
        if (c->td_pending > 0 && t < c->td_deadline) {
            *fd = c->cm_ch->fd;
            *wake_ns = c->td_deadline;
            return 0;
        }
    }
    c->td_release(c);
    return 1;
}

void conn_release(struct conn *c, void (*release)(struct conn *c)) {
    stats_conn_close(&c->stats);
    if (!c->cm_ch) { /* GID mode, or an rdma_cm end not connected yet: nothing to wait for */
        /* A goodbye still tells the peer this is a normal close, not a death: one that waits
         * for us is then told the ranks disagree, not that our node died. The peer's own
         * goodbye, if it is there, is read first: closing a socket with unread bytes sends a
         * reset, which could discard ours. */
        if (c->fd >= 0 && !c->error) {
            (void)oob_goodbye_seen(c->fd);
            (void)oob_goodbye_send(c->fd);
        }
        cm_disconnect_start(c);
        release(c);
        return;
    }
    c->td_release = release;
    c->td_stage = TD_BYE;
    c->reap.step = conn_teardown_step;
    reap_defer(&c->reap);
}

/* ------------------------------------------------------------ listen */
int erdma_listen(int dev_index, void *handle, void **listen_comm) {
    *listen_comm = NULL;
    if (erdma_forked) return erdma_forked_refuse("listen");
    struct erdma_device *dev = device_get(dev_index);
    if (!dev) {
        WARN("listen: device %d does not exist", dev_index);
        return -EINVAL;
    }
    struct listen_comm *lc = calloc(1, sizeof(*lc));
    if (!lc) return -ENOMEM;
    lc->base.kind = COMM_LISTEN;
    lc->base.dev = dev;
    lc->fd = -1;
    erdma_object_opened(); /* now: a failure below closes it, which counts it closed */
    struct sockaddr_in local;
    int rc = oob_local_addr(dev, &local);
    if (!rc) rc = oob_listen(&local, &lc->fd, &lc->addr);
    if (!rc && dev->connect_mode == CONNECT_RDMACM) rc = cm_listen(lc);
    if (rc) {
        erdma_close_listen(lc);
        return rc;
    }
    if (getrandom(&lc->nonce, sizeof(lc->nonce), 0) != sizeof(lc->nonce))
        lc->nonce = now_ns() ^ ((uint64_t)getpid() << 32);

    struct wire_handle *h = handle;
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    h->connect_mode = (uint8_t)dev->connect_mode;
    h->nonce = lc->nonce;
    h->addr = lc->addr;
    h->cm_port = lc->cm_addr.sin_port;
    h->cm_ip = lc->cm_addr.sin_addr;
    wire_handle_seal(h);
    *listen_comm = lc;
    return 0;
}

/* ------------------------------------------------------------ connect */
enum connect_stage {
    CS_TCP_START,
    CS_TCP_WAIT,
    CS_SEND_HELLO,
    CS_RECV_REPLY,
    CS_PORT_WAIT,
    CS_CM,
    CS_SEND_READY,
    CS_WAIT_WARMED
};

/* For the timeout's WARN: where a connect stopped, in words. */
static const char *const connect_stage_name[] = {
    [CS_TCP_START] = "starting the TCP connection",
    [CS_TCP_WAIT] = "waiting for the TCP connection",
    [CS_SEND_HELLO] = "sending the hello",
    [CS_RECV_REPLY] = "waiting for the reply (the peer has not called accept for us yet)",
    [CS_PORT_WAIT] = "waiting for the port to connect the QPs",
    [CS_CM] = "connecting the QPs through rdma_cm",
    [CS_SEND_READY] = "sending the ready message",
    [CS_WAIT_WARMED] = "waiting for the receiver to confirm the warm-up SENDs"};

/* A connect's or accept's wait for a port that can carry the connection (a link flap): why
 * it cannot yet (NULL: it can), and when to look again. */
struct port_wait {
    const char *why;
    uint64_t next_ns;
};

#define PORT_POLL_MS 50

/* 1 the device's port can carry the connection (device_port_unusable), 0 not yet: wait,
 * looked at again every PORT_POLL_MS within the handshake's deadline. The first wait logs
 * why, naming the connection (who, peer: "the connect to", "10.0.0.2:40001"). */
static int port_ready(struct erdma_device *dev, struct port_wait *w, const char *who,
                      const char *peer) {
    if (w->why && now_ns() < w->next_ns) return 0;
    const char *why = device_port_unusable(dev);
    if (why && !w->why)
        INFO(NCCL_NET,
             "%s: %s (check the link of %s): %s %s waits for it, up to "
             "NCCL_ERDMA_CONNECT_TIMEOUT=%lds",
             dev->name, why, device_netdev_name(dev), who, peer,
             param_int(P_ERDMA_CONNECT_TIMEOUT));
    w->why = why;
    w->next_ns = now_ns() + PORT_POLL_MS * 1000000ull;
    return why == NULL;
}

struct connect_state {
    struct connect_state *next;
    void *handle; /* NCCL's buffer this state belongs to */
    struct wire_handle peer;
    struct send_comm *sc;
    enum connect_stage stage;
    int cm_stage;
    uint32_t cm_token; /* rdma_cm mode: the accept's, from its reply */
    int tc;
    uint64_t deadline;
    uint64_t retry_at;
    int backoff_ms;
    int attempts;
    int last_err; /* -errno of the last TCP attempt that failed, for the timeout's WARN */
    struct port_wait port;
    struct wire_conn_msg msg;
    size_t io_done;
};

/* NCCL hands us the same handle buffer on every connect() retry: its tail holds our state
 * pointer, accepted only if registered here (a garbage handle cannot make us follow it). */
#define HANDLE_STATE_OFFSET 64
static pthread_mutex_t connect_lock = PTHREAD_MUTEX_INITIALIZER;
static struct connect_state *connect_states;

static struct connect_state **handle_state_slot(void *handle) {
    return (struct connect_state **)((char *)handle + HANDLE_STATE_OFFSET);
}

static struct connect_state *connect_state_find(void *handle) {
    struct connect_state *want = *handle_state_slot(handle), *s;
    pthread_mutex_lock(&connect_lock);
    for (s = connect_states; s && !(s == want && s->handle == handle); s = s->next)
        ;
    pthread_mutex_unlock(&connect_lock);
    return s;
}

static void connect_state_free(struct connect_state *st) {
    pthread_mutex_lock(&connect_lock);
    for (struct connect_state **pp = &connect_states; *pp; pp = &(*pp)->next) {
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    }
    pthread_mutex_unlock(&connect_lock);
    *handle_state_slot(st->handle) = NULL;
    free(st);
}

static void send_comm_release(struct conn *c) {
    conn_destroy_common(c);
    free((struct send_comm *)c); /* the conn is its first member */
}

static void send_comm_free(struct send_comm *sc) {
    if (sc) conn_release(&sc->c, send_comm_release);
}

static int send_comm_setup(struct connect_state *st, struct erdma_device *dev) {
    struct send_comm *sc = comm_zalloc(sizeof(*sc));
    if (!sc) return -ENOMEM;
    st->sc = sc;
    sc->c.base.kind = COMM_SEND;
    int nqps = qps_per_connection(dev);
    int rc = conn_alloc_common(&sc->c, dev, nqps, SEND_CTRL_LEN, SEND_CTRL_PEER_LEN);
    if (rc) return rc;
    sc->fifo = (struct wire_cts *)((char *)sc->c.ctrl + SEND_CTRL_FIFO);
    sc->records = (struct wire_record *)((char *)sc->c.ctrl + SEND_CTRL_RECORDS);
    sc->c.split = param_int(P_IB_SPLIT_DATA_ON_QPS) != 0;
    sc->c.completion = dev->completion;
    sc->c.inline_payload = param_int(P_ERDMA_INLINE_PAYLOAD) != 0;

    struct wire_conn_msg *m = &st->msg;
    memset(m, 0, sizeof(*m));
    if (dev->connect_mode == CONNECT_GID) {
        for (int i = 0; i < nqps; i++) {
            rc = qp_create(dev, sc->c.cq, conn_sq_depth(dev, true), 1, QP_ACCESS_PEER,
                           &sc->c.qps[i]);
            if (rc) return rc;
            m->qpn[i] = sc->c.qps[i].qp->qp_num;
        }
    }
    m->nonce = st->peer.nonce;
    m->nqps = (uint8_t)nqps;
    m->completion = (uint8_t)dev->completion;
    m->connect_mode = (uint8_t)dev->connect_mode;
    m->mtu = (uint8_t)dev->active_mtu;
    m->split = sc->c.split;
    memcpy(m->gid, dev->gid.raw, 16);
    m->lid = dev->lid;
    m->ctrl_addr = (uintptr_t)sc->fifo;
    m->ctrl_rkey = sc->c.peer_mr->rkey;
    m->max_msg_sz = dev->max_msg_sz;
    struct qp_params qpp;
    qp_params_from_env(&qpp, st->tc);
    m->tc = (uint8_t)qpp.tc;
    m->sl = (uint8_t)qpp.sl;
    m->qos_set = 1;
    wire_msg_seal(m, MSG_HELLO);
    return 0;
}

static int connect_apply_reply(struct connect_state *st, struct erdma_device *dev) {
    struct send_comm *sc = st->sc;
    struct wire_conn_msg *m = &st->msg;
    char why[160];
    int rc = wire_msg_check(m, MSG_REPLY, why, sizeof(why));
    if (!rc && (m->nonce != st->peer.nonce || m->nqps != sc->c.nqps)) {
        snprintf(why, sizeof(why), "reply for another connection (nonce or QP count differ)");
        rc = -EPROTO;
    }
    if (!rc && m->connect_mode != dev->connect_mode) {
        snprintf(why, sizeof(why), "reply in %s mode to our %s-mode hello",
                 m->connect_mode == CONNECT_GID ? "GID" : "rdma_cm",
                 dev->connect_mode == CONNECT_GID ? "GID" : "rdma_cm");
        rc = -EPROTO;
    }
    if (!rc && m->completion == COMPLETION_IMM && dev->completion == COMPLETION_SEND) {
        snprintf(why, sizeof(why), "peer chose write-with-imm completions we cannot do");
        rc = -EPROTO;
    }
    if (rc) {
        WARN("%s: bad reply from %s: %s", dev->name, sc->c.peer, why);
        return rc;
    }
    sc->c.completion = (enum completion_mode)m->completion;
    sc->c.remote_ctrl_addr = m->ctrl_addr;
    sc->c.remote_ctrl_rkey = m->ctrl_rkey;
    uint32_t mm = m->max_msg_sz < dev->max_msg_sz ? m->max_msg_sz : dev->max_msg_sz;
    sc->c.max_msg = mm < MAX_MSG_CAP ? mm : MAX_MSG_CAP;
    st->cm_token = m->cm_token;
    if (dev->connect_mode != CONNECT_GID) return 0;
    struct qp_params qpp;
    qp_params_from_env(&qpp, st->tc);
    enum ibv_mtu mtu = m->mtu < dev->active_mtu ? (enum ibv_mtu)m->mtu : dev->active_mtu;
    for (int i = 0; i < sc->c.nqps; i++) {
        rc = qp_connect_gid(dev, &sc->c.qps[i], m->qpn[i], m->gid, mtu, &qpp, sc->c.peer);
        if (rc) return rc;
    }
    return 0;
}

/* A TCP connect that failed in a way time may mend: the peer does not listen yet (pods start
 * in any order), or no route or link to it yet (a link flap, routes a CNI adds after the pod
 * starts). Backs off and tries again within the deadline (0), remembering the error for the
 * timeout's WARN; any other error is returned. */
static int tcp_retry_later(struct connect_state *st, int rc) {
    if (rc != -ECONNREFUSED && rc != -ETIMEDOUT && rc != -EHOSTUNREACH && rc != -ENETUNREACH &&
        rc != -ENETDOWN && rc != -EHOSTDOWN)
        return rc;
    st->last_err = rc;
    if (st->sc->c.fd >= 0) close(st->sc->c.fd);
    st->sc->c.fd = -1;
    st->backoff_ms = st->backoff_ms ? st->backoff_ms * 2 : 10;
    if (st->backoff_ms > 1000) st->backoff_ms = 1000;
    st->retry_at = now_ns() + (uint64_t)st->backoff_ms * 1000000ull;
    st->stage = CS_TCP_START;
    return 0;
}

/* One step of the connect state machine: 1 connected, 0 not yet, -errno failed. */
static int connect_step(struct connect_state *st, struct erdma_device *dev) {
    struct send_comm *sc = st->sc;
    int rc;
    switch (st->stage) {
    case CS_TCP_START:
        if (now_ns() < st->retry_at) return 0;
        if (!port_ready(dev, &st->port, "the connect to", sc->c.peer))
            return 0; /* no TCP attempt while the link is down */
        st->attempts++;
        rc = oob_connect_start(&st->peer.addr, &sc->c.fd);
        if (rc) return tcp_retry_later(st, rc);
        st->stage = CS_TCP_WAIT;
        /* fall through */
    case CS_TCP_WAIT:
        rc = oob_connect_poll(sc->c.fd);
        if (rc == 0) return 0;
        if (rc < 0) return tcp_retry_later(st, rc);
        st->last_err = 0;
        st->stage = CS_SEND_HELLO;
        st->io_done = 0;
        /* fall through */
    case CS_SEND_HELLO:
        rc = oob_send_progress(sc->c.fd, &st->msg, sizeof(st->msg), &st->io_done);
        if (rc <= 0) return rc;
        st->stage = CS_RECV_REPLY;
        st->io_done = 0;
        memset(&st->msg, 0, sizeof(st->msg));
        /* fall through */
    case CS_RECV_REPLY:
        rc = oob_recv_progress(sc->c.fd, &st->msg, sizeof(st->msg), &st->io_done);
        if (rc == -ECONNRESET || rc == -EPIPE) {
            WARN("%s: %s closed the connection during the handshake: it rejected us (a stale "
                 "handle, or NCCL_ERDMA_CONNECT_MODE differs between the nodes; its log says "
                 "why) or it exited",
                 dev->name, sc->c.peer);
            return -ECONNREFUSED;
        }
        if (rc <= 0) return rc;
        st->stage = CS_PORT_WAIT;
        /* fall through */
    case CS_PORT_WAIT:
        /* The peer's accept may come long after our hello, and the link may have flapped
         * meanwhile: our QPs are connected only to a port that can carry them. They were not
         * connected before now, so no earlier down can be what breaks them: the connection
         * counts from here (p2p.c's port_down_hint). */
        if (!port_ready(dev, &st->port, "the connect to", sc->c.peer)) return 0;
        sc->c.port_downs = __atomic_load_n(&dev->port_downs, __ATOMIC_ACQUIRE);
        rc = connect_apply_reply(st, dev);
        if (rc) return rc;
        st->stage = dev->connect_mode == CONNECT_RDMACM ? CS_CM : CS_SEND_READY;
        st->io_done = 0;
        if (st->stage == CS_SEND_READY) goto send_ready;
        /* fall through */
    case CS_CM: {
        /* the receiver writes nothing before our ready message: an end is a receiver gone */
        if (oob_peer_hung_up(sc->c.fd)) {
            WARN("%s: %s closed the connection while our rdma_cm requests were connecting: it "
                 "gave up on them or exited (its log says why)",
                 dev->name, sc->c.peer);
            return -ECONNREFUSED;
        }
        struct sockaddr_in dst = {
            .sin_family = AF_INET, .sin_port = st->peer.cm_port, .sin_addr = st->peer.cm_ip};
        rc = cm_connect_progress(sc, &dst, st->peer.nonce, st->cm_token, &st->cm_stage);
        if (rc <= 0) return rc;
        rc = p2p_send_warmup(sc);
        if (rc) return rc;
        st->stage = CS_SEND_READY;
        st->io_done = 0;
    }
    send_ready:
        memset(&st->msg, 0, sizeof(st->msg));
        st->msg.nonce = st->peer.nonce;
        wire_msg_seal(&st->msg, MSG_READY);
        /* fall through */
    case CS_SEND_READY:
        rc = oob_send_progress(sc->c.fd, &st->msg, sizeof(st->msg), &st->io_done);
        if (rc <= 0 || dev->connect_mode != CONNECT_RDMACM) return rc;
        st->stage = CS_WAIT_WARMED;
        st->io_done = 0;
        memset(&st->msg, 0, sizeof(st->msg));
        /* fall through */
    case CS_WAIT_WARMED: {
        /* Done only once the receiver has every warm-up (p2p.c says why one can stall): a
         * sender that goes on connecting other comms, or does nothing, still gets its
         * receiver's accept through, as NCCL's setup loops need. */
        char why[160];
        rc = oob_recv_progress(sc->c.fd, &st->msg, sizeof(st->msg), &st->io_done);
        if (rc == 0) return p2p_send_warmup_again(sc);
        if (rc < 0) return rc;
        rc = wire_msg_check(&st->msg, MSG_WARMED, why, sizeof(why));
        if (!rc && st->msg.nonce != st->peer.nonce) {
            snprintf(why, sizeof(why), "it is for another connection (nonce differs)");
            rc = -EPROTO;
        }
        if (rc) {
            WARN("%s: bad warm-up confirmation from %s: %s", dev->name, sc->c.peer, why);
            return rc;
        }
        return 1;
    }
    }
    return -ENOTRECOVERABLE;
}

int erdma_connect(int dev_index, int traffic_class, void *handle, void **send_comm) {
    *send_comm = NULL;
    if (erdma_forked) return erdma_forked_refuse("connect");
    struct erdma_device *dev = device_get(dev_index);
    if (!dev) {
        WARN("connect: device %d does not exist", dev_index);
        return -EINVAL;
    }
    struct connect_state *st = connect_state_find(handle);
    int rc;
    if (!st) {
        char why[160];
        struct wire_handle peer;
        memcpy(&peer, handle, sizeof(peer));
        rc = wire_handle_check(&peer, why, sizeof(why));
        if (rc) {
            WARN("connect on %s: invalid handle: %s", dev->name, why);
            return rc;
        }
        if (peer.connect_mode != dev->connect_mode) {
            WARN("connect on %s: the peer listens in %s mode, this device uses %s; set the same "
                 "NCCL_ERDMA_CONNECT_MODE on every node",
                 dev->name, peer.connect_mode == CONNECT_GID ? "GID" : "rdma_cm",
                 dev->connect_mode == CONNECT_GID ? "GID" : "rdma_cm");
            return -EINVAL;
        }
        st = calloc(1, sizeof(*st));
        if (!st) return -ENOMEM;
        st->handle = handle;
        st->peer = peer;
        st->tc = traffic_class;
        st->deadline = now_ns() + (uint64_t)param_int(P_ERDMA_CONNECT_TIMEOUT) * 1000000000ull;
        rc = send_comm_setup(st, dev);
        oob_format(&peer.addr, st->sc ? st->sc->c.peer : why, sizeof(st->sc->c.peer));
        if (rc) {
            send_comm_free(st->sc);
            free(st);
            return rc;
        }
        pthread_mutex_lock(&connect_lock);
        st->next = connect_states;
        connect_states = st;
        pthread_mutex_unlock(&connect_lock);
        *handle_state_slot(handle) = st;
    }
    rc = connect_step(st, dev);
    bool late = rc == 0 && now_ns() > st->deadline; /* one reading for both messages */
    if (late && st->port.why) {
        WARN("%s: could not connect to %s within NCCL_ERDMA_CONNECT_TIMEOUT=%lds: %s; check "
             "the link of %s",
             dev->name, st->sc->c.peer, param_int(P_ERDMA_CONNECT_TIMEOUT), st->port.why,
             device_netdev_name(dev));
        rc = -ETIMEDOUT;
    } else if (late) {
        WARN("%s: could not connect to %s within NCCL_ERDMA_CONNECT_TIMEOUT=%lds (%d TCP "
             "attempt(s)%s%s, stopped %s). Is the peer alive and reachable on this interface?",
             dev->name, st->sc->c.peer, param_int(P_ERDMA_CONNECT_TIMEOUT), st->attempts,
             st->last_err ? ", the last failed: " : "", st->last_err ? strerror(-st->last_err) : "",
             connect_stage_name[st->stage]);
        rc = -ETIMEDOUT;
    }
    if (rc < 0) {
        if (rc != -ETIMEDOUT && rc != -EPROTO && rc != -EBADMSG && rc != -ECONNREFUSED)
            WARN("%s: connect to %s failed: %s", dev->name, st->sc->c.peer, strerror(-rc));
        send_comm_free(st->sc);
        connect_state_free(st);
        return rc;
    }
    if (rc == 1) {
        *send_comm = st->sc;
        erdma_object_opened();
        stats_conn_open(&st->sc->c.stats, dev->index, STATS_SEND, st->sc->c.peer);
        stats_event(dev->index, STATS_CONNECT);
        TRACE(NCCL_NET, "%s: connected to %s with %d QP(s)", dev->name, st->sc->c.peer,
              st->sc->c.nqps);
        connect_state_free(st);
    }
    return 0;
}

bool erdma_connects_pending(void) {
    pthread_mutex_lock(&connect_lock);
    bool any = connect_states != NULL;
    pthread_mutex_unlock(&connect_lock);
    return any;
}

void erdma_connect_sweep(void) {
    pthread_mutex_lock(&connect_lock);
    struct connect_state *st = connect_states;
    connect_states = NULL;
    pthread_mutex_unlock(&connect_lock);
    while (st) {
        struct connect_state *next = st->next;
        INFO(NCCL_NET, "%s: releasing an unfinished connect to %s", st->sc->c.base.dev->name,
             st->sc->c.peer);
        /* NCCL's handle buffer may be gone by now: its state slot is not touched */
        send_comm_free(st->sc);
        free(st);
        st = next;
    }
}

/* ------------------------------------------------------------ accept */
enum accept_stage {
    AS_TCP_ACCEPT,
    AS_RECV_HELLO,
    AS_SEND_REPLY,
    AS_CM,
    AS_CM_FLUSH,
    AS_RECV_READY,
    AS_WARMUP,
    AS_SEND_WARMED
};

static const char *const accept_stage_name[] = {
    [AS_TCP_ACCEPT] = "accepting the TCP connection",
    [AS_RECV_HELLO] = "setting up the QPs",
    [AS_SEND_REPLY] = "sending the reply",
    [AS_CM] = "accepting the QPs through rdma_cm",
    [AS_CM_FLUSH] = "connecting the flush loopback",
    [AS_RECV_READY] = "waiting for the ready message",
    [AS_WARMUP] = "waiting for the sender's warm-up SEND on every QP",
    [AS_SEND_WARMED] = "confirming the warm-up"};

struct accept_state {
    struct recv_comm *rc;
    enum accept_stage stage;
    int fd;
    char peer[ERDMA_PEER_LEN];
    uint64_t deadline;
    struct wire_conn_msg msg;
    size_t io_done;
    uint32_t cm_token; /* rdma_cm mode: what our requests must carry (from the listen) */
    struct port_wait port;
};

static void recv_comm_release(struct conn *c) {
    struct recv_comm *rc = (struct recv_comm *)c; /* the conn is its first member */
    qp_destroy(&rc->flush_qp);
    cm_flush_release(rc);
    conn_destroy_common(&rc->c);
    free(rc);
}

static void recv_comm_free(struct recv_comm *rc) {
    if (rc) conn_release(&rc->c, recv_comm_release);
}

/* As net_ib: GPU memory reached through peer memory or through dma-buf is flushed. */
static bool flush_wanted(const struct erdma_device *dev) {
    if (param_int(P_ERDMA_FORCE_FLUSH)) return true;
    return (dev->gdr || dev->dmabuf) && !param_int(P_GDR_FLUSH_DISABLE);
}

/* The flush QP reads from our own memory: connected to itself (GID mode only). */
static int flush_qp_setup(struct recv_comm *rc, struct erdma_device *dev) {
    int ret = qp_create(dev, rc->c.cq, ERDMA_FIFO_DEPTH * 2, 1, QP_ACCESS_FLUSH, &rc->flush_qp);
    if (ret) return ret;
    struct qp_params qpp;
    qp_params_from_env(&qpp, -1);
    ret = qp_connect_gid(dev, &rc->flush_qp, rc->flush_qp.qp->qp_num, dev->gid.raw, dev->active_mtu,
                         &qpp, "itself (flush loopback)");
    if (!ret) rc->flush_ready = true;
    return ret;
}

static int recv_comm_setup(struct accept_state *as, struct erdma_device *dev) {
    struct wire_conn_msg *m = &as->msg;
    struct recv_comm *rc = comm_zalloc(sizeof(*rc));
    if (!rc) return -ENOMEM;
    as->rc = rc;
    rc->c.base.kind = COMM_RECV;
    int ret = conn_alloc_common(&rc->c, dev, m->nqps, RECV_CTRL_LEN(m->nqps), RECV_CTRL_PEER_LEN);
    if (ret) return ret;
    rc->c.fd = as->fd;
    as->fd = -1;
    snprintf(rc->c.peer, sizeof(rc->c.peer), "%s", as->peer);
    rc->rec_area = (struct wire_record *)((char *)rc->c.ctrl + RECV_CTRL_RECORDS);
    rc->cts = (struct wire_cts *)((char *)rc->c.ctrl + RECV_CTRL_CTS);
    rc->flush_buf = (uint8_t *)rc->c.ctrl + RECV_CTRL_FLUSH;
    rc->ring = (struct wire_record *)((char *)rc->c.ctrl + RECV_CTRL_RING);
    rc->c.split = m->split;
    rc->cts_batch = (int)param_int(P_ERDMA_CTS_BATCH);
    rc->c.inline_cts = param_int(P_IB_USE_INLINE) != 0;
    for (int q = 0; q < m->nqps; q++)
        rc->next_seq[q] = rc->c.split ? 0 : (uint32_t)q;
    rc->c.completion = (m->completion == COMPLETION_SEND || dev->completion == COMPLETION_SEND)
                           ? COMPLETION_SEND
                           : COMPLETION_IMM;
    rc->c.remote_ctrl_addr = m->ctrl_addr;
    rc->c.remote_ctrl_rkey = m->ctrl_rkey;
    uint32_t mm = m->max_msg_sz < dev->max_msg_sz ? m->max_msg_sz : dev->max_msg_sz;
    rc->c.max_msg = mm < MAX_MSG_CAP ? mm : MAX_MSG_CAP;

    struct wire_conn_msg reply;
    memset(&reply, 0, sizeof(reply));
    if (dev->connect_mode == CONNECT_GID) {
        struct qp_params qpp;
        qp_params_for_receiver(&qpp, m->qos_set == 1, m->tc, m->sl & 0xf);
        enum ibv_mtu mtu = m->mtu < dev->active_mtu ? (enum ibv_mtu)m->mtu : dev->active_mtu;
        for (int i = 0; i < rc->c.nqps; i++) {
            ret = qp_create(dev, rc->c.cq, conn_sq_depth(dev, false), ERDMA_RQ_DEPTH,
                            QP_ACCESS_PEER, &rc->c.qps[i]);
            if (ret) return ret;
            reply.qpn[i] = rc->c.qps[i].qp->qp_num;
        }
        /* receives must be posted before the peer can send */
        ret = p2p_recv_post_initial(rc);
        if (ret) return ret;
        for (int i = 0; i < rc->c.nqps; i++) {
            ret = qp_connect_gid(dev, &rc->c.qps[i], m->qpn[i], m->gid, mtu, &qpp, rc->c.peer);
            if (ret) return ret;
        }
        if (flush_wanted(dev)) {
            ret = flush_qp_setup(rc, dev);
            if (ret) return ret;
        }
    }
    reply.nonce = m->nonce;
    reply.nqps = m->nqps;
    reply.completion = (uint8_t)rc->c.completion;
    reply.connect_mode = (uint8_t)dev->connect_mode;
    reply.mtu = (uint8_t)dev->active_mtu;
    reply.split = m->split;
    memcpy(reply.gid, dev->gid.raw, 16);
    reply.lid = dev->lid;
    reply.ctrl_addr = (uintptr_t)rc->rec_area;
    reply.ctrl_rkey = rc->c.peer_mr->rkey;
    reply.max_msg_sz = dev->max_msg_sz;
    reply.cm_token = as->cm_token;
    wire_msg_seal(&reply, MSG_REPLY);
    *m = reply;
    return 0;
}

static void accept_state_free(struct accept_state *as) {
    if (!as) return;
    if (as->fd >= 0) close(as->fd);
    recv_comm_free(as->rc);
    free(as);
}

/* Before a valid hello the peer is nobody we know (a port scan, a health probe, a stale or
 * foreign peer): drop it and keep waiting for the real one instead of failing NCCL's accept. */
static void drop_stray_peer(struct listen_comm *lc, int i, const char *why) {
    struct accept_state *as = lc->candidates[i];
    WARN("%s: rejecting connection from %s: %s; still waiting for the expected peer",
         lc->base.dev->name, as->peer, why);
    stats_event(lc->base.dev->index, STATS_ACCEPT_REJECT);
    accept_state_free(as);
    lc->candidates[i] = lc->candidates[--lc->ncandidates];
}

/* The most candidates served at once; past it the oldest is dropped for the newest. */
#define ACCEPT_MAX_CANDIDATES 32
/* The most clients one accept call takes from the backlog: a flood (a scanner completing
 * handshakes faster than we read them) must not keep NCCL's thread in one call. */
#define ACCEPT_PER_CALL 64

/* Reads what each candidate sent, dropping those that closed, sent a bad hello or let their
 * hello deadline pass. 1 with lc->pending set to (and taken out of the candidates) the first
 * whose hello is complete and valid, 0 none yet. */
static int candidates_read(struct listen_comm *lc, long hello_s) {
    struct erdma_device *dev = lc->base.dev;
    uint64_t t = now_ns();
    for (int i = 0; i < lc->ncandidates;) {
        struct accept_state *as = lc->candidates[i];
        char why[160];
        int rc = oob_recv_progress(as->fd, &as->msg, sizeof(as->msg), &as->io_done);
        if (rc < 0) {
            snprintf(why, sizeof(why), "it closed the connection before its hello (%s)",
                     strerror(-rc));
            drop_stray_peer(lc, i, why);
            continue;
        }
        if (rc == 0) {
            if (t > as->deadline) {
                snprintf(why, sizeof(why),
                         "it sent no complete hello within NCCL_ERDMA_HELLO_TIMEOUT=%lds (%zu "
                         "of %zu bytes)",
                         hello_s, as->io_done, sizeof(as->msg));
                drop_stray_peer(lc, i, why);
                continue;
            }
            i++;
            continue;
        }
        rc = wire_msg_check(&as->msg, MSG_HELLO, why, sizeof(why));
        if (!rc && as->msg.nonce != lc->nonce) {
            snprintf(why, sizeof(why), "it used a stale handle (from an earlier listen)");
            rc = -EPROTO;
        }
        if (!rc && as->msg.connect_mode != dev->connect_mode) {
            snprintf(why, sizeof(why), "it connects in %s mode, we listen in %s mode",
                     as->msg.connect_mode == CONNECT_GID ? "GID" : "rdma_cm",
                     dev->connect_mode == CONNECT_GID ? "GID" : "rdma_cm");
            rc = -EPROTO;
        }
        if (rc) {
            drop_stray_peer(lc, i, why);
            continue;
        }
        /* from here on the peer is known: the rest of the handshake gets the full timeout */
        lc->candidates[i] = lc->candidates[--lc->ncandidates];
        as->deadline = t + (uint64_t)param_int(P_ERDMA_CONNECT_TIMEOUT) * 1000000000ull;
        lc->pending = as;
        return 1;
    }
    return 0;
}

/* Every accepted socket is read at once, each with a short hello deadline of its own
 * (NCCL_ERDMA_HELLO_TIMEOUT), so idle clients never delay the peer queued behind them: a
 * real peer sends its hello right after its TCP connect. 1 with lc->pending set to a
 * candidate whose hello is valid, 0 none yet, -errno when the listening socket fails. */
static int accept_candidates(struct listen_comm *lc) {
    long hello_s = param_int(P_ERDMA_HELLO_TIMEOUT);
    if (hello_s > param_int(P_ERDMA_CONNECT_TIMEOUT)) hello_s = param_int(P_ERDMA_CONNECT_TIMEOUT);
    if (!lc->candidates) {
        lc->candidates = calloc(ACCEPT_MAX_CANDIDATES, sizeof(*lc->candidates));
        if (!lc->candidates) return -ENOMEM;
    }
    int found = 0;
    for (int taken = 0; taken < ACCEPT_PER_CALL; taken++) {
        struct sockaddr_in peer;
        int fd = -1;
        int rc = oob_accept(lc->fd, &fd, &peer);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (rc == 2) { /* a client gone before we took it (counts against this call) */
            INFO(NCCL_NET,
                 "%s: a client of the listening socket failed before it was accepted "
                 "(%s): skipped",
                 lc->base.dev->name, strerror(errno)); /* errno: accept4's, just returned */
            continue;
        }
        struct accept_state *as = calloc(1, sizeof(*as));
        if (!as) {
            close(fd);
            return -ENOMEM;
        }
        as->fd = fd;
        oob_format(&peer, as->peer, sizeof(as->peer));
        as->stage = AS_RECV_HELLO;
        as->deadline = now_ns() + (uint64_t)hello_s * 1000000000ull;
        /* Full: read what the candidates sent before dropping one, so that a burst of
         * silent clients right behind the real peer cannot push out its waiting hello. */
        if (lc->ncandidates == ACCEPT_MAX_CANDIDATES) found = candidates_read(lc, hello_s);
        if (lc->ncandidates == ACCEPT_MAX_CANDIDATES) {
            int oldest = 0;
            for (int i = 1; i < lc->ncandidates; i++)
                if (lc->candidates[i]->deadline < lc->candidates[oldest]->deadline) oldest = i;
            drop_stray_peer(lc, oldest, "too many clients are connecting without a hello");
        }
        lc->candidates[lc->ncandidates++] = as;
        if (found) return 1; /* the rest of the backlog waits for the next call */
    }
    return candidates_read(lc, hello_s);
}

static int accept_step(struct listen_comm *lc, struct accept_state *as) {
    struct erdma_device *dev = lc->base.dev;
    char why[160];
    int rc;
    switch (as->stage) {
    case AS_TCP_ACCEPT: /* candidates are accepted by accept_candidates() */
        return -ENOTRECOVERABLE;
    case AS_RECV_HELLO: /* complete and valid */
        /* the QPs wait for a port that can carry them; nothing of ours exists yet */
        if (!port_ready(dev, &as->port, "the connection from", as->peer)) return 0;
        if (dev->connect_mode == CONNECT_RDMACM && ++lc->last_token == 0) lc->last_token = 1;
        as->cm_token = lc->last_token;
        rc = recv_comm_setup(as, dev);
        if (rc) return rc;
        as->stage = AS_SEND_REPLY;
        as->io_done = 0;
        /* fall through */
    case AS_SEND_REPLY:
        rc = oob_send_progress(as->rc->c.fd, &as->msg, sizeof(as->msg), &as->io_done);
        if (rc <= 0) return rc;
        as->stage = dev->connect_mode == CONNECT_RDMACM ? AS_CM : AS_RECV_READY;
        as->io_done = 0;
        memset(&as->msg, 0, sizeof(as->msg));
        if (as->stage == AS_RECV_READY) goto recv_ready;
        /* fall through */
    case AS_CM:
        /* The sender says nothing on the socket until its QPs are up: an end there is a sender
         * that died or gave up after our reply, not one to wait NCCL_ERDMA_CONNECT_TIMEOUT for. */
        if (oob_peer_hung_up(as->rc->c.fd)) {
            WARN("%s: %s closed the connection after our reply, before its rdma_cm requests "
                 "connected: its process exited or it gave up (its log says why)",
                 dev->name, as->peer);
            return -ECONNRESET;
        }
        rc = cm_accept_progress(lc, as->rc, lc->nonce, as->cm_token);
        if (rc <= 0) return rc;
        as->stage = AS_RECV_READY;
        if (flush_wanted(dev)) {
            rc = cm_flush_start(as->rc);
            if (rc) return rc;
            as->stage = AS_CM_FLUSH;
        }
        /* fall through */
    case AS_CM_FLUSH:
        if (as->stage == AS_CM_FLUSH) { /* bounded by the handshake's deadline */
            rc = cm_flush_progress(as->rc);
            if (rc <= 0) return rc;
        }
        as->stage = AS_RECV_READY;
        as->io_done = 0;
        /* fall through */
    case AS_RECV_READY:
    recv_ready:
        rc = oob_recv_progress(as->rc->c.fd, &as->msg, sizeof(as->msg), &as->io_done);
        if (rc <= 0) return rc;
        rc = wire_msg_check(&as->msg, MSG_READY, why, sizeof(why));
        if (!rc && as->msg.nonce != lc->nonce) {
            snprintf(why, sizeof(why), "it is for another connection (nonce differs)");
            rc = -EPROTO;
        }
        if (rc) {
            WARN("%s: bad ready message from %s: %s", dev->name, as->peer, why);
            return rc;
        }
        if (dev->connect_mode != CONNECT_RDMACM) return 1;
        as->stage = AS_WARMUP;
        /* fall through */
    case AS_WARMUP:
        /* After its ready message the sender waits, silent, for our confirmation: an end on
         * the socket is a sender that died or gave up, whose missing warm-ups never come. A
         * killed sender's rdma_cm disconnect races its socket's end, and the data path's health
         * check may see it first (-ECONNRESET): either way the user is told the same thing. */
        rc = oob_peer_hung_up(as->rc->c.fd) ? -ECONNRESET : p2p_recv_warmup_done(as->rc);
        if (rc == -ECONNRESET) {
            WARN("%s: %s closed the connection after its ready message, before its warm-up "
                 "SENDs arrived: its process exited or it gave up (its log says why)",
                 dev->name, as->peer);
            return rc;
        }
        if (rc <= 0) return rc;
        memset(&as->msg, 0, sizeof(as->msg));
        as->msg.nonce = lc->nonce;
        wire_msg_seal(&as->msg, MSG_WARMED);
        as->io_done = 0;
        as->stage = AS_SEND_WARMED;
        /* fall through */
    case AS_SEND_WARMED:
        return oob_send_progress(as->rc->c.fd, &as->msg, sizeof(as->msg), &as->io_done);
    }
    return -ENOTRECOVERABLE;
}

int erdma_accept(void *listen_comm, void **recv_comm) {
    struct listen_comm *lc = listen_comm;
    *recv_comm = NULL;
    if (erdma_forked) return erdma_forked_refuse("accept");
    if (!lc || lc->base.kind != COMM_LISTEN) {
        WARN("accept: not a listen comm (%p)", listen_comm);
        return -EINVAL;
    }
    if (!lc->pending) {
        int rc = accept_candidates(lc);
        if (rc < 0) {
            WARN("%s: accept on its listening socket failed: %s%s", lc->base.dev->name,
                 strerror(-rc),
                 rc == -EMFILE || rc == -ENFILE
                     ? ": out of file descriptors; raise the limit (ulimit -n; in Kubernetes "
                       "the container runtime's LimitNOFILE)"
                     : "");
            return rc;
        }
        if (rc == 0) return 0;
    }
    struct accept_state *as = lc->pending;
    int rc = accept_step(lc, as);
    bool late = rc == 0 && now_ns() > as->deadline; /* one reading for both messages */
    if (late && as->port.why) {
        WARN("%s: connection from %s did not complete within NCCL_ERDMA_CONNECT_TIMEOUT=%lds: "
             "%s; check the link of %s",
             lc->base.dev->name, as->peer, param_int(P_ERDMA_CONNECT_TIMEOUT), as->port.why,
             device_netdev_name(lc->base.dev));
        rc = -ETIMEDOUT;
    } else if (late) {
        WARN("%s: connection from %s did not complete within NCCL_ERDMA_CONNECT_TIMEOUT=%lds "
             "(stopped %s)",
             lc->base.dev->name, as->peer, param_int(P_ERDMA_CONNECT_TIMEOUT),
             accept_stage_name[as->stage]);
        rc = -ETIMEDOUT;
    }
    if (rc < 0) {
        if (rc != -EPROTO && rc != -ETIMEDOUT)
            WARN("%s: accept from %s failed: %s", lc->base.dev->name, as->peer, strerror(-rc));
        accept_state_free(as);
        lc->pending = NULL;
        return rc;
    }
    if (rc == 1) {
        *recv_comm = as->rc;
        erdma_object_opened();
        stats_conn_open(&as->rc->c.stats, lc->base.dev->index, STATS_RECV, as->rc->c.peer);
        stats_event(lc->base.dev->index, STATS_ACCEPT);
        as->rc = NULL;
        accept_state_free(as);
        lc->pending = NULL;
    }
    return 0;
}

/* ------------------------------------------------------------ close */
int erdma_close_listen(void *listen_comm) {
    struct listen_comm *lc = listen_comm;
    if (erdma_forked) return erdma_forked_skip("closeListen");
    if (!lc) return 0;
    if (lc->base.kind != COMM_LISTEN) return -EINVAL;
    accept_state_free(lc->pending);
    for (int i = 0; i < lc->ncandidates; i++)
        accept_state_free(lc->candidates[i]);
    free(lc->candidates);
    if (lc->base.dev->connect_mode == CONNECT_RDMACM) cm_close_listen(lc);
    if (lc->fd >= 0) close(lc->fd);
    lc->base.kind = 0;
    free(lc);
    erdma_object_closed();
    return 0;
}

int erdma_close_send(void *send_comm) {
    struct send_comm *sc = send_comm;
    if (erdma_forked) return erdma_forked_skip("closeSend");
    if (!sc) return 0;
    if (sc->c.base.kind != COMM_SEND) return -EINVAL;
    p2p_prof_close(&sc->c); /* requests still in flight: their events end here */
    sc->c.base.kind = 0;
    send_comm_free(sc);
    erdma_object_closed();
    return 0;
}

int erdma_close_recv(void *recv_comm) {
    struct recv_comm *rc = recv_comm;
    if (erdma_forked) return erdma_forked_skip("closeRecv");
    if (!rc) return 0;
    if (rc->c.base.kind != COMM_RECV) return -EINVAL;
    p2p_prof_close(&rc->c); /* requests still in flight: their events end here */
    rc->c.base.kind = 0;
    recv_comm_free(rc);
    erdma_object_closed();
    return 0;
}
