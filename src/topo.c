/*
 * Owns the node's topology as NCCL sees it: the sysfs scan (GPUs, eRDMA NICs,
 * their PCI placement), generation of NCCL topology XML, and the init-time
 * choice of the shipped files. The checks of topology and graph XMLs live in
 * topo_check.c, the XML syntax in topo_xml.c, the plugin's device table in
 * device.c.
 *
 * Placement follows NCCL's own sysfs walk (ncclTopoGetXmlFromSys): from a
 * PCI function it skips one bridge level (the switch downstream port) and
 * attaches to the next one up, until the parent is no longer a PCI function,
 * where the CPU (NUMA node) takes over. Two files that place devices the same
 * way give NCCL the same tree.
 */
#define _GNU_SOURCE
#include "topo.h"
#include "device.h"
#include "log.h"
#include "params.h"
#include "sysfs.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef ERDMA_TOPO_DIR
#define ERDMA_TOPO_DIR "/usr/local/share/nccl-net-erdma/topo"
#endif

#define NVIDIA_VENDOR 0x10de

const char *const topo_families[] = {"ebmgn9g", "ebmgn9gc", "ebmgn9ge", NULL};

/* ---------- sysfs scan ---------- */

bool topo_is_busid(const char *s) {
    static const char pat[] = "xxxx:xx:xx.x";
    if (strlen(s) != sizeof(pat) - 1) return false;
    for (size_t i = 0; pat[i]; i++) {
        if (pat[i] == 'x' ? !isxdigit((unsigned char)s[i]) : s[i] != pat[i]) return false;
    }
    return true;
}

/* Fills chain/depth from the realpath of the function's sysfs directory. */
static int fill_chain(struct topo_dev *d, const char *realpath_rel) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s", realpath_rel);
    char *parts[64];
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(path, "/", &save); tok && n < 64;
         tok = strtok_r(NULL, "/", &save))
        parts[n++] = tok;
    int first = n;
    while (first > 0 && topo_is_busid(parts[first - 1]))
        first--;
    d->depth = n - first;
    if (d->depth == 0) return -ENOENT;
    if (d->depth > TOPO_MAX_DEPTH) return -E2BIG;
    for (int i = 0; i < d->depth; i++)
        snprintf(d->chain[i], sizeof(d->chain[i]), "%s", parts[first + i]);
    memcpy(d->busid, d->chain[d->depth - 1], sizeof(d->busid));
    return 0;
}

/* The chain positions NCCL keeps: the device, then every second bridge up. */
static int nccl_levels(const struct topo_dev *d, int *idx) {
    int n = 0;
    for (int i = d->depth - 1; i >= 0; i -= 2)
        idx[n++] = i;
    /* top first */
    for (int a = 0, b = n - 1; a < b; a++, b--) {
        int t = idx[a];
        idx[a] = idx[b];
        idx[b] = t;
    }
    return n;
}

static int read_numa(const char *busid) {
    long v;
    if (sysfs_read_long(&v, "/sys/bus/pci/devices/%s/numa_node", busid)) return -1;
    return (int)v;
}

static int fill_dev(struct topo_dev *d, const char *rp) {
    int rc = fill_chain(d, rp);
    if (rc) return rc;
    int idx[TOPO_MAX_DEPTH];
    nccl_levels(d, idx);
    d->numa = read_numa(d->chain[idx[0]]);
    return 0;
}

static DIR *open_sysfs_dir(const char *rel) {
    char path[PATH_MAX];
    const char *root = sysfs_root();
    snprintf(path, sizeof(path), "%s%s", strcmp(root, "/") ? root : "", rel);
    return opendir(path);
}

static int cmp_busid(const void *a, const void *b) {
    return strcmp(((const struct topo_dev *)a)->busid, ((const struct topo_dev *)b)->busid);
}

static int scan_gpus(struct topo_node *node) {
    DIR *dir = open_sysfs_dir("/sys/bus/pci/devices");
    if (!dir) return errno == ENOENT ? 0 : -errno;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(dir))) {
        long vendor, cls;
        char rp[PATH_MAX];
        if (!topo_is_busid(de->d_name)) continue;
        if (sysfs_read_long(&vendor, "/sys/bus/pci/devices/%s/vendor", de->d_name) ||
            sysfs_read_long(&cls, "/sys/bus/pci/devices/%s/class", de->d_name))
            continue;
        /* Display controllers only: NVIDIA bridges and audio functions are not GPUs. */
        if (vendor != NVIDIA_VENDOR || (cls >> 16) != 0x03) continue;
        if (node->ngpus == TOPO_MAX_GPUS) {
            rc = -E2BIG;
            break;
        }
        struct topo_dev *d = &node->gpus[node->ngpus];
        memset(d, 0, sizeof(*d));
        if (sysfs_realpath(rp, sizeof(rp), "/sys/bus/pci/devices/%s", de->d_name) ||
            fill_dev(d, rp))
            continue;
        node->ngpus++;
    }
    closedir(dir);
    qsort(node->gpus, (size_t)node->ngpus, sizeof(node->gpus[0]), cmp_busid);
    return rc;
}

static bool is_erdma(const char *ibdev) {
    char drv[PATH_MAX];
    if (!sysfs_realpath(drv, sizeof(drv), "/sys/class/infiniband/%s/device/driver", ibdev)) {
        const char *base = strrchr(drv, '/');
        return base && !strcmp(base + 1, "erdma");
    }
    return !strncmp(ibdev, "erdma", 5);
}

static int scan_nics(struct topo_node *node) {
    DIR *dir = open_sysfs_dir("/sys/class/infiniband");
    if (!dir) return errno == ENOENT ? 0 : -errno;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(dir))) {
        char rp[PATH_MAX];
        if (de->d_name[0] == '.') continue;
        if (!is_erdma(de->d_name)) {
            size_t used = strlen(node->other);
            snprintf(node->other + used, sizeof(node->other) - used, "%s%s", used ? ", " : "",
                     de->d_name);
            node->nother++;
            continue;
        }
        if (node->nnics == TOPO_MAX_NICS) {
            rc = -E2BIG;
            break;
        }
        struct topo_dev *d = &node->nics[node->nnics];
        memset(d, 0, sizeof(*d));
        if (strlen(de->d_name) >= sizeof(d->name)) continue;
        memcpy(d->name, de->d_name, strlen(de->d_name) + 1);
        /* A NIC without a PCI function (a soft device) cannot be placed. */
        if (sysfs_realpath(rp, sizeof(rp), "/sys/class/infiniband/%s/device", de->d_name) ||
            fill_dev(d, rp))
            continue;
        node->nnics++;
    }
    closedir(dir);
    /* The plugin's order (NCCL_IB_DEVICE_PCI_ORDER=1, device.c): by bus ID. */
    qsort(node->nics, (size_t)node->nnics, sizeof(node->nics[0]), cmp_busid);
    return rc;
}

int topo_scan(struct topo_node *node) {
    memset(node, 0, sizeof(*node));
    int rc = scan_gpus(node);
    if (!rc) rc = scan_nics(node);
    return rc;
}

bool topo_node_has_family_shape(const struct topo_node *node, char *why, size_t len) {
    if (node->ngpus == TOPO_FAMILY_GPUS && node->nnics == TOPO_FAMILY_NICS) return true;
    if (node->ngpus == 0)
        snprintf(why, len, "no NVIDIA GPUs under %s/sys/bus/pci/devices",
                 strcmp(sysfs_root(), "/") ? sysfs_root() : "");
    else if (node->nnics == 0 && node->nother)
        snprintf(why, len, "%d NVIDIA GPUs but no eRDMA NIC (RDMA devices: %s)", node->ngpus,
                 node->other);
    else
        snprintf(why, len, "%d NVIDIA GPUs and %d eRDMA NICs (the ebmgn9g family has %d and %d)",
                 node->ngpus, node->nnics, TOPO_FAMILY_GPUS, TOPO_FAMILY_NICS);
    return false;
}

const char *topo_family_from_instance(const char *type) {
    if (!type) return NULL;
    if (!strncmp(type, "ecs.", 4)) type += 4;
    size_t n = strcspn(type, ".");
    for (int i = 0; topo_families[i]; i++)
        if (strlen(topo_families[i]) == n && !strncasecmp(type, topo_families[i], n))
            return topo_families[i];
    return NULL;
}

/* ---------- generation ---------- */

/* Keeps children in NCCL's order: by numaid for CPUs, by bus ID for PCI nodes. */
static void sort_last_child(struct xml_node *parent, const char *key, bool numeric) {
    int i = parent->nsubs - 1;
    struct xml_node *n = parent->subs[i];
    const char *v = xml_get(n, key);
    while (i > 0) {
        const char *pv = xml_get(parent->subs[i - 1], key);
        if (!pv || !v) break;
        int c = numeric ? (atoi(pv) > atoi(v)) - (atoi(pv) < atoi(v)) : strcmp(pv, v);
        if (c <= 0) break;
        parent->subs[i] = parent->subs[i - 1];
        i--;
    }
    parent->subs[i] = n;
}

static struct xml_node *find_child(struct xml_node *parent, const char *name, const char *key,
                                   const char *value) {
    for (int i = 0; i < parent->nsubs; i++) {
        struct xml_node *s = parent->subs[i];
        if (strcmp(s->name, name)) continue;
        const char *v = key ? xml_get(s, key) : NULL;
        if (!key || (v && !strcmp(v, value))) return s;
    }
    return NULL;
}

/* NCCL reports the slower of the function's and its upstream port's link. */
static void link_attrs(char *speed, size_t slen, long *width, const char *busid) {
    char rp[PATH_MAX], dev_s[64] = "", port_s[64] = "";
    long dw = 0, pw = 0;
    speed[0] = 0;
    *width = 0;
    if (sysfs_realpath(rp, sizeof(rp), "/sys/bus/pci/devices/%s", busid)) return;
    sysfs_read(dev_s, sizeof(dev_s), "%s/max_link_speed", rp);
    sysfs_read(port_s, sizeof(port_s), "%s/../max_link_speed", rp);
    float ds = FLT_MAX, ps = FLT_MAX;
    sscanf(dev_s, "%f", &ds);
    sscanf(port_s, "%f", &ps);
    snprintf(speed, slen, "%s", ps < ds ? port_s : dev_s);
    sysfs_read_long(&dw, "%s/max_link_width", rp);
    sysfs_read_long(&pw, "%s/../max_link_width", rp);
    *width = dw < pw ? dw : pw;
}

static int fill_pci(struct xml_node *n, const char *busid) {
    static const char *const ids[] = {"class", "vendor", "device", "subsystem_vendor",
                                      "subsystem_device"};
    int rc = xml_set(n, "busid", "%s", busid);
    for (size_t i = 0; !rc && i < sizeof(ids) / sizeof(ids[0]); i++) {
        char v[64];
        if (sysfs_read(v, sizeof(v), "/sys/bus/pci/devices/%s/%s", busid, ids[i])) continue;
        rc = xml_set(n, ids[i], "%s", v);
    }
    char speed[64];
    long width;
    link_attrs(speed, sizeof(speed), &width, busid);
    if (!rc) rc = xml_set(n, "link_speed", "%s", speed);
    if (!rc) rc = xml_set(n, "link_width", "%ld", width);
    return rc;
}

/* "cpu family : 6" -> "6": one field of the first processor in /proc/cpuinfo. */
static bool cpuinfo_field(const char *text, const char *key, char *out, size_t len) {
    size_t klen = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, klen) || (l[klen] != ' ' && l[klen] != '\t')) continue;
        const char *v = strchr(l, ':');
        if (!v || v > strchr(l, '\n')) return false;
        v += 1 + strspn(v + 1, " \t");
        snprintf(out, len, "%.*s", (int)strcspn(v, "\n"), v);
        return true;
    }
    return false;
}

/* The attributes NCCL's ncclTopoAddCpu reads and each rank fills in for its own CPU (since 2.22
 * the ranks' trees fuse only when all of them match): arch, vendor, family and model as
 * cpuid reports them (read from /proc/cpuinfo under the sysfs root), affinity from sysfs. */
static int cpu_attrs(struct xml_node *cpu, int numa) {
    char v[256], text[8192] = "";
    int rc = 0;
#if defined(__x86_64__)
    rc = xml_set(cpu, "arch", "x86_64");
#elif defined(__aarch64__)
    rc = xml_set(cpu, "arch", "arm64");
#elif defined(__PPC__)
    rc = xml_set(cpu, "arch", "ppc64");
#endif
    if (!rc && !sysfs_read(v, sizeof(v), "/sys/devices/system/node/node%d/cpumap", numa))
        rc = xml_set(cpu, "affinity", "%s", v);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/proc/cpuinfo", strcmp(sysfs_root(), "/") ? sysfs_root() : "");
    FILE *f = rc ? NULL : fopen(path, "re");
    if (!f) return rc;
    text[fread(text, 1, sizeof(text) - 1, f)] = 0;
    fclose(f);
    if (cpuinfo_field(text, "vendor_id", v, sizeof(v))) rc = xml_set(cpu, "vendor", "%s", v);
    if (!rc && cpuinfo_field(text, "cpu family", v, sizeof(v)))
        rc = xml_set(cpu, "familyid", "%s", v);
    if (!rc && cpuinfo_field(text, "model", v, sizeof(v))) rc = xml_set(cpu, "modelid", "%s", v);
    return rc;
}

/* The PCI node NCCL would attach the device to, created along the way. */
static int place(struct xml_node *sys, const struct topo_dev *d, struct xml_node **out) {
    char numa[16];
    snprintf(numa, sizeof(numa), "%d", d->numa);
    struct xml_node *parent = find_child(sys, "cpu", "numaid", numa);
    if (!parent) {
        parent = xml_add(sys, "cpu");
        if (!parent || xml_set(parent, "numaid", "%s", numa) || cpu_attrs(parent, d->numa))
            return -ENOMEM;
        sort_last_child(sys, "numaid", true);
    }
    int idx[TOPO_MAX_DEPTH], n = nccl_levels(d, idx);
    for (int i = 0; i < n; i++) {
        const char *busid = d->chain[idx[i]];
        struct xml_node *pci = find_child(parent, "pci", "busid", busid);
        if (!pci) {
            pci = xml_add(parent, "pci");
            if (!pci || fill_pci(pci, busid)) return -ENOMEM;
            sort_last_child(parent, "busid", false);
        }
        parent = pci;
    }
    *out = parent;
    return 0;
}

int topo_generate(const struct topo_node *node, const char *name, struct xml_node **root) {
    struct xml_node *sys = xml_add(NULL, "system"), *pci, *x;
    int rc = sys ? xml_set(sys, "version", "1") : -ENOMEM;
    if (!rc && name) rc = xml_set(sys, "name", "%s", name);
    for (int i = 0; !rc && i < node->ngpus; i++) {
        rc = place(sys, &node->gpus[i], &pci);
        if (rc) break;
        /* dev is NVML's index, which enumerates GPUs in bus ID order. */
        x = xml_add(pci, "gpu");
        rc = x ? xml_set(x, "dev", "%d", i) : -ENOMEM;
    }
    for (int i = 0; !rc && i < node->nnics; i++) {
        rc = place(sys, &node->nics[i], &pci);
        if (rc) break;
        struct xml_node *nic = find_child(pci, "nic", NULL, NULL);
        if (!nic) nic = xml_add(pci, "nic");
        x = nic ? xml_add(nic, "net") : NULL;
        rc = x ? xml_set(x, "name", "%s", node->nics[i].name) : -ENOMEM;
        /* dev is the plugin's device index: devices are listed in bus ID order. */
        if (!rc) rc = xml_set(x, "dev", "%d", i);
    }
    if (rc) {
        xml_free(sys);
        return rc;
    }
    *root = sys;
    return 0;
}

/* ---------- show ---------- */

/* NCCL's path type between two placed functions, from their kept PCI levels. */
static int path_rank(const struct topo_dev *a, const struct topo_dev *b, const char **name) {
    int ia[TOPO_MAX_DEPTH], ib[TOPO_MAX_DEPTH];
    int na = nccl_levels(a, ia), nb = nccl_levels(b, ib), common = 0;
    if (a->numa != b->numa) {
        *name = "SYS";
        return 3;
    }
    while (common < na && common < nb && !strcmp(a->chain[ia[common]], b->chain[ib[common]]))
        common++;
    if (common == 0) {
        *name = "PHB";
        return 2;
    }
    *name = (common == na - 1 && common == nb - 1) ? "PIX" : "PXB";
    return common == na - 1 && common == nb - 1 ? 0 : 1;
}

int topo_show(FILE *out, const struct topo_node *node) {
    for (int g = 0; g < node->ngpus; g++) {
        const struct topo_dev *gpu = &node->gpus[g];
        int best = -1, best_rank = 99;
        const char *best_path = "-";
        for (int n = 0; n < node->nnics; n++) {
            const char *p;
            int r = path_rank(gpu, &node->nics[n], &p);
            if (r < best_rank) {
                best = n;
                best_rank = r;
                best_path = p;
            }
        }
        fprintf(out, "GPU %d %s NUMA %d -> %s (%s)\n", g, gpu->busid, gpu->numa,
                best >= 0 ? node->nics[best].name : "no eRDMA NIC", best_path);
    }
    return ferror(out) ? -EIO : 0;
}

/* ---------- graph selection ---------- */

const char *topo_cpu_kind(char *why, size_t wlen) {
    char path[PATH_MAX], text[8192] = "", vendor[64] = "", fam[16] = "", mod[16] = "";
    snprintf(path, sizeof(path), "%s/proc/cpuinfo", strcmp(sysfs_root(), "/") ? sysfs_root() : "");
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(why, wlen, "cannot read %s", path);
        return NULL;
    }
    text[fread(text, 1, sizeof(text) - 1, f)] = 0;
    fclose(f);
    cpuinfo_field(text, "vendor_id", vendor, sizeof(vendor));
    cpuinfo_field(text, "cpu family", fam, sizeof(fam));
    cpuinfo_field(text, "model", mod, sizeof(mod));
    long family = strtol(fam, NULL, 10), model = strtol(mod, NULL, 10);
    /* NCCL models Intel's socket link by family 6 and model: Sapphire Rapids (0x8f) and
     * Emerald Rapids (0xcf) get different figures, hence a graph each. */
    if (!strcmp(vendor, "AuthenticAMD")) {
        snprintf(why, wlen,
                 "AMD CPU: no graph is shipped (NCCL's own search on the family "
                 "layout sends its one ring out through the far NIC, SYS)");
        return NULL;
    }
    if (!strcmp(vendor, "GenuineIntel") && family == 6 && model == 0x8f) return "intel-spr";
    if (!strcmp(vendor, "GenuineIntel") && family == 6 && model == 0xcf) return "intel-erp";
    snprintf(why, wlen,
             "CPU %s family %ld model 0x%lx has no graph (shipped: Intel Sapphire Rapids, "
             "Emerald Rapids)",
             vendor[0] ? vendor : "?", family, model);
    return NULL;
}

/* GPUs 4n..4n+3 (NVML's order) and NIC n share a PCIe switch, as the graphs' channels assume. */
static bool layout_fits(const struct topo_node *node, char *why, size_t wlen) {
    for (int g = 0; g < node->ngpus; g++) {
        const struct topo_dev *nic = &node->nics[g / 4];
        const char *p;
        if (path_rank(&node->gpus[g], nic, &p) != 0) {
            snprintf(why, wlen, "GPU %d (%s) reaches %s through %s, the graphs assume PIX", g,
                     node->gpus[g].busid, nic->name, p);
            return false;
        }
    }
    return true;
}

static int graph_file_fits(const struct topo_node *node, const char *path, char *why, size_t wlen) {
    struct xml_node *graph = NULL, *topo = NULL;
    struct topo_err e = {0};
    char err[512];
    int rc = xml_load(path, &graph, err, sizeof(err));
    if (rc) {
        snprintf(why, wlen, "%s", err);
        return rc;
    }
    rc = topo_generate(node, NULL, &topo);
    if (!rc) rc = topo_validate_graph(graph, topo, &e);
    if (rc)
        snprintf(why, wlen, "%s does not fit this node: %.*s", path, (int)strcspn(e.text, "\n"),
                 e.count ? e.text : strerror(-rc));
    xml_free(graph);
    xml_free(topo);
    return rc ? -ENOENT : 0;
}

/* The GPUs this process can use, where it can tell (-1: it cannot), and how it knows. A pod
 * given some of the node's GPUs sees all of them in sysfs, but only its own device nodes (and
 * perhaps a CUDA_VISIBLE_DEVICES); NCCL numbers the GPUs it sees 0..n-1, and a graph names the
 * node's. */
static int visible_gpus(int ngpus, char *how, size_t hlen) {
    if (param_is_set(P_CUDA_VISIBLE_DEVICES)) {
        const char *v = param_str(P_CUDA_VISIBLE_DEVICES);
        int n = 0;
        for (const char *p = v; *p; p += strcspn(p, ","), p += *p == ',')
            n += strcspn(p, ",") > 0;
        snprintf(how, hlen, "CUDA_VISIBLE_DEVICES=%s", v);
        if (n < ngpus) return n;
    }
    char dev[PATH_MAX];
    snprintf(dev, sizeof(dev), "%s/dev", sysfs_root());
    DIR *d = opendir(dev);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) { /* nvidia0, nvidia1...: not nvidiactl, -uvm */
        const char *num = e->d_name + 6;
        n += !strncmp(e->d_name, "nvidia", 6) && *num && strspn(num, "0123456789") == strlen(num);
    }
    closedir(d);
    snprintf(how, hlen, "%d /dev/nvidiaN device nodes", n);
    return n ? n : -1;
}

int topo_graph_select(const struct topo_node *node, const struct topo_plugin_view *plugin,
                      const char *dir, char *path, size_t plen, char *why, size_t wlen) {
    if (!topo_node_has_family_shape(node, why, wlen) || !layout_fits(node, why, wlen))
        return -ENOENT;
    char how[256];
    int seen = visible_gpus(node->ngpus, how, sizeof(how));
    if (seen >= 0 && seen < node->ngpus) {
        snprintf(why, wlen,
                 "this process sees %d of the node's %d GPUs (%s): NCCL numbers them from 0, "
                 "the graphs name all %d",
                 seen, node->ngpus, how, node->ngpus);
        return -ENOENT;
    }
    const char *cpu = topo_cpu_kind(why, wlen);
    if (!cpu) return -ENOENT;
    if (plugin->net_version == 8) {
        snprintf(why, wlen,
                 "NCCL loaded ncclNet v8 (NCCL 2.23 or older; v9 came with 2.24): the graphs "
                 "carry the figures of newer releases (2.21's model gives this CPU's socket "
                 "link 6 GB/s)");
        return -ENOENT;
    }
    if (!plugin->gdr) {
        snprintf(why, wlen,
                 "GPU Direct RDMA is off (no peer memory, no dma-buf): NCCL's paths to the "
                 "NICs are PHB, the graphs assume PIX");
        return -ENOENT;
    }
    if (plugin->nnics != node->nnics) {
        snprintf(why, wlen,
                 "the plugin uses %d of the node's %d eRDMA NICs (NCCL_IB_HCA?), the "
                 "graphs use both",
                 plugin->nnics, node->nnics);
        return -ENOENT;
    }
    for (int i = 0; i < plugin->nnics; i++) {
        if (strcmp(plugin->names[i], node->nics[i].name)) {
            snprintf(why, wlen,
                     "plugin device %d is %s, the graphs' NET %d is %s (bus ID order, "
                     "NCCL_IB_DEVICE_PCI_ORDER=1)",
                     i, plugin->names[i], i, node->nics[i].name);
            return -ENOENT;
        }
    }
    /* NCCL skips a graph from a file only when NCCL_CROSS_NIC=0 and the graph says crossnic="1";
     * the shipped rings say "2" (NCCL's own dump), so NCCL would load them despite the 0. */
    if (param_int(P_NCCL_CROSS_NIC) == 0) {
        snprintf(why, wlen,
                 "NCCL_CROSS_NIC=0, but the graphs' rings cross NICs (each ring channel enters "
                 "on one NIC and leaves on the other), and NCCL loads them regardless");
        return -ENOENT;
    }
    snprintf(path, plen, "%s/graph-%s.xml", dir, cpu);
    return graph_file_fits(node, path, why, wlen);
}

/* ---------- automatic selection ---------- */

/* The shipped files are installed in <prefix>/share/nccl-net-erdma/topo, beside the
 * <prefix>/lib (or lib/<multiarch>, or bin) this code was loaded from, and are looked for there
 * first: a package installs under another prefix than the build's (the .deb goes to /usr, the
 * build's default is /usr/local), and an image may copy the tree elsewhere. Else the build's. */
static char found_topo_dir[PATH_MAX];
static pthread_once_t topo_dir_once = PTHREAD_ONCE_INIT;

static void topo_dir_find(void) {
    snprintf(found_topo_dir, sizeof(found_topo_dir), "%s", ERDMA_TOPO_DIR);
    Dl_info info;
    char here[PATH_MAX], cand[PATH_MAX];
    if (!dladdr((void *)topo_dir_find, &info) || !info.dli_fname || !realpath(info.dli_fname, here))
        return;
    char *slash = strrchr(here, '/'); /* the object's directory */
    if (!slash) return;
    *slash = 0;
    for (int up = 1; up <= 2; up++) { /* the prefix is 1 or 2 levels above it */
        slash = strrchr(here, '/');
        if (!slash) return;
        *slash = 0;
        if (snprintf(cand, sizeof(cand), "%s/share/nccl-net-erdma/topo", here) >= (int)sizeof(cand))
            return;
        if (access(cand, R_OK | X_OK) == 0) {
            memcpy(found_topo_dir, cand, sizeof(cand));
            return;
        }
    }
}

const char *topo_dir(void) {
    if (param_is_set(P_ERDMA_TOPO_DIR)) return param_str(P_ERDMA_TOPO_DIR);
    pthread_once(&topo_dir_once, topo_dir_find);
    return found_topo_dir;
}

int topo_autoselect(const struct topo_plugin_view *view) {
    static const char *const modes[] = {"auto", "off", "graph", NULL};
    int mode = param_choice(P_ERDMA_TOPO, modes);
    const char *user_topo = param_is_set(P_NCCL_TOPO_FILE) ? param_str(P_NCCL_TOPO_FILE) : NULL;
    const char *user_graph = param_is_set(P_NCCL_GRAPH_FILE) ? param_str(P_NCCL_GRAPH_FILE) : NULL;
    if (mode == 1) {
        INFO(NCCL_INIT | NCCL_ENV, "NCCL_ERDMA_TOPO=off: topology left to NCCL");
        return 0;
    }
    /* NCCL reads these itself; the user's choice (or ours from an earlier init) stands. */
    if ((user_topo && *user_topo) || (user_graph && *user_graph)) {
        INFO(NCCL_INIT | NCCL_ENV, "NCCL_TOPO_FILE/NCCL_GRAPH_FILE already set (%s, %s): kept",
             user_topo ? user_topo : "unset", user_graph ? user_graph : "unset");
        return 0;
    }
    static struct topo_node node; /* large; init is serialised by net.c's lock */
    char why[512];
    int rc = topo_scan(&node);
    if (rc) {
        INFO(NCCL_INIT, "topology: cannot read sysfs (%s); NCCL detects it", strerror(-rc));
        return 0;
    }
    const char *family = NULL;
    if (param_is_set(P_ERDMA_INSTANCE_TYPE)) {
        const char *type = param_str(P_ERDMA_INSTANCE_TYPE);
        family = topo_family_from_instance(type);
        if (!family) {
            INFO(NCCL_INIT,
                 "topology: instance type %s is not of the ebmgn9g family; NCCL "
                 "detects it",
                 type);
            return 0;
        }
    } else if (!topo_node_has_family_shape(&node, why, sizeof(why))) {
        INFO(NCCL_INIT, "topology: not an ebmgn9g-family node (%s); NCCL detects it", why);
        return 0;
    }
    static char path[PATH_MAX];
    rc = topo_graph_select(&node, view, topo_dir(), path, sizeof(path), why, sizeof(why));
    const char *what = family ? family : "ebmgn9g-family";
    const char *how = family ? "NCCL_ERDMA_INSTANCE_TYPE" : "by its shape";
    if (rc) {
        INFO(NCCL_INIT,
             "topology: %s node (%s); no graph set: %s. NCCL detects the topology "
             "and searches its graphs itself",
             what, how, why);
        return 0;
    }
    /* The shipped graphs are what NCCL's own search computes on the layout they assume: on a
     * node where every assumption holds NCCL finds the same, so auto sets nothing and only
     * NCCL_ERDMA_TOPO=graph pins them (topo/README.md says when that can help, and why it
     * must not be the default: every communicator of the process gets the same graph). */
    if (mode != 2) {
        INFO(NCCL_INIT,
             "topology: %s node (%s); NCCL detects the topology and searches its "
             "graphs itself (%s fits: NCCL_ERDMA_TOPO=graph sets it)",
             what, how, path);
        return 0;
    }
    /* Only an unset or empty NCCL_GRAPH_FILE gets here (a user's file returned above): empty
     * means unset to every parameter (params.c), and NCCL would try to open "", so replace it. */
    bool was_empty = getenv("NCCL_GRAPH_FILE") != NULL;
    setenv("NCCL_GRAPH_FILE", path, 1);
    INFO(NCCL_INIT | NCCL_ENV,
         "topology: %s node (%s); NCCL_ERDMA_TOPO=graph: NCCL_GRAPH_FILE=%s%s (for communicators "
         "of all 8 GPUs of each node: NCCL rejects it in one over fewer)",
         what, how, path, was_empty ? " (it was set but empty)" : "");
    return 1;
}
