/* Owns GID classification and selection; device.c reads the table, conn code uses the index. */
#include "gid.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

bool gid_is_zero(const uint8_t raw[16]) {
    for (int i = 0; i < 16; i++)
        if (raw[i]) return false;
    return true;
}

bool gid_is_link_local(const uint8_t raw[16]) {
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

bool gid_is_ipv4_mapped(const uint8_t raw[16]) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(raw, prefix, 12) && !gid_is_zero(raw);
}

void gid_format(const uint8_t raw[16], char *out, int outlen) {
    char buf[INET6_ADDRSTRLEN];
    if (!inet_ntop(AF_INET6, raw, buf, sizeof(buf))) snprintf(buf, sizeof(buf), "?");
    snprintf(out, outlen, "%s", buf);
}

enum gid_type gid_type_parse(const char *text) {
    if (!text) return GID_TYPE_UNKNOWN;
    if (strstr(text, "RoCE v2")) return GID_TYPE_ROCE_V2;
    if (strstr(text, "IB/RoCE v1") || strstr(text, "RoCE v1")) return GID_TYPE_IB_ROCE_V1;
    return GID_TYPE_UNKNOWN;
}

/* Why entry i cannot carry RoCE traffic for this family/version, or NULL when it can. */
static const char *gid_unusable(const struct gid_entry *e, bool want_v4, int roce_version) {
    if (!e->valid) return "cannot be read";
    if (gid_is_zero(e->raw)) return "is empty";
    if (gid_is_link_local(e->raw)) return "is link-local (fe80::), which RoCE v2 cannot route";
    if (want_v4 && !gid_is_ipv4_mapped(e->raw)) return "is not IPv4-mapped (::ffff:a.b.c.d)";
    if (!want_v4 && gid_is_ipv4_mapped(e->raw)) return "is IPv4-mapped but AF_INET6 was asked";
    if (e->type != GID_TYPE_UNKNOWN) {
        enum gid_type want = roce_version == 1 ? GID_TYPE_IB_ROCE_V1 : GID_TYPE_ROCE_V2;
        if (e->type != want) return roce_version == 1 ? "is not RoCE v1" : "is not RoCE v2";
    }
    return NULL;
}

struct gid_choice gid_select(const struct gid_entry *tbl, int n, int requested, bool want_v4,
                             int roce_version) {
    struct gid_choice c = {.index = -1};

    if (requested >= 0) {
        const char *why = requested >= n ? "is beyond the GID table"
                                         : gid_unusable(&tbl[requested], want_v4, roce_version);
        if (!why) {
            c.index = requested;
            return c;
        }
        c.fell_back = true;
        snprintf(c.reason, sizeof(c.reason), "GID index %d %s", requested, why);
    }
    if (n > 1 && !gid_unusable(&tbl[1], want_v4, roce_version)) {
        c.index = 1;
        return c;
    }
    for (int i = 0; i < n; i++) {
        if (!gid_unusable(&tbl[i], want_v4, roce_version)) {
            c.index = i;
            return c;
        }
    }
    if (!c.fell_back)
        snprintf(c.reason, sizeof(c.reason), "no %s RoCE v%d GID in a table of %d entries",
                 want_v4 ? "IPv4-mapped" : "IPv6", roce_version, n);
    return c;
}
