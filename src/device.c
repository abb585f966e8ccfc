/*
 * Owns the device table: enumeration through the verbs boundary, its order
 * (by PCI bus ID, as net_ib), NCCL_IB_HCA filtering, transport/GID/netdev/speed/pointer-support
 * detection, and the INFO line that tells users which NICs are in use. Does not own memory
 * registrations (mr_cache.c) or connections.
 */
#define _GNU_SOURCE
#include "device.h"
#include "gid.h"
#include "hca_filter.h"
#include "log.h"
#include "mr_cache.h"
#include "params.h"
#include "sysfs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct erdma_device devices[ERDMA_MAX_DEVICES];
static int ndevices;

const char *transport_name(enum erdma_transport t) {
    return t == TRANSPORT_IWARP ? "iWARP" : "RoCE";
}

int ib_rate_mbps(uint8_t active_speed, uint8_t active_width) {
    int lane;
    switch (active_speed) {
    case 1:
        lane = 2500;
        break;
    case 2:
        lane = 5000;
        break;
    case 4:
        lane = 10000;
        break;
    case 8:
        lane = 10000;
        break;
    case 16:
        lane = 14000;
        break;
    case 32:
        lane = 25000;
        break;
    case 64:
        lane = 50000;
        break;
    case 128:
        lane = 100000;
        break;
    default:
        lane = 10000;
        break;
    }
    int width;
    switch (active_width) {
    case 1:
        width = 1;
        break;
    case 2:
        width = 4;
        break;
    case 4:
        width = 8;
        break;
    case 8:
        width = 12;
        break;
    case 16:
        width = 2;
        break;
    default:
        width = 1;
        break;
    }
    return lane * width;
}

int speed_resolve(long env_mbps, long netdev_mbps, int verbs_mbps, bool is_erdma, char *source,
                  int srclen) {
    if (env_mbps > 0) {
        snprintf(source, srclen, "NCCL_ERDMA_PORT_SPEED");
        return (int)env_mbps;
    }
    if (netdev_mbps > 0) {
        snprintf(source, srclen, "netdev speed");
        return (int)netdev_mbps;
    }
    /* eRDMA's query_port hard-codes EDR x4: the figure says nothing about the wire. */
    snprintf(source, srclen, is_erdma ? "driver placeholder, set NCCL_ERDMA_PORT_SPEED" : "verbs");
    return verbs_mbps;
}

/* The netdev behind a port: gid_attrs (RoCE), "parent" (rxe), device/net (PCI), or MAC match. */
static void find_netdev(struct erdma_device *d) {
    char buf[64];
    d->netdev[0] = 0;
    if (!sysfs_read(buf, sizeof(buf), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d",
                    d->name, d->port, d->gid_index) &&
        buf[0]) {
        snprintf(d->netdev, sizeof(d->netdev), "%s", buf);
        return;
    }
    if (!sysfs_read(buf, sizeof(buf), "/sys/class/infiniband/%s/parent", d->name) && buf[0]) {
        snprintf(d->netdev, sizeof(d->netdev), "%s", buf);
        return;
    }
    /* iWARP GIDs (siw, eRDMA standard mode) start with the MAC address. RoCE GIDs do not:
     * ::ffff:a.b.c.d starts with six zero bytes, which would "match" lo. */
    const uint8_t *mac = d->gid.raw;
    static const uint8_t no_mac[6];
    if (d->transport != TRANSPORT_IWARP || !memcmp(mac, no_mac, sizeof(no_mac))) return;
    struct if_nameindex *ifs = if_nameindex();
    for (struct if_nameindex *i = ifs; i && i->if_name; i++) {
        char addr[64], want[32];
        if (sysfs_read(addr, sizeof(addr), "/sys/class/net/%s/address", i->if_name)) continue;
        snprintf(want, sizeof(want), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2],
                 mac[3], mac[4], mac[5]);
        if (!strcasecmp(addr, want)) {
            snprintf(d->netdev, sizeof(d->netdev), "%s", i->if_name);
            break;
        }
    }
    if (ifs) if_freenameindex(ifs);
}

static void find_ipv4(struct erdma_device *d) {
    struct ifaddrs *ifa_list, *ifa;
    memset(&d->ip, 0, sizeof(d->ip));
    if (!d->netdev[0] || getifaddrs(&ifa_list)) return;
    for (ifa = ifa_list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
        if (strcmp(ifa->ifa_name, d->netdev)) continue;
        memcpy(&d->ip, ifa->ifa_addr, sizeof(d->ip));
        break;
    }
    freeifaddrs(ifa_list);
}

static void find_pci_path(struct erdma_device *d) {
    d->has_pci_path = !sysfs_realpath(d->pci_path, sizeof(d->pci_path),
                                      "/sys/class/infiniband/%s/device", d->name);
    /* Soft devices (rxe) have no device link: use their netdev's PCI function. */
    if (!d->has_pci_path && d->netdev[0])
        d->has_pci_path = !sysfs_realpath(d->pci_path, sizeof(d->pci_path),
                                          "/sys/class/net/%s/device", d->netdev);
}

static bool is_erdma_driver(const struct erdma_device *d) {
    char drv[256];
    if (!sysfs_realpath(drv, sizeof(drv), "/sys/class/infiniband/%s/device/driver", d->name)) {
        const char *base = strrchr(drv, '/');
        if (base && !strcmp(base + 1, "erdma")) return true;
    }
    return !strncmp(d->name, "erdma", 5);
}

static void resolve_speed(struct erdma_device *d, const struct ibv_port_attr *pa) {
    long netdev_speed = -1;
    if (d->netdev[0]) sysfs_read_long(&netdev_speed, "/sys/class/net/%s/speed", d->netdev);
    d->speed_mbps = speed_resolve(param_int(P_ERDMA_PORT_SPEED), netdev_speed,
                                  ib_rate_mbps(pa->active_speed, pa->active_width),
                                  is_erdma_driver(d), d->speed_source, sizeof(d->speed_source));
}

static bool peer_memory_present(void) {
    return sysfs_exists("/sys/kernel/mm/memory_peers/nv_mem/version") ||
           sysfs_exists("/sys/kernel/mm/memory_peers/nv_mem_nc/version") ||
           sysfs_exists("/sys/module/nvidia_peermem/version") ||
           sysfs_exists("/sys/module/nv_peer_mem/version");
}

/* dma-buf registration with a bad fd: EOPNOTSUPP/EPROTONOSUPPORT mean "never", anything else
 * means the kernel got as far as looking at the fd. eRDMA answers EOPNOTSUPP. */
static bool probe_dmabuf(struct erdma_device *d) {
    if (!vb.reg_dmabuf_mr || !param_int(P_DMABUF_ENABLE)) return false;
    errno = 0;
    struct ibv_mr *mr = vb.reg_dmabuf_mr(d->pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    if (mr) {
        vb.dereg_mr(mr);
        return true;
    }
    return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT && errno != 0;
}

static void resolve_ptr_support(struct erdma_device *d) {
    long gdr = param_int(P_ERDMA_GDR);
    d->gdr = gdr == 1 || (gdr == -1 && peer_memory_present());
    d->dmabuf = probe_dmabuf(d);
    d->ptr_support = NCCL_PTR_HOST;
    /* As net_ib: NCCL_PTR_CUDA means regMr takes GPU memory, which needs peer memory. The
     * dma-buf probe proves the kernel side only; NCCL adds CUDA's (can it export one?). */
    if (d->gdr) d->ptr_support |= NCCL_PTR_CUDA;
    if (d->dmabuf) d->ptr_support |= NCCL_PTR_DMABUF;
}

/* Reads the GID table (types from sysfs; containers may hide them: then UNKNOWN). */
static int read_gid_table(struct erdma_device *d, int len, struct gid_entry *tbl) {
    for (int i = 0; i < len; i++) {
        union ibv_gid g;
        char type[32];
        tbl[i].valid = vb.query_gid(d->ctx, d->port, i, &g) == 0;
        memcpy(tbl[i].raw, g.raw, 16);
        tbl[i].type =
            sysfs_read(type, sizeof(type), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
                       d->name, d->port, i)
                ? GID_TYPE_UNKNOWN
                : gid_type_parse(type);
    }
    return 0;
}

static const char *const addr_families[] = {"AF_INET", "AF_INET6", NULL};

/* Read in devices_discover, as cm_choice: a bad value is WARNed once, not per device. */
static int family_choice;

static int choose_gid(struct erdma_device *d, int table_len) {
    int requested = (int)param_int(P_IB_GID_INDEX);
    /* Auto selection looks at the first 64 entries (each costs a query and a sysfs read);
     * an index the user set is read wherever it lies in the port's table, as net_ib does
     * (mlx5 RoCE ports have 128 or 256). */
    int n = table_len < 64 ? table_len : 64;
    if (requested >= n && requested < table_len) n = requested + 1;
    struct gid_entry *tbl = calloc((size_t)(n > 0 ? n : 1), sizeof(*tbl));
    if (!tbl) return -ENOMEM;
    read_gid_table(d, n, tbl);
    bool want_v4 = family_choice == 0;
    struct gid_choice c =
        gid_select(tbl, n, requested, want_v4, (int)param_int(P_IB_ROCE_VERSION_NUM));
    if (c.index < 0) {
        WARN("%s:%d has no usable RoCE GID: %s. Check the interface has an IPv4 address "
             "(eRDMA compat mode puts ::ffff:<IPv4> at index 1); skipping this device",
             d->name, d->port, c.reason);
        free(tbl);
        return -ENODEV;
    }
    if (c.fell_back) {
        char txt[64];
        gid_format(tbl[c.index].raw, txt, sizeof(txt));
        WARN("%s:%d: %s; using GID index %d (%s) instead. Set NCCL_IB_GID_INDEX=%d to silence "
             "this.",
             d->name, d->port, c.reason, c.index, txt, c.index);
    }
    d->gid_index = c.index;
    memcpy(d->gid.raw, tbl[c.index].raw, 16);
    free(tbl);
    return 0;
}

static const char *const connect_modes[] = {"auto", "gid", "rdmacm", NULL};
static const char *const completion_modes[] = {"auto", "imm", "send", NULL};

/* Read once per discovery, so a bad value is WARNed once, not once per device. */
static int cm_choice, comp_choice;

static int choose_modes(struct erdma_device *d) {
    int cm = cm_choice, comp = comp_choice;

    d->connect_mode = cm == 1                           ? CONNECT_GID
                      : cm == 2                         ? CONNECT_RDMACM
                      : d->transport == TRANSPORT_IWARP ? CONNECT_RDMACM
                                                        : CONNECT_GID;
    if (d->transport == TRANSPORT_IWARP && d->connect_mode == CONNECT_GID) {
        WARN("%s is an iWARP device (eRDMA standard mode): it connects only through rdma_cm, "
             "so NCCL_ERDMA_CONNECT_MODE=gid cannot work on it; skipping it. Unset "
             "NCCL_ERDMA_CONNECT_MODE (or set it to rdmacm).",
             d->name);
        return -EINVAL;
    }
    if (d->connect_mode == CONNECT_RDMACM && !verbs_have_rdmacm()) {
        WARN("%s needs rdma_cm but librdmacm could not be loaded; skipping it", d->name);
        return -ENOENT;
    }
    /* siw (and some iWARP devices) cannot do RDMA WRITE_WITH_IMM. */
    d->completion = comp == 1                         ? COMPLETION_IMM
                    : comp == 2                       ? COMPLETION_SEND
                    : d->transport == TRANSPORT_IWARP ? COMPLETION_SEND
                                                      : COMPLETION_IMM;
    return 0;
}

/* rdma_create_qp() wants the PD (and CQ) from the very context librdmacm bound the cm_id
 * to, not one we opened ourselves: adopt librdmacm's context for this device. */
static struct ibv_context **cm_devices;

static int use_rdmacm_context(struct erdma_device *d) {
    int n = 0;
    if (!cm_devices) cm_devices = vb.cm_get_devices(&n);
    for (int i = 0; cm_devices && cm_devices[i]; i++) {
        if (!strcmp(vb.get_device_name(cm_devices[i]->device), d->name)) {
            d->ctx = cm_devices[i];
            d->ctx_from_cm = true;
            return 0;
        }
    }
    WARN("%s: librdmacm does not list this device (rdma_get_devices); skipping it", d->name);
    return -ENODEV;
}

static void cm_devices_release(void) {
    if (cm_devices) vb.cm_free_devices(cm_devices);
    cm_devices = NULL;
}

/* siw's userspace provider (rdma-core) reads a queue mmap key of 0x90000 (SIW_INVAL_UOBJ_KEY)
 * as "no queue", but since siw moved to the core's mmap entries (Linux 5.6) that is a valid key:
 * the queue mapped at page 0x90 of the context. The kernel hands out pages first-fit per context,
 * so once ~145 pages of queues are mapped at once (a few comms, several threads), one
 * create_cq/rdma_create_qp fails with no errno, and every retry lands on the same page again.
 * A CQ of 32768 entries (1 MiB + its control page: pages 0-256 on a fresh context) made before
 * anything else holds page 0x90 while the plugin is initialised (released with the devices, so
 * that a reload does not stack plugs).
 * Found and checked with a program that creates 200 one-page CQs: #144 on fails without it.
 * Costs 1 MiB of memory per siw device, and nothing elsewhere (siw is the test rig's iWARP). */
#define SIW_VENDOR_ID 0x626d74 /* "bmt", siw's vendor id */
#define SIW_PLUG_CQE  32768

static void siw_hold_bad_key(struct erdma_device *d, const struct ibv_device_attr *attr) {
    if (attr->vendor_id != SIW_VENDOR_ID || !d->ctx_from_cm || attr->max_cqe < SIW_PLUG_CQE) return;
    errno = 0;
    d->siw_plug = vb.create_cq(d->ctx, SIW_PLUG_CQE, NULL, NULL, 0);
    if (!d->siw_plug)
        WARN("%s: cannot make the CQ that keeps siw's bad mmap key unused (%s): a comm may fail "
             "to open now and then with 'Input/output error'",
             d->name, errno ? strerror(errno) : "the provider gave no reason");
}

/* Opens one device/port and fills everything but the MR cache. -errno to skip it. */
static int device_open(struct erdma_device *d, struct ibv_device *ibdev, int port,
                       const struct ibv_device_attr *attr, const struct ibv_port_attr *pa,
                       struct ibv_context *ctx) {
    d->ctx = ctx;
    d->port = port;
    d->transport =
        (ibdev->transport_type == IBV_TRANSPORT_IWARP || ibdev->node_type == IBV_NODE_RNIC)
            ? TRANSPORT_IWARP
            : TRANSPORT_ROCE;
    d->link_layer = pa->link_layer;
    d->lid = pa->lid;
    d->active_mtu = pa->active_mtu;
    d->guid = attr->node_guid;
    d->max_qp_wr = attr->max_qp_wr < ERDMA_MAX_SQ_WR ? attr->max_qp_wr : ERDMA_MAX_SQ_WR;
    d->max_cqe = attr->max_cqe;
    d->sends_in_syscall = attr->vendor_id == SIW_VENDOR_ID;
    d->max_msg_sz = pa->max_msg_sz ? pa->max_msg_sz : (1u << 30);
    int rc = choose_modes(d);
    if (rc) return rc;
    if (d->transport == TRANSPORT_ROCE && d->connect_mode == CONNECT_GID) {
        if (pa->link_layer != IBV_LINK_LAYER_ETHERNET) {
            WARN("%s:%d is not an Ethernet (RoCE) port; only RoCE and iWARP are supported, "
                 "skipping it",
                 d->name, port);
            return -ENODEV;
        }
        rc = choose_gid(d, pa->gid_tbl_len);
        if (rc) return rc;
    } else {
        d->gid_index = 0;
        if (vb.query_gid(ctx, port, 0, &d->gid)) memset(&d->gid, 0, sizeof(d->gid));
    }
    find_netdev(d);
    find_ipv4(d);
    if (d->connect_mode == CONNECT_RDMACM && d->ip.sin_family != AF_INET) {
        WARN("%s: rdma_cm needs an IPv4 address on its netdev (%s), found none; skipping it",
             d->name, d->netdev[0] ? d->netdev : "unknown");
        return -ENODEV;
    }
    find_pci_path(d);
    resolve_speed(d, pa);
    if (d->connect_mode == CONNECT_RDMACM) {
        rc = use_rdmacm_context(d);
        if (rc) return rc;
    }
    d->pd = vb.alloc_pd(d->ctx);
    if (!d->pd) {
        WARN("%s: ibv_alloc_pd failed: %s", d->name, strerror(errno));
        return -errno ? -errno : -ENOMEM;
    }
    resolve_ptr_support(d);
    d->mrs = mr_cache_create(d);
    if (!d->mrs) {
        vb.dealloc_pd(d->pd);
        d->pd = NULL;
        return -ENOMEM;
    }
    siw_hold_bad_key(d, attr); /* nothing above maps a queue */
    return 0;
}

static void log_using_line(void) {
    char line[1024];
    int n = snprintf(line, sizeof(line), "Using");
    for (int i = 0; i < ndevices && n < (int)sizeof(line); i++) {
        struct erdma_device *d = &devices[i];
        if (d->transport == TRANSPORT_ROCE && d->connect_mode == CONNECT_GID)
            n += snprintf(line + n, sizeof(line) - n, " [%d]%s:%d/RoCE/GID%d", i, d->name, d->port,
                          d->gid_index);
        else
            n += snprintf(line + n, sizeof(line) - n, " [%d]%s:%d/%s", i, d->name, d->port,
                          transport_name(d->transport));
    }
    if (ndevices && n < (int)sizeof(line)) {
        char ip[INET_ADDRSTRLEN] = "none";
        const struct erdma_device *d0 = &devices[0];
        if (d0->ip.sin_family == AF_INET) inet_ntop(AF_INET, &d0->ip.sin_addr, ip, sizeof(ip));
        const char *ifname =
            param_is_set(P_SOCKET_IFNAME) ? param_str(P_SOCKET_IFNAME) : d0->netdev;
        snprintf(line + n, sizeof(line) - n, " ; OOB %s%s%s", ifname[0] ? ifname : "?",
                 param_is_set(P_SOCKET_IFNAME) ? "" : ":", param_is_set(P_SOCKET_IFNAME) ? "" : ip);
    }
    INFO(NCCL_INIT | NCCL_NET, "%s", line);
    for (int i = 0; i < ndevices; i++) {
        struct erdma_device *d = &devices[i];
        INFO(NCCL_INIT | NCCL_NET,
             "[%d]%s: netdev %s, %s connect, %s completions, speed %d Mb/s (%s), GPU Direct %s%s",
             i, d->name, d->netdev[0] ? d->netdev : "?",
             d->connect_mode == CONNECT_GID ? "GID" : "rdma_cm",
             d->completion == COMPLETION_IMM ? "write-with-imm" : "send", d->speed_mbps,
             d->speed_source, d->gdr ? "peer memory" : "off", d->dmabuf ? ", dma-buf" : "");
    }
}

/* The bus ID that ends the realpath of /sys/class/infiniband/<dev>/device, as a number;
 * LLONG_MAX for a device without one (a soft device), which net_ib also lists last. */
static long long pci_order_key(const char *name) {
    char rp[PATH_MAX];
    unsigned dom, bus, dev, fn;
    if (sysfs_realpath(rp, sizeof(rp), "/sys/class/infiniband/%s/device", name)) return LLONG_MAX;
    const char *last = strrchr(rp, '/');
    if (sscanf(last ? last + 1 : rp, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return LLONG_MAX;
    return ((long long)dom << 20) | (bus << 12) | (dev << 4) | fn;
}

/* net_ib's order (NCCL_IB_DEVICE_PCI_ORDER, NCCL 2.30): by PCI bus ID, so that every node
 * gives the same index to the NIC in the same slot, whatever order libibverbs (readdir of
 * /sys/class/infiniband) happens to list them in. A graph file's <net dev> is that index.
 * Stable: the ports of one device, and devices without a PCI function, keep their order. */
static void order_devices(struct ibv_device **list, int num) {
    if (!param_int(P_IB_DEVICE_PCI_ORDER) || num < 2) return;
    long long *key = calloc((size_t)num, sizeof(*key));
    if (!key) return; /* libibverbs' order: the INFO line says which it is */
    for (int i = 0; i < num; i++)
        key[i] = pci_order_key(vb.get_device_name(list[i]));
    for (int i = 1; i < num; i++) {
        struct ibv_device *d = list[i];
        long long k = key[i];
        int j = i;
        for (; j > 0 && key[j - 1] > k; j--) {
            list[j] = list[j - 1];
            key[j] = key[j - 1];
        }
        list[j] = d;
        key[j] = k;
    }
    free(key);
}

static void log_device_order(void) {
    char line[2048];
    int n = snprintf(line, sizeof(line), "device order (%s):",
                     param_int(P_IB_DEVICE_PCI_ORDER) ? "by PCI path, NCCL_IB_DEVICE_PCI_ORDER=1"
                                                      : "libibverbs', NCCL_IB_DEVICE_PCI_ORDER=0");
    for (int i = 0; i < ndevices && n < (int)sizeof(line); i++)
        n += snprintf(line + n, sizeof(line) - n, " [%d]%s %s", i, devices[i].name,
                      devices[i].has_pci_path ? devices[i].pci_path : "(no PCI function)");
    INFO(NCCL_INIT | NCCL_NET, "%s", line);
}

/* An include list's entry that selects none of the ports in use: a misspelt or absent NIC
 * would otherwise be left out in silence (net_ib says nothing either), the job running on
 * the rest. */
static void warn_unused_entries(const struct hca_filter *f) {
    for (int i = 0; i < f->count && !f->exclude; i++) {
        bool used = false;
        for (int j = 0; j < ndevices && !used; j++)
            used = hca_filter_entry_match(f, i, devices[j].name, devices[j].port);
        if (used) continue;
        char port[16] = "";
        if (f->entries[i].port >= 0) snprintf(port, sizeof(port), ":%d", f->entries[i].port);
        WARN("NCCL_IB_HCA entry \"%s%s\" selects no ACTIVE RDMA port: that NIC is not used; "
             "check the name with ibv_devices and the port's state with ibv_devinfo",
             f->entries[i].name, port);
    }
}

int devices_discover(void) {
    struct hca_filter filter;
    char err[160];
    int num = 0;

    ndevices = 0;
    cm_choice = param_choice(P_ERDMA_CONNECT_MODE, connect_modes);
    comp_choice = param_choice(P_ERDMA_COMPLETION, completion_modes);
    family_choice = param_choice(P_IB_ADDR_FAMILY, addr_families);
    if (hca_filter_parse(param_str(P_IB_HCA), &filter, err, sizeof(err))) {
        WARN("NCCL_IB_HCA=\"%s\" is malformed: %s", param_str(P_IB_HCA), err);
        return -EINVAL;
    }
    struct ibv_device **list = vb.get_device_list(&num);
    if (!list || num == 0) {
        WARN("no RDMA devices found (ibv_get_device_list: %s). In a pod, request the "
             "aliyun/erdma resource so /dev/infiniband is passed in, and check that the eRDMA "
             "driver and ibverbs-providers are installed.",
             list ? "empty" : strerror(errno));
        if (list) vb.free_device_list(list);
        return -ENODEV;
    }
    order_devices(list, num);
    for (int i = 0; i < num && ndevices < ERDMA_MAX_DEVICES; i++) {
        const char *name = vb.get_device_name(list[i]);
        struct ibv_context *ctx = vb.open_device(list[i]);
        if (!ctx) {
            WARN("cannot open %s: %s (is /dev/infiniband passed to the container?)", name,
                 strerror(errno));
            continue;
        }
        struct ibv_device_attr attr;
        int used = 0;
        if (vb.query_device(ctx, &attr)) {
            WARN("ibv_query_device(%s) failed: %s", name, strerror(errno));
            vb.close_device(ctx);
            continue;
        }
        for (int port = 1; port <= attr.phys_port_cnt && ndevices < ERDMA_MAX_DEVICES; port++) {
            struct ibv_port_attr pa;
            if (!hca_filter_match(&filter, name, port)) continue;
            if (vb.query_port(ctx, port, &pa)) continue;
            if (pa.state != IBV_PORT_ACTIVE) {
                INFO(NCCL_INIT | NCCL_NET, "%s:%d is not ACTIVE (state %d), skipping", name, port,
                     pa.state);
                continue;
            }
            struct erdma_device *d = &devices[ndevices];
            memset(d, 0, sizeof(*d));
            d->index = ndevices;
            snprintf(d->name, sizeof(d->name), "%s", name);
            int entry = hca_filter_entry(&filter, name, port);
            d->rail = entry >= 0 ? filter.entries[entry].rail : -1;
            d->plane = entry >= 0 ? filter.entries[entry].plane : -1;
            if (device_open(d, list[i], port, &attr, &pa, ctx)) continue;
            ndevices++;
            used += d->ctx == ctx;
        }
        if (!used) vb.close_device(ctx);
    }
    vb.free_device_list(list);
    if (ndevices == 0) {
        cm_devices_release(); /* a failed init unloads librdmacm without devices_release() */
        if (filter.count)
            WARN("NCCL_IB_HCA=\"%s\" matches no ACTIVE RDMA port (%d device(s) present); check "
                 "the names with ibv_devices",
                 param_str(P_IB_HCA), num);
        else
            WARN("no ACTIVE RDMA port usable among %d device(s)", num);
        return -ENODEV;
    }
    warn_unused_entries(&filter);
    log_using_line();
    log_device_order();
    return ndevices;
}

void devices_release(void) {
    for (int i = 0; i < ndevices; i++) {
        struct erdma_device *d = &devices[i];
        mr_cache_destroy(d->mrs);
        if (d->siw_plug) vb.destroy_cq(d->siw_plug);
        if (d->pd) vb.dealloc_pd(d->pd);
        /* several ports of one device share the context: close it once */
        bool shared_later = false;
        for (int j = i + 1; j < ndevices; j++)
            shared_later |= devices[j].ctx == d->ctx;
        if (!shared_later && !d->ctx_from_cm) vb.close_device(d->ctx);
    }
    cm_devices_release();
    memset(devices, 0, sizeof(devices));
    ndevices = 0;
}

int devices_count(void) {
    return ndevices;
}

/* A link flap is brief, and connection setup waits it out (conn.c) rather than fail in QP
 * setup with a misleading error. The port must be active by the driver's word and not down by
 * the async thread's last event for it (the events lag the driver: both must agree), and in
 * GID mode our GID must be back at its index (the kernel re-adds it after the link comes up;
 * until then a QP's RTR fails with ENETUNREACH). */
const char *device_port_unusable(struct erdma_device *d) {
    if (__atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE) == -ENETDOWN)
        return "its port went down and is not active again";
    struct ibv_port_attr pa;
    if (vb.query_port(d->ctx, (uint8_t)d->port, &pa) == 0 && pa.state != IBV_PORT_ACTIVE)
        return "its port is not active";
    if (d->connect_mode != CONNECT_GID) return NULL;
    union ibv_gid g;
    if (vb.query_gid(d->ctx, (uint8_t)d->port, d->gid_index, &g) == 0 &&
        memcmp(&g, &d->gid, sizeof(g)) != 0)
        return "its GID is not (or no longer) at the index it was found at";
    return NULL;
}

struct erdma_device *device_get(int index) {
    return index >= 0 && index < ndevices ? &devices[index] : NULL;
}

void device_fill_props(const struct erdma_device *d, struct erdma_props *p) {
    memset(p, 0, sizeof(*p));
    p->name = d->name;
    p->pci_path = d->has_pci_path ? d->pci_path : NULL;
    p->guid = d->guid;
    p->ptr_support = d->ptr_support;
    p->reg_is_global = 1; /* mr_cache.c: one cache per device, shared by all comms */
    /* net_ib says 0 but for DataDirect NICs; NCCL asks for no flush on sm90+ GPUs unless a
     * device forces it, so the testing knob must reach NCCL to mean anything there */
    p->force_flush = param_int(P_ERDMA_FORCE_FLUSH) ? 1 : 0;
    p->speed = d->speed_mbps;
    p->port = d->port;
    p->latency = 0;
    p->max_comms = 65536;
    p->max_recvs = ERDMA_MAX_RECVS;
    p->max_p2p_bytes = NCCL_MAX_NET_SIZE_BYTES;
    p->max_coll_bytes = NCCL_MAX_NET_SIZE_BYTES;
    p->max_multi_request_size = 1;
    p->rail_id = d->rail;
    p->plane_id = d->plane;
}
