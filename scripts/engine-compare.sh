#!/usr/bin/env bash
# Before/after evidence for an engine change.
#
#   scripts/engine-compare.sh BEFORE AFTER [OUT.md]
#
# BEFORE and AFTER are each a git revision of this repository (exported with
# `git archive`) or a path to a checkout/worktree (built as it is on disk,
# uncommitted changes included; nothing is written into it).
#
# Each side is built once, into its own target dir under $WORK:
#   - the criterion benches `xarray` and `add_folio` (bench profile);
#   - examples/engine_paths.rs of THIS checkout, as a tiny separate crate
#     depending on the side's kxarray by path (release profile), so that the
#     same driver runs against both sides even if a side lacks the file.
# Then:
#   (a) the benches, interleaved: ROUNDS rounds; in each round every part
#       (xarray per shape, restricted to the kxarray rows; add_folio whole)
#       runs before then after (odd rounds) or after then before (even
#       rounds), back to back. Tables: before, after, ratio, flag > 5% slower.
#   (b) callgrind instruction counts per operation of `load`, cursor `next`
#       and the conflict scan: `engine_paths <path> N` at N1 and N2
#       iterations, differenced, so the setup cancels.
#   (c) per-file counts (`unsafe {`, `// SAFETY:`, `# Safety`,
#       `debug_assert!`, lines) and the module import graph of both src/.
# The report goes to OUT.md (default $WORK/report.md) and to stdout.
#
# Environment: ROUNDS (default 3), CG_N1/CG_N2 (default 200000/400000),
# QUICK=1 (the benches print only their tables: KXARRAY_BENCH_QUICK=1, a few
# chunks per case instead of criterion's samples; minutes instead of an
# hour, so more rounds fit), SKIP_BENCH=1, SKIP_CALLGRIND=1 (skip parts), WORK (default
# <this repo>/target/engine-compare; builds there are incremental across
# runs). Needs cargo, python3, git, and valgrind for (b) (installed with
# apt-get when missing and running as root).
set -euo pipefail

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 2 ] || usage

here="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${WORK:-$here/target/engine-compare}"
ROUNDS="${ROUNDS:-3}"
CG_N1="${CG_N1:-200000}"
CG_N2="${CG_N2:-400000}"
OUT="${3:-$WORK/report.md}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
log() { printf '[engine-compare %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# --- sources ------------------------------------------------------------
# resolve LABEL SPEC: prints the source dir and records a description
declare -A SRC DESC
resolve() {
  local label=$1 spec=$2
  if [ -d "$spec" ]; then
    SRC[$label]="$(cd "$spec" && pwd)"
    local rev
    rev="$(git -C "$spec" rev-parse --short HEAD 2>/dev/null || echo '?')"
    local dirty=""
    [ -n "$(git -C "$spec" status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=" + uncommitted changes"
    DESC[$label]="worktree ${SRC[$label]} (HEAD $rev$dirty)"
  else
    local commit
    commit="$(git -C "$here" rev-parse --verify "$spec^{commit}")" || { echo "not a directory or revision: $spec" >&2; exit 2; }
    local dir="$WORK/src-$label"
    if [ "$(cat "$dir/.commit" 2>/dev/null)" != "$commit" ]; then
      rm -rf "$dir"
      mkdir -p "$dir"
      git -C "$here" archive "$commit" | tar -x -C "$dir"
      echo "$commit" >"$dir/.commit"
    fi
    SRC[$label]="$dir"
    DESC[$label]="revision $spec ($(git -C "$here" rev-parse --short "$commit"))"
  fi
}
resolve before "$1"
resolve after "$2"
log "before: ${DESC[before]}"
log "after:  ${DESC[after]}"

# --- builds -------------------------------------------------------------
declare -A XA_BIN AF_BIN PATHS_BIN
build() {
  local label=$1 src=${SRC[$1]} tgt="$WORK/target-$1"
  log "building $label benches into $tgt"
  local json
  json="$(cd "$src" && cargo bench -p kxarray --no-run --bench xarray --bench add_folio \
    --target-dir "$tgt" --message-format=json-render-diagnostics 2>"$WORK/build-$label.log")" ||
    { tail -n 30 "$WORK/build-$label.log" >&2; echo "bench build of $label failed" >&2; exit 1; }
  XA_BIN[$label]="$(printf '%s\n' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' xarray | tail -n 1)"
  AF_BIN[$label]="$(printf '%s\n' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' add_folio | tail -n 1)"
  [ -x "${XA_BIN[$label]}" ] && [ -x "${AF_BIN[$label]}" ] || { echo "bench build of $label failed" >&2; exit 1; }

  log "building $label engine_paths driver"
  local crate="$WORK/paths-$label"
  mkdir -p "$crate/src"
  cat >"$crate/Cargo.toml" <<EOF
[package]
name = "engine-paths"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
kxarray = { path = "$src" }

[profile.release]
debug = true

[workspace]
EOF
  cp "$here/examples/engine_paths.rs" "$crate/src/main.rs"
  # the side's own lock file, so both sides use the same dependency versions
  [ -f "$crate/Cargo.lock" ] || cp "$src/Cargo.lock" "$crate/Cargo.lock"
  (cd "$crate" && cargo build --release --target-dir "$tgt" >>"$WORK/build-$label.log" 2>&1) ||
    { tail -n 30 "$WORK/build-$label.log" >&2; echo "engine_paths build of $label failed" >&2; exit 1; }
  PATHS_BIN[$label]="$tgt/release/engine-paths"
  [ -x "${PATHS_BIN[$label]}" ] || { echo "engine_paths build of $label failed" >&2; exit 1; }
}
build before
build after

# --- (a) interleaved benches ---------------------------------------------
runs="$WORK/runs"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  rm -rf "$runs"
  mkdir -p "$runs"
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for shape in dense sparse40 sparse64; do
      for label in $order; do
        log "round $r/$ROUNDS xarray $shape $label"
        KXARRAY_BENCH_QUICK=${QUICK:-} KXARRAY_BENCH_SHAPES=$shape CRITERION_HOME="$WORK/criterion-$label" \
          "${XA_BIN[$label]}" --bench --noplot kxarray \
          >"$runs/xarray-$shape-$label-$r.txt" 2>"$runs/xarray-$shape-$label-$r.err"
      done
    done
    for label in $order; do
      log "round $r/$ROUNDS add_folio $label"
      KXARRAY_BENCH_QUICK=${QUICK:-} CRITERION_HOME="$WORK/criterion-$label" "${AF_BIN[$label]}" --bench --noplot \
        >"$runs/add_folio-all-$label-$r.txt" 2>"$runs/add_folio-all-$label-$r.err"
    done
  done
fi

# --- (b) callgrind --------------------------------------------------------
cg="$WORK/callgrind"
if [ "${SKIP_CALLGRIND:-0}" != 1 ]; then
  if ! command -v valgrind >/dev/null; then
    log "installing valgrind"
    (apt-get update -qq && apt-get install -y -qq valgrind) >/dev/null 2>&1 || true
  fi
  if command -v valgrind >/dev/null; then
    rm -rf "$cg"
    mkdir -p "$cg"
    for path in load next conflicts iter store add_folio; do
      for label in before after; do
        for n in "$CG_N1" "$CG_N2"; do
          log "callgrind $label $path $n"
          valgrind --tool=callgrind --callgrind-out-file="$cg/$label-$path-$n.callgrind" \
            "${PATHS_BIN[$label]}" "$path" "$n" >"$cg/$label-$path-$n.stdout" 2>"$cg/$label-$path-$n.out"
          # the two sides must compute the same thing
        done
      done
      if ! cmp -s "$cg/before-$path-$CG_N2.stdout" "$cg/after-$path-$CG_N2.stdout"; then
        log "WARNING: $path checksums differ between before and after"
      fi
    done
  else
    log "valgrind unavailable: skipping (b)"
  fi
fi

# --- report ---------------------------------------------------------------
{
  echo "# Engine comparison"
  echo
  echo "- before: ${DESC[before]}"
  echo "- after: ${DESC[after]}"
  echo "- machine: $(nproc) cores, $(uname -sr), $(rustc --version)"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- command: \`scripts/engine-compare.sh $1 $2\` (ROUNDS=$ROUNDS, QUICK=${QUICK:-}, CG_N1=$CG_N1, CG_N2=$CG_N2)"
  echo
  echo "## (a) Benchmarks, interleaved"
  echo
  if [ -d "$runs" ] && ls "$runs"/*.txt >/dev/null 2>&1; then
    echo "$ROUNDS rounds; in each, every part (xarray per shape, kxarray rows only; add_folio whole) ran before and after back to back, alternating which went first. Values: median over the rounds (ns per op / per add unless a unit is shown). Ratio = after / before, > 1 means after is slower."
    echo
    python3 "$here/scripts/engine_compare_report.py" bench "$runs"
  else
    echo "(skipped)"
  fi
  echo
  echo "## (b) Callgrind instructions per operation"
  echo
  if [ -d "$cg" ] && ls "$cg"/*.out >/dev/null 2>&1; then
    echo "\`engine_paths <path> N\` (examples/engine_paths.rs) under \`valgrind --tool=callgrind\`, (Ir(N=$CG_N2) - Ir(N=$CG_N1)) / $((CG_N2 - CG_N1)), so the setup cancels; deterministic, unlike the timings. Array: the values 0..2^16. load = one \`XArray::load\` of a present key; next = one \`XaState::next\` step; conflicts = one conflict scan of a full 64-entry leaf (order-6 cursor, lock held), i.e. 64 conflicts; iter = one \`XArray::iter\` step; store = one \`XArray::store\` of a value over a present value (lock, walk, store, unlock); add_folio = one refault cycle (\`add_folio\` of an order-0 folio over an order-0 shadow + \`remove_folio\` leaving the shadow)."
    echo
    python3 "$here/scripts/engine_compare_report.py" callgrind "$cg" "$CG_N1" "$CG_N2"
  else
    echo "(skipped)"
  fi
  echo
  echo "## (c) Source figures"
  echo
  python3 "$here/scripts/engine_stats.py" "${SRC[before]}/src" "${SRC[after]}/src"
  echo
  echo "\`python3 /work/shared/tools/modcycles.py src\`, before: \`$(python3 /work/shared/tools/modcycles.py "${SRC[before]}/src" 2>&1 | tail -n 1)\`; after: \`$(python3 /work/shared/tools/modcycles.py "${SRC[after]}/src" 2>&1 | tail -n 1)\`."
} >"$OUT"
cat "$OUT"
log "report: $OUT"
