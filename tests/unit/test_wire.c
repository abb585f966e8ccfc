/*
 * Byte formats exchanged with peers (wire.c): every check must refuse garbage,
 * foreign or corrupted bytes with a reason, and accept what seal produced.
 */
#include "wire.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#define FUZZ_ROUNDS 4000

static char why[256];

static void good_handle(struct wire_handle *h, enum connect_mode mode) {
    memset(h, 0, sizeof(*h));
    h->connect_mode = (uint8_t)mode;
    h->nonce = 0x0123456789abcdefull;
    h->addr.sin_family = AF_INET;
    h->addr.sin_port = htons(40000);
    h->addr.sin_addr.s_addr = htonl(0xac10000a);
    h->cm_port = mode == CONNECT_RDMACM ? htons(40001) : 0;
    h->cm_ip.s_addr = mode == CONNECT_RDMACM ? htonl(0xac10010a) : 0; /* another interface */
    wire_handle_seal(h);
}

static void good_msg(struct wire_conn_msg *m, enum wire_msg_type type) {
    memset(m, 0, sizeof(*m));
    m->nonce = 42;
    m->nqps = 2;
    m->completion = COMPLETION_IMM;
    m->connect_mode = CONNECT_GID;
    m->mtu = IBV_MTU_1024;
    m->qpn[0] = 0x11;
    m->qpn[1] = 0x12;
    m->ctrl_rkey = 0x1234;
    m->ctrl_addr = 0x7f0000001000ull;
    m->max_msg_sz = 1u << 30;
    wire_msg_seal(m, type);
}

static int check_handle(const struct wire_handle *h) {
    why[0] = 0;
    return wire_handle_check(h, why, sizeof(why));
}

static int check_msg(const struct wire_conn_msg *m, enum wire_msg_type type) {
    why[0] = 0;
    return wire_msg_check(m, type, why, sizeof(why));
}

static void assert_why(const char *needle) {
    if (!strstr(why, needle)) fprintf(stderr, "reason \"%s\" lacks \"%s\"\n", why, needle);
    assert_non_null(strstr(why, needle));
}

static void test_checksum(void **state) {
    /* FNV-1a reference values */
    assert_int_equal(wire_checksum("", 0), 2166136261u);
    assert_int_equal(wire_checksum("a", 1), 0xe40c292cu);
    assert_int_equal(wire_checksum("foobar", 6), 0xbf9cf968u);
}

static void test_handle_roundtrip(void **state) {
    struct wire_handle h;
    good_handle(&h, CONNECT_GID);
    assert_int_equal(h.magic, WIRE_MAGIC);
    assert_int_equal(h.version, WIRE_VERSION);
    assert_int_equal(check_handle(&h), 0);
    good_handle(&h, CONNECT_RDMACM);
    assert_int_equal(check_handle(&h), 0);
    /* NCCL copies the handle as bytes */
    uint8_t bytes[NCCL_NET_HANDLE_MAXSIZE];
    memcpy(bytes, &h, sizeof(h));
    struct wire_handle copy;
    memcpy(&copy, bytes, sizeof(copy));
    assert_int_equal(check_handle(&copy), 0);
}

static void test_handle_garbage(void **state) {
    struct wire_handle h;
    memset(&h, 0xa5, sizeof(h));
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("not an eRDMA plugin handle");
    memset(&h, 0, sizeof(h));
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("magic 0x00000000");
}

static void test_handle_wrong_magic_and_version(void **state) {
    struct wire_handle h;
    good_handle(&h, CONNECT_GID);
    h.magic = 0x4e43434c;
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("another NCCL network plugin");
    good_handle(&h, CONNECT_GID);
    h.version = WIRE_VERSION + 1;
    assert_int_equal(check_handle(&h), -EBADMSG);
    char want[32];
    snprintf(want, sizeof(want), "handle version %d", WIRE_VERSION + 1);
    assert_why(want);
}

static void test_handle_flipped_byte(void **state) {
    struct wire_handle h;
    /* every byte after magic/version, checksum included, is covered */
    for (size_t off = offsetof(struct wire_handle, connect_mode); off < sizeof(h); off++) {
        good_handle(&h, CONNECT_RDMACM);
        ((uint8_t *)&h)[off] ^= 0x01;
        assert_int_equal(check_handle(&h), -EBADMSG);
        assert_why("checksum mismatch");
    }
}

static void test_handle_bad_fields(void **state) {
    struct wire_handle h;
    good_handle(&h, CONNECT_GID);
    h.addr.sin_port = 0;
    wire_handle_seal(&h);
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("no IPv4 listener address");

    good_handle(&h, CONNECT_GID);
    h.addr.sin_family = AF_INET6;
    wire_handle_seal(&h);
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("no IPv4 listener address");

    good_handle(&h, CONNECT_GID);
    h.connect_mode = 7;
    wire_handle_seal(&h);
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("unknown connect mode 7");

    good_handle(&h, CONNECT_RDMACM);
    h.cm_port = 0;
    wire_handle_seal(&h);
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("without an rdma_cm address and port");

    good_handle(&h, CONNECT_RDMACM); /* a handle of version 3 had no address: nowhere to go */
    h.cm_ip.s_addr = 0;
    wire_handle_seal(&h);
    assert_int_equal(check_handle(&h), -EBADMSG);
    assert_why("without an rdma_cm address and port");
}

static void test_msg_roundtrip(void **state) {
    struct wire_conn_msg m;
    good_msg(&m, MSG_HELLO);
    assert_int_equal(m.length, sizeof(m));
    assert_int_equal(check_msg(&m, MSG_HELLO), 0);
    good_msg(&m, MSG_REPLY);
    assert_int_equal(check_msg(&m, MSG_REPLY), 0);
    /* READY carries no connection fields */
    memset(&m, 0, sizeof(m));
    wire_msg_seal(&m, MSG_READY);
    assert_int_equal(check_msg(&m, MSG_READY), 0);
    /* nor does WARMED, and one is never taken for the other */
    wire_msg_seal(&m, MSG_WARMED);
    assert_int_equal(check_msg(&m, MSG_WARMED), 0);
    assert_int_equal(check_msg(&m, MSG_READY), -EPROTO);
    /* rdma_cm peers need no MTU code */
    good_msg(&m, MSG_HELLO);
    m.connect_mode = CONNECT_RDMACM;
    m.completion = COMPLETION_SEND;
    m.mtu = 0;
    m.nqps = ERDMA_MAX_QPS;
    m.split = 1;
    wire_msg_seal(&m, MSG_HELLO);
    assert_int_equal(check_msg(&m, MSG_HELLO), 0);
}

static void test_msg_header_errors(void **state) {
    struct wire_conn_msg m;
    good_msg(&m, MSG_HELLO);
    m.magic ^= 0x100;
    assert_int_equal(check_msg(&m, MSG_HELLO), -EPROTO);
    assert_why("bad magic");

    good_msg(&m, MSG_HELLO);
    m.version = 0;
    assert_int_equal(check_msg(&m, MSG_HELLO), -EPROTO);
    assert_why("protocol version 0");

    good_msg(&m, MSG_HELLO);
    m.length = 64;
    assert_int_equal(check_msg(&m, MSG_HELLO), -EPROTO);
    assert_why("message length 64");

    good_msg(&m, MSG_HELLO);
    assert_int_equal(check_msg(&m, MSG_REPLY), -EPROTO);
    assert_why("message type 1, expected 2");

    good_msg(&m, MSG_HELLO);
    m.qpn[1] ^= 0x80;
    assert_int_equal(check_msg(&m, MSG_HELLO), -EPROTO);
    assert_why("checksum mismatch");

    good_msg(&m, MSG_HELLO);
    m.checksum++;
    assert_int_equal(check_msg(&m, MSG_HELLO), -EPROTO);
    assert_why("checksum mismatch");
}

/* A sealed (checksum-valid) message with one bad field: refused on its own merits. */
static void expect_field_error(void (*mutate)(struct wire_conn_msg *), const char *reason) {
    struct wire_conn_msg m;
    good_msg(&m, MSG_REPLY);
    mutate(&m);
    wire_msg_seal(&m, MSG_REPLY);
    assert_int_equal(check_msg(&m, MSG_REPLY), -EPROTO);
    assert_why(reason);
}

static void no_qps(struct wire_conn_msg *m) {
    m->nqps = 0;
}
static void too_many_qps(struct wire_conn_msg *m) {
    m->nqps = ERDMA_MAX_QPS + 1;
}
static void bad_completion(struct wire_conn_msg *m) {
    m->completion = COMPLETION_SEND + 1;
}
static void bad_connect(struct wire_conn_msg *m) {
    m->connect_mode = CONNECT_RDMACM + 1;
}
static void bad_split(struct wire_conn_msg *m) {
    m->split = 2;
}
static void mtu_zero(struct wire_conn_msg *m) {
    m->mtu = 0;
}
static void mtu_too_big(struct wire_conn_msg *m) {
    m->mtu = IBV_MTU_4096 + 1;
}
static void no_ctrl_addr(struct wire_conn_msg *m) {
    m->ctrl_addr = 0;
}
static void no_max_msg(struct wire_conn_msg *m) {
    m->max_msg_sz = 0;
}
static void tiny_max_msg(struct wire_conn_msg *m) {
    m->max_msg_sz = 1; /* a 4 KiB send would need more work requests than a send queue holds */
}
static void max_msg_below_floor(struct wire_conn_msg *m) {
    m->max_msg_sz = WIRE_MIN_MSG_SZ - 1;
}

static void test_msg_field_errors(void **state) {
    expect_field_error(no_qps, "asks for 0 QPs");
    expect_field_error(too_many_qps, "asks for 17 QPs");
    expect_field_error(bad_completion, "unknown modes (completion 2");
    expect_field_error(bad_connect, "connect 2");
    expect_field_error(bad_split, "split 2");
    expect_field_error(mtu_zero, "MTU code 0");
    expect_field_error(mtu_too_big, "MTU code 6");
    expect_field_error(no_ctrl_addr, "no control region");
    expect_field_error(no_max_msg, "max message size 0");
    expect_field_error(tiny_max_msg, "max message size 1 ");
    expect_field_error(max_msg_below_floor, "max message size 1048575");
    struct wire_conn_msg m; /* the floor itself is fine */
    good_msg(&m, MSG_REPLY);
    m.max_msg_sz = WIRE_MIN_MSG_SZ;
    wire_msg_seal(&m, MSG_REPLY);
    assert_int_equal(check_msg(&m, MSG_REPLY), 0);
}

static void test_record(void **state) {
    const uint64_t posted[3] = {4096, 1 << 20, 0};
    struct wire_record r = {.seq = 9, .n = 3, .sizes = {4096, 100, 0}};
    assert_int_equal(wire_record_check(&r, 9, 3, posted, why, sizeof(why)), 0);

    assert_int_equal(wire_record_check(&r, 10, 3, posted, why, sizeof(why)), -EPROTO);
    assert_why("sequence 9, expected 10");

    assert_int_equal(wire_record_check(&r, 9, 2, posted, why, sizeof(why)), -EPROTO);
    assert_why("3 buffers, 2 were posted");

    r.sizes[0] = 4097;
    assert_int_equal(wire_record_check(&r, 9, 3, posted, why, sizeof(why)), -EPROTO);
    assert_why("4097 bytes into buffer 0 of 4096");

    r.sizes[0] = 0;
    r.sizes[2] = 1; /* a zero-byte receive must get zero bytes */
    assert_int_equal(wire_record_check(&r, 9, 3, posted, why, sizeof(why)), -EPROTO);
    assert_why("buffer 2");
}

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static void fill_random(void *buf, size_t len) {
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)next_rand();
}

static void test_fuzz_handles(void **state) {
    struct wire_handle h;
    for (int i = 0; i < FUZZ_ROUNDS; i++) {
        fill_random(&h, sizeof(h));
        if (i % 2) { /* get past the first checks half the time */
            h.magic = WIRE_MAGIC;
            h.version = WIRE_VERSION;
        }
        memset(why, 0x7f, sizeof(why));
        assert_int_equal(wire_handle_check(&h, why, sizeof(why)), -EBADMSG);
        assert_true(why[0] != 0 && memchr(why, 0, sizeof(why)) != NULL);
    }
    /* one random byte of a valid handle changed: always caught */
    for (int i = 0; i < FUZZ_ROUNDS; i++) {
        good_handle(&h, i % 2 ? CONNECT_RDMACM : CONNECT_GID);
        size_t off = next_rand() % sizeof(h);
        uint8_t delta = (uint8_t)(next_rand() % 255 + 1);
        ((uint8_t *)&h)[off] ^= delta;
        assert_int_equal(check_handle(&h), -EBADMSG);
    }
}

static void test_fuzz_msgs(void **state) {
    struct wire_conn_msg m;
    const enum wire_msg_type types[] = {MSG_HELLO, MSG_REPLY, MSG_READY};
    for (int i = 0; i < FUZZ_ROUNDS; i++) {
        enum wire_msg_type t = types[i % 3];
        fill_random(&m, sizeof(m));
        if (i % 2) {
            m.magic = WIRE_MAGIC;
            m.version = WIRE_VERSION;
            m.type = (uint16_t)t;
            m.length = sizeof(m);
        }
        memset(why, 0x7f, sizeof(why));
        assert_int_equal(wire_msg_check(&m, t, why, sizeof(why)), -EPROTO);
        assert_true(why[0] != 0 && memchr(why, 0, sizeof(why)) != NULL);
    }
    for (int i = 0; i < FUZZ_ROUNDS; i++) {
        enum wire_msg_type t = types[i % 3];
        good_msg(&m, t);
        size_t off = next_rand() % sizeof(m);
        ((uint8_t *)&m)[off] ^= (uint8_t)(next_rand() % 255 + 1);
        assert_int_equal(check_msg(&m, t), -EPROTO);
    }
}

static void test_fuzz_records(void **state) {
    const uint64_t posted[ERDMA_MAX_RECVS] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct wire_record r;
    for (int i = 0; i < FUZZ_ROUNDS; i++) {
        fill_random(&r, sizeof(r));
        int n = (int)(next_rand() % ERDMA_MAX_RECVS) + 1;
        int rc = wire_record_check(&r, 5, n, posted, why, sizeof(why));
        /* accepted only when it really matches what was posted */
        bool ok = r.seq == 5 && r.n == n;
        for (int j = 0; ok && j < n; j++)
            ok = r.sizes[j] <= posted[j];
        assert_int_equal(rc, ok ? 0 : -EPROTO);
    }
}

static void test_cm_private(void **state) {
    int qp = -1;
    struct wire_cm_private p = {
        .magic = WIRE_MAGIC, .qp_index = 2, .nqps = 4, .nonce = 77, .token = 5};
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 77, 5, 4, &qp, why, sizeof(why)), 0);
    assert_int_equal(qp, 2);
    assert_int_equal(wire_cm_private_check(NULL, 0, 77, 5, 4, &qp, why, sizeof(why)), -EPROTO);
    assert_int_equal(wire_cm_private_check(&p, sizeof(p) - 1, 77, 5, 4, &qp, why, sizeof(why)),
                     -EPROTO);
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 78, 5, 4, &qp, why, sizeof(why)),
                     -EPROTO);
    assert_non_null(strstr(why, "another listen"));
    /* the listen's, but an earlier accept's: a peer that gave up, its requests still queued */
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 77, 6, 4, &qp, why, sizeof(why)),
                     -EPROTO);
    assert_non_null(strstr(why, "another accept"));
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 77, 5, 3, &qp, why, sizeof(why)),
                     -EPROTO);
    p.qp_index = 4;
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 77, 5, 4, &qp, why, sizeof(why)),
                     -EPROTO);
    p.qp_index = 0;
    p.magic = 0x12345678;
    assert_int_equal(wire_cm_private_check(&p, sizeof(p), 77, 5, 4, &qp, why, sizeof(why)),
                     -EPROTO);
    assert_non_null(strstr(why, "magic"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_handle_roundtrip),
        cmocka_unit_test(test_handle_garbage),
        cmocka_unit_test(test_handle_wrong_magic_and_version),
        cmocka_unit_test(test_handle_flipped_byte),
        cmocka_unit_test(test_handle_bad_fields),
        cmocka_unit_test(test_msg_roundtrip),
        cmocka_unit_test(test_msg_header_errors),
        cmocka_unit_test(test_msg_field_errors),
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_fuzz_handles),
        cmocka_unit_test(test_fuzz_msgs),
        cmocka_unit_test(test_fuzz_records),
        cmocka_unit_test(test_cm_private),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
