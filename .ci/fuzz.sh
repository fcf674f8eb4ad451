#!/usr/bin/env bash
# Short fuzzing pass: every cargo-fuzz target in fuzz/ for about
# FUZZ_SECONDS (default 60) each. Needs a nightly toolchain; without one it
# says so and exits 0. Exits non-zero if a target crashes (the crash input
# is left in fuzz/artifacts/<target>/).
#
# New inputs go to a scratch directory; the saved corpus in
# fuzz/corpus/<target>/ is only read (it is replayed by `cargo test` through
# tests/fuzz_replay.rs).
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
secs="${FUZZ_SECONDS:-60}"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: skipped (no nightly toolchain: cargo +nightly --version failed)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# cargo-fuzz keeps its own target dir under fuzz/.
unset CARGO_TARGET_DIR

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

status=0
for target in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$target" "$scratch/$target"
    echo "fuzz: $target for ${secs}s"
    if ! cargo +nightly fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$secs" -timeout=20 -print_final_stats=1; then
        echo "fuzz: $target FAILED (see fuzz/artifacts/$target/)" >&2
        status=1
    fi
done
exit "$status"
