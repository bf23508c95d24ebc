#!/usr/bin/env bash
# Static checks of the project's shell scripts (their tests, of the bind and
# hugepage scripts, run in scripts/test.sh).
#
# - POSIX scripts (#!/bin/sh: the bind script and the VM guest scripts, which
#   run under busybox ash): `sh -n`, and `busybox sh -n` when busybox is
#   installed.
# - bash scripts: `bash -n`.
# - every script: shellcheck (Debian package shellcheck; installed here when
#   missing and we are root), which picks the dialect from the #! line.
#
# Usage: scripts/check-shell.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs the shellcheck tool, and busybox so that the busybox-ash checks run on
# a fresh machine too (not only once the VM test installed it).
need=()
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o Acquire::Retries=3 update -q >/dev/null
        apt-get -o Acquire::Retries=3 install -y -q --no-install-recommends "${need[@]}" >/dev/null
    fi
    if ! command -v shellcheck >/dev/null 2>&1; then
        echo "check-shell: shellcheck not found: apt-get install shellcheck" >&2
        exit 1
    fi
fi

# every shell script in the repository, by its #! line
posix=()
bashs=()
while IFS= read -r -d '' f; do
    case "$(head -n 1 "$f")" in
        '#!/bin/sh'*) posix+=("$f") ;;
        '#!/usr/bin/env bash'* | '#!/bin/bash'*) bashs+=("$f") ;;
    esac
done < <(git ls-files -z --cached --others --exclude-standard -- scripts .ci bench)

echo "== sh -n (${#posix[@]} POSIX scripts)"
for f in "${posix[@]}"; do
    sh -n "$f"
    if command -v busybox >/dev/null 2>&1; then
        busybox sh -n "$f"
    fi
done
echo "== bash -n (${#bashs[@]} bash scripts)"
for f in "${bashs[@]}"; do
    bash -n "$f"
done
echo "== shellcheck ($(shellcheck --version | sed -n 's/^version: //p'))"
shellcheck "${posix[@]}" "${bashs[@]}"
