/*
 * Discovery of the RDMA devices the plugin uses, and what NCCL is told about
 * them. Each device is opened once per init with one protection domain that
 * every comm and memory registration on it shares (so regIsGlobal can hold).
 */
#ifndef ERDMA_DEVICE_H
#define ERDMA_DEVICE_H

#include "verbs.h"

#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define ERDMA_MAX_DEVICES 32
#define ERDMA_MAX_RECVS   8
#define ERDMA_MAX_INLINE  96   /* eRDMA's inline limit; rxe allows more, we never use it */
#define ERDMA_MAX_SQ_WR   8192 /* eRDMA's max_send_wr (older releases 4096) */

enum erdma_transport { TRANSPORT_ROCE, TRANSPORT_IWARP };
enum connect_mode { CONNECT_GID, CONNECT_RDMACM };
enum completion_mode { COMPLETION_IMM, COMPLETION_SEND };

struct mr_cache;

struct erdma_device {
    int index;
    char name[64];
    int port;
    struct ibv_context *ctx;
    bool ctx_from_cm; /* librdmacm's context: QPs on rdma_cm ids must share it */
    struct ibv_pd *pd;
    enum erdma_transport transport;
    enum connect_mode connect_mode;
    enum completion_mode completion;
    int gid_index; /* RoCE: index used; iWARP: 0 */
    union ibv_gid gid;
    enum ibv_mtu active_mtu;
    uint8_t link_layer;
    uint16_t lid;
    char netdev[64];
    struct sockaddr_in ip; /* the netdev's IPv4 address (OOB default, rdma_cm bind) */
    char pci_path[PATH_MAX];
    bool has_pci_path;
    uint64_t guid;
    int speed_mbps;
    char speed_source[64];
    int ptr_support;
    bool dmabuf;
    bool gdr;
    int max_qp_wr;
    int max_cqe;
    uint32_t max_msg_sz;
    struct mr_cache *mrs;
    int fatal; /* -errno set by the async-event thread: device fatal, port down */
    /* Counts port-down events: a connection that fails after one during its life says the
     * link is the likely cause. */
    unsigned port_downs;
    uint64_t port_down_ns;   /* the last port-down event's time (now_coarse_ns) */
    bool sends_in_syscall;   /* siw: posting may raise SIGPIPE in our thread (verbs.h) */
    struct ibv_cq *siw_plug; /* siw only: holds the mmap page its provider misreads (device.c) */
    int rail; /* from NCCL_IB_HCA's dev:port:rail:plane, else -1 (NCCL_NET_ID_UNDEF) */
    int plane;
};

/* What getProperties reports, version-independent; plugin.c copies it out. */
struct erdma_props {
    const char *name;
    const char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
    int max_multi_request_size;
    int rail_id; /* v12: NCCL_NET_ID_UNDEF unless NCCL_IB_HCA names one */
    int plane_id;
};

/* Opens and filters devices; logs the "Using ..." line. Count (>= 1) or -errno. */
int devices_discover(void);
void devices_release(void);
int devices_count(void);
struct erdma_device *device_get(int index);

/* The netdev whose link to check, for the messages that say so. */
static inline const char *device_netdev_name(const struct erdma_device *d) {
    return d->netdev[0] ? d->netdev : "its netdev";
}

/* NULL when the device's port can carry a new connection now, else why not, in words. */
const char *device_port_unusable(struct erdma_device *d);
void device_fill_props(const struct erdma_device *dev, struct erdma_props *props);

/* Pure helpers, exposed for unit tests. */
int ib_rate_mbps(uint8_t active_speed, uint8_t active_width);
/* Picks the speed to report and writes where it came from into source. */
int speed_resolve(long env_mbps, long netdev_mbps, int verbs_mbps, bool is_erdma, char *source,
                  int srclen);
const char *transport_name(enum erdma_transport t);

#endif
