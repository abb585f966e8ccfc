/*
 * Writes a stats file with known counts (the writer the plugin uses), for the tests that
 * parse it with a Prometheus text parser and pretty-print it with the doctor:
 *   stats_sample FILE
 */
#include "params.h"
#include "stats.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: stats_sample FILE\n");
        return 2;
    }
    static const char *const names[] = {"erdma_0", "erdma_1"};
    params_load();
    stats_start(2, names);
    static struct stats_conn s, r, gone;
    stats_conn_open(&gone, 0, STATS_SEND, "10.0.0.9:40000");
    stats_add(&gone.c.bytes_sent, 1000);
    stats_add(&gone.c.msgs_sent, 1);
    stats_conn_close(&gone); /* its counts stay in erdma_0's totals */
    stats_conn_open(&s, 0, STATS_SEND, "10.0.0.2:41000");
    stats_add(&s.c.bytes_sent, 1048576);
    stats_add(&s.c.msgs_sent, 4);
    stats_add(&s.c.wrs_posted, 5);
    stats_max(&s.c.max_inflight_ns, 2500000);
    stats_wc_error(&s, IBV_WC_RETRY_EXC_ERR);
    stats_conn_open(&r, 1, STATS_RECV, "10.0.0.3:\"odd\"");
    stats_add(&r.c.bytes_recv, 4096);
    stats_add(&r.c.msgs_recv, 2);
    stats_add(&r.c.flushes, 2);
    stats_event(0, STATS_CONNECT);
    stats_event(0, STATS_CONNECT);
    stats_event(1, STATS_ACCEPT);
    stats_event(1, STATS_ACCEPT_REJECT);
    int rc = stats_write_file(argv[1]);
    if (rc) fprintf(stderr, "stats_sample: %s: %s\n", argv[1], strerror(-rc));
    return rc ? 1 : 0;
}
