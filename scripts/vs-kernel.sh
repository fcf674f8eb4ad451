#!/usr/bin/env bash
# kxarray's page cache against the kernel's, one harness for all:
# the fio example (examples/fio) with --engine kxarray|psync|mmap|memcpy|null,
# the same job loop, random stream, clock reads and histogram for every
# engine, every cache warm before the clock starts (the kernel's is never
# dropped: fio's --invalidate=0).
#
# Usage:
#   scripts/vs-kernel.sh [table]     the table (default): ROUNDS interleaved rounds
#   scripts/vs-kernel.sh fio-check   the harness's psync/mmap rows against the real fio
#   scripts/vs-kernel.sh callgrind   instructions per I/O of the hit paths
#   scripts/vs-kernel.sh miss        4 KiB random read_at misses against fio psync
#   scripts/vs-kernel.sh cold        cold misses (O_DIRECT, empty caches) against the real fio, and NBD
#
# table: rows = file size (SIZES: a 256 MiB file the page cache holds, a
# 1 MiB file the CPU caches hold) x pattern (ROWS: 4 KiB and 64 KiB random
# reads, 4 KiB sequential reads, a 70/30 random read/write mix of 4 KiB) x
# jobs (JOBS: 1 and 2); every row runs every engine of its size back to
# back in an order rotated from row to row and round to round:
#   kxarray           CachedFile::read_at (a copy), write_at
#   kxarray-zc        read_folio_in, zero-copy, a guard pinned per read
#   kxarray-zc+touch  the same, checksumming every byte in place
#   psync+touch       pread, checksumming its copy
#   psync             pread(2)/pwrite(2)
#   mmap              memcpy from/to a MAP_SHARED mapping (fio's mmap engine)
#   memcpy            memcpy from/to a heap buffer: the floor (1 MiB rows)
#   null              no data moved: the harness's own cost (1 MiB rows)
# (also accepted in ENGINES_256M / ENGINES_1M: kxarray-zc-batch, a guard
# per 64 reads; kxarray+touch; mmap+touch; memcpy+touch)
# and prints the median KIOPS and the ratios the issue's targets name,
# each the median of the per-round ratios with its range.
#
# fio-check: fio --ioengine=psync|mmap|null --invalidate=0 --rw=randread
# --bs=4k --size=256M --numjobs=1|2 --time_based, as processes (fio's
# default) and with --thread (what the harness does: threads), against the
# harness's same job on the same file; interleaved rounds; needs fio
# (apt-get install -y fio). The "net" column subtracts each tool's own null
# engine (its per-I/O bookkeeping) from its time per I/O.
#
# callgrind: each engine of CG_ENGINES on the 4 KiB random-read rows of
# both files, one job, under valgrind --tool=callgrind with --ios N and
# --ios 2N (CG_IOS=N, default 100000); the difference over N is the
# instructions per I/O, with layout, warm-up and exit cancelled out, and the
# null engine's figure (the harness's loop: RNG, clock, histogram) is
# subtracted for the net column. Needs valgrind (apt-get install -y
# valgrind). To look inside one row by hand:
#   cargo build --release --example fio
#   F=/tmp/vs-kernel-256m.img   # laid out by a first run without --reuse-file
#   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
#     target/release/examples/fio --engine kxarray --zero-copy --rw randread \
#     --bs 4k --size 256m --cache-size 512m --numjobs 1 --ios 200000 \
#     --no-verify --reuse-file --filename $F --quiet
#   callgrind_annotate --inclusive=yes /tmp/cg.out | head -40
# (run it again with --ios 100000 and subtract, as this mode does, to get
# per-I/O figures; CG_KEEP=DIR keeps this mode's output files.) The mode
# counts only inside the job loop (--toggle-collect='fio::job::Job::run*'),
# and for the engines of CG_PROFILE ("kxarray kxarray-zc") also prints
# each function's own instructions per I/O (the same difference, per
# function, from callgrind_annotate).
#
# miss: the miss path. A MISS_SIZE file (2g) held by the
# kernel's cache (read once with cat before every round), 4 KiB random
# reads, MISS_JOBS jobs ("1 2"), interleaved in an order rotated per row
# and round:
#   kx-grow     read_at on a cold kxarray cache larger than the file
#               (MISS_GROW_CACHE, 4g): GROW_IOS reads per job (131072: a
#               job's slice is MISS_SIZE / jobs, so most reads miss and
#               the cache grows all along; hits rise to about a quarter
#               of the reads by the end)
#   kx-steady   read_at on a warm cache of MISS_STEADY_CACHE (256m) over
#               the file, RUNTIME seconds: at steady state nearly every
#               read misses and evicts (the warm-up's 64 KiB folios give
#               way to 4 KiB ones in the first fraction of a second)
#   psync       the harness's pread(2) on the same file, RUNTIME seconds
#   fio         real fio --ioengine=psync --invalidate=0 --thread on the
#               same file, RUNTIME seconds (if fio is installed)
# and prints each row's median IOPS and the ratios kx-grow / fio psync and
# kx-steady / fio psync (target: 0.67x), each the median of the per-round
# ratios with its range, and the same against the harness's psync. With
# BEFORE_BIN set (another build of the fio example), kx-grow@before and
# kx-steady@before run it too, interleaved, and a table of after / before
# ratios follows. With MISS_BG=1, kx-steady-bg runs kx-steady with the
# background reclaimer on (--background-reclaim), and a table of its
# ratios to kx-steady and to fio follows.
#
# BEFORE_BIN: another build of the harness (for example the fio example
# built from an earlier commit); engines labelled LABEL@before in
# ENGINES_256M / ENGINES_1M run with it, interleaved with the rest, and the
# report adds an after/before table for every such pair.
#
# Environment: ROUNDS (3), RUNTIME seconds per run (1; fio-check: 3), DIR
# for the files (/tmp; two files, 256 MiB and 1 MiB, kept for reuse),
# SIZES ("256m 1m"), JOBS ("1 2"), ROWS ("randread-4k randread-64k read-4k
# randrw-4k"), ENGINES_256M, ENGINES_1M (the lists above), CACHE (512m: the
# kxarray cache, big enough for the file), KX_DIRTY (kernel: the kxarray
# cache writes back under the kernel's vm.dirty_* policy; library: its
# defaults), CG_IOS, CG_ENGINES ("kxarray
# kxarray-zc kxarray-zc-batch memcpy null"), CG_PROFILE, CG_KEEP, RAW (the
# raw results, one run a line, kept: $DIR/vs-kernel-MODE.tsv; the report
# again from it: python3 scripts/vs_kernel_report.py MODE FILE).
# A full table run is 112 runs per round: with RUNTIME=1, 6 min 40 s for
# the 3 rounds on the 2-core development machine (fio-check with ROUNDS=5
# RUNTIME=3: 5 min; callgrind: 1 min 35 s).
#
# cold: the miss path on a cold start, against the real fio on
# the same COLD_SIZE file (2g, in DIR: not tmpfs, which refuses O_DIRECT),
# every run a fresh process with the file dropped from the kernel's cache
# first (posix_fadvise DONTNEED), RUNTIME seconds (2), rows COLD_ROWS
# ("seq rand nbd"), the tools of a row interleaved in an order rotated per
# round:
#   seq   kx-seq          the fio example --direct --cold, --rw read --bs 4k,
#                         1 job, a COLD_CACHE (256m) cache over O_DIRECT
#         fio-psync       fio psync, buffered, the kernel's readahead
#         fio-uring-128k  fio io_uring --bs 128k --iodepth 8 --direct 1
#   rand  kx-rand-qd32    the fio example --direct --cold --rw randread --bs 4k,
#                         2 jobs, --iodepth 32 (the page cache's batch read)
#         kx-rand-fut32   the same with --iodepth-api future (32 read_owned
#                         futures in flight per job, each replaced as it
#                         completes)
#         kx-rand-sync    the same at --iodepth 1 (read_at)
#         fio-uring-qd32  fio io_uring --bs 4k --iodepth 32 --direct 1,
#                         COLD_URING_JOBS (1) job(s), the issue's anchor
#         fio-psync-direct fio psync --direct 1, 2 jobs
#   nbd   nbd-qd64        fio's nbd engine, --bs 4k --iodepth 64, 2 jobs,
#                         randread, against kxarray-nbd --backend cached
#                         --direct --cache-size COLD_CACHE serving the file
#                         over a Unix socket (a fresh server per run; each
#                         connection's reads kept in flight)
#         nbd-batch-qd64  the same with --in-flight-reads false (the reads
#                         in batches on 4 workers per connection)
#         nbd-file-qd64   the same against --backend file --direct (no
#                         cache: the batch read is the file's submission
#                         side on the I/O engine), for reference
#         fio-uring-qd64  fio io_uring --bs 4k --iodepth 64 --direct 1,
#                         2 jobs, on the file
# and prints each row's medians and the ratios the issue's targets name
# (median of the per-round ratios, range): kx-seq / fio-psync (1.0x),
# kx-seq / fio-uring-128k (0.7x), kx-rand-qd32 and kx-rand-fut32 /
# fio-uring-qd32 (0.9x),
# kx-rand-sync / fio-psync-direct (1.0x), nbd-qd64 / fio-uring-qd64 (0.9x).
# Report: python3 scripts/vs_kernel_cold.py report $DIR/vs-kernel-cold.tsv
#
# Speed runs pass --no-verify (no stamp checks per I/O) and --reuse-file
# (the file is laid out once); every run syncs its writes after the clock
# stops, so no engine leaves dirty pages to the next one.
set -euo pipefail
MODE=${1:-table}
ROUNDS=${ROUNDS:-3}
case $MODE in
  fio-check) RUNTIME=${RUNTIME:-3} ;;
  table | callgrind) RUNTIME=${RUNTIME:-1} ;;
  miss) RUNTIME=${RUNTIME:-2} ;;
  cold) RUNTIME=${RUNTIME:-2} ;;
  *) echo "usage: $0 [table|fio-check|callgrind|miss|cold]" >&2; exit 2 ;;
esac
DIR=${DIR:-/tmp}
SIZES=${SIZES:-256m 1m}
JOBS=${JOBS:-1 2}
ROWS=${ROWS:-randread-4k randread-64k read-4k randrw-4k}
ENGINES_256M=${ENGINES_256M:-kxarray kxarray-zc kxarray-zc+touch psync+touch psync mmap}
ENGINES_1M=${ENGINES_1M:-kxarray kxarray-zc kxarray-zc+touch psync+touch psync mmap memcpy null}
CACHE=${CACHE:-512m}
CG_IOS=${CG_IOS:-100000}
CG_ENGINES=${CG_ENGINES:-kxarray kxarray-zc kxarray-zc-batch memcpy null}
CG_PROFILE=${CG_PROFILE:-kxarray kxarray-zc}
RAW=${RAW:-$DIR/vs-kernel-$MODE.tsv}
cd "$(dirname "$0")/.."
REPORT=$PWD/scripts/vs_kernel_report.py

cargo build --release --example fio >&2
BIN=$PWD/target/release/examples/fio
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
: >"$RAW"
echo "raw results: $RAW" >&2

# The kernel's writeback policy for the kxarray cache (KX_DIRTY=kernel):
# vm.dirty_background_* and vm.dirty_* (bytes, or the ratio of
# MemAvailable, close to the kernel's "dirtyable memory") and
# vm.dirty_expire_centisecs, so that in the 70/30 mix neither cache writes
# back more than the other's policy makes it (the library's defaults are
# 10% and 20% of the cache's capacity and 1 s: KX_DIRTY=library).
kernel_dirty_flags() {
  local avail bg lim
  avail=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
  bg=$(cat /proc/sys/vm/dirty_background_bytes)
  [ "$bg" -gt 0 ] || bg=$((avail * $(cat /proc/sys/vm/dirty_background_ratio) / 100))
  lim=$(cat /proc/sys/vm/dirty_bytes)
  [ "$lim" -gt 0 ] || lim=$((avail * $(cat /proc/sys/vm/dirty_ratio) / 100))
  echo "--dirty-background $bg --dirty-limit $lim --dirty-expire $(awk '{print $1 / 100}' /proc/sys/vm/dirty_expire_centisecs)"
}
case ${KX_DIRTY:-kernel} in
  kernel) KXF=$(kernel_dirty_flags) ;;
  library) KXF= ;;
  *) echo "KX_DIRTY: kernel or library" >&2; exit 2 ;;
esac

# The harness's flags for an engine label ("LABEL@before": the same with
# BEFORE_BIN, another build of the harness, to compare a change).
engine_flags() {
  case ${1%@before} in
    kxarray) echo "--engine kxarray $KXF" ;;
    kxarray+touch) echo "--engine kxarray --touch $KXF" ;;
    kxarray-zc) echo "--engine kxarray --zero-copy $KXF" ;;
    kxarray-zc+touch) echo "--engine kxarray --zero-copy --touch $KXF" ;;
    kxarray-zc-batch) echo "--engine kxarray --zero-copy --pin batch $KXF" ;;
    psync) echo "--engine psync" ;;
    psync+touch) echo "--engine psync --touch" ;;
    mmap) echo "--engine mmap" ;;
    mmap+touch) echo "--engine mmap --touch" ;;
    memcpy) echo "--engine memcpy" ;;
    memcpy+touch) echo "--engine memcpy --touch" ;;
    null) echo "--engine null" ;;
    *) echo "unknown engine label: $1" >&2; exit 2 ;;
  esac
}

# The harness's flags for a row (pattern-bs).
row_flags() {
  local rw=${1%-*} bs=${1##*-}
  case $rw in
    randrw) echo "--rw randrw --rwmixread 70 --bs $bs" ;;
    randread | read) echo "--rw $rw --bs $bs" ;;
    *) echo "unknown row: $1" >&2; exit 2 ;;
  esac
}

file_for() { echo "$DIR/vs-kernel-$1.img"; }

# Lay a file out once (a verified run writes every block's stamp).
prepare() {
  local f
  f=$(file_for "$1")
  if [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -lt "$(numfmt --from=iec "${1^^}")" ]; then
    "$BIN" --engine psync --rw randread --size "$1" --numjobs 1 --ios 1 --filename "$f" --quiet >/dev/null
  fi
}

# One run of the harness; prints its result: line.
harness() { # size jobs row-flags engine-flags extra...
  local size=$1 jobs=$2 rowf=$3 engf=$4 bin=$BIN
  shift 4
  if [ "${1:-}" = --before ]; then
    bin=${BEFORE_BIN:?an @before engine needs BEFORE_BIN}
    shift
  fi
  # shellcheck disable=SC2086 # the flag lists are meant to split
  { "$bin" $engf $rowf --size "$size" --numjobs "$jobs" --cache-size "$CACHE" \
    --no-verify --reuse-file --filename "$(file_for "$size")" --quiet "$@" ||
    echo "vs-kernel: failed: $engf $rowf --size $size --numjobs $jobs $*" >&2; } |
    { grep '^result:' || true; } | cut -d' ' -f2-
}

# rotate N word...: the words rotated left by N.
rotate() {
  local n=$1
  shift
  local a=("$@")
  local k=${#a[@]} i
  for ((i = 0; i < k; i++)); do printf '%s ' "${a[$(((i + n) % k))]}"; done
}

machine() {
  echo "date: $(date -Is); host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), kernel $(uname -r); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}

case $MODE in
table)
  for s in $SIZES; do prepare "$s"; done
  n=0
  for s in $SIZES; do
    [ "$s" = 1m ] && e=$ENGINES_1M || e=$ENGINES_256M
    n=$((n + $(wc -w <<<"$ROWS") * $(wc -w <<<"$JOBS") * $(wc -w <<<"$e")))
  done
  echo "vs-kernel: $ROUNDS rounds of $n runs, ${RUNTIME}s each; files in $DIR; the machine is shared: expect noise" >&2
  machine
  echo "kxarray writeback policy (KX_DIRTY=${KX_DIRTY:-kernel}): ${KXF:-library defaults}"
  k=0
  for round in $(seq 1 "$ROUNDS"); do
    for s in $SIZES; do
      [ "$s" = 1m ] && engines=$ENGINES_1M || engines=$ENGINES_256M
      read -r -a elist <<<"$engines"
      for row in $ROWS; do
        for jobs in $JOBS; do
          k=$((k + 1))
          for eng in $(rotate $((k + round)) "${elist[@]}"); do
            before=()
            [ "${eng%@before}" = "$eng" ] || before=(--before)
            r=$(harness "$s" "$jobs" "$(row_flags "$row")" "$(engine_flags "$eng")" \
              "${before[@]}" --runtime "$RUNTIME" --seed "$round")
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$s" "$row" "$jobs" "$eng" "${r// /$'\t'}" >>"$RAW"
          done
        done
      done
    done
    echo "round $round of $ROUNDS done ($(date +%T))" >&2
  done
  machine
  python3 "$REPORT" table "$RAW"
  ;;

fio-check)
  command -v fio >/dev/null || { echo "fio not found: apt-get install -y fio" >&2; exit 1; }
  prepare 256m
  F=$(file_for 256m)
  machine
  fio --version
  k=0
  for round in $(seq 1 "$ROUNDS"); do
    for jobs in 1 2; do
      k=$((k + 1))
      for t in $(rotate "$k" fio:psync fio-thread:psync harness:psync fio:mmap fio-thread:mmap harness:mmap fio:null fio-thread:null harness:null); do
        tool=${t%%:*} eng=${t##*:}
        if [ "$tool" = harness ]; then
          got=$(harness 256m "$jobs" "--rw randread --bs 4k" "--engine $eng" --runtime "$RUNTIME" |
            tr ' ' '\n' | sed -n 's/^iops=//p; s/^cpu_ns_per_io=//p' | tr '\n' ' ')
        else
          thread=()
          [ "$tool" = fio-thread ] && thread=(--thread)
          # Per job (no group_reporting): IOPS summed; CPU per I/O from each
          # job's usr_cpu + sys_cpu (percent of its runtime; fio takes them
          # from getrusage of the job's process, or of its thread with
          # --thread).
          got=$(fio --name=vsk --filename="$F" --ioengine="$eng" --invalidate=0 --rw=randread \
            --bs=4k --size=256M --numjobs="$jobs" --time_based --runtime="$RUNTIME" \
            "${thread[@]}" --output-format=json |
            python3 "$REPORT" fio-json /dev/stdin)
        fi
        echo "$round $jobs $tool $eng $got" >>"$RAW"
      done
    done
    echo "round $round of $ROUNDS done ($(date +%T))" >&2
  done
  machine
  python3 "$REPORT" fio-check "$RAW"
  ;;

miss)
  MISS_SIZE=${MISS_SIZE:-2g}
  MISS_JOBS=${MISS_JOBS:-1 2}
  MISS_GROW_CACHE=${MISS_GROW_CACHE:-4g}
  MISS_STEADY_CACHE=${MISS_STEADY_CACHE:-256m}
  GROW_IOS=${GROW_IOS:-131072}
  prepare "$MISS_SIZE"
  F=$(file_for "$MISS_SIZE")
  machine
  echo "file $F ($MISS_SIZE), held by the kernel's cache; kx-grow: cache $MISS_GROW_CACHE, $GROW_IOS reads per job; kx-steady: cache $MISS_STEADY_CACHE; ${RUNTIME}s runs"
  tools="kx-grow kx-steady psync"
  command -v fio >/dev/null && tools="$tools fio" || echo "fio not found (apt-get install -y fio): harness psync only" >&2
  # BEFORE_BIN: the kxarray rows again with another build, interleaved.
  [ -n "${BEFORE_BIN:-}" ] && tools="$tools kx-grow@before kx-steady@before"
  # MISS_BG=1: kx-steady again with the background reclaimer on.
  [ "${MISS_BG:-0}" = 1 ] && tools="$tools kx-steady-bg"
  k=0
  for round in $(seq 1 "$ROUNDS"); do
    for jobs in $MISS_JOBS; do
      k=$((k + 1))
      for t in $(rotate $((k + round)) $tools); do
        cat "$F" >/dev/null # the kernel's cache holds the file
        bin=$BIN
        [ "${t%@before}" = "$t" ] || bin=$BEFORE_BIN
        case ${t%@before} in
          kx-grow)
            # Skip the warm-up only (the kernel's cache keeps the file):
            # --no-warm; a build before it spelled that --cold.
            warm=--cold
            case $("$bin" --help) in *--no-warm*) warm=--no-warm ;; esac
            got=$("$bin" --engine kxarray --rw randread --bs 4k --size "$MISS_SIZE" --numjobs "$jobs" \
              --cache-size "$MISS_GROW_CACHE" "$warm" --ios "$GROW_IOS" --no-verify --reuse-file \
              --filename "$F" --quiet --seed "$round" | sed -n 's/^result: .* iops=\([0-9]*\) .*/\1/p') ;;
          kx-steady | kx-steady-bg)
            bg=()
            [ "$t" = kx-steady-bg ] && bg=(--background-reclaim)
            got=$("$bin" --engine kxarray "${bg[@]}" --rw randread --bs 4k --size "$MISS_SIZE" --numjobs "$jobs" \
              --cache-size "$MISS_STEADY_CACHE" --runtime "$RUNTIME" --no-verify --reuse-file \
              --filename "$F" --quiet --seed "$round" | sed -n 's/^result: .* iops=\([0-9]*\) .*/\1/p') ;;
          psync)
            got=$("$BIN" --engine psync --rw randread --bs 4k --size "$MISS_SIZE" --numjobs "$jobs" \
              --runtime "$RUNTIME" --no-verify --reuse-file --filename "$F" --quiet --seed "$round" |
              sed -n 's/^result: .* iops=\([0-9]*\) .*/\1/p') ;;
          fio)
            got=$(fio --name=miss --filename="$F" --ioengine=psync --invalidate=0 --rw=randread \
              --bs=4k --size="${MISS_SIZE^^}" --numjobs="$jobs" --thread --time_based \
              --runtime="$RUNTIME" --output-format=json | python3 "$REPORT" fio-json /dev/stdin | cut -d' ' -f1) ;;
        esac
        echo "$round $jobs $t ${got:-0}" >>"$RAW"
      done
    done
    echo "round $round of $ROUNDS done ($(date +%T))" >&2
  done
  machine
  python3 "$REPORT" miss "$RAW"
  ;;

callgrind)
  command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install -y valgrind" >&2; exit 1; }
  for s in $SIZES; do prepare "$s"; done
  machine
  for s in $SIZES; do
    for eng in $CG_ENGINES; do
      for n in "$CG_IOS" $((2 * CG_IOS)); do
        out=$WORK/cg.$s.$eng.$n
        # shellcheck disable=SC2046 # the flag lists are meant to split
        # The thread pool, not io_uring: valgrind does not follow
        # io_uring's completions (the warm-up's readahead would wait on
        # them forever).
        KXARRAY_IO_ENGINE=threads valgrind --tool=callgrind --toggle-collect='fio::job::Job::run*' \
          --callgrind-out-file="$out" "$BIN" $(engine_flags "$eng") \
          --rw randread --bs 4k --size "$s" --numjobs 1 --cache-size "$CACHE" --ios "$n" \
          --no-verify --reuse-file --filename "$(file_for "$s")" --quiet >/dev/null 2>"$out.log"
        ins=$(sed -n 's/^summary: //p' "$out")
        echo "$s randread-4k $eng $n $ins" >>"$RAW"
        echo "$s $eng --ios $n: $ins instructions" >&2
      done
    done
  done
  if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP" && cp "$WORK"/cg.* "$CG_KEEP"/; fi
  python3 "$REPORT" callgrind "$RAW"
  # Where the instructions go, per I/O, for the engines of CG_PROFILE.
  for s in $SIZES; do
    for eng in $CG_PROFILE; do
      for n in "$CG_IOS" $((2 * CG_IOS)); do
        callgrind_annotate --threshold=100 "$WORK/cg.$s.$eng.$n" >"$WORK/ann.$n" 2>/dev/null
      done
      python3 "$REPORT" profile "$WORK/ann.$CG_IOS" "$WORK/ann.$((2 * CG_IOS))" "$CG_IOS" \
        "$eng, 4 KiB random reads, $s file"
    done
  done
  ;;
cold)
  command -v fio >/dev/null || { echo "fio not found: apt-get install -y fio" >&2; exit 1; }
  COLD_SIZE=${COLD_SIZE:-2g}
  COLD_CACHE=${COLD_CACHE:-256m}
  COLD_ROWS=${COLD_ROWS:-seq rand nbd}
  COLD_URING_JOBS=${COLD_URING_JOBS:-1}
  COLD=$PWD/scripts/vs_kernel_cold.py
  prepare "$COLD_SIZE"
  F=$(file_for "$COLD_SIZE")
  FSIZE=${COLD_SIZE^^}
  if [[ " $COLD_ROWS " == *" nbd "* ]]; then
    cargo build --release --bin kxarray-nbd >&2
    NBD=$PWD/target/release/kxarray-nbd
  fi
  drop_file() { python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"; }
  # fio on the file, cold: IOPS and bytes/s.
  fio_cold() { # name extra-fio-flags...
    fio --name="$1" --filename="$F" --size="$FSIZE" --time_based --runtime="$RUNTIME" \
      --output-format=json "${@:2}" | python3 "$COLD" fio-json /dev/stdin
  }
  # The fio example, cold: IOPS and bytes/s.
  kx_cold() { # flags...
    # shellcheck disable=SC2046 # the result words are meant to split
    python3 "$COLD" result $("$BIN" --engine kxarray --direct --cold --bs 4k --size "$COLD_SIZE" \
      --cache-size "$COLD_CACHE" --runtime "$RUNTIME" --no-verify --reuse-file --filename "$F" \
      --quiet "$@" | grep '^result:')
  }
  # fio's nbd engine against a fresh kxarray-nbd serving the file.
  nbd_cold() { # backend (cached or file), more server flags...
    local sock=$WORK/nbd.sock pid got
    rm -f "$sock"
    "$NBD" --backend "$1" --direct --file "$F" --size "$FSIZE" --cache-size "${COLD_CACHE^^}" \
      --unix "$sock" "${@:2}" 2>"$WORK/nbd.log" &
    pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    got=$(fio --name=nbd --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=randread --bs=4k \
      --iodepth=64 --numjobs=2 --size="$FSIZE" --time_based --runtime="$RUNTIME" \
      --output-format=json | python3 "$COLD" fio-json /dev/stdin) || got=
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo "${got:-0 0}"
  }
  machine
  echo "file $F ($COLD_SIZE), dropped from the kernel's cache before every run; kxarray cache $COLD_CACHE over O_DIRECT; ${RUNTIME}s runs"
  for round in $(seq 1 "$ROUNDS"); do
    for row in $COLD_ROWS; do
      case $row in
        seq) tools="kx-seq fio-psync fio-uring-128k" ;;
        rand) tools="kx-rand-qd32 kx-rand-fut32 kx-rand-sync fio-uring-qd32 fio-psync-direct" ;;
        nbd) tools="nbd-qd64 nbd-batch-qd64 nbd-file-qd64 fio-uring-qd64" ;;
        *) echo "unknown cold row: $row" >&2; exit 2 ;;
      esac
      read -r -a tlist <<<"$tools"
      for t in $(rotate "$round" "${tlist[@]}"); do
        drop_file "$F"
        case $t in
          kx-seq) got=$(kx_cold --rw read --numjobs 1) ;;
          kx-rand-qd32) got=$(kx_cold --rw randread --numjobs 2 --iodepth 32 --seed "$round") ;;
          kx-rand-fut32) got=$(kx_cold --rw randread --numjobs 2 --iodepth 32 --iodepth-api future --seed "$round") ;;
          kx-rand-sync) got=$(kx_cold --rw randread --numjobs 2 --seed "$round") ;;
          fio-psync) got=$(fio_cold seq --ioengine=psync --rw=read --bs=4k) ;;
          fio-uring-128k) got=$(fio_cold seq --ioengine=io_uring --rw=read --bs=128k --iodepth=8 --direct=1) ;;
          fio-uring-qd32) got=$(fio_cold rand --ioengine=io_uring --rw=randread --bs=4k --iodepth=32 \
            --direct=1 --numjobs="$COLD_URING_JOBS") ;;
          fio-psync-direct) got=$(fio_cold rand --ioengine=psync --rw=randread --bs=4k --direct=1 --numjobs=2) ;;
          fio-uring-qd64) got=$(fio_cold rand --ioengine=io_uring --rw=randread --bs=4k --iodepth=64 \
            --direct=1 --numjobs=2) ;;
          nbd-qd64) got=$(nbd_cold cached) ;;
          nbd-batch-qd64) got=$(nbd_cold cached --in-flight-reads false) ;;
          nbd-file-qd64) got=$(nbd_cold file) ;;
        esac
        echo "$round $row $t ${got:-0 0}" >>"$RAW"
        echo "round $round $row $t: ${got:-failed} (IOPS bytes/s)" >&2
      done
    done
  done
  machine
  python3 "$COLD" report "$RAW"
  ;;
esac
