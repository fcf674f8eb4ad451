#!/usr/bin/env bash
# Miri (tree borrows) over the library's unit tests, bounded by
# MIRI_SECONDS (default 240). Without nightly or its miri component it says
# so and exits 0.
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
# The library's unit tests, except backend::file (real file I/O with
# O_DIRECT, which Miri's isolation refuses). Measured on a fresh 2-core CI
# checkout: about 150 s of build and 41 s of tests. The fidelity tests
# also pass under Miri (`--test fidelity -- --skip
# loom_models_take_the_bound_from_loom_max_preemptions`, 10 s) but their
# extra build does not fit the bound; tests/smoke.rs takes minutes per test.
timeout "${MIRI_SECONDS:-240}" cargo +nightly miri test -p kxarray --target-dir target/miri \
    --lib -- --skip backend::file ${MIRI_TEST_FILTER:-}
