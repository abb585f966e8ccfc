/*
 * Timing shared by the two benchmarks (erdma_bench, verbs_floor): the clock and
 * the latency row, so that the plugin and its raw-verbs floor are timed and
 * summarised the same way as ib_write_lat.
 */
#ifndef BENCH_CLOCK_H
#define BENCH_CLOCK_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Round-trip stamps read the cycle counter, as perftest does. clock_gettime is
 * a system call wherever the kernel's clocksource has no vDSO path (HPET: the
 * emulated VM), and a few of those per round trip weigh on a 10 us latency.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static double g_tick_s; /* seconds per cycle, calibrated against CLOCK_MONOTONIC */
static inline void tick_calibrate(void) {
    double t0 = now_s();
    uint64_t c0 = __rdtsc();
    while (now_s() - t0 < 0.05) {
    }
    g_tick_s = (now_s() - t0) / (double)(__rdtsc() - c0);
}
static inline double tick_s(void) {
    return (double)__rdtsc() * g_tick_s;
}
#else
static inline void tick_calibrate(void) {}
static inline double tick_s(void) {
    return now_s();
}
#endif

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ib_write_lat's columns: bytes, iterations, then t_min, t_max, t_typical (the median) and
 * t_avg of one way (round trip / 2) in microseconds. Sorts rtt[]. */
#define LAT_HEADER_FMT "%-8s %12s %10s %12s %12s %14s %12s\n"
static inline void lat_print_header(void) {
    printf(LAT_HEADER_FMT, "#mode", "bytes", "iters", "t_min[us]", "t_max[us]", "t_typical[us]",
           "t_avg[us]");
}
static inline void lat_print_row(const char *mode, uint64_t size, double *rtt, uint64_t m) {
    double sum = 0;
    for (uint64_t i = 0; i < m; i++)
        sum += rtt[i];
    qsort(rtt, m, sizeof(double), cmp_double);
    printf("%-8s %12" PRIu64 " %10" PRIu64 " %12.2f %12.2f %14.2f %12.2f\n", mode, size, m,
           rtt[0] * 0.5e6, rtt[m - 1] * 0.5e6, rtt[m / 2] * 0.5e6, sum / (double)m * 0.5e6);
    fflush(stdout);
}

#endif
