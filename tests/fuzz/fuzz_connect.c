/*
 * libFuzzer target over connection setup (conn.c, oob.c, wire.c as conn.c uses them)
 * with a scripted peer on the out-of-band TCP socket, over the fake verbs provider.
 * Byte 0 picks the side we play:
 *   even: we connect (erdma_connect) to a listener the fuzzer owns; it answers our
 *         HELLO with its REPLY (raw bytes, or a plausible REPLY with fuzzed fields and
 *         a valid seal), maybe cut short, maybe followed by anything;
 *   odd:  we listen and accept (erdma_accept); the fuzzer connects and sends its HELLO
 *         and READY the same way, and may go silent or hang up at any point.
 * Checked: nothing crashes, a comm that comes out is well formed, and once the peer
 * hangs up every connect/accept ends and close leaves no QP, CQ or registration.
 * rdma_cm private data is not reached: the fake has no rdma_cm (fuzz_wire covers its
 * parser, wire_cm_private_check).
 */
#define _GNU_SOURCE
#include "comm.h"
#include "conn.h"
#include "fake_verbs.h"
#include "log.h"
#include "mr_cache.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define STEPS 24

struct input {
    const uint8_t *p;
    size_t left;
};

static uint8_t u8(struct input *in) {
    if (!in->left) return 0;
    in->left--;
    return *in->p++;
}

static int peer_listen_fd = -1;
static struct sockaddr_in peer_addr;

static void quiet_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...) {}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    erdma_log_set(getenv("FUZZ_VERBOSE") ? NULL : quiet_logger);
    const char *env[] = {"NCCL_ERDMA_CONNECT_TIMEOUT=1", NULL};
    if (fake_env_start(1, NULL, env) != 1) abort();
    erdma_log_set(getenv("FUZZ_VERBOSE") ? NULL : quiet_logger);
    peer_listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    peer_addr.sin_family = AF_INET;
    peer_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(peer_addr);
    if (bind(peer_listen_fd, (struct sockaddr *)&peer_addr, sizeof(peer_addr)) ||
        listen(peer_listen_fd, 16) ||
        getsockname(peer_listen_fd, (struct sockaddr *)&peer_addr, &len))
        abort();
    return 0;
}

/* What the peer says next: raw bytes, or a message of type t built from base with fuzzed
 * fields laid over it and sealed. Written with the fuzzer's cut (partial) or whole. */
static void peer_say(struct input *in, int fd, enum wire_msg_type t,
                     const struct wire_conn_msg *base) {
    uint8_t kind = u8(in);
    uint8_t buf[sizeof(struct wire_conn_msg) + 64];
    size_t len;
    if (kind % 4 == 0) { /* raw */
        len = u8(in) % sizeof(buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = u8(in);
    } else {
        struct wire_conn_msg m = *base;
        int fields = kind % 4 == 1 ? 0 : u8(in) % 6;
        for (int f = 0; f < fields; f++) {
            size_t off = u8(in) % sizeof(m);
            ((uint8_t *)&m)[off] = u8(in);
        }
        if (kind & 0x40) m.max_msg_sz = (uint32_t)u8(in) << (u8(in) % 32);
        wire_msg_seal(&m, t);
        if (kind & 0x80) m.type = u8(in); /* sealed, then one field changed */
        memcpy(buf, &m, sizeof(m));
        len = sizeof(m);
        if (kind & 0x20) len = u8(in) % len; /* cut short */
    }
    if (len) (void)!send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Closes with a reset: no TIME_WAIT on either end, so a million inputs never run the
 * loopback out of ports (a normal close on our side would leave one per input). */
static void close_rst(int fd) {
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

static void peer_read(int fd, void *buf, size_t len) {
    memset(buf, 0, len);
    (void)!recv(fd, buf, len, MSG_DONTWAIT);
}

static void fail_if_leaked(void) {
    if (fake_live_qps_cqs() != 0) abort();
    if (mr_cache_count(device_get(0)->mrs) != 0) abort();
}

static void check_comm(const struct conn *c) {
    if (c->nqps < 1 || c->nqps > ERDMA_MAX_QPS || c->max_msg < WIRE_MIN_MSG_SZ) abort();
}

/* We connect; the fuzzer accepts and answers. */
static void play_acceptor(struct input *in) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    struct wire_handle *h = (struct wire_handle *)handle;
    memset(handle, 0, sizeof(handle));
    h->connect_mode = CONNECT_GID;
    h->nonce = 0x5eed0000u + u8(in);
    h->addr = peer_addr;
    wire_handle_seal(h);
    void *sc = NULL;
    int fd = -1, rc = 0;
    struct wire_conn_msg hello, base;
    for (int i = 0; i < STEPS && fd < 0 && !rc; i++) {
        rc = erdma_connect(0, -1, handle, &sc);
        fd = accept4(peer_listen_fd, NULL, NULL, SOCK_CLOEXEC);
    }
    if (fd < 0) abort(); /* a TCP connect on loopback always arrives */
    for (int i = 0; i < 4 && !rc; i++)
        rc = erdma_connect(0, -1, handle, &sc);
    peer_read(fd, &hello, sizeof(hello));
    memset(&base, 0, sizeof(base));
    base.nonce = u8(in) % 8 ? h->nonce : hello.nonce + 1;
    base.nqps = hello.nqps;
    base.completion = u8(in) % 2;
    base.connect_mode = CONNECT_GID;
    base.mtu = IBV_MTU_1024;
    base.split = hello.split;
    memcpy(base.qpn, hello.qpn, sizeof(base.qpn)); /* our own QPs: the fake loops them back */
    memcpy(base.gid, hello.gid, 16);
    base.ctrl_addr = hello.ctrl_addr;
    base.ctrl_rkey = hello.ctrl_rkey;
    base.max_msg_sz = 1u << 30;
    peer_say(in, fd, MSG_REPLY, &base);
    for (int i = 0; i < STEPS && !rc && !sc; i++)
        rc = erdma_connect(0, -1, handle, &sc);
    if (sc) {
        check_comm(&((struct send_comm *)sc)->c);
        close_rst(fd);
        fd = -1;
        if (erdma_close_send(sc)) abort();
    } else if (!rc) {
        /* the peer went quiet: it hangs up now, and our connect must end */
        close_rst(fd);
        fd = -1;
        for (int i = 0; i < STEPS && !rc && !sc; i++)
            rc = erdma_connect(0, -1, handle, &sc);
        if (!rc && !sc) abort(); /* still waiting on a closed socket */
        if (sc && erdma_close_send(sc)) abort();
    }
    if (fd >= 0) close_rst(fd);
    fail_if_leaked();
}

/* We listen and accept; the fuzzer connects and speaks first. */
static void play_connector(struct input *in) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *rcomm = NULL;
    if (erdma_listen(0, handle, &lc)) abort();
    struct wire_handle h;
    memcpy(&h, handle, sizeof(h));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, (struct sockaddr *)&h.addr, sizeof(h.addr))) abort();
    struct wire_conn_msg base;
    memset(&base, 0, sizeof(base));
    base.nonce = u8(in) % 8 ? h.nonce : h.nonce ^ 1;
    base.nqps = 1 + u8(in) % 3;
    base.completion = u8(in) % 2;
    base.connect_mode = CONNECT_GID;
    base.mtu = IBV_MTU_1024;
    base.split = u8(in) % 2;
    for (int i = 0; i < ERDMA_MAX_QPS; i++)
        base.qpn[i] = u8(in);
    base.ctrl_addr = 0x10000;
    base.ctrl_rkey = 0x1234;
    base.max_msg_sz = 1u << 30;
    peer_say(in, fd, MSG_HELLO, &base);
    int rc = 0;
    for (int i = 0; i < STEPS && !rc && !rcomm; i++)
        rc = erdma_accept(lc, &rcomm);
    struct wire_conn_msg reply;
    peer_read(fd, &reply, sizeof(reply));
    struct wire_conn_msg ready;
    memset(&ready, 0, sizeof(ready));
    ready.nonce = h.nonce;
    if (u8(in) % 2) peer_say(in, fd, MSG_READY, &ready);
    for (int i = 0; i < STEPS && !rc && !rcomm; i++)
        rc = erdma_accept(lc, &rcomm);
    if (rcomm) {
        check_comm(&((struct recv_comm *)rcomm)->c);
        close_rst(fd);
        fd = -1;
        if (erdma_close_recv(rcomm)) abort();
        rcomm = NULL;
        rc = 1; /* done: no more accepts */
    }
    if (fd >= 0) close_rst(fd);
    for (int i = 0; i < 4 && !rc && !rcomm; i++) /* a stray that hung up is dropped */
        rc = erdma_accept(lc, &rcomm);
    if (rcomm && erdma_close_recv(rcomm)) abort();
    if (erdma_close_listen(lc)) abort();
    fail_if_leaked();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct input in = {data, size};
    if (u8(&in) % 2)
        play_connector(&in);
    else
        play_acceptor(&in);
    return 0;
}
