#!/usr/bin/env bash
# The installed topo/ directory holds only what the plugin selects and its README: never the
# files topo/README.md records as broken (<family>-topo.xml makes NCCL 2.22+ fail init,
# <family>-graph.xml claims more bandwidth than NCCL's model), which a user could take for
# the right ones and set as NCCL_TOPO_FILE/NCCL_GRAPH_FILE.
#   test_install_topo.sh BUILD_DIR
set -euo pipefail
BUILD=${1:?usage: test_install_topo.sh BUILD_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$BUILD" --prefix "$tmp/root" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
dir=$(find "$tmp/root" -type d -path '*/nccl-net-erdma/topo')
[ -n "$dir" ] || { echo "FAIL: no nccl-net-erdma/topo directory installed"; exit 1; }
got=$(cd "$dir" && find . -type f | sed 's|^\./||' | sort)
# graph-<cpu>.xml for each CPU kind topo_cpu_kind() names (src/topo.c)
want=$(printf '%s\n' README.md graph-intel-erp.xml graph-intel-spr.xml)
if [ "$got" != "$want" ]; then
    echo "FAIL: installed topo/ differs from what the plugin selects (< installed, > wanted):"
    diff <(echo "$got") <(echo "$want") || true
    exit 1
fi
echo "OK: installed topo/ is $(echo $got)"
