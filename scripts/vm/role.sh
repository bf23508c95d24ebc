#!/bin/sh
# Guest side of the ntbdk VM test: what one guest does, by role.
# Run by /init (scripts/vm/init) as `role.sh ROLE`, with ROLE from the kernel
# command line (ntbdk.role=server|client).
#
# Every role first binds the ivshmem function (QEMU ivshmem-plain, 1af4:1110,
# docs/specs/ivshmem-spec.rst) to vfio-pci with ntbdk-devbind and checks that
# /dev/vfio/<group> appears. Then the workload, chosen by ntbdk.workload=
# (scripts/vm-test.sh sets it from NTBDK_VM_WORKLOAD):
#
#   perf (default)   the end-to-end test over vfio: the server role runs
#                    `ntb-perf --device vfio:$BDF --server`, the client role
#                    `ntb-perf --device vfio:$BDF -s 4K -n 200` (bandwidth and
#                    latency; zero non-posted reads required); then the client
#                    sends a file with `ntb-fwd --mode file-trans` and the
#                    server compares every byte with the expected file.
#   smoke            prove the static binaries run in the guest: --help of
#                    every app, and ntb-tool creating and showing an emulated
#                    fabric in the guest's tmpfs. Does not touch the device.
#
# With ntbdk.peer_death=1 (NTBDK_VM_PEER_DEATH=1 on the host) the host kills
# the client's QEMU once both guests print NTBDK-VM-READY (after the first
# ntb-perf session, during a second one); the server must then see the peer
# go and exit cleanly (status 0 or 1, never a hang or a crash). With smoke this
# is a self-test of the harness: the "link" is a heartbeat word the client
# writes into BAR2 with devmem, and the server watches it stop.
#
# Console markers read by the host: NTBDK-VM-READY (workload started; the
# peer may now be killed). /init prints NTBDK-VM-RESULT after this returns.

ROLE=${1:?usage: role.sh server|client}
WORKLOAD=${NTBDK_WORKLOAD:-perf}
PEER_DEATH=${NTBDK_PEER_DEATH:-0}
BDF=${NTBDK_BDF:-}

say() {
    echo "ntbdk-vm[$ROLE]: $*"
}

fail() {
    say "FAIL: $*"
    exit 1
}

case "$ROLE" in
    server | client) ;;
    *) fail "unknown role '$ROLE' (server or client)" ;;
esac

# ---- find the ivshmem function (the host puts it at ntbdk.bdf=)
if [ -z "$BDF" ]; then
    for d in /sys/bus/pci/devices/*; do
        if [ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ]; then
            BDF=${d##*/}
            break
        fi
    done
fi
[ -n "$BDF" ] || fail "no ivshmem function (1af4:1110) found"
[ -e "/sys/bus/pci/devices/$BDF" ] || fail "no PCI device $BDF"

ntbdk-devbind --status

# ---- the harness's own check that both guests' BAR2 is one memory: a
# handshake through BAR2 with busybox devmem (/dev/mem), done while the
# function has no driver (vfio-pci would claim the BAR, which
# CONFIG_IO_STRICT_DEVMEM then fences off, and may put the function in D3).
# BAR2 is line 3 of the sysfs resource file (start end flags).
# The server writes SERVER_MAGIC at offset 0, the client answers with
# CLIENT_MAGIC at offset 4. The memory file is new for every run (zeros).
SERVER_MAGIC=0x4E544231 # "NTB1"
CLIENT_MAGIC=0x4E544232 # "NTB2"
bar2=$(sed -n 3p "/sys/bus/pci/devices/$BDF/resource" | cut -d ' ' -f 1)
if [ -z "$bar2" ] || [ "$((bar2))" -eq 0 ]; then
    fail "$BDF has no BAR2 (resource: $(sed -n 3p "/sys/bus/pci/devices/$BDF/resource"))"
fi
wait_word() { # OFFSET VALUE SECONDS
    ww_n=0
    while [ "$(($(devmem $((bar2 + $1)) 32)))" -ne "$(($2))" ]; do
        [ "$ww_n" -ge "$(($3 * 10))" ] && return 1
        usleep 100000
        ww_n=$((ww_n + 1))
    done
}
# The server then clears both words and the client waits for that, so BAR2
# is all zeros again before ntbdk lays its fabric out there.
if [ "$ROLE" = server ]; then
    devmem $((bar2)) 32 "$SERVER_MAGIC"
    wait_word 4 "$CLIENT_MAGIC" 60 || fail "no answer from the client in BAR2 within 60 s (is the memory shared?)"
    devmem $((bar2 + 4)) 32 0
    devmem $((bar2)) 32 0
else
    wait_word 0 "$SERVER_MAGIC" 60 || fail "the server's word never appeared in BAR2 within 60 s (is the memory shared?)"
    devmem $((bar2 + 4)) 32 "$CLIENT_MAGIC"
    wait_word 0 0 60 || fail "the server never cleared its word in BAR2 within 60 s"
fi
say "BAR2 at $bar2 is shared with the peer (devmem handshake)"

# ---- bind to vfio-pci, as a user would
ntbdk-devbind --bind=vfio-pci "$BDF" || fail "ntbdk-devbind --bind=vfio-pci $BDF failed"
GROUP=$(readlink "/sys/bus/pci/devices/$BDF/iommu_group")
GROUP=${GROUP##*/}
[ -n "$GROUP" ] || fail "$BDF has no IOMMU group after binding"
[ -c "/dev/vfio/$GROUP" ] || fail "/dev/vfio/$GROUP is missing after binding"
[ -c /dev/vfio/vfio ] || fail "/dev/vfio/vfio is missing"
say "bound $BDF to vfio-pci, IOMMU group $GROUP"
ls -l /dev/vfio
ntbdk-devbind --status
# binding again is a no-op, not an error
ntbdk-devbind --bind=vfio-pci "$BDF" || fail "second bind of $BDF failed"
# --user: the initramfs has a user ntb (uid 1000) for this
ntbdk-devbind --user ntb "$BDF" || fail "ntbdk-devbind --user ntb failed"
owner=$(stat -c %U "/dev/vfio/$GROUP")
[ "$owner" = ntb ] || fail "/dev/vfio/$GROUP is owned by $owner after --user ntb"
# a process holding the group open keeps its device: the unbind is refused
# (it would wait in the kernel until the process lets go), naming the process
sleep 600 9<"/dev/vfio/$GROUP" &
holder=$!
sleep 1
if ntbdk-devbind --unbind "$BDF" 2>/tmp/held.err; then
    fail "ntbdk-devbind --unbind took $BDF from process $holder, which holds /dev/vfio/$GROUP"
fi
grep -q "by process $holder (sleep)" /tmp/held.err ||
    fail "the refusal does not name process $holder: $(cat /tmp/held.err)"
kill "$holder"
wait "$holder" 2>/dev/null
case "$(readlink "/sys/bus/pci/devices/$BDF/driver")" in
    */vfio-pci) say "a held device is not taken: $(cat /tmp/held.err)" ;;
    *) fail "$BDF left vfio-pci while a process held it" ;;
esac

# ---- workload
case "$WORKLOAD" in
    smoke)
        for app in ntb-perf ntb-pingpong ntb-fwd ntb-tool; do
            "$app" --help >/dev/null || fail "$app --help failed"
        done
        say "all apps start (static binaries run in the guest)"
        ntb-tool --dir /dev/shm create vmsmoke --slots 2 --window-size 1M ||
            fail "ntb-tool create failed"
        ntb-tool --dir /dev/shm status vmsmoke || fail "ntb-tool status failed"
        ntb-tool --dir /dev/shm destroy vmsmoke || fail "ntb-tool destroy failed"
        # give the device back (leaves the guest as it found it)
        ntbdk-devbind --unbind "$BDF" || fail "unbind failed"
        if [ "$PEER_DEATH" = 1 ]; then
            # harness self-test of the peer-death case, without ntbdk: the
            # client bumps a heartbeat word in BAR2 (offset 8) until the host
            # kills its QEMU; the server must see it stop (3 s) and exit 0
            if [ "$ROLE" = client ]; then
                hb=0
                while :; do
                    hb=$((hb + 1))
                    devmem $((bar2 + 8)) 32 "$hb"
                    [ "$hb" = 5 ] && echo "NTBDK-VM-READY"
                    usleep 200000
                done
            fi
            last=0
            wait_word 8 5 60 || true
            hb_seen=$(($(devmem $((bar2 + 8)) 32)))
            [ "$hb_seen" -ge 5 ] || fail "the client's heartbeat never started"
            echo "NTBDK-VM-READY"
            still=0
            while [ "$still" -lt 30 ]; do
                now=$(($(devmem $((bar2 + 8)) 32)))
                if [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; fi
                last=$now
                usleep 100000
            done
            say "peer heartbeat stopped at $last: peer is dead, exiting cleanly"
        else
            echo "NTBDK-VM-READY"
        fi
        ;;
    perf)
        # ================= WORKLOAD: ntb-perf over vfio =================
        # The two guests share BAR2 of their ivshmem functions (one
        # memory-backend-file on the host), so they form a 2-host fabric.
        # READY comes first: the host kills the client (peer death) a few
        # seconds later (NTBDK_VM_KILL_AFTER), while traffic flows.
        # READY comes after the first session: with NTBDK_VM_PEER_DEATH=1
        # the host kills the client NTBDK_VM_KILL_AFTER seconds later, while
        # the second session's traffic flows.
        if [ "$ROLE" = server ]; then
            # 1. ntb-perf: serve one client session (bandwidth, then latency)
            ntb-perf --device "vfio:$BDF" --server --timeout 60 ||
                fail "ntb-perf server failed"
            echo "NTBDK-VM-READY"
            if [ "$PEER_DEATH" = 1 ]; then
                # 2'. a second session, whose client the host kills mid-run:
                # the server must see link down within its timeout and exit
                # with status 0 or 1 (a clean error), never hang
                rc=0
                ntb-perf --device "vfio:$BDF" --server --timeout 60 >/tmp/serve2.out 2>&1 || rc=$?
                cat /tmp/serve2.out
                [ "$rc" -le 1 ] || fail "ntb-perf server died with status $rc after the peer died"
                # A server that failed for another reason (it never served,
                # its device was busy) is no proof it saw the peer die.
                [ "$rc" -eq 1 ] || fail "ntb-perf server ended with status 0: it did not see the client die"
                grep -Eq 'left before the end of the run|left during the run|is gone|is not connected|Reset|PeerDown' /tmp/serve2.out ||
                    fail "ntb-perf server failed, but not because its client left (see its output above)"
                say "peer died: ntb-perf server saw its client leave and exited cleanly (status $rc)"
            else
                # 2. a file over the transport, every byte compared
                seq 1 120000 >/tmp/expected.bin
                ntb-fwd --device "vfio:$BDF" --mode file-trans --recv /tmp/out.bin --timeout 60 ||
                    fail "ntb-fwd file-trans receiver failed"
                cmp /tmp/expected.bin /tmp/out.bin || fail "the received file differs from the one sent"
                say "file-trans: $(wc -c </tmp/out.bin) bytes received, every byte equal"
            fi
        else
            # 1. small: a spinning guest under TCG is slow
            rc=0
            ntb-perf --device "vfio:$BDF" -s 4K -n 200 --timeout 60 >/tmp/perf.out 2>&1 || rc=$?
            cat /tmp/perf.out
            [ "$rc" -eq 0 ] || fail "ntb-perf client failed (status $rc)"
            echo "NTBDK-VM-READY"
            grep -q 'non-posted reads 0 ' /tmp/perf.out ||
                fail "ntb-perf reported non-posted reads (or no device counters)"
            say "ntb-perf over vfio: done, zero non-posted reads"
            if [ "$PEER_DEATH" = 1 ]; then
                # 2'. runs until the host kills this guest
                ntb-perf --device "vfio:$BDF" --test bw -s 4K -D 600 --timeout 60 ||
                    fail "ntb-perf client failed"
            else
                # 2. a file over the transport, every byte compared by the receiver
                seq 1 120000 >/tmp/in.bin
                ntb-fwd --device "vfio:$BDF" --mode file-trans --send /tmp/in.bin --timeout 60 ||
                    fail "ntb-fwd file-trans sender failed"
            fi
        fi
        # ============================================================================
        ntbdk-devbind --unbind "$BDF" || fail "unbind failed"
        ;;
    *) fail "unknown workload '$WORKLOAD' (smoke or perf)" ;;
esac

say "done"
exit 0
