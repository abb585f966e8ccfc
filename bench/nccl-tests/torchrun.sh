#!/usr/bin/env bash
# The same collectives through PyTorch (torchrun, no MPI), printed in nccl-tests' format so
# busbw.py reads them. Run on every node:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node-0 bench/nccl-tests/torchrun.sh [all_reduce|all_gather|alltoall|reduce_scatter]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.env
. "$HERE/common.env"
OP=${1:-all_reduce}
torchrun --nnodes="${NNODES:-2}" --node-rank="${NODE_RANK:?}" --nproc-per-node="${GPUS:-8}" \
    --master-addr="${MASTER_ADDR:?}" --master-port="${MASTER_PORT:-29500}" \
    "$HERE/torch_collectives.py" --op "$OP" | tee "torch-$OP.txt"
[ "${NODE_RANK}" != 0 ] || "$HERE/busbw.py" --line-rate-gbps "${LINE_RATE_GBPS:-400}" "torch-$OP.txt"
