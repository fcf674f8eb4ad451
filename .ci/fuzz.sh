#!/usr/bin/env bash
# Short fuzzing pass: every cargo-fuzz target in fuzz/ for a fixed number
# of runs from a fixed seed, bounded by FUZZ_SECONDS (default 60) each. Needs a nightly toolchain and cargo-fuzz;
# without nightly it says so and exits 0, and it installs cargo-fuzz when
# missing (FUZZ_INSTALL=0 skips instead). Exits non-zero if a target
# crashes (the crash input is left in fuzz/artifacts/<target>/).
#
# The api target's operations that reach the known defects
# (`KNOWN_DEFECTS_FIXED` in tests/fuzz_common/api.rs) are on only once
# that constant is true, so CI stays green while the fixes are pending;
# KX_FUZZ_KNOWN_DEFECT_OPS overrides (1: all, 0: none, or a list).
#
# New inputs go to a scratch directory; the saved corpus in
# fuzz/corpus/<target>/ is only read (it is replayed by `cargo test` through
# tests/fuzz_replay.rs).
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
secs="${FUZZ_SECONDS:-60}"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: SKIPPED (no nightly toolchain: cargo +nightly --version failed)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    if [ "${FUZZ_INSTALL:-1}" = 0 ]; then
        echo "fuzz: SKIPPED (cargo-fuzz not installed)"
        exit 0
    fi
    echo "fuzz: installing cargo-fuzz"
    t0=$(date +%s)
    cargo install --locked cargo-fuzz
    echo "fuzz: cargo-fuzz installed in $(( $(date +%s) - t0 ))s"
fi

if [ -z "${KX_FUZZ_KNOWN_DEFECT_OPS:-}" ]; then
    if grep -qE 'const KNOWN_DEFECTS_FIXED: bool = true' ../tests/fuzz_common/api.rs; then
        export KX_FUZZ_KNOWN_DEFECT_OPS=1
    else
        export KX_FUZZ_KNOWN_DEFECT_OPS=0
        echo "fuzz: api runs without the known-defect operations (KNOWN_DEFECTS_FIXED is false)"
    fi
fi

# cargo-fuzz keeps its own target dir under fuzz/.
unset CARGO_TARGET_DIR

# A fixed seed and a run count make the CI pass reproducible: the same
# inputs are tried on every machine fast enough to finish the runs within
# the time bound, so a failure here is a finding to fix, not luck. Longer
# exploratory runs: FUZZ_SEED=0 (random) and a larger FUZZ_SECONDS or
# FUZZ_RUNS.
seed="${FUZZ_SEED:-1}"
runs_for() {
    if [ -n "${FUZZ_RUNS:-}" ]; then echo "$FUZZ_RUNS"; return; fi
    case "$1" in
        split_insert) echo 2000 ;;   # about 90 inputs/s
        *) echo 25000 ;;             # api, filemap: about 1,100-1,800 inputs/s
    esac
}

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

status=0
for target in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$target" "$scratch/$target"
    runs="$(runs_for "$target")"
    echo "fuzz: $target, seed $seed, $runs runs or ${secs}s, whichever ends first"
    if ! cargo +nightly fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
        -seed="$seed" -runs="$runs" -max_total_time="$secs" -timeout=20 -print_final_stats=1 2>&1 |
        tee "$scratch/$target.log" | grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^Done|panicked|SUMMARY|ERROR' ; then
        :
    fi
    if ! grep -q 'Done [0-9]* runs' "$scratch/$target.log"; then
        echo "fuzz: $target FAILED (see fuzz/artifacts/$target/)" >&2
        tail -40 "$scratch/$target.log" >&2
        status=1
    fi
done
exit "$status"
