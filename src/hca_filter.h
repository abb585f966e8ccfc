/*
 * NCCL_IB_HCA parsing and matching with NCCL's semantics:
 *   "^a,b"  exclude devices matching a or b      "=a"  exact name match
 *   "a"     prefix match ("erdma" matches erdma_0) "a:1" only port 1
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
        int port; /* -1 = any */
    } entries[HCA_FILTER_MAX];
};

/* 0, or -EINVAL for a malformed list (message in err). An empty spec keeps every device. */
int hca_filter_parse(const char *spec, struct hca_filter *f, char *err, int errlen);
bool hca_filter_match(const struct hca_filter *f, const char *dev, int port);

#endif
