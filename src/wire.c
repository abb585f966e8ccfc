/* Owns the byte formats exchanged with peers and their validation. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

uint32_t wire_checksum(const void *data, size_t len) {
    const uint8_t *p = data;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

void wire_handle_seal(struct wire_handle *h) {
    h->magic = WIRE_MAGIC;
    h->version = WIRE_VERSION;
    h->checksum = wire_checksum(h, offsetof(struct wire_handle, checksum));
}

int wire_handle_check(const struct wire_handle *h, char *why, int whylen) {
    if (h->magic != WIRE_MAGIC) {
        snprintf(why, whylen,
                 "not an eRDMA plugin handle (magic 0x%08x); was it made by "
                 "another NCCL network plugin?",
                 h->magic);
        return -EBADMSG;
    }
    if (h->version != WIRE_VERSION) {
        snprintf(why, whylen, "handle version %u, this plugin speaks %u: mixed plugin versions?",
                 h->version, WIRE_VERSION);
        return -EBADMSG;
    }
    if (h->checksum != wire_checksum(h, offsetof(struct wire_handle, checksum))) {
        snprintf(why, whylen, "handle checksum mismatch (corrupted in transit)");
        return -EBADMSG;
    }
    if (h->addr.sin_family != AF_INET || h->addr.sin_port == 0) {
        snprintf(why, whylen, "handle carries no IPv4 listener address");
        return -EBADMSG;
    }
    if (h->connect_mode != CONNECT_GID && h->connect_mode != CONNECT_RDMACM) {
        snprintf(why, whylen, "handle has unknown connect mode %u", h->connect_mode);
        return -EBADMSG;
    }
    if (h->connect_mode == CONNECT_RDMACM && (h->cm_port == 0 || h->cm_ip.s_addr == 0)) {
        snprintf(why, whylen, "rdma_cm handle without an rdma_cm address and port");
        return -EBADMSG;
    }
    return 0;
}

void wire_msg_seal(struct wire_conn_msg *m, enum wire_msg_type type) {
    m->magic = WIRE_MAGIC;
    m->version = WIRE_VERSION;
    m->type = (uint16_t)type;
    m->length = sizeof(*m);
    m->checksum = 0;
    m->checksum = wire_checksum(m, sizeof(*m));
}

int wire_msg_check(const struct wire_conn_msg *m, enum wire_msg_type type, char *why, int whylen) {
    struct wire_conn_msg copy;
    if (m->magic != WIRE_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x (not an eRDMA plugin peer?)", m->magic);
        return -EPROTO;
    }
    if (m->version != WIRE_VERSION) {
        snprintf(why, whylen, "peer speaks protocol version %u, we speak %u", m->version,
                 WIRE_VERSION);
        return -EPROTO;
    }
    if (m->length != sizeof(*m)) {
        snprintf(why, whylen, "message length %u, expected %zu", m->length, sizeof(*m));
        return -EPROTO;
    }
    if (m->type != type) {
        snprintf(why, whylen, "message type %u, expected %u", m->type, type);
        return -EPROTO;
    }
    copy = *m;
    copy.checksum = 0;
    if (wire_checksum(&copy, sizeof(copy)) != m->checksum) {
        snprintf(why, whylen, "message checksum mismatch");
        return -EPROTO;
    }
    if (type == MSG_READY || type == MSG_WARMED) return 0;
    if (m->nqps < 1 || m->nqps > ERDMA_MAX_QPS) {
        snprintf(why, whylen, "peer asks for %u QPs (1..%d allowed)", m->nqps, ERDMA_MAX_QPS);
        return -EPROTO;
    }
    if (m->completion > COMPLETION_SEND || m->connect_mode > CONNECT_RDMACM || m->split > 1) {
        snprintf(why, whylen, "peer sent unknown modes (completion %u, connect %u, split %u)",
                 m->completion, m->connect_mode, m->split);
        return -EPROTO;
    }
    if (m->connect_mode == CONNECT_GID && (m->mtu < IBV_MTU_256 || m->mtu > IBV_MTU_4096)) {
        snprintf(why, whylen, "peer MTU code %u is invalid", m->mtu);
        return -EPROTO;
    }
    if (m->ctrl_addr == 0) {
        snprintf(why, whylen, "peer sent no control region");
        return -EPROTO;
    }
    if (m->max_msg_sz < WIRE_MIN_MSG_SZ) {
        snprintf(why, whylen,
                 "peer's max message size %u is below the %u bytes any RDMA device "
                 "allows",
                 m->max_msg_sz, WIRE_MIN_MSG_SZ);
        return -EPROTO;
    }
    return 0;
}

int wire_record_check(const struct wire_record *r, uint32_t seq, int nposted,
                      const uint64_t *posted_sizes, char *why, int whylen) {
    if (r->seq != seq) {
        snprintf(why, whylen, "completion record for sequence %u, expected %u", r->seq, seq);
        return -EPROTO;
    }
    if (r->n != nposted) {
        snprintf(why, whylen, "completion record for %u buffers, %d were posted", r->n, nposted);
        return -EPROTO;
    }
    for (int i = 0; i < nposted; i++) {
        if (r->sizes[i] > posted_sizes[i]) {
            snprintf(why, whylen, "peer reports %llu bytes into buffer %d of %llu bytes",
                     (unsigned long long)r->sizes[i], i, (unsigned long long)posted_sizes[i]);
            return -EPROTO;
        }
    }
    return 0;
}

int wire_cm_private_check(const void *data, size_t len, uint64_t nonce, uint32_t token, int nqps,
                          int *qp_index, char *why, int whylen) {
    struct wire_cm_private p;
    if (!data || len < sizeof(p)) {
        snprintf(why, whylen, "%zu bytes of private data, %zu expected", data ? len : 0, sizeof(p));
        return -EPROTO;
    }
    memcpy(&p, data, sizeof(p));
    if (p.magic != WIRE_MAGIC) {
        snprintf(why, whylen, "private data magic 0x%08x (not an eRDMA plugin peer)", p.magic);
        return -EPROTO;
    }
    if (p.nonce != nonce) {
        snprintf(why, whylen, "it belongs to another listen (stale or foreign peer)");
        return -EPROTO;
    }
    if (p.token != token) {
        snprintf(why, whylen,
                 "it belongs to another accept on this listen (token %u, this one's %u): a "
                 "peer that gave up",
                 p.token, token);
        return -EPROTO;
    }
    if (p.nqps != nqps || p.qp_index >= p.nqps) {
        snprintf(why, whylen, "QP %u of %u, the handshake agreed on %d", p.qp_index, p.nqps, nqps);
        return -EPROTO;
    }
    *qp_index = p.qp_index;
    return 0;
}
