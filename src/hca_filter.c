/* Owns NCCL_IB_HCA syntax; device.c applies it. */
#include "hca_filter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hca_filter_parse(const char *spec, struct hca_filter *f, char *err, int errlen) {
    memset(f, 0, sizeof(*f));
    if (!spec) return 0;
    while (*spec == ' ')
        spec++;
    if (*spec == '^') {
        f->exclude = true;
        spec++;
    }
    if (*spec == '=') {
        f->exact = true;
        spec++;
    }
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* spaces around an entry ("erdma_0, erdma_1") are no part of a device name */
        while (len > 0 && *p == ' ') {
            p++;
            len--;
        }
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len == 0) {
            p += end ? 1 : 0;
            if (!end) break;
            continue;
        }
        if (f->count == HCA_FILTER_MAX) {
            snprintf(err, errlen, "more than %d entries", HCA_FILTER_MAX);
            return -EINVAL;
        }
        char item[96];
        if (len >= sizeof(item)) {
            snprintf(err, errlen, "entry \"%.*s...\" is too long", 16, p);
            return -EINVAL;
        }
        memcpy(item, p, len);
        item[len] = 0;
        /* dev[:port[:rail[:plane]]] */
        static const struct {
            const char *what;
            long lo, hi;
        } fields[3] = {{"port (want dev:N, N >= 1)", 1, 255},
                       {"rail (want dev:port:R, 0 <= R <= 32767)", 0, HCA_RAIL_MAX},
                       {"plane (want dev:port:rail:P, 0 <= P <= 16383)", 0, HCA_PLANE_MAX}};
        int vals[3] = {-1, -1, -1};
        char whole[96];
        memcpy(whole, item, len + 1); /* for messages: item is cut at each colon */
        char *colon = strchr(item, ':');
        if (colon) *colon = 0;
        for (int k = 0; colon; k++) {
            char *field = colon + 1, *e;
            colon = strchr(field, ':');
            if (colon) *colon = 0;
            if (k == 3) {
                snprintf(err, errlen, "entry \"%s\" has more than dev:port:rail:plane", whole);
                return -EINVAL;
            }
            if (field[0] == 0) continue; /* empty: not given, as NCCL 2.28+ reads it */
            long v = strtol(field, &e, 10);
            if (*e || v < fields[k].lo || v > fields[k].hi) {
                snprintf(err, errlen, "entry \"%s\" has an invalid %s", whole, fields[k].what);
                return -EINVAL;
            }
            vals[k] = (int)v;
        }
        if (!item[0] || strlen(item) >= sizeof(f->entries[0].name)) {
            snprintf(err, errlen, "entry \"%s\" has an invalid device name", item);
            return -EINVAL;
        }
        strcpy(f->entries[f->count].name, item);
        f->entries[f->count].port = vals[0];
        f->entries[f->count].rail = vals[1];
        f->entries[f->count].plane = vals[2];
        f->count++;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

bool hca_filter_entry_match(const struct hca_filter *f, int i, const char *dev, int port) {
    const char *want = f->entries[i].name;
    bool name_ok = f->exact ? !strcmp(dev, want) : !strncmp(dev, want, strlen(want));
    return name_ok && (f->entries[i].port == -1 || f->entries[i].port == port);
}

bool hca_filter_match(const struct hca_filter *f, const char *dev, int port) {
    if (f->count == 0) return true;
    bool any = false;
    for (int i = 0; i < f->count && !any; i++)
        any = hca_filter_entry_match(f, i, dev, port);
    return f->exclude ? !any : any;
}

int hca_filter_entry(const struct hca_filter *f, const char *dev, int port) {
    if (f->exclude) return -1;
    for (int i = 0; i < f->count; i++)
        if (hca_filter_entry_match(f, i, dev, port)) return i;
    return -1;
}
