/*
 * The async-event thread (async.c) over the fake verbs provider: events queued on a
 * device's async fd reach its fatal flag, and the thread stops cleanly.
 */
#define _GNU_SOURCE
#include "async.h"
#include "conn.h"
#include "device.h"
#include "fake_verbs.h"
#include "unit_log.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static int setup(void **state) {
    unit_log_start();
    assert_int_equal(fake_env_start(2, NULL, NULL), 2);
    assert_int_equal(async_start(), 0);
    return 0;
}

static int teardown(void **state) {
    async_stop();
    int leaked = fake_env_stop();
    erdma_log_set(NULL);
    assert_int_equal(leaked, 0);
    return 0;
}

/* Waits (bounded) for the thread to set dev's fatal flag; returns it. */
static int wait_fatal(int dev, int want) {
    uint64_t until = now_ns() + 5000000000ull;
    int v;
    while ((v = __atomic_load_n(&device_get(dev)->fatal, __ATOMIC_ACQUIRE)) != want &&
           now_ns() < until)
        usleep(1000);
    return v;
}

/* Waits (bounded) until the thread has handled events up to the fake's ack count n. */
static bool wait_acked(unsigned n) {
    uint64_t until = now_ns() + 5000000000ull;
    while (fake_async_acked() < n && now_ns() < until)
        usleep(1000);
    return fake_async_acked() >= n;
}

static void test_port_down_marks_only_its_device(void **state) {
    fake_async_event(1, IBV_EVENT_PORT_ERR, 1);
    assert_int_equal(wait_fatal(1, -ENETDOWN), -ENETDOWN);
    assert_int_equal(device_get(0)->fatal, 0);
}

static void test_event_for_another_port_ignored(void **state) {
    fake_async_event(0, IBV_EVENT_PORT_ERR, 2);
    fake_async_event(0, IBV_EVENT_DEVICE_FATAL, 1); /* processed after the first */
    assert_int_equal(wait_fatal(0, -EIO), -EIO);
}

/* A device fatal error stays through a link flap (a driver reset may bounce the link): the
 * port's down and up events used to overwrite it and then clear it, and a dead device's
 * connections, with nothing left to complete their requests, waited silently. */
static void test_fatal_error_outlives_a_flap(void **state) {
    fake_async_event(0, IBV_EVENT_DEVICE_FATAL, 1);
    assert_int_equal(wait_fatal(0, -EIO), -EIO);
    unsigned acked = fake_async_acked();
    fake_async_event(0, IBV_EVENT_PORT_ERR, 1);
    assert_true(wait_acked(acked + 1));
    assert_int_equal(device_get(0)->fatal, -EIO);
    fake_async_event(0, IBV_EVENT_PORT_ACTIVE, 1);
    assert_true(wait_acked(acked + 2));
    assert_int_equal(device_get(0)->fatal, -EIO);
}

static void test_stop_with_events_pending(void **state) {
    for (int i = 0; i < 8; i++)
        fake_async_event(0, IBV_EVENT_QP_FATAL, 1);
    /* teardown stops the thread: it must join whatever it is doing */
}

/* A device that goes away leaves its event channel polling as failed, with nothing to read:
 * the thread spun on it at 100 % of a core until finalize, and the device kept working on
 * paper. Now the device fails, the WARN says why, the other device carries on, and the
 * thread sleeps. */
static void test_channel_failure_fails_device_without_spinning(void **state) {
    unit_log_count = 0;
    fake_async_channel_fails(1);
    assert_int_equal(wait_fatal(1, -EIO), -EIO);
    assert_logged(NCCL_LOG_WARN, "fake1", "event channel failed");
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    usleep(300000);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu_s = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    print_message("process CPU over 300 ms of sleep: %.3f s\n", cpu_s);
    assert_true(cpu_s < 0.1);                   /* a spinning thread takes ~0.3 s of it */
    fake_async_event(0, IBV_EVENT_PORT_ERR, 1); /* the other device is still watched */
    assert_int_equal(wait_fatal(0, -ENETDOWN), -ENETDOWN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_port_down_marks_only_its_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_for_another_port_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fatal_error_outlives_a_flap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_events_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_channel_failure_fails_device_without_spinning, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
