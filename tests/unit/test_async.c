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

static void test_stop_with_events_pending(void **state) {
    for (int i = 0; i < 8; i++)
        fake_async_event(0, IBV_EVENT_QP_FATAL, 1);
    /* teardown stops the thread: it must join whatever it is doing */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_port_down_marks_only_its_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_for_another_port_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_events_pending, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
