/*
 * A strict reader and writer for the XML subset NCCL's topology and graph
 * parser understands (src/graph/xml.cc). Anything NCCL would misread is an
 * error here: an XML declaration, text content, tabs between elements,
 * attributes split across lines or separated by more than one space,
 * unquoted values, names or values of 255 characters or more, more than 16
 * attributes or 128 children. Entities are not decoded (NCCL does not).
 */
#ifndef ERDMA_TOPO_XML_H
#define ERDMA_TOPO_XML_H

#include <stddef.h>
#include <stdio.h>

#define XML_MAX_STR   255 /* NCCL's MAX_STR_LEN, terminator included */
#define XML_MAX_ATTRS 16  /* NCCL's MAX_ATTR_COUNT */
#define XML_MAX_SUBS  128 /* NCCL's MAX_SUBS */

struct xml_attr {
    char *key;
    char *value;
};

struct xml_node {
    char *name;
    int line; /* where it starts in the file; 0 for built nodes */
    int nattrs;
    struct xml_attr attrs[XML_MAX_ATTRS];
    int nsubs;
    struct xml_node *subs[XML_MAX_SUBS];
    struct xml_node *parent;
};

/* Parses one root element. 0, or -EINVAL with "line N: why" in err. */
int xml_parse(const char *text, struct xml_node **root, char *err, size_t errlen);
/* Reads and parses a file. 0 or -errno (err says why). */
int xml_load(const char *path, struct xml_node **root, char *err, size_t errlen);
void xml_free(struct xml_node *node);

/* NULL when absent. */
const char *xml_get(const struct xml_node *node, const char *key);
/* A child element; NULL parent makes a root. NULL on allocation failure or too many children. */
struct xml_node *xml_add(struct xml_node *parent, const char *name);
/* Sets (or replaces) an attribute. 0 or -ENOMEM/-E2BIG. */
int xml_set(struct xml_node *node, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes in NCCL's dump layout: two-space indent, one element per line. */
int xml_write(FILE *out, const struct xml_node *node);

#endif
