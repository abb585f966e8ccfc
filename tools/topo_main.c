/*
 * nccl-erdma-topo: generates an NCCL topology XML from this node's sysfs,
 * checks topology/graph XMLs against the node, and shows which eRDMA NIC
 * each GPU would be paired with. --sysfs-root points it at a fixture tree.
 * Exit status: 0 fine, 1 the check found problems, 2 usage or I/O error,
 * 3 not this kind of node (no NVIDIA GPU or no eRDMA NIC).
 */
#define _GNU_SOURCE
#include "sysfs.h"
#include "topo.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_OK = 0, EXIT_CHECK = 1, EXIT_USAGE = 2, EXIT_NOT_NODE = 3 };

static void usage(FILE *out) {
    fprintf(out, "usage: nccl-erdma-topo [--sysfs-root DIR] COMMAND\n"
                 "  generate [--name NAME] [-o FILE]  topology XML (NCCL_TOPO_FILE format) of this "
                 "node\n"
                 "  check TOPO.xml [GRAPH.xml]        does the file fit this node? (and the graph "
                 "the topology?)\n"
                 "  show                              which eRDMA NIC each GPU would use\n"
                 "  select [--topo-dir DIR] [--nics NIC,NIC] [--gdr 0|1] [--nccl-net 8..12]\n"
                 "                                    the graph NCCL_ERDMA_TOPO=graph would set, "
                 "for the\n"
                 "                                    plugin's NICs in this order (default: the "
                 "node's, by\n"
                 "                                    bus ID) and GPU Direct RDMA (default 1)\n");
}

static int not_this_node(const char *why) {
    fprintf(stderr,
            "nccl-erdma-topo: not this kind of node: %s.\n"
            "This tool is for GPU nodes with eRDMA NICs (ebmgn9g, ebmgn9gc, ebmgn9ge).\n",
            why);
    return EXIT_NOT_NODE;
}

static int scan(struct topo_node *node) {
    int rc = topo_scan(node);
    if (rc)
        fprintf(stderr, "nccl-erdma-topo: reading sysfs under %s: %s\n", sysfs_root(),
                strerror(-rc));
    return rc;
}

static int cmd_generate(const struct topo_node *node, int argc, char **argv) {
    const char *name = NULL, *outpath = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--name") && i + 1 < argc) {
            name = argv[++i];
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            outpath = argv[++i];
        } else {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    char why[256];
    if (node->ngpus == 0) {
        topo_node_has_family_shape(node, why, sizeof(why));
        return not_this_node(why);
    }
    if (node->nnics == 0)
        fprintf(stderr, "nccl-erdma-topo: note: no eRDMA NIC found; the file has GPUs only\n");
    struct xml_node *root;
    int rc = topo_generate(node, name, &root);
    if (rc) {
        fprintf(stderr, "nccl-erdma-topo: generate: %s\n", strerror(-rc));
        return EXIT_USAGE;
    }
    FILE *out = outpath ? fopen(outpath, "we") : stdout;
    if (!out) {
        perror(outpath);
        xml_free(root);
        return EXIT_USAGE;
    }
    rc = xml_write(out, root);
    if (outpath && fclose(out)) rc = -1;
    xml_free(root);
    return rc ? EXIT_USAGE : EXIT_OK;
}

static int load(const char *path, struct xml_node **root) {
    char err[512];
    int rc = xml_load(path, root, err, sizeof(err));
    if (rc) fprintf(stderr, "%s\n", err);
    return rc;
}

static int report(const char *what, const struct topo_err *e) {
    if (!e->count) {
        printf("%s: OK\n", what);
        return 0;
    }
    printf("%s: %d problem(s)\n%s", what, e->count, e->text);
    return 1;
}

static int cmd_check(const struct topo_node *node, int argc, char **argv) {
    if (argc < 1 || argc > 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    struct xml_node *topo = NULL, *graph = NULL;
    if (load(argv[0], &topo)) return EXIT_CHECK;
    if (argc == 2 && load(argv[1], &graph)) {
        xml_free(topo);
        return EXIT_CHECK;
    }
    int bad = 0;
    struct topo_err e = {0};
    if (topo_validate_topology(topo, &e) == 0) {
        bad |= report(argv[0], &e);
        memset(&e, 0, sizeof(e));
        topo_check_node(topo, node, &e);
        char what[PATH_MAX + 32];
        snprintf(what, sizeof(what), "%s against this node", argv[0]);
        bad |= report(what, &e);
        if (graph) {
            memset(&e, 0, sizeof(e));
            topo_validate_graph(graph, topo, &e);
            bad |= report(argv[1], &e);
        }
    } else {
        bad |= report(argv[0], &e);
    }
    xml_free(topo);
    xml_free(graph);
    char why[256];
    if (!topo_node_has_family_shape(node, why, sizeof(why)))
        printf("note: this node has %s\n", why);
    return bad ? EXIT_CHECK : EXIT_OK;
}

static int cmd_show(const struct topo_node *node) {
    char why[256];
    if (node->ngpus == 0 || node->nnics == 0) {
        topo_node_has_family_shape(node, why, sizeof(why));
        return not_this_node(why);
    }
    if (!topo_node_has_family_shape(node, why, sizeof(why))) printf("note: %s\n", why);
    return topo_show(stdout, node) ? EXIT_USAGE : EXIT_OK;
}

static int cmd_select(const struct topo_node *node, int argc, char **argv) {
    struct topo_plugin_view view = {.gdr = true};
    const char *dir = topo_dir();
    static char nics[1024];
    for (int i = 0; i < node->nnics && view.nnics < TOPO_MAX_NICS; i++)
        view.names[view.nnics++] = node->nics[i].name;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--topo-dir") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--nccl-net") && i + 1 < argc) {
            view.net_version = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--gdr") && i + 1 < argc) {
            view.gdr = strcmp(argv[++i], "0") != 0;
        } else if (!strcmp(argv[i], "--nics") && i + 1 < argc) {
            snprintf(nics, sizeof(nics), "%s", argv[++i]);
            view.nnics = 0;
            for (char *save = NULL, *t = strtok_r(nics, ",", &save);
                 t && view.nnics < TOPO_MAX_NICS; t = strtok_r(NULL, ",", &save))
                view.names[view.nnics++] = t;
        } else {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    char path[PATH_MAX], why[512];
    if (topo_graph_select(node, &view, dir, path, sizeof(path), why, sizeof(why))) {
        printf("refused: %s\n", why);
        return EXIT_CHECK;
    }
    printf("%s\n", path);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    int i = 1;
    char root[PATH_MAX];
    if (i + 1 < argc && !strcmp(argv[i], "--sysfs-root")) {
        /* Symlinks in fixtures resolve to real paths; the root must be spelled the same way. */
        if (!realpath(argv[i + 1], root)) {
            perror(argv[i + 1]);
            return EXIT_USAGE;
        }
        sysfs_set_root(root);
        i += 2;
    }
    if (i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
        usage(stdout);
        return EXIT_OK;
    }
    static struct topo_node node;
    if (scan(&node)) return EXIT_USAGE;
    const char *cmd = argv[i++];
    if (!strcmp(cmd, "generate")) return cmd_generate(&node, argc - i, argv + i);
    if (!strcmp(cmd, "check")) return cmd_check(&node, argc - i, argv + i);
    if (!strcmp(cmd, "show") && i == argc) return cmd_show(&node);
    if (!strcmp(cmd, "select")) return cmd_select(&node, argc - i, argv + i);
    usage(stderr);
    return EXIT_USAGE;
}
