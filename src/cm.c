/* rdma_cm connection path (iWARP): filled in by the iWARP work. */
#include "conn.h"
#include "log.h"

#include <errno.h>

int cm_listen(struct listen_comm *lc) {
    WARN("%s: rdma_cm connections are not implemented yet", lc->base.dev->name);
    return -EOPNOTSUPP;
}

void cm_close_listen(struct listen_comm *lc) {}

int cm_connect_progress(struct send_comm *sc, const struct sockaddr_in *dst, uint64_t nonce,
                        int *stage, const struct qp_params *qpp) {
    return -EOPNOTSUPP;
}

int cm_accept_progress(struct listen_comm *lc, struct recv_comm *rc, uint64_t nonce) {
    return -EOPNOTSUPP;
}
