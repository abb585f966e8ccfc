/*
 * Connection setup (conn.c) and the out-of-band socket (oob.c) over the fake verbs
 * provider and real TCP on 127.0.0.1, with a scripted peer where a real one would
 * not misbehave.
 */
#define _GNU_SOURCE
#include "comm.h"
#include "conn.h"
#include "device.h"
#include "fake_verbs.h"
#include "net.h"
#include "oob.h"
#include "params.h"
#include "prof.h"
#include "reap.h"
#include "sysfs.h"
#include "unit_log.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static int setup(void **state) {
    unit_log_start();
    assert_int_equal(fake_env_start(1, NULL, NULL), 1);
    return 0;
}

static int teardown(void **state) {
    int leaked = fake_env_stop();
    erdma_log_set(NULL);
    assert_int_equal(leaked, 0);
    return 0;
}

/* ---- oob.c ---- */

static void test_ifname_match(void **state) {
    assert_true(oob_ifname_match("eth", "eth0"));
    assert_false(oob_ifname_match("=eth", "eth0"));
    assert_true(oob_ifname_match("=eth0,lo", "lo"));
    assert_false(oob_ifname_match("^eth", "eth1"));
    assert_true(oob_ifname_match("^eth", "lo"));
}

static void test_local_addr(void **state) {
    struct sockaddr_in a;
    assert_int_equal(oob_local_addr(device_get(0), &a), 0); /* the device's netdev address */
    assert_int_equal(ntohl(a.sin_addr.s_addr), INADDR_LOOPBACK);
    const char *lo[] = {"NCCL_SOCKET_IFNAME=lo", NULL};
    fake_env_stop();
    assert_int_equal(fake_env_start(1, NULL, lo), 1);
    assert_int_equal(oob_local_addr(device_get(0), &a), 0);
    assert_int_equal(ntohl(a.sin_addr.s_addr), INADDR_LOOPBACK);
    const char *none[] = {"NCCL_SOCKET_IFNAME=nosuchif", NULL};
    fake_env_stop();
    assert_int_equal(fake_env_start(1, NULL, none), 1);
    unit_log_count = 0;
    assert_int_equal(oob_local_addr(device_get(0), &a), -EADDRNOTAVAIL);
    assert_logged(NCCL_LOG_WARN, "nosuchif");
}

static void test_peer_alive(void **state) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(oob_peer_alive(sv[0]), 0);
    assert_int_equal(write(sv[1], "x", 1), 1); /* not a goodbye: a protocol error */
    assert_int_equal(oob_peer_alive(sv[0]), -EPROTO);
    char c;
    assert_int_equal(read(sv[0], &c, 1), 1);
    assert_int_equal(write(sv[1], "B", 1), 1); /* a goodbye: a normal close */
    assert_int_equal(oob_peer_alive(sv[0]), OOB_PEER_CLOSING);
    assert_int_equal(read(sv[0], &c, 1), 1);
    close(sv[1]);
    assert_int_equal(oob_peer_alive(sv[0]), -ECONNRESET);
    close(sv[0]);
}

/* During the handshake's quiet stages (the receiver waiting for rdma_cm requests or warm-ups,
 * the sender for rdma_cm to connect) a goodbye is a peer that gave up: its failed connect or
 * accept released the comm, which says goodbye and closes. Taken for a normal close, the byte
 * stayed peeked, hid the end behind it, and the survivor waited out the connect timeout. */
static void test_hung_up_after_goodbye(void **state) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    assert_int_equal(oob_peer_hung_up(sv[0]), 0); /* silence: still connecting */
    assert_int_equal(write(sv[1], "A", 1), 1);    /* the next message, early: left unread */
    assert_int_equal(oob_peer_hung_up(sv[0]), 0);
    char c;
    assert_int_equal(read(sv[0], &c, 1), 1);
    assert_int_equal(oob_goodbye_send(sv[1]), 0); /* it gave up ... */
    assert_int_equal(oob_peer_hung_up(sv[0]), -ECONNRESET);
    close(sv[1]); /* ... and closed */
    assert_int_equal(oob_peer_hung_up(sv[0]), -ECONNRESET);
    close(sv[0]);
}

/* A byte that is not the next message (or the start of one) must not hide an end behind it
 * either: a peer that wrote one stray byte and closed was seen as still there, and the
 * survivor waited out the connect timeout (120 s). Over TCP, as the handshake runs. */
static void test_hung_up_behind_a_stray_byte(void **state) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 1), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    int peer = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(peer, (struct sockaddr *)&a, sizeof(a)), 0);
    int fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    assert_int_equal(write(peer, "A", 1), 1);
    uint64_t until = now_ns() + 5000000000ull;
    while (!oob_peer_alive(fd) && now_ns() < until) /* the byte has arrived */
        usleep(1000);
    assert_int_equal(oob_peer_hung_up(fd), 0); /* early, or a stray: the peer is there */
    close(peer);
    int rc = 0;
    while (!rc && now_ns() < until) { /* its end follows the byte */
        rc = oob_peer_hung_up(fd);
        usleep(1000);
    }
    assert_int_equal(rc, -ECONNRESET);
    close(fd);
    close(lfd);
}

static void test_partial_io(void **state) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    char out[8] = "abcdefg", in[8] = {0};
    size_t sent = 0, got = 0;
    assert_int_equal(oob_recv_progress(sv[0], in, 8, &got), 0); /* nothing yet */
    assert_int_equal(send(sv[1], out, 3, 0), 3);
    assert_int_equal(oob_recv_progress(sv[0], in, 8, &got), 0);
    assert_int_equal(got, 3);
    assert_int_equal(oob_send_progress(sv[1], out + 3, 5, &sent), 1);
    assert_int_equal(oob_recv_progress(sv[0], in, 8, &got), 1);
    assert_memory_equal(in, out, 8);
    close(sv[1]);
    got = 0;
    assert_int_equal(oob_recv_progress(sv[0], in, 8, &got), -ECONNRESET);
    close(sv[0]);
}

/* ---- conn.c ---- */

static void test_connect_accept_and_close(void **state) {
    void *s, *r;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    struct send_comm *sc = s;
    struct recv_comm *rc = r;
    assert_int_equal(sc->c.base.kind, COMM_SEND);
    assert_int_equal(rc->c.base.kind, COMM_RECV);
    assert_int_equal(sc->c.max_msg, 1u << 30);
    assert_int_equal(sc->c.remote_ctrl_addr, (uintptr_t)rc->rec_area);
    assert_int_equal(rc->c.remote_ctrl_addr, (uintptr_t)sc->fifo);
    assert_int_equal(fake_recv_posted(rc->c.qps[0].qp), ERDMA_RQ_DEPTH);
    assert_ptr_equal(comm_device(s), device_get(0));
    assert_null(comm_device(&sc->c.fd)); /* not a comm */
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(erdma_close_send(NULL), 0);
}

/* A normal close says goodbye in GID mode too (rdma_cm mode always did): the peer's
 * out-of-band look reads a closing peer, not a dead one, whichever end closes first. */
static void test_close_says_goodbye(void **state) {
    void *s, *r;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    struct recv_comm *rc = r;
    assert_int_equal(oob_peer_alive(rc->c.fd), 0);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(oob_peer_alive(rc->c.fd), OOB_PEER_CLOSING);
    assert_int_equal(erdma_close_recv(r), 0);

    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    struct send_comm *sc = s;
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(oob_peer_alive(sc->c.fd), OOB_PEER_CLOSING);
    assert_int_equal(erdma_close_send(s), 0);
}

static void test_bad_handles(void **state) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *s = NULL;
    memset(handle, 0x5a, sizeof(handle));
    unit_log_count = 0;
    assert_int_equal(erdma_connect(0, -1, handle, &s), -EBADMSG);
    assert_logged(NCCL_LOG_WARN, "fake0", "invalid handle");
    struct wire_handle *h = (struct wire_handle *)handle;
    memset(handle, 0, sizeof(handle));
    h->connect_mode = CONNECT_RDMACM;
    h->addr.sin_family = AF_INET;
    h->addr.sin_port = htons(1);
    h->cm_port = htons(2);
    h->cm_ip.s_addr = htonl(INADDR_LOOPBACK);
    wire_handle_seal(h);
    assert_int_equal(erdma_connect(0, -1, handle, &s), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "NCCL_ERDMA_CONNECT_MODE");
    assert_int_equal(erdma_connect(7, -1, handle, &s), -EINVAL);
    assert_null(s);
}

/* A scripted acceptor: takes our HELLO, then hangs up. */
static void test_peer_hangs_up_during_handshake(void **state) {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    memset(handle, 0, sizeof(handle));
    struct wire_handle *h = (struct wire_handle *)handle;
    h->connect_mode = CONNECT_GID;
    h->nonce = 99;
    h->addr = a;
    wire_handle_seal(h);
    void *s = NULL;
    int fd = -1, rc = 0;
    for (int i = 0; i < 1000 && fd < 0 && !rc; i++) {
        rc = erdma_connect(0, -1, handle, &s);
        fd = accept(lfd, NULL, NULL);
    }
    assert_true(fd >= 0);
    struct wire_conn_msg hello;
    size_t got = 0;
    for (int i = 0; i < 1000 && got < sizeof(hello); i++) {
        assert_int_equal(erdma_connect(0, -1, handle, &s), 0);
        ssize_t n = recv(fd, (char *)&hello + got, sizeof(hello) - got, MSG_DONTWAIT);
        if (n > 0) got += (size_t)n;
    }
    char why[160];
    assert_int_equal(wire_msg_check(&hello, MSG_HELLO, why, sizeof(why)), 0);
    assert_int_equal(hello.nonce, 99);
    assert_int_equal(hello.max_msg_sz, 1u << 30);
    close(fd);
    unit_log_count = 0;
    rc = 0;
    for (int i = 0; i < 1000 && !rc; i++)
        rc = erdma_connect(0, -1, handle, &s);
    assert_int_equal(rc, -ECONNREFUSED);
    assert_logged(NCCL_LOG_WARN, "fake0", "closed the connection during the handshake");
    assert_null(s);
    close(lfd);
}

/* A stray client with a stale handle's HELLO is dropped; the real peer then connects. */
static void test_stale_hello_dropped(void **state) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *s = NULL, *r = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    struct wire_handle h;
    memcpy(&h, handle, sizeof(h));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&h.addr, sizeof(h.addr)), 0);
    struct wire_conn_msg m;
    memset(&m, 0, sizeof(m));
    m.nonce = h.nonce + 1;
    m.nqps = 1;
    m.mtu = IBV_MTU_1024;
    m.ctrl_addr = 0x1000;
    m.max_msg_sz = 1u << 30;
    wire_msg_seal(&m, MSG_HELLO);
    assert_int_equal(send(fd, &m, sizeof(m), 0), (ssize_t)sizeof(m));
    unit_log_count = 0;
    int rc = 0;
    for (int i = 0; i < 1000 && !UNIT_LOG_HAS(NCCL_LOG_WARN, "stale handle"); i++)
        assert_int_equal(erdma_accept(lc, &r), 0);
    assert_logged(NCCL_LOG_WARN, "fake0", "rejecting connection", "stale handle");
    assert_null(r);
    close(fd);
    uint64_t until = now_ns() + 10000000000ull;
    while (!rc && (!s || !r) && now_ns() < until) {
        if (!s) rc = erdma_connect(0, -1, handle, &s);
        if (!rc && !r) rc = erdma_accept(lc, &r);
    }
    assert_int_equal(rc, 0);
    assert_non_null(s);
    assert_non_null(r);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* A burst of silent clients (port scanners, health probes) right behind the real peer: the
 * candidates were full before its hello was read, and the oldest, the real peer, was dropped
 * for a probe (its connect failed: "closed the connection during the handshake"). */
static void test_probe_burst_behind_real_peer(void **state) {
    enum { PROBES = 40 }; /* more than the candidates served at once (32) */
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *s = NULL, *r = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    struct wire_handle h;
    memcpy(&h, handle, sizeof(h));
    int rc = 0;
    for (int i = 0; i < 50 && !rc && !s; i++) { /* the real peer connects and sends its hello */
        rc = erdma_connect(0, -1, handle, &s);
        usleep(1000);
    }
    assert_int_equal(rc, 0);
    assert_null(s); /* waiting for our reply */
    int fds[PROBES];
    for (int i = 0; i < PROBES; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&h.addr, sizeof(h.addr)), 0);
    }
    unit_log_count = 0;
    uint64_t until = now_ns() + 10000000000ull;
    while (!rc && (!s || !r) && now_ns() < until) {
        if (!r) rc = erdma_accept(lc, &r);
        if (!rc && !s) rc = erdma_connect(0, -1, handle, &s);
    }
    if (rc) unit_log_print();
    assert_int_equal(rc, 0);
    assert_non_null(s);
    assert_non_null(r);
    for (int i = 0; i < PROBES; i++)
        close(fds[i]);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* A flood of clients (a scanner completing TCP handshakes faster than they are read) must
 * not keep one accept call looping: it accepted until the backlog was empty, paying a read
 * of every candidate and a WARN per dropped client, and NCCL's thread, serving its other
 * comms between calls, never got back. Each call now takes at most 64; the rest wait for
 * the next. */
static void test_accept_bounded_per_call(void **state) {
    enum { CLIENTS = 120 }; /* under the listen backlog (128): all are queued at once */
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *r = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    struct wire_handle h;
    memcpy(&h, handle, sizeof(h));
    int fds[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&h.addr, sizeof(h.addr)), 0);
    }
    unit_log_count = 0;
    assert_int_equal(erdma_accept(lc, &r), 0);
    assert_null(r);
    int dropped = unit_log_count_matching(NCCL_LOG_WARN, (const char *const[]){"too many", NULL});
    assert_int_equal(dropped, 64 - 32); /* 64 taken, 32 kept as candidates */
    for (int i = 0; i < 10; i++)        /* the rest of the backlog on the next calls */
        assert_int_equal(erdma_accept(lc, &r), 0);
    dropped = unit_log_count_matching(NCCL_LOG_WARN, (const char *const[]){"too many", NULL});
    assert_int_equal(dropped, CLIENTS - 32);
    for (int i = 0; i < CLIENTS; i++)
        close(fds[i]);
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* accept4 as the kernel gives it, or, once, the error a test chose: this definition in the
 * test executable takes the plugin's calls (erdma_core is linked in statically). */
static int accept4_fails_with;
int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "accept4");
    if (accept4_fails_with) {
        errno = accept4_fails_with;
        accept4_fails_with = 0;
        return -1;
    }
    return real(fd, addr, len, flags);
}

/* accept(2) passes on errors of a connection that failed before it was taken (Linux: "treat
 * them like EAGAIN"), and a client that reset in the backlog gives ECONNABORTED: that client
 * is gone, the listener is fine, and the real peer behind it must still be accepted. Both
 * failed NCCL's accept, so a port scanner's reset or a flapping link failed the job. */
static void test_accept_survives_a_client_gone_before_it(void **state) {
    static const int client_errors[] = {ECONNABORTED, ENETDOWN, EHOSTUNREACH, EPROTO};
    for (unsigned i = 0; i < sizeof(client_errors) / sizeof(client_errors[0]); i++) {
        void *s, *r;
        accept4_fails_with = client_errors[i];
        int rc = fake_pair_connect(0, 0, &s, &r);
        if (rc) unit_log_print();
        assert_int_equal(rc, 0);
        assert_int_equal(accept4_fails_with, 0); /* the error was given */
        assert_int_equal(erdma_close_send(s), 0);
        assert_int_equal(erdma_close_recv(r), 0);
    }
}

/* Out of file descriptors is the listener's own failure: NCCL's accept fails, and the WARN
 * names the limit to raise. */
static void test_accept_out_of_descriptors_names_the_limit(void **state) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *r = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    struct wire_handle h;
    memcpy(&h, handle, sizeof(h));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&h.addr, sizeof(h.addr)), 0);
    unit_log_count = 0;
    accept4_fails_with = EMFILE;
    assert_int_equal(erdma_accept(lc, &r), -EMFILE);
    assert_null(r);
    assert_logged(NCCL_LOG_WARN, "accept", "ulimit -n");
    close(fd);
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* A listen that fails (no IPv4 address on the netdev yet: a flapping link) must not count
 * a comm closed that was never counted open: one count short, a later finalize with one comm
 * still open released the devices under it. */
static void test_failed_listen_keeps_object_count(void **state) {
    for (int id = 0; id < PARAM_COUNT; id++)
        unsetenv(param_name(id));
    sysfs_set_root("/nonexistent-erdma-fake-sysfs");
    fake_verbs_install(1, NULL);
    unit_log_start();
    assert_int_equal(erdma_init(unit_log_sink, NULL), 0);
    assert_int_equal(devices_count(), 1);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), -EADDRNOTAVAIL); /* the fake has no netdev */
    assert_null(lc);
    device_get(0)->ip.sin_family = AF_INET; /* the address comes back */
    device_get(0)->ip.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    void *s, *r;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    erdma_finalize(); /* an abort's finalize, the send comm still open: the devices stay */
    assert_int_equal(devices_count(), 1);
    assert_int_equal(erdma_close_send(s), 0); /* the last object: now they go */
    assert_int_equal(devices_count(), 0);
    sysfs_set_root(NULL);
    erdma_log_set(NULL);
    assert_int_equal(fake_verbs_uninstall(), 0);
}

/* A fork while another thread's finalize releases the devices (holding init_lock): the child
 * inherits the lock locked for ever, and its init (set_net_version, then init, as every table's
 * init calls them) waited on it for ever. It must refuse at once, saying why. */
static void *finalize_thread(void *arg) {
    erdma_finalize();
    return NULL;
}

static int child_init_after_fork(void) {
    unit_log_count = 0;
    erdma_set_net_version(11);
    if (erdma_init(unit_log_sink, NULL) != -ENOTSUP) return 1;
    if (!UNIT_LOG_HAS(NCCL_LOG_WARN, "init", "releasing the eRDMA devices", "spawn")) return 2;
    erdma_finalize(); /* a no-op here: it must not wait on the lock either */
    return 0;
}

static void test_fork_during_finalize_refuses_not_hangs(void **state) {
    for (int id = 0; id < PARAM_COUNT; id++)
        unsetenv(param_name(id));
    sysfs_set_root("/nonexistent-erdma-fake-sysfs");
    fake_verbs_install(1, NULL);
    unit_log_start();
    assert_int_equal(erdma_init(unit_log_sink, NULL), 0);
    fake_call_gate(device_get(0)->ctx); /* its close_device waits: the finalize holds there */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, finalize_thread, NULL), 0);
    for (int i = 0; i < 5000 && !fake_call_gate_waiting(); i++)
        usleep(1000);
    assert_true(fake_call_gate_waiting());

    pid_t pid = fork(); /* the finalize holds init_lock, inside close_device */
    if (pid == 0) _exit(child_init_after_fork());
    int status = 0;
    pid_t w = pid > 0 ? fake_wait_child(pid, 10, &status) : -1;
    fake_call_gate(NULL);
    pthread_join(t, NULL);
    assert_int_equal(devices_count(), 0);
    sysfs_set_root(NULL);
    erdma_log_set(NULL);
    assert_int_equal(fake_verbs_uninstall(), 0);
    assert_true(pid > 0);
    assert_int_equal(w, pid); /* 0: the child hung */
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Closing a comm with a request in flight ends that request's profiler events (v10+): the
 * close cleared the comm's kind first, and the events were then left open. */
static int prof_starts, prof_stops, prof_token;
static ncclResult_t prof_count(void **ev, int type, void *phandle, int64_t id, void *data) {
    if (type == NCCL_PROF_NET_EVENT_START) {
        prof_starts++;
        *ev = &prof_token;
    } else if (type == NCCL_PROF_NET_EVENT_STOP) {
        prof_stops++;
    }
    return ncclSuccess;
}

static void test_close_stops_profiler_events(void **state) {
    void *s, *r, *rmh, *smh;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    static char buf[4096];
    assert_int_equal(erdma_reg_mr(r, buf, sizeof(buf), NCCL_PTR_HOST, &rmh), 0);
    assert_int_equal(erdma_reg_mr(s, buf, sizeof(buf), NCCL_PTR_HOST, &smh), 0);
    prof_set(prof_count);
    prof_starts = prof_stops = 0;
    void *data[1] = {buf}, *mhs[1] = {rmh}, *ph[1] = {&prof_token}, *rreq = NULL, *sreq = NULL;
    size_t sizes[1] = {sizeof(buf)};
    int tags[1] = {0};
    assert_int_equal(erdma_irecv(r, 1, data, sizes, tags, mhs, ph, &rreq), 0);
    assert_non_null(rreq);
    assert_int_equal(prof_starts, 1);
    assert_int_equal(erdma_close_recv(r), 0); /* the receive still in flight */
    assert_int_equal(prof_stops, 1);
    for (int i = 0; i < 1000 && !sreq; i++) /* its clear-to-send came: a send in flight too */
        assert_int_equal(erdma_isend(s, buf, 64, 0, smh, &prof_token, &sreq), 0);
    assert_non_null(sreq);
    assert_int_equal(prof_starts, 2);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(prof_stops, 2);
    prof_set(NULL);
    assert_int_equal(erdma_dereg_mr(NULL, rmh), 0);
    assert_int_equal(erdma_dereg_mr(NULL, smh), 0);
}

/* rdma_cm mode: the listener binds the device's address, and the sender must send its
 * requests there, not to the TCP listener's address, which NCCL_SOCKET_IFNAME may put on
 * another interface (bootstrap on eth0, eRDMA on another ENI): nothing listens there. A stub
 * rdma_cm records where the listener is bound and where the sender resolves to. */
static struct sockaddr_in cm_bound, cm_dst;
static int cm_resolved;
static struct rdma_event_channel *stub_ch_create(void) {
    struct rdma_event_channel *ch = calloc(1, sizeof(*ch));
    int p[2];
    if (!ch || pipe(p)) abort();
    close(p[1]);
    ch->fd = p[0];
    return ch;
}
static void stub_ch_destroy(struct rdma_event_channel *ch) {
    close(ch->fd);
    free(ch);
}
static int stub_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx,
                          enum rdma_port_space ps) {
    *id = calloc(1, sizeof(**id));
    (*id)->channel = ch;
    (*id)->context = ctx;
    return 0;
}
static int stub_destroy_id(struct rdma_cm_id *id) {
    free(id);
    return 0;
}
static int stub_bind(struct rdma_cm_id *id, struct sockaddr *a) {
    memcpy(&cm_bound, a, sizeof(cm_bound));
    return 0;
}
static int stub_ok(struct rdma_cm_id *id) {
    return 0;
}
static int stub_listen(struct rdma_cm_id *id, int backlog) {
    return 0;
}
static uint16_t stub_port(struct rdma_cm_id *id) {
    return htons(40001);
}
static int stub_resolve(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst, int t) {
    memcpy(&cm_dst, dst, sizeof(cm_dst));
    cm_resolved = 1;
    return 0;
}
static int stub_get_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev) {
    errno = EAGAIN;
    return -1;
}

static void test_rdmacm_connects_to_the_listeners_address(void **state) {
    const char *env[] = {"NCCL_SOCKET_IFNAME=lo", NULL}; /* the TCP listener: 127.0.0.1 */
    fake_env_stop();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    vb.cm_create_event_channel = stub_ch_create;
    vb.cm_destroy_event_channel = stub_ch_destroy;
    vb.cm_create_id = stub_create_id;
    vb.cm_destroy_id = stub_destroy_id;
    vb.cm_bind_addr = stub_bind;
    vb.cm_listen = stub_listen;
    vb.cm_get_src_port = stub_port;
    vb.cm_resolve_addr = stub_resolve;
    vb.cm_get_cm_event = stub_get_event;
    vb.cm_disconnect = stub_ok;
    struct erdma_device *d = device_get(0);
    d->connect_mode = CONNECT_RDMACM;
    d->ip.sin_addr.s_addr = htonl(0x7f000002); /* the device's netdev: 127.0.0.2 */
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *s = NULL, *r = NULL;
    cm_resolved = 0;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    uint64_t until = now_ns() + 5000000000ull;
    while (!cm_resolved && now_ns() < until) {
        assert_int_equal(erdma_connect(0, -1, handle, &s), 0);
        assert_int_equal(erdma_accept(lc, &r), 0);
    }
    assert_true(cm_resolved);
    assert_int_equal(ntohl(cm_bound.sin_addr.s_addr), 0x7f000002);
    assert_int_equal(ntohl(cm_dst.sin_addr.s_addr), 0x7f000002); /* was 127.0.0.1 */
    assert_int_equal(ntohs(cm_dst.sin_port), 40001);
    erdma_connect_sweep(); /* the half-made connect: released, as an abort would */
    reap_drain();
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* Steps connect (device 0) and accept together for ms milliseconds, or until both comms are
 * made or a call fails (its return). */
static int pair_steps(void *handle, void *lc, void **s, void **r, int ms) {
    uint64_t until = now_ns() + (uint64_t)ms * 1000000ull;
    int rc = 0;
    while (!rc && (!*s || !*r) && now_ns() < until) {
        if (!*s) rc = erdma_connect(0, -1, handle, s);
        if (!rc && !*r) rc = erdma_accept(lc, r);
    }
    return rc;
}

/* One message from s to r, its bytes and both ends' sizes checked. */
static void message_moves(void *s, void *r) {
    static char src[256], dst[256];
    void *rmh, *smh;
    for (int i = 0; i < (int)sizeof(src); i++)
        src[i] = (char)(i * 7 + 1);
    memset(dst, 0, sizeof(dst));
    assert_int_equal(erdma_reg_mr(r, dst, sizeof(dst), NCCL_PTR_HOST, &rmh), 0);
    assert_int_equal(erdma_reg_mr(s, src, sizeof(src), NCCL_PTR_HOST, &smh), 0);
    void *data[1] = {dst}, *mhs[1] = {rmh}, *rreq = NULL, *sreq = NULL;
    size_t sizes[1] = {sizeof(dst)};
    int tags[1] = {0}, sdone = 0, rdone = 0, ssize = -1, rsize = -1;
    assert_int_equal(erdma_irecv(r, 1, data, sizes, tags, mhs, NULL, &rreq), 0);
    assert_non_null(rreq);
    for (int i = 0; i < 1000 && !sreq; i++)
        assert_int_equal(erdma_isend(s, src, sizeof(src), 0, smh, NULL, &sreq), 0);
    assert_non_null(sreq);
    for (int i = 0; i < 100000 && !(sdone && rdone); i++) {
        if (!sdone) assert_int_equal(erdma_test(sreq, &sdone, &ssize), 0);
        if (!rdone) assert_int_equal(erdma_test(rreq, &rdone, &rsize), 0);
    }
    assert_true(sdone && rdone);
    assert_int_equal(ssize, sizeof(src));
    assert_int_equal(rsize, sizeof(src));
    assert_memory_equal(src, dst, sizeof(src));
    assert_int_equal(erdma_dereg_mr(r, rmh), 0);
    assert_int_equal(erdma_dereg_mr(s, smh), 0);
}

/* Connects until the hello is on its way: the receiver has not called accept yet. */
static void hello_sent(void *handle, void **s) {
    for (int i = 0; i < 50; i++) {
        assert_int_equal(erdma_connect(0, -1, handle, s), 0);
        usleep(1000);
    }
    assert_null(*s);
}

/* A link flap around connection setup: connect and accept wait for the port (down by the
 * driver's word or by the async thread's, or its GID not back yet) within
 * NCCL_ERDMA_CONNECT_TIMEOUT, say why, and connect once it is back. Before, setup went on and
 * the QPs' RTR failed on both ends ("A wrong NCCL_IB_GID_INDEX is the usual cause"). */
static void test_setup_waits_out_a_link_flap(void **state) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *s = NULL, *r = NULL;
    struct erdma_device *d = device_get(0);
    /* the receiver finds the port down when the sender's hello arrives */
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    hello_sent(handle, &s);
    fake_port_set_state(0, IBV_PORT_DOWN);
    unit_log_count = 0;
    assert_int_equal(pair_steps(handle, lc, &s, &r, 300), 0);
    assert_null(s);
    assert_null(r);
    assert_logged(NCCL_LOG_INFO, "fake0", "port is not active", "connection from", "waits for it");
    fake_port_set_state(0, IBV_PORT_ACTIVE);
    assert_int_equal(pair_steps(handle, lc, &s, &r, 5000), 0);
    assert_non_null(s);
    assert_non_null(r);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(erdma_close_listen(lc), 0);

    /* the sender finds the port down by the async thread's word, then its GID not back */
    s = r = lc = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    d->fatal = -ENETDOWN;
    unit_log_count = 0;
    assert_int_equal(pair_steps(handle, lc, &s, &r, 300), 0);
    assert_null(s);
    assert_null(r);
    assert_logged(NCCL_LOG_INFO, "fake0", "went down", "the connect to", "waits for it");
    d->port_downs++; /* the event came after the sender made its QPs, not yet connected */
    d->fatal = 0;
    union ibv_gid saved = d->gid, zero;
    memset(&zero, 0, sizeof(zero));
    fake_gid_set(0, d->gid_index, &zero);
    assert_int_equal(pair_steps(handle, lc, &s, &r, 300), 0);
    assert_null(s);
    fake_gid_set(0, d->gid_index, &saved);
    assert_int_equal(pair_steps(handle, lc, &s, &r, 5000), 0);
    assert_non_null(s);
    assert_non_null(r);
    assert_int_equal(((struct send_comm *)s)->c.port_downs, d->port_downs);
    assert_int_equal(((struct recv_comm *)r)->c.port_downs, d->port_downs);
    message_moves(s, r); /* the connection counts from its QPs' connect, after that down */
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    assert_int_equal(erdma_close_listen(lc), 0);
}

/* Calls connect (lc NULL) or accept on lc until it fails, with NCCL_ERDMA_CONNECT_TIMEOUT=1:
 * its error, once it gave up after about that second and made no comm. */
static int step_until_failure(void *handle, void *lc, void **comm) {
    uint64_t t0 = now_ns();
    int rc = 0;
    while (!rc && now_ns() - t0 < 5000000000ull)
        rc = lc ? erdma_accept(lc, comm) : erdma_connect(0, -1, handle, comm);
    assert_true(now_ns() - t0 >= 900000000ull);
    assert_null(*comm);
    return rc;
}

/* A port that stays down: connect and accept give up at NCCL_ERDMA_CONNECT_TIMEOUT and say
 * which device's link to check (not "is the peer alive?"). */
static void test_setup_gives_up_on_a_port_that_stays_down(void **state) {
    const char *env[] = {"NCCL_ERDMA_CONNECT_TIMEOUT=1", NULL};
    fake_env_stop();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *s = NULL, *r = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    hello_sent(handle, &s);
    fake_port_set_state(0, IBV_PORT_DOWN);
    unit_log_count = 0;
    assert_int_equal(step_until_failure(NULL, lc, &r), -ETIMEDOUT);
    assert_logged(NCCL_LOG_WARN, "fake0", "did not complete within NCCL_ERDMA_CONNECT_TIMEOUT=1s",
                  "port is not active", "check the link");
    erdma_connect_sweep(); /* the sender's half-made connect */
    reap_drain();
    assert_int_equal(erdma_close_listen(lc), 0);

    s = lc = NULL;
    assert_int_equal(erdma_listen(0, handle, &lc), 0);
    unit_log_count = 0;
    assert_int_equal(step_until_failure(handle, NULL, &s), -ETIMEDOUT);
    assert_logged(NCCL_LOG_WARN, "fake0", "could not connect", "port is not active",
                  "check the link");
    assert_int_equal(erdma_close_listen(lc), 0);
    fake_port_set_state(0, IBV_PORT_ACTIVE);
}

/* No route to the peer (yet): a link flap, or routes a CNI adds after the pod starts. connect
 * tries again within NCCL_ERDMA_CONNECT_TIMEOUT, as for a refused one, and its timeout names
 * the error. Before, connect failed at once with ENETUNREACH. A multicast address gives that
 * error on any host. */
static void test_connect_retries_an_unreachable_network(void **state) {
    const char *env[] = {"NCCL_ERDMA_CONNECT_TIMEOUT=1", NULL};
    fake_env_stop();
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    memset(handle, 0, sizeof(handle));
    struct wire_handle *h = (struct wire_handle *)handle;
    h->connect_mode = CONNECT_GID;
    h->nonce = 7;
    h->addr.sin_family = AF_INET;
    h->addr.sin_addr.s_addr = inet_addr("224.0.0.1");
    h->addr.sin_port = htons(5555);
    wire_handle_seal(h);
    void *s = NULL;
    unit_log_count = 0;
    assert_int_equal(step_until_failure(handle, NULL, &s), -ETIMEDOUT);
    assert_logged(NCCL_LOG_WARN, "fake0", "224.0.0.1", "NCCL_ERDMA_CONNECT_TIMEOUT=1s",
                  "the last failed: Network is unreachable");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ifname_match),
        cmocka_unit_test_setup_teardown(test_local_addr, setup, teardown),
        cmocka_unit_test(test_peer_alive),
        cmocka_unit_test_setup_teardown(test_close_says_goodbye, setup, teardown),
        cmocka_unit_test(test_hung_up_after_goodbye),
        cmocka_unit_test(test_hung_up_behind_a_stray_byte),
        cmocka_unit_test(test_partial_io),
        cmocka_unit_test_setup_teardown(test_connect_accept_and_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_handles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_hangs_up_during_handshake, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_hello_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accept_bounded_per_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accept_survives_a_client_gone_before_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_accept_out_of_descriptors_names_the_limit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_probe_burst_behind_real_peer, setup, teardown),
        cmocka_unit_test(test_failed_listen_keeps_object_count),
        cmocka_unit_test(test_fork_during_finalize_refuses_not_hangs),
        cmocka_unit_test_setup_teardown(test_close_stops_profiler_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rdmacm_connects_to_the_listeners_address, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_setup_waits_out_a_link_flap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_retries_an_unreachable_network, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_setup_gives_up_on_a_port_that_stays_down, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
