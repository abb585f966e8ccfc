/* Test stub: the GIN scratch handles sym_kernels.h embeds (unused by the graph code). */
#pragma once
#include <stdint.h>
struct ncclGinOutboxHandle {
    uint32_t bufHandle, size_log2;
};
struct ncclGinInboxA2AHandle {
    uint32_t bufHandle, signals, size_log2, nPeers_rcp32;
};
struct ncclGinSyncHandle {
    uint32_t railSignals;
};
