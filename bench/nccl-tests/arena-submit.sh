#!/usr/bin/env bash
# Collective benchmarks on an ACK cluster with Arena, in the style of Alibaba's ACK eRDMA
# guide: WORKERS pods x GPUS GPUs; each pod gets the eRDMA devices through aliyun/erdma.
#   IMAGE=registry.example.com/team/nccl-erdma:latest bench/nccl-tests/arena-submit.sh [OP]
#   MODE=mpijob IMAGE=... bench/nccl-tests/arena-submit.sh all_reduce_perf
# MODE=pytorch (default): `arena submit pytorch`, torchrun + torch_collectives.py (OP:
# all_reduce, all_gather, alltoall, reduce_scatter). MODE=mpijob: nccl-tests binaries
# (OP: all_reduce_perf, ...) through `arena submit mpijob`.
# IMAGE: a training image with this plugin (packaging/Dockerfile), this directory at
# /opt/nccl-erdma/bench; for mpijob also Open MPI and nccl-tests built with MPI=1 at
# /opt/nccl-tests/build, which packaging/Dockerfile does not build: derive such an image.
# NCCL_IB_HCA: unset, the plugin uses every ACTIVE RDMA port (both eRDMA NICs when the pod
# has both); set it here to choose NICs, by the names `ibv_devices` prints in the pod.
# --hostNetwork puts the pod in the node's network namespace, where the eRDMA netdevs and
# their IPv4 addresses are: the plugin's out-of-band TCP connection uses that address (in a
# pod network set NCCL_SOCKET_IFNAME instead). One such pod per node.
# Memory registration needs an unlimited memlock limit or CAP_IPC_LOCK. Arena sets neither
# for eRDMA (--rdma adds IPC_LOCK but also requests rdma/hca, another device plugin's
# resource), so the pods get the container runtime's limit; the doctor run (MODE=pytorch)
# shows it on its memlock line: on a FAIL raise the runtime's limit on the nodes (containerd:
# LimitMEMLOCK=infinity).
# Flags follow Arena's kubeflow/arena sources (--device needs a recent Arena); check
# `arena submit pytorch --help` on older releases.
set -euo pipefail
MODE=${MODE:-pytorch}
IMAGE=${IMAGE:?set IMAGE to a training image with the eRDMA plugin}
WORKERS=${WORKERS:-2}
GPUS=${GPUS:-8}
# shellcheck disable=SC2054 # the commas are inside NCCL_DEBUG_SUBSYS and NCCL_IB_HCA
ENV_FLAGS=(--env=NCCL_NET_PLUGIN=erdma --env=NCCL_IB_GID_INDEX=1 --env=NCCL_DEBUG=INFO
           --env=NCCL_DEBUG_SUBSYS=INIT,NET,ENV)
X_HCA=""
if [ -n "${NCCL_IB_HCA:-}" ]; then
    ENV_FLAGS+=(--env=NCCL_IB_HCA="$NCCL_IB_HCA")
    X_HCA="-x NCCL_IB_HCA"
fi

if [ "$MODE" = pytorch ]; then
    OP=${1:-all_reduce}
    NAME=nccl-erdma-torch-${OP//_/-}
    arena submit pytorch \
        --name="$NAME" \
        --workers="$WORKERS" \
        --gpus="$GPUS" \
        --device=aliyun/erdma=1 \
        --hostNetwork \
        --image="$IMAGE" \
        "${ENV_FLAGS[@]}" \
        --share-memory=32Gi \
        "nccl-erdma-doctor; torchrun --nnodes=\$WORLD_SIZE --node-rank=\$RANK --nproc-per-node=$GPUS \
           --master-addr=\$MASTER_ADDR --master-port=\$MASTER_PORT \
           /opt/nccl-erdma/bench/torch_collectives.py --op $OP"
else
    # `arena submit mpijob` has no shared-memory flag: /dev/shm is the container runtime's
    # default (often 64 MiB), which NCCL's intra-node SHM transport can outgrow; check
    # `df -h /dev/shm` in a pod, or use MODE=pytorch.
    OP=${1:-all_reduce_perf}
    NAME=nccl-erdma-${OP//_/-}
    NP=$((WORKERS * GPUS))
    arena submit mpijob \
        --name="$NAME" \
        --workers="$WORKERS" \
        --gpus="$GPUS" \
        --device=aliyun/erdma=1 \
        --hostNetwork \
        --image="$IMAGE" \
        "${ENV_FLAGS[@]}" \
        "mpirun --allow-run-as-root -np $NP -npernode $GPUS --bind-to none \
           -x NCCL_NET_PLUGIN $X_HCA -x NCCL_IB_GID_INDEX -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS \
           /opt/nccl-tests/build/$OP -b 8 -e 8G -f 2 -g 1"
fi
echo "submitted $NAME; follow it with: arena logs -f $NAME"
echo "then: arena logs $NAME > $NAME.txt && bench/nccl-tests/busbw.py --line-rate-gbps 400 $NAME.txt"
