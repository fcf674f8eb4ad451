#!/usr/bin/env bash
# The shared memory budget, side by side, interleaved:
#
# 1. Five stock sqlite3 shells in one memory cgroup limited to LIMIT_MB
#    (default 1024), each scanning its own DB_MB database (default 820)
#    three times: kxarray with default settings (the budget on), kxarray
#    with kx_budget=0 (each cache sized alone, as before the budget), and
#    the unix VFS. Prints each run's wall time, the five's CPU time (user
#    + system), the processes killed (exit 137, and the cgroup's oom_kill
#    count); then each configuration's median wall time and OOM kills.
# 2. One shell alone, no cgroup limit, scanning one database three times
#    in a fresh process: kxarray (budget on) against kx_budget=0 (today's
#    fixed sizing) and unix: the first pass must not lose to a small start.
# 3. Eight stock sqlite3 shells sharing ONE DB_MB database in WAL mode in
#    the same cgroup, each scanning it three
#    times with a one-row commit after each scan (`.timeout 60000`: the
#    writers take turns), the same three configurations. Prints each
#    run's wall time, the eight's CPU time (user + system), the processes
#    that failed / the cgroup's OOM kills, and those whose three scans
#    and own three rows were right; then each configuration's median wall
#    time and its kills over all rounds.
#
#   sudo bash kxarray-sqlite/scripts/budget-bench.sh
#   ROUNDS=5 LIMIT_MB=512 DB_MB=300 bash kxarray-sqlite/scripts/budget-bench.sh
#   PARTS=3 ROUNDS=5 bash kxarray-sqlite/scripts/budget-bench.sh   # the eight only
#   KX_BEFORE=/path/to/other/libkxarray_sqlite.so CONFIGS="kx kx-before unix" ...
#       # a fourth configuration: another build of the extension (say,
#       # main's) with default settings, side by side with this one
#
# Parts 1 and 3 also print the page faults the cgroup counted during each
# run (memory.stat's pgfault, minor and major, of all its processes).
#
# Needs root and the cgroup v1 memory controller (/sys/fs/cgroup/memory)
# or cgroup v2 with memory delegated at the root; parts 1 and 3 are
# skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
LIMIT_MB=${LIMIT_MB:-1024}
DB_MB=${DB_MB:-820}
CONFIGS=${CONFIGS:-"kx kx-nobudget unix"}
PARTS=${PARTS:-"1 2 3"}         # which parts to run
WRITES=${WRITES:-1}             # part 3: WRITES=0 scans only (no commits, no lock waits)
DIR=${DIR:-target/budget-bench}
EXT=$PWD/target/release/libkxarray_sqlite
mkdir -p "$DIR"
command -v sqlite3 >/dev/null || { echo "sqlite3 not installed (apt-get install -y sqlite3)" >&2; exit 1; }
echo "building the extension (release)..." >&2
cargo build --release -p kxarray-sqlite --lib >/dev/null 2>&1

ROWS=$((DB_MB * 1000))
DB0=$DIR/db-$DB_MB-0.db
if [ ! -s "$DB0" ]; then
  echo "making a $DB_MB MB database..." >&2
  sqlite3 "$DB0" > /dev/null <<EOF
PRAGMA page_size=4096; PRAGMA journal_mode=off; PRAGMA synchronous=off;
CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<$ROWS)
INSERT INTO t SELECT x, randomblob(1000) FROM c;
EOF
fi
for i in 1 2 3 4; do [ -s "$DIR/db-$DB_MB-$i.db" ] || cp "$DB0" "$DIR/db-$DB_MB-$i.db"; done
EXPECT="$ROWS|$((ROWS * 1000))|$((ROWS * (ROWS + 1) / 2))"

open_db() { # config db -> the shell's lines that open db
  local c=$1 db=$2
  case "$c" in
    unix) echo ".open '$db'" ;;
    kx) printf ".load %s\n.open 'file:%s?vfs=kxarray'\n" "$EXT" "$db" ;;
    kx-before) printf ".load %s\n.open 'file:%s?vfs=kxarray'\n" "${KX_BEFORE:?set KX_BEFORE to the other extension}" "$db" ;;
    kx-nobudget) printf ".load %s\n.open 'file:%s?vfs=kxarray&kx_budget=0'\n" "$EXT" "$db" ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
}

script() { # config db -> the shell's input
  open_db "$1" "$2"
  for _ in 1 2 3; do echo "SELECT count(*), sum(length(b)), sum(a) FROM t;"; done
}

shared_script() { # config db process -> the input of one of the eight
  local r
  open_db "$1" "$2"
  echo ".timeout 60000"
  for r in 1 2 3; do
    echo "SELECT count(*), sum(length(b)), sum(a) FROM t;"
    [ "$WRITES" = 0 ] || echo "INSERT INTO w VALUES($3, $r);"
  done
  if [ "$WRITES" = 0 ]; then echo "SELECT 'own', 3;"; else echo "SELECT 'own', count(*) FROM w WHERE p = $3;"; fi
}

summary() { # results file (config wall killed per line) -> median wall and kills per config
  for c in $CONFIGS; do
    awk -v c="$c" '$1 == c {print $2}' "$1" | sort -n | awk -v c="$c" -v k="$(awk -v c="$c" '$1 == c {k += $3} END {print k + 0}' "$1")" \
      '{w[NR] = $1} END {if (NR) printf "%-12s median %6.2f s over %d runs, %s OOM kills in all\n", c, (NR % 2 ? w[(NR + 1) / 2] : (w[NR / 2] + w[NR / 2 + 1]) / 2), NR, k}'
  done
}

rotate() { local r=$1; shift; local a=("$@") n=$#; for ((i = 0; i < n; i++)); do printf '%s ' "${a[$(((i + r) % n))]}"; done; }

# --- 1. five processes in a memory cgroup ---
CG=""
own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  parent=/sys/fs/cgroup/memory$own; [ -d "$parent" ] || parent=/sys/fs/cgroup/memory
  CG=$parent/kxarray-budget-bench-$$
  mkdir "$CG" && echo $((LIMIT_MB << 20)) > "$CG/memory.limit_in_bytes" && KILLS_FILE=memory.oom_control || CG=""
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  CG=/sys/fs/cgroup/kxarray-budget-bench-$$
  mkdir "$CG" && echo $((LIMIT_MB << 20)) > "$CG/memory.max" && KILLS_FILE=memory.events || CG=""
fi
cleanup() { [ -n "$CG" ] && rmdir "$CG" 2>/dev/null || true; }
trap cleanup EXIT

oom_kills() { awk '$1 == "oom_kill" {print $2}' "$CG/$KILLS_FILE"; }
# Page faults the cgroup's processes took so far (v1 and v2: memory.stat's pgfault).
cg_faults() { awk '$1 == "pgfault" {print $2}' "$CG/memory.stat"; }
# CPU seconds (user + system) of this script's waited-for children so far.
TICK=$(getconf CLK_TCK)
children_cpu() { awk -v t="$TICK" '{printf "%.2f", ($16 + $17) / t}' /proc/$$/stat; }

if [[ " $PARTS " != *" 1 "* ]]; then
  :
elif [ -z "$CG" ]; then
  echo "part 1 skipped: no memory cgroup could be made" >&2
else
  echo "# five processes, $DB_MB MB each, 3 scans, in a $LIMIT_MB MiB cgroup ($CG); $(date -u +%FT%TZ); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  RESULTS=$DIR/results-1.txt; : > "$RESULTS"
  printf '%-12s %5s %8s %7s %9s %6s %s\n' config round wall_s cpu_s faults killed answers
  for ((r = 0; r < ROUNDS; r++)); do
    for c in $(rotate "$r" $CONFIGS); do
      for i in 0 1 2 3 4; do script "$c" "$DIR/db-$DB_MB-$i.db" > "$DIR/in-$i.sql"; done
      # The databases in the kernel's page cache, charged outside the
      # cgroup (a page reclaimed meanwhile would be read again inside it,
      # under its limit).
      for i in 0 1 2 3 4; do cat "$DIR/db-$DB_MB-$i.db" > /dev/null; done
      before=$(oom_kills)
      faults0=$(cg_faults)
      cpu0=$(children_cpu)
      start=$(date +%s.%N)
      pids=()
      for i in 0 1 2 3 4; do
        sh -c 'echo $$ > "$1/cgroup.procs" && exec sqlite3 < "$2" > "$3" 2>&1' sh "$CG" "$DIR/in-$i.sql" "$DIR/out-$i.txt" &
        pids+=($!)
      done
      killed=0
      for p in "${pids[@]}"; do wait "$p" 2>/dev/null || killed=$((killed + 1)); done
      end=$(date +%s.%N)
      right=0
      for i in 0 1 2 3 4; do [ "$(grep -c "^$EXPECT\$" "$DIR/out-$i.txt" || true)" = 3 ] && right=$((right + 1)); done
      wall=$(echo "$end - $start" | bc)
      oom=$(( $(oom_kills) - before ))
      cpu=$(echo "$(children_cpu) - $cpu0" | bc)
      faults=$(( $(cg_faults) - faults0 ))
      printf '%-12s %5d %8.2f %7.2f %9d %6s %s\n' "$c" "$r" "$wall" "$cpu" "$faults" "$killed/$oom" "$right/5 right"
      echo "$c $wall $oom" >> "$RESULTS"
    done
  done
  summary "$RESULTS"
fi

# --- 2. one process alone, no limit ---
if [[ " $PARTS " == *" 2 "* ]]; then
echo "# one process, $DB_MB MB, 3 scans, no cgroup limit (fresh process, the database in the kernel's page cache); $(date -u +%FT%TZ)"
cat "$DB0" > /dev/null
printf '%-12s %5s %8s %s\n' config round wall_s answers
for ((r = 0; r < ROUNDS; r++)); do
  for c in $(rotate "$r" $CONFIGS); do
    script "$c" "$DB0" > "$DIR/in-alone.sql"
    start=$(date +%s.%N)
    sqlite3 < "$DIR/in-alone.sql" > "$DIR/out-alone.txt" 2>&1
    end=$(date +%s.%N)
    printf '%-12s %5d %8.2f %s\n' "$c" "$r" "$(echo "$end - $start" | bc)" "$(grep -c "^$EXPECT\$" "$DIR/out-alone.txt")/3 right"
  done
done
fi

# --- 3. eight processes sharing one database in the cgroup ---
if [[ " $PARTS " != *" 3 "* ]]; then
  :
elif [ -z "$CG" ]; then
  echo "part 3 skipped: no memory cgroup could be made" >&2
else
  SHARED=$DIR/shared-$DB_MB.db
  if [ ! -s "$SHARED" ]; then
    cp "$DB0" "$SHARED"
    sqlite3 "$SHARED" "CREATE TABLE w(p INTEGER, r INTEGER); PRAGMA journal_mode=wal;" > /dev/null
  fi
  cat "$SHARED" > /dev/null
  RESULTS=$DIR/results-3.txt; : > "$RESULTS"
  echo "# eight processes sharing one $DB_MB MB database (WAL), 3 scans and 3 commits each, in a $LIMIT_MB MiB cgroup ($CG); $(date -u +%FT%TZ); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  printf '%-12s %5s %8s %7s %9s %6s %s\n' config round wall_s cpu_s faults failed/oom answers
  for ((r = 0; r < ROUNDS; r++)); do
    for c in $(rotate "$r" $CONFIGS); do
      sqlite3 "$SHARED" "DELETE FROM w;" > /dev/null
      for i in 0 1 2 3 4 5 6 7; do shared_script "$c" "$SHARED" "$i" > "$DIR/in-shared-$i.sql"; done
      before=$(oom_kills)
      faults0=$(cg_faults)
      cpu0=$(children_cpu)
      start=$(date +%s.%N)
      pids=()
      for i in 0 1 2 3 4 5 6 7; do
        sh -c 'echo $$ > "$1/cgroup.procs" && exec sqlite3 < "$2" > "$3" 2>&1' sh "$CG" "$DIR/in-shared-$i.sql" "$DIR/out-shared-$i.txt" &
        pids+=($!)
      done
      killed=0
      for p in "${pids[@]}"; do wait "$p" 2>/dev/null || killed=$((killed + 1)); done
      end=$(date +%s.%N)
      right=0
      for i in 0 1 2 3 4 5 6 7; do
        [ "$(grep -c "^$EXPECT\$" "$DIR/out-shared-$i.txt" || true)" = 3 ] && grep -qx 'own|3' "$DIR/out-shared-$i.txt" && right=$((right + 1))
      done
      wall=$(echo "$end - $start" | bc)
      oom=$(( $(oom_kills) - before ))
      cpu=$(echo "$(children_cpu) - $cpu0" | bc)
      faults=$(( $(cg_faults) - faults0 ))
      printf '%-12s %5d %8.2f %7.2f %9d %6s %s\n' "$c" "$r" "$wall" "$cpu" "$faults" "$killed/$oom" "$right/8 right"
      echo "$c $wall $oom" >> "$RESULTS"
    done
  done
  summary "$RESULTS"
fi
