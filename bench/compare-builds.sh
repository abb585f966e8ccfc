#!/usr/bin/env bash
# Does a change cost anything on the data path? Builds the plugin at each git revision given,
# then in ONE boot of the RDMA test VM runs erdma_bench with each build in turn, round after
# round (the emulated VM drifts by 20-40 % within a boot, so builds alternate and the verdict
# is the per-round ratio against the first build, not two separate medians).
#
#   bench/compare-builds.sh e534559^1 e534559 HEAD      # before and after the counters (#15)
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]  the current tree's build, for erdma_bench itself
#   DEV [rxe0]  ROUNDS [16]  LAT_SIZES [8,4K]  LAT_ITERS [5000]
#   BW_SIZES [empty: no bandwidth]  e.g. 64K,1M,16M
#   BENCH_EXTRA [extra erdma_bench flags, every build]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --inside ]; then # ------------------------------------------------ in the VM
  shift
  ulimit -l unlimited
  for r in $(seq 1 "$ROUNDS"); do
    for so in "$@"; do
      name=$(basename "$(dirname "$(dirname "$(dirname "$so")")")")
      echo "### $r $name"
      "$BENCH" -d "$DEV" -p "$so" -m lat -S "$LAT_SIZES" -n "$LAT_ITERS" $BENCH_EXTRA 2>&1 |
        grep -E '^lat |rror' || true
      if [ -n "$BW_SIZES" ]; then
        "$BENCH" -d "$DEV" -p "$so" -m bw -s "$BW_SIZES" $BENCH_EXTRA 2>&1 | grep -E '^bw |rror' || true
      fi
    done
  done
  exit 0
fi

[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
export BUILD_DIR=${BUILD_DIR:-build} DEV=${DEV:-rxe0} ROUNDS=${ROUNDS:-16}
export LAT_SIZES=${LAT_SIZES:-8,4K} LAT_ITERS=${LAT_ITERS:-5000} BW_SIZES=${BW_SIZES:-}
export BENCH_EXTRA=${BENCH_EXTRA:-}
export BENCH=$PWD/$BUILD_DIR/bench/erdma_bench
[ -x "$BENCH" ] || { echo "build the tree first: $BENCH is missing" >&2; exit 1; }
work=$PWD/$BUILD_DIR/compare-builds
mkdir -p "$work"
sos=()
for rev in "$@"; do
  sha=$(git rev-parse --short "$rev")
  dir=$work/$sha
  if [ ! -f "$dir/build/src/libnccl-net-erdma.so" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    git archive "$sha" | tar -x -C "$dir"
    cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$dir/build" -j"$(nproc)" --target nccl-net-erdma >/dev/null
  fi
  echo "build $sha = $rev" >&2
  sos+=("$dir/build/src/libnccl-net-erdma.so")
done
log=$work/last.log
tests/vm/run-in-rdma-vm.sh "$PWD/bench/compare-builds.sh" --inside "${sos[@]}" | tee "$log" |
  grep -E 'rror' >&2 || true
python3 - "$log" <<'EOF'
import statistics, sys
runs, order = {}, []
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith('###'):
        rnd, build = int(f[1]), f[2]
        if build not in order: order.append(build)
    elif f and f[0] == 'lat':   # typical one-way latency, us
        runs[(rnd, build, 'lat', f[1])] = float(f[5])
    elif f and f[0] == 'bw':    # MB/s
        runs[(rnd, build, 'bw', f[1])] = float(f[3])
points = sorted({k[2:] for k in runs}, key=lambda p: (p[0], int(p[1])))
base = order[0]
print('%-4s %9s %-8s %9s %7s %-12s %s' % ('', 'size', 'build', 'median', 'rounds', 'vs ' + base, 'per-round ratio range'))
for kind, size in points:
    for b in order:
        vals = [v for k, v in runs.items() if k[1] == b and k[2:] == (kind, size)]
        if not vals: continue
        ratios = [runs[(r, b, kind, size)] / runs[(r, base, kind, size)]
                  for r in sorted({k[0] for k in runs})
                  if (r, b, kind, size) in runs and (r, base, kind, size) in runs]
        print('%-4s %9s %-8s %9.2f %7d %-12s %.2f-%.2f' % (
            kind, size, b, statistics.median(vals), len(vals),
            '%.3f' % statistics.median(ratios), min(ratios), max(ratios)))
EOF
