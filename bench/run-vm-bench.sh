#!/usr/bin/env bash
# The main job on a machine without eRDMA: in ONE boot of the RDMA test VM,
# measure raw verbs (perftest ib_write_bw / ib_write_lat) and the plugin
# (erdma_bench, through dlopen and the ncclNet API) on the same soft device,
# and print one table per device with the plugin/perftest ratio.
#
#   cmake -S . -B build -DERDMA_WERROR=ON && cmake --build build -j2
#   bench/run-vm-bench.sh                 # rxe0 and siw0
#   bench/run-vm-bench.sh rxe0            # one device
#   bench/run-vm-bench.sh -o bench/results/today.txt rxe0
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]  BW_SIZES [4K 16K 64K 256K 1M 4M 16M 64M]
#   LAT_SIZES [8 64 512 4K 64K]  BW_BYTES [64M timed bytes per size]
#   LAT_ITERS [1000]  LAT_ROUNDS [3]  BW_ROUNDS [3]  LAT_DEPTH [8 receives posted]  WINDOW [16]  API [12]
#   BENCH_EXTRA [extra erdma_bench flags]
#   FLOOR_MODE [imm+cts]  verbs_floor's mode: imm+cts (batched clear-to-sends) or netib
#                         (net_ib's algorithm: one inlined clear-to-send per receive; its
#                         latency with LAT_DEPTH receives posted, and its bandwidth too,
#                         with WINDOW receives posted ahead, the plugin bench's window)
#   FLOOR_CONNS [1]  QP pairs of the latency floor (verbs_floor -c): 1 carries both directions
#                    of the ping-pong on one pair and one CQ a side; 2 gives each direction its
#                    own pair and CQs, as net_ib's (and the plugin's) send and receive comms
# Latency drifts by 20-40 % within one boot of the emulated VM, and bandwidth
# drops by as much for seconds at a time, so both are measured in rounds
# (LAT_ROUNDS, BW_ROUNDS), perftest and plugin alternating size by size, and the table gives
# each side's median with the range of the per-round ratios. On RoCE
# devices each latency round also runs verbs_floor: the plugin's protocol in raw
# verbs (write-with-immediate + clear-to-sends), the floor the plugin can reach;
# with FLOOR_MODE=netib each bandwidth round runs its bandwidth mode as well.
#   PERFTEST_TRIES [3]  perftest retries a failed run (emulated clocks make it exit 1)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

OUT_FILE=
if [ "${1:-}" != --inside ]; then
  # ------------------------------------------------------------ host side
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) usage; exit 0 ;;
      -o) OUT_FILE=$2; shift 2 ;;
      --) shift; break ;;
      -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
      *) break ;;
    esac
  done
  cd "$(dirname "$0")/.."
  BUILD_DIR=${BUILD_DIR:-build}
  for f in "$BUILD_DIR/bench/erdma_bench" "$BUILD_DIR/bench/verbs_floor" "$BUILD_DIR/src/libnccl-net-erdma.so"; do
    [ -e "$f" ] || { echo "missing $f: build first (cmake -S . -B $BUILD_DIR && cmake --build $BUILD_DIR -j2)" >&2; exit 2; }
  done
  export BUILD_DIR BENCH_CMDLINE="$0 $*${BW_SIZES:+ BW_SIZES='$BW_SIZES'}${LAT_SIZES:+ LAT_SIZES='$LAT_SIZES'}${LAT_ROUNDS:+ LAT_ROUNDS=$LAT_ROUNDS}${BW_ROUNDS:+ BW_ROUNDS=$BW_ROUNDS}${LAT_ITERS:+ LAT_ITERS=$LAT_ITERS}${BENCH_EXTRA:+ BENCH_EXTRA='$BENCH_EXTRA'}${API:+ API=$API}${LAT_DEPTH:+ LAT_DEPTH=$LAT_DEPTH}${WINDOW:+ WINDOW=$WINDOW}${BW_BYTES:+ BW_BYTES=$BW_BYTES}${FLOOR_MODE:+ FLOOR_MODE=$FLOOR_MODE}${FLOOR_CONNS:+ FLOOR_CONNS=$FLOOR_CONNS}${NCCL_ERDMA_CTS_BATCH:+ NCCL_ERDMA_CTS_BATCH=$NCCL_ERDMA_CTS_BATCH}"
  if [ -n "$OUT_FILE" ]; then
    mkdir -p "$(dirname "$OUT_FILE")"
    tests/vm/run-in-rdma-vm.sh bench/run-vm-bench.sh --inside "${@:-rxe0 siw0}" | tee "$OUT_FILE"
    exit "${PIPESTATUS[0]}"
  fi
  exec tests/vm/run-in-rdma-vm.sh bench/run-vm-bench.sh --inside "${@:-rxe0 siw0}"
fi

# ------------------------------------------------------------ inside the VM
shift
# shellcheck disable=SC2206
DEVICES=(${*:-rxe0 siw0})
BUILD_DIR=${BUILD_DIR:-build}
BENCH=$BUILD_DIR/bench/erdma_bench
FLOOR=$BUILD_DIR/bench/verbs_floor
PLUGIN=$BUILD_DIR/src/libnccl-net-erdma.so
BW_SIZES=${BW_SIZES:-4K 16K 64K 256K 1M 4M 16M 64M}
LAT_SIZES=${LAT_SIZES:-8 64 512 4K 64K}
BW_BYTES=${BW_BYTES:-64M}
LAT_ITERS=${LAT_ITERS:-1000}
LAT_ROUNDS=${LAT_ROUNDS:-3}
BW_ROUNDS=${BW_ROUNDS:-3}
LAT_DEPTH=${LAT_DEPTH:-8}
FLOOR_MODE=${FLOOR_MODE:-imm+cts}
FLOOR_CONNS=${FLOOR_CONNS:-1}
WINDOW=${WINDOW:-16}
API=${API:-12}
TRIES=${PERFTEST_TRIES:-3}
LOG=$(mktemp -d /tmp/vm-bench.XXXXXX)
ulimit -l unlimited 2>/dev/null || true

bytes() { # 4K -> 4096
  local v=${1%[KkMmGg]} u=${1: -1}
  case $u in K|k) echo $((v << 10)) ;; M|m) echo $((v << 20)) ;; G|g) echo $((v << 30)) ;; *) echo "$1" ;; esac
}
human() { # 4096 -> 4K
  local b=$1
  if [ $((b % (1 << 20))) = 0 ]; then echo "$((b >> 20))M"
  elif [ $((b % 1024)) = 0 ]; then echo "$((b >> 10))K"
  else echo "$b"; fi
}
MIN_ITERS=5 # ib_write_bw refuses -n below 5
iters_for() { # the same timed bytes as the plugin: max(MIN_ITERS, BW_BYTES / size)
  local n=$(( $(bytes "$BW_BYTES") / $1 ))
  [ $n -lt $MIN_ITERS ] && n=$MIN_ITERS
  echo $n
}

dev_ip() { case $1 in rxe0) echo "${RDMA_VM_IP0:-10.77.0.1}" ;; siw0) echo "${RDMA_VM_IP1:-10.78.0.1}" ;; esac; }
perftest_flags() { case $1 in siw*) echo "-R" ;; *) echo "-x 1" ;; esac; }
# verbs_floor addresses by GID (RoCE); iWARP connects only through rdma_cm, so siw has none.
has_floor() { case $1 in siw*) return 1 ;; *) [ -x "$FLOOR" ] ;; esac; }

PORT=18600
# perftest TOOL DEV ARGS...: prints the client's output; retries up to $TRIES times.
perftest() {
  local tool=$1 dev=$2 try out rc spid
  shift 2
  local ip flags
  ip=$(dev_ip "$dev"); flags=$(perftest_flags "$dev")
  for try in $(seq 1 "$TRIES"); do
    PORT=$((PORT + 1))
    # shellcheck disable=SC2086
    timeout 60 "$tool" -d "$dev" $flags -p $PORT "$@" > "$LOG/server.out" 2>&1 & spid=$!
    sleep 1
    # shellcheck disable=SC2086
    out=$(timeout 60 "$tool" -d "$dev" $flags -p $PORT "$@" "$ip" 2>&1) && rc=0 || rc=$?
    wait "$spid" 2>/dev/null || true
    if [ $rc = 0 ]; then echo "$out"; return 0; fi
    echo "  ($tool $* on $dev: try $try failed, exit $rc: $(echo "$out" | grep -iE 'error|fail|r\^2|couldn' | head -n1))" >&2
    kill "$spid" 2>/dev/null || true
    sleep 1
  done
  return 1
}

# Runs the plugin bench on DEV in MODE (bw|lat) for SIZES (one size, in the rounds below)
# and appends this round's figure for each to the lists BWX[size] or LATXS[size] ("-"
# where it printed none, which keeps the rounds aligned). Returns the bench's exit status.
plugin_bench() {
  local dev=$1 mode=$2 sizes=$3 list rc=0
  list=$(echo "$sizes" | tr ' ' ',')
  local cmd=("$BENCH" -d "$dev" -p "$PLUGIN" -a "$API" -m "$mode" -w "$WINDOW" -s "$list"
             -B "$BW_BYTES" -i "$MIN_ITERS" -S "$list" -n "$LAT_ITERS" -D "$LAT_DEPTH" -t 90)
  # shellcheck disable=SC2206
  [ -n "${BENCH_EXTRA:-}" ] && cmd+=($BENCH_EXTRA)
  echo "== $dev: ${cmd[*]}" >&2
  timeout 200 "${cmd[@]}" > "$LOG/bench.$dev" 2> "$LOG/bench.$dev.err" || rc=$?
  sed 's/^/   /' "$LOG/bench.$dev" >&2
  [ -s "$LOG/bench.$dev.err" ] && sed 's/^/   stderr: /' "$LOG/bench.$dev.err" | head -n 20 >&2
  # (no process substitution: the VM has no /dev/fd)
  local m size f4 f6 f7 s b
  declare -A got=() typ=()
  while read -r m size _ f4 _ f6 f7 _; do
    case $m in
      bw) [ "$mode" = bw ] && got[$size]=$f4 ;;
      lat) [ "$mode" = lat ] && got[$size]=$f7 && typ[$size]=$f6 ;;
    esac
  done < "$LOG/bench.$dev"
  for s in $sizes; do
    b=$(bytes "$s")
    if [ "$mode" = bw ]; then BWX[$b]+=" ${got[$b]:--}"
    else LATXS[$b]+=" ${got[$b]:--}"; LATXT[$b]+=" ${typ[$b]:--}"; fi
  done
  return $rc
}

# verbs_floor's bandwidth is net_ib's algorithm only (-m netib -b).
has_bw_floor() { has_floor "$1" && [ "$FLOOR_MODE" = netib ]; }

# Fills, for one device, the lists (one figure per round, "-" where a run failed)
# BWP[size] / BWX[size] (perftest / plugin bandwidth), LATPS[size] / LATXS[size] (latency)
# and LATFS[size] / BWF[size] (the raw-verbs floor's latency / bandwidth).
measure() {
  local dev=$1 s b n out r typical
  PLUGIN_RC[$dev]=0
  for r in $(seq 1 "$BW_ROUNDS"); do
    echo "== $dev: perftest ib_write_bw ($(perftest_flags "$dev"), default tx depth), round $r of $BW_ROUNDS" >&2
    for s in $BW_SIZES; do
      b=$(bytes "$s"); n=$(iters_for "$b")
      out=$(perftest ib_write_bw "$dev" -s "$b" -n "$n") || out=
      out=$(echo "$out" | awk -v b="$b" '$1 == b && NF >= 4 {print $4; exit}' | finite)
      BWP[$b]+=" ${out:--}"
      echo "   $s: ${BWP[$b]} MB/s" >&2
      if has_bw_floor "$dev"; then # net_ib's algorithm in raw verbs, in the same round, with
        # as many receives posted ahead as the plugin bench keeps requests in flight (-w)
        out=$(timeout 150 "$FLOOR" -d "$dev" -m netib -b -s "$b" -n "$n" -D "$WINDOW" 2>&1) || out=
        out=$(echo "$out" | awk -v b="$b" '$1 == "netib-bw" && $2 == b {print $4; exit}' | finite)
        BWF[$b]+=" ${out:--}"
        echo "   $s: floor ${BWF[$b]} MB/s" >&2
      fi
      # the plugin right after them, size by size: the host's slow spells last seconds,
      # and one plugin run of every size in a row put all of its sizes in one of them
      plugin_bench "$dev" bw "$s" || { PLUGIN_RC[$dev]=$?; break 2; }
    done
  done
  for r in $(seq 1 "$LAT_ROUNDS"); do
    echo "== $dev: perftest ib_write_lat, round $r of $LAT_ROUNDS" >&2
    for s in $LAT_SIZES; do
      [ "${PLUGIN_RC[$dev]}" = 0 ] || break 2 # the plugin failed: no more turns for anyone
      b=$(bytes "$s")
      out=$(perftest ib_write_lat "$dev" -s "$b" -n "$LAT_ITERS") || out=
      out=$(echo "$out" | awk -v b="$b" '$1 == b && NF >= 6 {print $6; exit}' | finite)
      LATPS[$b]+=" ${out:--}" # "-" keeps the rounds aligned when perftest failed
      echo "   $s: ${LATPS[$b]:-FAILED} us" >&2
      if has_floor "$dev"; then # the protocol's raw-verbs floor, in the same round
        out=$(timeout 150 "$FLOOR" -d "$dev" -m "$FLOOR_MODE" -c "$FLOOR_CONNS" -s "$b" -n "$LAT_ITERS" -D "$LAT_DEPTH" 2>&1) || out=
        typical=$(echo "$out" | awk -v b="$b" -v m="$FLOOR_MODE" '$1 == m && $2 == b {print $6; exit}' | finite)
        out=$(echo "$out" | awk -v b="$b" -v m="$FLOOR_MODE" '$1 == m && $2 == b {print $7; exit}' | finite)
        LATFS[$b]+=" ${out:--}"
        LATFT[$b]+=" ${typical:--}"
        echo "   $s: floor ${LATFS[$b]} us (typical ${LATFT[$b]})" >&2
      fi
      plugin_bench "$dev" lat "$s" || PLUGIN_RC[$dev]=$?
    done
  done
}

# Passes a figure on only when it is a positive finite number: under emulation ib_write_lat
# now and then reports "inf" (its clock calibration), which is a failed run, not a value.
finite() { awk '$1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0 {print $1}'; }

median() { # values... ("-" = no value) -> the median, or nothing
  printf '%s\n' "$@" | { grep -v '^-$' || true; } | sort -g |
    awk '{v[NR] = $1} END {if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

ratio_range() { # "plugin values" "perftest values" -> "1.31-1.52" over the rounds both have
  local -a x p
  read -r -a x <<< "$1"; read -r -a p <<< "$2"
  local i out=""
  for i in "${!x[@]}"; do
    [ "${p[$i]:--}" != - ] && [ "${x[$i]:--}" != - ] && out+=" $(ratio "${x[$i]}" "${p[$i]}")"
  done
  # shellcheck disable=SC2086
  [ -n "$out" ] && printf '%s\n' $out | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}' || echo "-"
}

ratio() { # plugin perftest -> "0.97" or "-"
  if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "-" }'
  else echo "-"; fi
}

table() {
  local dev=$1 s b
  # a table only for what was measured (0 rounds: none, not a table of FAILED)
  if [ "$BW_ROUNDS" -gt 0 ]; then bw_table "$dev"; fi
  if [ "$LAT_ROUNDS" -gt 0 ]; then lat_table "$dev"; fi
}

bw_table() {
  local dev=$1 s b
  echo
  echo "### $dev: bandwidth, MB/s (decimal, 'BW average'), window $WINDOW, $BW_BYTES per size, median of $BW_ROUNDS alternating rounds"
  echo
  local floor=false bp bx bf
  has_bw_floor "$dev" && floor=true
  if $floor; then
    echo "| size | ib_write_bw | floor (raw verbs) | plugin (v$API) | plugin / perftest | per-round ratios | plugin / floor | per-round plugin / floor |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  else
    echo "| size | ib_write_bw | plugin (v$API) | plugin / perftest | per-round ratios |"
    echo "| ---: | ---: | ---: | ---: | ---: |"
  fi
  for s in $BW_SIZES; do
    b=$(bytes "$s")
    # shellcheck disable=SC2086
    bp=$(median ${BWP[$b]:-})
    # shellcheck disable=SC2086
    bx=$(median ${BWX[$b]:-})
    if $floor; then
      # shellcheck disable=SC2086
      bf=$(median ${BWF[$b]:-})
      echo "| $(human "$b") | ${bp:-FAILED} | ${bf:-FAILED} | ${bx:-FAILED} | $(ratio "$bx" "$bp") | $(ratio_range "${BWX[$b]:-}" "${BWP[$b]:-}") | $(ratio "$bx" "$bf") | $(ratio_range "${BWX[$b]:-}" "${BWF[$b]:-}") |"
    else
      echo "| $(human "$b") | ${bp:-FAILED} | ${bx:-FAILED} | $(ratio "$bx" "$bp") | $(ratio_range "${BWX[$b]:-}" "${BWP[$b]:-}") |"
    fi
  done
  if $floor; then
    echo
    echo "floor: \`verbs_floor -m netib -b -D $WINDOW\`, net_ib's algorithm streaming in raw verbs: the receiver keeps" \
         "$WINDOW receives posted ahead (the plugin bench's window), each announced by one inlined clear-to-send" \
         "write; the sender writes with immediate into each receive it has seen; timed on the receiver."
  fi
}

lat_table() {
  local dev=$1 s b
  echo
  echo "### $dev: latency, one-way us (t_avg = round trip / 2), $LAT_ITERS iterations, $LAT_DEPTH receives posted, median of $LAT_ROUNDS alternating rounds"
  echo
  echo "| size | ib_write_lat | floor (raw verbs) | plugin (v$API) | plugin / perftest | per-round ratios | floor / perftest | plugin / floor | per-round plugin / floor |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  local lp lx lf
  for s in $LAT_SIZES; do
    b=$(bytes "$s")
    # shellcheck disable=SC2086
    lp=$(median ${LATPS[$b]:-})
    # shellcheck disable=SC2086
    lx=$(median ${LATXS[$b]:-})
    # shellcheck disable=SC2086
    lf=$(median ${LATFS[$b]:-})
    echo "| $(human "$b") | ${lp:-FAILED} | ${lf:--} | ${lx:-FAILED} | $(ratio "$lx" "$lp") | $(ratio_range "${LATXS[$b]:-}" "${LATPS[$b]:-}") | $(ratio "$lf" "$lp") | $(ratio "$lx" "$lf") | $(ratio_range "${LATXS[$b]:-}" "${LATFS[$b]:-}") |"
  done
  if has_floor "$dev"; then typical_table "$dev"; fi
  if has_floor "$dev" && [ "$FLOOR_MODE" = netib ]; then
    echo
    echo "floor: \`verbs_floor -m netib -c $FLOOR_CONNS -D $LAT_DEPTH\`, net_ib's algorithm in raw verbs: write-with-immediate" \
         "polled on a CQ, $LAT_DEPTH receives posted on each side, one inlined clear-to-send write per receive," \
         "and a sender that waits for the clear-to-send of the receive it writes into;" \
         "$([ "$FLOOR_CONNS" = 2 ] && echo "each direction on its own QP pair and CQs, as net_ib's send and receive comms" || echo "both directions on one QP pair and one CQ a side")."
  elif has_floor "$dev"; then
    echo
    echo "floor: \`verbs_floor -m imm+cts -c $FLOOR_CONNS -D $LAT_DEPTH\`, the same protocol in raw verbs: write-with-immediate" \
         "polled on a CQ, plus one batched clear-to-send write per $((LAT_DEPTH - 1)) messages on each side."
  fi
  if [ "${PLUGIN_RC[$dev]}" != 0 ]; then
    echo
    echo "plugin bench on $dev FAILED (exit ${PLUGIN_RC[$dev]}):"
    sed 's/^/    /' "$LOG/bench.$dev.err" | tail -n 8
  fi
}

# The same rounds by their median round trip (t_typical) instead of the mean (t_avg): under
# emulation a few round trips in a run take milliseconds (the VM's, floor and plugin alike),
# and in a mean of 1,000 they weigh as much as the protocols' difference.
typical_table() {
  local dev=$1 s b tf tx
  echo
  echo "### $dev: latency by t_typical (median round trip / 2), us, the same runs, median of $LAT_ROUNDS rounds"
  echo
  echo "| size | floor | plugin | plugin / floor | per-round plugin / floor |"
  echo "| ---: | ---: | ---: | ---: | ---: |"
  for s in $LAT_SIZES; do
    b=$(bytes "$s")
    # shellcheck disable=SC2086
    tf=$(median ${LATFT[$b]:-})
    # shellcheck disable=SC2086
    tx=$(median ${LATXT[$b]:-})
    echo "| $(human "$b") | ${tf:--} | ${tx:-FAILED} | $(ratio "$tx" "$tf") | $(ratio_range "${LATXT[$b]:-}" "${LATFT[$b]:-}") |"
  done
}

declare -A PLUGIN_RC
REPORT=$LOG/report
{
  echo "## erdma_bench vs perftest, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "command: \`${BENCH_CMDLINE:-$0 $*}\`"
  echo "VM: $(uname -r), $(nproc) vCPUs, soft devices $(ls /sys/class/infiniband | tr '\n' ' ');" \
       "plugin $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-60)"
  echo "perftest: ib_write_bw -d DEV $(perftest_flags rxe0) (rxe) / -R (siw) -s SIZE -n ITERS;" \
       "ib_write_lat -s SIZE -n $LAT_ITERS; same timed bytes per size as the plugin;" \
       "bandwidth: $BW_ROUNDS rounds, each size in turn: perftest$([ "$FLOOR_MODE" = netib ] && echo ", net_ib's algorithm in raw verbs (RoCE only)"), then the plugin; latency: $LAT_ROUNDS rounds, each size in turn: perftest, the raw-verbs floor (RoCE only), then the plugin"
} > "$REPORT"

rc=0
for dev in "${DEVICES[@]}"; do
  [ -d "/sys/class/infiniband/$dev" ] || { echo "no device $dev in this VM" >&2; rc=1; continue; }
  declare -A BWP=() LATPS=() BWX=() LATXS=() LATFS=() BWF=() LATFT=() LATXT=()
  measure "$dev"
  [ "${PLUGIN_RC[$dev]}" = 0 ] || rc=1
  table "$dev" >> "$REPORT"
  unset BWP LATPS BWX LATXS LATFS BWF LATFT LATXT
done
echo "(measured in ${SECONDS}s inside the VM)" >> "$REPORT"
echo
cat "$REPORT"
rm -rf "$LOG"
exit $rc
