#!/usr/bin/env bash
# Miri (tree borrows) over the library's unit tests and the kernel-fidelity
# integration tests, bounded by MIRI_SECONDS (default 240). Without nightly
# or its miri component it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "miri: SKIPPED (no nightly toolchain: cargo +nightly --version failed)"
    exit 0
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1 || true
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri: SKIPPED (the nightly miri component is not available)"
    exit 0
fi
# -Zmiri-ignore-leaks: epoch garbage queued at exit is never freed.
export MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks ${MIRIFLAGS_EXTRA:-}"
# backend::file does real file I/O (O_DIRECT), which Miri's isolation
# refuses, and one fidelity test reads tests/ (opendir); every other unit
# test and fidelity test runs (measured: about 40 s and 10 s of Miri time
# after the build). tests/smoke.rs is left out: one of its tests alone
# runs for more than 3 minutes under Miri.
timeout "${MIRI_SECONDS:-240}" cargo +nightly miri test --target-dir target/miri \
    --lib --test fidelity -- --skip backend::file \
    --skip loom_models_take_the_bound_from_loom_max_preemptions ${MIRI_TEST_FILTER:-}
