#!/bin/sh
# Runs `bench transport` with the iceoryx2 peer row (the `iceoryx2` feature
# of ntbdk-bench). iceoryx2 generates its POSIX bindings with bindgen, which
# needs libclang: installed here with apt-get when missing (Debian/Ubuntu,
# as root). Arguments go to the harness, e.g.
#   bench/run-iceoryx2.sh --small-only --only iceoryx2
set -eu
# ldconfig lives in /sbin, which Debian leaves off a non-root user's PATH.
PATH=$PATH:/usr/sbin:/sbin
have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] || ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so'
}
if ! have_libclang; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "libclang not found: installing libclang-dev (needed by bindgen)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o Acquire::Retries=3 update -q >/dev/null
        apt-get -o Acquire::Retries=3 install -y -q --no-install-recommends libclang-dev >/dev/null
    else
        echo "run-iceoryx2: libclang not found (bindgen needs it): install libclang-dev" \
            "(apt-get install libclang-dev, as root), or set LIBCLANG_PATH" >&2
        exit 1
    fi
fi
cd "$(dirname "$0")/.."
exec cargo run --release -p ntbdk-bench --features iceoryx2 --bin transport -- "$@"
