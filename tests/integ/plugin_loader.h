/*
 * Loads the built plugin exactly as NCCL does: dlopen() of the .so, dlsym() of
 * ncclNetPlugin_vN. Captures everything the plugin logs so tests can assert
 * on the messages users would read.
 */
#ifndef ERDMA_PLUGIN_LOADER_H
#define ERDMA_PLUGIN_LOADER_H

#include "nccl_net_abi.h"

#include <stdbool.h>

struct plugin {
    void *dl;
    const ncclNet_v8_t *v8;
    const ncclNet_v9_t *v9;
    const ncclNet_v10_t *v10;
    const ncclNet_v11_t *v11;
    const ncclNet_v12_t *v12;
};

/* Path from ERDMA_PLUGIN (set by CMake), else libnccl-net-erdma.so on the search path. */
int plugin_open(struct plugin *p);
void plugin_close(struct plugin *p);

void log_capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                 const char *fmt, ...);
void log_reset(void);
bool log_contains(const char *needle);
bool log_has_warn(void);
const char *log_text(void);

/* Test skeleton helper: the VM's devices must exist; a missing one is a failure, not a skip. */
bool in_rdma_vm(void);

#endif
