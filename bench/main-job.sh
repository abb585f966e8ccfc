#!/usr/bin/env bash
# The README's first command: on a fresh machine, install what is needed, build the plugin,
# and run its main job here -- the plugin benchmark beside perftest on soft-RoCE (rxe0)
# and soft-iWARP (siw0) in one boot of the RDMA test VM.
#   bench/main-job.sh [run-vm-bench.sh args, e.g. rxe0]
set -euo pipefail
cd "$(dirname "$0")/.."
tests/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
exec bench/run-vm-bench.sh "$@"
