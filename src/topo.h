/*
 * Topology for the ebmgn9g family (8 NVIDIA GPUs, 2 eRDMA NICs, no NVLink):
 * what sysfs says about the node, NCCL topology XMLs generated from it,
 * checks of topology and graph XMLs against the node and against each other,
 * and the automatic choice of the shipped files at plugin init.
 */
#ifndef ERDMA_TOPO_H
#define ERDMA_TOPO_H

#include "topo_xml.h"

#include <stdbool.h>
#include <stdio.h>

#define TOPO_MAX_GPUS  16
#define TOPO_MAX_NICS  16
#define TOPO_MAX_DEPTH 16
#define TOPO_BUSID_LEN 16

/* The shape every family in topo_families has. */
#define TOPO_FAMILY_GPUS 8
#define TOPO_FAMILY_NICS 2

/* A PCI function as NCCL places it. */
struct topo_dev {
    char busid[TOPO_BUSID_LEN];
    char name[64]; /* NICs: the RDMA device name */
    int numa;      /* numa_node of the topmost PCI node NCCL keeps (its <cpu numaid>) */
    int depth;     /* PCI functions from the root port down to this one */
    char chain[TOPO_MAX_DEPTH][TOPO_BUSID_LEN];
};

struct topo_node {
    int ngpus; /* NVIDIA (0x10de) functions of class 0x03xxxx, sorted by bus ID (NVML's order) */
    struct topo_dev gpus[TOPO_MAX_GPUS];
    int nnics; /* eRDMA RDMA devices, by bus ID (the plugin's order, NCCL_IB_DEVICE_PCI_ORDER=1) */
    struct topo_dev nics[TOPO_MAX_NICS];
    int nother;      /* RDMA devices of other drivers */
    char other[256]; /* their names, for messages */
};

/* Problems found by a check, one per line. */
struct topo_err {
    int count;
    char text[4096];
};

extern const char *const topo_families[]; /* NULL-terminated */

/* Reads the node from sysfs (under sysfs_root()). 0 or -errno. */
int topo_scan(struct topo_node *node);
/* True when the node has the family's shape; otherwise says why in why. */
bool topo_node_has_family_shape(const struct topo_node *node, char *why, size_t len);
/* "ecs.ebmgn9g.48xlarge" or "ebmgn9g" -> "ebmgn9g"; NULL when not a known family. */
const char *topo_family_from_instance(const char *instance_type);

/* A topology XML (the NCCL_TOPO_FILE format) for the node. 0 or -errno. */
int topo_generate(const struct topo_node *node, const char *name, struct xml_node **root);
/* Well-formed for NCCL and self-consistent. 0 or -EINVAL (problems in err). */
int topo_validate_topology(const struct xml_node *root, struct topo_err *err);
/* The topology fits the node: same GPUs, NICs, bus IDs, placement, device indices. */
int topo_check_node(const struct xml_node *root, const struct topo_node *node,
                    struct topo_err *err);
/* A graph XML (NCCL_GRAPH_FILE) valid for NCCL and consistent with the topology. */
int topo_validate_graph(const struct xml_node *graphs, const struct xml_node *topo,
                        struct topo_err *err);
/* Adds one problem (a line) to err; NULL err counts nothing. */
void topo_err_add(struct topo_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "0000:17:00.0": a PCI function's bus ID, as sysfs names its directory. */
bool topo_is_busid(const char *s);
/* One line per GPU: the NIC NCCL would pair it with, and the PCIe path between them. */
int topo_show(FILE *out, const struct topo_node *node);

/* What the plugin's devices look like to the graph selection: device.c's table at init, a
 * test's or the tool's stand-in otherwise. */
struct topo_plugin_view {
    int nnics;
    const char *names[TOPO_MAX_NICS]; /* in the plugin's order: a graph's <net dev> */
    bool gdr;                         /* every NIC reaches GPU memory: peer memory or dma-buf */
    int net_version; /* the ncclNet version NCCL loaded; 8 means NCCL <= 2.23, 0 unknown */
};

/* Where the shipped files are: NCCL_ERDMA_TOPO_DIR, else share/nccl-net-erdma/topo of the
 * prefix this code was loaded from, else the build's installed one.
 */
const char *topo_dir(void);
/* The CPU kind (/proc/cpuinfo under the sysfs root) a graph is shipped for, as NCCL's model
 * tells them apart: "intel-spr", "intel-erp"; NULL with the reason in why for any other. */
const char *topo_cpu_kind(char *why, size_t wlen);

/*
 * The shipped graph (topo/graph-<cpu>.xml, NCCL's own ring and tree of the family layout) for
 * this node, when everything it assumes holds: a family node (8 GPUs, 2 eRDMA NICs, GPUs 0-3
 * PIX-near the first NIC and 4-7 the second), a CPU kind it is made for, GPU Direct RDMA, both
 * NICs in the plugin's use, in bus ID order, ncclNet v9 or newer (NCCL 2.24+; 2.21 models these
 * CPUs' socket link as Skylake's), NCCL_CROSS_NIC not 0 (the rings cross NICs). 0 with its path,
 * or -ENOENT with the first assumption that fails in why.
 */
int topo_graph_select(const struct topo_node *node, const struct topo_plugin_view *plugin,
                      const char *dir, char *path, size_t plen, char *why, size_t wlen);

/*
 * At init, when NCCL_TOPO_FILE and NCCL_GRAPH_FILE are unset (or empty) and the node is
 * recognised: NCCL_ERDMA_TOPO=auto logs what topo_graph_select finds and sets nothing;
 * =graph sets NCCL_GRAPH_FILE to the graph it selects. Returns 1 when it set
 * it, 0 when it left NCCL alone (the reason is logged); never fails init.
 */
int topo_autoselect(const struct topo_plugin_view *plugin);

#endif
