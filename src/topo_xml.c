/*
 * Owns the XML subset shared with NCCL's topology/graph parser: parsing into
 * a tree, building trees, and writing them back. Knows nothing about what the
 * elements mean (topo.c does).
 */
#define _GNU_SOURCE
#include "topo_xml.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Deeper than any topology NCCL writes (system/cpu/pci/.../gpu: under 16): each level is a
 * recursive call, here and in every walk of the tree, so a hostile file must not go deeper. */
#define XML_MAX_DEPTH 32

struct parser {
    const char *p;
    int line;
    int depth;
    char *err;
    size_t errlen;
};

static int fail(struct parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct parser *ps, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (ps->err) snprintf(ps->err, ps->errlen, "line %d: %s", ps->line, msg);
    return -EINVAL;
}

void xml_free(struct xml_node *node) {
    if (!node) return;
    for (int i = 0; i < node->nsubs; i++)
        xml_free(node->subs[i]);
    for (int i = 0; i < node->nattrs; i++) {
        free(node->attrs[i].key);
        free(node->attrs[i].value);
    }
    free(node->name);
    free(node);
}

struct xml_node *xml_add(struct xml_node *parent, const char *name) {
    if (parent && parent->nsubs == XML_MAX_SUBS) return NULL;
    struct xml_node *n = calloc(1, sizeof(*n));
    if (!n) return NULL;
    n->name = strdup(name);
    if (!n->name) {
        free(n);
        return NULL;
    }
    n->parent = parent;
    if (parent) parent->subs[parent->nsubs++] = n;
    return n;
}

const char *xml_get(const struct xml_node *node, const char *key) {
    for (int i = 0; i < node->nattrs; i++)
        if (!strcmp(node->attrs[i].key, key)) return node->attrs[i].value;
    return NULL;
}

static int set_attr(struct xml_node *node, const char *key, const char *value) {
    for (int i = 0; i < node->nattrs; i++) {
        if (strcmp(node->attrs[i].key, key)) continue;
        char *v = strdup(value);
        if (!v) return -ENOMEM;
        free(node->attrs[i].value);
        node->attrs[i].value = v;
        return 0;
    }
    if (node->nattrs == XML_MAX_ATTRS) return -E2BIG;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return -ENOMEM;
    }
    node->attrs[node->nattrs].key = k;
    node->attrs[node->nattrs].value = v;
    node->nattrs++;
    return 0;
}

int xml_set(struct xml_node *node, const char *key, const char *fmt, ...) {
    char value[XML_MAX_STR];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof(value)) return -E2BIG;
    return set_attr(node, key, value);
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Between elements NCCL skips only spaces and line breaks, and whole comments. */
static int skip_space(struct parser *ps) {
    for (;;) {
        char c = *ps->p;
        if (c == ' ' || c == '\r') {
            ps->p++;
        } else if (c == '\n') {
            ps->line++;
            ps->p++;
        } else if (c == '\t') {
            return fail(ps, "tab character (NCCL's parser accepts only spaces and newlines)");
        } else if (!strncmp(ps->p, "<!--", 4)) {
            const char *end = strstr(ps->p + 4, "-->");
            if (!end) return fail(ps, "unterminated comment");
            for (const char *q = ps->p; q < end; q++)
                if (*q == '\n') ps->line++;
            ps->p = end + 3;
        } else {
            return 0;
        }
    }
}

static int read_name(struct parser *ps, char *out, const char *what) {
    size_t n = 0;
    while (name_char(ps->p[n]))
        n++;
    if (n == 0) return fail(ps, "expected %s name", what);
    if (n >= XML_MAX_STR)
        return fail(ps, "%s name longer than %d characters", what, XML_MAX_STR - 1);
    memcpy(out, ps->p, n);
    out[n] = 0;
    ps->p += n;
    return 0;
}

static int parse_attr(struct parser *ps, struct xml_node *node) {
    char key[XML_MAX_STR], value[XML_MAX_STR];
    int rc = read_name(ps, key, "attribute");
    if (rc) return rc;
    if (*ps->p != '=') return fail(ps, "attribute %s: expected '='", key);
    ps->p++;
    char quote = *ps->p;
    if (quote != '"' && quote != '\'') return fail(ps, "attribute %s: value not quoted", key);
    const char *start = ++ps->p;
    const char *end = strchr(start, quote);
    if (!end) return fail(ps, "attribute %s: unterminated value", key);
    size_t n = (size_t)(end - start);
    if (n >= XML_MAX_STR)
        return fail(ps, "attribute %s: value longer than %d characters", key, XML_MAX_STR - 1);
    memcpy(value, start, n);
    value[n] = 0;
    if (strpbrk(value, "<>&\n\r\t"))
        return fail(ps, "attribute %s: value contains a character NCCL does not decode", key);
    if (xml_get(node, key)) return fail(ps, "attribute %s given twice", key);
    if (node->nattrs == XML_MAX_ATTRS)
        return fail(ps, "<%s> has more than %d attributes (NCCL ignores the rest)", node->name,
                    XML_MAX_ATTRS);
    ps->p = end + 1;
    return set_attr(node, key, value) ? fail(ps, "out of memory") : 0;
}

static int parse_element(struct parser *ps, struct xml_node *parent, struct xml_node **out) {
    char name[XML_MAX_STR];
    if (*ps->p != '<') return fail(ps, "expected '<' (text content is not part of NCCL's format)");
    ps->p++;
    if (*ps->p == '?' || *ps->p == '!')
        return fail(ps, "declarations are not accepted by NCCL's parser; start with the element");
    int rc = read_name(ps, name, "element");
    if (rc) return rc;
    if (ps->depth == XML_MAX_DEPTH)
        return fail(ps, "<%s> is nested deeper than %d levels", name, XML_MAX_DEPTH);
    if (parent && parent->nsubs == XML_MAX_SUBS)
        return fail(ps, "<%s> has more than %d children", parent->name, XML_MAX_SUBS);
    struct xml_node *node = xml_add(parent, name);
    if (!node) return fail(ps, "out of memory");
    node->line = ps->line;
    if (!parent) *out = node;

    /* NCCL reads attributes only while the separator is exactly one space. */
    while (*ps->p == ' ') {
        ps->p++;
        rc = parse_attr(ps, node);
        if (rc) return rc;
    }
    if (ps->p[0] == '/' && ps->p[1] == '>') {
        ps->p += 2;
        return 0;
    }
    if (*ps->p != '>') return fail(ps, "<%s>: expected ' ', '/>' or '>'", name);
    ps->p++;
    for (;;) {
        rc = skip_space(ps);
        if (rc) return rc;
        if (!*ps->p) return fail(ps, "<%s> (line %d) is never closed", name, node->line);
        if (ps->p[0] == '<' && ps->p[1] == '/') {
            char close[XML_MAX_STR];
            ps->p += 2;
            rc = read_name(ps, close, "closing");
            if (rc) return rc;
            if (strcmp(close, name))
                return fail(ps, "</%s> closes <%s> (line %d)", close, name, node->line);
            if (*ps->p != '>') return fail(ps, "</%s: expected '>'", close);
            ps->p++;
            return 0;
        }
        ps->depth++;
        rc = parse_element(ps, node, NULL);
        ps->depth--;
        if (rc) return rc;
    }
}

int xml_parse(const char *text, struct xml_node **root, char *err, size_t errlen) {
    struct parser ps = {.p = text, .line = 1, .err = err, .errlen = errlen};
    struct xml_node *top = NULL;
    *root = NULL;
    int rc = skip_space(&ps);
    if (!rc && !*ps.p) rc = fail(&ps, "no element");
    if (!rc) rc = parse_element(&ps, NULL, &top);
    if (!rc) rc = skip_space(&ps);
    if (!rc && *ps.p) rc = fail(&ps, "content after the root element <%s>", top->name);
    if (rc) {
        xml_free(top);
        return rc;
    }
    *root = top;
    return 0;
}

int xml_load(const char *path, struct xml_node **root, char *err, size_t errlen) {
    FILE *f = fopen(path, "re");
    if (!f) {
        int rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    char buf[4096];
    size_t n;
    while (mem && (n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, mem);
    fclose(f);
    if (!mem || fclose(mem)) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    if (strlen(text) != len) {
        free(text);
        snprintf(err, errlen, "%s: contains a NUL byte", path);
        return -EINVAL;
    }
    char why[256];
    int rc = xml_parse(text, root, why, sizeof(why));
    free(text);
    if (rc) snprintf(err, errlen, "%s: %s", path, why);
    return rc;
}

static int write_rec(FILE *out, const struct xml_node *node, int indent) {
    fprintf(out, "%*s<%s", indent, "", node->name);
    for (int i = 0; i < node->nattrs; i++)
        fprintf(out, " %s=\"%s\"", node->attrs[i].key, node->attrs[i].value);
    if (!node->nsubs) {
        fprintf(out, "/>\n");
    } else {
        fprintf(out, ">\n");
        for (int i = 0; i < node->nsubs; i++)
            write_rec(out, node->subs[i], indent + 2);
        fprintf(out, "%*s</%s>\n", indent, "", node->name);
    }
    return ferror(out) ? -EIO : 0;
}

int xml_write(FILE *out, const struct xml_node *node) {
    return write_rec(out, node, 0);
}
