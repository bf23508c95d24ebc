#!/usr/bin/env bash
# Runs the fuzz targets of pmd/fuzz on the stable toolchain, without
# cargo-fuzz: builds them with libFuzzer's coverage instrumentation
# (SanitizerCoverage through `-Cpasses=sancov-module`, which stable rustc
# accepts; plus debug assertions and overflow checks), runs every file of
# pmd/fuzz/corpus/<target>/ once as a regression input, then fuzzes each
# target for a bounded time from a scratch copy of that corpus.
#
# Not covered on stable: AddressSanitizer (`-Zsanitizer=address`, nightly
# only); a memory error that does not panic or crash goes unseen here.
#
# A crash, panic, timeout or out-of-memory fails the script; the input is
# kept under pmd/fuzz/artifacts/<target>/ (git-ignored). Add it to the
# corpus directory to keep it as a regression input.
#
# Usage: scripts/fuzz.sh [seconds of fuzzing per target, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-30}"
case "$secs" in
'' | *[!0-9]*)
    echo "fuzz: seconds must be a whole number, not '$secs'" >&2
    exit 2
    ;;
esac
targets=(wire_decode transport_inject)
# Every target in the crate is run: a new one missing here is an error.
for f in pmd/fuzz/fuzz_targets/*.rs; do
    t=$(basename "$f" .rs)
    case " ${targets[*]} " in
    *" $t "*) ;;
    *)
        echo "fuzz: the target $t is not run: add it to targets in scripts/fuzz.sh" >&2
        exit 1
        ;;
    esac
done

host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=pmd/fuzz/target/sancov
flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    --cfg fuzzing
    -Cdebug-assertions
    -Coverflow-checks
)
echo "== fuzz: building the targets with coverage instrumentation ($host)"
# An explicit --target keeps the flags off build scripts and proc macros
# (which would not link without libFuzzer).
RUSTFLAGS="${flags[*]} ${RUSTFLAGS:-}" \
    cargo build --manifest-path pmd/fuzz/Cargo.toml --release --target "$host"
bin="$CARGO_TARGET_DIR/$host/release"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for t in "${targets[@]}"; do
    seeds="pmd/fuzz/corpus/$t"
    mapfile -t files < <(find "$seeds" -type f | sort)
    if [ "${#files[@]}" -eq 0 ]; then
        echo "fuzz: no corpus for $t in $seeds" >&2
        exit 1
    fi
    art="pmd/fuzz/artifacts/$t"
    mkdir -p "$art" "$scratch/$t"
    echo "== fuzz: $t: ${#files[@]} corpus files, each once"
    if ! "$bin/$t" -artifact_prefix="$art/" "${files[@]}"; then
        echo "fuzz: $t failed on its corpus (see above)" >&2
        exit 1
    fi
    echo "== fuzz: $t: fuzzing for ${secs}s"
    if ! "$bin/$t" -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 \
        -artifact_prefix="$art/" "$scratch/$t" "$seeds"; then
        echo "fuzz: $t failed; the input is in $art/" >&2
        exit 1
    fi
done
echo "== fuzz: all targets passed"
