/* Owns memory registrations and their refcounts; knows nothing about comms. */
#define _GNU_SOURCE
#include "mr_cache.h"
#include "device.h"
#include "log.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct mr_cache {
    struct erdma_device *dev;
    pthread_mutex_t lock;
    struct erdma_mr *head;
    int count;
};

struct mr_cache *mr_cache_create(struct erdma_device *dev) {
    struct mr_cache *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->dev = dev;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

void mr_cache_destroy(struct mr_cache *c) {
    if (!c) return;
    if (c->count)
        INFO(NCCL_INIT | NCCL_NET, "%s: %d registration(s) still live at finalize; releasing them",
             c->dev->name, c->count);
    for (struct erdma_mr *m = c->head, *next; m; m = next) {
        next = m->next;
        vb.dereg_mr(m->mr);
        free(m);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void warn_reg_failure(struct mr_cache *c, void *data, size_t size, int type, int err) {
    struct rlimit rl;
    char lim[64] = "unknown";
    if (!getrlimit(RLIMIT_MEMLOCK, &rl)) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof(lim), "unlimited");
        else
            snprintf(lim, sizeof(lim), "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
    }
    const char *hint;
    /* GPU memory gets here only with peer memory seen (or forced): its module is loaded */
    if (type == NCCL_PTR_CUDA && (err == ENOMEM || err == EAGAIN))
        hint = "the GPU memory could not be mapped for the NIC: the GPU's BAR1 space may be "
               "full (nvidia-smi -q -d MEMORY, BAR1 Memory Usage) or the locked-memory limit "
               "reached (run with `ulimit -l unlimited`; in Kubernetes give the container "
               "IPC_LOCK); dmesg may say which";
    else if (type == NCCL_PTR_CUDA)
        hint = "GPU memory registers through peer memory: check that it is loaded (lsmod | grep "
               "nvidia_peermem; NCCL_ERDMA_GDR=1 forces GPU Direct without it) and dmesg for "
               "the driver's reason";
    else if (type == NCCL_PTR_DMABUF) /* pinned by its exporter: memlock does not apply */
        hint = err == EBADF ? "the dma-buf file descriptor is not open (closed too early?)"
                            : "the GPU driver refused to export or map this dma-buf: check that "
                              "CUDA can export it (or set NCCL_DMABUF_ENABLE=0 to use peer "
                              "memory) and dmesg for the driver's reason";
    else if ((err == ENOMEM || err == EPERM || err == EAGAIN) && strcmp(lim, "unlimited"))
        hint = "the locked-memory limit is too low: run with `ulimit -l unlimited` (in Kubernetes "
               "give the container IPC_LOCK and SYS_RESOURCE, or raise memlock in the runtime)";
    else if (err == EFAULT)
        hint = "the range is not mapped memory of this process";
    else
        hint = "check dmesg for the RDMA driver's reason";
    WARN("%s: cannot register %p+%zu (%s memory): %s (memlock limit %s). %s", c->dev->name, data,
         size,
         type == NCCL_PTR_CUDA     ? "GPU"
         : type == NCCL_PTR_DMABUF ? "GPU dma-buf"
                                   : "host",
         strerror(err), lim, hint);
}

/* The entry of this type that covers [base, end), its reference taken; NULL if none. Under
 * c->lock. */
static struct erdma_mr *cache_find(struct mr_cache *c, uintptr_t base, uintptr_t end, int type) {
    for (struct erdma_mr *m = c->head; m; m = m->next) {
        if (m->type == type && m->base <= base && m->base + m->len >= end) {
            m->refs++;
            return m;
        }
    }
    return NULL;
}

int mr_cache_get(struct mr_cache *c, void *data, size_t size, int type, struct erdma_mr **out) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!data) {
        WARN("%s: regMr of a NULL pointer", c->dev->name);
        return -EINVAL;
    }
    /* a range past the end of the address space would round to one below its start, which
     * any cached registration "covers". Both bounds keep data + size + page - 1 below
     * UINTPTR_MAX, and neither subtraction can wrap. */
    if ((uintptr_t)data > UINTPTR_MAX - page || size > UINTPTR_MAX - page - (uintptr_t)data) {
        WARN("%s: regMr of %p+%zu runs past the end of the address space", c->dev->name, data,
             size);
        return -EINVAL;
    }
    uintptr_t base = (uintptr_t)data & ~(page - 1);
    uintptr_t end = ((uintptr_t)data + (size ? size : 1) + page - 1) & ~(page - 1);

    pthread_mutex_lock(&c->lock);
    struct erdma_mr *hit = cache_find(c, base, end, type);
    pthread_mutex_unlock(&c->lock);
    if (hit) {
        *out = hit;
        return 0;
    }
    struct erdma_mr *m = calloc(1, sizeof(*m));
    if (!m) return -ENOMEM;
    /* Outside the lock: pinning a large buffer takes long, and every registration on the
     * device would wait behind it. */
    errno = 0;
    m->mr = vb.reg_mr(c->dev->pd, (void *)base, end - base, MR_ACCESS);
    if (!m->mr) {
        int err = errno ? errno : EIO; /* not a guess at "out of memory" */
        free(m);
        warn_reg_failure(c, data, size, type, err);
        return -err;
    }
    pthread_mutex_lock(&c->lock);
    hit = cache_find(c, base, end, type); /* another thread registered it meanwhile */
    if (hit) {
        pthread_mutex_unlock(&c->lock);
        vb.dereg_mr(m->mr);
        free(m);
        *out = hit;
        return 0;
    }
    m->lkey = m->mr->lkey;
    m->rkey = m->mr->rkey;
    m->base = base;
    m->len = end - base;
    m->refs = 1;
    m->type = type;
    m->cache = c;
    m->next = c->head;
    c->head = m;
    c->count++;
    pthread_mutex_unlock(&c->lock);
    *out = m;
    return 0;
}

int mr_cache_get_dmabuf(struct mr_cache *c, void *data, size_t size, uint64_t offset, int fd,
                        struct erdma_mr **out) {
    if (!vb.reg_dmabuf_mr || !c->dev->dmabuf) {
        WARN("%s: dma-buf registration is not supported on this device", c->dev->name);
        return -EOPNOTSUPP;
    }
    struct erdma_mr *m = calloc(1, sizeof(*m));
    if (!m) return -ENOMEM;
    errno = 0;
    m->mr = vb.reg_dmabuf_mr(c->dev->pd, offset, size, (uintptr_t)data, fd, MR_ACCESS);
    if (!m->mr) {
        int err = errno ? errno : EINVAL;
        free(m);
        warn_reg_failure(c, data, size, NCCL_PTR_DMABUF, err);
        return -err;
    }
    m->lkey = m->mr->lkey;
    m->rkey = m->mr->rkey;
    /* dma-buf entries are keyed by fd, not address: never shared through lookup */
    m->base = (uintptr_t)data;
    m->len = size;
    m->refs = 1;
    m->type = -1;
    m->cache = c;
    pthread_mutex_lock(&c->lock);
    m->next = c->head;
    c->head = m;
    c->count++;
    pthread_mutex_unlock(&c->lock);
    *out = m;
    return 0;
}

void mr_cache_put(struct erdma_mr *m) {
    struct mr_cache *c = m->cache;
    pthread_mutex_lock(&c->lock);
    if (--m->refs > 0) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    for (struct erdma_mr **pp = &c->head; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    c->count--;
    pthread_mutex_unlock(&c->lock);
    vb.dereg_mr(m->mr);
    free(m);
}

int mr_cache_count(struct mr_cache *c) {
    pthread_mutex_lock(&c->lock);
    int n = c->count;
    pthread_mutex_unlock(&c->lock);
    return n;
}
