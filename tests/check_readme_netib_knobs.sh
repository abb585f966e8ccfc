#!/usr/bin/env bash
# The README's "NCCL's net_ib knobs" section must agree with the plugin and with net_ib:
#  - every knob it calls honoured is in src/params.def, and none it calls not read is;
#  - given net_ib's sources (NCCL_PARAM / ncclGetEnv), every knob net_ib reads is named there,
#    honoured or not read (a trailing * names a family, e.g. NCCL_IB_RESILIENCY_*).
set -euo pipefail
set -f # knob names are words, and NCCL_IB_RESILIENCY_* a pattern: no file globbing
readme=$1 params=$2 netib=${3:-}
section=$(sed -n "/^### NCCL's \`net_ib\` knobs/,/^## /p" "$readme")
[ -n "$section" ] || { echo "FAIL: no \"### NCCL's \`net_ib\` knobs\" section in $readme"; exit 1; }
# variables only: the section also names constants (NCCL_NET_ID_UNDEF)
names() { grep -oE '`NCCL_[A-Z0-9_]+\*?`' | tr -d '`' | grep -v '_UNDEF$' | sort -u; }
honoured=$(echo "$section" | sed -n '/^Honoured/,/^Not read/p' | sed '$d' | names)
notread=$(echo "$section" | sed -n '/^Not read, and why:/,$p' | names)
[ -n "$honoured" ] && [ -n "$notread" ] ||
  { echo "FAIL: the section lacks its 'Honoured' or 'Not read, and why:' list"; exit 1; }
fail=0
for k in $honoured; do
  grep -q "\"$k\"" "$params" || { echo "FAIL: $k is called honoured, but src/params.def does not read it"; fail=1; }
done
for k in $notread; do
  case $k in *\*) continue ;; esac
  ! grep -q "\"$k\"" "$params" || { echo "FAIL: $k is called not read, but src/params.def reads it"; fail=1; }
done
n=0
if [ -n "$netib" ]; then
  knobs=$(grep -rhoE 'NCCL_PARAM\([A-Za-z0-9]+, *"[A-Z0-9_]+"|ncclGetEnv\("NCCL_[A-Z0-9_]+"' "$netib" |
    grep -oE '"[A-Z0-9_]+"' | tr -d '"' | sed 's/^NCCL_//; s/^/NCCL_/' | sort -u)
  [ -n "$knobs" ] || { echo "FAIL: no knobs found in $netib"; exit 1; }
  for k in $knobs; do
    n=$((n + 1))
    covered=0
    for w in $honoured $notread; do
      # shellcheck disable=SC2254 # $w is a pattern on purpose (NCCL_IB_RESILIENCY_*)
      case $k in $w) covered=1 ;; esac
    done
    [ $covered = 1 ] || { echo "FAIL: net_ib reads $k; the README names it neither honoured nor not read"; fail=1; }
  done
fi
[ $fail = 0 ] || exit 1
echo "OK: $(echo "$honoured" | wc -l) honoured and $(echo "$notread" | wc -l) not-read knobs agree with src/params.def; $n knobs of net_ib accounted for"
