#!/usr/bin/env bash
# Bounded libFuzzer run of fuzz_wire: the committed seed corpus (read-only) plus a
# scratch corpus in the build tree; prints how many inputs were executed.
#   run_fuzz.sh FUZZ_BIN SEED_CORPUS SCRATCH_CORPUS RUNS
set -euo pipefail
bin=$1 seeds=$2 scratch=$3 runs=$4
mkdir -p "$scratch"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# new inputs go to the first directory (scratch), never into the repository
if ! "$bin" -runs="$runs" -max_len=512 -print_final_stats=1 "$scratch" "$seeds" >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "fuzz_wire: FAILED (crash or sanitizer report above; reproducer crash-* in $(pwd))"
  exit 1
fi
grep -E '^(Done|stat::number_of_executed_units|#[0-9]+ +DONE)' "$log" || true
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
echo "fuzz_wire: ${execs:-?} executions, no crash, no sanitizer report"
