#!/usr/bin/env bash
# The stock sqlite3 shell in a fresh process, 100,000 one-row selects by
# primary key over the ~456 MB database cold-scan.sh reads (db.sh makes
# it once), its pages in the kernel's page cache: the unix VFS against
# kxarray, side by side, interleaved.
#
#   bash kxarray-sqlite/scripts/shell-selects.sh
#   ROUNDS=7 QUERIES=100000 bash kxarray-sqlite/scripts/shell-selects.sh
#
# Configurations (each a fresh `sqlite3` process reading the same SQL file):
#   unix         the default unix VFS
#   kx           kxarray with the default settings: a member of the shared
#                cache (capacity from the machine)
#   kx-private   kxarray with the process's own cache (kx_shared=0)
#   kx-direct0   kxarray with kx_direct=0 spelled out
#   kx-1g        kxarray with kx_cache=1g
#   kx-before    kxarray's default settings with another build of the
#                extension (KX_BEFORE=/path/to/libkxarray_sqlite, no suffix)
# BESIDE=1 (the default): a member process beside, started first, reads the
# whole table into the shared cache and keeps the database open while the
# rounds run (a long-lived worker beside which scripts and shells start);
# BESIDE=0: none (the region still holds what earlier shells read).
# The kernel's cache is warmed (the file read with cat) before every unix
# run (a member's fills drop the kernel's copy of what the region holds);
# the order of the configurations rotates per round. Prints each run's
# wall and CPU time (user + system), then per configuration the medians and
# the medians of the per-round ratios unix/config (above 1.0: kxarray
# faster), with the range.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
ROWS=${ROWS:-1000000}
QUERIES=${QUERIES:-100000}
DIR=${DIR:-target/sqlite-bench}
CONFIGS=${CONFIGS:-"unix kx kx-private"}
BESIDE=${BESIDE:-1}
mkdir -p "$DIR"
DB=$DIR/cold-$ROWS.db   # the database cold-scan.sh reads too
SQL=$DIR/selects.sql
EXT=target/release/libkxarray_sqlite

command -v sqlite3 >/dev/null || { echo "sqlite3 not installed (apt-get install -y sqlite3)" >&2; exit 1; }
echo "building the extension (release)..." >&2
cargo build --release -p kxarray-sqlite --lib >/dev/null 2>&1
# shellcheck source=db.sh
. kxarray-sqlite/scripts/db.sh
make_db "$DB" "$ROWS"
python3 - "$SQL" "$QUERIES" "$ROWS" <<'EOF'
import random, sys
path, n, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(30)
with open(path, "w") as f:
    for _ in range(n):
        f.write(f"SELECT length(v) FROM t WHERE id={r.randint(1, rows)};\n")
EOF
echo "database: $(du -m "$DB" | cut -f1) MB; $QUERIES selects; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

run() { # config -> seconds
  local c=$1 uri
  case "$c" in
    unix) uri="file:$DB" ;;
    kx) uri="file:$DB?vfs=kxarray" ;;
    kx-private) uri="file:$DB?vfs=kxarray&kx_shared=0" ;;
    kx-direct0) uri="file:$DB?vfs=kxarray&kx_direct=0" ;;
    kx-1g) uri="file:$DB?vfs=kxarray&kx_cache=1g" ;;
    kx-before) uri="file:$DB?vfs=kxarray" ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
  # wall seconds and CPU seconds (user + system, every thread)
  local tf=$DIR/time.txt
  if [ "$c" = unix ]; then
    cat "$DB" > /dev/null
    /usr/bin/time -o "$tf" -f '%e %U %S' sqlite3 -cmd ".open '$uri'" < "$SQL" > /dev/null
  else
    local ext=$EXT
    [ "$c" = kx-before ] && ext=${KX_BEFORE:?set KX_BEFORE to the other build of the extension}
    /usr/bin/time -o "$tf" -f '%e %U %S' sqlite3 -cmd ".load $ext" -cmd ".open '$uri'" < "$SQL" > /dev/null
  fi
  awk '{printf "%s\t%.2f\n", $1, $2 + $3}' "$tf"
}

BESIDE_PID=
if [ "$BESIDE" = 1 ]; then
  # its input stays open (a fifo held by this script) until the script ends
  FIFO=$DIR/beside.fifo
  rm -f "$FIFO"; mkfifo "$FIFO"
  sqlite3 -cmd ".load $EXT" -cmd ".open 'file:$DB?vfs=kxarray'" < "$FIFO" > "$DIR/beside.out" 2>&1 &
  BESIDE_PID=$!
  exec 9> "$FIFO"
  printf 'SELECT sum(length(v)) FROM t;\n.print beside-ready\n' >&9
  trap 'exec 9>&-; wait "$BESIDE_PID" 2>/dev/null; rm -f "$FIFO"' EXIT
  for _ in $(seq 1 600); do grep -q beside-ready "$DIR/beside.out" 2>/dev/null && break; sleep 0.1; done
  echo "a member beside holds the database (pid $BESIDE_PID)" >&2
fi

OUT=$DIR/shell-selects.tsv
: > "$OUT"
read -r -a cfgs <<< "$CONFIGS"
n=${#cfgs[@]}
for ((r = 0; r < ROUNDS; r++)); do
  cat "$DB" > /dev/null
  for ((i = 0; i < n; i++)); do
    c=${cfgs[$(((i + r) % n))]}
    s=$(run "$c")
    printf '%s\t%s\t%s\n' "$r" "$c" "$s" >> "$OUT"
    printf 'round %s %-11s %s s (wall, cpu)\n' "$r" "$c" "$s" >&2
  done
done

python3 - "$OUT" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
wall, cpu = {}, {}
for r, c, w, u in rows:
    wall.setdefault(c, {})[r] = float(w)
    cpu.setdefault(c, {})[r] = float(u)
def ratio(t, c):
    rs = [t["unix"][r] / s for r, s in t[c].items() if r in t.get("unix", {}) and s > 0]
    return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"
print("| config | median wall s | unix / config, wall (median, range) | median CPU s | unix / config, CPU |")
print("|---|---|---|---|---|")
for c in wall:
    print(f"| {c} | {statistics.median(wall[c].values()):.3f} | {ratio(wall, c)} | "
          f"{statistics.median(cpu[c].values()):.2f} | {ratio(cpu, c)} |")
EOF
