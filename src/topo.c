/*
 * Owns the node's topology as NCCL sees it: the sysfs scan (GPUs, eRDMA NICs,
 * their PCI placement), generation of NCCL topology XML, checks of topology
 * and graph XMLs, and the init-time choice of the shipped files. The XML
 * syntax lives in topo_xml.c; the plugin's device table in device.c.
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
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifndef ERDMA_TOPO_DIR
#define ERDMA_TOPO_DIR "/usr/local/share/nccl-net-erdma/topo"
#endif

#define NVIDIA_VENDOR 0x10de

const char *const topo_families[] = {"ebmgn9g", "ebmgn9gc", "ebmgn9ge", NULL};

static void err_add(struct topo_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void err_add(struct topo_err *e, const char *fmt, ...) {
    if (!e) return;
    size_t used = strlen(e->text);
    if (used + 2 < sizeof(e->text)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->text + used, sizeof(e->text) - used - 1, fmt, ap);
        va_end(ap);
        used = strlen(e->text);
        e->text[used] = '\n';
        e->text[used + 1] = 0;
    }
    e->count++;
}

/* ---------- sysfs scan ---------- */

static bool is_bdf(const char *s) {
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
    while (first > 0 && is_bdf(parts[first - 1]))
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

static int cmp_name(const void *a, const void *b) {
    return strverscmp(((const struct topo_dev *)a)->name, ((const struct topo_dev *)b)->name);
}

static int scan_gpus(struct topo_node *node) {
    DIR *dir = open_sysfs_dir("/sys/bus/pci/devices");
    if (!dir) return errno == ENOENT ? 0 : -errno;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(dir))) {
        long vendor, cls;
        char rp[PATH_MAX];
        if (!is_bdf(de->d_name)) continue;
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
    qsort(node->nics, (size_t)node->nnics, sizeof(node->nics[0]), cmp_name);
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

/* The PCI node NCCL would attach the device to, created along the way. */
static int place(struct xml_node *sys, const struct topo_dev *d, struct xml_node **out) {
    char numa[16];
    snprintf(numa, sizeof(numa), "%d", d->numa);
    struct xml_node *parent = find_child(sys, "cpu", "numaid", numa);
    if (!parent) {
        parent = xml_add(sys, "cpu");
        if (!parent || xml_set(parent, "numaid", "%s", numa)) return -ENOMEM;
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
        /* dev is the plugin's device index: devices are listed in name order. */
        if (!rc) rc = xml_set(x, "dev", "%d", i);
    }
    if (rc) {
        xml_free(sys);
        return rc;
    }
    *root = sys;
    return 0;
}

/* ---------- schema shared with NCCL's parser ---------- */

struct elem_rule {
    const char *name;
    const char *required[8];
    const char *optional[16];
    const char *children[5];
};

/* Element and attribute names NCCL's topology loader reads (xml.cc, topo.cc). */
static const struct elem_rule topo_rules[] = {
    {"system", {"version"}, {"name"}, {"cpu"}},
    {"cpu",
     {"numaid"},
     {"affinity", "affinity_offset", "arch", "vendor", "familyid", "modelid", "host_hash"},
     {"pci", "nic"}},
    {"pci",
     {"busid", "class", "link_speed", "link_width"},
     {"vendor", "device", "subsystem_vendor", "subsystem_device"},
     {"pci", "gpu", "nic", "pcilink"}},
    {"gpu", {"dev"}, {"sm", "rank", "gdr", "mlopart"}, {"nvlink", "c2c"}},
    {"nvlink", {"target", "count", "tclass"}, {0}, {0}},
    {"c2c", {"bw", "count"}, {0}, {0}},
    {"pcilink", {"target"}, {0}, {0}},
    {"nic", {0}, {0}, {"net"}},
    {"net",
     {"name", "dev"},
     {"speed", "port", "latency", "guid", "maxconn", "gdr", "coll", "rail", "plane", "net"},
     {0}},
    {NULL, {0}, {0}, {0}},
};

/* And the graph loader (search.cc). */
static const struct elem_rule graph_rules[] = {
    {"graphs", {"version"}, {"name"}, {"graph"}},
    {"graph",
     {"id", "pattern", "crossnic", "nchannels", "speedintra", "speedinter", "typeintra",
      "typeinter"},
     {"samechannels", "latencyinter"},
     {"channel"}},
    {"channel", {0}, {0}, {"net", "gpu"}},
    {"net", {"dev"}, {0}, {0}},
    {"gpu", {"dev"}, {"rank"}, {0}},
    {NULL, {0}, {0}, {0}},
};

static bool in_list(const char *const *list, size_t n, const char *s) {
    for (size_t i = 0; i < n && list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

#define LIST_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void check_rules(const struct xml_node *n, const struct elem_rule *rules,
                        struct topo_err *e) {
    const struct elem_rule *r = rules;
    while (r->name && strcmp(r->name, n->name))
        r++;
    if (!r->name) {
        err_add(e, "line %d: NCCL's parser does not read <%s>", n->line, n->name);
        return;
    }
    for (size_t i = 0; i < LIST_LEN(r->required) && r->required[i]; i++)
        if (!xml_get(n, r->required[i]))
            err_add(e, "line %d: <%s> lacks %s=", n->line, n->name, r->required[i]);
    for (int i = 0; i < n->nattrs; i++) {
        const char *k = n->attrs[i].key;
        if (!in_list(r->required, LIST_LEN(r->required), k) &&
            !in_list(r->optional, LIST_LEN(r->optional), k))
            err_add(e, "line %d: NCCL does not read %s= on <%s>", n->line, k, n->name);
    }
    for (int i = 0; i < n->nsubs; i++) {
        if (!in_list(r->children, LIST_LEN(r->children), n->subs[i]->name))
            err_add(e, "line %d: <%s> inside <%s> is ignored by NCCL", n->subs[i]->line,
                    n->subs[i]->name, n->name);
        else
            check_rules(n->subs[i], rules, e);
    }
}

static bool parse_int(const char *s, long *out) {
    char *end;
    if (!s || !*s) return false;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, double *out) {
    char *end;
    if (!s || !*s) return false;
    double v = strtod(s, &end);
    if (*end) return false;
    *out = v;
    return true;
}

/* Collects nodes named name in document order. */
static int collect(const struct xml_node *n, const char *name, const struct xml_node **out, int max,
                   int count) {
    if (!strcmp(n->name, name) && count < max) out[count++] = n;
    for (int i = 0; i < n->nsubs; i++)
        count = collect(n->subs[i], name, out, max, count);
    return count;
}

/* Ids NCCL uses as array indices must be 0..n-1, each once. */
static void check_dense_ids(const struct xml_node **nodes, int n, const char *what,
                            struct topo_err *e) {
    bool seen[256] = {false};
    for (int i = 0; i < n; i++) {
        long dev;
        if (!parse_int(xml_get(nodes[i], "dev"), &dev) || dev < 0 || dev >= n) {
            err_add(e, "line %d: %s dev=\"%s\" is not in 0..%d", nodes[i]->line, what,
                    xml_get(nodes[i], "dev") ? xml_get(nodes[i], "dev") : "", n - 1);
            continue;
        }
        if (seen[dev]) err_add(e, "line %d: %s dev=%ld appears twice", nodes[i]->line, what, dev);
        seen[dev] = true;
    }
}

static const char *const pci_speeds[] = {"",
                                         "2.5 GT/s",
                                         "5 GT/s",
                                         "8 GT/s",
                                         "16 GT/s",
                                         "32 GT/s",
                                         "2.5 GT/s PCIe",
                                         "5.0 GT/s PCIe",
                                         "8.0 GT/s PCIe",
                                         "16.0 GT/s PCIe",
                                         "32.0 GT/s PCIe",
                                         "64.0 GT/s PCIe"};

int topo_validate_topology(const struct xml_node *root, struct topo_err *e) {
    int before = e ? e->count : 0;
    struct topo_err local = {0};
    if (!e) e = &local;
    if (strcmp(root->name, "system")) {
        err_add(e, "root element is <%s>, NCCL_TOPO_FILE needs <system>", root->name);
        return -EINVAL;
    }
    check_rules(root, topo_rules, e);
    const char *version = xml_get(root, "version");
    if (version && strcmp(version, "1"))
        err_add(e, "<system version=\"%s\">: NCCL reads version 1 only", version);

    const struct xml_node *cpus[64], *pcis[256], *gpus[256], *nets[256];
    int ncpu = collect(root, "cpu", cpus, 64, 0);
    int npci = collect(root, "pci", pcis, 256, 0);
    int ngpu = collect(root, "gpu", gpus, 256, 0);
    int nnet = collect(root, "net", nets, 256, 0);
    for (int i = 0; i < ncpu; i++) {
        long v;
        if (!parse_int(xml_get(cpus[i], "numaid"), &v) && xml_get(cpus[i], "numaid"))
            err_add(e, "line %d: numaid=\"%s\" is not an integer", cpus[i]->line,
                    xml_get(cpus[i], "numaid"));
        for (int j = 0; j < i; j++)
            if (xml_get(cpus[i], "numaid") && xml_get(cpus[j], "numaid") &&
                !strcmp(xml_get(cpus[i], "numaid"), xml_get(cpus[j], "numaid")))
                err_add(e, "line %d: a second <cpu numaid=\"%s\">", cpus[i]->line,
                        xml_get(cpus[i], "numaid"));
    }
    for (int i = 0; i < npci; i++) {
        const struct xml_node *p = pcis[i];
        const char *busid = xml_get(p, "busid"), *cls = xml_get(p, "class");
        const char *speed = xml_get(p, "link_speed");
        long width;
        /* NCCL compares bus IDs as sysfs spells them: lower case. */
        if (busid && (!is_bdf(busid) || strpbrk(busid, "ABCDEF")))
            err_add(e, "line %d: busid=\"%s\" is not a lower-case 0000:00:00.0 PCI address",
                    p->line, busid);
        for (int j = 0; busid && j < i; j++)
            if (xml_get(pcis[j], "busid") && !strcmp(busid, xml_get(pcis[j], "busid")))
                err_add(e, "line %d: busid %s appears twice", p->line, busid);
        if (cls && strncmp(cls, "0x", 2))
            err_add(e, "line %d: class=\"%s\" is not hexadecimal", p->line, cls);
        if (speed && !in_list(pci_speeds, LIST_LEN(pci_speeds), speed))
            err_add(e, "line %d: link_speed=\"%s\" is not one NCCL knows", p->line, speed);
        if (xml_get(p, "link_width") && !parse_int(xml_get(p, "link_width"), &width))
            err_add(e, "line %d: link_width=\"%s\" is not an integer", p->line,
                    xml_get(p, "link_width"));
    }
    for (int i = 0; i < ngpu; i++) {
        const struct xml_node *pci = gpus[i]->parent;
        const char *cls = pci ? xml_get(pci, "class") : NULL;
        if (!pci || strcmp(pci->name, "pci") || !cls || strncmp(cls, "0x03", 4))
            err_add(e, "line %d: <gpu> must sit in a <pci> of class 0x03xxxx", gpus[i]->line);
    }
    check_dense_ids(gpus, ngpu, "gpu", e);
    check_dense_ids(nets, nnet, "net", e);
    for (int i = 0; i < nnet; i++)
        for (int j = 0; j < i; j++)
            if (xml_get(nets[i], "name") && xml_get(nets[j], "name") &&
                !strcmp(xml_get(nets[i], "name"), xml_get(nets[j], "name")))
                err_add(e, "line %d: net %s appears twice", nets[i]->line,
                        xml_get(nets[i], "name"));
    return e->count > before ? -EINVAL : 0;
}

/* ---------- topology against the node ---------- */

/* "cpu 0 > pci 0000:17:00.0 > pci 0000:19:00.0": where NCCL would put the element. */
static void placement(const struct xml_node *n, char *out, size_t len) {
    const struct xml_node *stack[64];
    int depth = 0;
    for (const struct xml_node *p = n; p && depth < 64; p = p->parent)
        if (!strcmp(p->name, "cpu") || !strcmp(p->name, "pci")) stack[depth++] = p;
    out[0] = 0;
    for (int i = depth - 1; i >= 0; i--) {
        size_t used = strlen(out);
        bool cpu = !strcmp(stack[i]->name, "cpu");
        const char *v = xml_get(stack[i], cpu ? "numaid" : "busid");
        snprintf(out + used, len - used, "%s%s %s", used ? " > " : "", cpu ? "cpu" : "pci",
                 v ? v : "?");
    }
}

static const struct xml_node *find_by(const struct xml_node **nodes, int n, const char *key,
                                      const char *value, bool parent_attr) {
    for (int i = 0; i < n; i++) {
        const struct xml_node *holder = parent_attr ? nodes[i]->parent : nodes[i];
        const char *v = holder ? xml_get(holder, key) : NULL;
        if (v && value && !strcmp(v, value)) return nodes[i];
    }
    return NULL;
}

static void compare_endpoints(const struct xml_node *file, const struct xml_node *node,
                              const char *elem, const char *key, bool parent_attr, const char *what,
                              struct topo_err *e) {
    const struct xml_node *fs[256], *ns[256];
    int nf = collect(file, elem, fs, 256, 0), nn = collect(node, elem, ns, 256, 0);
    if (nf != nn) err_add(e, "the file has %d %s, this node has %d", nf, what, nn);
    for (int i = 0; i < nf; i++) {
        const struct xml_node *holder = parent_attr ? fs[i]->parent : fs[i];
        const char *id = holder ? xml_get(holder, key) : NULL;
        const struct xml_node *match = find_by(ns, nn, key, id, parent_attr);
        if (!match) {
            err_add(e, "line %d: %s %s is not on this node", fs[i]->line, elem, id ? id : "?");
            continue;
        }
        char pf[512], pn[512];
        placement(fs[i], pf, sizeof(pf));
        placement(match, pn, sizeof(pn));
        if (strcmp(pf, pn))
            err_add(e, "line %d: %s %s sits at [%s] in the file but at [%s] on this node",
                    fs[i]->line, elem, id, pf, pn);
        const char *df = xml_get(fs[i], "dev"), *dn = xml_get(match, "dev");
        if (df && dn && strcmp(df, dn))
            err_add(e, "line %d: %s %s has dev=%s in the file, index %s on this node", fs[i]->line,
                    elem, id, df, dn);
    }
}

static const struct xml_node *find_pci(const struct xml_node *n, const char *busid) {
    const char *v = xml_get(n, "busid");
    if (!strcmp(n->name, "pci") && v && !strcmp(v, busid)) return n;
    for (int i = 0; i < n->nsubs; i++) {
        const struct xml_node *hit = find_pci(n->subs[i], busid);
        if (hit) return hit;
    }
    return NULL;
}

int topo_check_node(const struct xml_node *root, const struct topo_node *node, struct topo_err *e) {
    struct topo_err local = {0};
    if (!e) e = &local;
    int before = e->count;
    if (topo_validate_topology(root, e)) return -EINVAL;
    struct xml_node *gen;
    int rc = topo_generate(node, NULL, &gen);
    if (rc) {
        err_add(e, "cannot describe this node: %s", strerror(-rc));
        return rc;
    }
    compare_endpoints(root, gen, "gpu", "busid", true, "GPUs", e);
    compare_endpoints(root, gen, "net", "name", false, "eRDMA NICs", e);
    /* Switches too: a bus ID that names nothing here means the file is for another node. */
    const struct xml_node *pcis[256];
    int npci = collect(root, "pci", pcis, 256, 0);
    for (int i = 0; i < npci; i++) {
        const char *busid = xml_get(pcis[i], "busid");
        if (busid && !sysfs_exists("/sys/bus/pci/devices/%s", busid)) {
            err_add(e, "line %d: PCI function %s does not exist on this node", pcis[i]->line,
                    busid);
            continue;
        }
        /* NCCL keeps what the file says over sysfs, so a wrong link speed would stick. */
        const struct xml_node *twin = busid ? find_pci(gen, busid) : NULL;
        for (int a = 0; twin && a < pcis[i]->nattrs; a++) {
            const char *k = pcis[i]->attrs[a].key, *v = pcis[i]->attrs[a].value;
            const char *real = xml_get(twin, k);
            if (real && strcmp(real, v))
                err_add(e, "line %d: %s %s=\"%s\" but this node says \"%s\"", pcis[i]->line, busid,
                        k, v, real);
        }
    }
    xml_free(gen);
    return e->count > before ? -EINVAL : 0;
}

/* ---------- graphs ---------- */

static const char *const path_types[] = {"LOC", "NVL", "NVB", "PIX", "PXB",
                                         "P2C", "PXN", "PHB", "SYS"};

static const struct xml_node *cpu_of(const struct xml_node *n) {
    while (n && strcmp(n->name, "cpu"))
        n = n->parent;
    return n;
}

static const struct xml_node *by_dev(const struct xml_node **nodes, int n, long dev) {
    char want[16];
    snprintf(want, sizeof(want), "%ld", dev);
    return find_by(nodes, n, "dev", want, false);
}

/* The GPUs that talk to the network must share a CPU with the channel's NIC. */
static void check_local(const struct xml_node *gpu, const struct xml_node *net, int line, int c,
                        struct topo_err *e) {
    if (!gpu || !net || cpu_of(gpu) == cpu_of(net)) return;
    err_add(e, "line %d: channel %d: GPU dev %s and NIC %s are on different CPUs", line, c,
            xml_get(gpu, "dev"), xml_get(net, "name"));
}

static void check_channel(const struct xml_node *ch, int c, const struct xml_node *graph,
                          const struct xml_node **tgpus, int ntgpu, const struct xml_node **tnets,
                          int ntnet, bool *net_used, struct topo_err *e) {
    long pattern = 0, crossnic = 0, dev;
    parse_int(xml_get(graph, "pattern"), &pattern);
    parse_int(xml_get(graph, "crossnic"), &crossnic);
    bool seen[TOPO_MAX_GPUS * 16] = {false};
    long netdev[2] = {-1, -1}, gpuorder[256];
    int nnet = 0, ngpu = 0;
    for (int i = 0; i < ch->nsubs; i++) {
        const struct xml_node *s = ch->subs[i];
        const char *v = xml_get(s, "dev");
        /* Newer NCCL reads channel devs as hex, older as decimal: only 0-9 mean the same. */
        if (!v || !parse_int(v, &dev) || dev < 0 || dev > 9 || strlen(v) != 1) {
            err_add(e, "line %d: channel %d: dev=\"%s\" must be one digit 0-9", s->line, c,
                    v ? v : "");
            continue;
        }
        if (!strcmp(s->name, "net")) {
            if (i != 0 && i != ch->nsubs - 1)
                err_add(e, "line %d: channel %d: <net> must come first or last", s->line, c);
            if (nnet < 2) netdev[nnet] = dev;
            nnet++;
            if (!by_dev(tnets, ntnet, dev))
                err_add(e, "line %d: channel %d: net dev %ld is not in the topology", s->line, c,
                        dev);
            else
                net_used[dev] = true;
        } else {
            if (!by_dev(tgpus, ntgpu, dev))
                err_add(e, "line %d: channel %d: gpu dev %ld is not in the topology", s->line, c,
                        dev);
            else if (seen[dev])
                err_add(e, "line %d: channel %d: gpu dev %ld appears twice", s->line, c, dev);
            seen[dev] = true;
            if (ngpu < 256) gpuorder[ngpu++] = dev;
        }
    }
    if (ngpu != ntgpu)
        err_add(e, "line %d: channel %d lists %d GPUs, the topology has %d", ch->line, c, ngpu,
                ntgpu);
    if (ntnet && nnet != 2)
        err_add(e, "line %d: channel %d needs a <net> before and after its GPUs", ch->line, c);
    if (nnet == 2 && crossnic == 0 && netdev[0] != netdev[1])
        err_add(e, "line %d: channel %d uses two NICs but crossnic=0", ch->line, c);
    if (nnet != 2 || ngpu == 0) return;
    const struct xml_node *first = by_dev(tgpus, ntgpu, gpuorder[0]);
    const struct xml_node *last = by_dev(tgpus, ntgpu, gpuorder[ngpu - 1]);
    check_local(first, by_dev(tnets, ntnet, netdev[0]), ch->line, c, e);
    /* A ring sends to the network from its last GPU; a tree only from its head. */
    if (pattern == 4) check_local(last, by_dev(tnets, ntnet, netdev[1]), ch->line, c, e);
    /* Balanced and split trees hang tree children off the second GPU too. */
    if ((pattern == 1 || pattern == 2) && ngpu > 1)
        check_local(by_dev(tgpus, ntgpu, gpuorder[1]), by_dev(tnets, ntnet, netdev[1]), ch->line, c,
                    e);
}

static void check_graph(const struct xml_node *g, const struct xml_node **tgpus, int ntgpu,
                        const struct xml_node **tnets, int ntnet, struct topo_err *e) {
    long id = -1, pattern = -1, nch = -1, crossnic = -1, same = 0;
    double bw;
    if (!parse_int(xml_get(g, "id"), &id) || id < 0 || id > 4)
        err_add(e, "line %d: graph id must be 0 (ring) .. 4", g->line);
    if (!parse_int(xml_get(g, "pattern"), &pattern) || pattern < 1 || pattern > 6)
        err_add(e, "line %d: pattern must be 1..6", g->line);
    if (id == 0 && pattern != 4)
        err_add(e, "line %d: the ring graph (id 0) needs pattern 4", g->line);
    if (id == 1 && (pattern < 1 || pattern > 3))
        err_add(e, "line %d: the tree graph (id 1) needs pattern 1, 2 or 3", g->line);
    if (!parse_int(xml_get(g, "crossnic"), &crossnic) || crossnic < 0 || crossnic > 1)
        err_add(e, "line %d: crossnic must be 0 or 1", g->line);
    if (xml_get(g, "samechannels") &&
        (!parse_int(xml_get(g, "samechannels"), &same) || same < 0 || same > 1))
        err_add(e, "line %d: samechannels must be 0 or 1", g->line);
    if (!parse_int(xml_get(g, "nchannels"), &nch) || nch != g->nsubs || nch < 1 || nch > 32)
        err_add(e, "line %d: nchannels=\"%s\" but %d <channel> elements (1..32)", g->line,
                xml_get(g, "nchannels") ? xml_get(g, "nchannels") : "", g->nsubs);
    static const char *const bws[] = {"speedintra", "speedinter"};
    for (int i = 0; i < 2; i++)
        if (!parse_float(xml_get(g, bws[i]), &bw) || bw <= 0)
            err_add(e, "line %d: %s must be a positive number (GB/s per channel)", g->line, bws[i]);
    if (xml_get(g, "latencyinter") && !parse_float(xml_get(g, "latencyinter"), &bw))
        err_add(e, "line %d: latencyinter must be a number", g->line);
    static const char *const types[] = {"typeintra", "typeinter"};
    for (int i = 0; i < 2; i++) {
        const char *t = xml_get(g, types[i]);
        if (t && !in_list(path_types, LIST_LEN(path_types), t))
            err_add(e, "line %d: %s=\"%s\" is not a path type NCCL knows", g->line, types[i], t);
    }
    bool net_used[10] = {false};
    for (int c = 0; c < g->nsubs; c++)
        check_channel(g->subs[c], c, g, tgpus, ntgpu, tnets, ntnet, net_used, e);
    for (int n = 0; n < ntnet && n < 10; n++)
        if (!net_used[n]) err_add(e, "line %d: graph %ld never uses NIC dev %d", g->line, id, n);
}

int topo_validate_graph(const struct xml_node *graphs, const struct xml_node *topo,
                        struct topo_err *e) {
    struct topo_err local = {0};
    if (!e) e = &local;
    int before = e->count;
    if (strcmp(graphs->name, "graphs")) {
        err_add(e, "root element is <%s>, NCCL_GRAPH_FILE needs <graphs>", graphs->name);
        return -EINVAL;
    }
    check_rules(graphs, graph_rules, e);
    const char *version = xml_get(graphs, "version");
    if (version && strcmp(version, "1"))
        err_add(e, "<graphs version=\"%s\">: NCCL reads version 1 only", version);
    if (e->count > before) return -EINVAL;
    const struct xml_node *tgpus[256], *tnets[256];
    int ntgpu = collect(topo, "gpu", tgpus, 256, 0), ntnet = collect(topo, "net", tnets, 256, 0);
    bool ids[5] = {false};
    for (int i = 0; i < graphs->nsubs; i++) {
        const struct xml_node *g = graphs->subs[i];
        long id;
        if (parse_int(xml_get(g, "id"), &id) && id >= 0 && id <= 4) {
            if (ids[id]) err_add(e, "line %d: a second graph with id %ld", g->line, id);
            ids[id] = true;
        }
        check_graph(g, tgpus, ntgpu, tnets, ntnet, e);
    }
    if (!ids[0] || !ids[1])
        err_add(e, "the file needs a ring graph (id 0) and a tree graph (id 1)");
    return e->count > before ? -EINVAL : 0;
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

/* ---------- automatic selection ---------- */

static const char *topo_dir(void) {
    return param_is_set(P_ERDMA_TOPO_DIR) ? param_str(P_ERDMA_TOPO_DIR) : ERDMA_TOPO_DIR;
}

/* The plugin's device order must be the one the files index NICs by. */
static int check_plugin_devices(const struct xml_node *topo, struct topo_err *e) {
    const struct xml_node *nets[64];
    int nnet = collect(topo, "net", nets, 64, 0), ndev = devices_count();
    if (ndev == 0) return 0; /* called outside init (tools, unit tests): sysfs only */
    if (ndev != nnet) {
        err_add(e, "the plugin uses %d NIC(s) (NCCL_IB_HCA?), the files expect %d", ndev, nnet);
        return -EINVAL;
    }
    for (int i = 0; i < ndev; i++) {
        const struct xml_node *n = by_dev(nets, nnet, i);
        if (!n || strcmp(xml_get(n, "name"), device_get(i)->name)) {
            err_add(e, "plugin device %d is %s, the files expect %s", i, device_get(i)->name,
                    n ? xml_get(n, "name") : "nothing");
            return -EINVAL;
        }
    }
    return 0;
}

static int family_fits(const char *family, const struct topo_node *node, char *topo_path,
                       char *graph_path, struct topo_err *e) {
    char why[512];
    struct xml_node *topo = NULL, *graph = NULL;
    snprintf(topo_path, PATH_MAX, "%s/%s-topo.xml", topo_dir(), family);
    snprintf(graph_path, PATH_MAX, "%s/%s-graph.xml", topo_dir(), family);
    int rc = xml_load(topo_path, &topo, why, sizeof(why));
    if (!rc) rc = xml_load(graph_path, &graph, why, sizeof(why));
    if (rc) err_add(e, "%s", why);
    if (!rc) rc = topo_check_node(topo, node, e);
    if (!rc) rc = topo_validate_graph(graph, topo, e);
    if (!rc) rc = check_plugin_devices(topo, e);
    xml_free(topo);
    xml_free(graph);
    return rc;
}

static void first_line(const struct topo_err *e, char *out, size_t len) {
    snprintf(out, len, "%.*s", (int)strcspn(e->text, "\n"), e->text);
}

int topo_autoselect(void) {
    static const char *const modes[] = {"auto", "off", NULL};
    const char *user_topo = getenv("NCCL_TOPO_FILE"), *user_graph = getenv("NCCL_GRAPH_FILE");
    if (param_choice(P_ERDMA_TOPO, modes) == 1) {
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
    const char *candidates[8] = {NULL};
    const char *type = param_str(P_ERDMA_INSTANCE_TYPE);
    if (param_is_set(P_ERDMA_INSTANCE_TYPE)) {
        candidates[0] = topo_family_from_instance(type);
        if (!candidates[0]) {
            INFO(NCCL_INIT, "topology: instance type %s has no shipped topology; NCCL detects it",
                 type);
            return 0;
        }
    } else if (!topo_node_has_family_shape(&node, why, sizeof(why))) {
        INFO(NCCL_INIT, "topology: not an ebmgn9g-family node (%s); NCCL detects it", why);
        return 0;
    } else {
        /* The shape does not tell the families apart: the first whose files fit wins. */
        for (int i = 0; topo_families[i] && i < 7; i++)
            candidates[i] = topo_families[i];
    }
    for (int i = 0; candidates[i]; i++) {
        static char topo_path[PATH_MAX], graph_path[PATH_MAX];
        struct topo_err e = {0};
        if (family_fits(candidates[i], &node, topo_path, graph_path, &e)) {
            first_line(&e, why, sizeof(why));
            INFO(NCCL_INIT,
                 "topology: %s files do not fit this node (%d problem(s), first: %s); "
                 "NCCL detects it. `nccl-erdma-topo check %s` lists them",
                 candidates[i], e.count, why, topo_path);
            continue;
        }
        if (setenv("NCCL_TOPO_FILE", topo_path, 0) || setenv("NCCL_GRAPH_FILE", graph_path, 0)) {
            unsetenv("NCCL_TOPO_FILE");
            INFO(NCCL_INIT, "topology: setenv failed (%s); NCCL detects it", strerror(errno));
            return 0;
        }
        INFO(NCCL_INIT | NCCL_ENV, "topology: %s node (%s), NCCL_TOPO_FILE=%s NCCL_GRAPH_FILE=%s",
             candidates[i],
             param_is_set(P_ERDMA_INSTANCE_TYPE) ? "NCCL_ERDMA_INSTANCE_TYPE" : "by its shape",
             topo_path, graph_path);
        return 1;
    }
    return 0;
}
