/*
 * GID table checks for RoCE: which entry to address a peer with. eRDMA's compat
 * mode puts its IPv4-mapped RoCE v2 GID at index 1 (index 0 is fe80:: from the
 * MAC); containers may hide the gid_attrs types, so index 1 is tried first and
 * checked rather than trusted. Pure logic over a snapshot of the table.
 */
#ifndef ERDMA_GID_H
#define ERDMA_GID_H

#include <stdbool.h>
#include <stdint.h>

enum gid_type { GID_TYPE_UNKNOWN = 0, GID_TYPE_IB_ROCE_V1, GID_TYPE_ROCE_V2 };

struct gid_entry {
    uint8_t raw[16];
    enum gid_type type;
    bool valid; /* query succeeded */
};

bool gid_is_zero(const uint8_t raw[16]);
bool gid_is_link_local(const uint8_t raw[16]);
bool gid_is_ipv4_mapped(const uint8_t raw[16]);
void gid_format(const uint8_t raw[16], char *out, int outlen);
enum gid_type gid_type_parse(const char *sysfs_text);

struct gid_choice {
    int index;        /* -1: none usable */
    bool fell_back;   /* the requested index was unusable */
    char reason[160]; /* why the requested index was refused, or why none fits */
};

/*
 * requested: NCCL_IB_GID_INDEX (-1 auto). want_v4: NCCL_IB_ADDR_FAMILY is AF_INET.
 * roce_version: NCCL_IB_ROCE_VERSION_NUM. Auto prefers index 1, then the first
 * entry of the wanted family and RoCE version (unknown type counts as a match).
 */
struct gid_choice gid_select(const struct gid_entry *tbl, int n, int requested, bool want_v4,
                             int roce_version);

#endif
