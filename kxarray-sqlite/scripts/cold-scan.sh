#!/usr/bin/env bash
# The stock sqlite3 shell's cold full scan: one
# `SELECT sum(length(v)) FROM t` over a database dropped from every cache
# (a fresh shell process with a runtime directory of its own, so an empty
# kxarray cache, private or shared, and the file dropped
# from the kernel's with posix_fadvise DONTNEED), through the unix VFS and
# through the kxarray VFS with kx_direct=1 (O_DIRECT below the cache: its
# own readahead is all there is) and kx_direct=0, interleaved in an order
# rotated per round; wall-clock seconds per scan, medians and the ratio
# unix / kx per round (above 1: kxarray faster), median and range.
#
#   bash kxarray-sqlite/scripts/cold-scan.sh            # 5 rounds, 1,000,000 rows (about 456 MB)
#   ROUNDS=3 ROWS=2400000 bash kxarray-sqlite/scripts/cold-scan.sh   # about 1.1 GB
#   KEYS=scattered ROWS=400000 CONFIGS="unix kx-direct kx-direct-noprefetch" bash kxarray-sqlite/scripts/cold-scan.sh
#
# kx-private: kx_direct=0 with the process's own cache (kx_shared=0)
# instead of the machine's shared one.
#
# kx-before, kx-direct-before: kx and kx-direct with another build of the
# extension (KX_BEFORE=/path/to/libkxarray_sqlite, no suffix).
#
# KEYS=scattered: a table filled in a scattered key order (its leaves out
# of order in the file: db.sh); kx-direct-noprefetch: kx_direct=1 with
# kx_prefetch=0 (no prefetch of a scan's B-tree children).
#
# The database is made once with the unix VFS (DIR, default
# target/sqlite-bench; not tmpfs, which refuses O_DIRECT) and reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
ROWS=${ROWS:-1000000}
DIR=${DIR:-target/sqlite-bench}
CONFIGS=${CONFIGS:-unix kx-direct kx}
command -v sqlite3 >/dev/null || { echo "sqlite3 not found: apt-get install -y sqlite3" >&2; exit 1; }
cargo build --release -p kxarray-sqlite --lib >&2
LIB=$PWD/target/release/libkxarray_sqlite
mkdir -p "$DIR"
KEYS=${KEYS:-sequential}
DB=$DIR/cold-$ROWS.db
[ "$KEYS" = scattered ] && DB=$DIR/cold-scattered-$ROWS.db
# shellcheck source=db.sh
. kxarray-sqlite/scripts/db.sh
# shellcheck source=rounds.sh
. kxarray-sqlite/scripts/rounds.sh
make_db "$DB" "$ROWS" "$KEYS"
scan() { # config -> seconds
  local uri
  case $1 in
    unix) uri="file:$DB?mode=ro" ;;
    kx-direct) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=1" ;;
    kx-direct-noprefetch) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=1&kx_prefetch=0" ;;
    kx) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=0" ;;
    kx-private) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=0&kx_shared=0" ;;
    kx-before) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=0" ;;
    kx-direct-before) uri="file:$DB?vfs=kxarray&mode=ro&kx_direct=1" ;;
    *) echo "unknown config $1" >&2; exit 2 ;;
  esac
  drop "$DB"
  local t0 t1 out
  t0=$(date +%s.%N)
  local lib=$LIB
  [ "${1%-before}" = "$1" ] || lib=${KX_BEFORE:?set KX_BEFORE to the other build of the extension}
  # A runtime directory of its own: the shared cache's region starts
  # empty, as on a machine where no process has the database open (the
  # kx_direct=1 configurations have a private cache anyway).
  local rt
  rt=$(mktemp -d /dev/shm/kx-cold-scan.XXXXXX)
  # removed however the scan ends (an interrupt or a kill of the script too)
  trap "rm -rf '$rt'" EXIT
  out=$(XDG_RUNTIME_DIR=$rt sqlite3 -cmd ".load $lib" -cmd ".open '$uri'" :memory: 'SELECT sum(length(v)) FROM t;')
  t1=$(date +%s.%N)
  rm -rf "$rt"
  trap - EXIT
  [ "$out" = $((ROWS * 400)) ] || { echo "$1: wrong result $out" >&2; exit 1; }
  echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}'
}
RAW=$DIR/cold-scan.tsv
: >"$RAW"
echo "date: $(date -Is); $(nproc) CPUs; load average: $(cut -d' ' -f1-3 /proc/loadavg); $DB: $(du -m "$DB" | cut -f1) MiB; $(sqlite3 --version | cut -d' ' -f1-2)"
read -r -a cl <<<"$CONFIGS"
run_rounds "$RAW" "$ROUNDS" scan "${cl[@]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
summarize_rounds "$RAW" unix "cold full scan, s"
