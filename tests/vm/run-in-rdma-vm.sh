#!/usr/bin/env bash
# run-in-rdma-vm.sh - run a command inside a throw-away QEMU/TCG VM (no KVM
# needed) that has real kernel RDMA verbs devices:
#   rxe0 = soft-RoCE (rdma_rxe, RoCE v2)   on eth0 10.77.0.1/24
#   siw0 = soft-iWARP (siw)                on eth1 10.78.0.1/24
# The VM boots Debian's own kernel (linux-image-*-amd64, fetched with
# apt-get download, never installed into /boot) with a tiny busybox initramfs
# and uses the HOST's root filesystem read-only over virtio-9p with a tmpfs
# overlay on top, so binaries built on the host run unchanged inside.  The
# command's stdout/stderr stream to the host's stdout/stderr, and its exit
# status becomes this script's exit status.  Then the VM powers off.
#
# Debian does not build CONFIG_RDMA_SIW, so siw.ko is compiled once out of
# tree from the matching linux-source-X.Y package against the matching
# linux-headers package (installed with apt).
#
# Usage:
#   run-in-rdma-vm.sh [--] COMMAND [ARGS...]
#   run-in-rdma-vm.sh --prepare      # install packages + build the cache only
#   run-in-rdma-vm.sh bash -c 'ib_write_bw -d rxe0 -x 1 & sleep 2; ib_write_bw -d rxe0 -x 1 $RDMA_VM_IP0'
#
# Inside the VM:
#   * exported: RDMA_VM=1 RDMA_VM_IP0=10.77.0.1 RDMA_VM_IP1=10.78.0.1
#     RDMA_VM_RXE=rxe0 RDMA_VM_SIW=siw0, plus the caller's environment.
#   * rxe0 GID table: idx 0 = fe80::5054:ff:fe77:1 (RoCE v2),
#     idx 1 = ::ffff:10.77.0.1 (RoCE v2).  siw0: one GID (MAC based).
#   * Both NICs are virtio-net WITHOUT any host backend (a qemu hub with one
#     port): nothing the guest sends can leave the VM.  rxe/siw loop traffic
#     back inside the guest, so client and server both run in the VM.
#   * siw0 and rxe0 are on different NICs on purpose: rdma_cm binds an IP to
#     the FIRST rdma device on that netdev, so with both on eth0 every
#     rdma_cm connection silently uses rxe0.
#   * host / is visible read-only + tmpfs overlay (writes go to guest RAM and
#     are discarded), EXCEPT the RDMA_VM_RW_DIRS (default: current directory),
#     which are shared read-write (changes land on the host, as root).
#   * cwd = the caller's cwd; stdin = /dev/null; runs as root; memlock is
#     unlimited; /dev/shm and /run are fresh tmpfs; ASLR is off (much faster
#     exec under TCG; set RDMA_VM_ASLR=1 to keep it); the guest clock is set
#     from the host clock.
#
# Environment knobs:
#   RDMA_VM_CACHE    cache dir (default ${XDG_CACHE_HOME:-~/.cache}/rdma-vm)
#   RDMA_VM_MEM      guest RAM (default 2G)
#   RDMA_VM_SMP      guest vCPUs (default 2; 1 makes ping-pong latency ~4 ms)
#   RDMA_VM_TIMEOUT  hard wall-clock limit for the VM in seconds (default 3000)
#   RDMA_VM_BOOT_TIMEOUT  limit in seconds for the guest to boot and reach the
#                    command (default 300; a boot takes ~5 s): past it the VM is
#                    stopped, its console printed, and the exit status is 125
#   RDMA_VM_RW_DIRS  ':'-separated host dirs shared read-write (default $PWD;
#                    "none" for none)
#   RDMA_VM_SIW_NETDEV  eth1 (default) or eth0 (same NIC as rxe0, see above)
#   RDMA_VM_NO_SIW   1 = do not build/create siw0
#   RDMA_VM_KVER     Debian kernel ABI, e.g. 6.1.0-57-amd64 (default: the one
#                    cached last, else what linux-image-amd64 depends on)
#   RDMA_VM_REFRESH  1 = re-resolve linux-image-amd64 (apt-get update) and
#                    build a new cache if Debian has a newer kernel
#   RDMA_VM_NO_INSTALL 1 = never call apt-get (fail if something is missing)
#   RDMA_VM_CONSOLE  1 = copy the guest kernel console to stderr
#   RDMA_VM_DMESG    host file to receive the guest's dmesg after the command
#   RDMA_VM_TIMING   1 = print boot/run timing to stderr at the end
#   RDMA_VM_APPEND   extra kernel command line
#   RDMA_VM_QEMU_EXTRA  extra qemu arguments (word-split)
#   RDMA_VM_NO_LOCK  1 = do not wait for other rdma-vm instances (default: one VM at a time)
#   RDMA_VM_CPU      qemu -cpu model (default max; note: TCG has no AVX-512,
#                    so do not build the code under test with -march=native)
#
# Exit status: the command's status; 124 on timeout; 125 if the VM or its
# setup failed before the command reported a status (console log printed).
set -euo pipefail

PROG=${0##*/}
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "error: $*"; exit 125; }

CACHE=${RDMA_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-vm}
MEM=${RDMA_VM_MEM:-2G}
SMP=${RDMA_VM_SMP:-2}
VM_TIMEOUT=${RDMA_VM_TIMEOUT:-3000}
BOOT_TIMEOUT=${RDMA_VM_BOOT_TIMEOUT:-300}
case $BOOT_TIMEOUT in ''|*[!0-9]*) BOOT_TIMEOUT=0 ;; *) BOOT_TIMEOUT=$((10#$BOOT_TIMEOUT)) ;; esac
[ "$BOOT_TIMEOUT" -ge 1 ] || die "RDMA_VM_BOOT_TIMEOUT=${RDMA_VM_BOOT_TIMEOUT:-}: give whole seconds, at least 1"
CPU=${RDMA_VM_CPU:-max}
SIW_NETDEV=${RDMA_VM_SIW_NETDEV:-eth1}
NO_SIW=${RDMA_VM_NO_SIW:-0}
IP0=10.77.0.1 IP1=10.78.0.1
CACHE_FORMAT=3   # bump when the initramfs layout changes

HOST_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
           librdmacm1 rdmacm-utils perftest libibverbs-dev librdmacm-dev iproute2
           kmod xz-utils cpio gzip binutils make gcc)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# run a command quietly; show its output only if it fails
quiet() {
  local log rc=0; log=$(mktemp "${TMPDIR:-/tmp}/rdma-vm-log.XXXXXX")
  "$@" > "$log" 2>&1 || rc=$?
  [ $rc = 0 ] || cat "$log" >&2
  rm -f "$log"; return $rc
}

apt_updated=0
apt_update_once() {
  [ "$apt_updated" = 1 ] && return 0
  [ "${RDMA_VM_NO_INSTALL:-0}" = 1 ] && die "need apt-get but RDMA_VM_NO_INSTALL=1"
  say "apt-get update"
  quiet as_root apt-get update || die "apt-get update failed"
  apt_updated=1
}

apt_install() {
  [ "${RDMA_VM_NO_INSTALL:-0}" = 1 ] && die "missing packages ($*) and RDMA_VM_NO_INSTALL=1"
  apt_update_once
  say "apt-get install $*"
  quiet as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
    || die "apt-get install $* failed"
}

missing_pkgs() {
  local have p
  have=$(dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null | awk '/ ok installed$/{print $1}')
  for p in "$@"; do grep -qx "$p" <<< "$have" || echo "$p"; done
}

ensure_host_packages() {
  local missing
  missing=$(missing_pkgs "${HOST_PKGS[@]}")
  # shellcheck disable=SC2086
  [ -z "$missing" ] || apt_install $missing
}

apt_kver() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/.*Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1
}

# Decide which Debian kernel ABI to use and make sure its cache exists.
resolve_kernel() {
  local k=${RDMA_VM_KVER:-}
  if [ -z "$k" ] && [ "${RDMA_VM_REFRESH:-0}" != 1 ] && [ -L "$CACHE/current" ] &&
     [ -f "$CACHE/current/ok" ]; then
    k=$(readlink "$CACHE/current")
  fi
  if [ -z "$k" ]; then
    if [ "${RDMA_VM_REFRESH:-0}" = 1 ]; then apt_update_once; fi
    k=$(apt_kver)
    if [ -z "$k" ] || [ ! -f "$CACHE/$k/ok" ]; then
      # a cache miss: make sure the package lists are current before building
      if [ "${RDMA_VM_NO_INSTALL:-0}" != 1 ]; then apt_update_once; k=$(apt_kver); fi
    fi
  fi
  [ -n "$k" ] || die "cannot determine a Debian kernel (apt-cache depends linux-image-amd64)"
  if [ ! -f "$CACHE/$k/ok" ] || [ "$(cat "$CACHE/$k/ok")" != "$CACHE_FORMAT" ]; then
    mkdir -p "$CACHE"
    exec 9> "$CACHE/.lock"; flock 9      # one builder at a time
    if [ ! -f "$CACHE/$k/ok" ] || [ "$(cat "$CACHE/$k/ok")" != "$CACHE_FORMAT" ]; then
      build_kernel_cache "$k"
    fi
    exec 9>&-
  fi
  ln -sfn "$k" "$CACHE/current"
  KVER=$k
}

# Modules for the initramfs; dependencies are resolved with modprobe.
WANT_MODS=(virtio_pci virtio_net virtio_console 9pnet_virtio 9p overlay
           crc32_generic crc32-pclmul crc32c_generic crc32c-intel libcrc32c
           configfs ib_core ib_uverbs ib_cm iw_cm rdma_cm rdma_ucm ib_umad
           udp_tunnel ip6_udp_tunnel rdma_rxe siw)

build_siw() { # $1=kver $2=image version $3=work dir $4=module dir
  local kver=$1 ver=$2 work=$3 kdir=$4 series hdr
  series=${kver%%-*}; series=${series%.*}                    # 6.1.0 -> 6.1
  hdr=linux-headers-$kver
  [ -z "$(missing_pkgs "$hdr")" ] || apt_install "$hdr"
  ( cd "$work" && { quiet apt-get download "linux-source-$series=$ver" ||
                    quiet apt-get download "linux-source-$series"; } ) \
    || { say "cannot download linux-source-$series"; return 1; }
  mkdir -p "$work/src"
  dpkg-deb --fsys-tarfile "$work"/linux-source-"$series"_*.deb |
    tar -xO "./usr/src/linux-source-$series.tar.xz" | xz -dc |
    tar -x -C "$work/src" --wildcards "linux-source-$series/drivers/infiniband/sw/siw/*" \
    || { say "cannot extract siw sources"; return 1; }
  rm -f "$work"/linux-source-*.deb
  local sdir=$work/src/linux-source-$series/drivers/infiniband/sw/siw
  quiet make -s -C "/lib/modules/$kver/build" M="$sdir" CONFIG_RDMA_SIW=m -j"$(nproc)" modules \
    || { say "building siw.ko failed"; return 1; }
  mkdir -p "$kdir/updates"
  strip --strip-debug -o "$kdir/updates/siw.ko" "$sdir/siw.ko"
}

build_kernel_cache() {
  local kver=$1 dst=$CACHE/$1 work
  mkdir -p "$CACHE"
  work=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm-build.XXXXXX"); chmod 755 "$work"
  # apt-get download drops privileges to _apt: let it write into $work
  id _apt >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && chown _apt "$work"
  say "building the VM kernel cache for $kver in $dst (one-time, about 1-2 min)"
  local pkg=linux-image-$kver
  ( cd "$work" && quiet apt-get download "$pkg" ) || {
    apt_update_once; ( cd "$work" && quiet apt-get download "$pkg" ) || die "apt-get download $pkg failed"; }
  local deb ver
  deb=$(ls "$work"/linux-image-*.deb | head -n1)
  ver=$(dpkg-deb -f "$deb" Version)
  mkdir -p "$work/k"
  dpkg -x "$deb" "$work/k"; rm -f "$deb"
  local kdir=$work/k/lib/modules/$kver
  [ -f "$work/k/boot/vmlinuz-$kver" ] || die "no vmlinuz in $pkg"

  if [ "$NO_SIW" != 1 ] && ! grep -q '^CONFIG_RDMA_SIW=' "$work/k/boot/config-$kver"; then
    build_siw "$kver" "$ver" "$work" "$kdir" || say "WARNING: continuing without siw"
  fi
  depmod -b "$work/k" "$kver"

  # --- initramfs: busybox + modules (flat, in load order) + /init
  local ird=$work/initrd m line f b
  mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,lower,newroot,ovl,rdmavm,lib/rdmavm}
  cp /bin/busybox "$ird/bin/busybox"
  : > "$ird/lib/rdmavm/order"
  for m in "${WANT_MODS[@]}"; do
    while read -r line; do
      case $line in insmod\ *) ;; *) continue ;; esac
      f=${line#insmod }; f=${f%% *}; b=$(basename "$f" .ko)
      grep -qx "$b" "$ird/lib/rdmavm/order" && continue
      cp "$f" "$ird/lib/rdmavm/$b.ko"; echo "$b" >> "$ird/lib/rdmavm/order"
    done < <(modprobe -d "$work/k" -S "$kver" --show-depends "$m" 2>/dev/null || true)
  done
  grep -qx rdma_rxe "$ird/lib/rdmavm/order" || die "rdma_rxe module missing from $pkg"
  write_init > "$ird/init"; chmod 755 "$ird/init"

  rm -rf "$dst.tmp"; mkdir -p "$dst.tmp"
  ( cd "$ird" && find . -print0 | cpio --null -o -H newc --quiet ) | gzip -1 > "$dst.tmp/initrd.img"
  cp "$work/k/boot/vmlinuz-$kver" "$dst.tmp/vmlinuz"
  # Uncompressed ELF vmlinux: qemu boots it directly via the PVH entry point,
  # which skips the (slow under TCG) firmware + decompression stage: ~3.5 s.
  local off
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$dst.tmp/vmlinuz" | head -n1 | cut -d: -f1 || true)
  # (xz stops after the first stream, so tail gets SIGPIPE: ignore the status)
  [ -n "$off" ] && { tail -c +$((off + 1)) "$dst.tmp/vmlinuz" | xz -dc --single-stream > "$dst.tmp/vmlinux" 2>/dev/null || true; }
  if [ -s "$dst.tmp/vmlinux" ] && [ "$(head -c 4 "$dst.tmp/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ] &&
     grep -q '^CONFIG_PVH=y' "$work/k/boot/config-$kver"; then :; else
    rm -f "$dst.tmp/vmlinux"; say "note: no PVH vmlinux, booting the bzImage (slower)"
  fi
  cp "$work/k/boot/config-$kver" "$dst.tmp/config"
  cp "$ird/lib/rdmavm/order" "$dst.tmp/modules.txt"
  echo "$ver" > "$dst.tmp/version"
  echo "$CACHE_FORMAT" > "$dst.tmp/ok"
  rm -rf "$dst"; mv "$dst.tmp" "$dst"
  rm -rf "$work"
  say "cache ready: $dst ($(du -sh "$dst" | cut -f1), $(wc -l < "$dst/modules.txt") modules)"
}

# The initramfs /init (busybox sh).
write_init() {
cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
log() { echo "rdma-vm[$(cut -d' ' -f1 /proc/uptime)]: $*"; }
fail() { log "FATAL: $*"; echo 125 > /rdmavm/rc 2>/dev/null; sync; poweroff -f; sleep 5; exit 1; }
log "init start"
while read -r m; do
  insmod "/lib/rdmavm/$m.ko" 2>/dev/null || log "insmod $m failed (ignored)"
done < /lib/rdmavm/order
log "modules loaded"
o=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $o,cache=none rdmavm_run /rdmavm || fail "mount run share"
. /rdmavm/config
mount -t 9p -o $o,ro,cache=loose hostroot /lower || fail "mount host root"
mount -t tmpfs -o mode=755,size=75% tmpfs /ovl
mkdir -p /ovl/upper /ovl/work
if ! mount -t overlay overlay -o lowerdir=/lower,upperdir=/ovl/upper,workdir=/ovl/work /newroot; then
  log "overlay failed; using read-only root + tmpfs /tmp"
  mount --bind /lower /newroot
  mount -t tmpfs tmpfs /newroot/tmp; mount -t tmpfs tmpfs /newroot/var/tmp
fi
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t tmpfs -o mode=755 tmpfs $R/run
mount -t configfs configfs $R/sys/kernel/config 2>/dev/null
mkdir -p $R/run/rdmavm; mount --bind /rdmavm $R/run/rdmavm
i=0
for d in $RW_DIRS; do
  mkdir -p "$R$d"
  mount -t 9p -o $o,cache=mmap "rdmavm_rw$i" "$R$d" || fail "mount rw dir $d"
  i=$((i+1))
done
hostname rdma-vm
# guest clock := host clock (9p file mtimes are stamped by the host)
touch /rdmavm/.clock && chroot $R date -s "@$(chroot $R stat -c %.9Y /run/rdmavm/.clock)" >/dev/null
[ "$ASLR" = 1 ] || echo 0 > /proc/sys/kernel/randomize_va_space
# network: NICs without host backend; rxe0 on eth0, siw0 on $SIW_NETDEV
ip link set lo up
ip link set eth0 up && ip addr add $IP0/24 dev eth0 || fail "eth0"
ip link set eth1 up && ip addr add $IP1/24 dev eth1 || fail "eth1"
chroot $R rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
if [ "$NO_SIW" != 1 ]; then
  chroot $R rdma link add siw0 type siw netdev $SIW_NETDEV || log "WARNING: rdma link add siw0 failed"
fi
# wait (max ~5 s) for the IPv4 GID on rxe0 index 1
n=0; while [ $n -lt 50 ] && ! grep -q "0000:0000:0000:0000:0000:ffff" /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null; do sleep 0.1; n=$((n+1)); done
[ $n -lt 50 ] || log "WARNING: rxe0 GID index 1 is not the IPv4-mapped GID"
port() { for p in /sys/class/virtio-ports/*; do [ "$(cat $p/name 2>/dev/null)" = "$1" ] && { echo /dev/${p##*/}; return; }; done; echo /dev/console; }
OUT=$(port rdmavm.out); ERR=$(port rdmavm.err)
log "setup done, running command"
ulimit -l unlimited
chroot $R /bin/bash /run/rdmavm/cmd.sh < /dev/null > $OUT 2> $ERR
rc=$?
log "command exited with $rc"
[ "$SAVE_DMESG" = 1 ] && dmesg > /rdmavm/dmesg
echo $rc > /rdmavm/rc
sync
poweroff -f
sleep 10
INIT
}

# ---------------------------------------------------------------- main
PREPARE_ONLY=0
case ${1:-} in
  --prepare) PREPARE_ONLY=1; shift ;;
  --) shift ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
[ $PREPARE_ONLY = 1 ] || [ $# -gt 0 ] || { say "usage: $PROG [--prepare] [--] COMMAND [ARGS...]"; exit 2; }

T_START=$(date +%s.%N)
ensure_host_packages
resolve_kernel
[ $PREPARE_ONLY = 1 ] && { say "prepared $CACHE/$KVER"; exit 0; }
KDIR=$CACHE/$KVER
KERNEL=$KDIR/vmlinuz; [ -f "$KDIR/vmlinux" ] && KERNEL=$KDIR/vmlinux
[ "$NO_SIW" != 1 ] && ! grep -qx siw "$KDIR/modules.txt" && say "warning: no siw module in the cache"

RUN=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm-run.XXXXXX")
QPID='' CAT1='' CAT2='' CONSOLE_TAIL='' WATCH=''
cleanup() {
  local p
  for p in $QPID $CAT1 $CAT2 $CONSOLE_TAIL $WATCH; do kill "$p" 2>/dev/null || true; done
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# read-write shares
RW_LIST=()
if [ "${RDMA_VM_RW_DIRS-}" != none ]; then
  IFS=: read -r -a _rw <<< "${RDMA_VM_RW_DIRS:-$PWD}"
  for d in "${_rw[@]}"; do
    [ -n "$d" ] || continue
    d=$(cd "$d" && pwd -P) || die "RW dir $d does not exist"
    case $d in
      /) die "RDMA_VM_RW_DIRS may not contain /" ;;
      *[[:space:]\'\"\\]*) die "RW dir with whitespace/quotes not supported: $d" ;;
    esac
    RW_LIST+=("$d")
  done
fi

# the command script, run by the host's /bin/bash inside the guest chroot
{
  echo '#!/bin/bash'
  export -p | grep -Ev '^declare -x (PWD|OLDPWD|SHLVL|HOSTNAME|_|TMPDIR)=' || true
  echo "export RDMA_VM=1 RDMA_VM_IP0=$IP0 RDMA_VM_IP1=$IP1 RDMA_VM_RXE=rxe0 RDMA_VM_SIW=siw0"
  printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} > "$RUN/cmd.sh"
{
  echo "IP0=$IP0 IP1=$IP1 SIW_NETDEV=$SIW_NETDEV NO_SIW=$NO_SIW ASLR=${RDMA_VM_ASLR:-0}"
  echo "SAVE_DMESG=$([ -n "${RDMA_VM_DMESG:-}" ] && echo 1 || echo 0)"
  echo "RW_DIRS='${RW_LIST[*]:-}'"
} > "$RUN/config"

mkfifo "$RUN/out.fifo" "$RUN/err.fifo"
cat "$RUN/out.fifo" & CAT1=$!
cat "$RUN/err.fifo" >&2 & CAT2=$!

APPEND="console=ttyS0 panic=-1 quiet loglevel=4"
[ "${RDMA_VM_ASLR:-0}" = 1 ] || APPEND+=" norandmaps"
# shellcheck disable=SC2054  # commas are qemu option syntax
QEMU_ARGS=(
  -machine q35,accel=tcg -cpu "$CPU" -smp "$SMP" -m "$MEM"
  -nodefaults -no-user-config -display none -no-reboot
  -kernel "$KERNEL" -initrd "$KDIR/initrd.img"
  -append "$APPEND ${RDMA_VM_APPEND:-}"
  -serial "file:$RUN/console.log"
  -fsdev local,id=fsroot,path=/,security_model=none,readonly=on,multidevs=remap
  -device virtio-9p-pci,fsdev=fsroot,mount_tag=hostroot
  -fsdev "local,id=fsrun,path=$RUN,security_model=none"
  -device virtio-9p-pci,fsdev=fsrun,mount_tag=rdmavm_run
  -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:01,romfile=
  -netdev hubport,id=n1,hubid=1 -device virtio-net-pci,netdev=n1,mac=52:54:00:78:00:01,romfile=
  -device virtio-serial-pci
  -chardev "file,id=cout,path=$RUN/out.fifo" -device virtserialport,chardev=cout,name=rdmavm.out
  -chardev "file,id=cerr,path=$RUN/err.fifo" -device virtserialport,chardev=cerr,name=rdmavm.err
)
i=0
for d in "${RW_LIST[@]}"; do
  QEMU_ARGS+=(-fsdev "local,id=fsrw$i,path=$d,security_model=none,multidevs=remap"
              -device "virtio-9p-pci,fsdev=fsrw$i,mount_tag=rdmavm_rw$i")
  i=$((i+1))
done
# shellcheck disable=SC2206
[ -n "${RDMA_VM_QEMU_EXTRA:-}" ] && QEMU_ARGS+=($RDMA_VM_QEMU_EXTRA)
if [ "${RDMA_VM_CONSOLE:-0}" = 1 ]; then
  : > "$RUN/console.log"
  tail -n +1 -f "$RUN/console.log" >&2 & CONSOLE_TAIL=$!
fi

# One VM at a time: two TCG guests on a 2-core machine starve each other (and
# every benchmark). Later callers wait here for the earlier VM to power off.
if [ "${RDMA_VM_NO_LOCK:-0}" != 1 ]; then
  mkdir -p "$CACHE"
  exec 8> "$CACHE/.vm.lock"
  if ! flock -n 8; then
    say "another rdma-vm is running; waiting for it (RDMA_VM_NO_LOCK=1 skips this)"
    flock 8
  fi
fi

T_QEMU=$(date +%s.%N)
set +e
timeout -k 10 "$VM_TIMEOUT" qemu-system-x86_64 "${QEMU_ARGS[@]}" </dev/null 2> "$RUN/qemu.err" &
QPID=$!
# Boot watchdog: a guest that hangs before the command starts (seen once, cause unknown)
# would otherwise hold the run until VM_TIMEOUT (50 min) and say nothing. The guest's
# /init logs "setup done" on the console (ttyS0, the file console.log) right before it runs
# the command: a caller that moves the console elsewhere gets no watchdog.
WATCH_BOOT=1
case "${RDMA_VM_APPEND:-} ${RDMA_VM_QEMU_EXTRA:-}" in *console=*|*-serial*) WATCH_BOOT=0 ;; esac
if [ $WATCH_BOOT = 1 ]; then
  (
    n=0
    while [ $n -lt "$BOOT_TIMEOUT" ]; do
      sleep 1; n=$((n + 1))
      grep -q 'setup done, running command' "$RUN/console.log" 2>/dev/null && exit 0
      kill -0 "$QPID" 2>/dev/null || exit 0
    done
    : > "$RUN/boot-hung"
    kill "$QPID" 2>/dev/null
  ) & WATCH=$!
fi
wait "$QPID"; QRC=$?
if [ -n "$WATCH" ]; then kill "$WATCH" 2>/dev/null || true; wait "$WATCH" 2>/dev/null || true; fi
WATCH=
set -e
QPID=
grep -v 'is not connected to host network' "$RUN/qemu.err" >&2 || true
wait "$CAT1" 2>/dev/null || true; CAT1=
wait "$CAT2" 2>/dev/null || true; CAT2=
[ -n "$CONSOLE_TAIL" ] && { sleep 0.3; kill "$CONSOLE_TAIL" 2>/dev/null || true; CONSOLE_TAIL=; }
T_END=$(date +%s.%N)

if [ -f "$RUN/rc" ]; then  # the command's own status, even if the watchdog fired late
  RC=$(cat "$RUN/rc")
elif [ -f "$RUN/boot-hung" ]; then
  say "the guest did not reach the command within ${BOOT_TIMEOUT}s (hung in boot or setup;" \
      "RDMA_VM_BOOT_TIMEOUT sets the limit): VM stopped"
  RC=125
elif [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
  say "VM timed out after ${VM_TIMEOUT}s"; RC=124
else
  say "no exit status from the VM (qemu exit $QRC)"; RC=125
fi
if [ "$RC" = 124 ] || [ "$RC" = 125 ]; then
  [ "${RDMA_VM_CONSOLE:-0}" = 1 ] || { say "guest console (last 40 lines):"; tail -n 40 "$RUN/console.log" >&2 || true; }
fi
[ -n "${RDMA_VM_DMESG:-}" ] && [ -f "$RUN/dmesg" ] && cp "$RUN/dmesg" "$RDMA_VM_DMESG"
if [ "${RDMA_VM_TIMING:-0}" = 1 ]; then
  grep -h 'rdma-vm\[' "$RUN/console.log" >&2 || true
  awk -v a="$T_START" -v b="$T_QEMU" -v c="$T_END" \
    'BEGIN{printf "rdma-vm timing: host prepare %.2fs, qemu %.2fs, total %.2fs\n", b-a, c-b, c-a}' >&2
fi
exit "$RC"
