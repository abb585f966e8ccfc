/*
 * NCCL_IB_HCA parsing and matching with NCCL's semantics:
 *   "^a,b"  exclude devices matching a or b      "=a"  exact name match
 *   "a"     prefix match ("erdma" matches erdma_0) "a:1" only port 1
 *   "a:1:R:P"  port 1, reported as rail R and plane P (NCCL 2.28+'s dev:port:rail:plane;
 *              an empty field is not given: "a:1::P", "a::R")
 * Pure logic: no verbs, no environment.
 */
#ifndef ERDMA_HCA_FILTER_H
#define ERDMA_HCA_FILTER_H

#include <stdbool.h>

#define HCA_FILTER_MAX 32

struct hca_filter {
    bool exclude;
    bool exact;
    int count;
    struct {
        char name[64];
        int port;  /* -1 = any */
        int rail;  /* -1 = not given (NCCL_NET_ID_UNDEF) */
        int plane; /* -1 = not given */
    } entries[HCA_FILTER_MAX];
};

#define HCA_RAIL_MAX  32767           /* railId is an int16_t */
#define HCA_PLANE_MAX ((1 << 14) - 1) /* net_ib keeps bit 14 for fused (virtual) devices */

/* 0, or -EINVAL for a malformed list (message in err). An empty spec keeps every device. */
int hca_filter_parse(const char *spec, struct hca_filter *f, char *err, int errlen);
bool hca_filter_match(const struct hca_filter *f, const char *dev, int port);
/* Whether entry i by itself names dev:port (name and port; rail and plane never match). */
bool hca_filter_entry_match(const struct hca_filter *f, int i, const char *dev, int port);
/* The entry that selects dev:port in an include list (its rail and plane apply), or -1: no
 * entry, an empty list, or an exclude list (as in net_ib, whose devices have no user rail). */
int hca_filter_entry(const struct hca_filter *f, const char *dev, int port);

#endif
