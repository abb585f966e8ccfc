/* Owns the logger pointer and the message prefix; nothing else. */
#include "log.h"
#include "params.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static ncclDebugLogger_t nccl_logger;

/* Every init (v11: one per communicator) sets it while other threads log: atomic. */
void erdma_log_set(ncclDebugLogger_t logger) {
    __atomic_store_n(&nccl_logger, logger, __ATOMIC_RELEASE);
}

static int stderr_wants(ncclDebugLogLevel level) {
    if (level <= NCCL_LOG_WARN) return 1; /* before the parameters: params_load WARNs */
    const char *env = param_str(P_ERDMA_LOG);
    bool trace = !strcasecmp(env, "trace"), info = trace || !strcasecmp(env, "info");
    static int said;
    if (!info && env[0] && !__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL))
        fprintf(stderr,
                "WARN NET/eRDMA : ERDMA_LOG=\"%s\" is neither info nor trace: only WARN "
                "lines are printed\n",
                env);
    return level == NCCL_LOG_INFO ? info : trace;
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
