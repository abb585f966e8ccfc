/*
 * Owns the LL128/MTU check at init and the optional NCCL_PROTO=^LL128 it may
 * set. It reads netdev MTUs from sysfs and NCCL_PROTO through the parameter
 * table; it never changes the MTU, and it never overrides an NCCL_PROTO the
 * user chose.
 */
#include "mtu_guard.h"
#include "device.h"
#include "log.h"
#include "params.h"
#include "sysfs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LL128_SAFE_MTU_JUMBO 8500
#define LL128_SAFE_MTU_SMALL 1400

bool mtu_is_ll128_safe(long mtu) {
    return mtu == LL128_SAFE_MTU_JUMBO || mtu == LL128_SAFE_MTU_SMALL;
}

/*
 * NCCL_PROTO is a comma list of LL, LL128, Simple (case-insensitive); a leading
 * '^' turns it into an exclusion list. NCCL splits it on commas only and compares
 * each piece whole (graph/tuning.cc parseList): " LL128" is no LL128 (NCCL 2.21
 * ignores it, 2.27 and 2.30 fail init on it), so "^LL, LL128" excludes nothing
 * and "Simple, LL128" allows no LL128. Read the same way here: splitting on blanks
 * too called "^LL, LL128" safe while NCCL ran LL128. A per-collective form
 * ("allreduce:...") is not understood here, so it counts as "LL128 may be used":
 * a false alarm is cheaper than silent corruption.
 */
bool nccl_proto_excludes_ll128(const char *proto) {
    if (!proto || !*proto || strchr(proto, ':') || strchr(proto, ';')) return false;
    bool exclude = proto[0] == '^';
    if (exclude) proto++;
    bool listed = false;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", proto);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (!strcasecmp(tok, "LL128")) listed = true;
    return exclude ? listed : !listed;
}

static bool seen_before(const char *const *netdevs, int upto) {
    for (int j = 0; j < upto; j++)
        if (!strcmp(netdevs[j], netdevs[upto])) return true;
    return false;
}

/* Sets NCCL_PROTO=^LL128 unless the user set NCCL_PROTO. NCCL reads NCCL_PROTO when it
 * tunes a communicator, which happens after the network plugin's init. An empty NCCL_PROTO
 * counts as unset (NCCL reads no token from it and keeps its defaults, LL128 included), so
 * it is overwritten: the exclusion is claimed only when setenv put it there. */
static bool exclude_ll128(void) {
    if (param_is_set(P_NCCL_PROTO)) return false;
    return setenv("NCCL_PROTO", "^LL128", 1) == 0;
}

int mtu_guard_check(const char *const *netdevs, int count, enum mtu_guard_mode mode) {
    if (mode == MTU_GUARD_OFF) {
        INFO(NCCL_INIT | NCCL_NET, "NCCL_ERDMA_MTU_GUARD=off: netdev MTUs not checked for LL128");
        return 0;
    }
    const char *proto = param_str(P_NCCL_PROTO);
    bool ll128_off = nccl_proto_excludes_ll128(proto);
    int unsafe = 0;
    for (int i = 0; i < count; i++) {
        const char *nd = netdevs[i];
        long mtu;
        if (!nd || !*nd || seen_before(netdevs, i)) continue;
        int rc = sysfs_read_long(&mtu, "/sys/class/net/%s/mtu", nd);
        if (rc) {
            WARN("MTU guard: cannot read /sys/class/net/%s/mtu (%s); LL128 safety of %s is "
                 "unknown: check that its MTU is 8500 or 1400",
                 nd, strerror(-rc), nd);
            continue;
        }
        if (mtu_is_ll128_safe(mtu)) {
            INFO(NCCL_INIT | NCCL_NET, "%s MTU %ld is safe for LL128", nd, mtu);
            continue;
        }
        if (ll128_off) {
            INFO(NCCL_INIT | NCCL_NET, "%s MTU %ld is not LL128-safe; NCCL_PROTO=%s excludes LL128",
                 nd, mtu, proto);
            continue;
        }
        unsafe++;
        if (mode == MTU_GUARD_DISABLE_LL128 && exclude_ll128()) {
            WARN("%s MTU %ld is neither 8500 nor 1400: LL128 at this MTU is documented to cause "
                 "data consistency problems on eRDMA. NCCL_ERDMA_MTU_GUARD=disable-ll128 set "
                 "NCCL_PROTO=^LL128; to keep LL128 set the MTU to 8500 (ip link set %s mtu 8500) "
                 "or 1400",
                 nd, mtu, nd);
            ll128_off = true;
            proto = "^LL128";
            continue;
        }
        WARN("%s MTU %ld is neither 8500 nor 1400: NCCL's LL128 protocol at this MTU is "
             "documented to cause DATA CONSISTENCY problems on eRDMA. Fix: set the MTU to 8500 "
             "(ip link set %s mtu 8500) or 1400, or exclude LL128 with NCCL_PROTO=^LL128 "
             "(NCCL_ERDMA_MTU_GUARD=disable-ll128 does that when NCCL_PROTO is unset)%s",
             nd, mtu, nd,
             param_is_set(P_NCCL_PROTO) ? "; NCCL_PROTO is set and still allows LL128" : "");
    }
    return unsafe;
}

int mtu_guard_run(void) {
    static const char *const modes[] = {"warn", "disable-ll128", "off", NULL};
    enum mtu_guard_mode mode = (enum mtu_guard_mode)param_choice(P_ERDMA_MTU_GUARD, modes);
    const char *netdevs[ERDMA_MAX_DEVICES];
    int n = 0;
    for (int i = 0; i < devices_count() && n < ERDMA_MAX_DEVICES; i++) {
        struct erdma_device *d = device_get(i);
        if (d && d->netdev[0]) netdevs[n++] = d->netdev;
    }
    return mtu_guard_check(netdevs, n, mode);
}
