#!/usr/bin/env bash
# The README's parameter table must be exactly what the parameter table generates.
set -euo pipefail
tool=$1 readme=$2
want=$("$tool" --markdown)
got=$(sed -n '/<!-- params:begin -->/,/<!-- params:end -->/p' "$readme" | sed '1d;$d')
if [ "$want" != "$got" ]; then
  echo "FAIL: README parameter table is stale; regenerate with: nccl-erdma-params --markdown"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
echo "OK: README lists all $(echo "$want" | tail -n +3 | wc -l) parameters"
