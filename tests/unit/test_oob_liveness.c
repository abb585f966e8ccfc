/*
 * oob_peer_alive() over a real TCP connection on 127.0.0.1: what a connected peer's
 * out-of-band socket tells the data path. A goodbye is a normal close (the peer's last
 * payload may still be on the way), silence is health, EOF without a goodbye is death,
 * and any other byte is a protocol error.
 */
#include "oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

/* A connected TCP pair on loopback: fds[0] is ours, fds[1] the peer's. */
static void tcp_pair(int fds[2]) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    fds[1] = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fds[1], (struct sockaddr *)&a, sizeof(a)), 0);
    fds[0] = accept(l, NULL, NULL);
    assert_true(fds[0] >= 0);
    close(l);
}

/* The peer's bytes travel through the kernel's loopback: give them a moment. */
static int settle(int fd) {
    int ret = 0;
    for (int i = 0; i < 200 && ret == 0; i++) {
        ret = oob_peer_alive(fd);
        if (!ret) usleep(1000);
    }
    return ret;
}

static void test_silent_peer_is_alive(void **state) {
    (void)state;
    int fds[2];
    tcp_pair(fds);
    assert_int_equal(oob_peer_alive(fds[0]), 0);
    close(fds[1]);
    close(fds[0]);
}

static void test_goodbye_is_a_normal_close(void **state) {
    (void)state;
    int fds[2];
    char bye = OOB_BYE;
    tcp_pair(fds);
    assert_int_equal(send(fds[1], &bye, 1, 0), 1);
    assert_int_equal(settle(fds[0]), OOB_PEER_CLOSING);
    /* still a normal close once the peer's socket is gone too, and on every later look */
    close(fds[1]);
    usleep(20000);
    assert_int_equal(oob_peer_alive(fds[0]), OOB_PEER_CLOSING);
    assert_int_equal(oob_peer_alive(fds[0]), OOB_PEER_CLOSING);
    close(fds[0]);
}

static void test_eof_without_goodbye_is_death(void **state) {
    (void)state;
    int fds[2];
    tcp_pair(fds);
    close(fds[1]);
    assert_int_equal(settle(fds[0]), -ECONNRESET);
    close(fds[0]);
}

static void test_other_byte_is_a_protocol_error(void **state) {
    (void)state;
    int fds[2];
    tcp_pair(fds);
    assert_int_equal(send(fds[1], "x", 1, 0), 1);
    assert_int_equal(settle(fds[0]), -EPROTO);
    close(fds[1]);
    close(fds[0]);
}

/* The handshake's quiet stages: an end of stream is a peer gone; bytes that arrived early
 * (the next stage's message) are neither an error nor consumed. With the end behind them the
 * peer is gone too (no peer closes before the handshake's last message): those bytes hid it
 * until the connect timeout, and a stray byte from a peer that closed did the same. */
static void test_hung_up_only_at_the_end(void **state) {
    (void)state;
    int fds[2];
    char buf[4];
    tcp_pair(fds);
    assert_int_equal(oob_peer_hung_up(fds[0]), 0);
    close(fds[1]);
    int ret = 0;
    for (int i = 0; i < 200 && ret == 0; i++) {
        ret = oob_peer_hung_up(fds[0]);
        if (!ret) usleep(1000);
    }
    assert_int_equal(ret, -ECONNRESET);
    close(fds[0]);

    tcp_pair(fds);
    assert_int_equal(send(fds[1], "RDY", 3, 0), 3);
    usleep(20000);
    assert_int_equal(oob_peer_hung_up(fds[0]), 0); /* early: the peer is there */
    close(fds[1]);
    ret = 0;
    for (int i = 0; i < 5000 && ret == 0; i++) { /* the end behind them shows */
        ret = oob_peer_hung_up(fds[0]);
        if (!ret) usleep(1000);
    }
    assert_int_equal(ret, -ECONNRESET);
    assert_int_equal(recv(fds[0], buf, sizeof(buf), MSG_DONTWAIT), 3); /* not consumed */
    assert_memory_equal(buf, "RDY", 3);
    assert_int_equal(oob_peer_hung_up(fds[0]), -ECONNRESET);
    close(fds[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silent_peer_is_alive),
        cmocka_unit_test(test_goodbye_is_a_normal_close),
        cmocka_unit_test(test_eof_without_goodbye_is_death),
        cmocka_unit_test(test_other_byte_is_a_protocol_error),
        cmocka_unit_test(test_hung_up_only_at_the_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
