#!/usr/bin/env bash
# kxarray-nbd with its reads in flight (the default) against the same server
# with --in-flight-reads false (batches of 16 on 4 workers per connection),
# interleaved, with each server's CPU time per read.
#
# Usage: kxarray-nbd/scripts/nbd-inflight.sh [cold|warm] [ROUNDS] [SECONDS]
#   cold (default): a fresh `--backend cached --direct --cache-size 256M`
#        server per run over FILE (2 GiB, laid out by scripts/vs-kernel.sh
#        cold, or made here), the file dropped from the kernel's cache
#        first; fio's nbd engine, 4 KiB randread, iodepth 64, JOBS jobs (2);
#        beside fio io_uring iodepth 64 O_DIRECT with JOBS jobs on the file
#   warm: `--backend cached` (buffered) with a 512 MiB cache, 256 MiB of
#        the export read first, then the same randread over those 256 MiB
# Prints one line per run: round, row, IOPS, server CPU (user + system)
# per read in microseconds. DIR (/var/tmp/sizing) must not be tmpfs.
set -euo pipefail
MODE=${1:-cold}
ROUNDS=${2:-3}
SECS=${3:-3}
JOBS=${JOBS:-2}
DIR=${DIR:-/var/tmp/sizing}
FILE=${FILE:-$DIR/vs-kernel-2g.img}
cd "$(dirname "$0")/../.."
command -v fio >/dev/null || { echo "fio not found: apt-get install -y fio" >&2; exit 1; }
cargo build --release --bin kxarray-nbd >&2
NBD=$PWD/target/release/kxarray-nbd
mkdir -p "$DIR"
[ -f "$FILE" ] || head -c 2G /dev/urandom >"$FILE"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
drop() { python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$FILE"; }
iops() { python3 -c 'import json, sys; t = sys.stdin.read(); j = json.loads(t[t.index("{"):]); print(sum(x["read"]["iops"] for x in j["jobs"]))'; }
# One run of the server with the given flags: "IOPS CPU_US_PER_READ".
server() {
  local sock=$WORK/nbd.sock pid t0 t1 got size=2G flags=(--direct --cache-size 256M)
  rm -f "$sock"
  [ "$MODE" = warm ] && { size=256M; flags=(--cache-size 512M); }
  [ "$MODE" = cold ] && drop
  "$NBD" --backend cached "${flags[@]}" --file "$FILE" --size 2G --unix "$sock" "$@" 2>"$WORK/nbd.log" &
  pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  if [ "$MODE" = warm ]; then
    fio --name=warm --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=read --bs=1m \
      --iodepth=8 --size=256M --output-format=json >/dev/null 2>&1
  fi
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  got=$(fio --name=nbd --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=randread --bs=4k \
    --iodepth=64 --numjobs="$JOBS" --size="$size" --time_based --runtime="$SECS" \
    --output-format=json 2>/dev/null | iops)
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  python3 -c "import os, sys; hz = os.sysconf('SC_CLK_TCK'); i = float(sys.argv[1]); print('%.0f %.2f' % (i, (int(sys.argv[3]) - int(sys.argv[2])) * 1e6 / hz / (i * float(sys.argv[4]))))" "$got" "$t0" "$t1" "$SECS"
}
uring() {
  drop
  echo "$(fio --name=rand --filename="$FILE" --size=2G --time_based --runtime="$SECS" --ioengine=io_uring \
    --rw=randread --bs=4k --iodepth=64 --direct=1 --numjobs="$JOBS" --output-format=json | iops) -"
}
echo "date: $(date -Is); load average: $(cut -d' ' -f1-3 /proc/loadavg); mode $MODE, $JOBS jobs, ${SECS}s runs"
rows=(in-flight batch)
[ "$MODE" = cold ] && rows+=(fio-uring)
for r in $(seq 1 "$ROUNDS"); do
  k=${#rows[@]}
  for ((i = 0; i < k; i++)); do
    row=${rows[$(((i + r) % k))]}
    case $row in
      in-flight) got=$(server) ;;
      batch) got=$(server --in-flight-reads false) ;;
      fio-uring) got=$(uring) ;;
    esac
    echo "$r $row $got"
  done
done
echo "date: $(date -Is); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
