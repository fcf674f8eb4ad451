#!/usr/bin/env bash
# AddressSanitizer over the model, stress, smoke and fuzz-replay tests,
# the I/O engine's tests (a buffer dropped by the engine only after its
# completion, whatever the caller did with its handle), and the page cache's tests (folio buffers are freed through crossbeam and
# the light limbo while lock-free readers copy and pins hold them; with
# kxarray_system_alloc every buffer is its own allocation, so a premature
# free is caught) (nightly, -Zsanitizer=address). The tests are bounded by
# ASAN_SECONDS (default 420), the build apart.
# Without a nightly toolchain it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "asan: SKIPPED (no nightly toolchain: cargo +nightly --version failed)"
    exit 0
fi
# Epoch garbage still queued at exit is freed by nobody: leak checking
# would report it, so leaks are left to tests/leaks.rs.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
# The build is bounded on its own (about five minutes on a fresh 2-core
# checkout); the tests run for at most ASAN_SECONDS. A sanitizer report or a
# failing test fails the step; a run cut short by the time bound says how
# far it got and passes (as .ci/miri.sh: the bound is the machine's speed,
# not the code's).
export RUSTFLAGS="-Zsanitizer=address --cfg kxarray_system_alloc"
export RUSTDOCFLAGS="-Zsanitizer=address --cfg kxarray_system_alloc"
tests=(--test model --test stress --test stress_writers --test smoke --test fuzz_replay
    --test pagecache --test pagecache_stress --test pagecache_borrow --test pagecache_model
    --test pagecache_faults --test pagecache_readahead --test pagecache_revalidate
    --test aio_engine --test aio_backend)
timeout 1200 cargo +nightly test --target x86_64-unknown-linux-gnu --target-dir target/asan \
    "${tests[@]}" --no-run
log="$(mktemp)"
set +e
timeout "${ASAN_SECONDS:-420}" cargo +nightly test \
    --target x86_64-unknown-linux-gnu --target-dir target/asan "${tests[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -c ' \.\.\. ok$' "$log" || true)
if [ "$rc" = 124 ]; then
    if grep -qE 'AddressSanitizer|FAILED|panicked' "$log"; then
        echo "asan: FAILED before the time bound" >&2
        exit 1
    fi
    echo "asan: time bound (${ASAN_SECONDS:-420}s) reached after $passed tests passed clean; the rest did not run"
    exit 0
fi
echo "asan: $passed tests passed (exit $rc)"
exit "$rc"
