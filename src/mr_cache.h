/*
 * Memory registration cache, one per device (shared PD). Registrations are
 * page-aligned and refcounted, so registering a sub-range of a registered
 * buffer is a lookup: this is what lets getProperties promise regIsGlobal=1.
 */
#ifndef ERDMA_MR_CACHE_H
#define ERDMA_MR_CACHE_H

#include <stddef.h>
#include <stdint.h>

struct erdma_device;
struct mr_cache;

/* The mhandle NCCL holds. */
struct erdma_mr {
    struct ibv_mr *mr;
    uint32_t lkey, rkey; /* mr's, copied: each message reads them, and not the ibv_mr's line */
    uintptr_t base;
    size_t len;
    int refs;
    int type; /* NCCL_PTR_HOST / NCCL_PTR_CUDA */
    struct mr_cache *cache;
    struct erdma_mr *next;
};

struct mr_cache *mr_cache_create(struct erdma_device *dev);
void mr_cache_destroy(struct mr_cache *cache);
/* 0 or -errno (the failure is WARNed with its likely cause). */
int mr_cache_get(struct mr_cache *cache, void *data, size_t size, int type, struct erdma_mr **out);
int mr_cache_get_dmabuf(struct mr_cache *cache, void *data, size_t size, uint64_t offset, int fd,
                        struct erdma_mr **out);
void mr_cache_put(struct erdma_mr *mr);
/* Number of live registrations (tests and leak checks). */
int mr_cache_count(struct mr_cache *cache);

#endif
