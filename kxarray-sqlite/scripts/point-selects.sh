#!/usr/bin/env bash
# The "regression to win back": the stock sqlite3 shell, QUERIES point
# selects in ONE statement over a table of ROWS rows of 400 bytes
# (scripts/db.sh's database), warm:
#
#   SELECT sum((SELECT length(v) FROM t WHERE id = (value*2654435761) % ROWS + 1))
#     FROM generate_series(1, QUERIES)
#
# Each run is a fresh `sqlite3` process that runs the statement twice with
# `.timer on`: the first run fills kxarray's cache (kx_cache=1g holds the
# whole database) and SQLite's; the second is the one timed ("Run Time:
# real"). The kernel's cache holds the file (read with cat before every
# round); the configurations' order rotates per round.
#
#   bash kxarray-sqlite/scripts/point-selects.sh
#   ROUNDS=7 CONFIGS="unix-mmap kx kx-excl" bash kxarray-sqlite/scripts/point-selects.sh
#   CALLGRIND=1 QUERIES=50000 bash kxarray-sqlite/scripts/point-selects.sh
#
# Configurations:
#   unix        the default unix VFS
#   unix-mmap   the unix VFS with PRAGMA mmap_size=1g
#   kx          kxarray, kx_cache=1g, shared locking (the default): the
#               copy path (no mmap_size, so SQLite never calls xFetch)
#   kx-fetch    the same with PRAGMA mmap_size=1g: zero-copy xFetch
#   kx-excl     kxarray, kx_cache=1g, kx_locking=exclusive: the copy path
#   kx-fetch-excl  kx-excl with PRAGMA mmap_size=1g
#   old-kx, old-kx-fetch  kx and kx-fetch with another build of the
#               extension, OLD_EXT (a path without the .so), for before/after
# Prints each run's seconds, then per configuration the median and the
# medians (and ranges) of the per-round ratios unix/config and
# unix-mmap/config (above 1.0: the configuration is faster).
#
# CALLGRIND=1: instead, each configuration runs once under valgrind
# --tool=callgrind (the thread-pool I/O engine), the counters zeroed after
# the first statement and dumped after the second (callgrind_control from
# the shell's .system): instructions per select of the warm statement, in
# user space only (a pread's copy in the kernel is not counted: compare kx
# with kx, and kx with unix-mmap, whose hits copy nothing). Deterministic:
# the primary evidence on a noisy machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
ROWS=${ROWS:-400000}
QUERIES=${QUERIES:-300000}
DIR=${DIR:-target/sqlite-bench}
CONFIGS=${CONFIGS:-"unix unix-mmap kx kx-fetch kx-excl"}
CALLGRIND=${CALLGRIND:-0}
CG_OPTS=${CG_OPTS:-}            # more callgrind options, e.g. --cache-sim=yes
KX_EXTRA=${KX_EXTRA:-}          # more URI parameters for the kx configurations
mkdir -p "$DIR"
DB=$DIR/points-$ROWS.db
EXT=${EXT:-target/release/libkxarray_sqlite}   # another build: EXT=/other/target/release/libkxarray_sqlite
OLD_EXT=${OLD_EXT:-}

command -v sqlite3 >/dev/null || { echo "sqlite3 not installed (apt-get install -y sqlite3)" >&2; exit 1; }
if [ "$EXT" = target/release/libkxarray_sqlite ]; then
  echo "building the extension (release)..." >&2
  cargo build --release -p kxarray-sqlite --lib >/dev/null 2>&1
fi
# shellcheck source=db.sh
. kxarray-sqlite/scripts/db.sh
make_db "$DB" "$ROWS"
Q="SELECT sum((SELECT length(v) FROM t WHERE id = (value*2654435761) % $ROWS + 1)) FROM generate_series(1,$QUERIES);"
echo "database: $(du -m "$DB" | cut -f1) MB; $QUERIES selects per statement; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

script() { # config times -> the shell's input on stdout
  local c=$1 times=$2 uri="file:$DB?vfs=kxarray&kx_cache=1g$KX_EXTRA" map=0
  case "$c" in
    unix) uri="file:$DB" ;;
    unix-mmap) uri="file:$DB"; map=1073741824 ;;
    kx) ;;
    kx-fetch) map=1073741824 ;;
    kx-excl) uri="$uri&kx_locking=exclusive" ;;
    kx-fetch-excl) uri="$uri&kx_locking=exclusive"; map=1073741824 ;;
    old-kx) ;;
    old-kx-fetch) map=1073741824 ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
  case "$c" in kx*) echo ".load $EXT" ;; old-kx*) echo ".load $OLD_EXT" ;; esac
  echo ".open '$uri'"
  echo "PRAGMA mmap_size=$map;"
  echo ".timer on"
  for ((k = 0; k < times; k++)); do
    echo "$Q"
    case "$c" in *kx*) printf '.timer off\nPRAGMA kx_stats;\n.timer on\n' ;; esac
  done
}

if [ "$CALLGRIND" = 1 ]; then
  # Instructions of hits only: the cache keeps its capacity whatever the
  # machine's memory pressure (a shrink under other processes' load sent
  # reads to the miss path, whose copy callgrind counts differently).
  KX_EXTRA="$KX_EXTRA&kx_pressure=0&kx_budget=0"
  command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }
  echo "| config | instructions per select (warm statement) |"
  echo "|---|---|"
  for c in $CONFIGS; do
    # The counters are zeroed after the first (warm-up) statement and
    # dumped after the second: the dump holds the warm statement alone.
    script "$c" 1 > "$DIR/cg.sql"
    { echo '.system callgrind_control -z $PPID >/dev/null'; echo "$Q"
      echo '.system callgrind_control -d $PPID >/dev/null'; } >> "$DIR/cg.sql"
    rm -f "$DIR/callgrind.$c" "$DIR/callgrind.$c".*
    # io_uring's completions are invisible to valgrind (a wait never
    # returns): the thread-pool engine under callgrind.
    # (callgrind_control now and then misses the process: run again)
    for try in 1 2 3; do
      KXARRAY_IO_ENGINE=threads valgrind --tool=callgrind $CG_OPTS --callgrind-out-file="$DIR/callgrind.$c" \
        sqlite3 < "$DIR/cg.sql" > /dev/null 2> "$DIR/cg.log" || true
      [ -s "$DIR/callgrind.$c.1" ] && break
    done
    ir=$(sed -n 's/^summary: //p' "$DIR/callgrind.$c.1" | cut -d' ' -f1)
    echo "| $c | $((ir / QUERIES)) |"
  done
  echo "(profiles of the warm statement: $DIR/callgrind.CONFIG.1; callgrind_annotate them)" >&2
  exit 0
fi

OUT=$DIR/points.tsv
: > "$OUT"
read -r -a cfgs <<< "$CONFIGS"
n=${#cfgs[@]}
for ((r = 0; r < ROUNDS; r++)); do
  cat "$DB" > /dev/null
  for ((i = 0; i < n; i++)); do
    c=${cfgs[$(((i + r) % n))]}
    o=$(script "$c" 2 | sqlite3)
    s=$(echo "$o" | sed -n 's/^Run Time: real \([0-9.]*\).*/\1/p' | sed -n 2p)
    # kxarray's misses during the timed statement (0: every read a hit)
    m=$(echo "$o" | sed -n 's/^misses=\([0-9]*\).*/\1/p' | tr '\n' ' ' | awk 'NF == 2 {print $2 - $1}')
    printf '%s\t%s\t%s\n' "$r" "$c" "$s" >> "$OUT"
    printf 'round %s %-13s %s s%s\n' "$r" "$c" "$s" "${m:+ (cache misses: $m)}" >&2
  done
done

python3 - "$OUT" <<'EOF'
import statistics, sys
t = {}
for l in open(sys.argv[1]):
    r, c, s = l.split()
    t.setdefault(c, {})[r] = float(s)
def ratio(base, c):
    if base not in t:
        return "-"
    rs = [t[base][r] / s for r, s in t[c].items() if r in t[base] and s > 0]
    return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"
print("| config | median s | unix / config (median, range) | unix-mmap / config (median, range) |")
print("|---|---|---|---|")
for c in t:
    print(f"| {c} | {statistics.median(t[c].values()):.3f} | {ratio('unix', c)} | {ratio('unix-mmap', c)} |")
EOF
