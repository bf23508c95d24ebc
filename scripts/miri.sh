#!/usr/bin/env bash
# Runs the ring's unit tests under Miri (Stacked Borrows, then Tree
# Borrows) where a nightly toolchain with Miri is installed; otherwise says
# why it skipped, and how to get one. The ring builds its header and slots
# in raw memory, so this is where undefined behaviour would show.
#
# Usage: scripts/miri.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri: SKIPPED: no nightly toolchain with Miri here" \
        "(rustup toolchain install nightly --component miri)"
    exit 0
fi
for model in "" "-Zmiri-tree-borrows"; do
    echo "== miri: ntbdk-ring unit tests ${model:-(stacked borrows)}"
    MIRIFLAGS="-Zmiri-strict-provenance ${model}" \
        cargo +nightly miri test -p ntbdk-ring --lib
done
