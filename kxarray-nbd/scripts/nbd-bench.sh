#!/usr/bin/env bash
# The seed's brd table (radix tree vs XArray, fio KIOPS) redone over NBD
# with the real fio: 4 KiB write/randwrite/read/randread at iodepth 64 with
# 1 and 2 jobs (fio's nbd engine opens one connection per job), over a Unix
# socket and over TCP loopback, against
#   xarray         kxarray-nbd --backend xarray   (RamDisk: pages in the XArray)
#   hashmap        kxarray-nbd --backend hashmap  (pages in a Mutex<HashMap>)
#   nbdkit-sparse  nbdkit memory allocator=sparse (one global lock)
#   nbdkit-malloc  nbdkit memory allocator=malloc (one flat allocation)
# Each round starts every server of a transport afresh, all at once, fills
# each disk with one untimed sequential 1 MiB write pass (so all jobs
# measure allocated pages, the steady state the seed's --loop=8 measured),
# then runs each of the eight jobs against every server back to back, in an
# order rotated from job to job. The table shows the median KIOPS over the
# rounds, the diff of xarray against each other store, and the range of the
# per-round diffs. A second table gives each server's CPU time per I/O
# (user + system, from /proc/PID/stat over the job): on a machine whose
# cores the client and the servers share, it is what a server costs the
# client's throughput, and it moves far less from round to round than KIOPS.
#
# Usage: kxarray-nbd/scripts/nbd-bench.sh [ROUNDS] [SECONDS] [SIZE]
#        (defaults 3 rounds, 3 s per job, 512M disk)
# Rows can be narrowed (more rounds of fewer rows, to pin one down):
#   TRANSPORTS="unix tcp" JOBS="1 2" RWS="write randwrite read randread"
#   (the defaults), e.g. TRANSPORTS=tcp JOBS=1 RWS=write ... 9 3 512M
# THREADS sets kxarray-nbd's --threads (worker threads per connection;
# unset: the server's default, 1 for the RAM disks).
# OLD_BIN=path adds a column "xarray-old": another build of kxarray-nbd
# (for example main's, built into another directory) serving the same
# RAM disk, to compare a change side by side in the same run.
# TLS=1 adds "xarray-tls": the same RAM disk with --tls require, fio over
# nbds:// (fio's nbd engine takes no tls-certificates in its URI, so libnbd
# finds the CA in $HOME/.pki/libnbd of a HOME made for it; certificates
# made with openssl). ONLY="xarray xarray-old ..." keeps only those columns.
# Needs fio (apt-get install -y fio); the nbdkit columns need nbdkit
# (apt-get install -y nbdkit) and are skipped with a message without it.
set -euo pipefail
ROUNDS=${1:-3}
RUNTIME=${2:-3}
SIZE=${3:-512M}
export TRANSPORTS=${TRANSPORTS:-unix tcp} JOBS=${JOBS:-1 2} RWS=${RWS:-write randwrite read randread}
THREADS=${THREADS:-} # kxarray-nbd's worker threads per connection (empty: its default)
cd "$(dirname "$0")/../.."

command -v fio >/dev/null || { echo "fio not found: apt-get install -y fio" >&2; exit 1; }
cargo build --release --bin kxarray-nbd >&2
BIN=$PWD/target/release/kxarray-nbd

STORES="xarray hashmap"
OLD_BIN=${OLD_BIN:-}
[ -n "$OLD_BIN" ] && STORES="$STORES xarray-old"
if command -v nbdkit >/dev/null && nbdkit memory --dump-plugin >/dev/null 2>&1; then
  STORES="$STORES nbdkit-sparse nbdkit-malloc"
else
  echo "nbdkit (memory plugin) not found: skipping the nbdkit columns (apt-get install -y nbdkit)" >&2
fi

TLS=${TLS:-}
if [ -n "$TLS" ]; then
  if command -v openssl >/dev/null; then STORES="$STORES xarray-tls"
  else echo "openssl not found: skipping the TLS column" >&2; fi
fi
if [ -n "${ONLY:-}" ]; then
  kept=""
  for s in $STORES; do case " $ONLY " in *" $s "*) kept="$kept $s" ;; esac; done
  STORES=${kept# }
fi

WORK=$(mktemp -d)
declare -A PID PORT SOCK
cleanup() {
  for p in "${PID[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
RESULTS=$WORK/results.tsv
if [[ " $STORES " == *" xarray-tls "* ]]; then
  # A CA, a server certificate for localhost and 127.0.0.1 (nbdkit's
  # layout for the server), and the CA where libnbd looks by default.
  T=$WORK/tls
  mkdir -p "$T/srv" "$T/home/.pki/libnbd"
  ( cd "$T" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca-key.pem \
      -out ca-cert.pem -days 2 -subj "/CN=bench CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=keyCertSign,cRLSign" &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv/server-key.pem \
      -out srv.csr -subj "/CN=localhost" &&
    printf "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" >ext &&
    openssl x509 -req -in srv.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
      -out srv/server-cert.pem -days 2 -extfile ext &&
    cp ca-cert.pem srv/ && cp ca-cert.pem home/.pki/libnbd/ ) >/dev/null 2>&1 ||
    { echo "certificates not made" >&2; exit 1; }
fi
read -r -a store_list <<<"$STORES"
n=${#store_list[@]}
base=$((20000 + RANDOM % 20000))
for k in $(seq 0 $((n - 1))); do
  PORT[${store_list[$k]}]=$((base + k))
  SOCK[${store_list[$k]}]=$WORK/${store_list[$k]}.sock
done

start_server() { # store transport
  local store=$1 transport=$2 listen sock=${SOCK[$1]} port=${PORT[$1]}
  rm -f "$sock"
  case $store in
    xarray|hashmap|xarray-old|xarray-tls)
      if [ "$transport" = unix ]; then listen=(--unix "$sock"); else listen=(--listen "127.0.0.1:$port"); fi
      local bin=$BIN backend=$store tls=()
      [ "$store" = xarray-old ] && bin=$OLD_BIN backend=xarray
      [ "$store" = xarray-tls ] && backend=xarray tls=(--tls require --tls-certificates "$WORK/tls/srv")
      RUST_LOG=warn "$bin" --size "$SIZE" --backend "$backend" ${THREADS:+--threads "$THREADS"} "${tls[@]}" "${listen[@]}" 2>>"$WORK/server.log" &
      ;;
    nbdkit-*)
      if [ "$transport" = unix ]; then listen=(-U "$sock"); else listen=(-i 127.0.0.1 -p "$port"); fi
      nbdkit -f "${listen[@]}" memory size="$SIZE" allocator="${store#nbdkit-}" 2>>"$WORK/server.log" &
      ;;
  esac
  PID[$store]=$!
  for _ in $(seq 100); do
    if [ "$transport" = unix ]; then [ -S "$sock" ] && return 0
    else (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0; fi
    sleep 0.05
  done
  echo "server $store did not start" >&2; exit 1
}

stop_server() {
  kill -INT "${PID[$1]}" 2>/dev/null || true
  wait "${PID[$1]}" 2>/dev/null || true
  unset "PID[$1]"
}

uri() { # store transport
  local s=nbd
  [ "$1" = xarray-tls ] && s=nbds
  if [ "$2" = unix ]; then echo "$s+unix:///?socket=${SOCK[$1]}"; else echo "$s://127.0.0.1:${PORT[$1]}/"; fi
}

fio_for() { # store -> run fio with the environment that store needs
  local store=$1; shift
  if [ "$store" = xarray-tls ]; then HOME=$WORK/tls/home fio "$@"; else fio "$@"; fi
}

kiops() { # json file -> "KIOPS IOS FIO_CPU_US_PER_IO" (read + write)
  python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index('{'):])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
# usr_cpu and sys_cpu: percent of one CPU, summed over the grouped jobs.
fio_us = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1000 / max(ios, 1)
print("%.1f %d %.2f" % ((j["read"]["iops"] + j["write"]["iops"]) / 1000, ios, fio_us))
PY
}

TICK_US=$((1000000 / $(getconf CLK_TCK)))
cpu_ticks() { # pid -> user + system clock ticks of the whole process
  # After the parenthesised command name, utime and stime are the 12th and
  # 13th fields (14 and 15 of the whole line).
  local stat
  stat=$(<"/proc/$1/stat")
  stat=${stat##*) }
  read -r -a f <<<"$stat"
  echo $((f[11] + f[12]))
}

# Every server of a transport runs at once (idle ones cost nothing), so each
# job is run against every store back to back, in an order rotated from job
# to job: the stores of one row are measured seconds apart, not minutes, and
# the machine's drift falls on all of them alike.
slot=0
for round in $(seq "$ROUNDS"); do
  for transport in $TRANSPORTS; do
    for store in "${store_list[@]}"; do
      start_server "$store" "$transport"
      # Fill the disk once, untimed, so every measured job sees allocated
      # pages (steady state, as the seed's --loop=8 over the whole brd).
      fio_for "$store" --name=fill --ioengine=nbd --uri="$(uri "$store" "$transport")" --rw=write --bs=1M \
        --iodepth=8 --size="$SIZE" >/dev/null 2>>"$WORK/fio.err"
    done
    for jobs in $JOBS; do
      for rw in $RWS; do
        slot=$((slot + 1))
        for k in $(seq 0 $((n - 1))); do
          store=${store_list[$(( (k + slot) % n ))]}
          c0=$(cpu_ticks "${PID[$store]}")
          fio_for "$store" --name=bench --ioengine=nbd --uri="$(uri "$store" "$transport")" --rw="$rw" --bs=4k \
            --iodepth=64 --numjobs="$jobs" --size="$SIZE" --time_based --runtime="$RUNTIME" \
            --group_reporting --output-format=json >"$WORK/out.json" 2>>"$WORK/fio.err"
          c1=$(cpu_ticks "${PID[$store]}")
          read -r k_iops ios fio_us <<<"$(kiops "$WORK/out.json")"
          cpu_us=$(python3 -c "print('%.2f' % (($c1 - $c0) * $TICK_US / max($ios, 1)))")
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$transport" "$jobs" "$rw" "$store" "$k_iops" "$cpu_us" "$fio_us" >>"$RESULTS"
          echo "round $round $transport jobs=$jobs $rw $store: $k_iops KIOPS, CPU per I/O: server $cpu_us us, fio $fio_us us" >&2
        done
      done
    done
    for store in "${store_list[@]}"; do stop_server "$store"; done
  done
done

python3 - "$RESULTS" "$STORES" "$ROUNDS" "$RUNTIME" "$SIZE" <<'EOF'
import os, sys, statistics, collections
path, stores, rounds, runtime, size = sys.argv[1], sys.argv[2].split(), *sys.argv[3:]
vals = collections.defaultdict(list)
cpu = collections.defaultdict(list)
client = collections.defaultdict(list)
for line in open(path):
    r, t, j, rw, store, k, c, f = line.split("\t")
    vals[(t, j, rw, store)].append(float(k))
    cpu[(t, j, rw, store)].append(float(c))
    client[(t, j, rw)].append(float(f))
others = [s for s in stores if s != "xarray"]

def table(data, digits, label, cell, last=None):
    """One row per (transport, jobs, rw): each store's median of `data`,
    then `cell(key, store, medians)` for xarray against each other store,
    then `last(key)` when given (a "fio" column)."""
    head = "| transport | jobs | rw        | " + " | ".join(f"{s:>13}" for s in stores)
    head += "".join(f" | xarray {label} {s}" for s in others) + (" | fio |" if last else " |")
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for t in os.environ["TRANSPORTS"].split():
        for j in os.environ["JOBS"].split():
            for rw in os.environ["RWS"].split():
                key = (t, j, rw)
                med = {s: statistics.median(data[key + (s,)]) for s in stores}
                row = f"| {t:9} | {j:4} | {rw:9} | " + " | ".join(f"{med[s]:13.{digits}f}" for s in stores)
                for s in others:
                    row += " | " + cell(key, s, med).rjust(len(f"xarray {label} {s}"))
                print(row + (f" | {last(key)} |" if last else " |"))

def kiops_diff(key, s, med):
    d = (med["xarray"] / med[s] - 1) * 100 if med[s] else float("nan")
    # the same round's paired ratios: their spread shows the noise
    pr = [(a / b - 1) * 100 for a, b in zip(vals[key + ("xarray",)], vals[key + (s,)]) if b]
    return f"{d:+.1f}% ({min(pr):+.0f}..{max(pr):+.0f})" if pr else f"{d:+.1f}%"

print(f"fio --ioengine=nbd, 4 KiB, iodepth 64, {runtime} s per job, {size} disk filled first; median KIOPS of {rounds} rounds; diff of the medians, and in brackets the range of the per-round diffs (all stores of a row run back to back)")
print()
table(vals, 1, "vs", kiops_diff)
print()
print(f"CPU (user + system) per I/O, microseconds, median of {rounds} rounds: each server's, the ratio of xarray's to each other store's (below 1: xarray costs less), and fio's own (median over all stores)")
print()
table(cpu, 2, "/", lambda key, s, med: f"{med['xarray'] / med[s]:.2f}x" if med[s] else "-",
      lambda key: f"{statistics.median(client[key]):.2f}")
EOF
