/*
 * GID classification and selection (gid.c) over tables modelled on real ones:
 * eRDMA compat mode and rxe (fe80:: at 0, ::ffff:IPv4 RoCE v2 at 1), a
 * ConnectX-style v1/v2 pair table, containers that hide the types, and an
 * iWARP table (one MAC-based entry).
 */
#include "gid.h"

#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#define TBL 16

static struct gid_entry tbl[TBL];

static void set_gid(int i, const char *text, enum gid_type type) {
    assert_int_equal(inet_pton(AF_INET6, text, tbl[i].raw), 1);
    tbl[i].type = type;
    tbl[i].valid = true;
}

/* Unused slots read as zero GIDs, as ibv_query_gid returns them. */
static void clear_table(void) {
    memset(tbl, 0, sizeof(tbl));
    for (int i = 0; i < TBL; i++)
        tbl[i].valid = true;
}

/* eRDMA compat mode (and rxe): 16 entries, fe80:: from the MAC, then the IPv4-mapped GID. */
static void erdma_compat_table(enum gid_type type) {
    clear_table();
    set_gid(0, "fe80::216:3eff:fe01:203", type);
    set_gid(1, "::ffff:172.16.0.10", type);
}

/* ConnectX-style: each address twice, RoCE v1 then v2. */
static void mlx5_table(void) {
    clear_table();
    set_gid(0, "fe80::ba59:9fff:fe12:3456", GID_TYPE_IB_ROCE_V1);
    set_gid(1, "fe80::ba59:9fff:fe12:3456", GID_TYPE_ROCE_V2);
    set_gid(2, "::ffff:10.0.0.5", GID_TYPE_IB_ROCE_V1);
    set_gid(3, "::ffff:10.0.0.5", GID_TYPE_ROCE_V2);
    set_gid(4, "2001:db8::5", GID_TYPE_IB_ROCE_V1);
    set_gid(5, "2001:db8::5", GID_TYPE_ROCE_V2);
}

static void assert_choice(struct gid_choice c, int index, bool fell_back) {
    assert_int_equal(c.index, index);
    assert_int_equal(c.fell_back, fell_back);
    if (!fell_back && index >= 0) assert_string_equal(c.reason, "");
}

static void test_classify(void **state) {
    uint8_t g[16];
    memset(g, 0, 16);
    assert_true(gid_is_zero(g));
    assert_false(gid_is_link_local(g));
    assert_false(gid_is_ipv4_mapped(g));
    inet_pton(AF_INET6, "fe80::1", g);
    assert_false(gid_is_zero(g));
    assert_true(gid_is_link_local(g));
    assert_false(gid_is_ipv4_mapped(g));
    inet_pton(AF_INET6, "febf::1", g); /* still fe80::/10 */
    assert_true(gid_is_link_local(g));
    inet_pton(AF_INET6, "fec0::1", g); /* site-local, not link-local */
    assert_false(gid_is_link_local(g));
    inet_pton(AF_INET6, "::ffff:192.168.1.7", g);
    assert_true(gid_is_ipv4_mapped(g));
    assert_false(gid_is_link_local(g));
    inet_pton(AF_INET6, "::192.168.1.7", g); /* IPv4-compatible, not mapped */
    assert_false(gid_is_ipv4_mapped(g));
    inet_pton(AF_INET6, "2001:db8::1", g);
    assert_false(gid_is_ipv4_mapped(g));
    assert_false(gid_is_link_local(g));
}

static void test_format(void **state) {
    uint8_t g[16];
    char out[64];
    inet_pton(AF_INET6, "::ffff:172.16.0.10", g);
    gid_format(g, out, sizeof(out));
    assert_string_equal(out, "::ffff:172.16.0.10");
    inet_pton(AF_INET6, "fe80::216:3eff:fe01:203", g);
    gid_format(g, out, sizeof(out));
    assert_string_equal(out, "fe80::216:3eff:fe01:203");
    memset(g, 0, 16);
    gid_format(g, out, sizeof(out));
    assert_string_equal(out, "::");
    /* a short buffer truncates but stays terminated */
    inet_pton(AF_INET6, "fe80::216:3eff:fe01:203", g);
    gid_format(g, out, 6);
    assert_string_equal(out, "fe80:");
}

static void test_type_parse(void **state) {
    assert_int_equal(gid_type_parse("RoCE v2"), GID_TYPE_ROCE_V2);
    assert_int_equal(gid_type_parse("IB/RoCE v1"), GID_TYPE_IB_ROCE_V1);
    assert_int_equal(gid_type_parse("RoCE v1"), GID_TYPE_IB_ROCE_V1);
    assert_int_equal(gid_type_parse(""), GID_TYPE_UNKNOWN);
    assert_int_equal(gid_type_parse(NULL), GID_TYPE_UNKNOWN);
    assert_int_equal(gid_type_parse("Invalid argument"), GID_TYPE_UNKNOWN);
}

static void test_compat_auto_picks_index1(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    assert_choice(gid_select(tbl, TBL, -1, true, 2), 1, false);
}

static void test_hidden_types_still_pick_index1(void **state) {
    erdma_compat_table(GID_TYPE_UNKNOWN);
    assert_choice(gid_select(tbl, TBL, -1, true, 2), 1, false);
    /* unknown type counts as a match for either version */
    assert_choice(gid_select(tbl, TBL, -1, true, 1), 1, false);
}

static void test_requested_valid(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    assert_choice(gid_select(tbl, TBL, 1, true, 2), 1, false);
    mlx5_table();
    assert_choice(gid_select(tbl, TBL, 3, true, 2), 3, false);
}

static void test_requested_link_local_falls_back(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    struct gid_choice c = gid_select(tbl, TBL, 0, true, 2);
    assert_choice(c, 1, true);
    assert_non_null(strstr(c.reason, "GID index 0"));
    assert_non_null(strstr(c.reason, "link-local"));
}

static void test_requested_out_of_range_falls_back(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    struct gid_choice c = gid_select(tbl, TBL, 16, true, 2);
    assert_choice(c, 1, true);
    assert_non_null(strstr(c.reason, "GID index 16"));
    assert_non_null(strstr(c.reason, "beyond the GID table"));
}

static void test_requested_empty_falls_back(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    struct gid_choice c = gid_select(tbl, TBL, 5, true, 2);
    assert_choice(c, 1, true);
    assert_non_null(strstr(c.reason, "GID index 5 is empty"));
}

static void test_requested_unreadable_falls_back(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    tbl[7].valid = false;
    struct gid_choice c = gid_select(tbl, TBL, 7, true, 2);
    assert_choice(c, 1, true);
    assert_non_null(strstr(c.reason, "cannot be read"));
}

static void test_index1_checked_not_trusted(void **state) {
    /* index 1 is empty (interface had no IPv4 yet): auto must not take it */
    erdma_compat_table(GID_TYPE_ROCE_V2);
    memset(tbl[1].raw, 0, 16);
    set_gid(4, "::ffff:172.16.0.11", GID_TYPE_ROCE_V2);
    assert_choice(gid_select(tbl, TBL, -1, true, 2), 4, false);
    /* and an explicit 1 falls back to it, saying why */
    struct gid_choice c = gid_select(tbl, TBL, 1, true, 2);
    assert_choice(c, 4, true);
    assert_non_null(strstr(c.reason, "GID index 1 is empty"));
}

static void test_mlx5_versions(void **state) {
    mlx5_table();
    /* index 1 is link-local: auto moves on to the first IPv4 RoCE v2 entry */
    assert_choice(gid_select(tbl, TBL, -1, true, 2), 3, false);
    assert_choice(gid_select(tbl, TBL, -1, true, 1), 2, false);
    /* asking for the v1 entry while wanting v2 is refused with the reason */
    struct gid_choice c = gid_select(tbl, TBL, 2, true, 2);
    assert_choice(c, 3, true);
    assert_non_null(strstr(c.reason, "not RoCE v2"));
    c = gid_select(tbl, TBL, 3, true, 1);
    assert_choice(c, 2, true);
    assert_non_null(strstr(c.reason, "not RoCE v1"));
}

static void test_ipv6_wanted(void **state) {
    mlx5_table();
    assert_choice(gid_select(tbl, TBL, -1, false, 2), 5, false);
    assert_choice(gid_select(tbl, TBL, -1, false, 1), 4, false);
    struct gid_choice c = gid_select(tbl, TBL, 3, false, 2);
    assert_choice(c, 5, true);
    assert_non_null(strstr(c.reason, "AF_INET6"));
    /* eRDMA has no IPv6: nothing fits */
    erdma_compat_table(GID_TYPE_ROCE_V2);
    c = gid_select(tbl, TBL, -1, false, 2);
    assert_choice(c, -1, false);
    assert_non_null(strstr(c.reason, "no IPv6 RoCE v2 GID in a table of 16 entries"));
}

static void test_roce_v1_on_v2_only_device(void **state) {
    erdma_compat_table(GID_TYPE_ROCE_V2);
    struct gid_choice c = gid_select(tbl, TBL, -1, true, 1);
    assert_choice(c, -1, false);
    assert_non_null(strstr(c.reason, "IPv4-mapped RoCE v1"));
}

static void test_no_usable_gid(void **state) {
    clear_table();
    struct gid_choice c = gid_select(tbl, TBL, -1, true, 2);
    assert_choice(c, -1, false);
    assert_non_null(strstr(c.reason, "no IPv4-mapped RoCE v2 GID in a table of 16 entries"));
    /* only link-local */
    set_gid(0, "fe80::216:3eff:fe01:203", GID_TYPE_ROCE_V2);
    c = gid_select(tbl, TBL, -1, true, 2);
    assert_int_equal(c.index, -1);
    assert_true(c.reason[0] != 0);
    /* a requested index that fails and nothing else: the requested reason is kept */
    c = gid_select(tbl, TBL, 0, true, 2);
    assert_choice(c, -1, true);
    assert_non_null(strstr(c.reason, "GID index 0 is link-local"));
}

static void test_empty_and_tiny_tables(void **state) {
    struct gid_choice c = gid_select(tbl, 0, -1, true, 2);
    assert_choice(c, -1, false);
    assert_non_null(strstr(c.reason, "table of 0 entries"));
    c = gid_select(tbl, 0, 1, true, 2);
    assert_choice(c, -1, true);
    assert_non_null(strstr(c.reason, "beyond"));
    /* iWARP: one entry, the MAC padded with zeros; never a RoCE GID */
    clear_table();
    static const uint8_t mac_gid[16] = {0x00, 0x16, 0x3e, 0x01, 0x02, 0x03};
    memcpy(tbl[0].raw, mac_gid, 16);
    c = gid_select(tbl, 1, -1, true, 2);
    assert_choice(c, -1, false);
    assert_non_null(strstr(c.reason, "table of 1 entries"));
    /* one usable entry at 0 in a table of 1: taken */
    set_gid(0, "::ffff:192.168.0.2", GID_TYPE_ROCE_V2);
    assert_choice(gid_select(tbl, 1, -1, true, 2), 0, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_type_parse),
        cmocka_unit_test(test_compat_auto_picks_index1),
        cmocka_unit_test(test_hidden_types_still_pick_index1),
        cmocka_unit_test(test_requested_valid),
        cmocka_unit_test(test_requested_link_local_falls_back),
        cmocka_unit_test(test_requested_out_of_range_falls_back),
        cmocka_unit_test(test_requested_empty_falls_back),
        cmocka_unit_test(test_requested_unreadable_falls_back),
        cmocka_unit_test(test_index1_checked_not_trusted),
        cmocka_unit_test(test_mlx5_versions),
        cmocka_unit_test(test_ipv6_wanted),
        cmocka_unit_test(test_roce_v1_on_v2_only_device),
        cmocka_unit_test(test_no_usable_gid),
        cmocka_unit_test(test_empty_and_tiny_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
