#!/usr/bin/env bash
# nccl-erdma-topo on fixture sysfs trees: exit status and output of one case.
# usage: check_topo_cli.sh TOOL SOURCE_DIR CASE
set -uo pipefail
tool=$1 src=$2 case=$3
fx=$src/tests/fixtures/topo
out=$(mktemp) gen=$(mktemp)
trap 'rm -f "$out" "$gen"' EXIT

expect() { # want_rc pattern... : the last run must exit want_rc and print every pattern
  local want=$1; shift
  if [ "$rc" != "$want" ]; then echo "FAIL: exit $rc, wanted $want"; cat "$out"; exit 1; fi
  for p in "$@"; do
    if ! grep -qE -- "$p" "$out"; then echo "FAIL: no line matching '$p' in:"; cat "$out"; exit 1; fi
  done
}

case $case in
show)
  "$tool" --sysfs-root "$fx/ebmgn9g" show >"$out" 2>&1; rc=$?
  expect 0 '^GPU 0 0000:19:00.0 NUMA 0 -> erdma_0 \(PIX\)$' '^GPU 4 0000:99:00.0 NUMA 1 -> erdma_1 \(PIX\)$'
  [ "$(grep -c '^GPU ' "$out")" = 8 ] || { echo "FAIL: not 8 GPU lines"; cat "$out"; exit 1; } ;;
check-old)
  old=$src/tests/nccl_graph/old-ebmgn9g
  "$tool" --sysfs-root "$fx/ebmgn9g" check "$old-topo.xml" "$old-graph.xml" >"$out" 2>&1; rc=$?
  # NCCL's init fails on the topology shipped before (tests/nccl_graph): the check must say why.
  expect 1 "old-ebmgn9g-topo.xml: 2 problem" '<cpu> lacks arch=' ;;
generate-check)
  "$tool" --sysfs-root "$fx/ebmgn9g" generate --name test -o "$gen" >"$out" 2>&1; rc=$?
  expect 0
  "$tool" --sysfs-root "$fx/ebmgn9g" check "$gen" >"$out" 2>&1; rc=$?
  expect 0 'against this node: OK'
  # The same file on a node with other bus numbers must fail, naming the problem.
  "$tool" --sysfs-root "$fx/other_bus" check "$gen" >"$out" 2>&1; rc=$?
  expect 1 'gpu 0000:19:00.0 is not on this node' ;;
not-this-node)
  for cmd in show generate; do
    "$tool" --sysfs-root "$fx/empty" $cmd >"$out" 2>&1; rc=$?
    expect 3 'not this kind of node: no NVIDIA GPUs'
  done
  "$tool" --sysfs-root "$fx/no_erdma" show >"$out" 2>&1; rc=$?
  expect 3 'not this kind of node: 8 NVIDIA GPUs but no eRDMA NIC' ;;
select)
  "$tool" --sysfs-root "$fx/ebmgn9g" select --topo-dir "$src/topo" >"$out" 2>&1; rc=$?
  expect 0 "^$src/topo/graph-intel-spr.xml\$"
  "$tool" --sysfs-root "$fx/ebmgn9g" select --topo-dir "$src/topo" --nics erdma_1,erdma_0 >"$out" 2>&1; rc=$?
  expect 1 '^refused: plugin device 0 is erdma_1'
  "$tool" --sysfs-root "$fx/ebmgn9g" select --topo-dir "$src/topo" --gdr 0 >"$out" 2>&1; rc=$?
  expect 1 '^refused: GPU Direct RDMA is off'
  "$tool" --sysfs-root "$fx/ebmgn9g" select --topo-dir "$src/topo" --nccl-net 8 >"$out" 2>&1; rc=$?
  expect 1 '^refused: NCCL loaded ncclNet v8'
  NCCL_CROSS_NIC=0 "$tool" --sysfs-root "$fx/ebmgn9g" select --topo-dir "$src/topo" >"$out" 2>&1; rc=$?
  expect 1 '^refused: NCCL_CROSS_NIC=0, but the graphs. rings cross NICs'
  "$tool" --sysfs-root "$fx/one_nic" select --topo-dir "$src/topo" >"$out" 2>&1; rc=$?
  expect 1 '^refused: 8 NVIDIA GPUs and 1 eRDMA NICs' ;;
usage)
  "$tool" frobnicate >"$out" 2>&1; rc=$?
  expect 2 '^usage: nccl-erdma-topo' ;;
*) echo "unknown case $case"; exit 2 ;;
esac
echo "OK: $case"
