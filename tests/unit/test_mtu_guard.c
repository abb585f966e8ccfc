/* Unit tests of the LL128/MTU guard on fixture sysfs trees (tests/fixtures/mtu_guard). */
#include "log.h"
#include "mtu_guard.h"
#include "params.h"
#include "sysfs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static char warnings[8192];
static int warn_count;

static void capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                    const char *fmt, ...) {
    if (level != NCCL_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    size_t n = strlen(warnings);
    vsnprintf(warnings + n, sizeof(warnings) - n, fmt, ap);
    va_end(ap);
    strncat(warnings, "\n", sizeof(warnings) - strlen(warnings) - 1);
    warn_count++;
}

/* Environment in, parameters reloaded, log captured, sysfs at the fixture tree. */
static void env_setup(const char *guard, const char *proto) {
    if (guard)
        setenv("NCCL_ERDMA_MTU_GUARD", guard, 1);
    else
        unsetenv("NCCL_ERDMA_MTU_GUARD");
    if (proto)
        setenv("NCCL_PROTO", proto, 1);
    else
        unsetenv("NCCL_PROTO");
    params_load();
    warnings[0] = 0;
    warn_count = 0;
}

static int setup(void **state) {
    const char *fx = getenv("ERDMA_FIXTURES");
    assert_non_null(fx); /* set by ctest: never run without the fixtures */
    char root[4096];
    snprintf(root, sizeof(root), "%s/mtu_guard", fx);
    sysfs_set_root(root);
    erdma_log_set(capture);
    return 0;
}

static int teardown(void **state) {
    erdma_log_set(NULL);
    sysfs_set_root(NULL);
    unsetenv("NCCL_PROTO");
    unsetenv("NCCL_ERDMA_MTU_GUARD");
    return 0;
}

static void test_safe_mtus(void **state) {
    assert_true(mtu_is_ll128_safe(8500));
    assert_true(mtu_is_ll128_safe(1400));
    assert_false(mtu_is_ll128_safe(1500));
    assert_false(mtu_is_ll128_safe(9000));
    assert_false(mtu_is_ll128_safe(0));
}

static void test_proto_parsing(void **state) {
    assert_false(nccl_proto_excludes_ll128(NULL));
    assert_false(nccl_proto_excludes_ll128(""));
    assert_true(nccl_proto_excludes_ll128("^LL128"));
    assert_true(nccl_proto_excludes_ll128("^ll,ll128"));
    assert_true(nccl_proto_excludes_ll128("Simple"));
    assert_true(nccl_proto_excludes_ll128("LL,Simple"));
    assert_false(nccl_proto_excludes_ll128("^LL"));
    assert_false(nccl_proto_excludes_ll128("LL128"));
    assert_false(nccl_proto_excludes_ll128("simple,LL128"));
    /* split on commas only and compared whole, as NCCL's parseList: " LL128" is no LL128 */
    assert_false(nccl_proto_excludes_ll128("^LL, LL128"));
    assert_false(nccl_proto_excludes_ll128("^LL128 "));
    assert_true(nccl_proto_excludes_ll128("Simple, LL128"));
    /* per-collective syntax is not understood: assume LL128 may run */
    assert_false(nccl_proto_excludes_ll128("allreduce:simple"));
}

static void test_safe_netdevs_do_not_warn(void **state) {
    env_setup(NULL, NULL);
    const char *nds[] = {"eth8500", "eth1400"};
    assert_int_equal(mtu_guard_check(nds, 2, MTU_GUARD_WARN), 0);
    assert_int_equal(warn_count, 0);
    assert_null(getenv("NCCL_PROTO"));
}

static void test_unsafe_mtu_warns_with_name_mtu_and_fix(void **state) {
    env_setup(NULL, NULL);
    const char *nds[] = {"eth8500", "eth1500", "eth1500"}; /* duplicate checked once */
    assert_int_equal(mtu_guard_check(nds, 3, MTU_GUARD_WARN), 1);
    assert_int_equal(warn_count, 1);
    assert_non_null(strstr(warnings, "eth1500 MTU 1500"));
    assert_non_null(strstr(warnings, "ip link set eth1500 mtu 8500"));
    assert_non_null(strstr(warnings, "NCCL_PROTO=^LL128"));
    assert_null(getenv("NCCL_PROTO")); /* warn mode never changes the environment */
}

static void test_jumbo_9000_is_unsafe(void **state) {
    env_setup("warn", NULL);
    const char *nds[] = {"eth9000"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_WARN), 1);
    assert_non_null(strstr(warnings, "eth9000 MTU 9000"));
}

static void test_proto_excluding_ll128_silences(void **state) {
    env_setup(NULL, "^LL128");
    const char *nds[] = {"eth1500"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_WARN), 0);
    assert_int_equal(warn_count, 0);
}

static void test_disable_ll128_sets_proto(void **state) {
    env_setup("disable-ll128", NULL);
    const char *nds[] = {"eth1500", "eth9000"};
    assert_int_equal(mtu_guard_check(nds, 2, MTU_GUARD_DISABLE_LL128), 1);
    assert_non_null(getenv("NCCL_PROTO"));
    assert_string_equal(getenv("NCCL_PROTO"), "^LL128");
    assert_int_equal(warn_count, 1); /* eth9000 is then covered by the exclusion */
    assert_non_null(strstr(warnings, "set NCCL_PROTO=^LL128"));
}

/* NCCL_PROTO= (set, empty: what a job template leaves) means NCCL's defaults, LL128 included
 * (its parser reads no token). It counts as unset: the exclusion must replace it, and the
 * log must not claim an exclusion the environment does not hold. */
static void test_disable_ll128_replaces_empty_proto(void **state) {
    env_setup("disable-ll128", "");
    const char *nds[] = {"eth1500"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_DISABLE_LL128), 1);
    assert_non_null(getenv("NCCL_PROTO"));
    assert_string_equal(getenv("NCCL_PROTO"), "^LL128");
    assert_non_null(strstr(warnings, "set NCCL_PROTO=^LL128"));
}

static void test_disable_ll128_keeps_user_proto(void **state) {
    env_setup("disable-ll128", "LL128,Simple");
    const char *nds[] = {"eth1500"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_DISABLE_LL128), 1);
    assert_string_equal(getenv("NCCL_PROTO"), "LL128,Simple");
    assert_non_null(strstr(warnings, "NCCL_PROTO is set and still allows LL128"));
}

static void test_off_checks_nothing(void **state) {
    env_setup("off", NULL);
    const char *nds[] = {"eth1500"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_OFF), 0);
    assert_int_equal(warn_count, 0);
    assert_null(getenv("NCCL_PROTO"));
}

static void test_unreadable_mtu_warns(void **state) {
    env_setup(NULL, NULL);
    const char *nds[] = {"ethmissing"};
    assert_int_equal(mtu_guard_check(nds, 1, MTU_GUARD_WARN), 0);
    assert_int_equal(warn_count, 1);
    assert_non_null(strstr(warnings, "/sys/class/net/ethmissing/mtu"));
}

static void test_bad_mode_falls_back_to_warn(void **state) {
    env_setup("bogus", NULL);
    /* no devices discovered: nothing to check, but the bad value is reported */
    assert_int_equal(mtu_guard_run(), 0);
    assert_non_null(strstr(warnings, "NCCL_ERDMA_MTU_GUARD=\"bogus\""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safe_mtus),
        cmocka_unit_test(test_proto_parsing),
        cmocka_unit_test(test_safe_netdevs_do_not_warn),
        cmocka_unit_test(test_unsafe_mtu_warns_with_name_mtu_and_fix),
        cmocka_unit_test(test_jumbo_9000_is_unsafe),
        cmocka_unit_test(test_proto_excluding_ll128_silences),
        cmocka_unit_test(test_disable_ll128_sets_proto),
        cmocka_unit_test(test_disable_ll128_replaces_empty_proto),
        cmocka_unit_test(test_disable_ll128_keeps_user_proto),
        cmocka_unit_test(test_off_checks_nothing),
        cmocka_unit_test(test_unreadable_mtu_warns),
        cmocka_unit_test(test_bad_mode_falls_back_to_warn),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
