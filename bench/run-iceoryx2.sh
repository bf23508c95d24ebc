#!/bin/sh
# Runs `bench transport` with the iceoryx2 peer row (the `iceoryx2` feature
# of ntbdk-bench). iceoryx2 generates its POSIX bindings with bindgen, which
# needs libclang: installed here with apt-get when missing (Debian/Ubuntu,
# as root). Arguments go to the harness, e.g.
#   bench/run-iceoryx2.sh --small-only --only iceoryx2
set -eu
if command -v dpkg >/dev/null && ! dpkg -s libclang-dev >/dev/null 2>&1; then
    echo "libclang not found: installing libclang-dev (needed by bindgen)" >&2
    apt-get update
    apt-get install -y libclang-dev
fi
cd "$(dirname "$0")/.."
exec cargo run --release -p ntbdk-bench --features iceoryx2 --bin transport -- "$@"
