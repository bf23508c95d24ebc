#!/usr/bin/env bash
# Runs the ring's tests under Miri, which interprets them and stops at
# undefined behaviour: out-of-bounds or misaligned accesses, uses of
# uninitialised slots, aliasing violations (Stacked Borrows, then Tree
# Borrows), and data races between the threads of the stress tests, with
# its emulation of weak memory on the atomics. The ring builds its header
# and slots in raw memory, so this is where such bugs would show.
#
# What runs: the unit tests, the property tests against a `VecDeque`
# model (a few cases each, under Stacked Borrows), the bad-input tests (corrupted headers and
# indices), and the multi-thread stress tests in every mode (a few hundred
# items per producer). Not the cross-process test: Miri can neither create
# a memfd nor start a process. The loom models run in their own build.
#
# Needs a nightly toolchain with Miri; without one it says why it skipped
# and how to get one (`.ci/run` installs it).
#
# Usage: scripts/miri.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri: SKIPPED: no nightly toolchain with Miri here" \
        "(rustup toolchain install nightly --component miri,rust-src)"
    exit 0
fi
# A nightly older than the workspace's rust-version cannot build it: skip.
need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
have=$(rustc +nightly --version | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')
if [ "$(printf '%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    echo "miri: SKIPPED: the nightly toolchain is Rust $have, older than the $need" \
        "this workspace needs (rustup update nightly)"
    exit 0
fi
# Isolation off: proptest reads and writes its regression files, and the
# stress tests' watchdog reads the clock. Proptest's default generator
# (ChaCha) costs minutes per case in the interpreter; its XorShift does not.
export PROPTEST_RNG_ALGORITHM=xs
flags="-Zmiri-strict-provenance -Zmiri-disable-isolation"

echo "== miri: ntbdk-ring tests (Stacked Borrows)"
MIRIFLAGS="$flags" cargo +nightly miri test -p ntbdk-ring \
    --lib --test bad_input --test model --test stress
# The property tests' operations are the ones the stress tests mix; the
# second aliasing model runs without them, to keep CI short.
echo "== miri: ntbdk-ring tests (Tree Borrows)"
MIRIFLAGS="$flags -Zmiri-tree-borrows" cargo +nightly miri test -p ntbdk-ring \
    --lib --test bad_input --test stress
