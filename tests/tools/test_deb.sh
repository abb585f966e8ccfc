#!/usr/bin/env bash
# Builds the .deb with cpack, checks its control fields, unpacks it into a temporary root
# and loads the plugin from there (dlopen + dlsym of every ncclNetPlugin_vN; no devices).
#   test_deb.sh BUILD_DIR            (unit)
#   test_deb.sh BUILD_DIR --install  (VM only: dpkg -i on the VM's throw-away root, then
#                                     NCCL-style dlopen by name and init on rxe0/siw0)
set -euo pipefail
BUILD=${1:?usage: test_deb.sh BUILD_DIR [--install]}
PROBE=${PLUGIN_PROBE:?set by ctest}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The unit run builds the package on the host into BUILD/packages; the VM run installs that
# file (cpack inside the VM would rebuild the tree under emulation: slow and racy).
if [ "${2:-}" != --install ]; then
    rm -rf "$BUILD/packages"
    (cd "$tmp" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$BUILD/packages" >"$tmp/log" 2>&1) ||
        { cat "$tmp/log"; exit 1; }
fi
deb=$(ls "$BUILD"/packages/nccl-net-erdma_*.deb) ||
    { echo "FAIL: no package in $BUILD/packages (the unit test unit_deb builds it first)"; exit 1; }
echo "built $(basename "$deb")"
[ "$(dpkg-deb -f "$deb" Package)" = nccl-net-erdma ]
# (grep -q on a pipe would SIGPIPE dpkg-deb under pipefail: read into variables first)
depends=$(dpkg-deb -f "$deb" Depends)
grep -q 'libibverbs1' <<<"$depends"
grep -q 'librdmacm1' <<<"$depends"
# the C library the plugin was linked against: dpkg must refuse an image whose glibc is older
# (NCCL's dlopen would fail there, and NCCL go on without the plugin)
syms=$(objdump -T "$BUILD/src/libnccl-net-erdma.so")
need=$(grep -o 'GLIBC_[0-9.]*' <<<"$syms" | sed 's/GLIBC_//' | sort -uV | tail -n1)
libc=$(grep -o 'libc6 (>= [0-9.]*)' <<<"$depends") ||
    { echo "FAIL: Depends '$depends' names no libc6 version; the plugin needs glibc $need"; exit 1; }
dpkg --compare-versions "$(sed 's/libc6 (>= \(.*\))/\1/' <<<"$libc")" ge "$need" ||
    { echo "FAIL: Depends has $libc, the plugin needs glibc $need"; exit 1; }
echo "depends: $depends (the plugin's newest glibc symbol: $need)"
contents=$(dpkg-deb -c "$deb")
grep -q '\./usr/lib/libnccl-net-erdma\.so$' <<<"$contents"
grep -q '\./usr/bin/nccl-erdma-doctor$' <<<"$contents"
grep -q '\./usr/share/nccl-net-erdma/topo/graph-intel-spr\.xml$' <<<"$contents"
# never the older files NCCL rejects (topo/README.md; unit_install_topo checks the install tree)
if grep -E '/topo/[^/]*-topo\.xml$|/topo/ebmgn9g' <<<"$contents"; then
    echo "FAIL: the package installs a topology/graph file topo/README.md calls broken"
    exit 1
fi
dpkg-deb -x "$deb" "$tmp/root"
"$PROBE" "$tmp/root/usr/lib/libnccl-net-erdma.so"
LD_LIBRARY_PATH=$tmp/root/usr/lib "$PROBE" libnccl-net-erdma.so
"$tmp/root/usr/bin/nccl-erdma-doctor" --version
# The package installs under /usr, the build was configured for /usr/local: the shipped graphs
# are found beside the installed binaries all the same (a family node's sysfs fixture).
fixture=$(cd "$(dirname "$0")/../fixtures/topo/ebmgn9g" && pwd)
root=$(realpath "$tmp/root")
selected=$(env -u NCCL_ERDMA_TOPO_DIR -u NCCL_CROSS_NIC \
    "$root/usr/bin/nccl-erdma-topo" --sysfs-root "$fixture" select) ||
    { echo "FAIL: the packaged nccl-erdma-topo found no graph: $selected"; exit 1; }
[ "$selected" = "$root/usr/share/nccl-net-erdma/topo/graph-intel-spr.xml" ] ||
    { echo "FAIL: the packaged nccl-erdma-topo selected '$selected'"; exit 1; }
if [ "${2:-}" = --install ]; then
    [ "${RDMA_VM:-}" = 1 ] || { echo "FAIL: --install only inside the RDMA VM (its root is thrown away)"; exit 1; }
    dpkg -i "$deb"
    # the way NCCL finds it with NCCL_NET_PLUGIN=erdma: by name, from the default search path
    out=$("$PROBE" libnccl-net-erdma.so --init)
    echo "$out"
    grep -q "^init 0 devices 2 " <<<"$out"
    [ "$(command -v nccl-erdma-doctor)" = /usr/bin/nccl-erdma-doctor ]
    dpkg -r nccl-net-erdma
fi
echo "deb: OK"
