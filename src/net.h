/*
 * The plugin's internal API: what plugin.c's version tables call. Every
 * function returns 0 or -errno; plugin.c alone maps that to ncclResult_t.
 * "Not ready yet" is 0 with a NULL out-pointer, as NCCL expects.
 */
#ifndef ERDMA_NET_H
#define ERDMA_NET_H

#include "nccl_net_abi.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct erdma_props;

/* Refcounted: the first init discovers devices, the last finalize releases them. */
/* prof: NCCL's profiler callback (v10+), or NULL. */
int erdma_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof);
/* The ncclNet version NCCL loaded (8..12), before erdma_init: 0 when unknown (tests, tools). */
void erdma_set_net_version(int version);
void erdma_finalize(void);
/* Comms and memory registrations NCCL holds. A last finalize while some are open (an abort
 * path may finalize first; net_ib never releases its devices at all) keeps the devices, and
 * everything else the handles point into, until the last of them is closed. */
void erdma_object_opened(void);
void erdma_object_closed(void);
/* True in a child forked while the devices were open. Its devices, queues, connections and
 * sockets are the parent's: the kernel's objects, reached through inherited file descriptors
 * and shared mappings. A call there would post on, poll, close or destroy the parent's. */
extern bool erdma_forked;
/* For calls in such a child: an API call is refused (-ENOTSUP, WARNed once, saying what to
 * do); a close, deregistration or finalize is a no-op (0), its copies go with the child. */
int erdma_forked_refuse(const char *call);
int erdma_forked_skip(const char *call);
int erdma_devices(int *ndev);
int erdma_get_properties(int dev, struct erdma_props *props);

int erdma_listen(int dev, void *handle, void **listen_comm);
int erdma_connect(int dev, int traffic_class, void *handle, void **send_comm);
/* Frees the connects NCCL started and never finished (an abort): at the last finalize. */
void erdma_connect_sweep(void);
/* Whether a connect is under way (begun, neither finished nor failed): not an open object,
 * but a thread may be in it. */
bool erdma_connects_pending(void);
int erdma_accept(void *listen_comm, void **recv_comm);
int erdma_close_send(void *send_comm);
int erdma_close_recv(void *recv_comm);
int erdma_close_listen(void *listen_comm);

int erdma_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
int erdma_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                        void **mhandle);
int erdma_dereg_mr(void *comm, void *mhandle);

/* phandle(s): NCCL's profiler handles (v10+), NULL before v10 */
int erdma_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                void **request);
int erdma_irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                void **mhandles, void **phandles, void **request);
int erdma_iflush(void *recv_comm, int n, void **data, const int *sizes, void **mhandles,
                 void **request);
int erdma_test(void *request, int *done, int *sizes);

#endif
