/*
 * Topology module: the XML subset, the sysfs scan on fixture nodes
 * (tests/fixtures/topo/<case>, made by make-fixtures.sh), generate -> check
 * round trips, the shipped topo XML files, and the init-time selection.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "log.h"
#include "params.h"
#include "sysfs.h"
#include "topo.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char fixtures[PATH_MAX];  /* .../tests/fixtures/topo */
static char shipped[PATH_MAX];   /* .../topo */
static char old_files[PATH_MAX]; /* .../tests/nccl_graph: the files topo/ shipped before */
static struct topo_node node;

static void use_fixture(const char *name) {
    char path[PATH_MAX * 2], real[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", fixtures, name);
    /* sysfs_realpath strips the root prefix, so the root must be a resolved path. */
    assert_non_null(realpath(path, real));
    sysfs_set_root(real);
    assert_int_equal(topo_scan(&node), 0);
}

static struct xml_node *parse(const char *text) {
    struct xml_node *root = NULL;
    char err[256];
    int rc = xml_parse(text, &root, err, sizeof(err));
    if (rc) print_error("parse: %s\n", err);
    assert_int_equal(rc, 0);
    return root;
}

/* old-ebmgn9g-<kind>.xml: the topology NCCL rejects and the graph it overrates (topo/README.md),
 * kept as fixtures of the checker. */
static struct xml_node *load_old(const char *kind) {
    char path[PATH_MAX * 2], err[512];
    struct xml_node *root = NULL;
    snprintf(path, sizeof(path), "%s/old-ebmgn9g-%s.xml", old_files, kind);
    int rc = xml_load(path, &root, err, sizeof(err));
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    return root;
}

/* ---------- XML subset ---------- */

static void expect_reject(const char *text, const char *why) {
    struct xml_node *root = NULL;
    char err[256] = "";
    assert_int_equal(xml_parse(text, &root, err, sizeof(err)), -EINVAL);
    assert_null(root);
    if (!strstr(err, why)) print_error("got \"%s\", wanted \"%s\"\n", err, why);
    assert_non_null(strstr(err, why));
}

/* A file nested deeper than any topology (a hostile or broken graph in NCCL_ERDMA_TOPO_DIR,
 * or one given to nccl-erdma-topo check) is refused: each level was a recursive call, and
 * 20,000 levels (140 KB) overflowed the stack (SIGSEGV). 32 levels still parse. */
static void test_xml_deep_nesting_refused(void **state) {
    enum { DEEP = 20000 };
    char *text = malloc(DEEP * 7 + 1), *p = text;
    for (int i = 0; i < DEEP; i++)
        p += sprintf(p, "<a>");
    for (int i = 0; i < DEEP; i++)
        p += sprintf(p, "</a>");
    expect_reject(text, "nested deeper than 32 levels");
    p = text;
    for (int i = 0; i < 32; i++)
        p += sprintf(p, "<a>");
    for (int i = 0; i < 32; i++)
        p += sprintf(p, "</a>");
    xml_free(parse(text));
    free(text);
}

static void test_xml_accepts_nccl_subset(void **state) {
    struct xml_node *r = parse("<!-- c -->\n<a x=\"1\" y='two'>\n  <b/>\n  <!-- c2 -->\n"
                               "  <c z=\"\"></c>\n</a>\n");
    assert_string_equal(r->name, "a");
    assert_string_equal(xml_get(r, "x"), "1");
    assert_string_equal(xml_get(r, "y"), "two");
    assert_int_equal(r->nsubs, 2);
    assert_string_equal(r->subs[1]->name, "c");
    assert_string_equal(xml_get(r->subs[1], "z"), "");
    assert_int_equal(r->subs[1]->line, 5);
    assert_ptr_equal(r->subs[0]->parent, r);
    xml_free(r);
}

static void test_xml_rejects_what_nccl_misreads(void **state) {
    expect_reject("<?xml version=\"1.0\"?><a/>", "declarations");
    expect_reject("<a>\n\t<b/>\n</a>", "line 2: tab");
    expect_reject("<a\n x=\"1\"/>", "expected ' ', '/>' or '>'");
    expect_reject("<a  x=\"1\"/>", "expected attribute name");
    expect_reject("<a x=1/>", "not quoted");
    expect_reject("<a><b></a>", "</a> closes <b>");
    expect_reject("<a>text</a>", "text content");
    expect_reject("<a/><b/>", "content after the root");
    expect_reject("<a x=\"1\" x=\"2\"/>", "given twice");
    expect_reject("<a x=\"&amp;\"/>", "does not decode");
    expect_reject("<a>", "never closed");
    expect_reject("", "no element");
    char many[1024] = "<a";
    for (int i = 0; i < 17; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), " k%d=\"v\"", i);
    strcat(many, "/>");
    expect_reject(many, "more than 16 attributes");
    char longv[400];
    snprintf(longv, sizeof(longv), "<a k=\"%0300d\"/>", 0);
    expect_reject(longv, "longer than 254");
}

static void test_xml_write_round_trip(void **state) {
    struct xml_node *r = xml_add(NULL, "system");
    assert_int_equal(xml_set(r, "version", "%d", 1), 0);
    struct xml_node *c = xml_add(r, "cpu");
    assert_int_equal(xml_set(c, "numaid", "0"), 0);
    assert_int_equal(xml_set(c, "numaid", "1"), 0); /* replaces */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    assert_int_equal(xml_write(m, r), 0);
    fclose(m);
    assert_string_equal(text, "<system version=\"1\">\n  <cpu numaid=\"1\"/>\n</system>\n");
    struct xml_node *back = parse(text);
    assert_string_equal(xml_get(back->subs[0], "numaid"), "1");
    free(text);
    xml_free(back);
    xml_free(r);
}

/* ---------- scan ---------- */

static void test_scan_family_node(void **state) {
    static const char *const gpus[] = {"0000:19:00.0", "0000:1a:00.0", "0000:1b:00.0",
                                       "0000:1c:00.0", "0000:99:00.0", "0000:9a:00.0",
                                       "0000:9b:00.0", "0000:9c:00.0"};
    char why[256] = "";
    use_fixture("ebmgn9g");
    /* The ASPEED VGA function (class 0x03, vendor 0x1a03) is not a GPU. */
    assert_int_equal(node.ngpus, 8);
    for (int i = 0; i < 8; i++) {
        assert_string_equal(node.gpus[i].busid, gpus[i]);
        assert_int_equal(node.gpus[i].numa, i < 4 ? 0 : 1);
        assert_int_equal(node.gpus[i].depth, 4);
    }
    assert_int_equal(node.nnics, 2);
    assert_string_equal(node.nics[0].name, "erdma_0");
    assert_string_equal(node.nics[0].busid, "0000:1d:00.0");
    assert_string_equal(node.nics[1].name, "erdma_1");
    assert_string_equal(node.nics[1].busid, "0000:9d:00.0");
    assert_int_equal(node.nother, 0);
    assert_true(topo_node_has_family_shape(&node, why, sizeof(why)));
}

static void expect_shape(const char *fixture, int ngpus, int nnics, const char *why_part) {
    char why[256] = "";
    use_fixture(fixture);
    assert_int_equal(node.ngpus, ngpus);
    assert_int_equal(node.nnics, nnics);
    assert_false(topo_node_has_family_shape(&node, why, sizeof(why)));
    if (!strstr(why, why_part)) print_error("%s: \"%s\"\n", fixture, why);
    assert_non_null(strstr(why, why_part));
}

static void test_scan_other_nodes(void **state) {
    expect_shape("fewer_gpus", 4, 2, "4 NVIDIA GPUs and 2 eRDMA NICs");
    expect_shape("no_erdma", 8, 0, "no eRDMA NIC (RDMA devices: mlx5_0, mlx5_1)");
    expect_shape("one_nic", 8, 1, "8 NVIDIA GPUs and 1 eRDMA NICs");
    expect_shape("empty", 0, 0, "no NVIDIA GPUs");
}

static void test_family_from_instance(void **state) {
    assert_string_equal(topo_family_from_instance("ecs.ebmgn9g.48xlarge"), "ebmgn9g");
    assert_string_equal(topo_family_from_instance("ecs.ebmgn9gc.48xlarge"), "ebmgn9gc");
    assert_string_equal(topo_family_from_instance("ebmgn9ge"), "ebmgn9ge");
    assert_null(topo_family_from_instance("ecs.ebmgn9.48xlarge"));
    assert_null(topo_family_from_instance("ecs.gn7i-c8g1.2xlarge"));
    assert_null(topo_family_from_instance(""));
    assert_null(topo_family_from_instance(NULL));
}

/* ---------- generate and check ---------- */

static struct xml_node *generate_and_reparse(void) {
    struct xml_node *gen;
    assert_int_equal(topo_generate(&node, "test", &gen), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    assert_int_equal(xml_write(m, gen), 0);
    fclose(m);
    xml_free(gen);
    struct xml_node *back = parse(text);
    free(text);
    return back;
}

static void round_trip(const char *fixture) {
    struct topo_err e = {0};
    use_fixture(fixture);
    struct xml_node *topo = generate_and_reparse();
    assert_int_equal(topo_validate_topology(topo, &e), 0);
    int rc = topo_check_node(topo, &node, &e);
    if (rc) print_error("%s:\n%s", fixture, e.text);
    assert_int_equal(rc, 0);
    assert_int_equal(e.count, 0);
    xml_free(topo);
}

static void test_generate_check_round_trip(void **state) {
    round_trip("ebmgn9g");
    round_trip("fewer_gpus");
    round_trip("one_nic");
    round_trip("other_bus");
}

static void test_generate_places_like_nccl(void **state) {
    use_fixture("ebmgn9g");
    struct xml_node *topo = generate_and_reparse();
    /* CPU -> switch upstream port -> endpoints: the downstream ports are skipped. */
    assert_int_equal(topo->nsubs, 2);
    struct xml_node *cpu0 = topo->subs[0], *sw = cpu0->subs[0];
    assert_string_equal(xml_get(cpu0, "numaid"), "0");
    assert_int_equal(cpu0->nsubs, 1);
    assert_string_equal(xml_get(sw, "busid"), "0000:17:00.0");
    assert_int_equal(sw->nsubs, 5);
    assert_string_equal(xml_get(sw->subs[0], "busid"), "0000:19:00.0");
    assert_string_equal(sw->subs[0]->subs[0]->name, "gpu");
    assert_string_equal(xml_get(sw->subs[0]->subs[0], "dev"), "0");
    assert_string_equal(xml_get(sw->subs[4], "busid"), "0000:1d:00.0");
    struct xml_node *net = sw->subs[4]->subs[0]->subs[0];
    assert_string_equal(net->name, "net");
    assert_string_equal(xml_get(net, "name"), "erdma_0");
    assert_string_equal(xml_get(net, "dev"), "0");
    assert_string_equal(xml_get(sw->subs[0], "link_speed"), "32.0 GT/s PCIe");
    assert_string_equal(xml_get(sw->subs[0], "link_width"), "16");
    xml_free(topo);
}

/* A topology NCCL accepts for the family fixture: generated from it (the shipped file lacks the
 * CPU attributes NCCL requires). */
static struct xml_node *family_topology(void) {
    struct xml_node *topo = NULL;
    use_fixture("ebmgn9g");
    assert_int_equal(topo_generate(&node, "ebmgn9g", &topo), 0);
    return topo;
}

static void expect_misfit(const char *fixture, const char *problem) {
    struct topo_err e = {0};
    struct xml_node *topo = family_topology();
    use_fixture(fixture);
    assert_int_equal(topo_check_node(topo, &node, &e), -EINVAL);
    if (!strstr(e.text, problem)) print_error("%s:\n%s", fixture, e.text);
    assert_non_null(strstr(e.text, problem));
    xml_free(topo);
}

static void test_check_rejects_other_nodes(void **state) {
    expect_misfit("other_bus", "gpu 0000:19:00.0 is not on this node");
    expect_misfit("other_bus", "net erdma_0 sits at [cpu 0 > pci 0000:17:00.0 > pci "
                               "0000:1d:00.0] in the file but at [cpu 0 > pci 0000:37:00.0");
    expect_misfit("fewer_gpus", "the file has 8 GPUs, this node has 4");
    expect_misfit("one_nic", "net erdma_1 is not on this node");
    expect_misfit("no_erdma", "the file has 2 eRDMA NICs, this node has 0");
    expect_misfit("empty", "PCI function 0000:17:00.0 does not exist on this node");
}

static void test_check_rejects_wrong_link(void **state) {
    struct topo_err e = {0};
    struct xml_node *topo = family_topology();
    struct xml_node *gpu_pci = topo->subs[1]->subs[0]->subs[2];
    assert_string_equal(xml_get(gpu_pci, "busid"), "0000:9b:00.0");
    assert_int_equal(xml_set(gpu_pci, "link_width", "8"), 0);
    assert_int_equal(topo_check_node(topo, &node, &e), -EINVAL);
    assert_non_null(strstr(e.text, "0000:9b:00.0 link_width=\"8\" but this node says \"16\""));
    xml_free(topo);
}

static void expect_invalid_topo(const char *text, const char *problem) {
    struct topo_err e = {0};
    struct xml_node *topo = parse(text);
    assert_int_equal(topo_validate_topology(topo, &e), -EINVAL);
    if (!strstr(e.text, problem)) print_error("%s", e.text);
    assert_non_null(strstr(e.text, problem));
    xml_free(topo);
}

#define PCI_GPU(b, d)                                                                              \
    "<pci busid=\"" b "\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">"     \
    "<gpu dev=\"" d "\"/></pci>"

static void test_validate_topology_rejects(void **state) {
    expect_invalid_topo("<system version=\"2\"><cpu numaid=\"0\"/></system>", "version 1 only");
    expect_invalid_topo("<graphs version=\"1\"/>", "needs <system>");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\"><socket/></cpu></system>",
                        "<socket> inside <cpu> is ignored");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\" speed=\"1\"/></system>",
                        "NCCL does not read speed= on <cpu>");
    expect_invalid_topo("<system version=\"1\"><cpu/></system>", "<cpu> lacks numaid=");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\">" PCI_GPU("0000:19:00.0", "0")
                            PCI_GPU("0000:19:00.0", "1") "</cpu></system>",
                        "busid 0000:19:00.0 appears twice");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\">" PCI_GPU("0000:19:00.0", "0")
                            PCI_GPU("0000:1a:00.0", "2") "</cpu></system>",
                        "gpu dev=\"2\" is not in 0..1");
    expect_invalid_topo(
        "<system version=\"1\"><cpu numaid=\"0\">" PCI_GPU("0000:1A:00.0", "0") "</cpu></system>",
        "not a lower-case");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:19:00.0\" "
                        "class=\"0x020000\" link_speed=\"9 GT/s\" link_width=\"16\"><gpu "
                        "dev=\"0\"/></pci></cpu></system>",
                        "<gpu> must sit in a <pci> of class 0x03xxxx");
    expect_invalid_topo("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:19:00.0\" "
                        "class=\"0x020000\" link_speed=\"9 GT/s\" link_width=\"16\"/></cpu>"
                        "</system>",
                        "link_speed=\"9 GT/s\" is not one NCCL knows");
}

/* ---------- shipped files ---------- */

static void count_elems(const struct xml_node *n, const char *name, int *count) {
    if (!strcmp(n->name, name)) (*count)++;
    for (int i = 0; i < n->nsubs; i++)
        count_elems(n->subs[i], name, count);
}

static void find_devs(const struct xml_node *n, const char *name, int *mask) {
    if (!strcmp(n->name, name)) *mask |= 1 << atoi(xml_get(n, "dev"));
    for (int i = 0; i < n->nsubs; i++)
        find_devs(n->subs[i], name, mask);
}

static void test_old_files(void **state) {
    use_fixture("ebmgn9g");
    struct topo_err e = {0};
    struct xml_node *topo = load_old("topo");
    struct xml_node *graph = load_old("graph");
    /* NCCL's init fails on the old topology (its CPUs lack arch=, tests/nccl_graph): the
     * check must say so. The graph is well-formed for NCCL's loader. */
    assert_int_equal(topo_validate_topology(topo, &e), -EINVAL);
    assert_non_null(strstr(e.text, "<cpu> lacks arch="));
    memset(&e, 0, sizeof(e));
    int rc = topo_validate_graph(graph, topo, &e);
    if (rc) print_error("%s\n", e.text);
    assert_int_equal(rc, 0);
    assert_string_equal(xml_get(topo, "name"), "ebmgn9g");
    assert_string_equal(xml_get(graph, "name"), "ebmgn9g");

    /* Ids, counted independently of the validator. */
    int gpus = 0, nets = 0, gmask = 0, nmask = 0;
    count_elems(topo, "gpu", &gpus);
    count_elems(topo, "net", &nets);
    find_devs(topo, "gpu", &gmask);
    find_devs(topo, "net", &nmask);
    assert_int_equal(gpus, 8);
    assert_int_equal(nets, 2);
    assert_int_equal(gmask, 0xff);
    assert_int_equal(nmask, 0x3);
    assert_int_equal(graph->nsubs, 2);
    for (int g = 0; g < graph->nsubs; g++) {
        const struct xml_node *gr = graph->subs[g];
        assert_string_equal(xml_get(gr, "id"), g == 0 ? "0" : "1");
        assert_int_equal(atoi(xml_get(gr, "nchannels")), gr->nsubs);
        int used = 0;
        for (int c = 0; c < gr->nsubs; c++) {
            const struct xml_node *ch = gr->subs[c];
            int chmask = 0, nsub = ch->nsubs;
            assert_int_equal(nsub, 10);
            assert_string_equal(ch->subs[0]->name, "net");
            assert_string_equal(ch->subs[nsub - 1]->name, "net");
            assert_string_equal(xml_get(ch->subs[0], "dev"), xml_get(ch->subs[nsub - 1], "dev"));
            used |= 1 << atoi(xml_get(ch->subs[0], "dev"));
            for (int s = 1; s < nsub - 1; s++) {
                assert_string_equal(ch->subs[s]->name, "gpu");
                chmask |= 1 << atoi(xml_get(ch->subs[s], "dev"));
            }
            assert_int_equal(chmask, 0xff);
            /* GPUs 0-3 sit with erdma_0, 4-7 with erdma_1: the head GPU is on its NIC's side. */
            int head = atoi(xml_get(ch->subs[1], "dev"));
            assert_int_equal(head / 4, atoi(xml_get(ch->subs[0], "dev")));
        }
        assert_int_equal(used, 0x3);
    }
    xml_free(topo);
    xml_free(graph);
}

static void expect_invalid_graph(const char *from, const char *to, const char *problem) {
    char path[PATH_MAX * 2];
    snprintf(path, sizeof(path), "%s/old-ebmgn9g-graph.xml", old_files);
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    char text[16384];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    assert_non_null(at);
    char edited[16384];
    snprintf(edited, sizeof(edited), "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    struct xml_node *graph = parse(edited), *topo = load_old("topo");
    struct topo_err e = {0};
    assert_int_equal(topo_validate_graph(graph, topo, &e), -EINVAL);
    if (!strstr(e.text, problem)) print_error("%s", e.text);
    assert_non_null(strstr(e.text, problem));
    xml_free(graph);
    xml_free(topo);
}

static void test_validate_graph_rejects(void **state) {
    expect_invalid_graph("nchannels=\"4\"", "nchannels=\"3\"", "nchannels=\"3\" but 4 <channel>");
    expect_invalid_graph("<gpu dev=\"5\"/>", "", "channel 0 lists 7 GPUs, the topology has 8");
    expect_invalid_graph("<gpu dev=\"5\"/>", "<gpu dev=\"4\"/>", "gpu dev 4 appears twice");
    /* Ring channel 0 starts on GPU 0 (erdma_0's side); hand it erdma_1 instead. */
    expect_invalid_graph("<net dev=\"0\"/>\n      <gpu dev=\"0\"/>\n      <gpu dev=\"1\"/>\n"
                         "      <gpu dev=\"4\"/>",
                         "<net dev=\"1\"/>\n      <gpu dev=\"0\"/>\n      <gpu dev=\"1\"/>\n"
                         "      <gpu dev=\"4\"/>",
                         "channel 0 uses two NICs but crossnic=0");
    /* Ring channel 0 would end on GPU 7, which sends to the network through erdma_0 across
     * the CPUs. */
    expect_invalid_graph("<gpu dev=\"6\"/>\n      <gpu dev=\"7\"/>\n      <gpu dev=\"2\"/>\n"
                         "      <gpu dev=\"3\"/>",
                         "<gpu dev=\"2\"/>\n      <gpu dev=\"3\"/>\n      <gpu dev=\"6\"/>\n"
                         "      <gpu dev=\"7\"/>",
                         "line 3: channel 0: GPU dev 7 and NIC erdma_0 are on different CPUs");
    expect_invalid_graph("<gpu dev=\"7\"/>", "<gpu dev=\"07\"/>", "must be one digit 0-9");
    expect_invalid_graph("pattern=\"4\"", "pattern=\"1\"", "the ring graph (id 0) needs pattern 4");
    expect_invalid_graph("typeintra=\"SYS\"", "typeintra=\"QPI\"", "not a path type NCCL knows");
    /* NCCL 2.21 has no P2C: its loader reads the ring's PIX, so edited, as LOC. */
    expect_invalid_graph("typeinter=\"PIX\"", "typeinter=\"P2C\"",
                         "line 2: typeinter=\"P2C\": NCCL 2.26 and older have no P2C and read it "
                         "as LOC");
    expect_invalid_graph("<graph id=\"1\"", "<graph id=\"0\"", "a second graph with id 0");
    expect_invalid_graph("<channel>", "<channel x=\"1\">", "NCCL does not read x= on <channel>");
    expect_invalid_graph("<graphs version=\"1\"", "<graphs version=\"2\"",
                         "<graphs version=\"2\">: NCCL reads version 1 only");

    struct xml_node *wrong_root = parse("<system version=\"1\"/>"), *topo = load_old("topo");
    struct topo_err e = {0};
    assert_int_equal(topo_validate_graph(wrong_root, topo, &e), -EINVAL);
    assert_non_null(strstr(e.text, "root element is <system>, NCCL_GRAPH_FILE needs <graphs>"));
    xml_free(wrong_root);
    xml_free(topo);
}

static void test_validate_graph_wants_both_nics(void **state) {
    struct topo_err e = {0};
    struct xml_node *topo = load_old("topo");
    struct xml_node *graph = load_old("graph");
    /* Drop the channels on erdma_1 from the ring: what is left is valid but wastes a NIC. */
    struct xml_node *ring = graph->subs[0];
    xml_free(ring->subs[1]);
    xml_free(ring->subs[3]);
    ring->subs[1] = ring->subs[2];
    ring->nsubs = 2;
    assert_int_equal(xml_set(ring, "nchannels", "2"), 0);
    assert_int_equal(topo_validate_graph(graph, topo, &e), -EINVAL);
    assert_int_equal(e.count, 1);
    assert_non_null(strstr(e.text, "graph 0 never uses NIC dev 1"));
    xml_free(graph);
    xml_free(topo);
}

/* ---------- show ---------- */

static void test_show(void **state) {
    use_fixture("ebmgn9g");
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    assert_int_equal(topo_show(m, &node), 0);
    fclose(m);
    assert_non_null(strstr(text, "GPU 0 0000:19:00.0 NUMA 0 -> erdma_0 (PIX)\n"));
    assert_non_null(strstr(text, "GPU 7 0000:9c:00.0 NUMA 1 -> erdma_1 (PIX)\n"));
    free(text);
    use_fixture("one_nic");
    m = open_memstream(&text, &len);
    assert_int_equal(topo_show(m, &node), 0);
    fclose(m);
    assert_non_null(strstr(text, "GPU 7 0000:9c:00.0 NUMA 1 -> erdma_0 (SYS)\n"));
    free(text);
}

/* ---------- automatic selection ---------- */

static char log_text[8192];
static int info_lines;

static void capture(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                    const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t used = strlen(log_text);
    vsnprintf(log_text + used, sizeof(log_text) - used, fmt, ap);
    va_end(ap);
    strncat(log_text, "\n", sizeof(log_text) - strlen(log_text) - 1);
    if (level == NCCL_LOG_INFO) info_lines++;
}

static int select_setup(void **state) {
    unsetenv("NCCL_TOPO_FILE");
    unsetenv("NCCL_GRAPH_FILE");
    unsetenv("NCCL_CROSS_NIC");
    unsetenv("NCCL_ERDMA_TOPO");
    unsetenv("NCCL_ERDMA_INSTANCE_TYPE");
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("NCCL_ERDMA_TOPO_DIR", shipped, 1);
    log_text[0] = 0;
    info_lines = 0;
    erdma_log_set(capture);
    return 0;
}

static int select_teardown(void **state) {
    erdma_log_set(NULL);
    unsetenv("NCCL_TOPO_FILE");
    unsetenv("NCCL_GRAPH_FILE");
    unsetenv("NCCL_CROSS_NIC");
    unsetenv("NCCL_ERDMA_TOPO_DIR");
    unsetenv("NCCL_ERDMA_TOPO");
    unsetenv("NCCL_ERDMA_INSTANCE_TYPE");
    unsetenv("CUDA_VISIBLE_DEVICES");
    params_load();
    return 0;
}

/* The plugin as net.c describes it at init: both NICs, in bus ID order, GPU Direct on. */
static struct topo_plugin_view view;

static void plugin_both_nics(void) {
    view = (struct topo_plugin_view){
        .nnics = 2, .names = {"erdma_0", "erdma_1"}, .gdr = true, .net_version = 12};
}

static int run_select(const char *fixture) {
    use_fixture(fixture);
    params_load();
    return topo_autoselect(&view);
}

static void expect_left_alone(const char *why) {
    assert_null(getenv("NCCL_TOPO_FILE"));
    assert_null(getenv("NCCL_GRAPH_FILE"));
    if (!strstr(log_text, why)) print_error("log: %s\n", log_text);
    assert_non_null(strstr(log_text, why));
}

/* auto never sets a file: on a node where the Intel graph fits, NCCL's own search computes the
 * same graph (tests/nccl_graph), so auto only says that NCCL_ERDMA_TOPO=graph would set it. */
static void test_select_by_shape(void **state) {
    plugin_both_nics();
    assert_int_equal(run_select("ebmgn9g"), 0);
    char want[PATH_MAX * 2];
    snprintf(want, sizeof(want),
             "topology: ebmgn9g-family node (by its shape); NCCL detects the topology and "
             "searches its graphs itself (%s/graph-intel-spr.xml fits: NCCL_ERDMA_TOPO=graph "
             "sets it)",
             shipped);
    expect_left_alone(want);
    assert_int_equal(info_lines, 1);
}

static void test_select_graph_mode(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    assert_int_equal(run_select("ebmgn9g"), 1);
    char want[PATH_MAX * 2];
    snprintf(want, sizeof(want), "%s/graph-intel-spr.xml", shipped);
    assert_null(getenv("NCCL_TOPO_FILE"));
    assert_non_null(getenv("NCCL_GRAPH_FILE"));
    assert_string_equal(getenv("NCCL_GRAPH_FILE"), want);
    assert_non_null(strstr(log_text, "NCCL_ERDMA_TOPO=graph: NCCL_GRAPH_FILE="));
    unsetenv("NCCL_GRAPH_FILE");
    /* Bus numbers do not matter to a graph (NVML's GPU index, the plugin's NIC index). */
    assert_int_equal(run_select("other_bus"), 1);
    assert_string_equal(getenv("NCCL_GRAPH_FILE"), want);
    unsetenv("NCCL_GRAPH_FILE");
}

/* A pod given some of the node's GPUs sees all eight in sysfs, but only its own device nodes
 * (and perhaps CUDA_VISIBLE_DEVICES): NCCL numbers the GPUs it sees 0..n-1, so the graph's gpu
 * dev 4 names none, and NCCL's init failed ("dev 4 not found"). The graph is not set. */
static void test_select_graph_mode_needs_every_gpu(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("this process sees 4 of the node's 8 GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3)");
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7", 1);
    assert_int_equal(run_select("ebmgn9g"), 1);
    unsetenv("NCCL_GRAPH_FILE");
    unsetenv("CUDA_VISIBLE_DEVICES");

    /* the pod's /dev holds nvidia0..3 only: a copy of the fixture with those device nodes */
    char tmp[] = "/tmp/topo-devXXXXXX", cmd[PATH_MAX * 3], real[PATH_MAX];
    assert_non_null(mkdtemp(tmp));
    snprintf(cmd, sizeof(cmd),
             "cp -a %s/ebmgn9g/. %s/ && mkdir %s/dev && touch %s/dev/nvidiactl %s/dev/nvidia0 "
             "%s/dev/nvidia1 %s/dev/nvidia2 %s/dev/nvidia3 %s/dev/nvidia-uvm",
             fixtures, tmp, tmp, tmp, tmp, tmp, tmp, tmp, tmp);
    assert_int_equal(system(cmd), 0);
    assert_non_null(realpath(tmp, real));
    sysfs_set_root(real);
    assert_int_equal(topo_scan(&node), 0);
    params_load();
    log_text[0] = 0;
    assert_int_equal(topo_autoselect(&view), 0);
    expect_left_alone("this process sees 4 of the node's 8 GPUs (4 /dev/nvidiaN device nodes)");
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7", 1); /* says more than the pod has */
    params_load();
    log_text[0] = 0;
    assert_int_equal(topo_autoselect(&view), 0);
    expect_left_alone("this process sees 4 of the node's 8 GPUs (4 /dev/nvidiaN device nodes)");
    unsetenv("CUDA_VISIBLE_DEVICES");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

/* An empty NCCL_GRAPH_FILE is unset to the plugin (params.c, as every parameter) and would make
 * NCCL open "": graph mode replaces it, and the file it logs is the one NCCL reads. */
static void test_select_graph_mode_empty_file(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    setenv("NCCL_GRAPH_FILE", "", 1);
    assert_int_equal(run_select("ebmgn9g"), 1);
    char want[PATH_MAX * 2];
    snprintf(want, sizeof(want), "%s/graph-intel-spr.xml", shipped);
    assert_non_null(getenv("NCCL_GRAPH_FILE"));
    assert_string_equal(getenv("NCCL_GRAPH_FILE"), want);
    if (!strstr(log_text, "(it was set but empty)")) print_error("log: %s\n", log_text);
    assert_non_null(strstr(log_text, "(it was set but empty)"));
    unsetenv("NCCL_GRAPH_FILE");
    /* auto still sets nothing, and leaves the user's empty value as it was. */
    unsetenv("NCCL_ERDMA_TOPO");
    setenv("NCCL_GRAPH_FILE", "", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    assert_string_equal(getenv("NCCL_GRAPH_FILE"), "");
}

/* Every assumption of the graphs, broken one at a time: NCCL_ERDMA_TOPO=graph sets nothing and
 * one INFO line names the assumption. */
static void test_select_graph_refused(void **state) {
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    plugin_both_nics();
    view.gdr = false;
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("no graph set: GPU Direct RDMA is off");
    assert_int_equal(info_lines, 1);

    plugin_both_nics();
    view.nnics = 1; /* NCCL_IB_HCA=erdma_0 */
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("the plugin uses 1 of the node's 2 eRDMA NICs (NCCL_IB_HCA?)");

    plugin_both_nics();
    view.names[0] = "erdma_1"; /* NCCL_IB_DEVICE_PCI_ORDER=0 and libibverbs' order */
    view.names[1] = "erdma_0";
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("plugin device 0 is erdma_1, the graphs' NET 0 is erdma_0");

    plugin_both_nics();
    view.net_version = 8; /* NCCL 2.21 to 2.23 */
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("NCCL loaded ncclNet v8 (NCCL 2.23 or older; v9 came with 2.24)");

    plugin_both_nics();
    assert_int_equal(run_select("one_nic"), 0);
    expect_left_alone("not an ebmgn9g-family node (8 NVIDIA GPUs and 1 eRDMA NICs");

    /* The rings enter on one NIC and leave on the other (crossnic="2"), which NCCL loads
     * whatever NCCL_CROSS_NIC says: a user who pins rails with 0 must not get them. */
    plugin_both_nics();
    setenv("NCCL_CROSS_NIC", "0", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("no graph set: NCCL_CROSS_NIC=0, but the graphs' rings cross NICs");
    for (int v = 1; v <= 2; v++) { /* 1 forces crossing, 2 (the default) allows it */
        char value[2] = {(char)('0' + v), 0};
        setenv("NCCL_CROSS_NIC", value, 1);
        assert_int_equal(run_select("ebmgn9g"), 1);
        assert_non_null(strstr(getenv("NCCL_GRAPH_FILE"), "/graph-intel-spr.xml"));
        unsetenv("NCCL_GRAPH_FILE");
    }
    unsetenv("NCCL_CROSS_NIC");

    /* No graph for this CPU. */
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "/tmp/erdma-topo-cpu-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char cmd[PATH_MAX * 3];
    snprintf(cmd, sizeof(cmd), "cp -r %s/ebmgn9g/. %s/", fixtures, dir);
    assert_int_equal(system(cmd), 0);
    char cpuinfo[PATH_MAX + 32];
    snprintf(cpuinfo, sizeof(cpuinfo), "%s/proc/cpuinfo", dir);
    static const char *const cpus[][2] = {
        {"vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n", "AMD CPU: no graph"},
        {"vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\n",
         "CPU GenuineIntel family 6 model 0x6a has no graph"},
        {"vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n", NULL}, /* ERP */
    };
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(cpuinfo, "w");
        assert_non_null(f);
        fputs(cpus[i][0], f);
        fclose(f);
        sysfs_set_root(dir);
        assert_int_equal(topo_scan(&node), 0);
        params_load();
        log_text[0] = 0;
        int rc = topo_autoselect(&view);
        if (cpus[i][1]) {
            assert_int_equal(rc, 0);
            expect_left_alone(cpus[i][1]);
        } else {
            assert_int_equal(rc, 1);
            assert_non_null(strstr(getenv("NCCL_GRAPH_FILE"), "/graph-intel-erp.xml"));
            unsetenv("NCCL_GRAPH_FILE");
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* No configuration of auto sets a file, whatever the node and the plugin look like. */
static void test_select_auto_never_sets(void **state) {
    static const char *const fixtures_all[] = {"ebmgn9g",    "other_bus", "one_nic",
                                               "fewer_gpus", "no_erdma",  "empty"};
    for (size_t f = 0; f < sizeof(fixtures_all) / sizeof(fixtures_all[0]); f++)
        for (int v = 0; v < 4; v++) {
            plugin_both_nics();
            view.gdr = v & 1;
            view.nnics = v & 2 ? 1 : 2;
            log_text[0] = 0;
            assert_int_equal(run_select(fixtures_all[f]), 0);
            expect_left_alone("topology: ");
        }
}

static void test_select_unknown_instance_type(void **state) {
    setenv("NCCL_ERDMA_INSTANCE_TYPE", "ecs.gn7i-c8g1.2xlarge", 1);
    plugin_both_nics();
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("instance type ecs.gn7i-c8g1.2xlarge is not of the ebmgn9g family");
}

static void test_select_mismatch_instance_type(void **state) {
    /* Told it is an ebmgn9g, but the node disagrees: the graphs' assumptions still must hold. */
    setenv("NCCL_ERDMA_INSTANCE_TYPE", "ecs.ebmgn9g.48xlarge", 1);
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    plugin_both_nics();
    assert_int_equal(run_select("fewer_gpus"), 0);
    expect_left_alone("topology: ebmgn9g node (NCCL_ERDMA_INSTANCE_TYPE); no graph set: 4 NVIDIA "
                      "GPUs and 2 eRDMA NICs");
}

static void test_select_not_family_shape(void **state) {
    plugin_both_nics();
    assert_int_equal(run_select("fewer_gpus"), 0);
    expect_left_alone("not an ebmgn9g-family node (4 NVIDIA GPUs and 2 eRDMA NICs");
    log_text[0] = 0;
    assert_int_equal(run_select("one_nic"), 0);
    expect_left_alone("8 NVIDIA GPUs and 1 eRDMA NICs");
    log_text[0] = 0;
    assert_int_equal(run_select("no_erdma"), 0);
    expect_left_alone("no eRDMA NIC");
    log_text[0] = 0;
    assert_int_equal(run_select("empty"), 0);
    expect_left_alone("no NVIDIA GPUs");
}

static void test_select_user_file_kept(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    setenv("NCCL_TOPO_FILE", "/etc/my-topo.xml", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    assert_string_equal(getenv("NCCL_TOPO_FILE"), "/etc/my-topo.xml");
    /* Never pair the user's topology with our graph. */
    assert_null(getenv("NCCL_GRAPH_FILE"));
    assert_non_null(strstr(log_text, "already set (/etc/my-topo.xml, unset): kept"));
    unsetenv("NCCL_TOPO_FILE");
    setenv("NCCL_GRAPH_FILE", "/etc/my-graph.xml", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    assert_null(getenv("NCCL_TOPO_FILE"));
    assert_string_equal(getenv("NCCL_GRAPH_FILE"), "/etc/my-graph.xml");
}

static void test_select_off(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "off", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("NCCL_ERDMA_TOPO=off");
}

static void test_select_missing_dir(void **state) {
    plugin_both_nics();
    setenv("NCCL_ERDMA_TOPO", "graph", 1);
    setenv("NCCL_ERDMA_TOPO_DIR", "/nonexistent/topo", 1);
    assert_int_equal(run_select("ebmgn9g"), 0);
    expect_left_alone("/nonexistent/topo/graph-intel-spr.xml: No such file or directory");
}

int main(void) {
    const char *base = getenv("ERDMA_FIXTURES");
    if (!base) {
        fprintf(stderr, "ERDMA_FIXTURES is not set (run through ctest)\n");
        return 1;
    }
    snprintf(fixtures, sizeof(fixtures), "%s/topo", base);
    snprintf(shipped, sizeof(shipped), "%s/../../topo", base);
    char real[PATH_MAX];
    if (!realpath(shipped, real)) {
        fprintf(stderr, "no topo/ directory at %s\n", shipped);
        return 1;
    }
    snprintf(shipped, sizeof(shipped), "%s", real);
    snprintf(old_files, sizeof(old_files), "%s/../nccl_graph", base);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_accepts_nccl_subset),
        cmocka_unit_test(test_xml_deep_nesting_refused),
        cmocka_unit_test(test_xml_rejects_what_nccl_misreads),
        cmocka_unit_test(test_xml_write_round_trip),
        cmocka_unit_test(test_scan_family_node),
        cmocka_unit_test(test_scan_other_nodes),
        cmocka_unit_test(test_family_from_instance),
        cmocka_unit_test(test_generate_check_round_trip),
        cmocka_unit_test(test_generate_places_like_nccl),
        cmocka_unit_test(test_check_rejects_other_nodes),
        cmocka_unit_test(test_check_rejects_wrong_link),
        cmocka_unit_test(test_validate_topology_rejects),
        cmocka_unit_test(test_old_files),
        cmocka_unit_test(test_validate_graph_rejects),
        cmocka_unit_test(test_validate_graph_wants_both_nics),
        cmocka_unit_test(test_show),
#define SELECT(f) cmocka_unit_test_setup_teardown(f, select_setup, select_teardown)
        SELECT(test_select_by_shape),
        SELECT(test_select_graph_mode),
        SELECT(test_select_graph_mode_empty_file),
        SELECT(test_select_graph_mode_needs_every_gpu),
        SELECT(test_select_graph_refused),
        SELECT(test_select_auto_never_sets),
        SELECT(test_select_unknown_instance_type),
        SELECT(test_select_mismatch_instance_type),
        SELECT(test_select_not_family_shape),
        SELECT(test_select_user_file_kept),
        SELECT(test_select_off),
        SELECT(test_select_missing_dir),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    sysfs_set_root(NULL);
    return failed;
}
