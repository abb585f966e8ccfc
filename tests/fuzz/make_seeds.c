/*
 * Writes the seed corpus of fuzz_wire into the directory given: one valid
 * instance of every format a peer sends, prefixed by the selector byte that
 * routes it to its parser in fuzz_wire.c. Run once; the output is committed.
 */
#include "wire.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

static void put(const char *dir, const char *name, uint8_t sel, const void *p, size_t len,
                const void *tail, size_t tail_len) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(&sel, 1, 1, f);
    fwrite(p, 1, len, f);
    if (tail) fwrite(tail, 1, tail_len, f);
    fclose(f);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    struct wire_handle h;
    memset(&h, 0, sizeof(h));
    h.connect_mode = CONNECT_GID;
    h.nonce = 0x1122334455667788ull;
    h.addr.sin_family = AF_INET;
    h.addr.sin_port = htons(40000);
    h.addr.sin_addr.s_addr = htonl(0x0a4d0001);
    wire_handle_seal(&h);
    put(dir, "handle-gid", 0, &h, sizeof(h), NULL, 0);
    put(dir, "handle-fields", 1, &h, sizeof(h), NULL, 0);
    h.connect_mode = CONNECT_RDMACM;
    h.cm_port = htons(40001);
    h.cm_ip.s_addr = htonl(0x0a4e0001);
    wire_handle_seal(&h);
    put(dir, "handle-rdmacm", 0, &h, sizeof(h), NULL, 0);

    struct wire_conn_msg m;
    memset(&m, 0, sizeof(m));
    m.nonce = h.nonce;
    m.nqps = 2;
    m.mtu = 3;
    m.qpn[0] = 17;
    m.qpn[1] = 18;
    m.ctrl_rkey = 0x1234;
    m.ctrl_addr = 0x7f0000001000ull;
    m.max_msg_sz = 1u << 30;
    wire_msg_seal(&m, MSG_HELLO);
    put(dir, "msg-hello", 2, &m, sizeof(m), NULL, 0);
    put(dir, "msg-fields", 5, &m, sizeof(m), NULL, 0);
    wire_msg_seal(&m, MSG_REPLY);
    put(dir, "msg-reply", 3, &m, sizeof(m), NULL, 0);
    struct wire_conn_msg ready;
    memset(&ready, 0, sizeof(ready));
    ready.nonce = h.nonce;
    wire_msg_seal(&ready, MSG_READY);
    put(dir, "msg-ready", 4, &ready, sizeof(ready), NULL, 0);

    struct wire_record r;
    memset(&r, 0, sizeof(r));
    r.seq = 5;
    r.n = 2;
    r.sizes[0] = 100;
    r.sizes[1] = 200;
    uint8_t tail[8] = {5, 0, 0, 0, 1, 0xff, 0xff, 0xff}; /* seq 5, 2 buffers posted */
    put(dir, "record", 6, &r, sizeof(r), tail, sizeof(tail));
    return 0;
}
