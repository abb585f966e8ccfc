#!/usr/bin/env bash
# Installs what building and testing need on a fresh Debian machine (apt), and prepares the
# RDMA test VM's kernel cache (~1 min the first time, cached in ~/.cache/rdma-vm).
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# file: cpack's dpkg-shlibdeps step (the .deb's libc6 dependency) needs it
PKGS=(build-essential cmake pkg-config libcmocka-dev libibverbs-dev librdmacm-dev
      rdma-core ibverbs-providers perftest valgrind gdb iproute2 clang-format clang libclang-rt-14-dev python3
      file
      python3-prometheus-client)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
tests/vm/run-in-rdma-vm.sh --prepare
tests/vm/loss_setup.sh --prepare   # veth + netem modules for the packet-loss test
