#!/usr/bin/env bash
# SQLite's own TCL test suite on the kxarray VFS, against the stock unix
# VFS: builds SQLite 3.40.1's testfixture from Debian's source with an
# SQLITE_EXTRA_INIT hook (testfixture/kxarray_init.c) that makes kxarray the
# default VFS of every connection when KXARRAY_TESTFIXTURE names the
# extension, runs each listed test file twice (unix, kxarray), and compares
# the failing test names. Exits 1 when a test fails on kxarray only and is
# not one of the tests of os_unix.c itself listed in
# testfixture/os_unix_only.txt (with its reason), or when a file crashes,
# hangs or leaks on kxarray only.
#
#   bash kxarray-sqlite/scripts/testfixture.sh              # the CI list (testfixture/ci.list)
#   bash kxarray-sqlite/scripts/testfixture.sh --list full  # testfixture/full.list
#   bash kxarray-sqlite/scripts/testfixture.sh wal2 pager1  # named files
#
# Environment: WORK (build and run directory, default target/testfixture),
# JOBS (files run at once, default the number of CPUs), TIMEOUT (seconds per
# file and VFS, default 900), RUNDIR (where the tests' files go: a directory
# under /dev/shm when there is one, else $WORK/run), CFLAGS_TF (the
# testfixture's optimization, default -O1), KXLIB (an extension already
# built, instead of this tree's `cargo build --release`).
#
# Nothing is cached between machines: the source comes from `apt-get
# source sqlite3` (a deb-src entry for bookworm is added when missing), and
# tcl-dev is installed when missing; when either cannot be had the script
# says so and exits 75 (CI then skips it). A rerun on the same machine
# reuses the build in $WORK.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-$ROOT/target/testfixture}
JOBS=${JOBS:-$(nproc)}
TIMEOUT=${TIMEOUT:-900}
if [ -z "${RUNDIR:-}" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then RUNDIR=/dev/shm/kxarray-testfixture-$$; else RUNDIR=$WORK/run; fi
fi
CFLAGS_TF=${CFLAGS_TF:--O1}
mkdir -p "$WORK"

list=ci
files=()
while [ $# -gt 0 ]; do
  case $1 in
    --list) list=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(grep -v '^\s*#' "$HERE/testfixture/$list.list" | awk 'NF {print $1}')
fi

say() { printf '[testfixture] %s\n' "$*" >&2; }

# --- source -----------------------------------------------------------------
SRC=$(ls -d "$WORK"/sqlite3-3.40.1 2>/dev/null || true)
if [ -z "$SRC" ]; then
  say "fetching SQLite's source (apt-get source sqlite3)"
  if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      > /etc/apt/sources.list.d/kxarray-deb-src.sources
    apt-get update -qq || true
  fi
  command -v dpkg-source >/dev/null || apt-get install -y -qq dpkg-dev >/dev/null || true
  (cd "$WORK" && apt-get source -qq sqlite3 >/dev/null 2>&1) || {
    apt-get update -qq && (cd "$WORK" && apt-get source -qq sqlite3 >/dev/null 2>&1)
  } || true
  SRC=$(ls -d "$WORK"/sqlite3-3.40.1 2>/dev/null || true)
  [ -n "$SRC" ] || { say "SKIPPED: no SQLite 3.40.1 source (apt-get source sqlite3 failed)"; exit 75; }
fi
[ -f /usr/include/tcl8.6/tcl.h ] || apt-get install -y -qq tcl-dev >/dev/null || true
[ -f /usr/include/tcl8.6/tcl.h ] || { say "SKIPPED: no tcl-dev"; exit 75; }

# --- testfixture with the hook ---------------------------------------------
BLD=$WORK/bld
TF=$BLD/testfixture
HOOK=$HERE/testfixture/kxarray_init.c
if [ ! -x "$TF" ] || [ "$HOOK" -nt "$TF" ]; then
  say "building testfixture ($CFLAGS_TF)"
  mkdir -p "$BLD"
  (
    cd "$BLD"
    [ -f Makefile ] || CFLAGS="$CFLAGS_TF" "$SRC/configure" --with-tcl=/usr/lib/tcl8.6 >configure.log 2>&1
    make -s sqlite3.h >make.log 2>&1
    cc $CFLAGS_TF -I. -c "$HOOK" -o kxarray_init.o
    make -s -j"$JOBS" testfixture OPTS=-DSQLITE_EXTRA_INIT=kxarray_testfixture_init \
      LIBS="$BLD/kxarray_init.o" >>make.log 2>&1
  ) || { tail -30 "$BLD/make.log" >&2; exit 2; }
fi

# --- the extension ------------------------------------------------------------
if [ -n "${KXLIB:-}" ]; then
  LIB=$KXLIB
else
  say "building the extension (cargo build --release -p kxarray-sqlite)"
  (cd "$ROOT" && cargo build --release -q -p kxarray-sqlite)
  LIB=$ROOT/target/release/libkxarray_sqlite.so
fi

# --- runs --------------------------------------------------------------------
rm -rf "$RUNDIR" "$WORK/logs"
mkdir -p "$RUNDIR" "$WORK/logs"
trap 'rm -rf "$RUNDIR"' EXIT
export TF SRC LIB RUNDIR TIMEOUT WORK
run_one() { # file vfs: log in $WORK/logs/<file>.<vfs>.log, result line on stdout
  local f=$1 vfs=$2 rc=0 t0 t1
  local dir=$RUNDIR/$2/$1 log=$WORK/logs/$1.$2.log
  mkdir -p "$dir"
  t0=$(date +%s)
  if [ "$vfs" = kxarray ]; then
    (cd "$dir" && KXARRAY_TESTFIXTURE=$LIB timeout -k 10 "$TIMEOUT" "$TF" "$SRC/test/$f.test") >"$log" 2>&1 || rc=$?
  else
    (cd "$dir" && env -u KXARRAY_TESTFIXTURE timeout -k 10 "$TIMEOUT" "$TF" "$SRC/test/$f.test") >"$log" 2>&1 || rc=$?
  fi
  t1=$(date +%s)
  rm -rf "$dir"
  local fails
  fails=$(sed -n 's/^!Failures on these tests: *//p' "$log" | tr ' ' '\n' | grep -v '^$' | sort -u | tr '\n' ' ')
  grep -q '^Unfreed memory' "$log" && fails+="$f:leak "
  grep -q 'files were left open' "$log" && fails+="$f:open-files "
  if ! grep -q 'errors out of' "$log"; then
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then fails+="$f:timeout "; else fails+="$f:crash($rc) "; fi
  fi
  printf '%s\t%s\t%s\t%s\n' "$f" "$vfs" "$((t1 - t0))" "$fails"
}
export -f run_one
say "running ${#files[@]} files on unix and kxarray, $JOBS at a time"
start=$(date +%s)
for f in "${files[@]}"; do
  [ -f "$SRC/test/$f.test" ] || { say "no such test file: $f"; exit 2; }
  printf '%s kxarray\n%s unix\n' "$f" "$f"
done | xargs -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"' >"$WORK/results.tsv"
say "ran in $(( $(date +%s) - start )) s"

# --- comparison --------------------------------------------------------------
python3 - "$WORK/results.tsv" "$HERE/testfixture/os_unix_only.txt" "${files[@]}" <<'PY'
import fnmatch, sys
results, known_file, files = sys.argv[1], sys.argv[2], sys.argv[3:]
fails, secs = {}, {}
for line in open(results):
    f, vfs, t, names = line.rstrip('\n').split('\t')
    fails[(f, vfs)] = set(names.split())
    secs[(f, vfs)] = int(t)
known = []
for line in open(known_file):
    line = line.split('#', 1)[0].strip()
    if line:
        pat, _, reason = line.partition(' ')
        known.append((pat, reason.strip()))
def why(name):
    for pat, reason in known:
        if fnmatch.fnmatchcase(name, pat):
            return reason
    return None
bad, allowed, same, fixed = [], [], 0, []
print('| file | unix failures | kxarray failures | kxarray only | listed (os_unix.c) | s unix | s kxarray |')
print('|---|---|---|---|---|---|---|')
for f in files:
    u, k = fails.get((f, 'unix'), {f + ':missing'}), fails.get((f, 'kxarray'), {f + ':missing'})
    only = sorted(k - u)
    listed = [n for n in only if why(n)]
    unlisted = [n for n in only if not why(n)]
    bad += unlisted
    allowed += listed
    fixed += sorted(u - k)
    if not only:
        same += 1
    print(f'| {f} | {len(u)} | {len(k)} | {" ".join(unlisted) or "-"} | {len(listed)} | '
          f'{secs.get((f, "unix"), "?")} | {secs.get((f, "kxarray"), "?")} |')
print()
print(f'{same} of {len(files)} files fail exactly as on unix; '
      f'{len(allowed)} kxarray-only failures are tests of os_unix.c itself (listed); '
      f'{len(bad)} are not.')
if fixed:
    print('failing on unix only: ' + ' '.join(fixed))
if bad:
    print('KXARRAY-ONLY FAILURES: ' + ' '.join(bad))
    sys.exit(1)
PY
