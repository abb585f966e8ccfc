#!/usr/bin/env bash
# ctest vm_loss: sets up the loss rig inside the VM, then runs the loss cases of
# itest_failures (1 % and 5 % loss intact; 100 % loss fails within the retry budget).
#   loss_test.sh ITEST_FAILURES_BIN
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/loss_setup.sh"
rc=0
ITEST_LOSS=1 "$1" || rc=$?
# the test removes its qdiscs itself; this only matters after a crash
tc qdisc del dev vl0 root 2>/dev/null || true
tc qdisc del dev lo root 2>/dev/null || true
# and the rig goes too: left in place, a later test in the same boot sees 4 RDMA devices
rdma link delete rxl0 2>/dev/null || true
rdma link delete rxl1 2>/dev/null || true
ip link del vl0 2>/dev/null || true
exit $rc
