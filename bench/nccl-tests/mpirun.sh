#!/usr/bin/env bash
# nccl-tests with plain Open MPI over two or more eRDMA nodes, one rank per GPU.
#   HOSTS=node-0:8,node-1:8 NCCL_TESTS=/opt/nccl-tests/build bench/nccl-tests/mpirun.sh [TEST...]
# Default: all four tests. Output goes to results/<test>-<date>.txt, and a bus-bandwidth
# table against LINE_RATE_GBPS (default 400 = 2 x 200 Gbit/s eRDMA NICs) is printed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.env
. "$HERE/common.env"
HOSTS=${HOSTS:?set HOSTS=host:slots,host:slots}
NCCL_TESTS=${NCCL_TESTS:-/opt/nccl-tests/build}
LINE_RATE_GBPS=${LINE_RATE_GBPS:-400}
NP=0
IFS=, read -r -a hs <<<"$HOSTS"
for h in "${hs[@]}"; do NP=$((NP + ${h##*:})); done
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(all_reduce_perf all_gather_perf alltoall_perf reduce_scatter_perf)
mkdir -p results
for t in "${TESTS[@]}"; do
    out=results/$t-$(date +%Y%m%d-%H%M).txt
    mpirun --allow-run-as-root -np "$NP" -H "$HOSTS" --bind-to none \
        -x NCCL_NET_PLUGIN -x NCCL_IB_HCA -x NCCL_IB_GID_INDEX -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS \
        -x NCCL_PROTO -x NCCL_ERDMA_MTU_GUARD -x LD_LIBRARY_PATH \
        "$NCCL_TESTS/$t" -b 8 -e 8G -f 2 -g 1 | tee "$out"
    grep -E "NET/Plugin|NET/eRDMA : Using" "$out" | head -n 3 || echo "WARNING: no eRDMA lines in $out: did NCCL load the plugin?"
    "$HERE/busbw.py" --line-rate-gbps "$LINE_RATE_GBPS" "$out"
done
