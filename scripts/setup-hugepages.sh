#!/usr/bin/env bash
# Reserve, show and clear hugepages for ntbdk, like DPDK's dpdk-hugepages.py.
#
# ntbdk maps hugepages through memfd (MFD_HUGETLB), so no hugetlbfs mount is
# needed; --mount is there for tools that want one.
set -euo pipefail

# The kernel's hugepage pools; the environment may point elsewhere (the
# tests use a fake tree).
SYSFS=${NTBDK_HUGEPAGES_SYSFS:-/sys/kernel/mm/hugepages}
NODES=${NTBDK_NODES_SYSFS:-/sys/devices/system/node}

usage() {
    cat <<'EOF'
Usage: scripts/setup-hugepages.sh [OPTIONS]

Reserve, show or clear hugepages (the memory ntbdk zones are made of).

Options:
  --setup N        reserve N hugepages in total (of --size; replaces the
                   current reservation of that size)
  --size SIZE      page size for --setup/--mount: 2M (default) or 1G
  --node NODE      reserve on NUMA node NODE only (default: system-wide)
  --show           print the hugepage pools and hugetlbfs mounts
  --clear          release every reserved hugepage of every size
  --mount DIR      also mount hugetlbfs of --size at DIR (created if missing)
  --unmount DIR    unmount the hugetlbfs at DIR
  -h, --help       print this help

Changing reservations or mounts needs root. Examples:
  sudo scripts/setup-hugepages.sh --setup 512          # 1 GiB of 2 MiB pages
  sudo scripts/setup-hugepages.sh --setup 2 --size 1G  # two 1 GiB pages
  scripts/setup-hugepages.sh --show
  sudo scripts/setup-hugepages.sh --clear
EOF
}

die() {
    echo "setup-hugepages: $*" >&2
    exit 1
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (it writes $SYSFS): run it with sudo"
}

# size argument (2M, 1G, 2048kB...) -> size in kB
size_kb() {
    case "${1^^}" in
        2M | 2MB | 2048K | 2048KB) echo 2048 ;;
        1G | 1GB | 1024M | 1048576K | 1048576KB) echo 1048576 ;;
        *) die "unknown page size '$1': use 2M or 1G" ;;
    esac
}

human() { # kB -> 2M / 1G
    if [ "$1" -ge 1048576 ]; then echo "$(($1 / 1048576))G"; else echo "$(($1 / 1024))M"; fi
}

pool_dir() { # kB [node]
    if [ -n "${2:-}" ]; then
        echo "$NODES/node$2/hugepages/hugepages-$1kB"
    else
        echo "$SYSFS/hugepages-$1kB"
    fi
}

show() {
    [ -d "$SYSFS" ] || die "this kernel has no hugepage support ($SYSFS is missing)"
    printf '%-6s %-6s %8s %8s %8s %8s\n' node size total free reserved surplus
    for d in "$SYSFS"/hugepages-*kB; do
        [ -d "$d" ] || continue
        kb=${d##*hugepages-}
        kb=${kb%kB}
        printf '%-6s %-6s %8s %8s %8s %8s\n' all "$(human "$kb")" \
            "$(cat "$d/nr_hugepages")" "$(cat "$d/free_hugepages")" \
            "$(cat "$d/resv_hugepages")" "$(cat "$d/surplus_hugepages")"
        for n in "$NODES"/node[0-9]*; do
            nd="$n/hugepages/hugepages-${kb}kB"
            [ -d "$nd" ] || continue
            printf '%-6s %-6s %8s %8s %8s %8s\n' "${n##*node}" "$(human "$kb")" \
                "$(cat "$nd/nr_hugepages")" "$(cat "$nd/free_hugepages")" - \
                "$(cat "$nd/surplus_hugepages")"
        done
    done
    local mounts
    mounts=$(awk '$3 == "hugetlbfs" { print "  " $2 " (" $4 ")" }' /proc/mounts)
    if [ -n "$mounts" ]; then
        echo "hugetlbfs mounts:"
        echo "$mounts"
    else
        echo "hugetlbfs mounts: none (ntbdk does not need one)"
    fi
}

setup() { # count kB [node]
    local count=$1 kb=$2 node=${3:-} dir
    dir=$(pool_dir "$kb" "$node")
    [ -d "$dir" ] || die "no $(human "$kb") hugepages here ($dir is missing)$(
        [ "$kb" = 1048576 ] && echo ': the CPU or kernel lacks 1 GiB pages, use --size 2M')"
    [ -w "$dir/nr_hugepages" ] ||
        die "--setup needs root (it writes $dir/nr_hugepages): run it with sudo"
    local old got left
    old=$(cat "$dir/nr_hugepages")
    echo "$count" >"$dir/nr_hugepages" || die "cannot write $dir/nr_hugepages"
    got=$(cat "$dir/nr_hugepages")
    if [ "$got" -lt "$count" ]; then
        # A partial reservation is not what was asked for: put back what was
        # there, and say exactly what is left.
        if [ "$got" -eq "$old" ]; then
            left="the reservation is unchanged ($old pages)"
        elif echo "$old" >"$dir/nr_hugepages" 2>/dev/null &&
            left=$(cat "$dir/nr_hugepages") && [ "$left" -eq "$old" ]; then
            left="rolled back to the $old pages reserved before"
        else
            left="left ${left:-$got} pages reserved: could not restore the $old reserved before"
        fi
        die "asked for $count $(human "$kb") pages, the kernel reserved only $got (memory is" \
            "short or fragmented; try fewer, or reserve at boot with hugepages=$count on the" \
            "kernel command line); $left"
    fi
    echo "reserved $got $(human "$kb") hugepages${node:+ on node $node}"
}

clear_all() {
    need_root "--clear"
    for d in "$SYSFS"/hugepages-*kB "$NODES"/node[0-9]*/hugepages/hugepages-*kB; do
        [ -w "$d/nr_hugepages" ] || continue
        echo 0 >"$d/nr_hugepages"
    done
    echo "released all hugepages (pages still in use are freed when their users exit)"
}

mount_at() { # dir kB
    need_root "--mount"
    mkdir -p "$1"
    if awk -v d="$1" '$2 == d && $3 == "hugetlbfs" { found = 1 } END { exit !found }' /proc/mounts; then
        echo "hugetlbfs already mounted at $1"
        return
    fi
    mount -t hugetlbfs -o "pagesize=$(human "$2")" nodev "$1"
    echo "mounted hugetlbfs ($(human "$2") pages) at $1"
}

unmount_at() {
    need_root "--unmount"
    umount "$1"
    echo "unmounted $1"
}

[ $# -gt 0 ] || {
    usage >&2
    exit 1
}

count="" size=2M node="" do_show=0 do_clear=0 mount_dir="" unmount_dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --setup)
            [ $# -ge 2 ] || die "--setup needs a page count"
            count=$2
            shift
            ;;
        --size)
            [ $# -ge 2 ] || die "--size needs 2M or 1G"
            size=$2
            shift
            ;;
        --node)
            [ $# -ge 2 ] || die "--node needs a NUMA node number"
            node=$2
            shift
            ;;
        --show) do_show=1 ;;
        --clear) do_clear=1 ;;
        --mount)
            [ $# -ge 2 ] || die "--mount needs a directory"
            mount_dir=$2
            shift
            ;;
        --unmount)
            [ $# -ge 2 ] || die "--unmount needs a directory"
            unmount_dir=$2
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done

kb=$(size_kb "$size")
if [ -n "$count" ]; then
    [[ "$count" =~ ^[0-9]+$ ]] || die "--setup needs a number of pages, not '$count'"
fi
if [ -n "$node" ]; then
    [[ "$node" =~ ^[0-9]+$ ]] || die "--node needs a node number, not '$node'"
fi

[ -n "$unmount_dir" ] && unmount_at "$unmount_dir"
[ "$do_clear" -eq 1 ] && clear_all
[ -n "$count" ] && setup "$count" "$kb" "$node"
[ -n "$mount_dir" ] && mount_at "$mount_dir" "$kb"
[ "$do_show" -eq 1 ] && show
exit 0
