#!/usr/bin/env bash
# The rig's boot watchdog (run-in-rdma-vm.sh, RDMA_VM_BOOT_TIMEOUT): a guest that never
# reaches its command is stopped with status 125 and a message that says so, long before
# RDMA_VM_TIMEOUT; a command that runs past the boot limit is left alone.
# The hang is made with qemu's -S (the guest's CPUs never start). The rig's one-VM-at-a-time
# lock is skipped (RDMA_VM_NO_LOCK=1): a wait for another VM would count against the limits
# here, and these guests are idle or nearly so.
export RDMA_VM_NO_LOCK=1
set -uo pipefail
RIG=$(cd "$(dirname "$0")" && pwd)/run-in-rdma-vm.sh
fail=0
out=$(mktemp); trap 'rm -f "$out"' EXIT

# 1. a guest that never boots: 125 and the message, not the 600 s VM limit
RDMA_VM_TIMEOUT=600 RDMA_VM_BOOT_TIMEOUT=10 RDMA_VM_QEMU_EXTRA=-S \
  timeout -k 5 120 "$RIG" echo never > "$out" 2>&1
rc=$?
cat "$out"
if [ $rc != 125 ]; then echo "FAIL: a guest that never booted gave status $rc, not 125"; fail=1; fi
if ! grep -q 'did not reach the command within 10s' "$out"; then
  echo "FAIL: no message saying the guest did not reach the command"; fail=1
fi
if grep -q '^never$' "$out"; then echo "FAIL: the command ran in a guest that never booted"; fail=1; fi

# 2. the limit is on the boot only: a command longer than it finishes
RDMA_VM_BOOT_TIMEOUT=15 timeout -k 5 180 "$RIG" bash -c 'sleep 20; echo finished' > "$out" 2>&1
rc=$?
cat "$out"
if [ $rc != 0 ] || ! grep -q '^finished$' "$out"; then
  echo "FAIL: a command running past the boot limit was stopped (status $rc)"; fail=1
fi

# 3. a wrong value is refused before anything starts (00 would stop every guest at once)
for v in 5s 00; do
  RDMA_VM_BOOT_TIMEOUT=$v timeout 60 "$RIG" true > "$out" 2>&1
  rc=$?
  if [ $rc != 125 ] || ! grep -q "RDMA_VM_BOOT_TIMEOUT=$v" "$out"; then
    cat "$out"; echo "FAIL: RDMA_VM_BOOT_TIMEOUT=$v was not refused (status $rc)"; fail=1
  fi
done

[ $fail = 0 ] && echo "boot watchdog: 3 cases passed"
exit $fail
