/*
 * Test helper: a logger installed with erdma_log_set() that keeps every line,
 * so tests can assert what a WARN or INFO told the user. Header-only (static
 * inline) so each test executable gets its own copy.
 */
#ifndef ERDMA_UNIT_LOG_H
#define ERDMA_UNIT_LOG_H

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define UNIT_LOG_LINES 256

struct unit_log_line {
    ncclDebugLogLevel level;
    char text[1100];
};

static struct unit_log_line unit_log_lines[UNIT_LOG_LINES];
static int unit_log_count;

static inline void unit_log_sink(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                 int line, const char *fmt, ...) {
    if (unit_log_count == UNIT_LOG_LINES) return;
    struct unit_log_line *l = &unit_log_lines[unit_log_count++];
    va_list ap;
    l->level = level;
    va_start(ap, fmt);
    vsnprintf(l->text, sizeof(l->text), fmt, ap);
    va_end(ap);
}

static inline void unit_log_start(void) {
    unit_log_count = 0;
    erdma_log_set(unit_log_sink);
}

/* Number of captured lines at this level that contain every needle (NULL-terminated). */
static inline int unit_log_count_matching(ncclDebugLogLevel level, const char *const *needles) {
    int hits = 0;
    for (int i = 0; i < unit_log_count; i++) {
        if (unit_log_lines[i].level != level) continue;
        int all = 1;
        for (int j = 0; needles[j] && all; j++)
            all = strstr(unit_log_lines[i].text, needles[j]) != NULL;
        hits += all;
    }
    return hits;
}

static inline int unit_log_count_level(ncclDebugLogLevel level) {
    int hits = 0;
    for (int i = 0; i < unit_log_count; i++)
        hits += unit_log_lines[i].level == level;
    return hits;
}

/* Prints what was captured: called before a failing assertion so the log explains it. */
static inline void unit_log_print(void) {
    for (int i = 0; i < unit_log_count; i++)
        fprintf(stderr, "  [captured %s] %s\n",
                unit_log_lines[i].level == NCCL_LOG_WARN ? "WARN" : "INFO", unit_log_lines[i].text);
}

/* True when a line at level contains all the given strings. */
#define UNIT_LOG_HAS(level, ...)                                                                   \
    (unit_log_count_matching((level), (const char *const[]){__VA_ARGS__, NULL}) > 0)

#define assert_logged(level, ...)                                                                  \
    do {                                                                                           \
        if (!UNIT_LOG_HAS(level, __VA_ARGS__)) unit_log_print();                                   \
        assert_true(UNIT_LOG_HAS(level, __VA_ARGS__));                                             \
    } while (0)

#endif
