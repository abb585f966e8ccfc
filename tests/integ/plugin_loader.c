#define _GNU_SOURCE
#include "plugin_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char log_buf[1 << 16];
static size_t log_len;
static int log_warns;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER; /* the plugin logs from any thread */

void log_capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                 const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *lv = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE";
    pthread_mutex_lock(&log_lock);
    if (level == NCCL_LOG_WARN) log_warns++;
    if (level <= NCCL_LOG_INFO || getenv("ITEST_TRACE"))
        fprintf(stderr, "  [plugin %s] %s\n", lv, msg);
    int n = snprintf(log_buf + log_len, sizeof(log_buf) - log_len, "%s %s\n", lv, msg);
    if (n > 0 && log_len + (size_t)n < sizeof(log_buf)) log_len += (size_t)n;
    pthread_mutex_unlock(&log_lock);
}

void log_reset(void) {
    pthread_mutex_lock(&log_lock);
    log_len = 0;
    log_buf[0] = 0;
    log_warns = 0;
    pthread_mutex_unlock(&log_lock);
}

/* Under the lock: the async-event thread may be logging meanwhile. */
bool log_contains(const char *needle) {
    pthread_mutex_lock(&log_lock);
    bool found = strstr(log_buf, needle) != NULL;
    pthread_mutex_unlock(&log_lock);
    return found;
}

bool log_has_warn(void) {
    pthread_mutex_lock(&log_lock);
    bool any = log_warns > 0;
    pthread_mutex_unlock(&log_lock);
    return any;
}

const char *log_text(void) {
    return log_buf;
}

int plugin_open(struct plugin *p) {
    const char *path = getenv("ERDMA_PLUGIN");
    memset(p, 0, sizeof(*p));
    p->dl = dlopen(path ? path : "libnccl-net-erdma.so", RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return -1;
    }
    p->v8 = dlsym(p->dl, "ncclNetPlugin_v8");
    p->v9 = dlsym(p->dl, "ncclNetPlugin_v9");
    p->v10 = dlsym(p->dl, "ncclNetPlugin_v10");
    p->v11 = dlsym(p->dl, "ncclNetPlugin_v11");
    p->v12 = dlsym(p->dl, "ncclNetPlugin_v12");
    return 0;
}

void plugin_close(struct plugin *p) {
    if (p->dl) dlclose(p->dl);
    memset(p, 0, sizeof(*p));
}

bool in_rdma_vm(void) {
    return getenv("RDMA_VM") != NULL;
}
