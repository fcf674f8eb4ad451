#!/usr/bin/env bash
# The page cache's miss path on the I/O engine against real fio on the same
# file, interleaved (the machine is shared and noisy: compare ratios).
#
#   scripts/readahead-bench.sh            # ROUNDS=3 SECS=3 FILE=/var/tmp/kx-ra-bench.dat SIZE=2g
#
# Rows, in an order rotated every round:
#   kx-seq@RA     examples/readahead_bench --mode seq: cold sequential 4 KiB read_at, one
#                 thread, O_DIRECT FileBackend below a 256 MiB cache (readahead windows of
#                 at most RA; RAS="0 2m 4m" runs one row per maximum, 0 = the default)
#   fio-psync     fio psync 4 KiB sequential, buffered, on a cold kernel cache (its readahead)
#   fio-uring128  fio io_uring 128 KiB sequential, iodepth 8, O_DIRECT
#   kx-rand       examples/readahead_bench --mode rand: random 4 KiB, O_DIRECT, 2 threads
#                 of read_owned futures, 32 in flight each, 256 MiB cache
#   fio-rand32    fio io_uring random 4 KiB, iodepth 32, one job, O_DIRECT
#   kx-rand-base  (with BASE_BIN=<another build's readahead_bench>) the kx-rand row on that
#                 build, for a before/after in the same rounds
# Cold = the file dropped from the kernel's cache (posix_fadvise DONTNEED) before each row.
# Prints each round's figures, then medians and per-round ratios (median [min-max]).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-3}
FILE=${FILE:-/var/tmp/kx-ra-bench.dat}
SIZE=${SIZE:-2g}
EXTRA=${EXTRA:-}
BASE_BIN=${BASE_BIN:-}
# Readahead maxima the kx-seq row runs with (one row each; "0": the backend's default).
RAS=${RAS:-0}
command -v fio >/dev/null || { echo "fio is missing: apt-get install -y fio"; exit 1; }
cargo build --release --example readahead_bench >/dev/null 2>&1 || cargo build --release --example readahead_bench
BIN=target/release/examples/readahead_bench
$BIN --file "$FILE" --size "$SIZE" --make-only
BYTES=$(stat -c %s "$FILE")

drop() { python3 -c "import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$FILE"; }
fiojson() { fio --output-format=json --readonly --filename="$FILE" --size="$BYTES" --runtime="$SECS" "$@" 2>/dev/null; }
bw_mb() { python3 -c "import json,sys;j=json.load(sys.stdin);print(round(j['jobs'][0]['read']['bw_bytes']/1e6,1))"; }
iops() { python3 -c "import json,sys;j=json.load(sys.stdin);print(round(sum(x['read']['iops'] for x in j['jobs'])))"; }

row() {
    drop
    case "$1" in
    kx-seq*) $BIN --mode seq --file "$FILE" --size "$SIZE" --seconds "$SECS" --ra "${1#kx-seq@}" $EXTRA 2>/dev/null | awk '{print $3}' ;;
    fio-psync) fiojson --name=s --rw=read --bs=4k --ioengine=psync --invalidate=1 | bw_mb ;;
    fio-uring128) fiojson --name=s --rw=read --bs=128k --ioengine=io_uring --iodepth=8 --direct=1 | bw_mb ;;
    kx-rand-base) $BASE_BIN --mode rand --file "$FILE" --size "$SIZE" --seconds "$SECS" --threads 2 --qd 32 $EXTRA 2>/dev/null | awk '{print $3}' ;;
    kx-rand) $BIN --mode rand --file "$FILE" --size "$SIZE" --seconds "$SECS" --threads 2 --qd 32 $EXTRA 2>/dev/null | awk '{print $3}' ;;
    fio-rand32) fiojson --name=r --rw=randread --bs=4k --ioengine=io_uring --iodepth=32 --direct=1 --time_based | iops ;;
    esac
}

ROWS=()
for ra in $RAS; do ROWS+=("kx-seq@$ra"); done
ROWS+=(fio-psync fio-uring128 kx-rand fio-rand32)
[ -n "$BASE_BIN" ] && ROWS+=(kx-rand-base)
OUT=$(mktemp)
echo "# $(date -u '+%F %T UTC'); load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; file $FILE ($BYTES bytes)"
for ((r = 0; r < ROUNDS; r++)); do
    n=${#ROWS[@]}
    for ((i = 0; i < n; i++)); do
        name=${ROWS[$(((i + r) % n))]}
        v=$(row "$name")
        echo "round $r $name $v" | tee -a "$OUT"
    done
done
echo "# end $(date -u '+%F %T UTC'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    _, r, name, v = line.split()
    rows.setdefault(name, {})[int(r)] = float(v)
def med(name): return st.median(rows[name].values())
print("| row | median | per round |")
print("|---|---|---|")
seqs = sorted(n for n in rows if n.startswith("kx-seq"))
for n in seqs + ["fio-psync", "fio-uring128", "kx-rand", "fio-rand32"] + [n for n in rows if n == "kx-rand-base"]:
    unit = "IOPS" if "rand" in n else "MB/s"
    print(f"| {n} | {med(n):,.0f} {unit} | {', '.join(f'{rows[n][k]:,.0f}' for k in sorted(rows[n]))} |")
def ratio(a, b, target):
    rs = [rows[a][k] / rows[b][k] for k in rows[a] if k in rows[b] and rows[b][k] > 0]
    print(f"| {a} / {b} | {st.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}] | {target if target.startswith('(') else 'target ' + target} |")
print()
print("| ratio | median [range] | |")
print("|---|---|---|")
for n in seqs:
    ratio(n, "fio-psync", ">= 1.0x")
    ratio(n, "fio-uring128", ">= 0.7x")
ratio("kx-rand", "fio-rand32", ">= 0.9x")
if "kx-rand-base" in rows:
    ratio("kx-rand-base", "fio-rand32", "(the base build)")
    ratio("kx-rand", "kx-rand-base", "(this build / the base)")
EOF
rm -f "$OUT"
