#!/usr/bin/env bash
# A picture of what a node exporter would scrape: in one boot of the RDMA test VM, run
# erdma_bench (bandwidth, 64 KiB to 64 MiB) with NCCL_ERDMA_STATS_FILE written every second,
# snapshot the files twice a second, and draw the bytes/s per device and direction that
# `rate(erdma_device_bytes_*_total[3s])` would show, as an SVG (bench/stats_graph.py).
#
#   bench/stats-graph.sh [DEV] [OUT.svg]      # default rxe0, docs/img/stats-DEV.svg
set -euo pipefail
if [ "${1:-}" != --inside ]; then
  cd "$(dirname "$0")/.."
  DEV=${1:-rxe0}; OUT=${2:-docs/img/stats-$DEV.svg}
  BUILD_DIR=${BUILD_DIR:-build}
  [ -x "$BUILD_DIR/bench/erdma_bench" ] || { echo "build first: $BUILD_DIR/bench/erdma_bench" >&2; exit 2; }
  SNAP=$BUILD_DIR/stats-graph # under the shared tree: the VM has its own /tmp
  rm -rf "$SNAP" && mkdir -p "$SNAP"
  BUILD_DIR=$BUILD_DIR tests/vm/run-in-rdma-vm.sh bench/stats-graph.sh --inside "$DEV" "$SNAP"
  mkdir -p "$(dirname "$OUT")"
  python3 bench/stats_graph.py "$SNAP" "$OUT" "erdma_bench -m bw on $DEV (soft device in the test VM), $(date -u +%F)"
  echo "wrote $OUT"
  exit 0
fi
# ------------------------------------------------------------ inside the VM
DEV=$2 SNAP=$3
ulimit -l unlimited 2>/dev/null || true
export NCCL_ERDMA_STATS_FILE=/tmp/stats-graph-%p.prom NCCL_ERDMA_STATS_INTERVAL=1
"$BUILD_DIR/bench/erdma_bench" -d "$DEV" -p "$BUILD_DIR/src/libnccl-net-erdma.so" -m bw \
  -s 64K,1M,16M,64M -B 32M > "$SNAP/bench.txt" 2>&1 &
bench=$!
t0=$(date +%s.%N)
while kill -0 "$bench" 2>/dev/null; do
  t=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.2f", a-b}')
  for f in /tmp/stats-graph-*.prom; do [ -e "$f" ] && cp -p "$f" "$SNAP/$t-${f##*/}"; done
  sleep 0.5
done
wait "$bench"
