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
                   current reservation of that size). N counts pages, not
                   bytes as dpdk-hugepages.py's --setup does: 1 GiB of 2M
                   pages is --setup 512
  --size SIZE      page size for --setup/--mount: 2M (default) or 1G
  --node NODE      reserve on NUMA node NODE only (default: system-wide)
  --show           print the hugepage pools and hugetlbfs mounts
  --clear          release every reserved hugepage of every size
  --mount DIR      also mount hugetlbfs of --size at DIR (created if missing)
  --unmount DIR    unmount the hugetlbfs at DIR (nothing else is unmounted)
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

# usage errors exit 2, as ntbdk-devbind's do
usage_error() {
    echo "setup-hugepages: $*" >&2
    echo "Try 'scripts/setup-hugepages.sh --help'." >&2
    exit 2
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (it writes $SYSFS): run it with sudo"
}

# size argument (2M, 1G, 2048kB...) -> size in kB
size_kb() {
    case "${1^^}" in
        2M | 2MB | 2048K | 2048KB) echo 2048 ;;
        1G | 1GB | 1024M | 1048576K | 1048576KB) echo 1048576 ;;
        *) usage_error "unknown page size '$1': use 2M or 1G" ;;
    esac
}

human() { # kB -> 64K / 2M / 1G
    if [ "$1" -ge 1048576 ]; then
        echo "$(($1 / 1048576))G"
    elif [ "$1" -ge 1024 ]; then
        echo "$(($1 / 1024))M"
    else
        echo "${1}K"
    fi
}

# hugetlbfs_at DIR: the mount options of the hugetlbfs mounted at DIR (an
# absolute, canonical path), failing when none is; /proc/mounts writes a
# space in a path as \040
hugetlbfs_at() {
    DIR=$1 awk '$3 == "hugetlbfs" { p = $2; gsub(/\\040/, " ", p) }
        $3 == "hugetlbfs" && p == ENVIRON["DIR"] { print $4; found = 1; exit }
        END { exit !found }' /proc/mounts
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
    local old got left total_kb
    # More than the machine has is a mistake (pages taken for MiB, say), and
    # the kernel would first take every free page trying.
    total_kb=$(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo 2>/dev/null)
    if [ -n "$total_kb" ] && [ "$count" -gt $((total_kb / kb)) ]; then
        die "$count $(human "$kb") pages is more than this machine's memory" \
            "($((total_kb / 1024)) MiB): --setup counts pages, not bytes or MiB"
    fi
    old=$(cat "$dir/nr_hugepages")
    echo "$count" >"$dir/nr_hugepages" || die "cannot write $dir/nr_hugepages"
    got=$(cat "$dir/nr_hugepages")
    [[ "$got" =~ ^[0-9]+$ ]] || die "$dir/nr_hugepages reads '$got', not a number"
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
    # Shrinking below what is in use leaves the excess as surplus pages,
    # counted in nr_hugepages until their users let go (the kernel's
    # set_max_huge_pages): the reservation is the rest.
    local surplus
    surplus=$(cat "$dir/surplus_hugepages" 2>/dev/null || echo 0)
    [[ "$surplus" =~ ^[0-9]+$ ]] && [ "$surplus" -le "$got" ] || surplus=0
    echo "reserved $((got - surplus)) $(human "$kb") hugepages${node:+ on node $node}"
    if [ "$surplus" -gt 0 ]; then
        echo "note: $surplus more are in use as surplus pages, freed when their users exit" \
            "(or their files in a hugetlbfs mount are deleted)"
    fi
}

clear_all() {
    need_root "--clear"
    local d kb held="" n s
    for d in "$SYSFS"/hugepages-*kB "$NODES"/node[0-9]*/hugepages/hugepages-*kB; do
        [ -w "$d/nr_hugepages" ] || continue
        echo 0 >"$d/nr_hugepages"
    done
    # Pages in use stay (as surplus) until their users let go: a process
    # mapping them, or a file in a hugetlbfs mount (until it is deleted).
    for d in "$SYSFS"/hugepages-*kB; do
        [ -r "$d/nr_hugepages" ] || continue
        kb=${d##*hugepages-}
        kb=${kb%kB}
        n=$(cat "$d/nr_hugepages")
        s=$(cat "$d/surplus_hugepages" 2>/dev/null || echo 0)
        [ "$((n + s))" -eq 0 ] || held="$held $((n + s)) of $(human "$kb");"
    done
    if [ -z "$held" ]; then
        echo "released all hugepages"
        return
    fi
    echo "released the free hugepages; still held:${held%;} (in use: they are freed when" \
        "the processes mapping them exit, or when their files in a hugetlbfs mount are deleted)"
    awk '$3 == "hugetlbfs" { print "  hugetlbfs mount: " $2 }' /proc/mounts
}

mount_at() { # dir kB
    need_root "--mount"
    local dir opts
    mkdir -p "$1"
    dir=$(realpath "$1")
    if opts=$(hugetlbfs_at "$dir"); then
        case ",$opts," in
            *",pagesize=$(human "$2"),"*) echo "hugetlbfs ($(human "$2") pages) already mounted at $dir" ;;
            *) die "a hugetlbfs of another page size is mounted at $dir ($opts):" \
                "--unmount it first, or choose another directory" ;;
        esac
        return
    fi
    mount -t hugetlbfs -o "pagesize=$(human "$2")" nodev "$dir"
    echo "mounted hugetlbfs ($(human "$2") pages) at $dir"
}

unmount_at() {
    need_root "--unmount"
    local dir
    dir=$(realpath -e "$1" 2>/dev/null) || die "--unmount: no directory $1"
    hugetlbfs_at "$dir" >/dev/null || die "--unmount: $dir is not a hugetlbfs mount (nothing unmounted)"
    umount "$dir"
    echo "unmounted $dir"
}

[ $# -gt 0 ] || {
    usage >&2
    exit 2
}

count="" size=2M node="" do_show=0 do_clear=0 mount_dir="" unmount_dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --setup)
            [ $# -ge 2 ] || usage_error "--setup needs a page count"
            count=$2
            shift
            ;;
        --size)
            [ $# -ge 2 ] || usage_error "--size needs 2M or 1G"
            size=$2
            shift
            ;;
        --node)
            [ $# -ge 2 ] || usage_error "--node needs a NUMA node number"
            node=$2
            shift
            ;;
        --show) do_show=1 ;;
        --clear) do_clear=1 ;;
        --mount)
            [ $# -ge 2 ] || usage_error "--mount needs a directory"
            mount_dir=$2
            shift
            ;;
        --unmount)
            [ $# -ge 2 ] || usage_error "--unmount needs a directory"
            unmount_dir=$2
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
    shift
done

kb=$(size_kb "$size")
if [ -n "$count" ]; then
    if [[ "$count" =~ ^[0-9]+[KkMmGgTt] ]]; then
        usage_error "--setup needs a number of pages, not a size ('$count'): e.g. 1 GiB of" \
            "$(human "$kb") pages is --setup $((1048576 / kb))"
    fi
    [[ "$count" =~ ^[0-9]{1,10}$ ]] || usage_error "--setup needs a number of pages, not '$count'"
    count=$((10#$count))
fi
if [ -n "$node" ]; then
    [[ "$node" =~ ^[0-9]{1,4}$ ]] || usage_error "--node needs a node number, not '$node'"
fi

[ -n "$unmount_dir" ] && unmount_at "$unmount_dir"
[ "$do_clear" -eq 1 ] && clear_all
[ -n "$count" ] && setup "$count" "$kb" "$node"
[ -n "$mount_dir" ] && mount_at "$mount_dir" "$kb"
[ "$do_show" -eq 1 ] && show
exit 0
