#!/usr/bin/env bash
# Tests of scripts/setup-hugepages.sh --setup against a fake sysfs tree
# (NTBDK_HUGEPAGES_SYSFS): a full reservation, a partial one rolled back to
# what was there, a partial one that cannot be rolled back (said exactly),
# a missing 1 GiB pool, a pool it may not write, counts that are sizes or
# more than the machine holds, and --unmount of a filesystem that is not
# hugetlbfs.
#
# The fake kernel is a FIFO in place of nr_hugepages served by a loop that,
# like the kernel, answers each read with the pool size and caps each write
# at the pages it "has".
#
# Usage: scripts/tests/hugepages-test.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
SETUP=$PWD/scripts/setup-hugepages.sh

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hugepages-test.XXXXXX") || exit 1
KERNEL=""
cleanup() {
    [ -n "$KERNEL" ] && kill "$KERNEL" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

PASS=0
FAIL=0

# fake_pool START CAP: a 2 MiB pool of START pages that can grow to CAP.
fake_pool() {
    [ -n "$KERNEL" ] && kill "$KERNEL" 2>/dev/null
    rm -rf "$TMP/sys"
    local dir=$TMP/sys/hugepages-2048kB
    mkdir -p "$dir"
    mkfifo "$dir/nr_hugepages"
    (
        cur=$1
        while true; do
            echo "$cur" >"$dir/nr_hugepages" || exit 0
            read -r v <"$dir/nr_hugepages" || exit 0
            cur=$((v < $2 ? v : $2))
            echo "$cur" >"$TMP/pool"
        done
    ) &
    KERNEL=$!
    echo "$1" >"$TMP/pool"
}

# check NAME WANT_STATUS WANT_POOL NEEDLE -- ARGS...: runs the script, checks
# its exit status, the pool size the fake kernel ends with, and that its
# output holds NEEDLE.
check() {
    local name=$1 want_status=$2 want_pool=$3 needle=$4 out status pool
    shift 5
    out=$(NTBDK_HUGEPAGES_SYSFS=$TMP/sys NTBDK_NODES_SYSFS=$TMP/nodes \
        timeout 10 "$SETUP" "$@" 2>&1)
    status=$?
    pool=$(cat "$TMP/pool")
    if [ "$status" -eq "$want_status" ] && [ "$pool" = "$want_pool" ] &&
        [[ "$out" == *"$needle"* ]]; then
        PASS=$((PASS + 1))
        echo "ok   $name"
    else
        FAIL=$((FAIL + 1))
        echo "FAIL $name: status $status (want $want_status), pool $pool (want $want_pool)," \
            "output: $out"
    fi
}

fake_pool 0 100
check "a full reservation" 0 8 "reserved 8 2M hugepages" -- --setup 8

fake_pool 2 5
check "a partial reservation is rolled back" 1 2 \
    "reserved only 5 (" -- --setup 8
fake_pool 2 5
check "and says so" 1 2 "rolled back to the 2 pages reserved before" -- --setup 8

fake_pool 3 3
check "nothing gained leaves it unchanged" 1 3 "the reservation is unchanged (3 pages)" \
    -- --setup 8

# The pool held 7 pages it can no longer hold (now capped at 4): a rollback
# to 7 gets 4, and the script says it left 4.
fake_pool 7 4
check "a rollback that does not take is said exactly" 1 4 \
    "left 4 pages reserved: could not restore the 7 reserved before" -- --setup 8

fake_pool 0 100
check "no 1 GiB pool" 1 0 "use --size 2M" -- --setup 1 --size 1G
check "not a number" 2 0 "needs a number of pages" -- --setup lots
check "a size is not a count" 2 0 "1 GiB of 2M pages is --setup 512" -- --setup 2G
check "more pages than memory" 1 0 "more than this machine's memory" -- --setup 99999999
check "far more" 2 0 "needs a number of pages" -- --setup 99999999999999999999
check "leading zeros" 0 10 "reserved 10 2M hugepages" -- --setup 0010
if [ "$(id -u)" -eq 0 ]; then
    check "--unmount leaves a filesystem that is not hugetlbfs" 1 10 \
        "is not a hugetlbfs mount (nothing unmounted)" -- --unmount /
fi

kill "$KERNEL" 2>/dev/null
KERNEL=""
mkdir -p "$TMP/ro/hugepages-2048kB"
echo 0 >"$TMP/ro/hugepages-2048kB/nr_hugepages"
chmod a-w "$TMP/ro/hugepages-2048kB/nr_hugepages"
if [ "$(id -u)" -ne 0 ]; then
    out=$(NTBDK_HUGEPAGES_SYSFS=$TMP/ro "$SETUP" --setup 8 2>&1)
    if [[ "$out" == *"needs root"* ]]; then
        PASS=$((PASS + 1))
        echo "ok   a pool it may not write needs root"
    else
        FAIL=$((FAIL + 1))
        echo "FAIL a pool it may not write: $out"
    fi
fi

echo "hugepages-test: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
