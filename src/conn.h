/* Connection establishment internals shared by conn.c and cm.c. */
#ifndef ERDMA_CONN_H
#define ERDMA_CONN_H

#include "comm.h"
#include "qp.h"

#include <netinet/in.h>

struct listen_comm {
    struct comm_base base;
    int fd;
    uint64_t nonce;
    struct sockaddr_in addr;
    struct rdma_event_channel *cm_ch; /* rdma_cm mode: listener events */
    struct rdma_cm_id *cm_id;
    struct sockaddr_in cm_addr;
    struct accept_state *pending;     /* the peer whose valid hello is being served */
    struct accept_state **candidates; /* accepted sockets still owing a hello */
    int ncandidates;
    uint32_t last_token; /* rdma_cm mode: the latest accept's token (1, 2, ...; never 0) */
};

uint64_t now_ns(void);
uint64_t now_coarse_ns(void);
/* The coarse clock as the data path last read it. Requests are stamped with it when posted
 * and completed (for the "longest in flight" counter) without a clock call on the critical
 * path of a message; idle polls of any comm and every new connection refresh it (p2p.c
 * conn_progress, conn_alloc_common), so it trails the clock by about an idle poll, well under
 * the coarse clock's own tick. Threads race on it harmlessly: readers allow for a step back. */
extern uint64_t erdma_clock_ns;
static inline uint64_t clock_cached_ns(void) {
    return __atomic_load_n(&erdma_clock_ns, __ATOMIC_RELAXED);
}
static inline void clock_refresh(void) {
    __atomic_store_n(&erdma_clock_ns, now_coarse_ns(), __ATOMIC_RELAXED);
}
/* Allocates the CQ and control region of a connection end; the peer's key covers only the
 * region's first peer_len bytes. */
int conn_alloc_common(struct conn *c, struct erdma_device *dev, int nqps, size_t ctrl_len,
                      size_t peer_len);
int conn_sq_depth(const struct erdma_device *dev, bool sender);

/* cm.c: rdma_cm listener and per-QP connections (iWARP, or forced rdmacm mode). */
int cm_listen(struct listen_comm *lc);
void cm_close_listen(struct listen_comm *lc);
/* Sender: start/progress the rdma_cm connects of every QP. 1 done, 0 pending, -errno. */
int cm_connect_progress(struct send_comm *sc, const struct sockaddr_in *dst, uint64_t nonce,
                        uint32_t token, int *stage);
/* Receiver: accept nqps rdma_cm connections carrying nonce and token. 1 done, 0 pending,
 * -errno. */
int cm_accept_progress(struct listen_comm *lc, struct recv_comm *rc, uint64_t nonce,
                       uint32_t token);
/* The flush loopback in rdma_cm mode: a QP connected to a QP of our own through the NIC.
 * Local only, so it completes within milliseconds; bounded by a 5 s deadline. */
int cm_flush_start(struct recv_comm *rc);
/* 1 when the loopback is up, 0 not yet, -errno. Never blocks. */
int cm_flush_progress(struct recv_comm *rc);
void cm_flush_release(struct recv_comm *rc);
/* Drains the comm's rdma_cm events: -ECONNRESET once the peer disconnected, else 0. */
int cm_poll_disconnect(struct conn *c);
/* Starts the graceful disconnect of every connected QP; returns how many will report it on
 * the comm's own event channel (0 without one). */
int cm_disconnect_start(struct conn *c);
/* Reads the comm's events without blocking; returns the disconnects still to come. */
int cm_disconnect_progress(struct conn *c, int pending);
/* Flush loopback for rdma_cm devices: connect a QP to ourselves through lc's listener. */

#endif
