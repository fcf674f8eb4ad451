#!/usr/bin/env python3
"""The cold-miss table of `scripts/vs-kernel.sh cold`: kxarray's
fio example (`--direct --cold`) and the NBD server beside the real fio on
the same file, cold, interleaved rounds; a row per target of the issue with
the ratio's median and range over the rounds.

Usage:
  vs_kernel_cold.py fio-json FILE       one fio run's JSON -> "IOPS BYTES_PER_S"
  vs_kernel_cold.py result LINE...      the fio example's result: words -> "IOPS BYTES_PER_S"
  vs_kernel_cold.py report FILE         the table, from lines "round row tool IOPS BYTES_PER_S"
"""
import json
import statistics
import sys
from collections import defaultdict

# row -> (unit, [(tool, anchor, target)], the tools in column order)
TARGETS = {
    "seq": ("MB/s", [("kx-seq", "fio-psync", 1.0), ("kx-seq", "fio-uring-128k", 0.7)],
            ["kx-seq", "fio-psync", "fio-uring-128k"]),
    "rand": ("KIOPS", [("kx-rand-qd32", "fio-uring-qd32", 0.9), ("kx-rand-fut32", "fio-uring-qd32", 0.9),
                       ("kx-rand-sync", "fio-psync-direct", 1.0)],
             ["kx-rand-qd32", "kx-rand-fut32", "kx-rand-sync", "fio-uring-qd32", "fio-psync-direct"]),
    "nbd": ("KIOPS", [("nbd-qd64", "fio-uring-qd64", 0.9), ("nbd-batch-qd64", "fio-uring-qd64", 0.9),
                      ("nbd-file-qd64", "fio-uring-qd64", 0.9)],
            ["nbd-qd64", "nbd-batch-qd64", "nbd-file-qd64", "fio-uring-qd64"]),
}
WHAT = {
    "kx-seq": "fio example --direct --cold --rw read --bs 4k, 1 job",
    "fio-psync": "fio psync buffered, cold kernel cache, --rw read --bs 4k, 1 job",
    "fio-uring-128k": "fio io_uring --bs 128k --iodepth 8 --direct 1 --rw read, 1 job",
    "kx-rand-qd32": "fio example --direct --cold --rw randread --bs 4k, 2 jobs, --iodepth 32",
    "kx-rand-fut32": "the same with --iodepth-api future (32 read_owned futures in flight per job)",
    "kx-rand-sync": "fio example --direct --cold --rw randread --bs 4k, 2 jobs, --iodepth 1 (read_at)",
    "fio-uring-qd32": "fio io_uring --bs 4k --iodepth 32 --direct 1 --rw randread",
    "fio-psync-direct": "fio psync --direct 1 --rw randread --bs 4k, 2 jobs",
    "nbd-qd64": "fio nbd engine --rw randread --bs 4k --iodepth 64, 2 jobs, against kxarray-nbd --backend cached --direct --cache-size 256M",
    "nbd-batch-qd64": "the same with --in-flight-reads false (reads in batches of 16 on 4 workers per connection)",
    "nbd-file-qd64": "the same against kxarray-nbd --backend file --direct (no cache; reference)",
    "fio-uring-qd64": "fio io_uring --bs 4k --iodepth 64 --direct 1 --rw randread, 2 jobs, on the file",
}


def fio_json(path):
    text = open(path).read()
    # fio's nbd engine prints "fio: connected to NBD server" before the JSON.
    jobs = json.loads(text[text.index("{"):])["jobs"]
    iops = sum(j["read"]["iops"] for j in jobs)
    bw = sum(j["read"]["bw_bytes"] for j in jobs)
    print(round(iops), round(bw))


def result(words):
    kv = dict(w.split("=", 1) for w in words if "=" in w)
    iops = float(kv.get("read_iops", 0))
    print(round(iops), round(iops * float(kv.get("bs", 0))))


def report(path):
    runs = defaultdict(dict)  # (row, round) -> tool -> (iops, bytes/s)
    for line in open(path):
        c = line.split()
        if len(c) == 5:
            runs[(c[1], c[0])][c[2]] = (float(c[3]), float(c[4]))
    for row, (unit, pairs, tools) in TARGETS.items():
        rounds = [r for (rw, r) in runs if rw == row]
        if not rounds:
            continue

        def value(r, t):
            v = runs[(row, r)].get(t)
            if v is None or v[0] <= 0:
                return None
            return v[1] / 1e6 if unit == "MB/s" else v[0] / 1e3

        print(f"\n{row}: {len(rounds)} rounds, median {unit} (range)")
        print("| tool | what | " + unit + " |")
        print("|---|---|---|")
        for t in tools:
            xs = [x for x in (value(r, t) for r in rounds) if x is not None]
            if xs:
                print(f"| {t} | {WHAT[t]} | {statistics.median(xs):,.1f} ({min(xs):,.1f}-{max(xs):,.1f}) |")
            else:
                print(f"| {t} | {WHAT[t]} | no run |")
        print("\n| target | ratio per round: median (range) | target | met |")
        print("|---|---|---|---|")
        for a, b, want in pairs:
            rs = [x / y for x, y in ((value(r, a), value(r, b)) for r in rounds) if x and y]
            if not rs:
                print(f"| {a} / {b} | no pair | {want:.1f}x | - |")
                continue
            m = statistics.median(rs)
            print(f"| {a} / {b} | {m:.2f}x ({min(rs):.2f}-{max(rs):.2f}) | {want:.1f}x | {'yes' if m >= want else 'no'} |")


if __name__ == "__main__":
    if sys.argv[1] == "fio-json":
        fio_json(sys.argv[2])
    elif sys.argv[1] == "result":
        result(sys.argv[2:])
    else:
        report(sys.argv[2])
