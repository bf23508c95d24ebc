#!/usr/bin/env bash
# Runs the whole ntbdk test suite: every crate's unit, integration,
# multi-process and property tests, the doc examples, the bad-input tests
# and the pmd unit tests once more with debug assertions and overflow
# checks on, then the loom model checks (which need their own build with
# `--cfg loom`), then the bind and hugepage scripts' tests (against a fake
# sysfs tree and a fake hugepage pool; no root needed).
#
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace (release: the multi-process stress tests need real speed)"
cargo test --workspace --release "$@"

echo "== the never-panics tests again with debug assertions and overflow checks (dev profile)"
cargo test -p ntbdk-pmd --lib --test transport_bad_input --test transport_wire_prop \
    --test transport_isolation "$@"

echo "== the ring under Miri (where a nightly toolchain with Miri is installed)"
scripts/miri.sh

echo "== loom model checks"
RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}" CARGO_TARGET_DIR=target/loom \
    cargo test -p ntbdk-ring --release --test loom "$@"

echo "== ntbdk-devbind on a fake sysfs, setup-hugepages.sh on a fake pool"
scripts/tests/devbind-test.sh
scripts/tests/hugepages-test.sh
