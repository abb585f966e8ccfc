/*
 * The traffic counters (src/stats.c): per-connection counts fold into their device's totals at
 * close, errors count by status, the Prometheus text names every series with its labels, the
 * file is replaced whole (temporary + rename), and the writer thread rewrites it, is joined at
 * stop and starts again after a re-init, logging one INFO line per device at stop.
 */
#include "params.h"
#include "stats.h"
#include "unit_log.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static const char *const names[] = {"rxe0", "siw0"};

static int setup(void **state) {
    unsetenv("NCCL_ERDMA_STATS_FILE");
    unsetenv("NCCL_ERDMA_STATS_INTERVAL");
    params_load();
    unit_log_start();
    assert_int_equal(stats_start(2, names), 0);
    return 0;
}

static int teardown(void **state) {
    stats_stop();
    return 0;
}

static char *prom_text(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(stats_write_prometheus(f, 4242), 0);
    fclose(f);
    return buf;
}

static void test_fold_at_close(void **state) {
    struct stats_conn a, b, c;
    stats_conn_open(&a, 0, STATS_SEND, "10.0.0.2:5000");
    stats_conn_open(&b, 0, STATS_RECV, "10.0.0.3:5000");
    stats_conn_open(&c, 1, STATS_SEND, "10.0.0.4:5000");
    stats_add(&a.c.bytes_sent, 1000);
    stats_add(&a.c.msgs_sent, 2);
    stats_add(&a.c.wrs_posted, 3);
    stats_add(&b.c.bytes_recv, 777);
    stats_add(&b.c.msgs_recv, 1);
    stats_add(&b.c.flushes, 5);
    stats_max(&a.c.max_inflight_ns, 2000000);
    stats_max(&b.c.max_inflight_ns, 9000000);
    stats_max(&b.c.max_inflight_ns, 1000); /* smaller: kept at the larger */
    stats_add(&c.c.bytes_sent, 50);

    struct stats_counters t;
    uint64_t ev[STATS_EVENTS];
    stats_device_totals(0, &t, ev);
    assert_int_equal(t.bytes_sent, 1000);
    assert_int_equal(t.bytes_recv, 777);
    assert_int_equal(t.msgs_sent, 2);
    assert_int_equal(t.msgs_recv, 1);
    assert_int_equal(t.wrs_posted, 3);
    assert_int_equal(t.flushes, 5);
    assert_int_equal(t.max_inflight_ns, 9000000);

    stats_conn_close(&a);
    stats_conn_close(&a); /* idempotent: counted once */
    stats_add(&b.c.bytes_recv, 3);
    stats_device_totals(0, &t, ev);
    assert_int_equal(t.bytes_sent, 1000);
    assert_int_equal(t.bytes_recv, 780);
    stats_conn_close(&b);
    stats_device_totals(0, &t, ev);
    assert_int_equal(t.bytes_recv, 780);
    assert_int_equal(t.max_inflight_ns, 9000000);
    stats_device_totals(1, &t, ev);
    assert_int_equal(t.bytes_sent, 50);
    stats_conn_close(&c);
}

static void test_errors_and_events(void **state) {
    struct stats_conn a;
    stats_conn_open(&a, 1, STATS_SEND, "p");
    stats_wc_error(&a, IBV_WC_RETRY_EXC_ERR);
    stats_wc_error(&a, IBV_WC_RETRY_EXC_ERR);
    stats_wc_error(&a, IBV_WC_WR_FLUSH_ERR);
    stats_wc_error(&a, 9999); /* not a status we know: "other" */
    stats_event(1, STATS_CONNECT);
    stats_event(1, STATS_ACCEPT);
    stats_event(1, STATS_ACCEPT_REJECT);
    stats_event(1, STATS_ACCEPT_REJECT);
    stats_conn_close(&a);
    struct stats_counters t;
    uint64_t ev[STATS_EVENTS];
    stats_device_totals(1, &t, ev);
    assert_int_equal(t.wc_errors[IBV_WC_RETRY_EXC_ERR], 2);
    assert_int_equal(t.wc_errors[IBV_WC_WR_FLUSH_ERR], 1);
    assert_int_equal(t.wc_errors[STATS_WC_STATUSES], 1);
    assert_int_equal(ev[STATS_CONNECT], 1);
    assert_int_equal(ev[STATS_ACCEPT], 1);
    assert_int_equal(ev[STATS_ACCEPT_REJECT], 2);
    assert_string_equal(stats_wc_status_name(IBV_WC_RETRY_EXC_ERR), "retry_exceeded");
    assert_string_equal(stats_wc_status_name(9999), "other");
    stats_device_totals(0, &t, ev); /* the other device saw none of it */
    assert_int_equal(ev[STATS_ACCEPT_REJECT], 0);
    assert_int_equal(t.wc_errors[IBV_WC_RETRY_EXC_ERR], 0);
}

static void test_prometheus_text(void **state) {
    struct stats_conn a;
    stats_conn_open(&a, 0, STATS_SEND, "10.0.0.2:5000 \"x\\y\"");
    stats_add(&a.c.bytes_sent, 123456);
    stats_max(&a.c.max_inflight_ns, 1500000000);
    stats_wc_error(&a, IBV_WC_REM_ACCESS_ERR);
    char *t = prom_text();
    assert_non_null(strstr(t, "# TYPE erdma_device_bytes_sent_total counter\n"));
    assert_non_null(strstr(t, "erdma_device_bytes_sent_total{device=\"rxe0\",pid=\"4242\"} "
                              "123456\n"));
    assert_non_null(strstr(t, "erdma_device_bytes_sent_total{device=\"siw0\",pid=\"4242\"} 0\n"));
    char want[256];
    snprintf(want, sizeof(want),
             "erdma_conn_bytes_sent_total{device=\"rxe0\",peer=\"10.0.0.2:5000 \\\"x\\\\y\\\"\","
             "pid=\"4242\",conn=\"%llu\",dir=\"send\"} 123456\n",
             (unsigned long long)a.id);
    if (!strstr(t, want)) fprintf(stderr, "%s\nwanted: %s", t, want);
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, "erdma_device_completion_errors_total{device=\"rxe0\",pid=\"4242\","
                              "status=\"remote_access\"} 1\n"));
    assert_non_null(
        strstr(t, "erdma_device_request_max_inflight_seconds{device=\"rxe0\",pid=\"4242\"} "
                  "1.500000\n"));
    assert_non_null(strstr(t, "# TYPE erdma_device_request_max_inflight_seconds gauge\n"));
    free(t);
    stats_conn_close(&a);
    t = prom_text(); /* a closed connection's series go; its counts stay in the device's */
    assert_null(strstr(t, "erdma_conn_"));
    assert_non_null(strstr(t, "erdma_device_bytes_sent_total{device=\"rxe0\",pid=\"4242\"} "
                              "123456\n"));
    free(t);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_file_replaced(void **state) {
    char dir[] = "/tmp/erdma-stats-XXXXXX", tmpl[128], path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(tmpl, sizeof(tmpl), "%s/erdma-%%p.prom", dir);
    assert_int_equal(stats_file_name(tmpl, 77, path, sizeof(path)), 0);
    char want[128];
    snprintf(want, sizeof(want), "%s/erdma-77.prom", dir);
    assert_string_equal(path, want);
    assert_int_equal(stats_file_name("", 1, path, sizeof(path)), -EINVAL);
    assert_int_equal(stats_file_name("/a/very/long/%p", 1, path, 8), -ENAMETOOLONG);

    struct stats_conn a;
    stats_conn_open(&a, 1, STATS_RECV, "peer");
    stats_add(&a.c.bytes_recv, 11);
    assert_int_equal(stats_write_file(tmpl), 0);
    stats_file_name(tmpl, (long)getpid(), path, sizeof(path));
    char *t = slurp(path);
    assert_non_null(t);
    assert_non_null(strstr(t, "erdma_device_bytes_received_total{device=\"siw0\""));
    assert_non_null(strstr(t, "} 11\n"));
    stats_add(&a.c.bytes_recv, 11);
    assert_int_equal(stats_write_file(tmpl), 0);
    t = slurp(path);
    assert_non_null(strstr(t, "} 22\n"));
    assert_null(strstr(t, "} 11\n"));
    /* nothing but the one file is left behind */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "test $(ls %s | wc -l) = 1", dir);
    assert_int_equal(system(cmd), 0);
    /* a link planted where the temporary goes: its target is left alone */
    char tmp[200], victim[160];
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    FILE *v = fopen(victim, "w");
    assert_non_null(v);
    fputs("keep me\n", v);
    fclose(v);
    assert_int_equal(symlink(victim, tmp), 0);
    assert_int_equal(stats_write_file(tmpl), 0);
    t = slurp(victim);
    assert_string_equal(t, "keep me\n");
    assert_non_null(strstr(slurp(path), "} 22\n"));
    unlink(victim);
    unlink(path);
    rmdir(dir);
    /* a directory that does not exist is an error, not a crash */
    assert_true(stats_write_file("/nonexistent-dir-erdma/x.prom") < 0);
    stats_conn_close(&a);
}

/* write(2) as this test binary sees it (the plugin's code is linked in): while a test arms it,
 * a write to a file whose name holds "erdma-hang-" blocks, as on a filesystem that hangs (NFS),
 * until the test lets it go or 5 s pass. Everything else goes straight to the kernel. */
enum { HANG_OFF, HANG_ARMED, HANG_BLOCKED, HANG_RELEASED };
static int hang_state;

static bool is_hang_file(int fd) {
    char link[64], target[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n <= 0) return false;
    target[n] = 0;
    return strstr(target, "erdma-hang-") != NULL;
}

ssize_t write(int fd, const void *buf, size_t len) {
    int armed = HANG_ARMED;
    if (__atomic_load_n(&hang_state, __ATOMIC_ACQUIRE) == HANG_ARMED && is_hang_file(fd) &&
        __atomic_compare_exchange_n(&hang_state, &armed, HANG_BLOCKED, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        for (int i = 0; i < 500 && __atomic_load_n(&hang_state, __ATOMIC_ACQUIRE) == HANG_BLOCKED;
             i++)
            usleep(10000);
    return syscall(SYS_write, fd, buf, len);
}

static void *write_file_thread(void *tmpl) {
    return (void *)(intptr_t)stats_write_file(tmpl);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Connect, accept and close take the registry lock: a stats file stuck in write() must not
 * hold it. */
static void test_hung_file_write_leaves_registry_free(void **state) {
    char dir[] = "/tmp/erdma-stats-XXXXXX", tmpl[128], path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(tmpl, sizeof(tmpl), "%s/erdma-hang-%%p.prom", dir);
    struct stats_conn a, b;
    stats_conn_open(&a, 0, STATS_SEND, "peer-a");
    stats_add(&a.c.bytes_sent, 4242);
    __atomic_store_n(&hang_state, HANG_ARMED, __ATOMIC_RELEASE);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, write_file_thread, tmpl), 0);
    for (int i = 0; i < 300 && __atomic_load_n(&hang_state, __ATOMIC_ACQUIRE) != HANG_BLOCKED; i++)
        usleep(10000);
    /* the file's bytes go out through write(2): stuck there now */
    assert_int_equal(__atomic_load_n(&hang_state, __ATOMIC_ACQUIRE), HANG_BLOCKED);
    double t0 = mono_s();
    stats_conn_open(&b, 1, STATS_RECV, "peer-b"); /* a connection being set up */
    stats_conn_close(&a);                         /* and one closing */
    double waited = mono_s() - t0;
    bool still_blocked = __atomic_load_n(&hang_state, __ATOMIC_ACQUIRE) == HANG_BLOCKED;
    __atomic_store_n(&hang_state, HANG_RELEASED, __ATOMIC_RELEASE);
    void *ret;
    pthread_join(t, &ret);
    __atomic_store_n(&hang_state, HANG_OFF, __ATOMIC_RELEASE);
    print_message("registry calls during a stuck stats write took %.3f s\n", waited);
    assert_true(still_blocked); /* they returned while the write was stuck, not after it */
    assert_true(waited < 2.0);
    assert_int_equal((int)(intptr_t)ret, 0);
    stats_file_name(tmpl, (long)getpid(), path, sizeof(path));
    char *text = slurp(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "} 4242\n")); /* the counts as they were when it started */
    stats_conn_close(&b);
    unlink(path);
    rmdir(dir);
}

static bool wait_for(const char *path, const char *needle, int ms) {
    for (int i = 0; i < ms / 20; i++) {
        char *t = slurp(path);
        if (t && strstr(t, needle)) return true;
        usleep(20000);
    }
    return false;
}

/* The writer thread, twice (a re-init after finalize, as after dlclose and dlopen). */
static void test_writer_thread(void **state) {
    stats_stop(); /* the fixture's, without a file */
    char dir[] = "/tmp/erdma-stats-XXXXXX", tmpl[128], path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(tmpl, sizeof(tmpl), "%s/w-%%p.prom", dir);
    stats_file_name(tmpl, (long)getpid(), path, sizeof(path));
    setenv("NCCL_ERDMA_STATS_FILE", tmpl, 1);
    setenv("NCCL_ERDMA_STATS_INTERVAL", "1", 1);
    assert_int_equal(params_load(), 0);
    for (int round = 0; round < 2; round++) {
        unit_log_start();
        assert_int_equal(stats_start(2, names), 0);
        assert_true(wait_for(path, "erdma_device_bytes_sent_total{device=\"rxe0\"", 500));
        struct stats_conn a;
        stats_conn_open(&a, 0, STATS_SEND, "p");
        stats_add(&a.c.bytes_sent, 31337);
        /* the thread writes it within an interval, with no call from us */
        assert_true(wait_for(path, "} 31337\n", 2500));
        stats_add(&a.c.bytes_sent, 1);
        stats_conn_close(&a);
        stats_stop(); /* joins the thread and writes the final counts */
        assert_non_null(strstr(slurp(path), "pid=\""));
        assert_true(wait_for(path, "erdma_device_bytes_sent_total{device=\"rxe0\"", 20));
        assert_true(wait_for(path, "} 31338\n", 20));
        assert_logged(NCCL_LOG_INFO, "rxe0: sent 30.6 KiB in 0 messages");
        assert_logged(NCCL_LOG_INFO, "siw0: sent 0 B");
    }
    unlink(path);
    rmdir(dir);
    unsetenv("NCCL_ERDMA_STATS_FILE");
    unsetenv("NCCL_ERDMA_STATS_INTERVAL");
    params_load();
    stats_start(2, names); /* for the teardown */
}

static void test_bad_path_warns(void **state) {
    stats_stop();
    setenv("NCCL_ERDMA_STATS_FILE", "/nonexistent-dir-erdma/s-%p.prom", 1);
    params_load();
    unit_log_start();
    assert_int_equal(stats_start(1, names), 0); /* never fails init */
    assert_logged(NCCL_LOG_WARN, "cannot write the stats file", "/nonexistent-dir-erdma");
    stats_stop();
    unsetenv("NCCL_ERDMA_STATS_FILE");
    params_load();
    stats_start(2, names);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fold_at_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_and_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prometheus_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_path_warns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hung_file_write_leaves_registry_free, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
