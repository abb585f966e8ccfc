/*
 * Logging through the function NCCL hands to init(). Before init, or in the
 * command-line tools, WARN goes to stderr and INFO only when ERDMA_LOG=info.
 * Every line starts with "NET/eRDMA : " so users can grep one prefix.
 */
#ifndef ERDMA_LOG_H
#define ERDMA_LOG_H

#include "nccl_net_abi.h"

void erdma_log_set(ncclDebugLogger_t logger);
void erdma_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define WARN(...)         erdma_log(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(flags, ...)  erdma_log(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define TRACE(flags, ...) erdma_log(NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)

#endif
