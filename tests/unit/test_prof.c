/*
 * The profiler events (src/prof.c) through a recording callback, as NCCL's would see them: a
 * start carries net_ib's plugin id (IB, descriptor version 1), the request's profiler handle
 * and a QP descriptor with our fields; a stop hands back the event handle the start returned.
 * No callback, or no profiler handle, means no call at all; a failing profiler is WARNed about
 * once and never fails anything.
 */
#include "prof.h"
#include "unit_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

struct call {
    int type;
    void *phandle;
    int64_t plugin_id;
    ncclProfilerNetIbDescr_v1_t d;
    void *ev_in;
};
static struct call calls[16];
static int ncalls;
static ncclResult_t next_result;
static int ev_token;

static ncclResult_t recorder(void **eh, int type, void *phandle, int64_t plugin_id, void *ext) {
    struct call *c = &calls[ncalls++];
    c->type = type;
    c->phandle = phandle;
    c->plugin_id = plugin_id;
    c->ev_in = *eh;
    if (type == NCCL_PROF_NET_EVENT_START) {
        c->d = *(ncclProfilerNetIbDescr_v1_t *)ext; /* copied now, as a profiler must */
        *eh = &ev_token;
    }
    return next_result;
}

static int setup(void **state) {
    ncalls = 0;
    next_result = ncclSuccess;
    unit_log_start();
    prof_set(recorder);
    return 0;
}

static int teardown(void **state) {
    prof_set(NULL);
    return 0;
}

static void test_start_stop(void **state) {
    int ph;
    void *ev = NULL;
    assert_true(prof_on());
    prof_qp_start(&ev, &ph, 1, 0x1234, 0xabcdef0123ull, 4 /* IBV_WR_SEND */, 65536);
    assert_int_equal(ncalls, 1);
    assert_int_equal(calls[0].type, 0);
    assert_ptr_equal(calls[0].phandle, &ph);
    assert_int_equal(calls[0].plugin_id, (1 << 16) | 1); /* IB, version 1 */
    assert_int_equal(calls[0].d.type, 1);                /* a QP event */
    assert_int_equal(calls[0].d.qp.device, 1);
    assert_int_equal(calls[0].d.qp.qpNum, 0x1234);
    assert_true(calls[0].d.qp.wr_id == 0xabcdef0123ull);
    assert_int_equal(calls[0].d.qp.opcode, 4);
    assert_int_equal(calls[0].d.qp.length, 65536);
    assert_ptr_equal(ev, &ev_token);
    prof_qp_stop(&ev);
    assert_int_equal(ncalls, 2);
    assert_int_equal(calls[1].type, 1);
    assert_ptr_equal(calls[1].ev_in, &ev_token);
    assert_null(ev);
    prof_qp_stop(&ev); /* already stopped: no second stop */
    assert_int_equal(ncalls, 2);
}

static void test_no_phandle_no_event(void **state) {
    void *ev = (void *)1;
    prof_qp_start(&ev, NULL, 0, 1, 2, 0, 8);
    assert_int_equal(ncalls, 0);
    assert_null(ev);
    prof_qp_stop(&ev);
    assert_int_equal(ncalls, 0);
}

static void test_no_profiler(void **state) {
    int ph;
    void *ev = NULL;
    prof_set(NULL);
    assert_false(prof_on());
    prof_qp_start(&ev, &ph, 0, 1, 2, 0, 8);
    assert_null(ev);
    assert_int_equal(ncalls, 0);
}

static void test_failing_profiler_warns_once(void **state) {
    int ph;
    void *ev = NULL;
    next_result = ncclInternalError;
    prof_qp_start(&ev, &ph, 0, 1, 2, 0, 8);
    assert_null(ev); /* whatever it wrote, a failed start leaves nothing to stop */
    prof_qp_start(&ev, &ph, 0, 1, 2, 0, 8);
    assert_int_equal(ncalls, 2);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1);
    assert_logged(NCCL_LOG_WARN, "profiler callback failed", "transfers are not affected");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_start_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_phandle_no_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_profiler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_profiler_warns_once, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
