/* The parameter table (params.c): defaults, strict parsing, WARN + default on bad values. */
#define _GNU_SOURCE
#include "params.h"
#include "qp.h"
#include "unit_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static void unset_all(void) {
    for (int id = 0; id < PARAM_COUNT; id++)
        unsetenv(param_name(id));
}

static int setup(void **state) {
    unset_all();
    unit_log_start();
    return 0;
}

static int teardown(void **state) {
    unset_all();
    erdma_log_set(NULL);
    return 0;
}

static void test_defaults(void **state) {
    assert_int_equal(params_load(), 0);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    assert_int_equal(param_int(P_IB_GID_INDEX), -1);
    assert_int_equal(param_int(P_IB_TIMEOUT), 20);
    assert_int_equal(param_int(P_IB_RETRY_CNT), 7);
    assert_int_equal(param_int(P_IB_ROCE_VERSION_NUM), 2);
    assert_int_equal(param_int(P_IB_QPS_PER_CONNECTION), 1);
    assert_int_equal(param_int(P_DMABUF_ENABLE), 1);
    assert_int_equal(param_int(P_ERDMA_PORT_SPEED), 0);
    assert_int_equal(param_int(P_ERDMA_GDR), -1);
    assert_int_equal(param_int(P_ERDMA_CONNECT_TIMEOUT), 120);
    assert_string_equal(param_str(P_IB_HCA), "");
    assert_string_equal(param_str(P_IB_ADDR_FAMILY), "AF_INET");
    assert_string_equal(param_str(P_ERDMA_IBVERBS_LIB), "libibverbs.so.1");
    assert_string_equal(param_str(P_ERDMA_CONNECT_MODE), "auto");
    for (int id = 0; id < PARAM_COUNT; id++)
        assert_false(param_is_set(id));
}

static void test_names(void **state) {
    assert_string_equal(param_name(P_IB_HCA), "NCCL_IB_HCA");
    assert_string_equal(param_name(P_IB_GID_INDEX), "NCCL_IB_GID_INDEX");
    assert_string_equal(param_name(P_ERDMA_PORT_SPEED), "NCCL_ERDMA_PORT_SPEED");
    for (int id = 0; id < PARAM_COUNT; id++) {
        assert_non_null(param_name(id));
        /* NCCL's namespace, ERDMA_LOG (the command-line tools' switch, no NCCL there), or
         * CUDA's list of the GPUs the process sees (read by the graph selection) */
        assert_true(strncmp(param_name(id), "NCCL_", 5) == 0 ||
                    strcmp(param_name(id), "ERDMA_LOG") == 0 ||
                    strcmp(param_name(id), "CUDA_VISIBLE_DEVICES") == 0);
        for (int j = 0; j < id; j++) /* each variable once */
            assert_string_not_equal(param_name(id), param_name(j));
    }
}

static void test_valid_values(void **state) {
    setenv("NCCL_IB_TIMEOUT", "23", 1);
    setenv("NCCL_IB_GID_INDEX", "1", 1);
    setenv("NCCL_IB_TC", "0x10", 1); /* base prefix accepted, as NCCL does */
    setenv("NCCL_IB_SL", "15", 1);   /* the upper bound itself */
    setenv("NCCL_IB_RETRY_CNT", "0", 1);
    setenv("NCCL_ERDMA_GDR", "-1", 1);             /* the lower bound itself */
    setenv("NCCL_ERDMA_PORT_SPEED", "200000 ", 1); /* trailing blank tolerated */
    setenv("NCCL_IB_HCA", "^erdma_1", 1);
    assert_int_equal(params_load(), 0);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    assert_int_equal(param_int(P_IB_TIMEOUT), 23);
    assert_int_equal(param_int(P_IB_GID_INDEX), 1);
    assert_int_equal(param_int(P_IB_TC), 16);
    assert_int_equal(param_int(P_IB_SL), 15);
    assert_int_equal(param_int(P_IB_RETRY_CNT), 0);
    assert_int_equal(param_int(P_ERDMA_GDR), -1);
    assert_int_equal(param_int(P_ERDMA_PORT_SPEED), 200000);
    assert_string_equal(param_str(P_IB_HCA), "^erdma_1");
    assert_true(param_is_set(P_IB_TIMEOUT));
    assert_true(param_is_set(P_IB_RETRY_CNT));
    assert_true(param_is_set(P_IB_HCA));
    assert_false(param_is_set(P_IB_QPS_PER_CONNECTION));
}

static void test_empty_value_is_unset(void **state) {
    setenv("NCCL_IB_TIMEOUT", "", 1);
    setenv("NCCL_SOCKET_IFNAME", "", 1);
    assert_int_equal(params_load(), 0);
    assert_false(param_is_set(P_IB_TIMEOUT));
    assert_false(param_is_set(P_SOCKET_IFNAME));
    assert_int_equal(param_int(P_IB_TIMEOUT), 20);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
}

/* One bad value: counted once, WARNed with name and value, default kept, not "set". */
static void check_invalid(const char *var, enum param_id id, const char *value, long def) {
    unset_all();
    unit_log_start();
    setenv(var, value, 1);
    assert_int_equal(params_load(), 1);
    assert_int_equal(param_int(id), def);
    assert_false(param_is_set(id));
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1);
    char quoted[128];
    snprintf(quoted, sizeof(quoted), "%s=\"%s\"", var, value);
    assert_logged(NCCL_LOG_WARN, quoted, "not valid", "using the default");
}

static void test_invalid_ints_warn_and_default(void **state) {
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "abc", 20);
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "12x", 20);
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "32", 20);
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "0", 20);
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "1.5", 20);
    check_invalid("NCCL_IB_TIMEOUT", P_IB_TIMEOUT, "99999999999999999999999", 20);
    check_invalid("NCCL_IB_RETRY_CNT", P_IB_RETRY_CNT, "10", 7);
    check_invalid("NCCL_IB_GID_INDEX", P_IB_GID_INDEX, "-2", -1);
    check_invalid("NCCL_IB_GID_INDEX", P_IB_GID_INDEX, "256", -1);
    check_invalid("NCCL_IB_QPS_PER_CONNECTION", P_IB_QPS_PER_CONNECTION, "-9223372036854775809", 1);
    check_invalid("NCCL_ERDMA_PORT_SPEED", P_ERDMA_PORT_SPEED, "fast", 0);
    check_invalid("NCCL_IB_DISABLE", P_IB_DISABLE, " ", 0);
}

static void test_warn_names_range(void **state) {
    setenv("NCCL_IB_SL", "16", 1);
    assert_int_equal(params_load(), 1);
    assert_logged(NCCL_LOG_WARN, "NCCL_IB_SL=\"16\"", "[-1, 15]", "default -1");
}

static void test_invalid_values_are_counted(void **state) {
    setenv("NCCL_IB_TIMEOUT", "abc", 1);
    setenv("NCCL_IB_SL", "99", 1);
    setenv("NCCL_ERDMA_GDR", "2", 1);
    setenv("NCCL_IB_TC", "106", 1); /* valid: not counted */
    assert_int_equal(params_load(), 3);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 3);
    assert_int_equal(param_int(P_IB_TC), 106);
    assert_int_equal(param_int(P_ERDMA_GDR), -1);
    /* a reload after fixing the environment forgets the old values */
    unsetenv("NCCL_IB_TIMEOUT");
    unsetenv("NCCL_IB_SL");
    unsetenv("NCCL_ERDMA_GDR");
    unsetenv("NCCL_IB_TC");
    assert_int_equal(params_load(), 0);
    assert_int_equal(param_int(P_IB_TC), -1);
    assert_false(param_is_set(P_IB_TC));
}

static const char *const modes[] = {"auto", "gid", "rdmacm", NULL};

static void test_choice(void **state) {
    assert_int_equal(params_load(), 0);
    assert_int_equal(param_choice(P_ERDMA_CONNECT_MODE, modes), 0);
    setenv("NCCL_ERDMA_CONNECT_MODE", "rdmacm", 1);
    params_load();
    assert_int_equal(param_choice(P_ERDMA_CONNECT_MODE, modes), 2);
    setenv("NCCL_ERDMA_CONNECT_MODE", "GID", 1); /* case does not matter */
    params_load();
    assert_int_equal(param_choice(P_ERDMA_CONNECT_MODE, modes), 1);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
}

static void test_choice_unknown_warns(void **state) {
    setenv("NCCL_ERDMA_CONNECT_MODE", "iwarp", 1);
    assert_int_equal(params_load(), 0); /* strings are not judged at load */
    assert_true(param_is_set(P_ERDMA_CONNECT_MODE));
    assert_int_equal(param_choice(P_ERDMA_CONNECT_MODE, modes), 0);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1);
    assert_logged(NCCL_LOG_WARN, "NCCL_ERDMA_CONNECT_MODE=\"iwarp\"", "{auto, gid, rdmacm}",
                  "using \"auto\"");
}

static void test_string_params(void **state) {
    setenv("NCCL_SOCKET_IFNAME", "eth1", 1);
    setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6", 1);
    assert_int_equal(params_load(), 0);
    assert_true(param_is_set(P_SOCKET_IFNAME));
    assert_string_equal(param_str(P_SOCKET_IFNAME), "eth1");
    assert_string_equal(param_str(P_IB_ADDR_FAMILY), "AF_INET6");
}

static void test_dump_lists_only_set_values(void **state) {
    setenv("NCCL_IB_TIMEOUT", "23", 1);
    setenv("NCCL_SOCKET_IFNAME", "eth1", 1);
    params_load();
    unit_log_start();
    params_dump();
    assert_int_equal(unit_log_count_level(NCCL_LOG_INFO), 2);
    assert_logged(NCCL_LOG_INFO, "NCCL_IB_TIMEOUT", "23");
    assert_logged(NCCL_LOG_INFO, "NCCL_SOCKET_IFNAME", "\"eth1\"");
}

static void test_markdown_lists_every_parameter(void **state) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    params_write_markdown(out);
    fclose(out);
    assert_non_null(strstr(buf, "| variable | default | meaning |"));
    int rows = 0;
    for (const char *p = buf; (p = strstr(p, "\n| `")); p++)
        rows++;
    assert_int_equal(rows, PARAM_COUNT);
    for (int id = 0; id < PARAM_COUNT; id++) {
        char cell[96];
        snprintf(cell, sizeof(cell), "| `%s` |", param_name(id));
        if (!strstr(buf, cell)) fprintf(stderr, "missing %s in:\n%s", cell, buf);
        assert_non_null(strstr(buf, cell));
    }
    assert_non_null(strstr(buf, "| `NCCL_IB_TIMEOUT` | `20` |"));
    assert_non_null(strstr(buf, "| `NCCL_IB_HCA` | `(unset)` |"));
    assert_non_null(strstr(buf, "| `NCCL_ERDMA_CONNECT_MODE` | `auto` |"));
    /* a doc's own | and < would end the cell or open a tag when the table is rendered */
    assert_non_null(strstr(buf, "auto \\| gid (RoCE GID exchange) \\| rdmacm"));
    assert_non_null(strstr(buf, "/sys/class/infiniband/&lt;dev&gt;/device"));
    assert_null(strstr(buf, "open )"));
    for (const char *row = strstr(buf, "\n| `"); row; row = strstr(row + 1, "\n| `")) {
        int bars = 0; /* exactly the four that delimit three cells */
        for (const char *q = row + 1; *q && *q != '\n'; q++)
            bars += *q == '|' && q[-1] != '\\';
        assert_int_equal(bars, 4);
    }
    free(buf);
}

/* Traffic class in net_ib's order (connect.cc): the sender takes NCCL_IB_TC when set, else the
 * communicator's, else the default; the receiver takes NCCL_IB_FIFO_TC when set, else what the
 * sender announced. */
static void test_traffic_class_order(void **state) {
    struct qp_params p;
    assert_int_equal(params_load(), 0);
    qp_params_from_env(&p, -1); /* NCCL_NET_TRAFFIC_CLASS_UNDEF */
    assert_int_equal(p.tc, 0);
    qp_params_from_env(&p, 106);
    assert_int_equal(p.tc, 106);
    qp_params_for_receiver(&p, true, 106, 3);
    assert_int_equal(p.tc, 106);
    assert_int_equal(p.sl, 3);
    qp_params_for_receiver(&p, false, 0, 0); /* an older sender: our own settings */
    assert_int_equal(p.tc, 0);

    setenv("NCCL_IB_TC", "41", 1);
    setenv("NCCL_IB_SL", "5", 1);
    assert_int_equal(params_load(), 0);
    qp_params_from_env(&p, 106); /* the environment wins over the communicator */
    assert_int_equal(p.tc, 41);
    assert_int_equal(p.sl, 5);
    qp_params_for_receiver(&p, true, 106, 3); /* the receiver follows the sender, not its env */
    assert_int_equal(p.tc, 106);
    assert_int_equal(p.sl, 3);
    qp_params_for_receiver(&p, false, 0, 0);
    assert_int_equal(p.tc, 41);

    setenv("NCCL_IB_FIFO_TC", "0", 1);
    assert_int_equal(params_load(), 0);
    qp_params_for_receiver(&p, true, 106, 3);
    assert_int_equal(p.tc, 0);
    assert_int_equal(p.sl, 3);
    qp_params_from_env(&p, 106); /* the sender's QPs do not take it */
    assert_int_equal(p.tc, 41);
}

/* net_ib's own "unset" values (NCCL_IB_TC=-1, NCCL_IB_SL=-1, their defaults there) are valid
 * and mean unset: they were WARNed as invalid and counted as ignored values. A communicator's
 * traffic class outside 0..255 (other than undefined, -1) is WARNed once, not dropped in
 * silence. */
static void test_net_ib_unset_values(void **state) {
    struct qp_params p;
    setenv("NCCL_IB_TC", "-1", 1);
    setenv("NCCL_IB_SL", "-1", 1);
    assert_int_equal(params_load(), 0);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    qp_params_from_env(&p, 106);
    assert_int_equal(p.tc, 106);
    assert_int_equal(p.sl, 0);
    qp_params_from_env(&p, -1);
    assert_int_equal(p.tc, 0);
    qp_params_from_env(&p, 300);
    assert_int_equal(p.tc, 0);
    assert_logged(NCCL_LOG_WARN, "traffic class 300", "outside 0..255");
    qp_params_from_env(&p, 300);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1); /* once */
}

/* As net_ib, any non-zero NCCL_IB_DISABLE disables the plugin: 2 was WARNed as invalid and
 * the plugin stayed on, the opposite of what was asked. */
static void test_ib_disable_any_nonzero(void **state) {
    setenv("NCCL_IB_DISABLE", "2", 1);
    assert_int_equal(params_load(), 0);
    assert_true(param_int(P_IB_DISABLE) != 0);
    setenv("NCCL_IB_DISABLE", "-1", 1);
    assert_int_equal(params_load(), 0);
    assert_true(param_int(P_IB_DISABLE) != 0);
}

/* What erdma_log prints to stderr (no NCCL logger: the command-line tools) for one INFO line
 * under the current ERDMA_LOG, into out. */
static void stderr_of_info(char *out, size_t len) {
    int pipefd[2], saved = dup(2);
    assert_int_equal(pipe(pipefd), 0);
    fflush(stderr);
    dup2(pipefd[1], 2);
    erdma_log_set(NULL);
    INFO(NCCL_INIT, "one info line");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(pipefd[1]);
    ssize_t n = read(pipefd[0], out, len - 1);
    out[n > 0 ? n : 0] = 0;
    close(pipefd[0]);
    erdma_log_set(unit_log_sink);
}

/* ERDMA_LOG is matched as users type it (INFO printed nothing), and a value it does not know
 * is said once, on stderr, where the tool's user looks. */
static void test_erdma_log_values(void **state) {
    char out[1024];
    setenv("ERDMA_LOG", "INFO", 1);
    params_load();
    stderr_of_info(out, sizeof(out));
    assert_non_null(strstr(out, "INFO NET/eRDMA : one info line"));
    setenv("ERDMA_LOG", "Trace", 1);
    params_load();
    stderr_of_info(out, sizeof(out));
    assert_non_null(strstr(out, "one info line"));
    setenv("ERDMA_LOG", "verbose", 1);
    params_load();
    stderr_of_info(out, sizeof(out));
    assert_null(strstr(out, "one info line"));
    assert_non_null(strstr(out, "ERDMA_LOG=\"verbose\" is neither info nor trace"));
    stderr_of_info(out, sizeof(out));
    assert_null(strstr(out, "ERDMA_LOG")); /* once */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_valid_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_value_is_unset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_ints_warn_and_default, setup, teardown),
        cmocka_unit_test_setup_teardown(test_warn_names_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_values_are_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_choice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_choice_unknown_warns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_string_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_lists_only_set_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_markdown_lists_every_parameter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_traffic_class_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_net_ib_unset_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ib_disable_any_nonzero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_erdma_log_values, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
