/*
 * A fake verbs provider for host tests, installed through the one verbs boundary
 * (verbs_install_fake). It models RoCE devices and RC QP pairs in process memory:
 * post_send of RDMA WRITE(_WITH_IMM), SEND and READ copies bytes between registered
 * regions at post time, checking keys, bounds and access flags the way a NIC does
 * (a bad key gives an error completion, never a stray write), and queues the
 * completions that poll_cq returns. Both ends of a connection live in one process,
 * over real TCP sockets on 127.0.0.1 for the out-of-band part.
 *
 * A test plays a misbehaving peer by writing into the memory the peer owns (FIFO
 * slots, records, the send-mode ring) and by injecting receive completions with
 * immediates and lengths of its choosing (fake_inject_recv).
 */
#ifndef ERDMA_FAKE_VERBS_H
#define ERDMA_FAKE_VERBS_H

#include "verbs.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAKE_MAX_DEVICES 4

struct fake_dev_cfg {
    const char *name;    /* default "fake<i>" */
    uint32_t max_msg_sz; /* port attribute, default 1 GiB */
    int max_qp_wr;       /* default 16384 */
    int max_cqe;         /* default 1 << 20 */
    bool dmabuf;         /* takes dma-buf MRs; default EOPNOTSUPP, as eRDMA */
    bool read_sink_rw;   /* a read's local target needs remote write access, as on iWARP */
};

/* Installs the fake table with ndev RoCE devices (cfg may be NULL: defaults). */
void fake_verbs_install(int ndev, const struct fake_dev_cfg *cfg);
/* Uninstalls; the number of objects (contexts, PDs, MRs, CQs, QPs) never released. */
int fake_verbs_uninstall(void);

/* The usual host-test environment: params from a clean environment plus extra
 * NAME=VALUE pairs (NULL-terminated, may be NULL), sysfs pointed nowhere, the fake
 * installed and devices discovered, each with 127.0.0.1 as its netdev's address. Returns
 * devices_discover()'s value. */
int fake_env_start(int ndev, const struct fake_dev_cfg *cfg, const char *const *env);
/* Releases the devices and uninstalls; returns leaked objects (0 is good). */
int fake_env_stop(void);

/* Waits up to seconds for child pid to exit: pid with its waitpid status, or 0 when it was
 * still running (a hang: it is then killed and reaped). */
int fake_wait_child(int pid, int seconds, int *status);

/* Connects a send comm on send_dev to a recv comm on recv_dev through listen/connect/
 * accept, stepping both until done (bounded). 0, or the first -errno. */
int fake_pair_connect(int send_dev, int recv_dev, void **send_comm, void **recv_comm);

/* Pops the oldest receive posted on qp and completes it as the peer chose: opcode
 * (IBV_WC_RECV or IBV_WC_RECV_RDMA_WITH_IMM), immediate (host order) and length.
 * For IBV_WC_RECV the bytes in data (len, may exceed the buffer: LOC_LEN_ERR) land in
 * the receive buffer. 0, or -1 when no receive is posted. */
int fake_inject_recv(struct ibv_qp *qp, enum ibv_wc_opcode op, uint32_t imm, const void *data,
                     uint32_t len);
/* Receives posted on qp and not yet consumed. */
/* What query_port says of device dev's port from now on (it starts ACTIVE). */
void fake_port_set_state(int dev, enum ibv_port_state state);
/* Replaces GID index of device dev (a link flap removes the IPv4 one until it is back). */
void fake_gid_set(int dev, int index, const union ibv_gid *gid);
int fake_recv_posted(struct ibv_qp *qp);
/* Completions waiting in cq; whether it ever overflowed. */
int fake_cq_pending(struct ibv_cq *cq);
bool fake_cq_overflowed(struct ibv_cq *cq);
/* While held, polls of cq find nothing and its completions wait (a peer whose ACKs are late). */
void fake_cq_hold(struct ibv_cq *cq, bool hold);
/* Errors a NIC would have refused at post time (bad inline size, SQ overflow...). */
int fake_post_errors(void);
/* Makes [addr, addr+len) GPU memory as the CPU sees it: the fake NIC still reads and writes
 * it, but a send that asks the CPU to copy it inline is refused at post time (a post error;
 * on a real provider the copy faults). len 0 clears it. */
void fake_set_gpu_memory(const void *addr, size_t len);
/* Counts, from now on, the send WRs posted inline with a payload in [addr, addr+len). */
void fake_watch_inline(const void *addr, size_t len);
int fake_inline_watched(void);
/* QPs and CQs alive now (a closed comm must leave none of its own). */
int fake_live_qps_cqs(void);
/* Queues an async event for device dev (async thread tests). */
void fake_async_event(int dev, enum ibv_event_type type, int port);
/* Async events acknowledged so far (the plugin acks each once it has handled it). */
unsigned fake_async_acked(void);
/* Makes device dev's async fd poll as failed for good (POLLHUP here; a removed device's
 * uverbs fd reports POLLERR), as when the device goes away. */
void fake_async_channel_fails(int dev);
/* The next reg_mr of addr, or close_device of the context at addr, waits until
 * fake_call_gate(NULL) opens the gate (a registration that pins a large buffer holds its
 * caller); whether a call is waiting there now. */
void fake_call_gate(const void *addr);
bool fake_call_gate_waiting(void);
/* Next reg_mr fails with this errno (0: none), as a pinning the kernel refuses. */
void fake_fail_next_reg(int err);
/* Next post_send on any QP fails with this errno (0: none). */
void fake_fail_next_post(int err);
/* Every RDMA READ from now on completes with this status (IBV_WC_SUCCESS: as normal): a NIC
 * that does not carry the flush's read from itself to itself. */
void fake_fail_reads(enum ibv_wc_status st);

#endif
