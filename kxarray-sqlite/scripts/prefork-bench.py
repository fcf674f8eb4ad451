#!/usr/bin/python3
"""Pre-fork workers, as gunicorn --preload serves them: a parent opens one
WAL database and reads it, then forks WORKERS workers (os.fork) that each
open it afresh and serve point selects with a one-row insert every tenth,
for SECONDS; then each worker's RSS, the PSS of all (parent and workers,
/proc/<pid>/smaps_rollup) while they are still alive, and the database's
bytes in the kernel's page cache (`fincore`), on the unix VFS, on kxarray
with each process's own cache (kx-private, kx_shared=0) and on kxarray's
shared cache (kx, the default), interleaved over ROUNDS; each run in a
process of its own (forked before any kxarray open, so that its first open
decides as a server's would). For kxarray, each worker's shared-budget
fields from PRAGMA kx_stats.

    cargo build --release -p kxarray-sqlite --lib
    /usr/bin/python3 kxarray-sqlite/scripts/prefork-bench.py
    ROUNDS=5 SECONDS=5 WORKERS=4 ROWS=8000 /usr/bin/python3 kxarray-sqlite/scripts/prefork-bench.py

Needs a Python whose sqlite3 module can load extensions (Debian's
/usr/bin/python3 can). The processes get a private XDG_RUNTIME_DIR, so the
budget's members shown are this run's alone.
"""
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time

ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECONDS = float(os.environ.get("SECONDS", "3"))
WORKERS = int(os.environ.get("WORKERS", "4"))
ROWS = int(os.environ.get("ROWS", "8000"))  # about 26 MB of 3,000-byte rows
LIB = os.environ.get(
    "KX_LIB",
    os.path.join(os.path.dirname(__file__), "../../target/release/libkxarray_sqlite.so"),
)


def make_db(path):
    c = sqlite3.connect(path)
    c.executescript(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(x INTEGER PRIMARY KEY, pad BLOB);"
    )
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO t SELECT i, randomblob(3000) FROM n",
        (ROWS,),
    )
    c.commit()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


def connect(db, vfs):
    if vfs == "kx":
        return sqlite3.connect(f"file:{db}?vfs=kxarray", uri=True)
    if vfs == "kx-private":
        return sqlite3.connect(f"file:{db}?vfs=kxarray&kx_shared=0", uri=True)
    return sqlite3.connect(db)


def kernel_cached(path):
    """Bytes of `path` in the kernel's page cache (util-linux fincore)."""
    import subprocess
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return 0


def mem(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Rss", "Pss"):
                out[k] = int(v.split()[0]) * 1024
    return out


def kx_fields(c):
    s = c.execute("PRAGMA kx_stats").fetchone()[0]
    kv = dict(p.split("=", 1) for p in s.split() if "=" in p)
    return {k: kv.get(k, "-") for k in ("budget_members", "budget_share", "capacity", "cached_pages",
                                         "region_capacity", "region_cached_pages")}


def worker(db, vfs, report_w, quit_r):
    c = connect(db, vfs)
    c.execute("PRAGMA busy_timeout=30000")
    ops = 0
    end = time.monotonic() + SECONDS
    rng = random.Random(os.getpid())
    while time.monotonic() < end:
        c.execute("SELECT length(pad) FROM t WHERE x = ?", (rng.randint(1, ROWS),)).fetchone()
        ops += 1
        if ops % 10 == 0:
            c.execute("INSERT INTO t(pad) VALUES (randomblob(100))")
            c.commit()
    fields = kx_fields(c) if vfs != "unix" else {}
    line = f"{os.getpid()} {ops} " + " ".join(f"{k}={v}" for k, v in fields.items())
    os.write(report_w, (line + "\n").encode())
    os.read(quit_r, 1)  # alive until the parent has measured
    os._exit(0)


def run(db, vfs):
    parent = connect(db, vfs)
    parent.execute("SELECT sum(length(pad)) FROM t").fetchone()
    report_r, report_w = os.pipe()
    quit_r, quit_w = os.pipe()
    pids = []
    for _ in range(WORKERS):
        pid = os.fork()
        if pid == 0:
            try:
                worker(db, vfs, report_w, quit_r)
            finally:
                os._exit(1)
        pids.append(pid)
    os.close(report_w)
    lines = []
    with os.fdopen(report_r) as r:
        for _ in range(WORKERS):
            lines.append(r.readline().split())
    mems = {pid: mem(pid) for pid in pids + [os.getpid()]}
    kernel = kernel_cached(db)
    os.write(quit_w, b"x" * WORKERS)
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(quit_r)
    os.close(quit_w)
    parent_fields = kx_fields(parent) if vfs != "unix" else {}
    parent.close()
    rss = [mems[p]["Rss"] for p in pids]
    pss = sum(m["Pss"] for m in mems.values())
    ops = sum(int(l[1]) for l in lines)
    return {
        "rss_worker": statistics.median(rss),
        "pss_all": pss,
        "kernel": kernel,
        "held": pss + kernel,
        "ops_s": ops / SECONDS,
        "workers": [" ".join(l[2:]) for l in lines],
        "parent": parent_fields,
    }


def main():
    if not os.path.exists(LIB):
        sys.exit(f"{LIB} not found: cargo build --release -p kxarray-sqlite --lib")
    tmp = tempfile.mkdtemp(prefix="kx-prefork-")
    xdg = os.path.join(tmp, "xdg")
    os.mkdir(xdg, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = xdg
    c = sqlite3.connect(":memory:")
    c.enable_load_extension(True)
    c.load_extension(os.path.abspath(LIB))
    c.close()
    import json
    configs = ["unix", "kx-private", "kx"]
    rows = {v: [] for v in configs}
    for rnd in range(ROUNDS):
        order = configs[rnd % 3:] + configs[:rnd % 3]
        for vfs in order:
            db = os.path.join(tmp, f"{vfs}-{rnd}.db")
            make_db(db)
            # a process of its own per run (see the module notes)
            rd, wr = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(rd)
                    os.write(wr, json.dumps(run(db, vfs)).encode())
                finally:
                    os._exit(0)
            os.close(wr)
            with os.fdopen(rd) as f:
                r = json.loads(f.read())
            os.waitpid(pid, 0)
            rows[vfs].append(r)
            print(
                f"round {rnd} {vfs:4}: worker RSS {r['rss_worker'] / 2**20:6.1f} MiB, "
                f"PSS of all {r['pss_all'] / 2**20:6.1f} MiB, kernel {r['kernel'] / 2**20:6.1f} MiB, "
                f"{r['ops_s']:9.0f} ops/s",
                flush=True,
            )
            if vfs != "unix":
                print(f"  parent: {r['parent']}")
                for w in r["workers"]:
                    print(f"  worker: {w}")
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.remove(db + suffix)
                except FileNotFoundError:
                    pass
    med = lambda v, k: statistics.median(x[k] for x in rows[v])
    print()
    print(f"| {WORKERS} workers, {ROWS} rows, {SECONDS:g} s, {ROUNDS} rounds | unix | kx-private | kx (shared) |")
    print("|---|---|---|---|")
    for k, label, scale in (
        ("rss_worker", "RSS per worker, MiB (median)", 2**20),
        ("pss_all", "PSS of all, MiB (median)", 2**20),
        ("kernel", "the database in the kernel's cache, MiB (median)", 2**20),
        ("held", "held on the machine: PSS + kernel, MiB (median)", 2**20),
        ("ops_s", "operations/s, all workers (median)", 1),
    ):
        u = med("unix", k)
        cells = [f"{med(v, k) / scale:.1f} ({med(v, k) / u:.2f}x)" if u else f"{med(v, k) / scale:.1f}"
                 for v in ("kx-private", "kx")]
        print(f"| {label} | {u / scale:.1f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
