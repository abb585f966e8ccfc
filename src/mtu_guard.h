/*
 * The LL128/MTU rule from Alibaba's eRDMA guide: with NCCL's LL128 protocol
 * the netdev MTU must be 8500 or 1400, other values are documented to cause
 * data consistency problems. At init the plugin checks every used device's
 * netdev and warns (or, on request, excludes LL128 through NCCL_PROTO).
 */
#ifndef ERDMA_MTU_GUARD_H
#define ERDMA_MTU_GUARD_H

#include <stdbool.h>

enum mtu_guard_mode { MTU_GUARD_WARN, MTU_GUARD_DISABLE_LL128, MTU_GUARD_OFF };

/* 8500 (jumbo) or 1400: the only MTUs Alibaba documents as safe with LL128. */
bool mtu_is_ll128_safe(long mtu);
/* Whether an NCCL_PROTO value keeps NCCL from using LL128 (NULL or "" does not). */
bool nccl_proto_excludes_ll128(const char *proto);
/*
 * Checks the MTU of each netdev (duplicates checked once) under the sysfs root.
 * Returns how many unsafe netdevs were found while LL128 is still allowed.
 */
int mtu_guard_check(const char *const *netdevs, int count, enum mtu_guard_mode mode);
/* Reads NCCL_ERDMA_MTU_GUARD and checks the netdevs of the discovered devices. */
int mtu_guard_run(void);

#endif
