/*
 * libFuzzer target for every parser of bytes that come from the network
 * (src/wire.c): the listen handle NCCL ships through its bootstrap, the
 * out-of-band connection messages (HELLO, REPLY, READY) and the completion
 * records the peer RDMA-writes. The first input byte picks the parser; the
 * rest are the peer's bytes, copied into an exactly sized heap buffer so that
 * AddressSanitizer sees any read past what the peer sent.
 *
 * rdma_cm private data is checked inline in cm.c (accept_request) and needs a
 * live rdma_cm event to reach: it is not fuzzed here (see tests/fuzz/README.md).
 */
#include "wire.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A sealed message or handle with the fuzzer's bytes laid over its fields: reaches the
 * checks behind the checksum, which random bytes alone almost never pass. */
static void overlay(void *dst, size_t dstlen, const uint8_t *data, size_t size) {
    memcpy(dst, data, size < dstlen ? size : dstlen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char why[160];
    if (size < 1) return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    if (sel >= 0xf0) { /* rdma_cm private data of a connect request, any length */
        int qp = -1;
        uint64_t nonce = 0;
        uint32_t token = 0;
        if (size >= 16) memcpy(&nonce, data + 8, 8); /* let some inputs reach later checks */
        if (size >= 20) memcpy(&token, data + 16, 4);
        if (wire_cm_private_check(size ? data : NULL, size, nonce, token, 1 + (sel & 0x0f), &qp,
                                  why, sizeof(why)) == 0 &&
            (qp < 0 || qp > (sel & 0x0f)))
            abort(); /* an accepted record names a QP of this connection */
        return 0;
    }
    switch (sel % 8) {
    case 0: { /* raw handle bytes, as connect() reads them */
        if (size < sizeof(struct wire_handle)) return 0;
        struct wire_handle *h = malloc(sizeof(*h));
        memcpy(h, data, sizeof(*h));
        if (wire_handle_check(h, why, sizeof(why)) == 0) {
            /* a handle that passes names an IPv4 listener and a known mode */
            if (h->addr.sin_family != AF_INET || h->addr.sin_port == 0) abort();
        }
        why[sizeof(why) - 1] = 0;
        free(h);
        break;
    }
    case 1: { /* handle fields with a valid seal: the checks after the checksum */
        struct wire_handle h;
        memset(&h, 0, sizeof(h));
        overlay(&h, sizeof(h), data, size);
        wire_handle_seal(&h);
        (void)wire_handle_check(&h, why, sizeof(why));
        break;
    }
    case 2:
    case 3:
    case 4: { /* raw connection message of each type */
        if (size < sizeof(struct wire_conn_msg)) return 0;
        struct wire_conn_msg *m = malloc(sizeof(*m));
        memcpy(m, data, sizeof(*m));
        enum wire_msg_type t = (enum wire_msg_type)(sel % 8 - 1); /* HELLO, REPLY, READY */
        if (wire_msg_check(m, t, why, sizeof(why)) == 0 && t != MSG_READY &&
            (m->nqps < 1 || m->nqps > ERDMA_MAX_QPS))
            abort(); /* a message that passes must carry a usable QP count */
        free(m);
        break;
    }
    case 5: { /* message fields with a valid seal */
        struct wire_conn_msg m;
        memset(&m, 0, sizeof(m));
        overlay(&m, sizeof(m), data, size);
        enum wire_msg_type t = (enum wire_msg_type)(1 + (sel >> 3) % 3);
        wire_msg_seal(&m, t);
        if (wire_msg_check(&m, t, why, sizeof(why)) == 0 && t != MSG_READY &&
            (m.nqps < 1 || m.nqps > ERDMA_MAX_QPS || m.ctrl_addr == 0))
            abort();
        break;
    }
    case 6:
    case 7: { /* completion record against what the receiver posted */
        if (size < sizeof(struct wire_record) + 8) return 0;
        struct wire_record *r = malloc(sizeof(*r));
        memcpy(r, data, sizeof(*r));
        data += sizeof(*r);
        uint32_t seq;
        memcpy(&seq, data, 4);
        int nposted = 1 + data[4] % ERDMA_MAX_RECVS;
        uint64_t *posted = malloc(sizeof(uint64_t) * (size_t)nposted);
        for (int i = 0; i < nposted; i++)
            posted[i] = (uint64_t)data[5 + i % 3] << (8 * (i % 5));
        if (sel % 8 == 7) r->seq = seq; /* reach the size checks */
        if (wire_record_check(r, seq, nposted, posted, why, sizeof(why)) == 0) {
            for (int i = 0; i < nposted; i++)
                if (r->sizes[i] > posted[i]) abort(); /* never more than the buffer holds */
        }
        free(posted);
        free(r);
        break;
    }
    }
    return 0;
}
