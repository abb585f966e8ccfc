#!/usr/bin/env bash
# Bounded libFuzzer run of one target: the committed seed corpus (read-only) plus a
# scratch corpus in the build tree; prints how many inputs were executed, how fast,
# and the coverage reached. With JOBS > 1 the runs are split over that many processes
# (different seeds, one scratch corpus), so a 2-core CI machine does the work in half
# the time; executions are summed over them. With MAX_TIME (seconds) each process also stops
# at that time, so a slow machine ends the run inside ctest's timeout instead of being killed
# by it (the rate swings with the inputs the fuzzer finds: 1,000-1,700/s per process for
# fuzz_datapath on the 2-core CI machine); it still fails below a tenth of RUNS.
#   run_fuzz.sh FUZZ_BIN SEED_CORPUS SCRATCH_CORPUS RUNS [MAX_LEN [JOBS [MAX_TIME]]]
set -euo pipefail
bin=$1 seeds=$2 scratch=$3 runs=$4 max_len=${5:-512} jobs=${6:-1} max_time=${7:-0}
name=$(basename "$bin")
mkdir -p "$scratch"
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
start=$(date +%s)
pids=()
for j in $(seq 1 "$jobs"); do
  # new inputs go to the first directory (scratch), never into the repository
  "$bin" -runs=$(( (runs + jobs - 1) / jobs )) -seed="$j" -max_len="$max_len" -print_final_stats=1 \
    -max_total_time="$max_time" \
    "$scratch" "$seeds" >"$logdir/$j.log" 2>&1 &
  pids+=($!)
done
failed=0
for j in $(seq 1 "$jobs"); do
  if ! wait "${pids[$((j - 1))]}"; then
    tail -n 60 "$logdir/$j.log"
    failed=1
  fi
done
if [ $failed = 1 ]; then
  echo "$name: FAILED (crash or sanitizer report above; reproducer crash-* in $(pwd))"
  exit 1
fi
execs=0 speed=0 cov=
for j in $(seq 1 "$jobs"); do
  grep -E '^(Done|#[0-9]+[[:space:]]+DONE)' "$logdir/$j.log" || true
  e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logdir/$j.log")
  s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logdir/$j.log")
  execs=$((execs + ${e:-0}))
  speed=$((speed + ${s:-0}))
  c=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logdir/$j.log" | sed -n 's/.*cov: \([0-9]*\) ft: \([0-9]*\).*/\1 edges, \2 features/p' || true)
  cov="$cov${cov:+; }${c:-?}"
done
if [ "$execs" -lt "$runs" ]; then
  if [ "$max_time" -gt 0 ] && [ "$execs" -ge $((runs / 10)) ]; then
    echo "$name: stopped by the ${max_time} s budget after $execs of $runs executions"
  else
    echo "$name: only $execs of $runs executions ran"; exit 1
  fi
fi
echo "$name: $execs executions in $(( $(date +%s) - start )) s by $jobs process(es) ($speed/s), coverage per process: $cov; no crash, no sanitizer report"
