#!/usr/bin/env bash
# Packet-loss rig for tests/integ/itest_failures.c (ITEST_LOSS=1).
#   loss_setup.sh --prepare   on the host: extract veth.ko and sch_netem.ko of the VM's
#                             kernel (the VM's initramfs carries neither) into the cache
#   loss_setup.sh             inside the VM: load them, make a veth pair vl0 (10.79.0.1)
#                             / vl1 (10.79.0.2) with soft-RoCE rxl0 / rxl1 on its ends
# Why a veth pair: both test processes share the VM, and rxe short-cuts traffic to its
# own MAC inside the driver, past every qdisc. Between rxl0 and rxl1 the packets leave
# through vl0 (requests) and lo (responses), where netem can drop them; the rxe
# counter completer_retry_err proves the drops hit RDMA traffic.
set -euo pipefail
CACHE=${RDMA_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-vm}
kver=$(readlink "$CACHE/current" 2>/dev/null || true)
kver=${kver##*/}
[ -n "$kver" ] || { echo "loss_setup: no VM kernel cache (run tests/vm/run-in-rdma-vm.sh --prepare)"; exit 1; }
mods=$CACHE/extra-$kver
if [ "${1:-}" = --prepare ]; then
  [ -f "$mods/veth.ko" ] && [ -f "$mods/sch_netem.ko" ] && exit 0
  work=$(mktemp -d); chmod 755 "$work"
  id _apt >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && chown _apt "$work"
  (cd "$work" && apt-get download -q "linux-image-$kver" >/dev/null)
  dpkg -x "$work"/linux-image-*.deb "$work/k"
  mkdir -p "$mods"
  for m in net/sched/sch_netem drivers/net/veth; do
    cp "$work/k/lib/modules/$kver/kernel/$m.ko" "$mods/"
  done
  rm -rf "$work"
  exit 0
fi
[ -n "${RDMA_VM:-}" ] || { echo "loss_setup: run inside the RDMA VM"; exit 1; }
for m in veth sch_netem; do
  grep -q "^$m " /proc/modules || insmod "$mods/$m.ko"
done
ip link show vl0 >/dev/null 2>&1 || ip link add vl0 type veth peer name vl1
ip addr replace 10.79.0.1/24 dev vl0
ip addr replace 10.79.0.2/24 dev vl1
# both ends are local addresses: accept ARP and packets with a local source address
for k in all vl0 vl1; do
  sysctl -qw net.ipv4.conf.$k.accept_local=1 net.ipv4.conf.$k.rp_filter=0
done
ip link set vl0 up
ip link set vl1 up
[ -e /sys/class/infiniband/rxl0 ] || rdma link add rxl0 type rxe netdev vl0
[ -e /sys/class/infiniband/rxl1 ] || rdma link add rxl1 type rxe netdev vl1
for i in $(seq 50); do
  grep -q ffff:0a4f:0001 /sys/class/infiniband/rxl0/ports/1/gids/1 2>/dev/null &&
    grep -q ffff:0a4f:0002 /sys/class/infiniband/rxl1/ports/1/gids/1 2>/dev/null && break
  sleep 0.1
done
sleep 1
