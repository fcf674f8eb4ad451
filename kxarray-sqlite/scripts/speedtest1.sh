#!/usr/bin/env bash
# SQLite's own benchmark, speedtest1, on the unix VFS and on kxarray
# (LD_PRELOAD), interleaved over rounds; prints a markdown table with each
# test's median time and the kxarray/unix ratio.
#
#   bash kxarray-sqlite/scripts/speedtest1.sh            # --size 100, 3 rounds
#   SIZE=50 ROUNDS=5 bash kxarray-sqlite/scripts/speedtest1.sh
#
# speedtest1.c (public domain) is not in the repository: it comes at run
# time from Debian's sqlite3 source package (a deb-src entry for bookworm
# main is added if missing), and is built unmodified against the system
# SQLite (libsqlite3-dev), the library Debian's shell uses.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SIZE=${SIZE:-100}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-$ROOT/target/speedtest1}
mkdir -p "$WORK"

if [ ! -x "$WORK/speedtest1" ]; then
  if ! ls "$WORK"/sqlite3-*/test/speedtest1.c >/dev/null 2>&1; then
    if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
      printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        > /etc/apt/sources.list.d/kxarray-deb-src.sources
    fi
    apt-get update -qq
    command -v dpkg-source >/dev/null || apt-get install -y -qq dpkg-dev >/dev/null
    (cd "$WORK" && apt-get source -qq sqlite3 >/dev/null 2>&1)
  fi
  [ -f /usr/include/sqlite3.h ] || apt-get install -y -qq libsqlite3-dev >/dev/null
  SRC=$(ls -d "$WORK"/sqlite3-*/ | head -1)
  cc -O2 -o "$WORK/speedtest1" "$SRC/test/speedtest1.c" -lsqlite3 -lm
fi

cargo build --release -p kxarray-sqlite >/dev/null 2>&1
LIB=$ROOT/target/release/libkxarray_sqlite.so

run() { # vfs -> one speedtest1 output
  local vfs=$1 db=$WORK/st1-$1.db
  rm -f "$db" "$db-journal" "$db-wal"
  if [ "$vfs" = kxarray ]; then
    LD_PRELOAD=$LIB "$WORK/speedtest1" --size "$SIZE" --vfs kxarray "$db"
  else
    "$WORK/speedtest1" --size "$SIZE" "$db"
  fi
  rm -f "$db" "$db-journal" "$db-wal"
}

for r in $(seq 1 "$ROUNDS"); do
  for vfs in unix kxarray; do
    # alternate which goes first
    [ $((r % 2)) -eq 0 ] && vfs=$([ "$vfs" = unix ] && echo kxarray || echo unix)
    run "$vfs" > "$WORK/out-$vfs-$r.txt" 2>&1
  done
done

python3 - "$WORK" "$ROUNDS" "$SIZE" <<'PY'
import re, statistics, sys
work, rounds, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def parse(p):
    t = {}
    for line in open(p):
        m = re.match(r'\s*(\d+) - (.*?)\.*\s+([\d.]+)s', line)
        if m: t[m.group(1) + ' ' + m.group(2).strip()] = float(m.group(3))
        m = re.match(r'\s*TOTAL\.*\s+([\d.]+)s', line)
        if m: t['TOTAL'] = float(m.group(1))
    return t
runs = {v: [parse(f'{work}/out-{v}-{r}.txt') for r in range(1, rounds + 1)] for v in ('unix', 'kxarray')}
print(f'speedtest1 --size {size}, median of {rounds} interleaved rounds (seconds)\n')
print('| test | unix | kxarray | kxarray/unix |')
print('|---|---|---|---|')
for k in runs['unix'][0]:
    u = statistics.median(r.get(k, float('nan')) for r in runs['unix'])
    x = statistics.median(r.get(k, float('nan')) for r in runs['kxarray'])
    ratio = x / u if u else float('nan')
    name = f'**{k}**' if k == 'TOTAL' else k
    print(f'| {name} | {u:.3f} | {x:.3f} | {ratio:.2f} |')
PY
