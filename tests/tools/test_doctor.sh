#!/usr/bin/env bash
# Tests of nccl-erdma-doctor on the fixture trees in tests/fixtures/doctor (see regen.py there).
#   test_doctor.sh CHECK     runs the OK / WARN / FAIL cases of one check (one ctest each)
#   test_doctor.sh json|sync the JSON output; the plugin API list against src/exports.map
# Each case asserts the exit status and one line of output; any miss fails the test.
set -uo pipefail
# shellcheck disable=SC2046,SC2001 # $(tree X) splits into options on purpose
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
DOCTOR=${DOCTOR:-$SRC/tools/nccl-erdma-doctor}
FX=$SRC/tests/fixtures/doctor
[ -x "$DOCTOR" ] || { echo "FAIL: $DOCTOR is not executable"; exit 1; }
unset NCCL_PROTO NCCL_ERDMA_MTU_GUARD NCCL_HOME NCCL_IB_HCA NCCL_IB_GID_INDEX NCCL_IB_ADDR_FAMILY NCCL_IB_ROCE_VERSION_NUM

pass=0 fail=0
# expect NAME RC PATTERN -- ARGS... : the doctor exits RC and prints a line containing PATTERN
expect() {
    local name=$1 want_rc=$2 pattern=$3 out rc
    shift 4
    out=$(timeout 120 "$DOCTOR" "$@" 2>&1) # a check that never ends fails (exit 124)
    rc=$?
    if [ "$rc" != "$want_rc" ]; then
        echo "FAIL $name: exit $rc, expected $want_rc"; echo "$out" | sed 's/^/    /'; fail=$((fail + 1))
    elif ! grep -qF -- "$pattern" <<<"$out"; then
        echo "FAIL $name: no line with '$pattern'"; echo "$out" | sed 's/^/    /'; fail=$((fail + 1))
    else
        echo "ok   $name"; pass=$((pass + 1))
    fi
}
tree() { # the options that point every input at fixture tree $1
    echo "--sysfs-root $FX/$1 --dev-root $FX/$1/dev"
}

case ${1:-} in
plugin)
    # the loader's view: LD_LIBRARY_PATH first, then its cache (ldconfig -p, from --ldconfig)
    libdir=$(mktemp -d) ld=$(mktemp)
    touch "$libdir/libnccl-net-erdma.so"
    printf '\tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1\n\tlibrdmacm.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/librdmacm.so.1\n' >"$ld"
    export NCCL_NET_PLUGIN=erdma
    LD_LIBRARY_PATH=/nonexistent:$libdir expect ok 0 "[OK  ] plugin: NCCL finds $libdir/libnccl-net-erdma.so" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    LD_LIBRARY_PATH= expect fail-not-found 1 "[FAIL] plugin: the loader does not find libnccl-net-erdma.so" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    printf '\tlibnccl-net-erdma.so (libc6,x86-64) => /usr/lib/libnccl-net-erdma.so\n' >>"$ld"
    LD_LIBRARY_PATH= expect ok-cache 0 "[OK  ] plugin: NCCL finds /usr/lib/libnccl-net-erdma.so" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    LD_LIBRARY_PATH= expect fail-no-provider 1 "[FAIL] plugin provider: no erdma provider for libibverbs" -- --only plugin --ldconfig "$ld" $(tree node-fail)
    LD_LIBRARY_PATH= expect fail-no-provider-renamed 1 "[FAIL] plugin provider: no erdma provider for libibverbs" -- --only plugin --ldconfig "$ld" $(tree renamed)
    LD_LIBRARY_PATH= expect ok-no-erdma-device 0 "[OK  ] plugin: NCCL finds" -- --only plugin --ldconfig "$ld" $(tree iwarp)
    printf '\tlibnccl-net-erdma.so (libc6,x86-64) => /usr/lib/libnccl-net-erdma.so\n' >"$ld"
    LD_LIBRARY_PATH= expect fail-no-verbs 1 "[FAIL] plugin libraries: libibverbs.so.1 librdmacm.so.1 not found by the loader" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    printf '\tlibibverbs.so.1 (libc6,x86-64) => /lib/libibverbs.so.1\n\tlibrdmacm.so.1 (libc6,x86-64) => /lib/librdmacm.so.1\n' >"$ld"
    unset NCCL_NET_PLUGIN
    LD_LIBRARY_PATH=$libdir expect warn-unset 0 "[WARN] plugin: NCCL_NET_PLUGIN is not set" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    NCCL_NET_PLUGIN=ib LD_LIBRARY_PATH=$libdir expect warn-other 0 "[WARN] plugin: NCCL_NET_PLUGIN=ib: NCCL loads that plugin" -- --only plugin --ldconfig "$ld" $(tree node-ok)
    rm -rf "$libdir" "$ld"
    ;;
devices)
    expect ok 0 "[OK  ] devices: 2 port(s) ACTIVE: erdma_0:1 erdma_1:1" -- --only devices $(tree node-ok)
    expect warn 0 "[WARN] devices: ACTIVE: erdma_0:1; not active: erdma_1:1(DOWN)" -- --only devices $(tree node-warn)
    expect fail-down 1 "[FAIL] devices: no ACTIVE port: erdma_0:1(DOWN) erdma_1:1(DOWN)" -- --only devices $(tree node-fail)
    expect fail-none 1 "[FAIL] devices: no RDMA device" -- --only devices $(tree empty)
    expect fail-has-fix 1 "fix: on a node: install and load the eRDMA driver" -- --only devices $(tree empty)
    # NCCL_IB_HCA: only the ports the plugin would open count, in NCCL's syntax
    NCCL_IB_HCA=erdma_0 expect hca-leaves-out-down 0 "[OK  ] devices: 1 port(s) ACTIVE: erdma_0:1; NCCL_IB_HCA=erdma_0 leaves out erdma_1:1" -- --only devices $(tree node-warn)
    NCCL_IB_HCA=^erdma_1 expect hca-excludes-down 0 "[OK  ] devices: 1 port(s) ACTIVE: erdma_0:1; NCCL_IB_HCA=^erdma_1 leaves out erdma_1:1" -- --only devices $(tree node-warn)
    NCCL_IB_HCA=erdma_1:1:0:0 expect hca-rail-plane 0 "[OK  ] devices: 1 port(s) ACTIVE: erdma_1:1; NCCL_IB_HCA=erdma_1:1:0:0 leaves out erdma_0:1" -- --only devices $(tree node-ok)
    NCCL_IB_HCA="=erdma" expect hca-exact-none 1 "[FAIL] devices: NCCL_IB_HCA=\"=erdma\" selects no ACTIVE port (none selected; left out: erdma_0:1 erdma_1:1)" -- --only devices $(tree node-ok)
    NCCL_IB_HCA=erdma_1 expect hca-selected-down 1 "[FAIL] devices: NCCL_IB_HCA=\"erdma_1\" selects no ACTIVE port (erdma_1:1(DOWN); left out: erdma_0:1)" -- --only devices $(tree node-warn)
    NCCL_IB_HCA=erdma_0:x expect hca-malformed 1 "[FAIL] devices: NCCL_IB_HCA=\"erdma_0:x\" is malformed (entry \"erdma_0:x\" has an invalid port" -- --only devices $(tree node-ok)
    NCCL_IB_HCA=erdma_0:1:0:0:0 expect hca-too-many-fields 1 "has more than dev:port:rail:plane" -- --only devices $(tree node-ok)
    NCCL_IB_HCA="erdma_0: +1" expect hca-port-as-strtol 0 "[OK  ] devices: 1 port(s) ACTIVE: erdma_0:1; NCCL_IB_HCA=erdma_0: +1 leaves out erdma_1:1" -- --only devices $(tree node-ok)
    NCCL_IB_HCA=erdma_0:0000000001 expect hca-port-zero-padded 0 "[OK  ] devices: 1 port(s) ACTIVE: erdma_0:1;" -- --only devices $(tree node-ok)
    NCCL_IB_HCA=$(printf 'x%d,' $(seq 1 33)) expect hca-too-many-entries 1 "is malformed (more than 32 entries)" -- --only devices $(tree node-ok)
    ;;
devnodes)
    expect ok 0 "[OK  ] devnodes: uverbs0 uverbs1 and rdma_cm accessible" -- --only devnodes $(tree node-ok)
    expect warn-no-rdma_cm 0 "[WARN] devnodes: uverbs0 uverbs1 usable, but" -- --only devnodes $(tree node-warn)
    expect fail-no-dir 1 "[FAIL] devnodes: $FX/node-fail/dev/infiniband does not exist" -- --only devnodes $(tree node-fail)
    expect fail-no-uverbs 1 "[FAIL] devnodes: no uverbs* device node" -- --only devnodes $(tree empty)
    ;;
gid)
    expect ok-roce 0 "[OK  ] gid erdma_1: port 1 GID index 1 = ::ffff:10.0.1.1 (RoCE v2)" -- --only gid $(tree node-ok)
    expect ok-iwarp 0 "[OK  ] gid siw0: iWARP device (node_type RNIC): connects through rdma_cm" -- --only gid $(tree iwarp)
    expect warn-masked-type 0 "[WARN] gid erdma_0: port 1 GID index 1 = ::ffff:10.0.0.1, but its type is unreadable" -- --only gid $(tree node-warn)
    expect fail-zero-gid 1 "[FAIL] gid erdma_0: GID index 1 is '0000:0000:0000:0000:0000:0000:0000:0000'" -- --only gid $(tree node-fail)
    expect fail-roce-v1 1 "[FAIL] gid erdma_1: port 1 GID index 1 = ::ffff:10.0.1.1 is 'IB/RoCE v1'" -- --only gid $(tree node-fail)
    expect fail-iwarp-no-rdma_cm 1 "[FAIL] gid siw0: iWARP device (node_type RNIC) but" -- --only gid --sysfs-root "$FX/iwarp" --dev-root "$FX/node-warn/dev"
    expect skip-no-device 0 "[SKIP] gid: no RDMA device" -- --only gid $(tree empty)
    # the index the plugin takes (src/gid.c): NCCL_IB_GID_INDEX if usable, else 1, else the first
    NCCL_IB_HCA=erdma_0 expect warn-gid-moved 0 "[WARN] gid erdma_0: port 1: GID index 1 is 'IB/RoCE v1', not RoCE v2; the plugin uses GID index 2 = ::ffff:10.0.0.1 (RoCE v2) instead" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=2 expect ok-gid-index-set 0 "[OK  ] gid erdma_0: port 1 GID index 2 = ::ffff:10.0.0.1 (RoCE v2)" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=3 expect warn-gid-index-falls-back 0 "[WARN] gid erdma_0: port 1: NCCL_IB_GID_INDEX=3, but GID index 3 is 'IB/RoCE v1', not RoCE v2; the plugin uses GID index 2" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=3 expect warn-gid-index-fix 0 "fix: set NCCL_IB_GID_INDEX=2, or unset it" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=9 expect fail-gid-index-beyond 1 "[FAIL] gid erdma_0: port 1: NCCL_IB_GID_INDEX=9, but GID index 9 is beyond the GID table (2 entries), and no other GID is usable" -- --only gid $(tree node-fail)
    NCCL_IB_HCA=^erdma_0 expect fail-gid-other-device 1 "[FAIL] gid erdma_1: GID index 1 is '0000:0000:0000:0000:0000:0000:0000:0000'" -- --only gid $(tree gid-moved)
    # values read as the plugin reads them (src/params.c: strtol base 0, range; else ignored)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=02 expect ok-gid-index-leading-zero 0 "[OK  ] gid erdma_0: port 1 GID index 2 = ::ffff:10.0.0.1 (RoCE v2)" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=0x000000002 expect ok-gid-index-zero-padded 0 "[OK  ] gid erdma_0: port 1 GID index 2 = ::ffff:10.0.0.1 (RoCE v2)" -- --only gid $(tree gid-moved)
    NCCL_IB_HCA=erdma_0 NCCL_IB_GID_INDEX=abc expect warn-gid-index-ignored 0 "[WARN] gid: NCCL_IB_GID_INDEX=\"abc\" is not an integer from -1 to 255: the plugin ignores it" -- --only gid $(tree gid-moved)
    NCCL_IB_ADDR_FAMILY=af_inet6 expect fail-gid-family-any-case 1 "[FAIL] gid erdma_0: port 1: GID index 1 is IPv4-mapped but NCCL_IB_ADDR_FAMILY=AF_INET6 asks for another" -- --only gid $(tree node-ok)
    NCCL_IB_ROCE_VERSION_NUM=1 expect fail-gid-roce-v1-asked 1 "GID index 1 is 'RoCE v2', but NCCL_IB_ROCE_VERSION_NUM=1 asks for RoCE v1, and no other GID is usable" -- --only gid $(tree node-ok)
    NCCL_IB_HCA="=erdma" expect skip-gid-none-selected 0 "[SKIP] gid: NCCL_IB_HCA=\"=erdma\" selects no RDMA port" -- --only gid $(tree node-ok)
    ;;
mtu)
    expect ok-8500 0 "[OK  ] mtu eth0: MTU 8500 (device erdma_0) is safe for LL128" -- --only mtu $(tree node-ok)
    expect ok-1400 0 "[OK  ] mtu eth1: MTU 1400 (device erdma_1) is safe for LL128" -- --only mtu $(tree node-ok)
    expect ok-iwarp-by-mac 0 "[OK  ] mtu eth1: MTU 1400 (device siw0)" -- --only mtu $(tree iwarp)
    NCCL_PROTO=^LL128 expect warn-proto-excludes 0 "[WARN] mtu eth0: MTU 1500 (device erdma_0) is neither 8500 nor 1400; LL128 is excluded by NCCL_PROTO=^LL128" -- --only mtu $(tree node-warn)
    NCCL_PROTO=LL,Simple expect warn-proto-list 0 "LL128 is excluded by NCCL_PROTO=LL,Simple" -- --only mtu $(tree node-warn)
    NCCL_ERDMA_MTU_GUARD=disable-ll128 expect warn-guard 0 "LL128 is excluded by NCCL_ERDMA_MTU_GUARD=disable-ll128" -- --only mtu $(tree node-warn)
    expect fail-1500 1 "[FAIL] mtu eth0: MTU 1500 (device erdma_0) is neither 8500 nor 1400" -- --only mtu $(tree node-warn)
    expect fail-9000 1 "[FAIL] mtu eth1: MTU 9000 (device erdma_1)" -- --only mtu $(tree node-fail)
    NCCL_PROTO=LL128,Simple expect fail-proto-allows 1 "[FAIL] mtu eth0: MTU 1500" -- --only mtu $(tree node-warn)
    NCCL_PROTO=^LL expect fail-proto-excludes-other 1 "[FAIL] mtu eth0: MTU 1500" -- --only mtu $(tree node-warn)
    # split and compared as NCCL and the plugin's guard do (src/mtu_guard.c: commas only,
    # whole pieces, any case)
    NCCL_PROTO="^LL, LL128" expect fail-proto-blank-is-no-ll128 1 "[FAIL] mtu eth0: MTU 1500" -- --only mtu $(tree node-warn)
    NCCL_PROTO="Simple, LL128" expect warn-proto-blank-allows-none 0 "LL128 is excluded by NCCL_PROTO=Simple, LL128" -- --only mtu $(tree node-warn)
    NCCL_ERDMA_MTU_GUARD=DISABLE-LL128 expect warn-guard-any-case 0 "LL128 is excluded by NCCL_ERDMA_MTU_GUARD=DISABLE-LL128" -- --only mtu $(tree node-warn)
    ;;
memlock)
    expect ok 0 "[OK  ] memlock: locked-memory limit is unlimited" -- --only memlock --memlock unlimited
    expect warn 0 "[WARN] memlock: locked-memory limit is 1048576 KiB" -- --only memlock --memlock 1048576 --capeff 0
    expect fail-docker-default 1 "[FAIL] memlock: locked-memory limit is 8192 KiB: memory registration will fail with 'Cannot allocate memory'" -- --only memlock --memlock 8192 --capeff 0
    expect fail-has-fix 1 "IPC_LOCK, SYS_RESOURCE" -- --only memlock --memlock 64 --capeff 0000000000000000
    # CAP_IPC_LOCK (bit 14) lifts the limit: a pod that added it was told registration fails
    expect ok-ipc-lock 0 "[OK  ] memlock: locked-memory limit is 64 KiB, but this process holds CAP_IPC_LOCK" -- --only memlock --memlock 64 --capeff 0000000000004000
    expect ok-root 0 "holds CAP_IPC_LOCK" -- --only memlock --memlock 8192 --capeff 000001ffffffffff
    expect fail-other-caps 1 "[FAIL] memlock" -- --only memlock --memlock 8192 --capeff 00000000a80425fb
    expect skip-garbage 0 "[SKIP] memlock: cannot parse" -- --only memlock --memlock lots --capeff 0
    cap=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    expect real-ulimit "$([ "$(ulimit -l)" = unlimited ] || [ "$(ulimit -l)" -ge 65536 ] || (((16#${cap: -8} >> 14) & 1)) && echo 0 || echo 1)" "memlock: locked-memory limit is $(ulimit -l)" -- --only memlock
    ;;
gpudirect)
    expect ok-nv_mem 0 "[OK  ] gpudirect: GPU peer memory present (nv_mem 1.0-0)" -- --only gpudirect $(tree node-ok)
    expect ok-module 0 "[OK  ] gpudirect: GPU peer memory present (nvidia_peermem loaded)" -- --only gpudirect $(tree iwarp)
    nc=$(mktemp -d) # peer memory as nv_mem_nc only (NCCL's gdr.cc accepts it)
    cp -r "$FX/acs-short/." "$nc" && mkdir -p "$nc/sys/kernel/mm/memory_peers/nv_mem_nc" &&
        echo 1.0-0 >"$nc/sys/kernel/mm/memory_peers/nv_mem_nc/version"
    expect ok-nv_mem_nc 0 "[OK  ] gpudirect: GPU peer memory present (nv_mem_nc 1.0-0)" -- --only gpudirect --sysfs-root "$nc" --dev-root "$nc/dev"
    rm -rf "$nc"
    expect warn-no-gpu 0 "[WARN] gpudirect: no NVIDIA driver loaded" -- --only gpudirect $(tree node-warn)
    expect warn-dmabuf 0 "[WARN] gpudirect: NVIDIA driver loaded but no peer memory (nvidia_peermem); non-eRDMA devices may still use dma-buf" -- --only gpudirect $(tree acs-short)
    expect fail-erdma 1 "[FAIL] gpudirect: NVIDIA driver loaded but no peer memory (nvidia_peermem): eRDMA cannot register GPU memory" -- --only gpudirect $(tree node-fail)
    # eRDMA known by its driver: rdma-core's persistent naming may call it rocep5s0
    expect fail-erdma-renamed 1 "[FAIL] gpudirect: NVIDIA driver loaded but no peer memory (nvidia_peermem): eRDMA cannot register GPU memory" -- --only gpudirect $(tree renamed)
    ;;
acs)
    expect ok 0 "[OK  ] acs: no ACS source validation on the bridges above 3 GPU/NIC device(s)" -- --only acs $(tree node-ok)
    expect warn-no-pci 0 "[WARN] acs: no PCI GPU or RDMA NIC found" -- --only acs $(tree node-warn)
    expect warn-not-root 0 "[WARN] acs: PCIe config space of 0000:00:01.0 not readable" -- --only acs $(tree acs-short)
    expect fail 1 "[FAIL] acs: PCIe ACS source validation on (SrcValid+) on bridge(s) 0000:01:00.0 0000:00:01.0" -- --only acs $(tree node-fail)
    # a bridge whose extended capability chain points back at itself: the walk never ended
    loop=$(mktemp -d)
    cp -a "$FX/node-ok" "$loop/"
    python3 -c 'import struct, sys
cs = bytearray(4096)
cs[0:4] = struct.pack("<HH", 0x8086, 0x1234)
cs[0x100:0x104] = struct.pack("<I", 0x0001 | (1 << 16) | (0x100 << 20))  # AER, next: itself
open(sys.argv[1], "wb").write(cs)' "$loop/node-ok/sys/devices/pci0000:00/0000:00:01.0/config"
    expect loop-ends 0 "[OK  ] acs:" -- --only acs --sysfs-root "$loop/node-ok" --dev-root "$loop/node-ok/dev"
    rm -rf "$loop"
    ;;
nccl)
    expect ok-v11 0 "[OK  ] nccl: NCCL 2.28.9 ($FX/node-ok/lib/libnccl.so.2) will load ncclNetPlugin_v11" -- --only nccl --nccl-lib "$FX/node-ok/lib/libnccl.so.2"
    expect ok-strings-v12 0 "[OK  ] nccl: NCCL 2.30.1 ($FX/node-ok/lib-strings/libnccl.so.2) will load ncclNetPlugin_v12" -- --only nccl --nccl-lib "$FX/node-ok/lib-strings/libnccl.so.2"
    NCCL_HOME=$FX/node-ok expect ok-nccl_home 0 "NCCL 2.28.9 ($FX/node-ok/lib/libnccl.so.2) will load ncclNetPlugin_v11" -- --only nccl --ldconfig /dev/null
    ld=$(mktemp)
    printf '\tlibnccl.so.2 (libc6,x86-64) => %s\n' "$FX/node-fail/lib/libnccl.so.2" >"$ld"
    expect fail-ldconfig-2.18 1 "[FAIL] nccl: NCCL 2.18.5 ($FX/node-fail/lib/libnccl.so.2) asks for plugin API v6 or older" -- --only nccl --ldconfig "$ld" $(tree empty)
    # pip's nvidia-nccl (PyTorch's wheels load it) comes before the loader's cache
    pip=$FX/renamed/usr/local/lib/python3.10/dist-packages/nvidia/nccl/lib/libnccl.so.2
    expect ok-pip 0 "[OK  ] nccl: NCCL 2.27.7 ($pip) will load ncclNetPlugin_v10" -- --only nccl --ldconfig "$ld" $(tree renamed)
    # ... and a loader's NCCL of another version (2.18.5 here) is named beside it
    expect warn-two-nccls 0 "[WARN] nccl two NCCLs: pip's nvidia-nccl is NCCL 2.27.7 ($pip, which PyTorch loads); the loader's is NCCL 2.18.5 ($FX/node-fail/lib/libnccl.so.2" -- --only nccl --ldconfig "$ld" $(tree renamed)
    rm -f "$ld"
    expect warn-not-found 0 "[WARN] nccl: libnccl.so.2 not found" -- --only nccl --ldconfig /dev/null $(tree empty)
    ;;
topology)
    # the real nccl-erdma-topo (TOPO_TOOL_BIN, from the build) on its own fixture trees: the
    # doctor ran 'check' without a file, which the tool answers with its usage (a FAIL on
    # every node), and its tests used stand-ins that accepted it
    [ -x "${TOPO_TOOL_BIN:-}" ] || { echo "FAIL: TOPO_TOOL_BIN (the built nccl-erdma-topo) is not set"; exit 1; }
    tfx=$SRC/tests/fixtures/topo
    real() { echo "--only topology --topo-tool $TOPO_TOOL_BIN --sysfs-root $tfx/$1"; }
    unset NCCL_TOPO_FILE NCCL_GRAPH_FILE
    expect ok-unset 0 "[OK  ] topology: NCCL_TOPO_FILE and NCCL_GRAPH_FILE unset: NCCL detects the topology itself; 8 GPU(s)" -- $(real ebmgn9g)
    expect ok-unset-other-node 0 "(not an ebmgn9g-family node: no NVIDIA GPUs" -- $(real empty)
    export NCCL_TOPO_FILE=$SRC/tests/nccl_graph/old-ebmgn9g-topo.xml
    expect fail-topo 1 "lacks arch=" -- $(real ebmgn9g)
    expect fail-topo-fix 1 "fix: fix or unset NCCL_TOPO_FILE" -- $(real ebmgn9g)
    unset NCCL_TOPO_FILE
    export NCCL_GRAPH_FILE=$SRC/topo/graph-intel-spr.xml
    expect ok-graph 0 "graph-intel-spr.xml: OK" -- $(real ebmgn9g)
    expect fail-graph-other-node 1 "NCCL_GRAPH_FILE=$SRC/topo/graph-intel-spr.xml is set, but this node's topology cannot be read" -- $(real empty)
    unset NCCL_GRAPH_FILE
    expect skip-loud 0 "(SKIPPED: not checked, not counted as passing)" -- --only topology --topo-tool "$FX/absent"
    expect skip-summary 0 "WARNING: 1 check(s) SKIPPED: not verified" -- --only topology --topo-tool "$FX/absent"
    ;;
json)
    ld=$(mktemp)
    printf '\t%s (libc6,x86-64) => /usr/lib/%s\n' libnccl-net-erdma.so libnccl-net-erdma.so \
        libibverbs.so.1 libibverbs.so.1 librdmacm.so.1 librdmacm.so.1 >"$ld"
    out=$(NCCL_NET_PLUGIN=erdma LD_LIBRARY_PATH= "$DOCTOR" --json $(tree node-fail) --memlock unlimited --ldconfig "$ld" --nccl-lib "$FX/node-fail/lib/libnccl.so.2" --topo-tool "$FX/topo-ok")
    rc=$?
    rm -f "$ld"
    if [ $rc = 1 ] && python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["tool"] == "nccl-erdma-doctor", d
s = d["summary"]
assert (s["ok"], s["warn"], s["fail"], s["skip"]) == (3, 0, 10, 0), s
names = {c["check"] for c in d["checks"]}
assert names == {"plugin", "devices", "devnodes", "gid", "mtu", "memlock", "gpudirect", "acs", "nccl", "topology"}, names
for c in d["checks"]:
    assert c["status"] in ("OK", "WARN", "FAIL", "SKIP"), c
    assert c["status"] != "FAIL" or c["fix"], c
mtu = [c for c in d["checks"] if c["check"] == "mtu" and c["subject"] == "eth1"]
assert mtu and mtu[0]["status"] == "FAIL" and "9000" in mtu[0]["message"], mtu
' "$out"; then
        echo "ok   json"; pass=$((pass + 1))
    else
        echo "FAIL json (exit $rc): $out"; fail=$((fail + 1))
    fi
    expect bad-usage 2 "unknown check 'nope'" -- --only nope
    ;;
sync)
    exported=$(sed -n 's/^ *ncclNetPlugin_v\([0-9]*\);/\1/p' "$SRC/src/exports.map" | sort -n | tr '\n' ' ')
    listed=$(sed -n 's/^PLUGIN_API_VERSIONS="\(.*\)"/\1/p' "$DOCTOR" | tr ' ' '\n' | sort -n | tr '\n' ' ')
    if [ -n "$exported" ] && [ "$exported" = "$listed" ]; then
        echo "ok   sync: v$exported"; pass=$((pass + 1))
    else
        echo "FAIL sync: exports.map has '$exported', the doctor lists '$listed'"; fail=$((fail + 1))
    fi
    ;;
*)
    echo "usage: $0 plugin|devices|devnodes|gid|mtu|memlock|gpudirect|acs|nccl|topology|json|sync" >&2
    exit 2
    ;;
esac
echo "$1: $pass passed, $fail failed"
[ $fail = 0 ] && [ $pass -gt 0 ]
