/* NCCL_IB_HCA parsing and matching (hca_filter.c): NCCL's syntax, and clear refusals. */
#include "hca_filter.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static struct hca_filter f;
static char err[160];

static int parse(const char *spec) {
    memset(err, 0, sizeof(err));
    return hca_filter_parse(spec, &f, err, sizeof(err));
}

static void test_null_and_empty_keep_all(void **state) {
    const char *specs[] = {NULL, "", "   ", ",", ",,,"};
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        assert_int_equal(parse(specs[i]), 0);
        assert_int_equal(f.count, 0);
        assert_false(f.exclude);
        assert_true(hca_filter_match(&f, "erdma_0", 1));
        assert_true(hca_filter_match(&f, "mlx5_3", 2));
    }
}

static void test_prefix_match(void **state) {
    assert_int_equal(parse("erdma"), 0);
    assert_int_equal(f.count, 1);
    assert_false(f.exact);
    assert_string_equal(f.entries[0].name, "erdma");
    assert_int_equal(f.entries[0].port, -1);
    assert_true(hca_filter_match(&f, "erdma_0", 1));
    assert_true(hca_filter_match(&f, "erdma_1", 1));
    assert_true(hca_filter_match(&f, "erdma", 1));
    assert_false(hca_filter_match(&f, "mlx5_0", 1));
    assert_false(hca_filter_match(&f, "erdm", 1));
    /* prefix: erdma_1 also takes erdma_10 (NCCL does the same) */
    assert_int_equal(parse("erdma_1"), 0);
    assert_true(hca_filter_match(&f, "erdma_10", 1));
    assert_false(hca_filter_match(&f, "erdma_0", 1));
}

static void test_exact_match(void **state) {
    assert_int_equal(parse("=erdma_1"), 0);
    assert_true(f.exact);
    assert_false(f.exclude);
    assert_true(hca_filter_match(&f, "erdma_1", 1));
    assert_false(hca_filter_match(&f, "erdma_10", 1));
    assert_false(hca_filter_match(&f, "erdma_", 1));
    assert_false(hca_filter_match(&f, "erdma_0", 1));
}

static void test_port_restricts(void **state) {
    assert_int_equal(parse("erdma_0:1"), 0);
    assert_int_equal(f.entries[0].port, 1);
    assert_string_equal(f.entries[0].name, "erdma_0");
    assert_true(hca_filter_match(&f, "erdma_0", 1));
    assert_false(hca_filter_match(&f, "erdma_0", 2));
    assert_int_equal(parse("mlx5_0:255"), 0);
    assert_int_equal(f.entries[0].port, 255);
    assert_true(hca_filter_match(&f, "mlx5_0", 255));
}

static void test_exclude(void **state) {
    assert_int_equal(parse("^erdma_1"), 0);
    assert_true(f.exclude);
    assert_false(f.exact);
    assert_true(hca_filter_match(&f, "erdma_0", 1));
    assert_false(hca_filter_match(&f, "erdma_1", 1));
    assert_false(hca_filter_match(&f, "erdma_12", 1));
}

static void test_list_of_several(void **state) {
    assert_int_equal(parse("mlx5_0:1,erdma_1"), 0);
    assert_int_equal(f.count, 2);
    assert_true(hca_filter_match(&f, "mlx5_0", 1));
    assert_false(hca_filter_match(&f, "mlx5_0", 2));
    assert_true(hca_filter_match(&f, "erdma_1", 7));
    assert_false(hca_filter_match(&f, "erdma_0", 1));
    /* empty items in the list are ignored, leading blanks too */
    assert_int_equal(parse("  ,erdma_0,,erdma_1,"), 0);
    assert_int_equal(f.count, 2);
    assert_string_equal(f.entries[1].name, "erdma_1");
}

static void test_exclude_exact_combo(void **state) {
    assert_int_equal(parse("^=erdma_0:1,erdma_1"), 0);
    assert_true(f.exclude);
    assert_true(f.exact);
    assert_int_equal(f.count, 2);
    assert_false(hca_filter_match(&f, "erdma_0", 1)); /* excluded port */
    assert_true(hca_filter_match(&f, "erdma_0", 2));  /* other port of it stays */
    assert_false(hca_filter_match(&f, "erdma_1", 1));
    assert_false(hca_filter_match(&f, "erdma_1", 2));
    assert_true(hca_filter_match(&f, "erdma_10", 1)); /* exact: not a prefix */
    assert_true(hca_filter_match(&f, "mlx5_0", 1));
}

static void test_bad_ports_rejected(void **state) {
    const char *bad[] = {"x:0", "x:abc", "x:1x", "x:-1", "x:256", "erdma_0,x:0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse(bad[i]), -EINVAL);
        assert_non_null(strstr(err, "invalid port"));
        assert_non_null(strstr(err, "x"));
    }
}

static void test_empty_name_rejected(void **state) {
    assert_int_equal(parse(":1"), -EINVAL);
    assert_non_null(strstr(err, "invalid device name"));
    assert_int_equal(parse("=,:2"), -EINVAL);
    assert_true(err[0] != 0);
}

static void test_too_many_entries(void **state) {
    char spec[HCA_FILTER_MAX * 8 + 16] = "";
    for (int i = 0; i < HCA_FILTER_MAX; i++) {
        char item[16];
        snprintf(item, sizeof(item), "%sd%d", i ? "," : "", i);
        strcat(spec, item);
    }
    assert_int_equal(parse(spec), 0);
    assert_int_equal(f.count, HCA_FILTER_MAX);
    assert_true(hca_filter_match(&f, "d31", 1));
    strcat(spec, ",d32");
    assert_int_equal(parse(spec), -EINVAL);
    assert_non_null(strstr(err, "more than 32 entries"));
}

static void test_long_names(void **state) {
    char name[200];
    /* 63 characters fit the 64-byte name */
    memset(name, 'a', 63);
    name[63] = 0;
    assert_int_equal(parse(name), 0);
    assert_int_equal(strlen(f.entries[0].name), 63);
    /* 64 do not */
    memset(name, 'a', 64);
    name[64] = 0;
    assert_int_equal(parse(name), -EINVAL);
    assert_non_null(strstr(err, "invalid device name"));
    /* and a very long item is refused before it is copied */
    memset(name, 'b', 150);
    strcpy(name + 150, ":1");
    assert_int_equal(parse(name), -EINVAL);
    assert_non_null(strstr(err, "too long"));
    assert_true(strlen(err) < sizeof(err));
}

/* NCCL 2.28+: dev:port:rail:plane. Rail and plane are reported, never used to match. */
static void test_rail_and_plane(void **state) {
    assert_int_equal(parse("erdma_0:1:0:0,erdma_1:1:3:1"), 0);
    assert_int_equal(f.count, 2);
    assert_int_equal(f.entries[0].port, 1);
    assert_int_equal(f.entries[0].rail, 0);
    assert_int_equal(f.entries[0].plane, 0);
    assert_int_equal(f.entries[1].rail, 3);
    assert_int_equal(f.entries[1].plane, 1);
    assert_true(hca_filter_match(&f, "erdma_1", 1));
    assert_false(hca_filter_match(&f, "erdma_1", 2));
    assert_int_equal(hca_filter_entry(&f, "erdma_1", 1), 1);
    assert_int_equal(hca_filter_entry(&f, "erdma_0", 1), 0);
    assert_int_equal(hca_filter_entry(&f, "erdma_2", 1), -1);
    /* rail without plane; bounds */
    assert_int_equal(parse("=erdma_0:1:32767"), 0);
    assert_int_equal(f.entries[0].rail, 32767);
    assert_int_equal(f.entries[0].plane, -1);
    assert_int_equal(parse("erdma_0:1:5:16383"), 0);
    assert_int_equal(f.entries[0].plane, 16383);
    /* fields not given stay undefined */
    assert_int_equal(parse("erdma_0:1,erdma_1"), 0);
    assert_int_equal(f.entries[0].rail, -1);
    assert_int_equal(f.entries[1].port, -1);
    assert_int_equal(f.entries[1].rail, -1);
    assert_int_equal(f.entries[1].plane, -1);
    assert_int_equal(hca_filter_entry(&f, "erdma_1", 1), 1);
    /* an exclude list selects no entry: its devices have no user rail (net_ib likewise) */
    assert_int_equal(parse("^erdma_0:1:2:0"), 0);
    assert_int_equal(hca_filter_entry(&f, "erdma_1", 1), -1);
    assert_int_equal(hca_filter_entry(&f, "erdma_0", 1), -1);
    /* empty list: no entry */
    assert_int_equal(parse(""), 0);
    assert_int_equal(hca_filter_entry(&f, "erdma_0", 1), -1);
}

/* An empty field is one not given, as NCCL 2.28+ parses it: net_ib's own "Using" line prints
 * a plane without a rail as dev:port::plane, and that form (or a trailing colon) failed the
 * plugin's init, so NCCL fell back to another transport. */
static void test_empty_fields_not_given(void **state) {
    assert_int_equal(parse("erdma_0:1::3,erdma_1::2,erdma_2:"), 0);
    assert_int_equal(f.count, 3);
    assert_int_equal(f.entries[0].port, 1);
    assert_int_equal(f.entries[0].rail, -1);
    assert_int_equal(f.entries[0].plane, 3);
    assert_int_equal(f.entries[1].port, -1); /* any port */
    assert_int_equal(f.entries[1].rail, 2);
    assert_int_equal(f.entries[1].plane, -1);
    assert_string_equal(f.entries[2].name, "erdma_2");
    assert_int_equal(f.entries[2].port, -1);
    assert_true(hca_filter_match(&f, "erdma_1", 2));
    assert_int_equal(parse("erdma_0:1:0:"), 0);
    assert_int_equal(f.entries[0].rail, 0);
    assert_int_equal(f.entries[0].plane, -1);
}

/* Spaces around an entry (a list typed as "erdma_0, erdma_1") are not part of a device name:
 * " erdma_1" matched nothing, and its NIC was silently left out. */
static void test_spaces_around_entries(void **state) {
    assert_int_equal(parse(" erdma_0 ,  erdma_1:1 "), 0);
    assert_int_equal(f.count, 2);
    assert_string_equal(f.entries[0].name, "erdma_0");
    assert_string_equal(f.entries[1].name, "erdma_1");
    assert_int_equal(f.entries[1].port, 1);
    assert_true(hca_filter_match(&f, "erdma_1", 1));
    assert_int_equal(parse("^ erdma_0"), 0);
    assert_true(f.exclude);
    assert_false(hca_filter_match(&f, "erdma_0", 1));
}

static void test_bad_rail_and_plane_rejected(void **state) {
    const struct {
        const char *spec, *why;
    } bad[] = {
        {"erdma_0:1:x", "invalid rail"},     {"erdma_0:1:-1", "invalid rail"},
        {"erdma_0:1:32768", "invalid rail"}, {"erdma_0:1:0:16384", "invalid plane"},
        {"erdma_0:1:0:-2", "invalid plane"}, {"erdma_0:1:0:0:0", "more than dev:port:rail:plane"},
        {"erdma_0:0:0:0", "invalid port"},   {"ok,erdma_0:1:0:1z", "invalid plane"},
        {"erdma_0:1 2", "invalid port"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse(bad[i].spec), -EINVAL);
        assert_non_null(strstr(err, bad[i].why));
        assert_non_null(strstr(err, "erdma_0:")); /* the whole entry is quoted */
    }
}

static void test_small_error_buffer(void **state) {
    char tiny[8];
    memset(tiny, 'z', sizeof(tiny));
    assert_int_equal(hca_filter_parse("erdma_0:abc", &f, tiny, sizeof(tiny)), -EINVAL);
    assert_int_equal(tiny[sizeof(tiny) - 1], 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_and_empty_keep_all),
        cmocka_unit_test(test_prefix_match),
        cmocka_unit_test(test_exact_match),
        cmocka_unit_test(test_port_restricts),
        cmocka_unit_test(test_exclude),
        cmocka_unit_test(test_list_of_several),
        cmocka_unit_test(test_exclude_exact_combo),
        cmocka_unit_test(test_bad_ports_rejected),
        cmocka_unit_test(test_empty_name_rejected),
        cmocka_unit_test(test_too_many_entries),
        cmocka_unit_test(test_long_names),
        cmocka_unit_test(test_rail_and_plane),
        cmocka_unit_test(test_bad_rail_and_plane_rejected),
        cmocka_unit_test(test_empty_fields_not_given),
        cmocka_unit_test(test_spaces_around_entries),
        cmocka_unit_test(test_small_error_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
