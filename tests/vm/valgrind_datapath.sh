#!/usr/bin/env bash
# valgrind memcheck over data-path scenarios in the RDMA VM (label vm):
#   valgrind_datapath.sh ITEST_DATAPATH_BIN PLUGIN_SO [ITEST_ONLY filter]
# libibverbs, librdmacm and the plugin are preloaded so that the plugin's dlclose()
# does not unmap them before the leak check: their process-lifetime globals then
# show as reachable, and every frame has a symbol. Fails on any memcheck error or on
# a definite/indirect leak.
set -euo pipefail
bin=$1 plugin=$2 only=${3:-rxe0/v12/close_and_reconnect}
here=$(cd "$(dirname "$0")" && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
ITEST_DEVICES=${ITEST_DEVICES:-rxe0} ITEST_ONLY=$only ERDMA_PLUGIN=$plugin \
  LD_PRELOAD="libibverbs.so.1 librdmacm.so.1 $plugin" \
  valgrind --leak-check=full --show-leak-kinds=definite,indirect,possible \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --num-callers=20 \
    --suppressions="$here/valgrind.supp" "$bin" >"$log" 2>&1 || rc=$?
grep -E '^\[ +(OK|FAILED|RUN) +\]' "$log" || true
grep -E '==[0-9]+== (ERROR SUMMARY|   definitely lost|   indirectly lost|   possibly lost)' "$log" || true
if [ $rc != 0 ] || grep -Eq '==[0-9]+== ERROR SUMMARY: [1-9]' "$log"; then
  grep -v 'plugin INFO\|MTU 1500' "$log" | tail -n 200
  echo "valgrind_datapath: FAILED (rc $rc)"
  exit 1
fi
if ! grep -Eq '^\[ +OK +\]' "$log"; then # a renamed scenario must not pass as "clean"
  tail -n 50 "$log"
  echo "valgrind_datapath: FAILED: no scenario matching '$only' ran"
  exit 1
fi
echo "valgrind_datapath: memcheck clean: no errors, no definite or indirect leak ($only)"
