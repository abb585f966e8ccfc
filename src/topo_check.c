/*
 * Checks of NCCL topology and graph XMLs: against the elements and attributes
 * NCCL's loaders read, against this node (every GPU and NIC where sysfs puts
 * it) and against each other (channels, devices, CPUs). Reading the node,
 * writing XML and the graph selection (with the plugin's device order) live
 * in topo.c, the XML syntax in topo_xml.c.
 */
#include "sysfs.h"
#include "topo.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void topo_err_add(struct topo_err *e, const char *fmt, ...) {
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

/* ---------- schema shared with NCCL's parser ---------- */

struct elem_rule {
    const char *name;
    const char *required[10];
    const char *optional[16];
    const char *children[5];
};

/* Element and attribute names NCCL's topology loader reads (xml.cc, topo.cc). */
static const struct elem_rule topo_rules[] = {
    {"system", {"version"}, {"name"}, {"cpu"}},
    /* arch is read unconditionally (topo.cc ncclTopoAddCpu); vendor, familyid and modelid
     * depend on it and are checked in topo_validate_topology. */
    {"cpu",
     {"numaid", "arch"},
     {"affinity", "affinity_offset", "vendor", "familyid", "modelid", "host_hash"},
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
      "typeinter", "samechannels"},
     {"latencyinter"},
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
        topo_err_add(e, "line %d: NCCL's parser does not read <%s>", n->line, n->name);
        return;
    }
    for (size_t i = 0; i < LIST_LEN(r->required) && r->required[i]; i++)
        if (!xml_get(n, r->required[i]))
            topo_err_add(e, "line %d: <%s> lacks %s=", n->line, n->name, r->required[i]);
    for (int i = 0; i < n->nattrs; i++) {
        const char *k = n->attrs[i].key;
        if (!in_list(r->required, LIST_LEN(r->required), k) &&
            !in_list(r->optional, LIST_LEN(r->optional), k))
            topo_err_add(e, "line %d: NCCL does not read %s= on <%s>", n->line, k, n->name);
    }
    for (int i = 0; i < n->nsubs; i++) {
        if (!in_list(r->children, LIST_LEN(r->children), n->subs[i]->name))
            topo_err_add(e, "line %d: <%s> inside <%s> is ignored by NCCL", n->subs[i]->line,
                         n->subs[i]->name, n->name);
        else
            check_rules(n->subs[i], rules, e);
    }
}

/* The root element NCCL's loader expects (-EINVAL if not), then every element and attribute
 * below it against the loader's rules, and the one version NCCL reads. */
static int check_document(const struct xml_node *root, const char *name, const char *env_var,
                          const struct elem_rule *rules, struct topo_err *e) {
    if (strcmp(root->name, name)) {
        topo_err_add(e, "root element is <%s>, %s needs <%s>", root->name, env_var, name);
        return -EINVAL;
    }
    check_rules(root, rules, e);
    const char *version = xml_get(root, "version");
    if (version && strcmp(version, "1"))
        topo_err_add(e, "<%s version=\"%s\">: NCCL reads version 1 only", name, version);
    return 0;
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
            topo_err_add(e, "line %d: %s dev=\"%s\" is not in 0..%d", nodes[i]->line, what,
                         xml_get(nodes[i], "dev") ? xml_get(nodes[i], "dev") : "", n - 1);
            continue;
        }
        if (seen[dev])
            topo_err_add(e, "line %d: %s dev=%ld appears twice", nodes[i]->line, what, dev);
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
    if (check_document(root, "system", "NCCL_TOPO_FILE", topo_rules, e)) return -EINVAL;

    const struct xml_node *cpus[64], *pcis[256], *gpus[256], *nets[256];
    int ncpu = collect(root, "cpu", cpus, 64, 0);
    int npci = collect(root, "pci", pcis, 256, 0);
    int ngpu = collect(root, "gpu", gpus, 256, 0);
    int nnet = collect(root, "net", nets, 256, 0);
    for (int i = 0; i < ncpu; i++) {
        /* What NCCL's ncclTopoAddCpu reads: a missing one fails NCCL's init. Since 2.22 NCCL
         * also merges a rank's detected CPU with the file's only when every attribute matches,
         * so a file's CPU must carry all of them. */
        const char *arch = xml_get(cpus[i], "arch"), *vendor = xml_get(cpus[i], "vendor");
        static const char *const arches[] = {"x86_64", "arm64", "ppc64"};
        if (arch && !in_list(arches, LIST_LEN(arches), arch))
            topo_err_add(e, "line %d: arch=\"%s\" is not one NCCL knows", cpus[i]->line, arch);
        if (arch && !strcmp(arch, "x86_64") && !vendor)
            topo_err_add(e, "line %d: an x86_64 <cpu> needs vendor= (NCCL reads it)",
                         cpus[i]->line);
        if (vendor && (!strcmp(vendor, "GenuineIntel") || !strcmp(vendor, "CentaurHauls") ||
                       !strcmp(vendor, "  Shanghai  ")))
            for (int k = 0; k < 2; k++)
                if (!xml_get(cpus[i], k ? "modelid" : "familyid"))
                    topo_err_add(e, "line %d: a %s <cpu> needs %s= (NCCL reads it)", cpus[i]->line,
                                 vendor, k ? "modelid" : "familyid");
        long v;
        if (!parse_int(xml_get(cpus[i], "numaid"), &v) && xml_get(cpus[i], "numaid"))
            topo_err_add(e, "line %d: numaid=\"%s\" is not an integer", cpus[i]->line,
                         xml_get(cpus[i], "numaid"));
        for (int j = 0; j < i; j++)
            if (xml_get(cpus[i], "numaid") && xml_get(cpus[j], "numaid") &&
                !strcmp(xml_get(cpus[i], "numaid"), xml_get(cpus[j], "numaid")))
                topo_err_add(e, "line %d: a second <cpu numaid=\"%s\">", cpus[i]->line,
                             xml_get(cpus[i], "numaid"));
    }
    for (int i = 0; i < npci; i++) {
        const struct xml_node *p = pcis[i];
        const char *busid = xml_get(p, "busid"), *cls = xml_get(p, "class");
        const char *speed = xml_get(p, "link_speed");
        long width;
        /* NCCL compares bus IDs as sysfs spells them: lower case. */
        if (busid && (!topo_is_busid(busid) || strpbrk(busid, "ABCDEF")))
            topo_err_add(e, "line %d: busid=\"%s\" is not a lower-case 0000:00:00.0 PCI address",
                         p->line, busid);
        for (int j = 0; busid && j < i; j++)
            if (xml_get(pcis[j], "busid") && !strcmp(busid, xml_get(pcis[j], "busid")))
                topo_err_add(e, "line %d: busid %s appears twice", p->line, busid);
        if (cls && strncmp(cls, "0x", 2))
            topo_err_add(e, "line %d: class=\"%s\" is not hexadecimal", p->line, cls);
        if (speed && !in_list(pci_speeds, LIST_LEN(pci_speeds), speed))
            topo_err_add(e, "line %d: link_speed=\"%s\" is not one NCCL knows", p->line, speed);
        if (xml_get(p, "link_width") && !parse_int(xml_get(p, "link_width"), &width))
            topo_err_add(e, "line %d: link_width=\"%s\" is not an integer", p->line,
                         xml_get(p, "link_width"));
    }
    for (int i = 0; i < ngpu; i++) {
        const struct xml_node *pci = gpus[i]->parent;
        const char *cls = pci ? xml_get(pci, "class") : NULL;
        if (!pci || strcmp(pci->name, "pci") || !cls || strncmp(cls, "0x03", 4))
            topo_err_add(e, "line %d: <gpu> must sit in a <pci> of class 0x03xxxx", gpus[i]->line);
    }
    check_dense_ids(gpus, ngpu, "gpu", e);
    check_dense_ids(nets, nnet, "net", e);
    for (int i = 0; i < nnet; i++)
        for (int j = 0; j < i; j++)
            if (xml_get(nets[i], "name") && xml_get(nets[j], "name") &&
                !strcmp(xml_get(nets[i], "name"), xml_get(nets[j], "name")))
                topo_err_add(e, "line %d: net %s appears twice", nets[i]->line,
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
    if (nf != nn) topo_err_add(e, "the file has %d %s, this node has %d", nf, what, nn);
    for (int i = 0; i < nf; i++) {
        const struct xml_node *holder = parent_attr ? fs[i]->parent : fs[i];
        const char *id = holder ? xml_get(holder, key) : NULL;
        const struct xml_node *match = find_by(ns, nn, key, id, parent_attr);
        if (!match) {
            topo_err_add(e, "line %d: %s %s is not on this node", fs[i]->line, elem, id ? id : "?");
            continue;
        }
        char pf[512], pn[512];
        placement(fs[i], pf, sizeof(pf));
        placement(match, pn, sizeof(pn));
        if (strcmp(pf, pn))
            topo_err_add(e, "line %d: %s %s sits at [%s] in the file but at [%s] on this node",
                         fs[i]->line, elem, id, pf, pn);
        const char *df = xml_get(fs[i], "dev"), *dn = xml_get(match, "dev");
        if (df && dn && strcmp(df, dn))
            topo_err_add(e, "line %d: %s %s has dev=%s in the file, index %s on this node",
                         fs[i]->line, elem, id, df, dn);
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
        topo_err_add(e, "cannot describe this node: %s", strerror(-rc));
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
            topo_err_add(e, "line %d: PCI function %s does not exist on this node", pcis[i]->line,
                         busid);
            continue;
        }
        /* NCCL overwrites these from sysfs when the bus ID exists: a value that differs means
         * the file describes another node. */
        const struct xml_node *twin = busid ? find_pci(gen, busid) : NULL;
        for (int a = 0; twin && a < pcis[i]->nattrs; a++) {
            const char *k = pcis[i]->attrs[a].key, *v = pcis[i]->attrs[a].value;
            const char *real = xml_get(twin, k);
            if (real && strcmp(real, v))
                topo_err_add(e, "line %d: %s %s=\"%s\" but this node says \"%s\"", pcis[i]->line,
                             busid, k, v, real);
        }
    }
    xml_free(gen);
    return e->count > before ? -EINVAL : 0;
}

/* ---------- graphs ---------- */

/* The path types NCCL's graph loader knows in every release. P2C came with 2.27: older releases'
 * kvConvertToInt turns an unknown name into 0 without a word, so 2.21 reads P2C as LOC (and a
 * tuning check such as typeInter <= PXB then passes). The checker cannot know which NCCL will
 * load the file, and P2C (PXN over a GPU's C2C link, Grace) never arises on these PCIe nodes,
 * so it is refused for every release. */
static const char *const path_types[] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"};

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
    topo_err_add(e, "line %d: channel %d: GPU dev %s and NIC %s are on different CPUs", line, c,
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
            topo_err_add(e, "line %d: channel %d: dev=\"%s\" must be one digit 0-9", s->line, c,
                         v ? v : "");
            continue;
        }
        if (!strcmp(s->name, "net")) {
            if (i != 0 && i != ch->nsubs - 1)
                topo_err_add(e, "line %d: channel %d: <net> must come first or last", s->line, c);
            if (nnet < 2) netdev[nnet] = dev;
            nnet++;
            if (!by_dev(tnets, ntnet, dev))
                topo_err_add(e, "line %d: channel %d: net dev %ld is not in the topology", s->line,
                             c, dev);
            else
                net_used[dev] = true;
        } else {
            if (!by_dev(tgpus, ntgpu, dev))
                topo_err_add(e, "line %d: channel %d: gpu dev %ld is not in the topology", s->line,
                             c, dev);
            else if (seen[dev])
                topo_err_add(e, "line %d: channel %d: gpu dev %ld appears twice", s->line, c, dev);
            seen[dev] = true;
            if (ngpu < 256) gpuorder[ngpu++] = dev;
        }
    }
    if (ngpu != ntgpu)
        topo_err_add(e, "line %d: channel %d lists %d GPUs, the topology has %d", ch->line, c, ngpu,
                     ntgpu);
    if (ntnet && nnet != 2)
        topo_err_add(e, "line %d: channel %d needs a <net> before and after its GPUs", ch->line, c);
    if (nnet == 2 && crossnic == 0 && netdev[0] != netdev[1])
        topo_err_add(e, "line %d: channel %d uses two NICs but crossnic=0", ch->line, c);
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
        topo_err_add(e, "line %d: graph id must be 0 (ring) .. 4", g->line);
    if (!parse_int(xml_get(g, "pattern"), &pattern) || pattern < 1 || pattern > 6)
        topo_err_add(e, "line %d: pattern must be 1..6", g->line);
    if (id == 0 && pattern != 4)
        topo_err_add(e, "line %d: the ring graph (id 0) needs pattern 4", g->line);
    if (id == 1 && (pattern < 1 || pattern > 3))
        topo_err_add(e, "line %d: the tree graph (id 1) needs pattern 1, 2 or 3", g->line);
    /* 2 is NCCL_CROSS_NIC's default, which NCCL's own graph dump writes. */
    if (!parse_int(xml_get(g, "crossnic"), &crossnic) || crossnic < 0 || crossnic > 2)
        topo_err_add(e, "line %d: crossnic must be 0, 1 or 2", g->line);
    if (xml_get(g, "samechannels") &&
        (!parse_int(xml_get(g, "samechannels"), &same) || same < 0 || same > 1))
        topo_err_add(e, "line %d: samechannels must be 0 or 1", g->line);
    if (!parse_int(xml_get(g, "nchannels"), &nch) || nch != g->nsubs || nch < 1 || nch > 32)
        topo_err_add(e, "line %d: nchannels=\"%s\" but %d <channel> elements (1..32)", g->line,
                     xml_get(g, "nchannels") ? xml_get(g, "nchannels") : "", g->nsubs);
    static const char *const bws[] = {"speedintra", "speedinter"};
    for (int i = 0; i < 2; i++)
        if (!parse_float(xml_get(g, bws[i]), &bw) || bw <= 0)
            topo_err_add(e, "line %d: %s must be a positive number (GB/s per channel)", g->line,
                         bws[i]);
    if (xml_get(g, "latencyinter") && !parse_float(xml_get(g, "latencyinter"), &bw))
        topo_err_add(e, "line %d: latencyinter must be a number", g->line);
    static const char *const types[] = {"typeintra", "typeinter"};
    for (int i = 0; i < 2; i++) {
        const char *t = xml_get(g, types[i]);
        if (t && !strcmp(t, "P2C"))
            topo_err_add(e,
                         "line %d: %s=\"P2C\": NCCL 2.26 and older have no P2C and read it as "
                         "LOC; these PCIe nodes have no C2C path, use the type NCCL's own dump "
                         "gives (PIX, PXB, PHB or SYS)",
                         g->line, types[i]);
        else if (t && !in_list(path_types, LIST_LEN(path_types), t))
            topo_err_add(e, "line %d: %s=\"%s\" is not a path type NCCL knows", g->line, types[i],
                         t);
    }
    bool net_used[10] = {false};
    for (int c = 0; c < g->nsubs; c++)
        check_channel(g->subs[c], c, g, tgpus, ntgpu, tnets, ntnet, net_used, e);
    for (int n = 0; n < ntnet && n < 10; n++)
        if (!net_used[n])
            topo_err_add(e, "line %d: graph %ld never uses NIC dev %d", g->line, id, n);
}

int topo_validate_graph(const struct xml_node *graphs, const struct xml_node *topo,
                        struct topo_err *e) {
    struct topo_err local = {0};
    if (!e) e = &local;
    int before = e->count;
    if (check_document(graphs, "graphs", "NCCL_GRAPH_FILE", graph_rules, e)) return -EINVAL;
    if (e->count > before) return -EINVAL;
    const struct xml_node *tgpus[256], *tnets[256];
    int ntgpu = collect(topo, "gpu", tgpus, 256, 0), ntnet = collect(topo, "net", tnets, 256, 0);
    bool ids[5] = {false};
    for (int i = 0; i < graphs->nsubs; i++) {
        const struct xml_node *g = graphs->subs[i];
        long id;
        if (parse_int(xml_get(g, "id"), &id) && id >= 0 && id <= 4) {
            if (ids[id]) topo_err_add(e, "line %d: a second graph with id %ld", g->line, id);
            ids[id] = true;
        }
        check_graph(g, tgpus, ntgpu, tnets, ntnet, e);
    }
    if (!ids[0] || !ids[1])
        topo_err_add(e, "the file needs a ring graph (id 0) and a tree graph (id 1)");
    return e->count > before ? -EINVAL : 0;
}
