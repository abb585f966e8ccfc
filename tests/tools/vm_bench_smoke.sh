#!/usr/bin/env bash
# In the RDMA VM: the README's main job in miniature. erdma_bench moves (and checks) data
# through the plugin on rxe0 and siw0, and verbs_floor runs each of its modes on rxe0
# (latency, and net_ib's algorithm's bandwidth);
# every run must print its result row. A missing device or a malformed number fails plainly.
#   vm_bench_smoke.sh ERDMA_BENCH VERBS_FLOOR PLUGIN
set -uo pipefail
BENCH=$1 FLOOR=$2 PLUGIN=$3
fail=0
ulimit -l unlimited 2>/dev/null || true

expect_row() { # label, awk condition on the output, command...
  local label=$1 cond=$2 out rc
  shift 2
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ $rc = 0 ] && echo "$out" | awk "$cond {found = 1} END {exit !found}"; then
    echo "PASS $label"
  else
    echo "FAIL $label (exit $rc):"; echo "$out" | tail -n 15 | sed 's/^/    /'; fail=1
  fi
}

for mode in write imm imm+cts netib; do
  expect_row "verbs_floor $mode on rxe0" "\$1 == \"$mode\" && \$2 == 8 && \$7 > 0" \
    "$FLOOR" -d rxe0 -m "$mode" -s 8 -n 200
done
# net_ib's algorithm: a sender that waits for each clear-to-send (depth 1 puts that wait in
# every round trip), and its bandwidth mode at depths 1 and 16, a message split in four
# writes (-M) too; the receiver checks that the last message's first and last bytes landed.
expect_row "verbs_floor netib, 1 receive posted, on rxe0" '$1 == "netib" && $2 == 8 && $7 > 0' \
  "$FLOOR" -d rxe0 -m netib -s 8 -n 200 -D 1
for args in "-D 1" "-D 16" "-D 4 -M 262144"; do
  # shellcheck disable=SC2086
  expect_row "verbs_floor netib bandwidth $args on rxe0" \
    '$1 == "netib-bw" && $2 == 1048576 && $3 == 16 && $4 > 0' \
    "$FLOOR" -d rxe0 -m netib -b -s 1048576 -n 16 $args
done
out=$("$FLOOR" -d rxe0 -m imm+cts -b 2>&1) && { echo "FAIL verbs_floor -b accepted imm+cts"; fail=1; }
if echo "$out" | grep -q 'runs net_ib.s algorithm only'; then
  echo "PASS verbs_floor -b names the one mode it runs"
else
  echo "FAIL verbs_floor -b -m imm+cts said: $out"; fail=1
fi
for dev in rxe0 siw0; do
  expect_row "erdma_bench latency on $dev" '$1 == "lat" && $2 == 8 && $7 > 0' \
    "$BENCH" -p "$PLUGIN" -d "$dev" -m lat -S 8,4K -n 200 -t 60
  expect_row "erdma_bench bandwidth on $dev" '$1 == "bw" && $2 == 1048576 && $4 > 0' \
    "$BENCH" -p "$PLUGIN" -d "$dev" -m bw -s 64K,1M -B 8M -t 60
done

out=$("$FLOOR" -d no_such_dev -n 10 2>&1) && { echo "FAIL verbs_floor accepted a missing device"; fail=1; }
if echo "$out" | grep -q "cannot open RDMA device no_such_dev"; then
  echo "PASS verbs_floor names a missing device"
else
  echo "FAIL verbs_floor on a missing device said: $out"; fail=1
fi
out=$("$FLOOR" -d rxe0 -n 12x 2>&1) && { echo "FAIL verbs_floor accepted -n 12x"; fail=1; }
if echo "$out" | grep -q 'wants a number in 1 .. 100000, not "12x"'; then
  echo "PASS verbs_floor rejects a malformed number"
else
  echo "FAIL verbs_floor on -n 12x said: $out"; fail=1
fi

# A peer that never comes: the bench gives up at its deadline (-t, read from the cycle
# counter) and says where it waited, rather than spinning on. `timeout 60` is only the
# backstop that turns a hang into this check's failure.
hs=$(mktemp)
out=$(timeout 60 "$BENCH" -p "$PLUGIN" -d rxe0 --server="$hs" -t 2 2>&1); rc=$?
rm -f "$hs"
if [ $rc != 0 ] && [ $rc != 124 ] && echo "$out" | grep -q 'timeout after 2 s in accept'; then
  echo "PASS erdma_bench gives up on a client that never connects"
else
  echo "FAIL erdma_bench without a client (exit $rc) said: $(echo "$out" | tail -n 3)"; fail=1
fi

# The main job's own script, in miniature (one size, one round per mode, both devices): it
# runs the plugin size by size between perftest and the floor and builds the tables from
# the pieces; every plugin cell (and rxe0's floor cells) must hold a number: bandwidth and
# latency on both devices, and rxe0's latency by t_typical. perftest's own
# cells are not judged: under emulation it fails now and then, and the script says so.
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$(dirname "$BENCH")/.." && pwd)
out=$(cd "$REPO" && BUILD_DIR=$BUILD BW_SIZES=64K LAT_SIZES=8 BW_ROUNDS=1 LAT_ROUNDS=1 \
  BW_BYTES=1M LAT_ITERS=200 FLOOR_MODE=netib timeout 240 bench/run-vm-bench.sh --inside rxe0 siw0 2>&1)
rc=$?
rows=$(echo "$out" | awk -F'|' '
  /^### / {dev = $0; sub(/^### /, "", dev); sub(/:.*/, "", dev)
           kind = ($0 ~ /bandwidth/) ? "bw" : ($0 ~ /t_typical/) ? "typical" : "lat"}
  /^\| [0-9]/ {
    # siw0 has no bandwidth floor column; the t_typical table has no perftest column
    if (kind == "typical") { floor = $3; plugin = $4 }
    else if (kind == "bw" && dev == "siw0") { floor = ""; plugin = $4 }
    else { floor = $4; plugin = $5 }
    gsub(/ /, "", plugin); gsub(/ /, "", floor)
    ok = plugin ~ /^[0-9.]+$/ && plugin > 0 && (dev != "rxe0" || floor ~ /^[0-9.]+$/)
    print dev, kind, ok ? "ok" : "bad(plugin=" plugin ",floor=" floor ")"
  }')
if [ $rc = 0 ] && [ "$(echo "$rows" | grep -c ' ok$')" = 5 ] && ! echo "$rows" | grep -q bad; then
  echo "PASS run-vm-bench.sh in miniature on rxe0 and siw0 ($(echo "$rows" | tr '\n' ';'))"
else
  echo "FAIL run-vm-bench.sh in miniature (exit $rc): $(echo "$rows" | tr '\n' ';')"
  echo "$out" | grep -v WARN | tail -n 30 | sed 's/^/    /'; fail=1
fi
exit $fail
