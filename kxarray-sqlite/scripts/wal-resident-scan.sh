#!/usr/bin/env bash
# Reads of pages that live in the WAL under PRAGMA locking_mode=EXCLUSIVE:
# the stock shell, 30 full scans of a 50,000-row table (rows of
# 300 bytes) whose pages are all in the WAL (wal_autocheckpoint=0) and not
# in SQLite's own cache (cache_size=10), so that every page is read from the
# WAL through the VFS. Configurations, interleaved over ROUNDS: unix (the
# default VFS), kx (the extension built from this tree, shared locking: the
# WAL read through kxarray's cache while the connection holds EXCLUSIVE),
# and, with BASE_LIB=<another build of libkxarray_sqlite, without the
# extension suffix>, kx@base. Prints the median seconds for the 30 scans
# and the ratio against unix (above 1: faster).
#
#   bash kxarray-sqlite/scripts/wal-resident-scan.sh
#   ROUNDS=9 BASE_LIB=/tmp/old/libkxarray_sqlite bash kxarray-sqlite/scripts/wal-resident-scan.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
DIR=${DIR:-target/sqlite-bench}
BASE_LIB=${BASE_LIB:-}
command -v sqlite3 >/dev/null || { echo "needs the sqlite3 shell (apt-get install -y sqlite3)" >&2; exit 1; }
cargo build --release -p kxarray-sqlite --lib >&2
LIB=$PWD/target/release/libkxarray_sqlite
mkdir -p "$DIR"
# shellcheck source=rounds.sh
. kxarray-sqlite/scripts/rounds.sh
configs=(unix kx)
[ -n "$BASE_LIB" ] && configs+=(kx@base)
RAW=$DIR/wal-resident-scan.tsv
: >"$RAW"
echo "date: $(date -Is); $(nproc) CPUs; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
one() { # config -> seconds of the 30 scans
  local c=$1 db=$DIR/wal-scan-$1.db pre
  rm -f "$db" "$db-wal" "$db-shm"
  case $c in
    unix) pre=".open $db" ;;
    kx) pre=".load $LIB
.open file:$db?vfs=kxarray" ;;
    kx@base) pre=".load $BASE_LIB
.open file:$db?vfs=kxarray" ;;
  esac
  local scans
  scans=$(for _ in $(seq 30); do echo "SELECT sum(length(v)) FROM t;"; done)
  sqlite3 -batch <<SQL | grep -o "real [0-9.]*" | awk '{s += $2} END {printf "%.4f\n", s}'
$pre
PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; PRAGMA cache_size=10;
CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 50000) INSERT INTO t(v) SELECT randomblob(300) FROM k;
.timer on
$scans
SQL
  rm -f "$db" "$db-wal" "$db-shm"
}
run_rounds "$RAW" "$ROUNDS" one "${configs[@]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
summarize_rounds "$RAW" unix "30 scans, s"
