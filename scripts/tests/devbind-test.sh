#!/bin/sh
# Tests of scripts/ntbdk-devbind against a fake sysfs tree (NTBDK_SYSFS).
#
# A fake tree cannot emulate the kernel's bind (writing to drivers_probe does
# not create a driver link), so this tests what is testable: --status output,
# argument errors, the refusals (in use, unknown device, no IOMMU, no IOMMU
# group, missing module, unknown user), the already-bound no-op, --user, and
# that a bind which does not take is rolled back (driver_override cleared).
# Real binds are tested in the VM test (scripts/vm-test.sh).
#
# Runs the suite under each shell given in DEVBIND_TEST_SHELLS (default: sh,
# and busybox sh when busybox is installed, as in the VM test's initramfs).
#
# Usage: scripts/tests/devbind-test.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
DEVBIND=$PWD/scripts/ntbdk-devbind

TMP=$(mktemp -d "${TMPDIR:-/tmp}/devbind-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM

PASS=0
FAIL=0

# ------------------------------------------------------------------ the fake

# make_dev BDF VENDOR DEVICE CLASS [DRIVER] [GROUP]
make_dev() {
    d=$SYS/bus/pci/devices/$1
    mkdir -p "$d"
    echo "$2" >"$d/vendor"
    echo "$3" >"$d/device"
    echo "$4" >"$d/class"
    v=$(echo "${2#0x}" | tr 'a-f' 'A-F')
    p=$(echo "${3#0x}" | tr 'a-f' 'A-F')
    c=$(echo "${4#0x}" | tr 'a-f' 'A-F')
    c1=$(echo "$c" | cut -c 1-2)
    c2=$(echo "$c" | cut -c 3-4)
    c3=$(echo "$c" | cut -c 5-6)
    echo "pci:v0000${v}d0000${p}sv00008086sd00000000bc${c1}sc${c2}i${c3}" >"$d/modalias"
    : >"$d/driver_override"
    if [ -n "${5:-}" ]; then
        mkdir -p "$SYS/bus/pci/drivers/$5"
        ln -s "../../../bus/pci/drivers/$5" "$d/driver"
    fi
    if [ -n "${6:-}" ]; then
        mkdir -p "$SYS/kernel/iommu_groups/$6/devices"
        ln -s "../../../kernel/iommu_groups/$6" "$d/iommu_group"
        ln -s "../../../../bus/pci/devices/$1" "$SYS/kernel/iommu_groups/$6/devices/$1"
    fi
}

# a fresh fake system: an IOMMU, vfio-pci loaded, and four functions:
#   0000:00:04.0 ivshmem, no driver, group 3
#   0000:00:05.0 ivshmem, vfio-pci, group 5, /dev/vfio/5 present
#   0000:af:00.0 Intel SKX NTB, ntb_hw_intel (with an ntb0 child), group 7
#   0000:00:01.0 a NIC (not NTB), e1000e, group 1
#   0000:b0:00.0 Intel ICX NTB, vfio-pci, group 8, /dev/vfio/8 present
make_fake() {
    rm -rf "$TMP/fake"
    SYS=$TMP/fake/sys
    DEV=$TMP/fake/dev
    MOD=$TMP/fake/modules
    PROC=$TMP/fake/proc
    mkdir -p "$SYS/bus/pci/devices" "$SYS/class/iommu/dmar0" "$DEV/vfio" "$MOD" "$PROC/1/fd"
    # a process holding something else open
    ln -s /dev/null "$PROC/1/fd/0"
    echo init >"$PROC/1/comm"
    : >"$SYS/bus/pci/drivers_probe"
    make_dev 0000:00:04.0 0x1af4 0x1110 0x050000 '' 3
    make_dev 0000:00:05.0 0x1af4 0x1110 0x050000 vfio-pci 5
    make_dev 0000:af:00.0 0x8086 0x201c 0x068000 ntb_hw_intel 7
    mkdir -p "$SYS/bus/pci/devices/0000:af:00.0/ntb0"
    make_dev 0000:00:01.0 0x8086 0x10d3 0x020000 e1000e 1
    make_dev 0000:b0:00.0 0x8086 0x347e 0x068000 vfio-pci 8
    : >"$DEV/vfio/8"
    for drv in vfio-pci ntb_hw_intel e1000e; do
        mkdir -p "$SYS/bus/pci/drivers/$drv"
        : >"$SYS/bus/pci/drivers/$drv/bind"
        : >"$SYS/bus/pci/drivers/$drv/unbind"
        : >"$SYS/bus/pci/drivers/$drv/new_id"
    done
    : >"$DEV/vfio/vfio"
    : >"$DEV/vfio/5"
    cat >"$MOD/modules.alias" <<'EOF'
alias pci:v00008086d0000201Csv*sd*bc06sc80i* ntb_hw_intel
alias pci:v00008086d0000347Esv*sd*bc06sc80i* ntb_hw_intel
alias pci:v00008086d000010D3sv*sd*bc*sc*i* e1000e
alias pci:v*d*sv*sd*bc0Csc03i30* xhci_pci
EOF
}

# ------------------------------------------------------------------- harness

# run ARGS...: runs the script on the fake; sets OUT, ERR, RC
run() {
    # shellcheck disable=SC2086 # SHELL_CMD may be "busybox sh"
    NTBDK_SYSFS=$SYS NTBDK_DEV=$DEV NTBDK_MODULES=$MOD NTBDK_PROC=$PROC NTBDK_MODPROBE=${MODPROBE_CMD:-false} \
        NTBDK_SETTLE=${SETTLE:-0} $SHELL_CMD "$DEVBIND" "$@" >"$TMP/out" 2>"$TMP/err"
    RC=$?
    OUT=$(cat "$TMP/out")
    ERR=$(cat "$TMP/err")
}

ok() {
    PASS=$((PASS + 1))
}

bad() {
    FAIL=$((FAIL + 1))
    echo "FAIL [$SHELL_CMD] $CASE: $*"
    echo "  exit $RC"
    echo "$OUT" | sed 's/^/  stdout: /'
    echo "$ERR" | sed 's/^/  stderr: /'
}

expect_rc() {
    if [ "$RC" -eq "$1" ]; then ok; else bad "expected exit $1"; fi
}

expect_out() { # PATTERN (grep -E on stdout)
    if printf '%s\n' "$OUT" | grep -q -E -e "$1"; then ok; else bad "stdout lacks /$1/"; fi
}

expect_no_out() {
    if printf '%s\n' "$OUT" | grep -q -E -e "$1"; then bad "stdout has /$1/"; else ok; fi
}

expect_err() {
    if printf '%s\n' "$ERR" | grep -q -E -e "$1"; then ok; else bad "stderr lacks /$1/"; fi
}

expect_file() { # FILE CONTENT (exact, newlines stripped)
    got=$(tr -d '\n' <"$1")
    if [ "$got" = "$2" ]; then ok; else bad "$1 holds '$got', expected '$2'"; fi
}

# nothing_written: no sysfs control file was written to
nothing_written() {
    for f in "$SYS/bus/pci/drivers_probe" "$SYS"/bus/pci/drivers/*/bind \
        "$SYS"/bus/pci/drivers/*/unbind "$SYS"/bus/pci/drivers/*/new_id \
        "$SYS"/bus/pci/devices/*/driver_override; do
        if [ -s "$f" ]; then
            bad "$f was written: '$(cat "$f")'"
            return
        fi
    done
    ok
}

# -------------------------------------------------------------------- cases

suite() {
    CASE='help'
    make_fake
    run --help
    expect_rc 0
    expect_out '--bind'
    run
    expect_rc 2

    CASE='status lists NTB and ivshmem functions by driver'
    run --status
    expect_rc 0
    expect_out "^NTB devices using a userspace driver"
    expect_out "^0000:00:05.0 'QEMU ivshmem .* 1af4:1110' drv=vfio-pci unused= iommu_group=5 dev=$DEV/vfio/5\$"
    expect_out "^0000:af:00.0 'Intel Skylake-SP NTB \\(gen3\\) 8086:201c' drv=ntb_hw_intel unused=vfio-pci iommu_group=7\$"
    expect_out "^0000:00:04.0 'QEMU ivshmem .* 1af4:1110' unused=vfio-pci iommu_group=3\$"
    expect_out "^0000:b0:00.0 'Intel Ice Lake/Sapphire Rapids NTB \\(gen4\\) 8086:347e' drv=vfio-pci unused=ntb_hw_intel iommu_group=8 dev=$DEV/vfio/8\$"
    expect_no_out '0000:00:01.0'
    # sections in dpdk-devbind order: userspace, kernel, other
    order=$(printf '%s\n' "$OUT" | grep -E '^0000:' | cut -d ' ' -f 1 | tr '\n' ' ')
    if [ "$order" = "0000:00:05.0 0000:b0:00.0 0000:af:00.0 0000:00:04.0 " ]; then ok; else bad "order: $order"; fi
    nothing_written

    CASE='status with no NTB device is not an error'
    rm -rf "$SYS/bus/pci/devices/0000:00:04.0" "$SYS/bus/pci/devices/0000:00:05.0" \
        "$SYS/bus/pci/devices/0000:af:00.0" "$SYS/bus/pci/devices/0000:b0:00.0"
    run --status
    expect_rc 0
    expect_out '^No NTB or ivshmem devices detected$'
    run -s
    expect_rc 0

    CASE='status warns when there is no IOMMU'
    make_fake
    rm -rf "$SYS/class/iommu/dmar0"
    run --status
    expect_rc 0
    expect_out 'no IOMMU found: .*(intel|amd)_iommu=on'

    CASE='bad addresses are usage errors'
    make_fake
    for a in zz:00.0 1:2 00:04 00:04.8 00:20.0 0000:00:04.0.1 000:00:04.0 xx:yy.z \
        123456789:00:04.0 1000g:00:04.0 0000:zz:00:04.0 0000:00:04.0/../0000:00:05.0; do
        run --bind=vfio-pci "$a"
        expect_rc 2
        expect_err 'is not a PCI address: use dddd:bb:ss.f or bb:ss.f'
    done
    nothing_written
    # A VMD domain (five digits) is an address, of no device here.
    run --bind=vfio-pci 10000:00:04.0
    expect_rc 1
    expect_err '10000:00:04.0'
    nothing_written

    CASE='a settle time that is not a number is a usage error'
    for SETTLE in abc -1 2.5; do
        run --bind=vfio-pci 00:04.0
        expect_rc 2
        expect_err "NTBDK_SETTLE='$SETTLE' is not a whole number of seconds"
    done
    SETTLE=
    nothing_written

    CASE='a missing device'
    run --bind=vfio-pci 00:07.0
    expect_rc 1
    expect_err 'no PCI device 0000:00:07.0'

    CASE='usage errors'
    run --bind
    expect_rc 2
    run --bogus
    expect_rc 2
    expect_err "unknown option '--bogus'"
    run --bind=vfio-pci
    expect_rc 2
    expect_err 'no device given'
    run --status 00:04.0
    expect_rc 2
    run -b 'vfio pci' 00:04.0
    expect_rc 2
    run -u --user root 00:05.0
    expect_rc 2
    nothing_written

    CASE='short address, upper case, both forms of --bind; already bound is a no-op'
    for form in '--bind=vfio-pci 00:05.0' '-b vfio-pci 0000:00:05.0' '--bind vfio-pci 00:05.0'; do
        # shellcheck disable=SC2086 # split the form on purpose
        run $form
        expect_rc 0
        expect_out '0000:00:05.0: already bound to vfio-pci, skipping'
    done
    run -b vfio-pci 0000:AF:00.0 --force --user nosuchuser-ntbdk
    expect_rc 1
    expect_err "no such user 'nosuchuser-ntbdk'"
    nothing_written

    CASE='a device in use by its kernel driver is refused without --force'
    run --bind=vfio-pci af:00.0
    expect_rc 1
    expect_err '0000:af:00.0 is in use: bound to kernel driver ntb_hw_intel; NTB device ntb0;'
    expect_err '--force'
    run -u af:00.0
    expect_rc 1
    expect_err 'is in use'
    nothing_written

    CASE='a function that is not NTB or ivshmem is refused without --any-device'
    run --bind=vfio-pci 00:01.0
    expect_rc 1
    expect_err '0000:00:01.0 \(8086:10d3\) is not a known NTB or ivshmem function; use --any-device'
    nothing_written
    # --force does not stand for --any-device, nor the other way round
    run --bind=vfio-pci 00:01.0 --force
    expect_rc 1
    expect_err 'use --any-device'
    run --bind=vfio-pci 00:01.0 --any-device
    expect_rc 1
    expect_err '0000:00:01.0 is in use: bound to kernel driver e1000e;'
    nothing_written
    # with both it passes the checks, says why it was in use, and only
    # fails at the (fake) bind
    mkdir -p "$SYS/bus/pci/devices/0000:00:01.0/net/eth0"
    run --bind=vfio-pci 00:01.0 --any-device --force
    expect_err 'is in use: bound to kernel driver e1000e; interface eth0; .*going on \(--force\)'
    expect_err 'did not bind'

    CASE='an address is taken literally, never as a glob or a list'
    make_fake
    : >"$TMP/00:04.0"
    cd "$TMP" || exit 1
    run -u '00:0?.0'
    cd - >/dev/null || exit 1
    expect_rc 2
    expect_err "'00:0\?.0' is not a PCI address"
    run -u '00:04.0 00:05.0'
    expect_rc 2
    run -b --force 00:04.0
    expect_rc 2
    expect_err 'needs a driver name, not the option'
    nothing_written

    CASE='a device a process holds open through vfio-pci is not taken from it'
    make_fake
    mkdir -p "$PROC/4242/fd"
    echo ntb-perf >"$PROC/4242/comm"
    ln -s "$DEV/vfio/5" "$PROC/4242/fd/7"
    for args in '-u 00:05.0' '-b ntb_hw_intel 00:05.0'; do
        # shellcheck disable=SC2086 # split the form on purpose
        run $args
        expect_rc 1
        expect_err '0000:00:05.0 is in use through vfio-pci by process 4242 \(ntb-perf\)'
        nothing_written
    done
    run -u 00:05.0 --force
    expect_err 'by process 4242 \(ntb-perf\).*going on \(--force\)'
    expect_file "$SYS/bus/pci/drivers/vfio-pci/unbind" 0000:00:05.0
    # the iommufd character device counts too
    make_fake
    mkdir -p "$SYS/bus/pci/devices/0000:00:05.0/vfio-dev/vfio0" "$PROC/77/fd"
    echo app >"$PROC/77/comm"
    ln -s "$DEV/vfio/devices/vfio0" "$PROC/77/fd/3"
    run -u 00:05.0
    expect_rc 1
    expect_err 'by process 77 \(app\)'
    nothing_written

    CASE='an IOMMU group shared with a device on a kernel driver'
    make_fake
    make_dev 0000:00:06.0 0x8086 0x10d3 0x020000 e1000e 3
    make_dev 0000:00:07.0 0x8086 0x2f0d 0x068000 '' 3
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'IOMMU group 3 of 0000:00:04.0 also holds 0000:00:06.0 \(e1000e\): vfio-pci cannot use a group'
    nothing_written
    # a port, a vfio-pci variant or an unbound device does not count, nor
    # one named too
    make_fake
    make_dev 0000:00:06.0 0x8086 0x2f0d 0x068000 pcieport 3
    make_dev 0000:00:07.0 0x8086 0x2f0d 0x068000 '' 3
    make_dev 0000:00:08.0 0x8086 0x2f0d 0x068000 mlx5_vfio_pci 3
    run --bind=vfio-pci 00:04.0
    expect_err 'did not bind'
    expect_no_out 'also holds'
    make_fake
    make_dev 0000:00:06.0 0x1af4 0x1110 0x050000 ntb_hw_intel 3
    run --bind=vfio-pci 00:04.0 00:06.0 --force
    if printf '%s\n' "$ERR" | grep -q 'also holds'; then bad "a device named on the command line blocked its group"; else ok; fi
    # --user says what else the group node gives (--user needs root); a
    # fresh fake either way, for the case after
    make_fake
    if [ "$(id -u)" -eq 0 ]; then
        make_dev 0000:00:09.0 0x1af4 0x1110 0x050000 vfio-pci 5
        run --user root 00:05.0
        expect_rc 0
        expect_err "$DEV/vfio/5 also gives root the other devices of IOMMU group 5: 0000:00:09.0"
    fi

    CASE='no IOMMU: refused, with the kernel command-line fix'
    rm -rf "$SYS/class/iommu/dmar0"
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'no IOMMU is present'
    expect_err '(intel|amd)_iommu=on'
    nothing_written
    rm -rf "$SYS/class/iommu"
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'no IOMMU is present'
    nothing_written
    # binding to a kernel driver needs no IOMMU
    run -b ntb_hw_intel --force af:00.0
    expect_rc 0
    expect_out 'already bound to ntb_hw_intel'

    CASE='no IOMMU group'
    make_fake
    rm "$SYS/bus/pci/devices/0000:00:04.0/iommu_group"
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err '0000:00:04.0 has no IOMMU group'
    nothing_written

    CASE='vfio-pci not loaded and no way to load it'
    make_fake
    rm -rf "$SYS/bus/pci/drivers/vfio-pci"
    MODPROBE_CMD=false run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'cannot load driver vfio-pci'
    MODPROBE_CMD=no-such-modprobe-ntbdk run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'not loaded and there is no no-such-modprobe-ntbdk'
    nothing_written

    CASE='a bind that does not take is rolled back'
    make_fake
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err '0000:00:04.0 did not bind to vfio-pci'
    expect_err 'binding 0000:00:04.0 to vfio-pci failed'
    # the sequence ran (override, probe) and the override was cleared again
    expect_file "$SYS/bus/pci/drivers_probe" 0000:00:04.0
    expect_file "$SYS/bus/pci/devices/0000:00:04.0/driver_override" ''

    CASE='--force unbinds from the kernel driver, and rebinds it on failure'
    make_fake
    run --bind=vfio-pci --force af:00.0
    expect_rc 1
    expect_file "$SYS/bus/pci/drivers/ntb_hw_intel/unbind" 0000:af:00.0
    expect_file "$SYS/bus/pci/devices/0000:af:00.0/driver_override" ''

    CASE='unbind of an unbound device is a no-op'
    make_fake
    run -u 00:04.0
    expect_rc 0
    expect_out 'not bound to any driver, skipping'
    nothing_written

    CASE='--user: owner of /dev/vfio/N and the memlock limit'
    [ "$(id -u)" -eq 0 ] || return 0 # --user needs root
    make_fake
    mkdir -p "$SYS/kernel/mm/hugepages/hugepages-2048kB"
    echo 4 >"$SYS/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    run --user root 00:05.0
    expect_rc 0
    expect_out "0000:00:05.0: $DEV/vfio/5 is now owned by root"
    expect_out 'memlock 8192$'
    expect_out 'ulimit -l 8192'
    run --user root 00:04.0
    expect_rc 1
    expect_err 'not bound to vfio-pci'
    run --user nosuchuser-ntbdk 00:05.0
    expect_rc 1
    expect_err "no such user"
    rm "$SYS/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    run --user root 00:05.0
    expect_out 'memlock unlimited'
}

# not root: refused up front (needs setpriv from util-linux, and root to drop)
nonroot_suite() {
    CASE='not root'
    make_fake
    # The unprivileged user runs a copy of the script: the checkout itself
    # may lie where it cannot read (a home directory of mode 0700).
    cp "$DEVBIND" "$TMP/fake/ntbdk-devbind"
    ROOT_DEVBIND=$DEVBIND
    DEVBIND=$TMP/fake/ntbdk-devbind
    chmod -R a+rX "$TMP"
    SHELL_CMD="setpriv --reuid=65534 --regid=65534 --clear-groups sh"
    run --bind=vfio-pci 00:04.0
    expect_rc 1
    expect_err 'binding needs root'
    run --user root 00:05.0
    expect_rc 1
    expect_err 'needs root'
    run -u 00:05.0
    expect_rc 1
    expect_err 'unbinding needs root'
    run --status
    expect_rc 0
    expect_out '^0000:00:04.0 '
    nothing_written
    DEVBIND=$ROOT_DEVBIND
}

SHELLS=${DEVBIND_TEST_SHELLS:-}
if [ -z "$SHELLS" ]; then
    SHELLS='sh'
    if command -v busybox >/dev/null 2>&1; then
        SHELLS="$SHELLS,busybox sh"
    fi
fi
OLDIFS=$IFS
IFS=,
for SHELL_CMD in $SHELLS; do
    IFS=$OLDIFS
    suite
    IFS=,
done
IFS=$OLDIFS
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    nonroot_suite
    SHELLS="$SHELLS,setpriv (not root)"
fi

echo "devbind-test: $PASS checks passed, $FAIL failed (shells: $SHELLS)"
[ "$FAIL" -eq 0 ]
