#!/usr/bin/env bash
# Inside the RDMA VM (rxe0 = RoCE v2 on eth0, siw0 = iWARP on eth1, both MTU 1500):
# the doctor sees both faces, and the plugin's MTU guard warns at init.
# Needs PLUGIN_PROBE and ERDMA_PLUGIN (set by ctest). Outside the VM this FAILS, never skips.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
DOCTOR=$SRC/tools/nccl-erdma-doctor
pass=0 fail=0
check() { # NAME PATTERN TEXT
    if grep -qF -- "$2" <<<"$3"; then echo "ok   $1"; pass=$((pass + 1)); else
        echo "FAIL $1: no line with '$2' in:"; sed 's/^/    /' <<<"$3"; fail=$((fail + 1)); fi
}
if [ "${RDMA_VM:-}" != 1 ]; then
    echo "FAIL: not inside the RDMA VM (run: tests/vm/run-in-rdma-vm.sh ctest --test-dir build -L vm)"
    exit 1
fi
unset NCCL_PROTO NCCL_ERDMA_MTU_GUARD NCCL_IB_HCA

out=$("$DOCTOR" 2>&1); rc=$?
echo "$out"
check exit-1-on-mtu-fail "rc=1" "rc=$rc"
check devices "[OK  ] devices: 2 port(s) ACTIVE: rxe0:1 siw0:1" "$out"
check devnodes "[OK  ] devnodes: uverbs0 uverbs1 and rdma_cm accessible" "$out"
check rxe0-roce-v2 "[OK  ] gid rxe0: port 1 GID index 1 = ::ffff:10.77.0.1 (RoCE v2)" "$out"
check siw0-iwarp "[OK  ] gid siw0: iWARP device (node_type RNIC): connects through rdma_cm" "$out"
check mtu-eth0 "[FAIL] mtu eth0: MTU 1500 (device rxe0)" "$out"
check mtu-eth1-by-mac "[FAIL] mtu eth1: MTU 1500 (device siw0)" "$out"
check memlock "[OK  ] memlock: locked-memory limit is unlimited" "$out"
check acs-virtual "[WARN] acs: no PCI GPU or RDMA NIC found" "$out"
out=$(NCCL_NET_PLUGIN=erdma LD_LIBRARY_PATH=$(dirname "$ERDMA_PLUGIN") "$DOCTOR" --only plugin 2>&1); rc=$?
check plugin-found "[OK  ] plugin: NCCL finds $ERDMA_PLUGIN" "$out"
check plugin-libraries-found "rc=0" "rc=$rc"
json=$("$DOCTOR" --json --only devices,gid 2>&1)
check json "$(printf '{"check":"gid","subject":"siw0","status":"OK"')" "$json"

out=$("$PLUGIN_PROBE" "$ERDMA_PLUGIN" --init 2>&1)
check guard-warns "WARN NET/eRDMA : eth0 MTU 1500 is neither 8500 nor 1400" "$out"
check guard-warns-siw "WARN NET/eRDMA : eth1 MTU 1500 is neither 8500 nor 1400" "$out"
check guard-leaves-proto "NCCL_PROTO=(unset)" "$out"
out=$(NCCL_ERDMA_MTU_GUARD=disable-ll128 "$PLUGIN_PROBE" "$ERDMA_PLUGIN" --init 2>&1)
check guard-disables-ll128 "set NCCL_PROTO=^LL128" "$out"
check guard-proto-set "NCCL_PROTO=^LL128" "$out"
out=$(NCCL_PROTO=Simple "$PLUGIN_PROBE" "$ERDMA_PLUGIN" --init 2>&1)
if grep -q "WARN.*MTU 1500" <<<"$out"; then echo "FAIL guard-quiet-when-excluded:"; echo "$out"; fail=$((fail + 1)); else
    echo "ok   guard-quiet-when-excluded"; pass=$((pass + 1)); fi
echo "vm_doctor: $pass passed, $fail failed"
[ $fail = 0 ]
