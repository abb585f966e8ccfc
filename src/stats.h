/*
 * Traffic counters per connection and per device, and where they show: an INFO line per device
 * at finalize, and (NCCL_ERDMA_STATS_FILE) a Prometheus text file for a node exporter's
 * textfile collector, rewritten every NCCL_ERDMA_STATS_INTERVAL seconds by one thread that
 * finalize joins.
 *
 * The hot path takes no lock and makes no system call: each connection's counters are written
 * only by the thread driving that comm (NCCL drives one comm from one thread at a time), with
 * relaxed atomic stores so the writer thread may read them at any moment; a plain load and
 * store, no locked instruction. Connections register at setup and fold their counts into their
 * device's totals at close, under a lock that only setup, close and the writer take.
 */
#ifndef ERDMA_STATS_H
#define ERDMA_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define STATS_WC_STATUSES 32 /* enum ibv_wc_status values counted one by one; the rest: other */

struct stats_counters {
    uint64_t bytes_sent, bytes_recv;
    uint64_t msgs_sent, msgs_recv;
    uint64_t wrs_posted;
    uint64_t flushes;
    uint64_t max_inflight_ns; /* longest a request stayed between post and completion */
    uint64_t wc_errors[STATS_WC_STATUSES + 1];
};

enum stats_dir { STATS_SEND, STATS_RECV };

struct stats_conn {
    struct stats_counters c;
    int dev;
    enum stats_dir dir;
    uint64_t id; /* a process-wide connection number, the series' `conn` label */
    char peer[64];
    bool registered;
    struct stats_conn *prev, *next;
};

/* Per-device events counted outside any connection's counters. */
enum stats_event { STATS_CONNECT, STATS_ACCEPT, STATS_ACCEPT_REJECT, STATS_EVENTS };

/* ------------------------------------------------------------ hot path (owner thread only) */
static inline void stats_add(uint64_t *ctr, uint64_t n) {
    __atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}
/* Stores whichever is larger, without a branch: it runs on every completion, and under
 * emulation a branch costs more than a store (bench/README.md, 2026-12-07 05:50). */
static inline void stats_max(uint64_t *ctr, uint64_t v) {
    uint64_t old = __atomic_load_n(ctr, __ATOMIC_RELAXED);
    __atomic_store_n(ctr, v > old ? v : old, __ATOMIC_RELAXED);
}
void stats_wc_error(struct stats_conn *s, int status);

/* ------------------------------------------------------------ lifetime */
/* First init: names the devices, clears their totals, starts the writer thread when
 * NCCL_ERDMA_STATS_FILE is set. 0 or -errno (the thread could not start). */
int stats_start(int ndev, const char *const *names);
/* Last finalize: the INFO line per device, the final file, joins the thread. */
void stats_stop(void);

void stats_conn_open(struct stats_conn *s, int dev, enum stats_dir dir, const char *peer);
void stats_conn_close(struct stats_conn *s); /* folds into the device totals; idempotent */
void stats_event(int dev, enum stats_event ev);

/* ------------------------------------------------------------ output (tests, tools) */
/* Totals of a device: closed connections plus live ones. */
void stats_device_totals(int dev, struct stats_counters *out, uint64_t events[STATS_EVENTS]);
int stats_write_prometheus(FILE *out, long pid);
/* Writes path (`%p` becomes the pid) through a temporary file and rename(2). 0 or -errno. */
int stats_write_file(const char *path_template);
/* The file name a template gives for this pid. */
int stats_file_name(const char *path_template, long pid, char *out, size_t outlen);
const char *stats_wc_status_name(int status);

#endif
