#!/usr/bin/env bash
# One process scanning a file four times its cache, sequential 4 KiB
# reads, buffered and O_DIRECT below the cache, against the kernel's
# buffered read of the same file and fio's O_DIRECT reads (docs/memory.md,
# "Reads that pass the cache by"). Rows run in an order rotated per round:
#
#   kx                 the fio example, --engine kxarray: CachedFile::read_at
#                      on a cache of CACHE over a buffered FileBackend (the
#                      file in the kernel's page cache: cat before each round)
#   kx@before          the same with BEFORE_BIN (another build of the example)
#   psync              the fio example's own pread(2) engine (the kernel's
#                      buffered read, the same loop and file)
#   fio-psync          fio --ioengine=psync --bs=4k, buffered, --invalidate=0
#   kx-direct          --direct: an O_DIRECT FileBackend below the cache
#   kx-direct@before   the same with BEFORE_BIN
#   fio-direct         fio --direct=1 --ioengine=psync --bs=4k
#   fio-direct-uring   fio --direct=1 --ioengine=io_uring --bs=128k --iodepth=8
#
# Prints each run's MB/s and a summary: the median and range of each row,
# and of the per-round ratios that the targets name (kx / psync,
# kx / fio-psync, kx-direct / fio-direct, kx-direct / fio-direct-uring,
# and each kx row over its @before row).
#
#   cargo build --release --example fio
#   ROUNDS=5 SECS=3 scripts/scan-bench.sh
#   BEFORE_BIN=/path/to/other/fio ROUNDS=5 scripts/scan-bench.sh
#   ROWS="kx psync fio-psync" scripts/scan-bench.sh    # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-3}
SIZE=${SIZE:-1g}
CACHE=${CACHE:-256m}
FILE=${FILE:-/var/tmp/kx-scan-bench.img}
BIN=${BIN:-target/release/examples/fio}
DEFAULT_ROWS="kx psync fio-psync kx-direct fio-direct fio-direct-uring"
[ -n "${BEFORE_BIN:-}" ] && DEFAULT_ROWS="kx kx@before psync fio-psync kx-direct kx-direct@before fio-direct fio-direct-uring"
ROWS=${ROWS:-$DEFAULT_ROWS}
RAW=${RAW:-target/scan-bench.txt}
command -v fio >/dev/null || { echo "fio not installed (apt-get install -y fio)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "$BIN missing: cargo build --release --example fio" >&2; exit 1; }
bytes=$(numfmt --from=iec "${SIZE^^}")
if [ ! -s "$FILE" ] || [ "$(stat -c %s "$FILE")" -lt "$bytes" ]; then
  echo "laying out $FILE ($SIZE)..." >&2
  "$BIN" --engine psync --rw read --bs 1m --size "$SIZE" --numjobs 1 --ios 1 --filename "$FILE" --quiet >/dev/null
fi
mkdir -p "$(dirname "$RAW")"
: >"$RAW"

kx() { # bin [args...] -> MB/s
  local bin=$1
  shift
  "$bin" --engine kxarray --rw read --bs 4k --size "$SIZE" --cache-size "$CACHE" --numjobs 1 \
    --runtime "$SECS" --no-verify --reuse-file --filename "$FILE" --quiet "$@" |
    awk '/^result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^read_iops=/) {split($i, a, "="); printf "%.1f\n", a[2] * 4096 / 1e6}}'
}
fio_mbs() { # fio args... -> MB/s
  fio --name=scan --filename="$FILE" --size="$bytes" --rw=read --runtime="$SECS" --time_based \
    --readonly --thread --output-format=json "$@" |
    python3 -c 'import json, sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e6))'
}
row() {
  case "$1" in
    kx) kx "$BIN" ;;
    kx@before) kx "$BEFORE_BIN" ;;
    psync)
      "$BIN" --engine psync --rw read --bs 4k --size "$SIZE" --numjobs 1 --runtime "$SECS" \
        --no-verify --reuse-file --filename "$FILE" --quiet |
        awk '/^result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^read_iops=/) {split($i, a, "="); printf "%.1f\n", a[2] * 4096 / 1e6}}' ;;
    fio-psync) fio_mbs --bs=4k --ioengine=psync --invalidate=0 ;;
    kx-direct) kx "$BIN" --direct ;;
    kx-direct@before) kx "$BEFORE_BIN" --direct ;;
    fio-direct) fio_mbs --bs=4k --ioengine=psync --direct=1 ;;
    fio-direct-uring) fio_mbs --bs=128k --ioengine=io_uring --iodepth=8 --direct=1 ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

echo "# $SIZE file, $CACHE cache, 4 KiB sequential reads, $SECS s per run, $ROUNDS rounds; $(date -u +%FT%TZ); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
rows=($ROWS)
k=${#rows[@]}
for r in $(seq 1 "$ROUNDS"); do
  cat "$FILE" >/dev/null # the kernel's cache holds the file (the buffered rows)
  for ((i = 0; i < k; i++)); do
    c=${rows[$(((i + r) % k))]}
    v=$(row "$c")
    echo "$r $c $v" >>"$RAW"
    echo "round $r $c: $v MB/s" >&2
  done
done
echo "# end: load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$RAW" <<'PY'
import statistics as st, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    r, c, v = line.split()
    runs[r][c] = float(v)
rows = list(dict.fromkeys(c for v in runs.values() for c in v))
def span(xs, unit=""):
    return f"{st.median(xs):.2f}{unit} ({min(xs):.2f}-{max(xs):.2f})"
print("| row | MB/s: median (range) |")
print("|---|---|")
for c in rows:
    print(f"| {c} | {span([v[c] for v in runs.values() if c in v])} |")
print()
print("| ratio | per round: median (range) |")
print("|---|---|")
for a, b in [("kx", "psync"), ("kx", "fio-psync"), ("kx", "kx@before"),
             ("kx-direct", "fio-direct"), ("kx-direct", "fio-direct-uring"),
             ("kx-direct", "kx-direct@before")]:
    rs = [v[a] / v[b] for v in runs.values() if a in v and b in v and v[b] > 0]
    if rs:
        print(f"| {a} / {b} | {span(rs, 'x')} |")
PY
