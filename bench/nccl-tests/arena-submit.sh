#!/usr/bin/env bash
# Collective benchmarks on an ACK cluster with Arena, in the style of Alibaba's ACK eRDMA
# guide: WORKERS pods x GPUS GPUs; each pod gets the eRDMA devices through aliyun/erdma.
#   IMAGE=registry.example.com/team/nccl-erdma:latest bench/nccl-tests/arena-submit.sh [OP]
#   MODE=mpijob IMAGE=... bench/nccl-tests/arena-submit.sh all_reduce_perf
# MODE=pytorch (default): `arena submit pytorch`, torchrun + torch_collectives.py (OP:
# all_reduce, all_gather, alltoall, reduce_scatter). MODE=mpijob: nccl-tests binaries
# (OP: all_reduce_perf, ...) through `arena submit mpijob`.
# IMAGE: a training image with this plugin (packaging/Dockerfile), this directory at
# /opt/nccl-erdma/bench, and for mpijob nccl-tests at /opt/nccl-tests/build.
# Flags follow Arena 0.9+; check `arena submit pytorch --help` on older releases.
set -euo pipefail
MODE=${MODE:-pytorch}
IMAGE=${IMAGE:?set IMAGE to a training image with the eRDMA plugin}
WORKERS=${WORKERS:-2}
GPUS=${GPUS:-8}
# shellcheck disable=SC2054 # the commas are inside NCCL_IB_HCA
ENV_FLAGS=(--env=NCCL_NET_PLUGIN=erdma --env=NCCL_IB_HCA=erdma_0,erdma_1
           --env=NCCL_IB_GID_INDEX=1 --env=NCCL_DEBUG=INFO --env=NCCL_DEBUG_SUBSYS=INIT,NET,ENV)

if [ "$MODE" = pytorch ]; then
    OP=${1:-all_reduce}
    NAME=nccl-erdma-torch-${OP//_/-}
    arena submit pytorch \
        --name="$NAME" \
        --workers="$WORKERS" \
        --gpus="$GPUS" \
        --device=aliyun/erdma=1 \
        --image="$IMAGE" \
        "${ENV_FLAGS[@]}" \
        --shm-size=32Gi \
        "nccl-erdma-doctor; torchrun --nnodes=\$WORLD_SIZE --node-rank=\$RANK --nproc-per-node=$GPUS \
           --master-addr=\$MASTER_ADDR --master-port=\$MASTER_PORT \
           /opt/nccl-erdma/bench/torch_collectives.py --op $OP"
else
    OP=${1:-all_reduce_perf}
    NAME=nccl-erdma-${OP//_/-}
    NP=$((WORKERS * GPUS))
    arena submit mpijob \
        --name="$NAME" \
        --workers="$WORKERS" \
        --gpus="$GPUS" \
        --device=aliyun/erdma=1 \
        --image="$IMAGE" \
        "${ENV_FLAGS[@]}" \
        --shm-size=32Gi \
        "mpirun --allow-run-as-root -np $NP -npernode $GPUS --bind-to none \
           -x NCCL_NET_PLUGIN -x NCCL_IB_HCA -x NCCL_IB_GID_INDEX -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS \
           /opt/nccl-tests/build/$OP -b 8 -e 8G -f 2 -g 1"
fi
echo "submitted $NAME; follow it with: arena logs -f $NAME"
echo "then: arena logs $NAME > $NAME.txt && bench/nccl-tests/busbw.py --line-rate-gbps 400 $NAME.txt"
