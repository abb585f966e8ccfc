/*
 * Runs NVIDIA NCCL's own topology code (src/graph/{xml,topo,paths,search}.cc,
 * compiled unmodified from ../shared) the way a node's ranks run it at
 * communicator init, on fake sysfs trees of the ebmgn9g family and of nodes
 * that differ from it: eight threads act as the node's eight ranks, each runs
 * ncclTopoGetSystem (which fuses the ranks' trees on 2.22+), computes and
 * trims paths, and searches the ring and tree graphs. On rank 0's system it
 * then loads graph files as NCCL_GRAPH_FILE: the old shipped graph, and the
 * graph the plugin's selection (nccl-erdma-topo select) picks for the tree,
 * which must equal NCCL's own search on node 0 and node 1 of the job; and it
 * reruns the ranks with nccl-erdma-topo generate's output as NCCL_TOPO_FILE.
 * Prints what NCCL computes; fails when NCCL fails where it must not, or when
 * the result is not what the plugin's topology support relies on (GPUs next
 * to their NIC, every channel's NIC PIX-near its GPUs, no graph selected
 * where an assumption of it fails).
 */
#include "ng_world.h"

#include "comm.h"
#include "graph.h"
#include "nccl.h"
#include "topo.h"
#include "transport.h"
#include "xml.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* NCCL before 2.30 has no name for "virtual devices not made yet". */
#ifndef NCCL_UNDEF_DEV_COUNT
#define NCCL_UNDEF_DEV_COUNT -1
#endif

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

/* ---------- the node being modelled ---------- */

enum ng_cpu { CPU_INTEL_SPR, CPU_INTEL_ERP, CPU_AMD };

struct ng_case {
    const char *name;
    ng_cpu cpu;
    int hb[2];         /* host bridge bus of each socket */
    bool gdr;          /* the plugin reports NCCL_PTR_CUDA */
    bool nic_reversed; /* the plugin lists erdma_1 first */
    int nics;          /* NICs the plugin exposes (NCCL_IB_HCA may drop one) */
    int nodes;         /* nodes in the job: 1 trims the NICs away */
};

struct ng_dev {
    std::string busid, path; /* path below sys/devices */
    std::string name;        /* NICs */
};

static struct {
    std::string root;
    std::vector<ng_dev> gpus, nics; /* GPUs in bus ID order; NICs in the plugin's order */
    ng_pci_ids gpu_ids;
    unsigned cpuid[2][4];
    bool gdr;
    int virt = NCCL_UNDEF_DEV_COUNT;
    std::mutex mu;
    std::vector<std::string> warns;
    pthread_barrier_t barrier;
    std::vector<char> gather;
} W;

static thread_local int t_rank = -1;
static int tree_serial; /* counts trees, see rank_main */

const char *ng_sysfs_root(void) {
    return W.root.c_str();
}
bool ng_verbose(void) {
    return getenv("NG_VERBOSE") != NULL;
}
int ng_thread_rank(void) {
    return t_rank;
}
/* The node whose 8 ranks the threads act as: 0 (ranks 0-7) or, in a job of 2, 1 (ranks 8-15). */
static int run_node;
/* The node's ranks in the communicator: 8, or 4 for a communicator of GPUs 0-3 of each node. */
static int local_ranks = 8;
static const uint64_t node_hash = 0x6e6f64654131ull;
uint64_t ng_host_hash(void) {
    return node_hash + run_node;
}
unsigned *ng_cpuid(unsigned leaf) {
    return W.cpuid[leaf ? 1 : 0];
}
const ng_pci_ids *ng_gpu_ids(int) {
    return &W.gpu_ids;
}
int ng_net_count(void) {
    return (int)W.nics.size();
}
int ng_virt_count(void) {
    return W.virt;
}
void ng_set_virt_count(int n) {
    W.virt = n;
}

void ng_record_warn(const char *msg) {
    std::lock_guard<std::mutex> l(W.mu);
    W.warns.push_back(msg);
}

int ng_gpu_index(const char *busId) {
    for (size_t i = 0; i < W.gpus.size(); i++)
        if (!strcasecmp(W.gpus[i].busid.c_str(), busId)) return (int)i;
    return -1;
}

void ng_allgather(int rank, int nranks, void *all, int size) {
    /* Each rank's slice is in its own buffer: collect, wait for all, copy back, wait again. */
    memcpy(W.gather.data() + (size_t)size * rank, (char *)all + (size_t)size * rank, size);
    pthread_barrier_wait(&W.barrier);
    memcpy(all, W.gather.data(), (size_t)size * nranks);
    pthread_barrier_wait(&W.barrier);
}

/* ---------- the fake sysfs tree ---------- */

static void put(const std::string &path, const char *fmt, ...) {
    FILE *f = fopen(path.c_str(), "w");
    if (!f) {
        perror(path.c_str());
        exit(2);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static void mkdirs(const std::string &p) {
    std::string cur;
    for (size_t i = 1; i <= p.size(); i++)
        if (i == p.size() || p[i] == '/') {
            cur = p.substr(0, i);
            if (mkdir(cur.c_str(), 0755) && errno != EEXIST) {
                perror(cur.c_str());
                exit(2);
            }
        }
}

static void link_to(const std::string &target, const std::string &at) {
    if (symlink(target.c_str(), at.c_str()) && errno != EEXIST) {
        perror(at.c_str());
        exit(2);
    }
}

/* A PCI function at sys/devices/<rel>: the attributes NCCL reads, and its bus link. */
static std::string function(const std::string &rel, unsigned vendor, unsigned device, unsigned cls,
                            int numa) {
    std::string d = W.root + "/sys/devices/" + rel;
    mkdirs(d);
    put(d + "/vendor", "0x%04x", vendor);
    put(d + "/device", "0x%04x", device);
    put(d + "/class", "0x%06x", cls);
    put(d + "/subsystem_vendor", "0x%04x", vendor == 0x10de ? 0x10de : 0x1ded);
    put(d + "/subsystem_device", "0x%04x", 0x16a1);
    put(d + "/numa_node", "%d", numa);
    put(d + "/max_link_speed", "32.0 GT/s PCIe");
    put(d + "/max_link_width", "16");
    link_to(W.root + "/sys/bus/pci", d + "/subsystem");
    std::string bdf = rel.substr(rel.rfind('/') + 1);
    /* The bus the function sits on, as the kernel lists it: NCCL before 2.30 finds a function
     * through /sys/class/pci_bus/<bus>/../../<bdf>. */
    std::string parent = d.substr(0, d.rfind('/')), bus = bdf.substr(0, 7);
    mkdirs(parent + "/pci_bus/" + bus);
    mkdirs(W.root + "/sys/class/pci_bus");
    link_to(parent + "/pci_bus/" + bus, W.root + "/sys/class/pci_bus/" + bus);
    link_to(d, W.root + "/sys/bus/pci/devices/" + bdf);
    return bdf;
}

static std::string bdf(int bus, int dev) {
    char b[32];
    snprintf(b, sizeof(b), "0000:%02x:%02x.0", bus, dev);
    return b;
}

/* One socket as topo/README.md assumes: root port, a PCIe switch, 4 GPUs and 1 NIC behind it. */
static void socket(int numa, int hb, int gpus, bool nic) {
    char host[32];
    snprintf(host, sizeof(host), "pci0000:%02x", hb);
    std::string rp = std::string(host) + "/" + bdf(hb, 1);
    function(rp, 0x8086, 0x352a, 0x060400, numa);
    std::string up = rp + "/" + bdf(hb + 1, 0);
    function(up, 0x1000, 0xc030, 0x060400, numa);
    for (int slot = 0; slot < gpus + (nic ? 1 : 0); slot++) {
        std::string dn = up + "/" + bdf(hb + 2, slot);
        function(dn, 0x1000, 0xc030, 0x060400, numa);
        std::string ep = dn + "/" + bdf(hb + 3 + slot, 0);
        if (slot < gpus) {
            W.gpus.push_back({function(ep, 0x10de, 0x2330, 0x030200, numa), ep, ""});
        } else {
            std::string name = "erdma_" + std::to_string(numa);
            std::string b = function(ep, 0x1ded, 0x107f, 0x020000, numa);
            std::string ib = W.root + "/sys/devices/" + ep + "/infiniband/" + name;
            mkdirs(ib);
            link_to(W.root + "/sys/devices/" + ep, ib + "/device");
            link_to(ib, W.root + "/sys/class/infiniband/" + name);
            W.nics.push_back({b, ep, name});
        }
    }
    std::string node = W.root + "/sys/devices/system/node/node" + std::to_string(numa);
    mkdirs(node);
    put(node + "/cpumap", numa == 0 ? "00000000,0000ffff" : "00000000,ffff0000");
}

static void build_tree(const ng_case &c) {
    char tmpl[] = "/tmp/ng-sysfs-XXXXXX";
    const char *base = getenv("TMPDIR");
    std::string t = std::string(base && *base ? base : "/tmp") + "/ng-sysfs-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back(0);
    if (!mkdtemp(buf.data())) {
        perror(tmpl);
        exit(2);
    }
    W.root = buf.data();
    tree_serial++;
    char real[PATH_MAX];
    if (realpath(W.root.c_str(), real)) W.root = real;
    mkdirs(W.root + "/sys/bus/pci/devices");
    mkdirs(W.root + "/sys/class/infiniband");
    W.gpus.clear();
    W.nics.clear();
    socket(0, c.hb[0], 4, true);
    socket(1, c.hb[1], 4, true);
    std::sort(W.gpus.begin(), W.gpus.end(),
              [](const ng_dev &a, const ng_dev &b) { return a.busid < b.busid; });
    if (c.nic_reversed) std::reverse(W.nics.begin(), W.nics.end());
    W.nics.resize(c.nics);
    W.gpu_ids = {0x10de, 0x2330, 0x10de, 0x16a1};
    static const char *const vendors[] = {"GenuineIntel", "GenuineIntel", "AuthenticAMD"};
    static const unsigned leaf1[] = {0x000806f0, 0x000c06f0, 0x00a10f10};
    const char *v = vendors[c.cpu];
    memcpy(&W.cpuid[0][1], v, 4);     /* ebx */
    memcpy(&W.cpuid[0][3], v + 4, 4); /* edx */
    memcpy(&W.cpuid[0][2], v + 8, 4); /* ecx */
    W.cpuid[1][0] = leaf1[c.cpu];
    /* What the plugin reads to tell the CPU kind (cpuid's family and model, as Linux prints). */
    static const int family[] = {6, 6, 25}, model[] = {0x8f, 0xcf, 0x11};
    mkdirs(W.root + "/proc");
    put(W.root + "/proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: %s\ncpu family\t: %d\nmodel\t\t: %d\n", v, family[c.cpu],
        model[c.cpu]);
    W.gdr = c.gdr;
    W.virt = NCCL_UNDEF_DEV_COUNT;
}

static void remove_tree(void) {
    std::string cmd = "rm -rf '" + W.root + "'";
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", W.root.c_str());
}

/* ---------- the net plugin's answers ---------- */

static ncclResult_t net_devices(int *n) {
    *n = (int)W.nics.size();
    return ncclSuccess;
}

static char pci_paths[8][PATH_MAX];

static ncclResult_t net_properties(int dev, ncclNetProperties_t *p) {
    if (dev < 0 || dev >= (int)W.nics.size()) return ncclInvalidArgument;
    memset(p, 0, sizeof(*p));
    p->name = (char *)W.nics[dev].name.c_str();
    /* The plugin reports realpath(/sys/class/infiniband/<dev>/device). */
    std::string link = W.root + "/sys/class/infiniband/" + W.nics[dev].name + "/device";
    if (!realpath(link.c_str(), pci_paths[dev])) return ncclSystemError;
    p->pciPath = pci_paths[dev];
    p->guid = 0x1ded000000000000ull + dev;
    p->ptrSupport = NCCL_PTR_HOST | (W.gdr ? NCCL_PTR_CUDA : 0);
    p->speed = 200000;
    p->port = 1;
    p->latency = 0;
    p->maxComms = 65536;
    p->maxRecvs = 1;
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
#if NCCL_VERSION_CODE >= 22400 /* ncclNet v9 */
    p->vProps.ndevs = 1;
    p->vProps.devs[0] = dev;
    p->maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
    p->maxCollBytes = NCCL_MAX_NET_SIZE_BYTES;
#endif
#if NCCL_VERSION_CODE >= 23000
    p->railId = NCCL_NET_ID_UNDEF;
    p->planeId = NCCL_NET_ID_UNDEF;
#endif
    return ncclSuccess;
}

#if NCCL_VERSION_CODE >= 22400 /* ncclNet v9 */
static ncclResult_t net_make_vdevice(int *, ncclNetVDeviceProps_t *props) {
    fprintf(stderr, "NCCL asked the plugin to merge %d NICs: not expected on these nodes\n",
            props->ndevs);
    abort();
}
#endif

/* ---------- one rank ---------- */

/* A graph as NCCL holds it after ncclTopoCompute, searched or loaded from NCCL_GRAPH_FILE: the
 * pattern decides which GPUs carry a tree's network traffic, crossNic whether connect.cc
 * alternates the rings, latencyInter the tuning model's network latency. */
struct ng_graph_out {
    int nChannels, pattern, crossNic, typeIntra, typeInter, sameChannels;
    float bwIntra, bwInter, latencyInter;
    std::string channels; /* each channel's NETs and GPUs, in order */
    std::string why;      /* a channel whose NIC is not PIX-near its GPU */
};

static bool same_graph(const ng_graph_out &a, const ng_graph_out &b) {
    return a.nChannels == b.nChannels && a.pattern == b.pattern && a.crossNic == b.crossNic &&
           a.typeIntra == b.typeIntra && a.typeInter == b.typeInter &&
           a.sameChannels == b.sameChannels && a.bwIntra == b.bwIntra && a.bwInter == b.bwInter &&
           a.latencyInter == b.latencyInter && a.channels == b.channels;
}

struct ng_rank_out {
    ncclResult_t rc = ncclSuccess;
    const char *step = "";
    int ncpu = 0, npci = 0, ngpu = 0, nnet = 0;
    std::string cpus;      /* arch/vendor/model of each CPU node */
    std::string gpu_paths; /* per GPU: its nearest NET and the path type */
    ng_graph_out ring, tree;
};

static ng_rank_out outs[8];
static ng_case cur;
/* Rank 0's system and graphs, kept for the graph files and dumps: NCCL loads NCCL_GRAPH_FILE in
 * ncclTopoCompute, on the system every rank has built (the ranks agree, see ranks_agree). */
static ncclTopoSystem *rank0_sys;
static ncclTopoGraph rank0_graphs[2];

static const char *path_name(int t) {
    return topoPathTypeStr[t];
}

/* The NET with this id, and the path from the GPU of this rank to it. */
static int net_path(ncclTopoSystem *s, int rank, int64_t netId) {
    for (int g = 0; g < s->nodes[GPU].count; g++) {
        if (s->nodes[GPU].nodes[g].gpu.rank != rank) continue;
        for (int n = 0; n < s->nodes[NET].count; n++)
            if (s->nodes[NET].nodes[n].id == netId)
                return s->nodes[GPU].nodes[g].paths[NET][n].type;
    }
    return -1;
}

static void search(ncclTopoSystem *s, int id, int pattern, ng_graph_out *o, ncclTopoGraph &g) {
    memset(&g, 0, sizeof(g));
    g.id = id;
    g.pattern = pattern;
    g.minChannels = 1;
    g.maxChannels = MAXCHANNELS / 2;
    ncclResult_t rc = ncclTopoCompute(s, &g);
    if (rc != ncclSuccess) {
        o->nChannels = -1;
        o->why = "ncclTopoCompute failed";
        return;
    }
    o->nChannels = g.nChannels;
    /* NCCL's own values after the search or the load: a graph file sets both, and the search
     * may change the pattern it was asked for (BALANCED_TREE falls back to TREE). */
    o->pattern = g.pattern;
    o->crossNic = g.crossNic;
    o->latencyInter = g.latencyInter;
    o->bwIntra = g.bwIntra;
    o->bwInter = g.bwInter;
    o->typeIntra = g.typeIntra;
    o->typeInter = g.typeInter;
    o->sameChannels = g.sameChannels;
    int ngpus = s->nodes[GPU].count;
    o->channels.clear();
    for (int c = 0; c < g.nChannels; c++) {
        char b[32];
        snprintf(b, sizeof(b), "%s%ld", c ? " | " : "", (long)g.inter[c * 2]);
        o->channels += b;
        for (int i = 0; i < ngpus; i++)
            o->channels += " " + std::to_string(g.intra[c * ngpus + i]);
        o->channels += " " + std::to_string((long)g.inter[c * 2 + 1]);
    }
    if (s->nodes[NET].count == 0) return;
    for (int c = 0; c < g.nChannels && o->why.empty(); c++) {
        /* ncclTopoGetNetDev: the channel's first GPU uses inter[0], every other GPU with network
         * traffic inter[1]. That other GPU follows the graph's own pattern (a loaded file's, not
         * the one asked for): a ring's last; a balanced or split tree's second, which holds a
         * child (connect.cc); a plain tree has none, and its first GPU is checked against both. */
        int first = g.intra[c * ngpus], other = first;
        if (g.pattern == NCCL_TOPO_PATTERN_RING)
            other = g.intra[c * ngpus + ngpus - 1];
        else if (g.pattern == NCCL_TOPO_PATTERN_BALANCED_TREE ||
                 g.pattern == NCCL_TOPO_PATTERN_SPLIT_TREE)
            other = g.intra[c * ngpus + 1];
        int tIn = net_path(s, first, g.inter[c * 2]);
        int tOut = net_path(s, other, g.inter[c * 2 + 1]);
        if (tIn != PATH_PIX || tOut != PATH_PIX) {
            char b[160];
            snprintf(b, sizeof(b),
                     "channel %d: NET %ld from rank %d is %s, NET %ld from rank %d is %s", c,
                     (long)g.inter[c * 2], first, tIn >= 0 ? path_name(tIn) : "?",
                     (long)g.inter[c * 2 + 1], other, tOut >= 0 ? path_name(tOut) : "?");
            o->why = b;
        }
    }
}

static void *rank_main(void *arg) {
    int rank = (int)(intptr_t)arg;
    t_rank = rank;
    ng_rank_out *o = &outs[rank];
    int nranks = local_ranks * cur.nodes;
    static ncclNet_t net;
    /* NCCL before 2.30 caches a plugin's device count per process, by plugin name, in at most
     * NCCL_NET_MAX_PLUGINS (16) slots: each tree is a new "process" with a name of its own;
     * the runs on one tree share it (same NICs). */
    static char name[32];
    snprintf(name, sizeof(name), "erdma-%d", tree_serial);
    net.name = name;
    net.devices = net_devices;
    net.getProperties = net_properties;
#if NCCL_VERSION_CODE >= 22400
    net.makeVDevice = net_make_vdevice;
#endif

    ncclComm *comm = (ncclComm *)calloc(1, sizeof(ncclComm));
    comm->rank = rank + local_ranks * run_node;
    comm->nRanks = nranks;
    comm->peerInfo = (ncclPeerInfo *)calloc(nranks, sizeof(ncclPeerInfo));
    comm->sharedRes = (ncclSharedResources *)calloc(1, sizeof(ncclSharedResources));
    comm->ncclNet = &net;
#if NCCL_VERSION_CODE >= 22200
    comm->ncclNetVer = 12;
#endif
    for (int r = 0; r < nranks; r++) {
        ncclPeerInfo *p = &comm->peerInfo[r];
        p->rank = r;
        p->cudaDev = p->nvmlDev = r % local_ranks;
        p->gdrSupport = 1; /* the GPU side; whether the NIC can is the plugin's answer */
        p->hostHash = node_hash + r / local_ranks;
        p->pidHash = 1000 + r;
        busIdToInt64(W.gpus[r % local_ranks].busid.c_str(), &p->busId);
        p->cudaCompCap = 90;
#if NCCL_VERSION_CODE >= 23000
        p->mloPart = -1;
#endif
    }
    ncclTopoSystem *s = NULL;
#define STEP(name, call)                                                                           \
    do {                                                                                           \
        o->step = name;                                                                            \
        if ((o->rc = (call)) != ncclSuccess) return NULL;                                          \
    } while (0)
#if NCCL_VERSION_CODE >= 22200
    STEP("ncclTopoGetSystem", ncclTopoGetSystem(comm, &s, NULL));
#else
    STEP("ncclTopoGetSystem", ncclTopoGetSystem(comm, &s));
#endif
    comm->topo = s;
    STEP("ncclTopoComputePaths", ncclTopoComputePaths(s, comm));
    STEP("ncclTopoTrimSystem", ncclTopoTrimSystem(s, comm));
    STEP("ncclTopoComputePaths", ncclTopoComputePaths(s, comm));
    STEP("ncclTopoSearchInit", ncclTopoSearchInit(s));
    o->step = "";
    o->ncpu = s->nodes[CPU].count;
    o->npci = s->nodes[PCI].count;
    o->ngpu = s->nodes[GPU].count;
    o->nnet = s->nodes[NET].count;
    for (int i = 0; i < s->nodes[CPU].count; i++) {
        ncclTopoNode *c = &s->nodes[CPU].nodes[i];
        char b[64];
        snprintf(b, sizeof(b), "%sarch%d/vendor%d/model%d", i ? " " : "", c->cpu.arch,
                 c->cpu.vendor, c->cpu.model);
        o->cpus += b;
    }
    for (int g = 0; g < s->nodes[GPU].count; g++) {
        ncclTopoNode *gpu = &s->nodes[GPU].nodes[g];
        int best = -1;
        for (int n = 0; n < s->nodes[NET].count; n++)
            if (best < 0 || gpu->paths[NET][n].type < gpu->paths[NET][best].type) best = n;
        char b[64];
        if (best >= 0)
            snprintf(b, sizeof(b), "%sgpu%d-net%ld:%s", g ? " " : "", gpu->gpu.dev,
                     (long)s->nodes[NET].nodes[best].id, path_name(gpu->paths[NET][best].type));
        else
            snprintf(b, sizeof(b), "%sgpu%d", g ? " " : "", gpu->gpu.dev);
        o->gpu_paths += b;
    }
    static thread_local ncclTopoGraph g[2];
    ncclTopoGraph *keep = rank == 0 ? rank0_graphs : g;
    search(s, 0, NCCL_TOPO_PATTERN_RING, &o->ring, keep[0]);
    search(s, 1, NCCL_TOPO_PATTERN_BALANCED_TREE, &o->tree, keep[1]);
    if (rank == 0)
        rank0_sys = s;
    else
        ncclTopoFree(s);
    free(comm->peerInfo);
    free(comm->sharedRes);
    free(comm);
    return NULL;
}

/* Runs the node's 8 ranks; 0 when every rank got through init's topology steps. */
static int run_ranks(void) {
    W.warns.clear();
    if (rank0_sys) ncclTopoFree(rank0_sys);
    rank0_sys = NULL;
    pthread_barrier_init(&W.barrier, NULL, local_ranks);
    W.gather.assign(local_ranks * xmlMemSize(NCCL_TOPO_XML_MAX_NODES), 0);
    pthread_t t[8];
    for (int r = 0; r < local_ranks; r++) {
        outs[r] = ng_rank_out();
        pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r);
    }
    for (int r = 0; r < local_ranks; r++)
        pthread_join(t[r], NULL);
    pthread_barrier_destroy(&W.barrier);
    int failed = 0;
    for (int r = 0; r < local_ranks; r++)
        failed += outs[r].rc != ncclSuccess;
    return failed;
}

/* ---------- cases and checks ---------- */

static int failures = 0;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "  FAIL: ");
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    failures++;
}

static void print_graph(const char *what, const ng_graph_out &g) {
    printf("  %s: pattern %d crossnic %d, %d channels x %.1f/%.1f GB/s (intra/inter), "
           "latencyinter %.1f, typeIntra=%s typeInter=%s samechannels=%d%s%s\n",
           what, g.pattern, g.crossNic, g.nChannels, g.bwIntra, g.bwInter, g.latencyInter,
           g.nChannels >= 0 ? path_name(g.typeIntra) : "-",
           g.nChannels >= 0 ? path_name(g.typeInter) : "-", g.sameChannels,
           g.why.empty() ? "" : "; ", g.why.c_str());
}

/* Every rank must have computed the same system and graphs. */
static bool ranks_agree(void) {
    for (int r = 1; r < local_ranks; r++)
        if (outs[r].cpus != outs[0].cpus || outs[r].gpu_paths != outs[0].gpu_paths ||
            !same_graph(outs[r].ring, outs[0].ring) || !same_graph(outs[r].tree, outs[0].tree))
            return false;
    return true;
}

/* What NCCL computes on a tree: the figures printed above, as NCCL 2.30's model gives them. */
struct ng_expect {
    const char *near; /* each GPU's path to the NIC behind its own switch: PIX, PHB */
    int ring_ch, tree_ch;
    float bw;          /* per channel, ring and tree alike */
    bool pix_channels; /* every channel enters and leaves through a PIX-near NIC */
};

/* ---------- graph files ---------- */

static struct {
    const char *old_graph; /* the graph shipped before issue 12: refused on every negative tree */
    const char *tool;      /* nccl-erdma-topo: the plugin's graph selection */
    const char *topo_dir;  /* the shipped graphs it selects from */
    const char *dump_dir;  /* where to write NCCL's own graphs of the family trees */
} opt;
static int old_accepted_negative, selected;

/* NCCL_GRAPH_FILE=file on rank 0's system: NCCL's ncclTopoCompute loads it. "" when NCCL
 * loaded it, else NCCL's failure. */
static std::string load_graph(const char *file, ng_graph_out out[2]) {
    ncclTopoGraph g[2];
    W.warns.clear();
    setenv("NCCL_GRAPH_FILE", file, 1);
    out[0] = out[1] = ng_graph_out();
    search(rank0_sys, 0, NCCL_TOPO_PATTERN_RING, &out[0], g[0]);
    search(rank0_sys, 1, NCCL_TOPO_PATTERN_BALANCED_TREE, &out[1], g[1]);
    unsetenv("NCCL_GRAPH_FILE");
    if (out[0].nChannels >= 0 && out[1].nChannels >= 0) return "";
    return std::string("NCCL fails in ncclTopoCompute: ") +
           (W.warns.empty() ? "(no WARN)" : W.warns[0]);
}

/* The old graph: NCCL uses a loaded graph as it is, so it is only acceptable on a tree where it
 * loads, every channel's NICs are PIX-near its GPUs, and it claims no more than NCCL's own
 * search gives (channels x bandwidth). */
static void check_old_graph(const ng_case &c, bool negative) {
    ng_graph_out f[2];
    std::string why = load_graph(opt.old_graph, f);
    const ng_graph_out *b[] = {&outs[0].ring, &outs[0].tree};
    for (int i = 0; i < 2 && why.empty(); i++) {
        char m[200];
        print_graph(i ? "old graph's tree" : "old graph's ring", f[i]);
        if (c.nodes > 1 && !f[i].why.empty()) {
            why = f[i].why;
        } else if (f[i].nChannels * f[i].bwInter > b[i]->nChannels * b[i]->bwInter) {
            snprintf(m, sizeof(m), "%s claims %d x %.1f GB/s, NCCL's model gives %d x %.1f",
                     i ? "tree" : "ring", f[i].nChannels, f[i].bwInter, b[i]->nChannels,
                     b[i]->bwInter);
            why = m;
        }
    }
    printf("  old graph: %s%s\n", why.empty() ? "acceptable" : "refused: ", why.c_str());
    old_accepted_negative += why.empty() && negative;
}

/* What the plugin's NCCL_ERDMA_TOPO=graph would set on this tree, as the plugin sees it (its
 * device order and GPU Direct answer): the file, or "" with the reason in why. */
static std::string plugin_selects(std::string &why) {
    std::string cmd = std::string(opt.tool) + " --sysfs-root '" + W.root + "' select --topo-dir '" +
                      opt.topo_dir + "' --gdr " + (W.gdr ? "1" : "0") +
                      /* the ncclNet version this NCCL loads: v8 up to 2.23, v9 from 2.24 */
                      (NCCL_VERSION_CODE >= 22400 ? " --nccl-net 9" : " --nccl-net 8") + " --nics ";
    for (size_t i = 0; i < W.nics.size(); i++)
        cmd += (i ? "," : "") + W.nics[i].name;
    cmd += " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) {
        why = "cannot run " + cmd;
        return "";
    }
    char line[1024];
    std::string text;
    while (fgets(line, sizeof(line), p))
        text += line;
    int st = pclose(p);
    while (!text.empty() && text.back() == '\n')
        text.pop_back();
    if (st == 0) return text;
    why = WIFEXITED(st) && WEXITSTATUS(st) == 1 ? text : "tool failed: " + text;
    return "";
}

static const char *const cpu_names[] = {"intel-spr", "intel-erp", "amd"};

/* The shipped graph the plugin selects: never on a negative tree; on every family tree of two
 * nodes the one for its CPU, which NCCL loads and which equals NCCL's own search. */
static void check_selection(const ng_case &c, bool negative) {
    std::string why, file = plugin_selects(why);
    /* No graph for AMD (NCCL's own search there leaves through the far NIC), nor where NCCL loads
     * ncclNet v8, up to 2.23 (2.21's model gives these Intel CPUs 6 GB/s). */
    bool expected = !negative && c.cpu != CPU_AMD && NCCL_VERSION_CODE >= 22400;
    if (file.empty()) {
        printf("  graph selection: none (%s)\n", why.c_str());
        if (expected) fail("the plugin selects no graph on an Intel family tree: %s", why.c_str());
        if (!expected && why.compare(0, 8, "refused:")) fail("selection failed: %s", why.c_str());
        return;
    }
    printf("  graph selection: %s\n", file.c_str());
    selected++;
    if (!expected) fail("the plugin selects %s on a negative or AMD tree", file.c_str());
    std::string want = std::string("graph-") + cpu_names[c.cpu] + ".xml";
    if (file.size() < want.size() || file.compare(file.size() - want.size(), want.size(), want))
        fail("expected %s for this CPU", want.c_str());
    /* Every node of the job loads the same file: node 1's ranks (8-15) too. */
    for (run_node = 0; run_node < c.nodes; run_node++) {
        if (run_node > 0 && run_ranks()) {
            fail("node %d: NCCL fails in %s", run_node, outs[0].step);
            break;
        }
        ng_graph_out f[2];
        std::string err = load_graph(file.c_str(), f);
        if (!err.empty()) {
            fail("node %d: NCCL rejects the selected graph: %s", run_node, err.c_str());
            continue;
        }
        const ng_graph_out *b[] = {&outs[0].ring, &outs[0].tree};
        int differ = 0;
        for (int i = 0; i < 2; i++) {
            if (same_graph(f[i], *b[i])) continue;
            differ++;
            print_graph(i ? "tree from file" : "ring from file", f[i]);
            print_graph(i ? "tree NCCL searched" : "ring NCCL searched", *b[i]);
            /* One node: NCCL's own search differs (the ring closes inside the node); NCCL
             * loads the file and uses its figures. topo/README.md says so: the graphs are for
             * jobs of two nodes or more. */
            if (c.nodes > 1)
                fail("node %d: %s from the selected graph differs from NCCL's own search", run_node,
                     i ? "tree" : "ring");
            else
                printf("  (one node: NCCL's own search differs, as topo/README.md says)\n");
        }
        if (!differ) printf("  node %d: the selected graph equals NCCL's own search\n", run_node);
    }
    run_node = 0;
}

static void dump_graphs(const ng_case &c) {
    std::string file = std::string(opt.dump_dir) + "/graph-" + cpu_names[c.cpu] + ".xml";
    ncclTopoGraph *g[2] = {&rank0_graphs[0], &rank0_graphs[1]};
    setenv("NCCL_GRAPH_DUMP_FILE", file.c_str(), 1);
    if (ncclTopoDumpGraphs(rank0_sys, 2, g) != ncclSuccess) fail("cannot dump %s", file.c_str());
    unsetenv("NCCL_GRAPH_DUMP_FILE");
    printf("  NCCL's graphs written to %s\n", file.c_str());
}

/* nccl-erdma-topo generate on this tree, then NCCL_TOPO_FILE=that file: NCCL must build the
 * same system (CPUs and their attributes, PCI switches, GPUs, NETs, each GPU's nearest NIC and
 * path) and the same ring and tree as from sysfs alone, on every rank. */
static void check_generated(void) {
    ng_rank_out base = outs[0];
    std::string file = W.root + "/generated-topo.xml";
    std::string cmd = std::string(opt.tool) + " --sysfs-root '" + W.root +
                      "' generate --name ebmgn9g -o '" + file + "' 2>&1";
    if (system(cmd.c_str()) != 0) {
        fail("%s failed", cmd.c_str());
        return;
    }
    setenv("NCCL_TOPO_FILE", file.c_str(), 1);
    int failed = run_ranks();
    unsetenv("NCCL_TOPO_FILE");
    const ng_rank_out &o = outs[0];
    if (failed) {
        fail("NCCL_TOPO_FILE=<generated>: %d rank(s) failed in %s: %s", failed, o.step,
             W.warns.empty() ? "(no WARN)" : W.warns[0].c_str());
        return;
    }
    if (o.cpus != base.cpus || o.npci != base.npci || o.ngpu != base.ngpu || o.nnet != base.nnet ||
        o.gpu_paths != base.gpu_paths || !ranks_agree() || !same_graph(o.ring, base.ring) ||
        !same_graph(o.tree, base.tree)) {
        printf("  with the generated file: %d CPU (%s), %d PCI, %d GPU, %d NET\n  paths: %s\n",
               o.ncpu, o.cpus.c_str(), o.npci, o.ngpu, o.nnet, o.gpu_paths.c_str());
        print_graph("ring", o.ring);
        print_graph("tree", o.tree);
        fail("NCCL_TOPO_FILE=<generated> gives NCCL another system or other graphs");
        return;
    }
    printf("  generated topology file: NCCL builds the same system and graphs\n");
}

static void run_case(const ng_case &c, const ng_expect &e, bool negative = false) {
    cur = c;
    build_tree(c);
    printf("case %s\n", c.name);
    int failed = run_ranks();
    if (failed) {
        fail("%d rank(s) failed in %s: %s", failed, outs[0].step,
             W.warns.empty() ? "(no WARN)" : W.warns[0].c_str());
        remove_tree();
        return;
    }
    const ng_rank_out &o = outs[0];
    printf("  system: %d CPU (%s), %d PCI, %d GPU, %d NET\n  paths: %s\n", o.ncpu, o.cpus.c_str(),
           o.npci, o.ngpu, o.nnet, o.gpu_paths.c_str());
    print_graph("ring", o.ring);
    print_graph("tree", o.tree);
    if (!ranks_agree()) fail("the ranks computed different systems or graphs");
        /* One CPU per socket, each with the attributes of the node's CPU (none bare). */
#if NCCL_VERSION_CODE >= 22200
    static const char *const cpu_want[] = {"arch1/vendor1/model3", "arch1/vendor1/model4",
                                           "arch1/vendor2/model-1"};
#else /* 2.21 knows no Intel model after Skylake */
    static const char *const cpu_want[] = {"arch1/vendor1/model2", "arch1/vendor1/model2",
                                           "arch1/vendor2/model-1"};
#endif
    std::string cpus = std::string(cpu_want[c.cpu]) + " " + cpu_want[c.cpu];
    if (o.cpus != cpus) fail("CPUs: expected %s", cpus.c_str());
    /* Both switches, as PCI nodes; all GPUs; every NIC the plugin lists. */
    /* A job on one node needs no NIC: NCCL before 2.30 trims them away, 2.30 keeps them. */
    int nets = c.nodes > 1 || NCCL_VERSION_CODE >= 23000 ? c.nics : 0;
    if (o.npci != 2 || o.ngpu != 8 || o.nnet != nets)
        fail("expected 2 PCI switches, 8 GPUs and %d NETs", nets);
    for (int g = 0; g < 8; g++) {
        bool socket0 = W.gpus[g].path.compare(0, 10, W.gpus[0].path.substr(0, 10)) == 0;
        int local = -1;
        for (size_t n = 0; n < W.nics.size(); n++)
            if (W.nics[n].name == (socket0 ? "erdma_0" : "erdma_1")) local = (int)n;
        if (local < 0 || nets == 0) continue; /* its NIC is not in use */
        char want[64], key[16];
        snprintf(want, sizeof(want), "gpu%d-net%d:%s", g, local, e.near);
        snprintf(key, sizeof(key), "gpu%d-", g);
        size_t at = o.gpu_paths.find(key);
        std::string got = at == std::string::npos ? "" : o.gpu_paths.substr(at);
        got = got.substr(0, got.find(' '));
        if (got != want) fail("GPU %d: expected %s, NCCL has %s", g, want, got.c_str());
    }
    if (o.ring.nChannels != e.ring_ch || o.tree.nChannels != e.tree_ch || o.ring.bwInter != e.bw ||
        o.tree.bwInter != e.bw)
        fail("expected ring %d x %.1f and tree %d x %.1f GB/s", e.ring_ch, e.bw, e.tree_ch, e.bw);
    /* Channels' NICs only matter when the job spans nodes. */
    bool pix = o.ring.why.empty() && o.tree.why.empty();
    if (c.nodes > 1 && pix != e.pix_channels)
        fail(e.pix_channels ? "a channel's NIC is not PIX-near its GPUs"
                            : "expected a channel whose NIC is not PIX-near its GPUs");
    /* The old graph on the negative trees, and on one family tree for its figures: each graph
     * file NCCL 2.30 loads costs ~0.9 GB of zeroed memory (NCCL_GRAPH_XML_MAX_NODES). */
    if (opt.old_graph && (negative || !strcmp(c.name, "intel-spr, 2 nodes")))
        check_old_graph(c, negative);
    if (opt.dump_dir && !negative && c.nodes > 1 && c.hb[0] == 0x16) dump_graphs(c);
    if (opt.tool && !negative) check_generated();
    if (opt.tool) check_selection(c, negative);
    remove_tree();
}

/* NCCL_GRAPH_FILE applies to every communicator of the process: one over GPUs 0-3 of each node
 * (a tensor-parallel group) gets the graph of all 8, whose channels name GPUs it does not have.
 * NCCL must reject it there; topo/README.md gives this as why the graphs are opt-in. */
static void check_subcomm_graph(void) {
    ng_case c = {"intel-spr, 2 nodes, a communicator of GPUs 0-3 of each node",
                 CPU_INTEL_SPR,
                 {0x16, 0x96},
                 true,
                 false,
                 2,
                 2};
    cur = c;
    build_tree(c);
    local_ranks = 4;
    printf("case %s\n", c.name);
    int failed = run_ranks();
    if (failed) {
        fail("%d rank(s) failed in %s: %s", failed, outs[0].step,
             W.warns.empty() ? "(no WARN)" : W.warns[0].c_str());
    } else {
        const ng_rank_out &o = outs[0];
        printf("  system: %d GPU, %d NET\n", o.ngpu, o.nnet);
        print_graph("ring", o.ring);
        print_graph("tree", o.tree);
        std::string file = std::string(opt.topo_dir) + "/graph-intel-spr.xml";
        ng_graph_out f[2];
        std::string err = load_graph(file.c_str(), f);
        printf("  graph-intel-spr.xml: %s\n", err.empty() ? "loaded" : err.c_str());
        if (o.ngpu != 4) fail("expected 4 GPUs in the communicator's system");
        if (err.empty()) fail("NCCL loaded an 8-GPU graph into a 4-GPU communicator");
    }
    local_ranks = 8;
    remove_tree();
}

/* NCCL_TOPO_FILE=FILE on the Intel family tree: 0 and NCCL's WARN when NCCL's init fails. */
static int topo_file_fails(const char *file) {
    ng_case c = {
        "intel-spr, 2 nodes, NCCL_TOPO_FILE", CPU_INTEL_SPR, {0x16, 0x96}, true, false, 2, 2};
    cur = c;
    build_tree(c);
    setenv("NCCL_TOPO_FILE", file, 1);
    int failed = run_ranks();
    unsetenv("NCCL_TOPO_FILE");
    remove_tree();
    printf("case %s=%s: %d rank(s) failed%s%s%s\n", c.name, file, failed, failed ? " in " : "",
           failed ? outs[0].step : "", failed ? "" : " (NCCL accepted it)");
    if (failed) printf("  NCCL: %s\n", W.warns.empty() ? "(no WARN)" : W.warns[0].c_str());
    return failed == 8 ? 0 : 1;
}

static int usage(const char *argv0) {
    fprintf(
        stderr,
        "usage: %s [--old-graph GRAPH.xml] [--old-topo TOPO.xml] [--select TOOL TOPO_DIR] "
        "[--dump DIR]\n"
        "  --old-graph: NCCL's code must refuse GRAPH.xml on every negative tree\n"
        "  --old-topo:  NCCL's init must fail with NCCL_TOPO_FILE=TOPO.xml\n"
        "  --select:    the graph `TOOL select` picks (NCCL_ERDMA_TOPO=graph) must be NCCL's own\n"
        "               result on the family trees and must be refused on the negative ones\n"
        "  --dump:      writes NCCL's ring and tree of each CPU's family tree to DIR\n",
        argv0);
    return 2;
}

int main(int argc, char **argv) {
    const char *old_topo = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--old-graph") && i + 1 < argc)
            opt.old_graph = argv[++i];
        else if (!strcmp(argv[i], "--old-topo") && i + 1 < argc)
            old_topo = argv[++i];
        else if (!strcmp(argv[i], "--select") && i + 2 < argc) {
            opt.tool = argv[++i];
            opt.topo_dir = argv[++i];
        } else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            opt.dump_dir = argv[++i];
        else
            return usage(argv[0]);
    }
    /* clang-format off */
    static const ng_case family[] = {
        {"intel-spr, 2 nodes", CPU_INTEL_SPR, {0x16, 0x96}, true, false, 2, 2},
        {"intel-erp, 2 nodes", CPU_INTEL_ERP, {0x16, 0x96}, true, false, 2, 2},
        {"amd, 2 nodes", CPU_AMD, {0x16, 0x96}, true, false, 2, 2},
        {"intel-spr, other bus numbers", CPU_INTEL_SPR, {0x36, 0xb6}, true, false, 2, 2},
        {"amd, other bus numbers", CPU_AMD, {0x00, 0x80}, true, false, 2, 2},
        {"intel-spr, 1 node", CPU_INTEL_SPR, {0x16, 0x96}, true, false, 2, 1},
        {"amd, 1 node", CPU_AMD, {0x16, 0x96}, true, false, 2, 1},
    };
    /* clang-format on */
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("NCCL %d.%d.%d graph code on fake ebmgn9g-family sysfs trees\n", NCCL_MAJOR, NCCL_MINOR,
           NCCL_PATCH);
    if (ng_verbose()) ncclDebugLevel = NCCL_LOG_INFO;
    unsetenv("NCCL_TOPO_FILE");
    unsetenv("NCCL_GRAPH_FILE");
    for (const ng_case &c : family) {
        /* NCCL's model: the socket link (Intel SPR 22, ERP 40 capped by the 24 GB/s PCIe path)
         * or AMD's 16 limits a ring that crosses sockets; on AMD NCCL itself takes one channel
         * whose ring leaves through the far NIC. One node: bandwidth is split over more channels.
         */
#if NCCL_VERSION_CODE >= 22200
        ng_expect e = c.cpu == CPU_AMD         ? ng_expect{"PIX", 1, 1, 15.0f, false}
                      : c.nodes == 1           ? ng_expect{"PIX", 2, 4, 11.0f, true}
                      : c.cpu == CPU_INTEL_ERP ? ng_expect{"PIX", 2, 2, 24.0f, true}
                                               : ng_expect{"PIX", 2, 2, 22.0f, true};
#else /* 2.21 models every recent Intel socket link as Skylake's */
        ng_expect e = c.cpu == CPU_AMD ? ng_expect{"PIX", 1, 1, 15.0f, false}
                      : c.nodes == 1   ? ng_expect{"PIX", 3, 6, 3.0f, true}
                                       : ng_expect{"PIX", 2, 2, 6.0f, true};
#endif
        run_case(c, e);
    }
    /* Negative trees: NCCL copes with each (its own detection); a preset graph would not. */
#if NCCL_VERSION_CODE >= 22200
    const float intel = 22.0f, one_nic = 22.0f, no_gdr = 15.0f;
    const int one_nic_ch = 1;
#else
    const float intel = 6.0f, one_nic = 2.4f, no_gdr = 6.0f;
    const int one_nic_ch = 4;
#endif
    run_case({"gpu direct off", CPU_INTEL_SPR, {0x16, 0x96}, false, false, 2, 2},
             {"PHB", 2, 2, no_gdr, false}, true);
    run_case({"nics in the other order", CPU_INTEL_SPR, {0x16, 0x96}, true, true, 2, 2},
             {"PIX", 2, 2, intel, true}, true);
    run_case({"one nic", CPU_INTEL_SPR, {0x16, 0x96}, true, false, 1, 2},
             {"PIX", one_nic_ch, one_nic_ch, one_nic, false}, true);
    if (opt.old_graph && old_accepted_negative)
        fail("%s was acceptable on %d negative tree(s)", opt.old_graph, old_accepted_negative);
    /* The Intel family trees of 2 nodes (3) and of 1 node (1) select a graph (ncclNet v9: 2.24+).
     */
    const int want_selected = NCCL_VERSION_CODE >= 22400 ? 4 : 0;
    if (opt.tool && selected != want_selected)
        fail("graphs selected on %d trees, expected %d", selected, want_selected);
    if (opt.tool) check_subcomm_graph();
    if (old_topo && topo_file_fails(old_topo)) fail("NCCL accepted %s", old_topo);
    if (rank0_sys) ncclTopoFree(rank0_sys);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
