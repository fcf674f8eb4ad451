#!/usr/bin/env bash
# SQLite's write rows against the unix VFS, interleaved (issue 31): one
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
read -r -a cl <<<"$CONFIGS"
if [ -n "$BASE" ]; then
  for c in $CONFIGS; do [ "$c" = unix ] || cl+=("$c@base"); done
fi
RAW=$DIR/write-bench.tsv
: >"$RAW"
echo "date: $(date -Is); $(nproc) CPUs; load average: $(cut -d' ' -f1-3 /proc/loadavg); workload $W"
for r in $(seq 1 "$ROUNDS"); do
  k=${#cl[@]}
  for ((i = 0; i < k; i++)); do
    c=${cl[$(((i + r) % k))]}
    bin=$B conf=$c extra=()
    if [[ $c == *@base ]]; then bin=$BASE conf=${c%@base}; fi
    if [[ $conf == *+thread ]]; then conf=${conf%+thread} extra=(--idle-thread); fi
    out=$({ /usr/bin/time -f "%U %S" "$bin" run --db "$DIR/w.db" --config "$conf" --workload "$W" "${extra[@]}"; } 2>&1)
    secs=$(echo "$out" | head -1 | cut -f5)
    cpu=$(echo "$out" | tail -1 | awk '{print $1 + $2}')
    echo "$r $c $secs $cpu" >>"$RAW"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$RAW" <<'PY'
import statistics as st, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    r, c, s, cpu = line.split()
    runs[r][c] = (float(s), float(cpu))
configs = list(dict.fromkeys(c for v in runs.values() for c in v))
base = configs[0] if "unix" not in configs else "unix"
def med(xs):
    return f"{st.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"
def ratio(xs):
    return f"{st.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"
print(f"| config | wall, s | {base} / it | CPU, s | {base} / it, CPU |")
print("|---|---|---|---|---|")
for c in configs:
    v = [x[c] for x in runs.values() if c in x]
    rw = [x[base][0] / x[c][0] for x in runs.values() if c in x]
    rc = [x[base][1] / x[c][1] for x in runs.values() if c in x and x[c][1] > 0]
    print(f"| {c} | {med([a for a, _ in v])} | {ratio(rw)} | {med([b for _, b in v])} | {ratio(rc) if rc else '-'} |")
PY
