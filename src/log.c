/* Owns the logger pointer and the message prefix; nothing else. */
#include "log.h"
#include "params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ncclDebugLogger_t nccl_logger;

/* Every init (v11: one per communicator) sets it while other threads log: atomic. */
void erdma_log_set(ncclDebugLogger_t logger) {
    __atomic_store_n(&nccl_logger, logger, __ATOMIC_RELEASE);
}

static int stderr_wants(ncclDebugLogLevel level) {
    if (level <= NCCL_LOG_WARN) return 1; /* before the parameters: params_load WARNs */
    const char *env = param_str(P_ERDMA_LOG);
    if (level == NCCL_LOG_INFO) return !strcmp(env, "info") || !strcmp(env, "trace");
    return !strcmp(env, "trace");
}

void erdma_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
               const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    int n = snprintf(msg, sizeof(msg), "NET/eRDMA : ");

    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    ncclDebugLogger_t logger = __atomic_load_n(&nccl_logger, __ATOMIC_ACQUIRE);
    if (logger) {
        logger(level, flags, file, line, "%s", msg);
    } else if (stderr_wants(level)) {
        fprintf(stderr, "%s %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
    }
}
