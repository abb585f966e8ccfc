/*
 * The reaper thread (reap.c): a handed-over item runs off the caller's thread, sleeps until
 * its descriptor is readable or its deadline passes, and reap_drain() returns only once every
 * item is done. Items here are pipes standing in for a peer's goodbye.
 */
#define _GNU_SOURCE
#include "conn.h"
#include "reap.h"
#include "unit_log.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

struct item {
    struct reap_item reap; /* first */
    int fd;                /* read end: done once a byte is there */
    uint64_t deadline;     /* or at this time; 0: none */
    int steps;
    int done; /* 1 by the byte, 2 by the deadline */
    pthread_t ran_on;
};

static int step(struct reap_item *it, int *fd, uint64_t *wake_ns) {
    struct item *x = (struct item *)it;
    char c;
    x->steps++;
    x->ran_on = pthread_self();
    if (read(x->fd, &c, 1) == 1) {
        __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
        return 1;
    }
    if (x->deadline && now_ns() >= x->deadline) {
        __atomic_store_n(&x->done, 2, __ATOMIC_RELEASE);
        return 1;
    }
    *fd = x->fd;
    if (x->deadline) *wake_ns = x->deadline;
    return 0;
}

static void item_init(struct item *x, int p[2], uint64_t deadline) {
    assert_int_equal(pipe2(p, O_NONBLOCK), 0);
    *x = (struct item){.reap.step = step, .fd = p[0], .deadline = deadline};
}

/* The caller gets its thread back at once; the item finishes when its peer "says goodbye". */
static void test_defer_returns_at_once(void **state) {
    struct item x;
    int p[2];
    item_init(&x, p, 0);
    reap_defer(&x.reap); /* no deadline: finished in place, it would never return */
    usleep(50000);
    assert_int_equal(__atomic_load_n(&x.done, __ATOMIC_ACQUIRE), 0);
    assert_int_equal(reap_pending(), 1);
    assert_int_equal(write(p[1], "B", 1), 1);
    for (int i = 0; i < 500 && reap_pending(); i++)
        usleep(10000);
    assert_int_equal(reap_pending(), 0);
    assert_int_equal(__atomic_load_n(&x.done, __ATOMIC_ACQUIRE), 1);
    assert_false(pthread_equal(x.ran_on, pthread_self()));
    /* it slept in poll between its steps, not in a spin */
    assert_true(x.steps < 20);
    reap_drain();
    close(p[0]);
    close(p[1]);
}

/* Finalize waits for every item, bounded by their deadlines; none is lost or run twice. */
static void test_drain_waits_for_all(void **state) {
    enum { N = 40 };
    struct item x[N];
    int p[N][2];
    uint64_t t0 = now_ns();
    for (int i = 0; i < N; i++) {
        /* the silent half ends by its 200 ms deadline; the answered half's is far enough
         * that a slow host (sanitizers, load) still writes its byte first: it ends by it */
        item_init(&x[i], p[i], t0 + (i % 2 ? 200000000ull : 60000000000ull));
        reap_defer(&x[i].reap);
    }
    for (int i = 0; i < N; i += 2) /* half of the peers answer */
        assert_int_equal(write(p[i][1], "B", 1), 1);
    reap_drain();
    assert_int_equal(reap_pending(), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(x[i].done, i % 2 ? 2 : 1);
        close(p[i][0]);
        close(p[i][1]);
    }
    /* a drain with nothing running, and a new thread after it */
    reap_drain();
    struct item y;
    int q[2];
    item_init(&y, q, now_ns());
    reap_defer(&y.reap);
    reap_drain();
    assert_int_equal(y.done, 2);
    close(q[0]);
    close(q[1]);
}

/* A wake-up that reaches the thread between its look at the shared state and its emptying of
 * the wake pipe must not be lost: finalize's join then waited forever (seen in siw0 runs).
 * Many short lives of the thread, each ended by a drain right after the last hand-over;
 * a lost wake-up hangs here, and the alarm turns that into a failure. */
static void test_no_lost_wakeup(void **state) {
    alarm(120);
    for (int cycle = 0; cycle < 3000; cycle++) {
        struct item x;
        int p[2];
        item_init(&x, p, 0);
        assert_int_equal(write(p[1], "B", 1), 1); /* done at its first step */
        reap_defer(&x.reap);
        if (cycle % 3) usleep((useconds_t)(cycle % 7)); /* vary where the thread is */
        reap_drain();
        assert_int_equal(x.done, 1);
        close(p[0]);
        close(p[1]);
    }
    alarm(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defer_returns_at_once),
        cmocka_unit_test(test_drain_waits_for_all),
        cmocka_unit_test(test_no_lost_wakeup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
