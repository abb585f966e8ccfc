/*
 * Device discovery (device.c) against a fake verbs table (verbs_install_fake)
 * and committed sysfs fixture trees (tests/fixtures/sysfs/<case>, sysfs_set_root).
 * Fixture cases:
 *   ebmgn9g     erdma_0/erdma_1 in compat mode (RoCE v2, GID 1 IPv4-mapped),
 *               eth0 reports a speed, eth1 does not (-1), nvidia_peermem loaded
 *   container   erdma_0 with gid_attrs hidden, class/net as a container sees it, peer
 *               memory as nv_mem_nc only (NCCL's gdr.cc checks it too)
 *   erdma-iwarp erdma_0/erdma_1 in standard (iWARP) mode, siw0 on lo
 *   rxe         soft-RoCE rxe0 on eth0: no device link, PCI function via the netdev
 */
#define _GNU_SOURCE
#include "async.h"
#include "device.h"
#include "params.h"
#include "sysfs.h"
#include "unit_log.h"
#include "verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* ---- the fake verbs provider ---- */

#define FAKE_MAX_DEVS  4
#define FAKE_MAX_PORTS 2
#define FAKE_GIDS      128 /* mlx5 RoCE: 128 or 256; eRDMA: 16 */

struct fake_port {
    struct ibv_port_attr attr;
    union ibv_gid gids[FAKE_GIDS];
};

struct fake_dev {
    struct ibv_device ibdev;
    struct ibv_device_attr attr;
    struct fake_port ports[FAKE_MAX_PORTS];
    bool open_fails;
};

struct fake_ctx {
    struct ibv_context ctx; /* first: device.c only sees this */
    struct fake_dev *dev;
};

static struct fake_dev fdevs[FAKE_MAX_DEVS];
static int nfdevs;
static bool list_fails;
static int dmabuf_errno; /* 0: registration succeeds */
static struct {
    int lists, lists_freed, opens, closes, pds, pds_freed, dmabuf_calls, mrs, mrs_freed;
} calls;

static struct ibv_device **fake_get_device_list(int *num) {
    if (list_fails) {
        errno = ENOSYS;
        *num = 0;
        return NULL;
    }
    struct ibv_device **list = calloc(FAKE_MAX_DEVS + 1, sizeof(*list));
    for (int i = 0; i < nfdevs; i++)
        list[i] = &fdevs[i].ibdev;
    *num = nfdevs;
    calls.lists++;
    return list;
}

static void fake_free_device_list(struct ibv_device **list) {
    calls.lists_freed++;
    free(list);
}

static const char *fake_get_device_name(struct ibv_device *dev) {
    return dev->name;
}

static struct ibv_context *fake_open_device(struct ibv_device *dev) {
    struct fake_dev *fd = (struct fake_dev *)((char *)dev - offsetof(struct fake_dev, ibdev));
    if (fd->open_fails) {
        errno = EACCES;
        return NULL;
    }
    struct fake_ctx *c = calloc(1, sizeof(*c));
    c->ctx.device = dev;
    c->dev = fd;
    calls.opens++;
    return &c->ctx;
}

static int fake_close_device(struct ibv_context *ctx) {
    calls.closes++;
    free(ctx);
    return 0;
}

static struct fake_dev *dev_of(struct ibv_context *ctx) {
    return ((struct fake_ctx *)ctx)->dev;
}

static int fake_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr) {
    *attr = dev_of(ctx)->attr;
    return 0;
}

static int fake_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
    struct fake_dev *d = dev_of(ctx);
    if (port < 1 || port > d->attr.phys_port_cnt) return EINVAL;
    *attr = d->ports[port - 1].attr;
    return 0;
}

static int fake_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
    struct fake_dev *d = dev_of(ctx);
    if (port < 1 || port > d->attr.phys_port_cnt || index < 0 ||
        index >= d->ports[port - 1].attr.gid_tbl_len || index >= FAKE_GIDS) {
        errno = EINVAL;
        return -1;
    }
    *gid = d->ports[port - 1].gids[index];
    return 0;
}

static struct ibv_pd *fake_alloc_pd(struct ibv_context *ctx) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = ctx;
    calls.pds++;
    return pd;
}

static int fake_dealloc_pd(struct ibv_pd *pd) {
    calls.pds_freed++;
    free(pd);
    return 0;
}

static struct ibv_mr *fake_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
                                         uint64_t iova, int fd, int access) {
    calls.dmabuf_calls++;
    if (dmabuf_errno) {
        errno = dmabuf_errno;
        return NULL;
    }
    struct ibv_mr *mr = calloc(1, sizeof(*mr));
    mr->pd = pd;
    mr->context = pd->context;
    calls.mrs++;
    return mr;
}

static int fake_dereg_mr(struct ibv_mr *mr) {
    calls.mrs_freed++;
    free(mr);
    return 0;
}

/* Only its presence matters: discovery must never open an event channel. */
static struct rdma_event_channel *fake_cm_create_event_channel(void) {
    fail_msg("device discovery opened an rdma_cm event channel");
    return NULL;
}

/* librdmacm opens its own context per device; iWARP devices adopt it (device.c). */
static int cm_lists_out;

static struct ibv_context **fake_cm_get_devices(int *num) {
    struct ibv_context **list = calloc(FAKE_MAX_DEVS + 1, sizeof(*list));
    for (int i = 0; i < nfdevs; i++) {
        struct fake_ctx *c = calloc(1, sizeof(*c));
        c->ctx.device = &fdevs[i].ibdev;
        c->dev = &fdevs[i];
        list[i] = &c->ctx;
    }
    if (num) *num = nfdevs;
    cm_lists_out++;
    return list;
}

static void fake_cm_free_devices(struct ibv_context **list) {
    for (int i = 0; list[i]; i++)
        free(list[i]);
    free(list);
    cm_lists_out--;
}

static struct verbs_api fake_api(void) {
    struct verbs_api api = {
        .get_device_list = fake_get_device_list,
        .free_device_list = fake_free_device_list,
        .get_device_name = fake_get_device_name,
        .open_device = fake_open_device,
        .close_device = fake_close_device,
        .query_device = fake_query_device,
        .query_port = fake_query_port,
        .query_gid = fake_query_gid,
        .alloc_pd = fake_alloc_pd,
        .dealloc_pd = fake_dealloc_pd,
        .reg_dmabuf_mr = fake_reg_dmabuf_mr,
        .dereg_mr = fake_dereg_mr,
        .cm_create_event_channel = fake_cm_create_event_channel,
        .cm_get_devices = fake_cm_get_devices,
        .cm_free_devices = fake_cm_free_devices,
    };
    return api;
}

static struct fake_dev *add_dev(const char *name, enum ibv_node_type node,
                                enum ibv_transport_type transport, uint64_t guid) {
    assert_true(nfdevs < FAKE_MAX_DEVS);
    struct fake_dev *d = &fdevs[nfdevs++];
    memset(d, 0, sizeof(*d));
    snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
    d->ibdev.node_type = node;
    d->ibdev.transport_type = transport;
    d->attr.node_guid = htobe64(guid);
    d->attr.phys_port_cnt = 1;
    d->attr.max_qp_wr = 16384;
    d->attr.max_cqe = 1 << 20;
    for (int p = 0; p < FAKE_MAX_PORTS; p++) {
        struct ibv_port_attr *pa = &d->ports[p].attr;
        pa->state = IBV_PORT_ACTIVE;
        pa->link_layer = IBV_LINK_LAYER_ETHERNET;
        pa->active_mtu = IBV_MTU_1024;
        pa->max_msg_sz = 1u << 30;
        pa->active_speed = 32; /* eRDMA's query_port: EDR x4 whatever the wire */
        pa->active_width = 2;
    }
    return d;
}

static void set_gid(struct fake_dev *d, int port, int index, const char *text) {
    assert_int_equal(inet_pton(AF_INET6, text, d->ports[port - 1].gids[index].raw), 1);
}

/* eRDMA compat mode (and rxe): 16 GIDs, fe80:: from the MAC at 0, ::ffff:IPv4 at 1. */
static struct fake_dev *add_roce_dev(const char *name, uint64_t guid, const char *ipv4) {
    struct fake_dev *d = add_dev(name, IBV_NODE_CA, IBV_TRANSPORT_IB, guid);
    char mapped[64];
    for (int p = 1; p <= FAKE_MAX_PORTS; p++) {
        d->ports[p - 1].attr.gid_tbl_len = 16;
        set_gid(d, p, 0, "fe80::216:3eff:fe01:203");
        snprintf(mapped, sizeof(mapped), "::ffff:%s", ipv4);
        set_gid(d, p, 1, mapped);
    }
    return d;
}

/* eRDMA standard mode / siw: an RNIC with one GID, the MAC followed by zeros. */
static struct fake_dev *add_iwarp_dev(const char *name, uint64_t guid, const uint8_t mac[6]) {
    struct fake_dev *d = add_dev(name, IBV_NODE_RNIC, IBV_TRANSPORT_IWARP, guid);
    d->ports[0].attr.gid_tbl_len = 1;
    memcpy(d->ports[0].gids[0].raw, mac, 6);
    return d;
}

/* ---- fixtures, environment, bookkeeping ---- */

static void use_fixture(const char *name) {
    const char *base = getenv("ERDMA_FIXTURES");
    if (!base) fail_msg("ERDMA_FIXTURES is not set (run through ctest)");
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof(path), "%s/sysfs/%s", base, name);
    /* sysfs_realpath strips the root as a string: give it the canonical form */
    if (!realpath(path, real)) fail_msg("fixture %s: %s", path, strerror(errno));
    sysfs_set_root(real);
}

static void unset_params(void) {
    for (int id = 0; id < PARAM_COUNT; id++)
        unsetenv(param_name(id));
}

static int setup(void **state) {
    unset_params();
    params_load();
    memset(fdevs, 0, sizeof(fdevs));
    nfdevs = 0;
    list_fails = false;
    dmabuf_errno = EOPNOTSUPP; /* what eRDMA answers */
    memset(&calls, 0, sizeof(calls));
    struct verbs_api api = fake_api();
    verbs_install_fake(&api);
    unit_log_start();
    return 0;
}

static int teardown(void **state) {
    devices_release();
    verbs_install_fake(NULL);
    sysfs_set_root(NULL);
    unset_params();
    erdma_log_set(NULL);
    return 0;
}

static int discover(void) {
    params_load();
    unit_log_count = 0;
    return devices_discover();
}

/* On a mismatch the captured log says why. */
#define assert_discover(want)                                                                      \
    do {                                                                                           \
        int got_ = discover();                                                                     \
        if (got_ != (want)) unit_log_print();                                                      \
        assert_int_equal(got_, (want));                                                            \
    } while (0)

/* Release and check that every context, PD and MR the fakes handed out came back. */
static void release_and_check(void) {
    devices_release();
    assert_int_equal(devices_count(), 0);
    assert_int_equal(calls.closes, calls.opens);
    assert_int_equal(cm_lists_out, 0); /* librdmacm device list released */
    assert_int_equal(calls.pds_freed, calls.pds);
    assert_int_equal(calls.mrs_freed, calls.mrs);
    assert_int_equal(calls.lists_freed, calls.lists);
}

static void ebmgn9g_fakes(void) {
    use_fixture("ebmgn9g");
    add_roce_dev("erdma_0", 0x02163efffe010203ull, "172.16.0.10");
    add_roce_dev("erdma_1", 0x02163efffe010204ull, "172.16.1.10");
}

static struct erdma_device *dev_named(const char *name) {
    for (int i = 0; i < devices_count(); i++)
        if (!strcmp(device_get(i)->name, name)) return device_get(i);
    return NULL;
}

static bool host_lo_has_127_0_0_1(void) {
    struct ifaddrs *list, *ifa;
    bool found = false;
    if (getifaddrs(&list)) return false;
    for (ifa = list; ifa; ifa = ifa->ifa_next)
        if (ifa->ifa_addr && ifa->ifa_addr->sa_family == AF_INET && !strcmp(ifa->ifa_name, "lo"))
            found = true;
    freeifaddrs(list);
    return found;
}

/* ---- pure helpers ---- */

static void test_ib_rate(void **state) {
    assert_int_equal(ib_rate_mbps(1, 1), 2500);     /* SDR 1x */
    assert_int_equal(ib_rate_mbps(2, 2), 20000);    /* DDR 4x */
    assert_int_equal(ib_rate_mbps(4, 2), 40000);    /* QDR 4x */
    assert_int_equal(ib_rate_mbps(8, 2), 40000);    /* FDR10 4x */
    assert_int_equal(ib_rate_mbps(16, 2), 56000);   /* FDR 4x */
    assert_int_equal(ib_rate_mbps(32, 2), 100000);  /* EDR 4x: eRDMA's placeholder */
    assert_int_equal(ib_rate_mbps(64, 2), 200000);  /* HDR 4x */
    assert_int_equal(ib_rate_mbps(128, 2), 400000); /* NDR 4x */
    assert_int_equal(ib_rate_mbps(32, 1), 25000);
    assert_int_equal(ib_rate_mbps(32, 4), 200000); /* 8x */
    assert_int_equal(ib_rate_mbps(32, 8), 300000); /* 12x */
    assert_int_equal(ib_rate_mbps(32, 16), 50000); /* 2x */
    assert_int_equal(ib_rate_mbps(0, 0), 10000);   /* unknown: one 10G lane */
}

static void test_speed_resolve(void **state) {
    char src[64];
    assert_int_equal(speed_resolve(400000, 200000, 100000, true, src, sizeof(src)), 400000);
    assert_string_equal(src, "NCCL_ERDMA_PORT_SPEED");
    assert_int_equal(speed_resolve(0, 200000, 100000, true, src, sizeof(src)), 200000);
    assert_string_equal(src, "netdev speed");
    assert_int_equal(speed_resolve(0, -1, 100000, true, src, sizeof(src)), 100000);
    assert_string_equal(src, "driver placeholder, set NCCL_ERDMA_PORT_SPEED");
    assert_int_equal(speed_resolve(0, 0, 25000, false, src, sizeof(src)), 25000);
    assert_string_equal(src, "verbs");
    assert_string_equal(transport_name(TRANSPORT_IWARP), "iWARP");
    assert_string_equal(transport_name(TRANSPORT_ROCE), "RoCE");
}

/* ---- discovery ---- */

static void test_ebmgn9g_both_found(void **state) {
    ebmgn9g_fakes();
    assert_discover(2);
    assert_int_equal(devices_count(), 2);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);

    const char *names[] = {"erdma_0", "erdma_1"};
    const char *pci[] = {"/sys/devices/pci0000:00/0000:00:05.0",
                         "/sys/devices/pci0000:00/0000:00:06.0"};
    const char *ips[] = {"::ffff:172.16.0.10", "::ffff:172.16.1.10"};
    for (int i = 0; i < 2; i++) {
        struct erdma_device *d = device_get(i);
        assert_non_null(d);
        assert_int_equal(d->index, i);
        assert_string_equal(d->name, names[i]);
        assert_int_equal(d->port, 1);
        assert_int_equal(d->transport, TRANSPORT_ROCE);
        assert_int_equal(d->connect_mode, CONNECT_GID);
        assert_int_equal(d->completion, COMPLETION_IMM);
        assert_int_equal(d->gid_index, 1);
        union ibv_gid want;
        inet_pton(AF_INET6, ips[i], want.raw);
        assert_memory_equal(d->gid.raw, want.raw, 16);
        assert_true(d->has_pci_path);
        assert_string_equal(d->pci_path, pci[i]);
        assert_non_null(d->pd);
        assert_non_null(d->mrs);
        assert_true(d->gdr); /* nvidia_peermem in the fixture */
        assert_false(d->dmabuf);
        assert_int_equal(d->ptr_support, NCCL_PTR_HOST | NCCL_PTR_CUDA);
        assert_int_equal(d->max_qp_wr, ERDMA_MAX_SQ_WR); /* capped at eRDMA's limit */
        assert_int_equal(d->active_mtu, IBV_MTU_1024);
    }
    assert_string_equal(device_get(0)->netdev, "eth0");
    assert_string_equal(device_get(1)->netdev, "eth1");
    /* eth0 reports its speed; eth1 says -1, so erdma_1 falls back to the placeholder */
    assert_int_equal(device_get(0)->speed_mbps, 200000);
    assert_string_equal(device_get(0)->speed_source, "netdev speed");
    assert_int_equal(device_get(1)->speed_mbps, 100000);
    assert_string_equal(device_get(1)->speed_source,
                        "driver placeholder, set NCCL_ERDMA_PORT_SPEED");
    assert_null(device_get(2));
    assert_null(device_get(-1));
    assert_logged(NCCL_LOG_INFO, "Using [0]erdma_0:1/RoCE/GID1 [1]erdma_1:1/RoCE/GID1", "OOB eth0");
    assert_logged(NCCL_LOG_INFO, "[1]erdma_1: netdev eth1", "driver placeholder");
    /* the probe asked once per device */
    assert_int_equal(calls.dmabuf_calls, 2);
    release_and_check();
    assert_int_equal(calls.opens, 2);
}

static void test_props(void **state) {
    ebmgn9g_fakes();
    assert_discover(2);
    struct erdma_props p;
    device_fill_props(device_get(1), &p);
    assert_string_equal(p.name, "erdma_1");
    assert_string_equal(p.pci_path, "/sys/devices/pci0000:00/0000:00:06.0");
    assert_true(p.guid == htobe64(0x02163efffe010204ull));
    assert_int_equal(p.ptr_support, NCCL_PTR_HOST | NCCL_PTR_CUDA);
    assert_int_equal(p.reg_is_global, 1);
    assert_int_equal(p.speed, 100000);
    assert_int_equal(p.port, 1);
    assert_int_equal(p.max_recvs, ERDMA_MAX_RECVS);
    assert_int_equal(p.max_comms, 65536);
    assert_true(p.max_p2p_bytes > 0 && p.max_coll_bytes > 0);
    release_and_check();
}

static void test_port_speed_override(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_ERDMA_PORT_SPEED", "400000", 1);
    assert_discover(2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(device_get(i)->speed_mbps, 400000);
        assert_string_equal(device_get(i)->speed_source, "NCCL_ERDMA_PORT_SPEED");
    }
    release_and_check();
}

static void test_gid_index_env_falls_back(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_IB_GID_INDEX", "0", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->gid_index, 1);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 2);
    assert_logged(NCCL_LOG_WARN, "erdma_0:1", "GID index 0", "link-local",
                  "using GID index 1 (::ffff:172.16.0.10)", "NCCL_IB_GID_INDEX=1");
    release_and_check();
}

/* Auto selection reads the first 64 GIDs; an index the user set is read wherever it lies in
 * the port's table, as net_ib does (it was refused as "beyond the GID table"). */
static void test_gid_index_env_past_64(void **state) {
    ebmgn9g_fakes();
    for (int i = 0; i < 2; i++) {
        fdevs[i].ports[0].attr.gid_tbl_len = FAKE_GIDS;
        set_gid(&fdevs[i], 1, 100, "::ffff:172.16.0.100");
    }
    setenv("NCCL_IB_GID_INDEX", "100", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->gid_index, 100);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    release_and_check();
    /* past the port's table: refused, auto picks */
    setenv("NCCL_IB_GID_INDEX", "200", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->gid_index, 1);
    assert_logged(NCCL_LOG_WARN, "erdma_0:1", "GID index 200 is beyond the GID table",
                  "using GID index 1");
    release_and_check();
}

/* NCCL_IB_ADDR_FAMILY is a choice: a value other than AF_INET/AF_INET6 is WARNed about once
 * and means AF_INET (any string but exactly "AF_INET6" silently meant AF_INET). */
static void test_addr_family_choice(void **state) {
    ebmgn9g_fakes();
    for (int i = 0; i < 2; i++)
        set_gid(&fdevs[i], 1, 2, i ? "2001:db8::11" : "2001:db8::10");
    setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->gid_index, 2);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    release_and_check();
    setenv("NCCL_IB_ADDR_FAMILY", "ipv6", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->gid_index, 1);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1); /* once, not per device */
    assert_logged(NCCL_LOG_WARN, "NCCL_IB_ADDR_FAMILY=\"ipv6\"", "{AF_INET, AF_INET6}",
                  "using \"AF_INET\"");
    release_and_check();
}

static void test_interface_without_ipv4_skipped(void **state) {
    ebmgn9g_fakes();
    memset(&fdevs[1].ports[0].gids[1], 0, 16); /* erdma_1's netdev has no IPv4 yet */
    assert_discover(1);
    assert_string_equal(device_get(0)->name, "erdma_0");
    assert_logged(NCCL_LOG_WARN, "erdma_1:1 has no usable RoCE GID", "IPv4 address");
    release_and_check();
    /* both: nothing left */
    memset(&fdevs[0].ports[0].gids[1], 0, 16);
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "no ACTIVE RDMA port usable among 2 device(s)");
    release_and_check();
}

static void test_dmabuf_eopnotsupp(void **state) {
    ebmgn9g_fakes();
    dmabuf_errno = EOPNOTSUPP;
    assert_discover(2);
    assert_false(device_get(0)->dmabuf);
    assert_int_equal(device_get(0)->ptr_support & NCCL_PTR_DMABUF, 0);
    release_and_check();
    dmabuf_errno = EPROTONOSUPPORT;
    assert_discover(2);
    assert_false(device_get(0)->dmabuf);
    release_and_check();
}

static void test_dmabuf_ebadf(void **state) {
    ebmgn9g_fakes();
    dmabuf_errno = EBADF; /* the kernel looked at the fd: dma-buf works */
    setenv("NCCL_ERDMA_GDR", "0", 1);
    assert_discover(2);
    assert_true(device_get(0)->dmabuf);
    assert_false(device_get(0)->gdr);
    /* As net_ib: no NCCL_PTR_CUDA without peer memory. The kernel probe says nothing about
     * CUDA's side; NCCL enables GDR through dma-buf only where CUDA can export one. */
    assert_int_equal(device_get(0)->ptr_support, NCCL_PTR_HOST | NCCL_PTR_DMABUF);
    assert_logged(NCCL_LOG_INFO, "[0]erdma_0:", ", dma-buf");
    release_and_check();
}

static void test_dmabuf_registration_succeeds(void **state) {
    ebmgn9g_fakes();
    dmabuf_errno = 0;
    assert_discover(2);
    assert_true(device_get(1)->dmabuf);
    assert_int_equal(calls.mrs, 2);
    assert_int_equal(calls.mrs_freed, 2); /* the probe's MR is released at once */
    release_and_check();
}

static void test_dmabuf_disabled_or_absent(void **state) {
    ebmgn9g_fakes();
    dmabuf_errno = EBADF;
    setenv("NCCL_DMABUF_ENABLE", "0", 1);
    assert_discover(2);
    assert_false(device_get(0)->dmabuf);
    assert_int_equal(calls.dmabuf_calls, 0);
    release_and_check();
    unsetenv("NCCL_DMABUF_ENABLE");
    /* old rdma-core: no ibv_reg_dmabuf_mr at all */
    struct verbs_api api = fake_api();
    api.reg_dmabuf_mr = NULL;
    verbs_install_fake(&api);
    assert_discover(2);
    assert_false(device_get(0)->dmabuf);
    assert_int_equal(device_get(0)->ptr_support, NCCL_PTR_HOST | NCCL_PTR_CUDA);
    release_and_check();
}

static void test_gdr_param(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_ERDMA_GDR", "0", 1);
    assert_discover(2);
    assert_false(device_get(0)->gdr);
    assert_int_equal(device_get(0)->ptr_support, NCCL_PTR_HOST);
    release_and_check();
}

static void test_port_not_active_skipped(void **state) {
    ebmgn9g_fakes();
    fdevs[0].ports[0].attr.state = IBV_PORT_DOWN;
    assert_discover(1);
    assert_string_equal(device_get(0)->name, "erdma_1");
    assert_int_equal(device_get(0)->index, 0);
    assert_logged(NCCL_LOG_INFO, "erdma_0:1 is not ACTIVE");
    assert_int_equal(calls.closes, 1); /* the unused context is closed at once */
    release_and_check();
}

static void test_open_failure_skipped(void **state) {
    ebmgn9g_fakes();
    fdevs[0].open_fails = true;
    assert_discover(1);
    assert_string_equal(device_get(0)->name, "erdma_1");
    assert_logged(NCCL_LOG_WARN, "cannot open erdma_0", "/dev/infiniband");
    release_and_check();
}

static void test_not_ethernet_skipped(void **state) {
    ebmgn9g_fakes();
    fdevs[1].ports[0].attr.link_layer = IBV_LINK_LAYER_INFINIBAND;
    assert_discover(1);
    assert_logged(NCCL_LOG_WARN, "erdma_1:1 is not an Ethernet (RoCE) port");
    release_and_check();
}

static void test_two_ports_share_context(void **state) {
    ebmgn9g_fakes();
    fdevs[0].attr.phys_port_cnt = 2;
    assert_discover(3);
    assert_string_equal(device_get(1)->name, "erdma_0");
    assert_int_equal(device_get(1)->port, 2);
    assert_ptr_equal(device_get(0)->ctx, device_get(1)->ctx);
    assert_ptr_not_equal(device_get(0)->pd, device_get(1)->pd);
    release_and_check(); /* the shared context is closed exactly once */
    assert_int_equal(calls.closes, 2);
    /* dev:port keeps only that port */
    setenv("NCCL_IB_HCA", "erdma_0:2", 1);
    assert_discover(1);
    assert_int_equal(device_get(0)->port, 2);
    release_and_check();
}

/* libibverbs lists devices in readdir order of /sys/class/infiniband, which differs between
 * nodes: the plugin sorts them by PCI bus ID as net_ib does (NCCL_IB_DEVICE_PCI_ORDER=1), so
 * index 0 is the NIC in the lower slot everywhere. */
static void test_pci_order(void **state) {
    use_fixture("ebmgn9g");
    add_roce_dev("erdma_1", 0x02163efffe010204ull, "172.16.1.10"); /* 0000:00:06.0 */
    add_roce_dev("erdma_0", 0x02163efffe010203ull, "172.16.0.10"); /* 0000:00:05.0 */
    assert_discover(2);
    assert_string_equal(device_get(0)->name, "erdma_0");
    assert_string_equal(device_get(0)->pci_path, "/sys/devices/pci0000:00/0000:00:05.0");
    assert_int_equal(device_get(0)->index, 0);
    assert_string_equal(device_get(1)->name, "erdma_1");
    assert_int_equal(device_get(1)->index, 1);
    /* The device's own address, not the verbs list's: the GID follows its device. */
    union ibv_gid want;
    inet_pton(AF_INET6, "::ffff:172.16.0.10", want.raw);
    assert_memory_equal(device_get(0)->gid.raw, want.raw, 16);
    assert_logged(NCCL_LOG_INFO, "Using [0]erdma_0:1/RoCE/GID1 [1]erdma_1:1/RoCE/GID1");
    assert_logged(NCCL_LOG_INFO, "device order (by PCI path, NCCL_IB_DEVICE_PCI_ORDER=1): "
                                 "[0]erdma_0 /sys/devices/pci0000:00/0000:00:05.0 "
                                 "[1]erdma_1 /sys/devices/pci0000:00/0000:00:06.0");
    release_and_check();
    /* 0: libibverbs' order, as before. */
    setenv("NCCL_IB_DEVICE_PCI_ORDER", "0", 1);
    assert_discover(2);
    assert_string_equal(device_get(0)->name, "erdma_1");
    assert_string_equal(device_get(1)->name, "erdma_0");
    assert_logged(NCCL_LOG_INFO, "device order (libibverbs', NCCL_IB_DEVICE_PCI_ORDER=0): "
                                 "[0]erdma_1");
    release_and_check();
}

/* A device without a PCI function under /sys/class/infiniband (rxe) goes last, as in net_ib. */
static void test_pci_order_soft_device_last(void **state) {
    use_fixture("ebmgn9g");
    add_roce_dev("rxe0", 0x02163efffe010205ull, "172.16.0.10");
    add_roce_dev("erdma_1", 0x02163efffe010204ull, "172.16.1.10");
    assert_discover(2);
    assert_string_equal(device_get(0)->name, "erdma_1");
    assert_string_equal(device_get(1)->name, "rxe0");
    release_and_check();
}

/* ---- the async-event thread over two ports of one context ---- */
static struct ibv_async_event async_queue[4];
static int async_queued, async_taken;

static int fake_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev) {
    char c;
    if (async_taken >= __atomic_load_n(&async_queued, __ATOMIC_ACQUIRE) ||
        read(ctx->async_fd, &c, 1) != 1) {
        errno = EAGAIN;
        return -1;
    }
    *ev = async_queue[async_taken++];
    return 0;
}

static void fake_ack_async_event(struct ibv_async_event *ev) {}

static const char *fake_event_type_str(enum ibv_event_type type) {
    return type == IBV_EVENT_PORT_ERR ? "port error" : "port active";
}

static void async_post(int wfd, enum ibv_event_type type, int port) {
    async_queue[async_queued] =
        (struct ibv_async_event){.event_type = type, .element.port_num = port};
    __atomic_store_n(&async_queued, async_queued + 1, __ATOMIC_RELEASE);
    assert_int_equal(write(wfd, "e", 1), 1);
}

static bool wait_for(const int *v, int want) {
    for (int i = 0; i < 200; i++) {
        if (__atomic_load_n(v, __ATOMIC_ACQUIRE) == want) return true;
        usleep(10000);
    }
    return false;
}

/* A port event names its port: the device of that port gets it, even when it is not the
 * first device of the shared context; port-active undoes port-down (a link flap). */
static void test_async_port_events_on_second_port(void **state) {
    ebmgn9g_fakes();
    fdevs[0].attr.phys_port_cnt = 2;
    assert_discover(3);
    struct erdma_device *p1 = device_get(0), *p2 = device_get(1);
    assert_ptr_equal(p1->ctx, p2->ctx);
    assert_int_equal(p2->port, 2);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    p1->ctx->async_fd = fds[0];
    device_get(2)->ctx->async_fd = fds[0]; /* never written for erdma_1 */
    struct verbs_api api = fake_api();
    api.get_async_event = fake_get_async_event;
    api.ack_async_event = fake_ack_async_event;
    api.event_type_str = fake_event_type_str;
    verbs_install_fake(&api);
    async_queued = async_taken = 0;
    assert_int_equal(async_start(), 0);
    async_post(fds[1], IBV_EVENT_PORT_ERR, 2);
    bool down = wait_for(&p2->fatal, -ENETDOWN);
    async_post(fds[1], IBV_EVENT_PORT_ACTIVE, 2);
    bool up = down && wait_for(&p2->fatal, 0);
    async_stop();
    close(fds[0]);
    close(fds[1]);
    assert_true(down);
    assert_true(up);
    assert_int_equal(p2->port_downs, 1);
    assert_int_equal(p1->fatal, 0);
    assert_int_equal(p1->port_downs, 0);
    release_and_check();
}

static void test_hca_filter(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_IB_HCA", "erdma_1", 1);
    assert_discover(1);
    assert_string_equal(device_get(0)->name, "erdma_1");
    release_and_check();

    setenv("NCCL_IB_HCA", "^erdma_1", 1);
    assert_discover(1);
    assert_string_equal(device_get(0)->name, "erdma_0");
    release_and_check();

    setenv("NCCL_IB_HCA", "erdma", 1);
    assert_discover(2);
    release_and_check();

    setenv("NCCL_IB_HCA", "=erdma", 1);
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "NCCL_IB_HCA=\"=erdma\" matches no ACTIVE RDMA port",
                  "2 device(s) present");
    release_and_check();

    setenv("NCCL_IB_HCA", "mlx5_0", 1);
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "matches no ACTIVE RDMA port");
    release_and_check();

    /* an entry that selects nothing is named, though the others work: a misspelt NIC was
     * left out in silence, and the job ran on half its bandwidth */
    setenv("NCCL_IB_HCA", "erdma_0, erdam_1", 1);
    assert_discover(1);
    assert_logged(NCCL_LOG_WARN, "NCCL_IB_HCA entry \"erdam_1\" selects no ACTIVE RDMA port",
                  "check the name with ibv_devices");
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1);
    release_and_check();
    setenv("NCCL_IB_HCA", "erdma_0:1,erdma_0:2,erdma", 1); /* a port the device lacks */
    assert_discover(2);
    assert_logged(NCCL_LOG_WARN, "entry \"erdma_0:2\" selects no ACTIVE RDMA port");
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 1);
    release_and_check();
    setenv("NCCL_IB_HCA", "^mlx5", 1); /* excluding what is absent is no mistake */
    assert_discover(2);
    assert_int_equal(unit_log_count_level(NCCL_LOG_WARN), 0);
    release_and_check();
}

/* NCCL's dev:port:rail:plane: the devices it names carry that rail and plane to getProperties;
 * any other device, and every device without NCCL_IB_HCA, reports them undefined (-1). */
static void test_hca_rail_plane(void **state) {
    struct erdma_props p;
    ebmgn9g_fakes();
    setenv("NCCL_IB_HCA", "=erdma_0:1:0:0,erdma_1:1:7:2", 1);
    assert_discover(2);
    device_fill_props(device_get(0), &p);
    assert_int_equal(p.rail_id, 0);
    assert_int_equal(p.plane_id, 0);
    device_fill_props(device_get(1), &p);
    assert_int_equal(p.rail_id, 7);
    assert_int_equal(p.plane_id, 2);
    release_and_check();

    setenv("NCCL_IB_HCA", "erdma_0:1:3,erdma_1", 1);
    assert_discover(2);
    device_fill_props(device_get(0), &p);
    assert_int_equal(p.rail_id, 3);
    assert_int_equal(p.plane_id, -1);
    device_fill_props(device_get(1), &p);
    assert_int_equal(p.rail_id, -1);
    assert_int_equal(p.plane_id, -1);
    release_and_check();

    unsetenv("NCCL_IB_HCA");
    assert_discover(2);
    device_fill_props(device_get(1), &p);
    assert_int_equal(p.rail_id, -1);
    assert_int_equal(p.plane_id, -1);
    release_and_check();
}

/* NCCL_ERDMA_FORCE_FLUSH=1 reaches NCCL as forceFlush: NCCL (2.27+) calls iflush only where
 * the topology needs it (never on sm90+ GPUs) unless a device says forceFlush, so the knob
 * that says "flushes after every receive" did nothing under NCCL. */
static void test_force_flush_reported(void **state) {
    struct erdma_props p;
    ebmgn9g_fakes();
    assert_discover(2);
    device_fill_props(device_get(0), &p);
    assert_int_equal(p.force_flush, 0); /* net_ib's answer for a NIC that is not DataDirect */
    release_and_check();
    setenv("NCCL_ERDMA_FORCE_FLUSH", "1", 1);
    assert_discover(2);
    device_fill_props(device_get(1), &p);
    assert_int_equal(p.force_flush, 1);
    release_and_check();
}

static void test_hca_filter_malformed(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_IB_HCA", "erdma_0:x", 1);
    assert_discover(-EINVAL);
    assert_logged(NCCL_LOG_WARN, "NCCL_IB_HCA=\"erdma_0:x\" is malformed", "invalid port");
    assert_int_equal(calls.lists, 0); /* refused before touching devices */
    release_and_check();
}

static void test_no_devices(void **state) {
    use_fixture("ebmgn9g");
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "no RDMA devices found", "empty", "aliyun/erdma",
                  "ibverbs-providers");
    release_and_check(); /* the empty list was freed */
    list_fails = true;
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "no RDMA devices found", strerror(ENOSYS), "aliyun/erdma");
    release_and_check();
}

static void test_rediscover(void **state) {
    ebmgn9g_fakes();
    for (int round = 0; round < 3; round++) {
        assert_discover(2);
        release_and_check();
    }
    assert_int_equal(calls.opens, 6);
}

static void test_rxe_pci_path_from_netdev(void **state) {
    use_fixture("rxe");
    add_roce_dev("rxe0", 0x5054fffe123456ull, "192.168.122.10");
    assert_discover(1);
    struct erdma_device *d = device_get(0);
    assert_string_equal(d->netdev, "eth0");
    assert_int_equal(d->gid_index, 1);
    assert_true(d->has_pci_path);
    assert_string_equal(d->pci_path, "/sys/devices/pci0000:00/0000:00:03.0");
    /* not eRDMA, no netdev speed: the verbs figure is trusted */
    assert_string_equal(d->speed_source, "verbs");
    assert_int_equal(d->speed_mbps, 100000);
    /* no peer memory module in this fixture */
    assert_false(d->gdr);
    assert_int_equal(d->ptr_support, NCCL_PTR_HOST);
    release_and_check();
    setenv("NCCL_ERDMA_GDR", "1", 1);
    assert_discover(1);
    assert_int_equal(device_get(0)->ptr_support, NCCL_PTR_HOST | NCCL_PTR_CUDA);
    release_and_check();
}

/* Containers may hide gid_attrs: index 1 is still checked and used, and the
 * netdev is not guessed from a GID that carries no MAC. */
static void test_container_hidden_gid_attrs(void **state) {
    use_fixture("container");
    add_roce_dev("erdma_0", 0x02163efffe010203ull, "172.16.0.10");
    assert_discover(1);
    struct erdma_device *d = device_get(0);
    assert_int_equal(d->gid_index, 1);
    assert_string_equal(d->pci_path, "/sys/devices/pci0000:00/0000:00:05.0");
    /* ::ffff:a.b.c.d starts with six zero bytes: that is lo's "MAC", not this NIC's */
    assert_string_not_equal(d->netdev, "lo");
    assert_int_not_equal(d->ip.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    assert_string_equal(d->speed_source, "driver placeholder, set NCCL_ERDMA_PORT_SPEED");
    /* peer memory known as nv_mem_nc only, which NCCL's own check accepts */
    assert_true(d->gdr);
    assert_int_equal(d->ptr_support, NCCL_PTR_HOST | NCCL_PTR_CUDA);
    release_and_check();
}

static const uint8_t erdma0_mac[6] = {0x00, 0x16, 0x3e, 0x0a, 0x0b, 0x0c};
static const uint8_t erdma1_mac[6] = {0x00, 0x16, 0x3e, 0x0a, 0x0b, 0x0d};
static const uint8_t siw0_mac[6] = {0x00, 0x00, 0x00, 0x00, 0x00, 0x00}; /* siw on lo */

static void iwarp_fakes(void) {
    use_fixture("erdma-iwarp");
    add_iwarp_dev("erdma_0", 0x0216ull, erdma0_mac);
    add_iwarp_dev("erdma_1", 0x0217ull, erdma1_mac);
    add_iwarp_dev("siw0", 0x0218ull, siw0_mac);
}

static void test_iwarp_uses_rdmacm(void **state) {
    /* the netdev's IPv4 comes from getifaddrs(), which no fixture can fake: lo is the one
     * interface every host has, so the fixture points erdma_0 (by MAC) and siw0 (parent) at it */
    if (!host_lo_has_127_0_0_1()) fail_msg("this test needs 127.0.0.1 on lo");
    iwarp_fakes();
    assert_discover(2);

    struct erdma_device *e = dev_named("erdma_0");
    assert_non_null(e);
    assert_int_equal(e->transport, TRANSPORT_IWARP);
    assert_int_equal(e->connect_mode, CONNECT_RDMACM);
    assert_int_equal(e->completion, COMPLETION_SEND);
    assert_int_equal(e->gid_index, 0);
    assert_memory_equal(e->gid.raw, erdma0_mac, 6);
    assert_string_equal(e->netdev, "lo");
    assert_int_equal(e->ip.sin_family, AF_INET);
    assert_int_equal(e->ip.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    assert_string_equal(e->pci_path, "/sys/devices/pci0000:00/0000:00:05.0");
    assert_string_equal(e->speed_source, "driver placeholder, set NCCL_ERDMA_PORT_SPEED");

    struct erdma_device *s = dev_named("siw0");
    assert_non_null(s);
    assert_int_equal(s->transport, TRANSPORT_IWARP);
    assert_int_equal(s->connect_mode, CONNECT_RDMACM);
    assert_string_equal(s->netdev, "lo");
    assert_false(s->has_pci_path);
    struct erdma_props p;
    device_fill_props(s, &p);
    assert_null(p.pci_path);
    assert_string_equal(s->speed_source, "verbs");

    /* erdma_1's MAC matches no interface: no IPv4 for rdma_cm, skipped with the reason */
    assert_null(dev_named("erdma_1"));
    assert_logged(NCCL_LOG_WARN, "erdma_1: rdma_cm needs an IPv4 address on its netdev (unknown)");
    assert_logged(NCCL_LOG_INFO, "[0]erdma_0:1/iWARP", "[1]siw0:1/iWARP", "OOB lo:127.0.0.1");
    release_and_check();
}

static void test_iwarp_without_rdmacm(void **state) {
    iwarp_fakes();
    struct verbs_api api = fake_api();
    api.cm_create_event_channel = NULL;
    verbs_install_fake(&api);
    assert_false(verbs_have_rdmacm());
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "erdma_0 needs rdma_cm but librdmacm could not be loaded");
    assert_logged(NCCL_LOG_WARN, "siw0 needs rdma_cm");
    release_and_check();
}

static struct ibv_pd *failing_alloc_pd(struct ibv_context *ctx) {
    errno = ENOMEM;
    return NULL;
}

/* A discovery that finds no usable device after librdmacm listed its devices releases that
 * list: it kept it, the plugin's init then unloaded librdmacm without devices_release(), and
 * the next init (NCCL's next communicator, v11) walked the freed list. */
static void test_failed_discovery_releases_rdmacm_list(void **state) {
    if (!host_lo_has_127_0_0_1()) fail_msg("this test needs 127.0.0.1 on lo");
    iwarp_fakes();
    struct verbs_api api = fake_api();
    api.alloc_pd = failing_alloc_pd;
    verbs_install_fake(&api);
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "erdma_0: ibv_alloc_pd failed");
    assert_int_equal(cm_lists_out, 0); /* no devices_release() before this */
    api.alloc_pd = fake_alloc_pd;
    verbs_install_fake(&api);
    assert_discover(2); /* the next init finds them again */
    release_and_check();
}

static void test_iwarp_gid_mode_refused(void **state) {
    iwarp_fakes();
    setenv("NCCL_ERDMA_CONNECT_MODE", "gid", 1);
    assert_discover(-ENODEV);
    assert_logged(NCCL_LOG_WARN, "erdma_0 is an iWARP device", "NCCL_ERDMA_CONNECT_MODE");
    release_and_check();
}

static void test_completion_override(void **state) {
    ebmgn9g_fakes();
    setenv("NCCL_ERDMA_COMPLETION", "send", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->completion, COMPLETION_SEND);
    assert_int_equal(device_get(0)->connect_mode, CONNECT_GID);
    release_and_check();
    setenv("NCCL_ERDMA_COMPLETION", "bogus", 1);
    assert_discover(2);
    assert_int_equal(device_get(0)->completion, COMPLETION_IMM);
    assert_logged(NCCL_LOG_WARN, "NCCL_ERDMA_COMPLETION=\"bogus\"");
    release_and_check();
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_ib_rate),
        T(test_speed_resolve),
        T(test_ebmgn9g_both_found),
        T(test_props),
        T(test_port_speed_override),
        T(test_gid_index_env_falls_back),
        T(test_interface_without_ipv4_skipped),
        T(test_gid_index_env_past_64),
        T(test_addr_family_choice),
        T(test_dmabuf_eopnotsupp),
        T(test_dmabuf_ebadf),
        T(test_dmabuf_registration_succeeds),
        T(test_dmabuf_disabled_or_absent),
        T(test_gdr_param),
        T(test_port_not_active_skipped),
        T(test_open_failure_skipped),
        T(test_not_ethernet_skipped),
        T(test_two_ports_share_context),
        T(test_pci_order),
        T(test_pci_order_soft_device_last),
        T(test_async_port_events_on_second_port),
        T(test_hca_filter),
        T(test_hca_filter_malformed),
        T(test_hca_rail_plane),
        T(test_no_devices),
        T(test_rediscover),
        T(test_rxe_pci_path_from_netdev),
        T(test_container_hidden_gid_attrs),
        T(test_iwarp_uses_rdmacm),
        T(test_iwarp_without_rdmacm),
        T(test_iwarp_gid_mode_refused),
        T(test_failed_discovery_releases_rdmacm_list),
        T(test_force_flush_reported),
        T(test_completion_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
