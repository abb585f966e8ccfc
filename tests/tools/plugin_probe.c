/*
 * plugin_probe: loads the plugin the way NCCL does (dlopen + dlsym of the
 * ncclNetPlugin_vN tables) and reports what it finds. Used by the packaging test
 * (load from an unpacked .deb, no devices needed) and, with --init, by the VM
 * test of the MTU guard (init's log lines go to stdout).
 *   plugin_probe LIBRARY [--init]
 */
#include "nccl_net_abi.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "LOG");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

int main(int argc, char **argv) {
    if (argc < 2 || (argc == 3 && strcmp(argv[2], "--init")) || argc > 3) {
        fprintf(stderr, "usage: %s LIBRARY [--init]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    static const char *const tables[] = {"ncclNetPlugin_v8", "ncclNetPlugin_v9",
                                         "ncclNetPlugin_v10", "ncclNetPlugin_v11",
                                         "ncclNetPlugin_v12"};
    int missing = 0;
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        void *sym = dlsym(lib, tables[i]);
        printf("%s %s\n", sym ? "found" : "MISSING", tables[i]);
        missing += !sym;
    }
    const ncclNet_v8_t *v8 = dlsym(lib, "ncclNetPlugin_v8");
    if (missing || !v8 || !v8->name || strcmp(v8->name, "eRDMA")) {
        printf("FAIL: tables missing or name is not eRDMA\n");
        return 1;
    }
    printf("name %s\n", v8->name);
    if (argc == 3) {
        ncclResult_t rc = v8->init(print_log);
        int ndev = -1;
        if (rc == ncclSuccess) v8->devices(&ndev);
        const char *proto = getenv("NCCL_PROTO");
        printf("init %d devices %d NCCL_PROTO=%s\n", (int)rc, ndev, proto ? proto : "(unset)");
        fflush(stdout);
        if (rc != ncclSuccess) return 1;
    }
    printf("OK\n");
    return 0;
}
