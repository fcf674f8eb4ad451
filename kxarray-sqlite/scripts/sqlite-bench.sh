#!/usr/bin/env bash
# SQLite on kxarray against the unix VFS, side by side, interleaved.
#
#   bash kxarray-sqlite/scripts/sqlite-bench.sh              # everything
#   ROUNDS=5 SECONDS_PER_RUN=3 bash kxarray-sqlite/scripts/sqlite-bench.sh
#   BIG=0 CRASH_KILLS=0 SPEEDTEST=0 bash kxarray-sqlite/scripts/sqlite-bench.sh
#
# 1. Read and write workloads (examples/sqlite_bench.rs), each run in its
#    own process, over ten configurations: unix (kernel page cache warm),
#    unix-mmap, unix-excl and unix-mmap-excl (locking_mode=EXCLUSIVE: the
#    fair anchor for one process, which kxarray's in-process locks match;
#    one-connection rows only), kx (kxarray on the shared cache, the default),
#    kx-private (kxarray with the process's own cache, kx_shared=0), kx-direct
#    (O_DIRECT below kxarray), kx-fetch (zero-copy xFetch), floor (SQLite's
#    own cache holding the database). The order of the configurations
#    rotates every round; the first table shows medians and ratios against
#    unix, the second kxarray's ratios against the exclusive anchors.
# 2. fincore: after a kx-direct run that started with the file dropped from
#    the kernel's page cache, how much of the database the kernel caches.
# 3. The crash test, CRASH_KILLS kills per mode (default 200).
# 4. speedtest1 (scripts/speedtest1.sh) when SPEEDTEST=1 (default).
# 5. redb on kxarray against redb's file backend, redb's cache 4 MiB
#    (examples/redb_kxarray.rs), when REDB=1 (default).
# 6. Multi-process rows, when MP=1 (default): WAL mode, one
#    writer process (single-row commits) and 3 reader processes (point
#    selects), all on the unix VFS or all on kxarray, interleaved over
#    ROUNDS, each kxarray process with a cache of MP_SMALL_CACHE (smaller
#    than the 180 MB database) and of MP_BIG_CACHE (larger); aggregate
#    commits/s and reads/s with ratios against unix. Then the coherence
#    cost: a kxarray reader's dropped pages, misses and pages read after a
#    unix-VFS process commits a one-row update (WAL: with and without a
#    checkpoint of it; DELETE).
#    Only these rows: BIG=0 CRASH_KILLS=0 SPEEDTEST=0 REDB=0 READS= WRITES= bash ...
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_RUN:-2}
ROWS=${ROWS:-400000}            # about 180 MB
BIG=${BIG:-1}                   # also a 1 GiB database (point and scan rows)
BIG_ROWS=${BIG_ROWS:-2400000}   # about 1.1 GB
CRASH_KILLS=${CRASH_KILLS:-200}
SPEEDTEST=${SPEEDTEST:-1}
REDB=${REDB:-1}
MP=${MP:-1}
MP_SMALL_CACHE=${MP_SMALL_CACHE:-64m}
MP_BIG_CACHE=${MP_BIG_CACHE:-512m}
CONFIGS=${CONFIGS:-"unix unix-mmap unix-excl unix-mmap-excl kx kx-private kx-direct kx-fetch kx-excl floor"}
READS=${READS-"point-uniform point-zipf range scan mix"}
WRITES=${WRITES-"commit-full commit-wal bulk"}
DIR=${DIR:-target/sqlite-bench}
mkdir -p "$DIR"
OUT=$DIR/results.tsv
: > "$OUT"

echo "building (release)..." >&2
cargo build --release -p kxarray-sqlite --lib --example sqlite_bench --example sqlite_crash --example redb_kxarray >/dev/null 2>&1
B=target/release/examples/sqlite_bench

rotate() { # round, list... -> the list rotated by round
  local r=$1; shift; local a=("$@") n=$#
  for ((i = 0; i < n; i++)); do printf '%s ' "${a[$(((i + r) % n))]}"; done
}

run() { # label db config workload threads [extra]
  local label=$1 db=$2 c=$3 w=$4 t=$5; shift 5
  local line
  # exclusive locking mode: the first connection keeps the database locked
  case "$c" in *-excl) [ "$t" = 1 ] || return 0 ;; esac
  if line=$(timeout 300 "$B" run --db "$db" --config "$c" --workload "$w" --threads "$t" --seconds "$SECS" "$@" 2>/dev/null); then
    printf '%s\t%s\n' "$label" "$line" >> "$OUT"
  else
    printf '%s\t%s\t%s\t%s\tFAILED\n' "$label" "$c" "$w" "$t" >> "$OUT"
    echo "FAILED (or timed out): $label $c $w $t" >&2
  fi
}

DB=$DIR/read.db
"$B" prepare --db "$DB" --rows "$ROWS"
if [ "$BIG" = 1 ]; then "$B" prepare --db "$DIR/big.db" --rows "$BIG_ROWS"; fi

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  for w in $READS; do
    for t in 1 2; do
      for c in $(rotate "$r" $CONFIGS); do run 180MB "$DB" "$c" "$w" "$t"; done
    done
  done
  if [ "$BIG" = 1 ]; then
    for w in point-uniform scan; do
      for c in $(rotate "$r" $CONFIGS); do run 1GiB "$DIR/big.db" "$c" "$w" 1; done
    done
  fi
  for w in $WRITES; do
    for c in $(rotate "$r" unix unix-excl kx kx-excl kx-direct); do run write "$DIR/w.db" "$c" "$w" 1; done
  done
done

python3 - "$OUT" "$ROUNDS" "$SECS" <<'PY'
import collections, statistics, sys, datetime, platform, os
path, rounds, secs = sys.argv[1], sys.argv[2], sys.argv[3]
runs = collections.defaultdict(list)
failed = collections.Counter()
configs = []
for line in open(path):
    f = line.rstrip('\n').split('\t')
    label, c, w, t = f[0], f[1], f[2], f[3]
    if c not in configs: configs.append(c)
    if f[4] == 'FAILED':
        failed[(label, w, t, c)] += 1
        continue
    runs[(label, w, t, c)].append(float(f[6]))
def fmt(v):
    return f'{v:,.0f}' if v >= 100 else f'{v:.1f}' if v >= 10 else f'{v:.2f}'
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f'SQLite on kxarray, {datetime.date.today()}, {os.cpu_count()} cores ({cpu}), '
      f'median of {rounds} interleaved rounds, {secs} s per read run; operations per second '
      f'(ratio against unix)\n')
rows = sorted({k[:3] for k in list(runs) + list(failed)}, key=lambda k: (k[0] != '180MB', k[0], k[1], k[2]))
cols = [c for c in ['unix', 'unix-mmap', 'unix-excl', 'unix-mmap-excl', 'kx', 'kx-direct', 'kx-fetch', 'kx-excl', 'floor'] if c in configs]
print('| database | workload | conns | ' + ' | '.join(cols) + ' |')
print('|---|---|---|' + '---|' * len(cols))
for label, w, t in rows:
    base = runs.get((label, w, t, 'unix'))
    b = statistics.median(base) if base else None
    cells = []
    for c in cols:
        v = runs.get((label, w, t, c))
        if failed[(label, w, t, c)]:
            cells.append(f'FAILED x{failed[(label, w, t, c)]}' + (f' / {statistics.median(v):,.0f}' if v else ''))
        elif not v:
            cells.append('')
        else:
            m = statistics.median(v)
            cells.append(fmt(m) + (f' ({m / b:.2f})' if b and c != 'unix' else ''))
    print(f'| {label} | {w} | {t} | ' + ' | '.join(cells) + ' |')
pairs = [(k, a) for k, a in [('kx', 'unix-excl'), ('kx-excl', 'unix-excl'), ('kx-direct', 'unix-excl'),
                             ('kx-fetch', 'unix-mmap-excl'), ('kx', 'unix-mmap-excl')]
         if k in configs and a in configs]
if pairs:
    print('\nkxarray against the exclusive-lock anchors (one connection; ratio of medians):\n')
    print('| database | workload | ' + ' | '.join(f'{k} / {a}' for k, a in pairs) + ' |')
    print('|---|---|' + '---|' * len(pairs))
    for label, w, t in rows:
        if t != '1':
            continue
        cells = []
        for k, a in pairs:
            x, y = runs.get((label, w, t, k)), runs.get((label, w, t, a))
            cells.append(f'{statistics.median(x) / statistics.median(y):.2f}' if x and y else '')
        print(f'| {label} | {w} | ' + ' | '.join(cells) + ' |')
PY

# One copy of each page: after a kx-direct run over a file dropped from the
# kernel's page cache, fincore shows what the kernel holds of it.
if command -v fincore >/dev/null; then
  line=$("$B" run --db "$DB" --config kx-direct --workload scan --seconds 1 --drop-kernel-cache)
  echo
  echo "kx-direct, full scans after dropping the file from the kernel's cache: $(echo "$line" | cut -f6) scans/s"
  echo '```'
  fincore "$DB"
  echo '```'
fi

if [ "$MP" = 1 ]; then
  MPOUT=$DIR/mp.tsv
  : > "$MPOUT"
  for r in $(seq 1 "$ROUNDS"); do
    for cache in "$MP_SMALL_CACHE" "$MP_BIG_CACHE"; do
      for c in $(rotate "$r" unix kx-private kx); do
        # kx-private: each process's own cache of $cache; kx: the shared
        # cache with the same total (4 processes x $cache), one region
        per=$cache
        if [ "$c" = kx ]; then per="$(( ${cache%m} * 4 ))m"; fi
        # the unix VFS's anchor starts with the database in the kernel's
        # page cache (the shared cache's runs drop the kernel's copy of
        # what they hold: see docs/sqlite.md)
        if [ "$c" = unix ]; then cat "$DB" "$DB-wal" > /dev/null 2>&1 || true; fi
        if line=$(timeout 300 "$B" mp --db "$DB" --config "$c" --readers 3 --seconds "$SECS" --kx-cache "$per" 2>/dev/null); then
          printf '%s\t%s\n' "$cache" "$line" >> "$MPOUT"
        else
          echo "FAILED (or timed out): mp $c $cache" >&2
        fi
      done
    done
  done
  echo
  python3 - "$MPOUT" "$ROUNDS" "$SECS" "$(du -m "$DB" | cut -f1)" <<'PY'
import collections, statistics, sys
path, rounds, secs, mb = sys.argv[1:5]
runs = collections.defaultdict(list)
for line in open(path):
    f = line.rstrip('\n').split('\t')
    cache, c = f[0], f[1]
    # commits/s, reads/s, misses, full drops, pages dropped, CPU us per
    # commit (writer), CPU us per read (readers), PSS MB (all processes),
    # the database's MB in the kernel's page cache
    runs[(cache, c)].append(tuple(float(x) for x in f[5:14]))
caches = sorted({k[0] for k in runs}, key=lambda s: (len(s), s))
m = lambda v, i: statistics.median(x[i] for x in v)
print(f'Multi-process, WAL, 1 writer + 3 reader processes on a {mb} MB database, '
      f'median of {rounds} interleaved rounds of {secs} s (ratios against unix); '
      'kx-private: a cache per process; kx: the shared cache, the same total:\n')
print('| cache per process | unix commits/s | unix reads/s | kx-private commits/s | kx-private reads/s | kx commits/s | kx reads/s |')
print('|---|---|---|---|---|---|---|')
for cache in caches:
    u = runs.get((cache, 'unix'))
    if not u:
        continue
    row = f'| {cache} | {m(u, 0):,.0f} | {m(u, 1):,.0f} |'
    for c in ('kx-private', 'kx'):
        k = runs.get((cache, c))
        if not k:
            row += ' | |'
            continue
        row += f' {m(k, 0):,.0f} ({m(k, 0) / m(u, 0):.2f}) | {m(k, 1):,.0f} ({m(k, 1) / m(u, 1):.2f}) |'
    print(row)
print('\nMemory the workload holds on the machine at the end of a run: the PSS of all '
      'four processes plus the database\'s pages in the kernel\'s page cache (mincore), '
      'MB (ratio against unix):\n')
print('| cache per process | unix PSS + kernel | kx-private PSS + kernel | kx PSS + kernel |')
print('|---|---|---|---|')
for cache in caches:
    u = runs.get((cache, 'unix'))
    if not u:
        continue
    tot = lambda v: m(v, 7) + m(v, 8)
    row = f'| {cache} | {m(u, 7):,.0f} + {m(u, 8):,.0f} = {tot(u):,.0f} |'
    for c in ('kx-private', 'kx'):
        k = runs.get((cache, c))
        row += f' {m(k, 7):,.0f} + {m(k, 8):,.0f} = {tot(k):,.0f} ({tot(k) / tot(u):.2f}) |' if k else ' |'
    print(row)
print('\nCPU per operation (user and system, every thread of the process; '
      'ratio unix / kx, above 1: kx cheaper), and the kx readers\' counters per run:\n')
print('| cache per process | config | unix us/commit | kx us/commit | unix us/read | kx us/read | kx misses | kx full drops | kx pages dropped |')
print('|---|---|---|---|---|---|---|---|---|')
for cache in caches:
    u = runs.get((cache, 'unix'))
    for c in ('kx-private', 'kx'):
        k = runs.get((cache, c))
        if not u or not k:
            continue
        print(f'| {cache} | {c} | {m(u, 5):.1f} | {m(k, 5):.1f} ({m(u, 5) / m(k, 5):.2f}) | '
              f'{m(u, 6):.2f} | {m(k, 6):.2f} ({m(u, 6) / m(k, 6):.2f}) | '
              f'{m(k, 2):,.0f} | {m(k, 3):.0f} | {m(k, 4):,.0f} |')
PY
  echo
  echo '| journal | another process commits | rounds | pages cached | pages dropped (median / max) | misses | pages read |'
  echo '|---|---|---|---|---|---|---|'
  "$B" coherence --db "$DIR/coherence.db" --journal wal --rows 20000 --rounds 20
  "$B" coherence --db "$DIR/coherence.db" --journal delete --rows 20000 --rounds 20
fi

if [ "$CRASH_KILLS" -gt 0 ]; then
  echo
  echo "Crash test, $CRASH_KILLS kills per mode:"
  echo
  target/release/examples/sqlite_crash --kills "$CRASH_KILLS" --dir "$DIR/crash" 2> "$DIR/crash.log" || {
    echo "CRASH TEST FAILED (see $DIR/crash.log)"; }
fi

if [ "$SPEEDTEST" = 1 ]; then
  echo
  bash kxarray-sqlite/scripts/speedtest1.sh
fi

if [ "$REDB" = 1 ]; then
  echo
  echo '| redb workload | redb file backend | redb on kxarray | ratio |'
  echo '|---|---|---|---|'
  target/release/examples/redb_kxarray --keys 400000 --seconds "$SECS" --rounds "$ROUNDS" --dir "$DIR"
fi
