#!/usr/bin/env bash
# SQLite's write rows against the unix VFS, interleaved: one
# workload of examples/sqlite_bench.rs (bulk: one transaction of 200,000
# rows in WAL; commit-wal; commit-full), each run its own process, the
# configurations in an order rotated per round; per configuration the
# median wall-clock time of the workload and the CPU time (user + system,
# the whole process) with their ratios against the first configuration
# per round (above 1: faster than it).
#
#   bash kxarray-sqlite/scripts/write-bench.sh                       # bulk, 9 rounds
#   W=commit-wal ROUNDS=7 bash kxarray-sqlite/scripts/write-bench.sh
#   CONFIGS="unix kx" BASE=/tmp/old-sqlite_bench bash kxarray-sqlite/scripts/write-bench.sh
#   CONFIGS="unix unix+thread kx" bash kxarray-sqlite/scripts/write-bench.sh
#
# `<config>+thread`: the example with `--idle-thread` (a process with a
# second thread, as every process using kxarray's VFS is: glibc's
# single-thread fast paths off).
# BASE: another build of the example; its rows run as `<config>@base`
# beside this build's (an A/B of two commits in one interleaved run).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-9}
W=${W:-bulk}
CONFIGS=${CONFIGS:-unix kx kx-direct}
DIR=${DIR:-target/sqlite-bench}
BASE=${BASE:-}
cargo build --release -p kxarray-sqlite --example sqlite_bench >&2
B=target/release/examples/sqlite_bench
mkdir -p "$DIR"
# shellcheck source=rounds.sh
. kxarray-sqlite/scripts/rounds.sh
read -r -a cl <<<"$CONFIGS"
if [ -n "$BASE" ]; then
  for c in $CONFIGS; do [ "$c" = unix ] || cl+=("$c@base"); done
fi
RAW=$DIR/write-bench.tsv
: >"$RAW"
echo "date: $(date -Is); $(nproc) CPUs; load average: $(cut -d' ' -f1-3 /proc/loadavg); workload $W"
one() { # config -> wall-clock seconds and CPU seconds of one run
  local c=$1 bin=$B conf=$1 extra=() out
  if [[ $c == *@base ]]; then bin=$BASE conf=${c%@base}; fi
  if [[ $conf == *+thread ]]; then conf=${conf%+thread} extra=(--idle-thread); fi
  out=$({ /usr/bin/time -f "%U %S" "$bin" run --db "$DIR/w.db" --config "$conf" --workload "$W" "${extra[@]}"; } 2>&1)
  echo "$(echo "$out" | head -1 | cut -f5) $(echo "$out" | tail -1 | awk '{print $1 + $2}')"
}
run_rounds "$RAW" "$ROUNDS" one "${cl[@]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
summarize_rounds "$RAW" unix "wall, s" "CPU, s"
