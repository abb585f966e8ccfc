/*
 * The registration cache (mr_cache.c) and the regMr/deregMr entry points (net.c) over
 * the fake verbs provider: page-aligned sharing, refcounts, release at finalize, and
 * the errors a user sees.
 */
#define _GNU_SOURCE
#include "comm.h"
#include "device.h"
#include "fake_verbs.h"
#include "mr_cache.h"
#include "net.h"
#include "unit_log.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static struct mr_cache *cache;

/* regMrDmaBuf with no descriptor (fd -1) registers the pointer as regMr does, as net_ib's
 * registration does (reg.cc: fd != -1 picks dma-buf): on a device with peer memory it is a
 * plain registration of GPU memory, not a dma-buf import of descriptor -1 (EBADF). */
static void test_dmabuf_call_without_fd(void **state) {
    assert_int_equal(fake_env_stop(), 0);
    const char *env[] = {"NCCL_ERDMA_GDR=1", NULL}; /* peer memory, whatever sysfs says */
    assert_int_equal(fake_env_start(1, NULL, env), 1);
    cache = device_get(0)->mrs;
    void *s, *r, *mh = NULL;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    char *buf = malloc(8192);
    unit_log_count = 0;
    int rc = erdma_reg_mr_dmabuf(s, buf, 8192, NCCL_PTR_CUDA, 0, -1, &mh);
    if (rc) unit_log_print();
    assert_int_equal(rc, 0);
    assert_int_equal(erdma_dereg_mr(s, mh), 0);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    free(buf);
}

/* A failed registration of GPU memory only happens once peer memory is there (without it,
 * regMr of GPU memory is refused first): "load nvidia_peermem" is then no help. Out of
 * memory is the GPU's BAR1 space or the locked-memory limit; other failures point at the
 * peer-memory module and dmesg. */
static void test_gpu_registration_failure_hints(void **state) {
    char *buf = aligned_alloc(4096, 4096);
    struct erdma_mr *m = NULL;
    unit_log_count = 0;
    fake_fail_next_reg(ENOMEM);
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_CUDA, &m), -ENOMEM);
    assert_logged(NCCL_LOG_WARN, "fake0", "BAR1");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, "load nvidia_peermem"));
    unit_log_count = 0;
    fake_fail_next_reg(EFAULT);
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_CUDA, &m), -EFAULT);
    assert_logged(NCCL_LOG_WARN, "fake0", "lsmod | grep nvidia_peermem");
    free(buf);
}

static int setup(void **state) {
    unit_log_start();
    assert_int_equal(fake_env_start(1, NULL, NULL), 1);
    cache = device_get(0)->mrs;
    return 0;
}

static int teardown(void **state) {
    int leaked = fake_env_stop();
    erdma_log_set(NULL);
    assert_int_equal(leaked, 0);
    return 0;
}

static void test_subrange_shares_one_registration(void **state) {
    char *buf = aligned_alloc(4096, 3 * 4096);
    struct erdma_mr *a, *b, *c;
    assert_int_equal(mr_cache_get(cache, buf, 3 * 4096, NCCL_PTR_HOST, &a), 0);
    assert_int_equal(mr_cache_get(cache, buf + 100, 200, NCCL_PTR_HOST, &b), 0);
    assert_ptr_equal(a, b); /* inside: a lookup */
    assert_int_equal(a->refs, 2);
    assert_int_equal(a->base, (uintptr_t)buf);
    assert_int_equal(a->len, 3 * 4096);
    assert_int_equal(mr_cache_count(cache), 1);
    /* overhanging the registered range: a new registration */
    assert_int_equal(mr_cache_get(cache, buf + 2 * 4096, 8192, NCCL_PTR_HOST, &c), 0);
    assert_ptr_not_equal(a, c);
    assert_int_equal(mr_cache_count(cache), 2);
    /* another pointer type never shares */
    struct erdma_mr *d;
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_CUDA, &d), 0);
    assert_ptr_not_equal(a, d);
    mr_cache_put(b);
    assert_int_equal(mr_cache_count(cache), 3); /* a still referenced */
    mr_cache_put(a);
    mr_cache_put(c);
    mr_cache_put(d);
    assert_int_equal(mr_cache_count(cache), 0);
    free(buf);
}

struct reg_job {
    void *buf;
    size_t len;
    struct erdma_mr *mr;
    int rc;
    volatile bool done;
};

static void *reg_main(void *arg) {
    struct reg_job *j = arg;
    j->rc = mr_cache_get(cache, j->buf, j->len, NCCL_PTR_HOST, &j->mr);
    j->done = true;
    return NULL;
}

/* Waits (bounded: a hang fails, it does not stall the suite) until done is set. */
static bool wait_done(volatile bool *done) {
    for (int i = 0; i < 5000 && !*done; i++)
        usleep(1000);
    return *done;
}

/* A registration that takes long (pinning a large buffer) holds only its caller: the cache's
 * lock was held across it, and every regMr and deregMr on the device, from every comm and
 * thread, waited behind it. Two threads that register the same range at once both pin it, and
 * the one that finishes second takes the other's entry and releases its own. */
static void test_slow_registration_holds_only_its_caller(void **state) {
    char *slow = aligned_alloc(4096, 4096), *quick = aligned_alloc(4096, 4096);
    struct reg_job a = {.buf = slow, .len = 4096}, b = {.buf = quick, .len = 4096};
    pthread_t ta, tb;
    fake_call_gate(slow);
    assert_int_equal(pthread_create(&ta, NULL, reg_main, &a), 0);
    for (int i = 0; i < 5000 && !fake_call_gate_waiting(); i++)
        usleep(1000);
    assert_true(fake_call_gate_waiting());
    assert_int_equal(pthread_create(&tb, NULL, reg_main, &b), 0);
    bool quick_done = wait_done(&b.done); /* while a's registration is still held */
    struct reg_job c = {.buf = slow, .len = 4096};
    bool same_done = quick_done && (reg_main(&c), c.done); /* the same range, meanwhile */
    fake_call_gate(NULL);
    assert_int_equal(pthread_join(ta, NULL), 0);
    assert_int_equal(pthread_join(tb, NULL), 0);
    assert_true(quick_done);
    assert_true(same_done);
    assert_int_equal(a.rc, 0);
    assert_int_equal(b.rc, 0);
    assert_int_equal(c.rc, 0);
    assert_ptr_equal(a.mr, c.mr); /* one entry for the range */
    assert_int_equal(a.mr->refs, 2);
    assert_int_equal(mr_cache_count(cache), 2);
    mr_cache_put(a.mr);
    mr_cache_put(b.mr);
    mr_cache_put(c.mr);
    assert_int_equal(mr_cache_count(cache), 0);
    free(slow);
    free(quick);
}

static void test_zero_length_and_unaligned(void **state) {
    char *buf = malloc(10);
    struct erdma_mr *m;
    assert_int_equal(mr_cache_get(cache, buf + 3, 0, NCCL_PTR_HOST, &m), 0);
    assert_true(m->base <= (uintptr_t)buf + 3);
    assert_true(m->base + m->len > (uintptr_t)buf + 3);
    assert_int_equal(m->base % 4096, 0);
    mr_cache_put(m);
    free(buf);
}

static void test_errors_are_named(void **state) {
    struct erdma_mr *m = NULL;
    unit_log_count = 0;
    assert_int_equal(mr_cache_get(cache, NULL, 10, NCCL_PTR_HOST, &m), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "NULL pointer");
    /* a size that wraps: it rounded to a range below its start, and a cached registration
     * was handed out as covering it */
    char *buf = aligned_alloc(4096, 4096);
    struct erdma_mr *a = NULL;
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_HOST, &a), 0);
    assert_int_equal(mr_cache_get(cache, buf + 64, SIZE_MAX - 100, NCCL_PTR_HOST, &m), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "past the end of the address space");
    mr_cache_put(a);
    free(buf);
    /* the fake device answers EOPNOTSUPP to dma-buf, as eRDMA */
    assert_int_equal(mr_cache_get_dmabuf(cache, (void *)0x1000, 4096, 0, 3, &m), -EOPNOTSUPP);
    assert_logged(NCCL_LOG_WARN, "fake0", "dma-buf");
}

/* A pointer in the last page: UINTPTR_MAX - data - page wrapped, the guard let it through, and
 * its range rounded to [base, 0), which the cached registration "covered". */
static void test_last_page_is_refused(void **state) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    char *buf = aligned_alloc(4096, 4096);
    struct erdma_mr *a = NULL, *m = NULL;
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_HOST, &a), 0);
    unit_log_count = 0;
    assert_int_equal(mr_cache_get(cache, (void *)(UINTPTR_MAX - 0x7ff), 0x100, NCCL_PTR_HOST, &m),
                     -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "past the end of the address space");
    assert_int_equal(mr_cache_get(cache, (void *)(UINTPTR_MAX - page + 1), 0, NCCL_PTR_HOST, &m),
                     -EINVAL);
    /* the page below the last one still registers: its rounded end is the last page's start */
    assert_int_equal(mr_cache_get(cache, (void *)(UINTPTR_MAX - page), 0, NCCL_PTR_HOST, &m), 0);
    assert_ptr_not_equal(m, a);
    mr_cache_put(m);
    mr_cache_put(a);
    free(buf);
}

/* Through the API: a comm names the device, and deregMr of NULL is a no-op. */
static void test_api_entry_points(void **state) {
    void *s, *r;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    char *buf = malloc(8192);
    void *mh1 = NULL, *mh2 = NULL;
    assert_int_equal(erdma_reg_mr(s, buf, 8192, NCCL_PTR_HOST, &mh1), 0);
    assert_int_equal(erdma_reg_mr(r, buf, 8192, NCCL_PTR_HOST, &mh2), 0);
    assert_ptr_equal(mh1, mh2); /* one PD per device: regIsGlobal */
    unit_log_count = 0;
    assert_int_equal(erdma_reg_mr(s, buf, 8192, 77, &mh1), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "unknown pointer type 77");
    assert_int_equal(erdma_reg_mr(s, buf, 8192, NCCL_PTR_CUDA, &mh1), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "GPU Direct RDMA is off");
    assert_int_equal(erdma_reg_mr(buf, buf, 8192, NCCL_PTR_HOST, &mh1), -EINVAL); /* not a comm */
    assert_int_equal(erdma_dereg_mr(s, NULL), 0);
    assert_int_equal(erdma_dereg_mr(s, mh2), 0);
    assert_int_equal(erdma_dereg_mr(r, mh2), 0);
    assert_int_equal(mr_cache_count(cache), 0);
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    free(buf);
}

/* Registrations NCCL never released go at finalize (devices_release), once. */
static void test_live_at_finalize_released(void **state) {
    char *buf = malloc(4096);
    struct erdma_mr *m;
    assert_int_equal(mr_cache_get(cache, buf, 4096, NCCL_PTR_HOST, &m), 0);
    unit_log_count = 0;
    devices_release(); /* teardown's fake_env_stop then counts no leaked MR */
    assert_logged(NCCL_LOG_INFO, "fake0", "1 registration(s) still live");
    free(buf);
}

/* Without peer memory, GPU memory reaches a dma-buf capable device only as a dma-buf: it is
 * not NCCL_PTR_CUDA (NCCL would then register GPU memory with regMr, which needs peer
 * memory); regMrDmaBuf takes it, and a regMr of GPU memory is refused, naming dma-buf. */
static void test_dmabuf_only_device(void **state) {
    assert_int_equal(fake_env_stop(), 0);
    struct fake_dev_cfg cfg = {.dmabuf = true};
    assert_int_equal(fake_env_start(1, &cfg, NULL), 1); /* no sysfs: no peer memory */
    cache = device_get(0)->mrs;
    void *s, *r;
    assert_int_equal(fake_pair_connect(0, 0, &s, &r), 0);
    char *buf = malloc(8192);
    void *mh = NULL;
    unit_log_count = 0;
    assert_int_equal(erdma_reg_mr(s, buf, 8192, NCCL_PTR_CUDA, &mh), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "only as a dma-buf (regMrDmaBuf with its descriptor)");
    /* a closed descriptor: said as GPU dma-buf memory, with no memlock advice (the exporter
     * pins it; the locked-memory limit does not apply) */
    unit_log_count = 0;
    int closed = dup(0);
    close(closed);
    assert_int_equal(erdma_reg_mr_dmabuf(s, buf, 8192, NCCL_PTR_CUDA, 0, closed, &mh), -EBADF);
    assert_logged(NCCL_LOG_WARN, "fake0", "(GPU dma-buf memory)");
    assert_logged(NCCL_LOG_WARN, "fake0", "file descriptor is not open");
    assert_false(UNIT_LOG_HAS(NCCL_LOG_WARN, "ulimit"));
    assert_int_equal(erdma_reg_mr_dmabuf(s, buf, 8192, NCCL_PTR_CUDA, 0, 0, &mh), 0);
    assert_int_equal(erdma_dereg_mr(s, mh), 0);
    /* no descriptor (-1) is a plain registration, as in net_ib: here GPU memory needs one */
    unit_log_count = 0;
    assert_int_equal(erdma_reg_mr_dmabuf(s, buf, 8192, NCCL_PTR_CUDA, 0, -1, &mh), -EINVAL);
    assert_logged(NCCL_LOG_WARN, "fake0", "only as a dma-buf (regMrDmaBuf with its descriptor)");
    assert_int_equal(erdma_close_send(s), 0);
    assert_int_equal(erdma_close_recv(r), 0);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_subrange_shares_one_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_registration_holds_only_its_caller, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_zero_length_and_unaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_are_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_page_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_entry_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_live_at_finalize_released, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dmabuf_only_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dmabuf_call_without_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_registration_failure_hints, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
