/*
 * Everything that crosses the network outside RDMA payloads: the listen
 * handle NCCL ships through its bootstrap, the out-of-band connection
 * messages, the clear-to-send FIFO entries and the completion records.
 * Every parser of peer bytes lives in wire.c and validates before use.
 */
#ifndef ERDMA_WIRE_H
#define ERDMA_WIRE_H

#include "device.h"
#include "nccl_net_abi.h"

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC 0x65524d41u /* "eRMA" */
/* 2: buffer-major clear-to-send FIFO; 3: MSG_WARMED; 4: the rdma_cm listener's address in the
 * handle, the accept's token in the reply and the rdma_cm private data */
#define WIRE_VERSION     4
#define ERDMA_MAX_QPS    16
#define ERDMA_FIFO_DEPTH NCCL_NET_MAX_REQUESTS
/* The smallest max_msg_sz a peer may announce. Every RDMA device allows far more (eRDMA,
 * rxe and siw 2 GiB); a tiny value would split one message into more work requests than a
 * send queue holds, and the send could never be posted. */
#define WIRE_MIN_MSG_SZ (1u << 20)

/* NCCL treats the handle as opaque bytes; ours must fit its 128. */
struct wire_handle {
    uint32_t magic;
    uint16_t version;
    uint8_t connect_mode;
    uint8_t reserved;
    uint64_t nonce;          /* identifies one listen comm: a stale handle fails fast */
    struct sockaddr_in addr; /* TCP listener */
    uint16_t cm_port;        /* rdma_cm listener (network order), 0 in GID mode */
    uint16_t reserved2;
    /* the rdma_cm listener's address: the device's own, which the TCP listener's is not
     * when NCCL_SOCKET_IFNAME names another interface */
    struct in_addr cm_ip;
    uint32_t reserved3;
    uint32_t checksum; /* over everything above */
};
_Static_assert(sizeof(struct wire_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");
_Static_assert(sizeof(struct wire_handle) == offsetof(struct wire_handle, checksum) + 4,
               "no padding after the checksum: every byte of a handle is checked");

/* WARMED (receiver -> sender, rdma_cm mode): every warm-up SEND has arrived. */
enum wire_msg_type { MSG_HELLO = 1, MSG_REPLY = 2, MSG_READY = 3, MSG_WARMED = 4 };

/* HELLO (sender -> receiver) and REPLY (receiver -> sender). */
struct wire_conn_msg {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t length; /* sizeof(struct wire_conn_msg) */
    uint32_t checksum;
    uint64_t nonce;
    uint8_t nqps;
    uint8_t completion; /* enum completion_mode */
    uint8_t connect_mode;
    uint8_t mtu; /* enum ibv_mtu */
    uint8_t split;
    uint8_t tc;      /* HELLO: the sender's traffic class and service level, which the */
    uint8_t sl;      /* receiver's QPs adopt as net_ib's do (valid when qos_set is 1; */
    uint8_t qos_set; /* older senders leave all three 0) */
    uint32_t qpn[ERDMA_MAX_QPS];
    uint8_t gid[16];
    uint16_t lid;
    uint16_t reserved2;
    uint32_t ctrl_rkey; /* sender: its FIFO; receiver: its record area */
    uint64_t ctrl_addr;
    uint32_t max_msg_sz;
    uint32_t cm_token; /* REPLY in rdma_cm mode: this accept's own, for its rdma_cm requests */
};

/* Written by the receiver into the sender's FIFO slot: one entry per buffer. */
struct wire_cts {
    uint64_t addr;
    uint64_t size;
    uint32_t rkey;
    int32_t tag;
    uint16_t nreqs;
    uint16_t reserved;
    uint32_t seq; /* slot sequence + 1: a stale or unwritten entry never matches */
};
_Static_assert(sizeof(struct wire_cts) == 32, "cts entry layout");

/* Sent by the sender when a slot's payload is placed (write-with-imm target or SEND). */
struct wire_record {
    uint32_t seq;
    uint16_t n;
    uint16_t reserved;
    uint64_t sizes[ERDMA_MAX_RECVS];
};
_Static_assert(sizeof(struct wire_record) <= ERDMA_MAX_INLINE, "record must fit inline");

/* rdma_cm private data of a connect request: which pending accept and which of its QPs. The
 * listen's nonce alone let requests of an earlier accept on the same listen (a peer that gave
 * up, its requests still queued) take the next accept's QPs: the accept's token says whose they
 * are. */
struct wire_cm_private {
    uint32_t magic;
    uint16_t qp_index;
    uint16_t nqps;
    uint64_t nonce;
    uint32_t token;
    uint32_t reserved;
};

uint32_t wire_checksum(const void *data, size_t len);
void wire_handle_seal(struct wire_handle *h);
/* 0, or -EBADMSG with a reason in why (a garbage or foreign handle). */
int wire_handle_check(const struct wire_handle *h, char *why, int whylen);
void wire_msg_seal(struct wire_conn_msg *m, enum wire_msg_type type);
/* Validates a message read from the peer: magic, version, type, length, checksum, counts. */
int wire_msg_check(const struct wire_conn_msg *m, enum wire_msg_type type, char *why, int whylen);
/* Validates rdma_cm private data (len bytes, possibly NULL) against the pending accept:
 * 0 and the QP index in *qp_index, or -EPROTO with a reason. */
int wire_cm_private_check(const void *data, size_t len, uint64_t nonce, uint32_t token, int nqps,
                          int *qp_index, char *why, int whylen);
/* Validates a completion record against what was posted. */
int wire_record_check(const struct wire_record *r, uint32_t seq, int nposted,
                      const uint64_t *posted_sizes, char *why, int whylen);

#endif
