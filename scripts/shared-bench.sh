#!/usr/bin/env bash
# N processes reading one file at random (4 KiB) inside a memory cgroup
# that holds the file once but not N times: kxarray's shared region,
# kxarray's private caches (each its share of the limit), and the kernel's
# page cache through fio's psync and mmap engines (`--numjobs` forks
# processes), interleaved round by round. Prints reads per second, the
# ratios, and the memory the processes hold (PSS) and the cgroup charged.
#
#   bash scripts/shared-bench.sh                   # 2 GiB file, 3 GiB limit, N = 1 2 4 8
#   SIZE=256m LIMIT=512M NS="1 2" SECONDS_PER_RUN=3 ROUNDS=1 bash scripts/shared-bench.sh
#
# Needs root (a cgroup v2 child of /sys/fs/cgroup) and fio; without a
# cgroup it runs unlimited and says so. Cold rows (COLD=1): the file is
# dropped from the kernel's cache (posix_fadvise DONTNEED) and the region
# emptied before every run, and the first pass is timed.
#
# FIRST_PASS=1: instead, a new process's first pass over a file another
# process holds cached: one process reads the whole file and stays, then a
# fresh process opens it and reads every 4 KiB block once in a shuffled
# order, then again (its warm rate); shared region against private caches
# (where the fresh process starts empty and reads from the kernel's cache).
#   FIRST_PASS=1 ROUNDS=5 bash scripts/shared-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-2g}
LIMIT=${LIMIT:-3G}
NS=${NS:-"1 2 4 8"}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
FILE=${FILE:-/var/tmp/kxarray-shared-bench.dat}
command -v fio >/dev/null || { echo "fio is needed (apt-get install -y fio)" >&2; exit 1; }
cargo build --release --example shared_readers >/dev/null 2>&1 || cargo build --release --example shared_readers
BIN=target/release/examples/shared_readers
DIR=$(mktemp -d /dev/shm/kxarray-bench-XXXXXX)
chmod 700 "$DIR"
# cgroup v2 (unified at /sys/fs/cgroup), or v1's memory controller
# under this process's own memory cgroup (a hybrid machine)
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CGV=2; CG=/sys/fs/cgroup/kxarray-shared-bench
else
  CGV=1; CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/kxarray-shared-bench
fi
trap 'rm -rf "$DIR"; [ -d "$CG" ] && rmdir "$CG" 2>/dev/null || true' EXIT

to_bytes() { numfmt --from=iec "$(echo "$1" | tr a-z A-Z)"; }
size_b=$(to_bytes "$SIZE")
limit_b=$(to_bytes "$LIMIT")
if [ ! -f "$FILE" ] || [ "$(stat -c %s "$FILE")" != "$size_b" ]; then
  "$BIN" --file "$FILE" --size "$SIZE" --procs 1 --reads 0 --mode private --capacity 16m >/dev/null
fi

in_cg=0
if mkdir -p "$CG" 2>/dev/null; then
  if [ $CGV = 2 ]; then
    echo "$limit_b" > "$CG/memory.max" 2>/dev/null && in_cg=1
  else
    echo "$limit_b" > "$CG/memory.limit_in_bytes" 2>/dev/null && in_cg=1
  fi
fi
[ $in_cg = 1 ] && echo "# memory cgroup v$CGV $CG, limit $LIMIT" || echo "# no memory cgroup: running without the limit"
run() { # in the cgroup when there is one
  if [ $in_cg = 1 ]; then
    bash -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' _ "$@"
  else
    "$@"
  fi
}
charged() { # the cgroup's peak since the last reset, MiB
  [ $in_cg = 1 ] || { echo -; return; }
  if [ $CGV = 2 ]; then echo $(( $(cat "$CG/memory.peak" 2>/dev/null || cat "$CG/memory.current") >> 20 ));
  else echo $(( $(cat "$CG/memory.max_usage_in_bytes") >> 20 )); fi
}
reset_peak() {
  [ $in_cg = 1 ] || return 0
  if [ $CGV = 2 ]; then echo 0 > "$CG/memory.peak" 2>/dev/null || true;
  else echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null || true; fi
}

fio_iops() { # engine n
  run fio --name=r --filename="$FILE" --rw=randread --bs=4k --ioengine="$1" --numjobs="$2" \
    --invalidate=0 --time_based --runtime="$SECONDS_PER_RUN" --group_reporting --output-format=terse 2>/dev/null |
    awk -F';' '{print $8}'
}

if [ "${FIRST_PASS:-0}" = 1 ]; then
  printf "%-6s %-8s %12s %12s %8s\n" round mode first_pass warm ratio
  for r in $(seq 1 "$ROUNDS"); do
    for mode in shared private; do
      rm -f "$DIR"/cache*
      [ $mode = private ] && run cat "$FILE" > /dev/null
      out=$(run "$BIN" --file "$FILE" --mode "$mode" --capacity $((size_b + (64 << 20))) \
        --first-pass --dir "$DIR")
      printf "%-6s %-8s %12s %12s %8s\n" "$r" "$mode" \
        "$(echo "$out" | sed -E 's/.*first_pass=([0-9]+).*/\1/')" \
        "$(echo "$out" | sed -E 's/.* warm=([0-9]+).*/\1/')" \
        "$(echo "$out" | sed -E 's/.*ratio=([0-9.]+).*/\1/')"
    done
  done
  exit 0
fi
printf "%-8s %3s %12s %12s %12s %12s   %-22s %s\n" round N shared private psync mmap "shared/psync /mmap /priv" "MiB: PSS shared, private; charged shared"
for n in $NS; do
  for r in $(seq 1 "$ROUNDS"); do
    rm -f "$DIR"/cache*
    reset_peak
    sh=$(run "$BIN" --file "$FILE" --procs "$n" --seconds "$SECONDS_PER_RUN" --mode shared \
      --capacity $((size_b + (64 << 20))) --warm --dir "$DIR")
    ch_sh=$(charged)
    rm -f "$DIR"/cache*
    priv_cap=$(( (limit_b - (256 << 20)) / n ))
    pr=$(run "$BIN" --file "$FILE" --procs "$n" --seconds "$SECONDS_PER_RUN" --mode private \
      --capacity "$priv_cap" --warm)
    run cat "$FILE" > /dev/null
    ps=$(fio_iops psync "$n")
    mm=$(fio_iops mmap "$n")
    si=$(echo "$sh" | sed -E 's/.*iops=([0-9]+).*/\1/')
    spss=$(echo "$sh" | sed -E 's/.*pss_mib=([0-9]+).*/\1/')
    pi=$(echo "$pr" | sed -E 's/.*iops=([0-9]+).*/\1/')
    ppss=$(echo "$pr" | sed -E 's/.*pss_mib=([0-9]+).*/\1/')
    ratio=$(awk -v s="$si" -v p="$ps" -v m="$mm" -v q="$pi" 'BEGIN{printf "%.2f %.2f %.2f", s/p, s/m, s/q}')
    printf "%-8s %3s %12s %12s %12s %12s   %-22s %s %s %s\n" "$r" "$n" "$si" "$pi" "$ps" "$mm" "$ratio" "$spss" "$ppss" "$ch_sh"
  done
done
