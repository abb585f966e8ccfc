/*
 * A version-agnostic face over the plugin's v8 and v12 tables for the
 * integration tests and their two-process scenarios. Calls that NCCL retries
 * (connect/accept/isend/irecv returning a NULL object) are retried here with a
 * deadline, so a hang becomes a test failure with a message.
 */
#ifndef ERDMA_NETAPI_H
#define ERDMA_NETAPI_H

#include "plugin_loader.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct netapi {
    struct plugin p;
    int version; /* 8, 10, 11 or 12 */
    void *ctx;   /* v11/v12 context */
    /* v11 and v12 share their function list; only the property types differ */
    const ncclNet_v12_t *t12;
    int dev;
    /* v10+: what isend hands the plugin as NCCL's profiler handle; irecv hands buffer i
     * phandle + i. NULL: none, as before. */
    char *phandle;
};

/* Opens the plugin, inits it, and finds the device by name. 0 or -1 (message printed). */
int net_open(struct netapi *n, int version, const char *devname);
/* The same, handing init a profiler callback (v10+), as NCCL does. */
int net_open_prof(struct netapi *n, int version, const char *devname, ncclProfilerCallback_t prof);
/* The same, with a communicator traffic class for v11/v12's init config. */
int net_open_tc(struct netapi *n, int version, const char *devname, int traffic_class);
/* Both: a traffic class and a profiler callback. */
int net_open_cfg(struct netapi *n, int version, const char *devname, int traffic_class,
                 ncclProfilerCallback_t prof);
void net_close(struct netapi *n);
int net_listen(struct netapi *n, void *handle, void **lc);
/* Retries until connected/accepted or timeout_s passes; returns the ncclResult_t. */
int net_connect(struct netapi *n, void *handle, void **sc, int timeout_s);
int net_accept(struct netapi *n, void *lc, void **rc, int timeout_s);
int net_regmr(struct netapi *n, void *comm, void *data, size_t size, void **mh);
/* The same with NCCL's pointer type (NCCL_PTR_HOST or NCCL_PTR_CUDA). */
int net_regmr_type(struct netapi *n, void *comm, void *data, size_t size, int type, void **mh);
int net_deregmr(struct netapi *n, void *comm, void *mh);
int net_isend(struct netapi *n, void *sc, void *data, size_t size, int tag, void *mh, void **req,
              int timeout_s);
int net_irecv(struct netapi *n, void *rc, int cnt, void **data, size_t *sizes, int *tags, void **mh,
              void **req, int timeout_s);
/* One test() call. */
int net_test(struct netapi *n, void *req, int *done, int *sizes);
/* test() until done; returns the ncclResult_t (ncclSystemError on timeout). */
int net_wait(struct netapi *n, void *req, int *sizes, int timeout_s);
int net_iflush(struct netapi *n, void *rc, int cnt, void **data, int *sizes, void **mh, void **req);
int net_close_send(struct netapi *n, void *sc);
int net_close_recv(struct netapi *n, void *rc);
int net_close_listen(struct netapi *n, void *lc);

/* Two processes: the child runs fn_child and exits with its status; the parent runs fn_parent.
 * They share two pipes for the handle and simple barriers. Returns 0 when both succeeded. */
struct duo {
    int to_child[2];
    int to_parent[2];
    int is_child;
};
typedef int (*duo_fn)(struct duo *d, void *arg);
int duo_run(duo_fn parent, duo_fn child, void *arg, int timeout_s);
int duo_send(struct duo *d, const void *buf, size_t len);
int duo_recv(struct duo *d, void *buf, size_t len);
int duo_barrier(struct duo *d);

/* A role process gets timeout_s from its parent, which dumps its stacks and kills it then; its
 * own alarm is only the backstop for a parent that died. */
#define ROLE_BACKSTOP_S 30
int role_reap(pid_t pid, double end, const char *role); /* 0 when it exited 0 */
void role_dump_stacks(pid_t pid, const char *role);

/* A scenario's environment, "NAME=VALUE;NAME=VALUE": set (true) or unset (false). */
void env_apply(const char *env, bool set);

void pattern_fill(uint8_t *buf, size_t len, uint32_t seed);
/* Returns the first offset that differs from the pattern, or -1. */
long pattern_check(const uint8_t *buf, size_t len, uint32_t seed);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);             \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

#endif
