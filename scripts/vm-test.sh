#!/usr/bin/env bash
# Two-VM end-to-end test of ntbdk's vfio path, under QEMU TCG.
#
# 1. Installs what is missing from Debian's packages (qemu-system-x86,
#    linux-image-amd64, busybox-static, cpio, kmod, binutils); needs root for that.
# 2. Builds the apps as static binaries into target/vm (its own target dir, so
#    the normal build is not invalidated).
# 3. Makes an initramfs: busybox, the vfio modules of the installed Debian
#    kernel (in the order modules.dep gives, decompressed), the stripped apps,
#    scripts/ntbdk-devbind, and scripts/vm/{init,role.sh}.
# 4. Boots two guests (roles server and client) with a vIOMMU and one
#    ivshmem-plain function each, both on one shared memory-backend-file:
#    their BAR2s are the same host memory. Each guest binds its function to
#    vfio-pci with ntbdk-devbind, checks /dev/vfio/<group>, runs the workload
#    and prints NTBDK-VM-RESULT on its serial console, then powers off.
#
# Sources: QEMU docs/specs/ivshmem-spec.rst and docs/system/devices/ivshmem.rst
# (ivshmem-plain + memory-backend-file,share=on), QEMU docs/devel/tcg.rst and
# qemu-options (-accel tcg), QEMU hw/i386/intel_iommu.c vtd_decide_config()
# (eim=on needs KVM with kernel-irqchip=split, so eim=off under TCG), Linux
# Documentation/admin-guide/kernel-parameters.txt (intel_iommu=on).
#
# Environment:
#   NTBDK_VM_WORKLOAD=perf|smoke  guest workload (default perf: ntb-perf
#                                 server/client over vfio:<BDF>, zero non-posted
#                                 reads required, then a file sent with ntb-fwd
#                                 file-trans and compared byte for byte; smoke:
#                                 bind, check /dev/vfio, run the static apps'
#                                 --help; see scripts/vm/role.sh)
#   NTBDK_VM_PEER_DEATH=1         kill the client's QEMU during a second
#                                 ntb-perf session; the server must notice
#                                 (within 15 s; the heartbeat timeout is 1 s),
#                                 exit cleanly and end with ok (with smoke this
#                                 only tests the harness)
#   NTBDK_VM_KILL_AFTER=SECS      peer death: seconds between both guests'
#                                 READY and the kill (default 0 for smoke,
#                                 5 for perf, so that traffic flows)
#   NTBDK_VM_TIMEOUT=SECS         hard limit per guest, QEMU is killed (180)
#   NTBDK_VM_MEM=MIB              guest RAM (384)
#   NTBDK_VM_SHM=MIB              size of the shared ivshmem memory (16)
#   NTBDK_VM_KEEP=1               keep the work dir (logs, initramfs)
#   NTBDK_VM_NO_INSTALL=1         do not apt-get anything; fail if missing
#   NTBDK_VM_TARGET_DIR=DIR       cargo target dir of the static build
#                                 (default target/vm)
#
# Exit status: 0 when both guests end with NTBDK-VM-RESULT: ok; else 1, after
# printing the tail of each guest's console.
set -euo pipefail
# modprobe lives in /sbin, which Debian leaves off a non-root user's PATH.
PATH=$PATH:/usr/sbin:/sbin
cd "$(dirname "$0")/.."
ROOT=$PWD

WORKLOAD=${NTBDK_VM_WORKLOAD:-perf}
PEER_DEATH=${NTBDK_VM_PEER_DEATH:-0}
TIMEOUT=${NTBDK_VM_TIMEOUT:-180}
if [ "$WORKLOAD" = perf ]; then KILL_AFTER=${NTBDK_VM_KILL_AFTER:-5}; else KILL_AFTER=${NTBDK_VM_KILL_AFTER:-0}; fi
MEM=${NTBDK_VM_MEM:-384}
SHM_MIB=${NTBDK_VM_SHM:-16}
# the ivshmem function's fixed slot in each guest (QEMU -device ...,addr=)
SLOT=4
BDF=$(printf '0000:00:%02x.0' "$SLOT")

T0=$(date +%s.%N)
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "== vm-test [$(elapsed)s] $*"; }
die() {
    echo "vm-test: error: $*" >&2
    exit 1
}

case "$WORKLOAD" in smoke | perf) ;; *) die "NTBDK_VM_WORKLOAD must be smoke or perf, not '$WORKLOAD'" ;; esac
case "$PEER_DEATH" in 0 | 1) ;; *) die "NTBDK_VM_PEER_DEATH must be 0 or 1" ;; esac

# ------------------------------------------------------------------ packages
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
# busybox-static's /bin/busybox (the dynamic "busybox" package would not run
# in the initramfs, which has no libc)
dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' ||
    need_pkgs+=(busybox-static)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v modprobe >/dev/null || need_pkgs+=(kmod)
command -v strip >/dev/null || need_pkgs+=(binutils)
# a Debian kernel with vfio-pci as a module, and its modules
find_kernel() {
    local v
    for v in $(for f in /boot/vmlinuz-*; do [ -e "$f" ] && echo "${f#/boot/vmlinuz-}"; done | sort -rV); do
        if [ -r "/boot/vmlinuz-$v" ] && grep -q '/vfio-pci\.ko' "/lib/modules/$v/modules.dep" 2>/dev/null; then
            echo "$v"
            return 0
        fi
    done
    return 1
}
find_kernel >/dev/null || need_pkgs+=(linux-image-amd64)

if [ ${#need_pkgs[@]} -gt 0 ]; then
    [ "${NTBDK_VM_NO_INSTALL:-0}" = 1 ] && die "missing: ${need_pkgs[*]} (NTBDK_VM_NO_INSTALL=1)"
    [ "$(id -u)" -eq 0 ] || die "missing Debian packages ${need_pkgs[*]}: run as root or apt-get install them"
    log "installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o Acquire::Retries=3 update -q >/dev/null
    apt-get -o Acquire::Retries=3 install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
KVER=$(find_kernel) || die "no kernel with vfio-pci modules under /boot and /lib/modules"
VMLINUZ=/boot/vmlinuz-$KVER
log "kernel $KVER, $(qemu-system-x86_64 --version | head -n 1)"

# ------------------------------------------------------------ static build
TARGET_DIR=${NTBDK_VM_TARGET_DIR:-$ROOT/target/vm}
log "building static apps ($TARGET_DIR)"
# --target makes RUSTFLAGS apply to the apps only, not to build scripts and
# proc macros (which cannot be static); glibc static binaries need no libc
# in the initramfs
RUSTFLAGS='-C target-feature=+crt-static' nice cargo build --release --quiet \
    --target x86_64-unknown-linux-gnu -p ntbdk-apps --target-dir "$TARGET_DIR"
BIN=$TARGET_DIR/x86_64-unknown-linux-gnu/release
APPS=(ntb-perf ntb-pingpong ntb-fwd ntb-tool)
for a in "${APPS[@]}"; do
    [ -x "$BIN/$a" ] || die "static build did not produce $BIN/$a"
done

# --------------------------------------------------------------- initramfs
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ntbdk-vm.XXXXXX")
SERVER_PID=''
CLIENT_PID=''
# kill_guest ROLE: SIGKILL its QEMU (not only the timeout wrapper around it)
kill_guest() {
    local p
    p=$(cat "$WORK/$1.pid" 2>/dev/null) || return 1
    case "$(cat "/proc/$p/comm" 2>/dev/null)" in
        qemu*) kill -9 "$p" 2>/dev/null ;;
        *) return 1 ;;
    esac
}
cleanup() {
    local p
    for p in $SERVER_PID $CLIENT_PID; do
        kill -9 "$p" 2>/dev/null || true
    done
    kill_guest server || true
    kill_guest client || true
    if [ "${NTBDK_VM_KEEP:-0}" = 1 ]; then
        echo "vm-test: work dir kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

log "initramfs in $WORK"
IR=$WORK/initramfs
mkdir -p "$IR"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,lib/modules,ntbdk}
cp /bin/busybox "$IR/bin/busybox"
ln -s busybox "$IR/bin/sh"
mkdir -p "$IR/etc"
printf 'root:x:0:0:root:/:/bin/sh\nntb:x:1000:1000:ntbdk test user:/tmp:/bin/sh\n' >"$IR/etc/passwd"
printf 'root:x:0:\nntb:x:1000:\n' >"$IR/etc/group"
install -m 0755 scripts/vm/init "$IR/init"
install -m 0755 scripts/vm/role.sh "$IR/ntbdk/role.sh"
install -m 0755 scripts/ntbdk-devbind "$IR/ntbdk/ntbdk-devbind"
for a in "${APPS[@]}"; do
    strip -o "$IR/ntbdk/$a" "$BIN/$a"
done

# vfio modules in dependency order: modprobe --show-depends reads modules.dep
# and the softdeps (vfio's "post: vfio_iommu_type1"), one "insmod PATH" each;
# listed in this shell first, so that a failure stops the script
: >"$IR/ntbdk/modules.order"
: >"$WORK/modules.deps"
for m in vfio-pci vfio_iommu_type1; do
    modprobe -S "$KVER" --show-depends "$m" >>"$WORK/modules.deps" ||
        die "modprobe --show-depends $m failed for $KVER"
done
while read -r path; do
    name=${path##*/}
    case "$name" in
        *.ko) cp "$path" "$IR/lib/modules/$name" ;;
        *.ko.xz) name=${name%.xz}; xz -dc "$path" >"$IR/lib/modules/$name" ;;
        *.ko.zst) name=${name%.zst}; zstd -qdc "$path" >"$IR/lib/modules/$name" ;;
        *.ko.gz) name=${name%.gz}; gzip -dc "$path" >"$IR/lib/modules/$name" ;;
        *) die "unexpected module file $path" ;;
    esac
    echo "$name" >>"$IR/ntbdk/modules.order"
done < <(awk '$1 == "insmod" && !seen[$2]++ { print $2 }' "$WORK/modules.deps")
for m in vfio-pci vfio_iommu_type1; do
    # a module, or built into the kernel ("builtin NAME")
    # (kmod prints a built-in module's name with underscores)
    grep -qx "$m.ko" "$IR/ntbdk/modules.order" || grep -q "^builtin ${m//-/_}\$" "$WORK/modules.deps" ||
        die "$m not found for $KVER (neither a module nor built in)"
done
log "modules: $(tr '\n' ' ' <"$IR/ntbdk/modules.order")"
# the kernel unpacks an uncompressed cpio fastest under TCG
(cd "$IR" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$WORK/initramfs.cpio"
log "initramfs: $(du -h "$WORK/initramfs.cpio" | cut -f 1)"

# ------------------------------------------------------------------ guests
SHM=$WORK/ivshmem.mem
truncate -s "${SHM_MIB}M" "$SHM"

# boot_guest ROLE: starts QEMU in the background (the caller takes $!, the
# timeout process), console to $WORK/ROLE.log, QEMU's own pid in ROLE.pid
boot_guest() {
    local role=$1
    local cmdline="console=ttyS0 intel_iommu=on panic=-1 loglevel=4"
    cmdline+=" ntbdk.role=$role ntbdk.workload=$WORKLOAD ntbdk.bdf=$BDF ntbdk.peer_death=$PEER_DEATH"
    # -accel tcg: no usable KVM here. q35 + intel-iommu gives vfio-pci a
    # real IOMMU group (intremap=on needs kernel-irqchip=split; eim=off as
    # TCG has no EIM). -nodefaults drops the VGA and NIC we do not need.
    # the subshell (with exit, so that bash does not exec) keeps bash's
    # "Killed" job message for a guest we kill off the terminal
    (
        nice -n 5 timeout --foreground -s KILL "$TIMEOUT" qemu-system-x86_64 \
            -accel tcg -M q35,kernel-irqchip=split -cpu max -smp 1 -m "$MEM" \
            -device intel-iommu,intremap=on,eim=off \
            -nodefaults -display none -no-reboot \
            -serial "file:$WORK/$role.log" -pidfile "$WORK/$role.pid" \
            -kernel "$VMLINUZ" -initrd "$WORK/initramfs.cpio" -append "$cmdline" \
            -object "memory-backend-file,id=ivshmem,size=${SHM_MIB}M,mem-path=$SHM,share=on" \
            -device "ivshmem-plain,memdev=ivshmem,addr=$(printf '0x%x' "$SLOT")" \
            >"$WORK/$role.qemu.log" 2>&1
        exit $?
    ) 2>/dev/null &
}

declare -A STARTED DONE_AT
has_marker() { grep -q "$2" "$WORK/$1.log" 2>/dev/null; }

tail_console() {
    local role=$1
    echo "---- $role console (last 40 lines of $WORK/$role.log)"
    tail -n 40 "$WORK/$role.log" 2>/dev/null || echo "(no console output)"
    if [ -s "$WORK/$role.qemu.log" ]; then
        echo "---- $role qemu stderr"
        tail -n 20 "$WORK/$role.qemu.log"
    fi
}

log "booting 2 guests (TCG, ${MEM} MiB, ivshmem ${SHM_MIB} MiB at $BDF, workload=$WORKLOAD peer_death=$PEER_DEATH, limit ${TIMEOUT}s each)"
STARTED[server]=$(date +%s.%N)
boot_guest server
SERVER_PID=$!
STARTED[client]=$(date +%s.%N)
boot_guest client
CLIENT_PID=$!

since() { awk -v a="${STARTED[$1]}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
declare -A BOOTED
KILLED=''
KILLED_AT=''
READY_AT=''
alive() { kill -0 "$1" 2>/dev/null; }
PASS=''
while :; do
    for role in server client; do
        if [ -z "${BOOTED[$role]:-}" ] && has_marker "$role" 'NTBDK-VM-BOOTED'; then
            BOOTED[$role]=$(since "$role")
            log "$role: userspace after ${BOOTED[$role]}s"
        fi
        if [ -z "${DONE_AT[$role]:-}" ] && has_marker "$role" 'NTBDK-VM-RESULT'; then
            DONE_AT[$role]=$(since "$role")
            log "$role: $(grep -m 1 -o 'NTBDK-VM-RESULT:.*' "$WORK/$role.log" | tr -d '\r') after ${DONE_AT[$role]}s"
        fi
    done
    # peer death: once both are READY, kill the client's QEMU (SIGKILL, as a
    # host crash would) and let the server report
    if [ "$PEER_DEATH" = 1 ] && [ -z "$KILLED" ] && [ -z "$READY_AT" ] &&
        has_marker server 'NTBDK-VM-READY' && has_marker client 'NTBDK-VM-READY'; then
        READY_AT=$(date +%s)
        log "both guests READY; killing the client in ${KILL_AFTER}s"
    fi
    if [ -n "$READY_AT" ] && [ -z "$KILLED" ] && [ "$(date +%s)" -ge $((READY_AT + KILL_AFTER)) ]; then
        if ! has_marker client 'NTBDK-VM-RESULT'; then
            if kill_guest client; then
                KILLED=client
                KILLED_AT=$(since server)
                log "peer death: killed the client's QEMU"
            else
                KILLED=kill-failed
            fi
        else
            KILLED=too-late
        fi
    fi
    sleep 0.5
    [ "$PASS" = last ] && break
    if ! alive "$SERVER_PID" && ! alive "$CLIENT_PID"; then
        PASS=last # one more pass for the markers of a guest that just ended
    fi
done
wait "$SERVER_PID" 2>/dev/null || true
wait "$CLIENT_PID" 2>/dev/null || true
SERVER_PID=''
CLIENT_PID=''

# ------------------------------------------------------------------ verdict
failed=0
check_ok() { # ROLE
    local role=$1
    if grep -q 'NTBDK-VM-RESULT: ok' "$WORK/$role.log" 2>/dev/null; then
        return 0
    fi
    if has_marker "$role" 'NTBDK-VM-RESULT'; then
        echo "vm-test: $role guest reported failure" >&2
    elif [ -n "${BOOTED[$role]:-}" ]; then
        echo "vm-test: $role guest gave no result within ${TIMEOUT}s (killed or hung)" >&2
    else
        echo "vm-test: $role guest did not boot to userspace within ${TIMEOUT}s" >&2
    fi
    return 1
}
check_ok server || failed=1
if [ "$PEER_DEATH" = 1 ]; then
    if [ "$KILLED" != client ]; then
        echo "vm-test: peer death: the client was not killed while running (${KILLED:-never READY})" >&2
        failed=1
    elif [ -n "${DONE_AT[server]:-}" ]; then
        # The ivshmem fabric's heartbeat timeout is 1 s; allow for a slow
        # TCG guest, but a server that noticed only at its own --timeout
        # (60 s) did not detect the death.
        took=$(awk -v a="$KILLED_AT" -v b="${DONE_AT[server]}" 'BEGIN { printf "%.1f", b - a }')
        log "peer death: the server ended ${took}s after the kill"
        if awk -v t="$took" 'BEGIN { exit !(t > 15) }'; then
            echo "vm-test: peer death: the server took ${took}s to notice (more than 15 s)" >&2
            failed=1
        elif awk -v t="$took" 'BEGIN { exit !(t < 0) }'; then
            echo "vm-test: peer death: the server ended ${took#-}s before the kill: it never saw the client die" >&2
            failed=1
        fi
    fi
else
    check_ok client || failed=1
fi

if [ "$failed" -ne 0 ]; then
    tail_console server
    tail_console client
    log "FAILED"
    exit 1
fi
# What each guest did, and the in-VM figures (a sanity check only: no
# performance figure means anything under TCG).
for role in server client; do
    grep -E 'NTBDK-VM-BOOTED|ntbdk-vm\[|#bytes|^ *[0-9]+ +[0-9]+ +[0-9.]+|non-posted reads|file (sent|received)' \
        "$WORK/$role.log" | tr -d '\r' | sed "s/^/   $role: /"
done
log "ok: server booted in ${BOOTED[server]:-?}s and finished in ${DONE_AT[server]:-?}s," \
    "client ${BOOTED[client]:-?}s / ${DONE_AT[client]:-(killed) }s (wall, host side)"
