#!/usr/bin/env python3
"""Tables for scripts/vs-kernel.sh: medians over interleaved
rounds of the fio example's `result:` lines, and the ratios the issue's
targets name.

Input (argv[1] = mode, argv[2] = a TSV file), one run per line:
  table:     round, size, row, jobs, engine label, then the result line's
             key=value fields
  fio-check: round, jobs, tool (fio|fio-thread|harness), engine, IOPS, CPU ns per I/O
  callgrind: size, row, engine label, I/O count, instructions collected
  miss:      round, jobs, tool (kx-grow|kx-steady|psync|fio), IOPS
  profile:   two `callgrind_annotate --threshold=100` listings (N and 2N
             I/Os), N, a title
"""
import re
import statistics
import sys
from collections import defaultdict


def med(xs):
    return statistics.median(xs) if xs else None


def kiops(x):
    return "-" if x is None else f"{x / 1e3:,.0f}"


def fields(cols):
    return dict(c.split("=", 1) for c in cols if "=" in c)


# (name, numerator, denominator, target, comparison, applies(size, row))
# A ratio is IOPS(numerator) / IOPS(denominator) unless `cost` is set:
# then it is the numerator's time per I/O over the denominator's (the
# floor target: at most 1.3x the time of a bare memcpy).
RATIOS = [
    # every 256 MiB row, and the 70/30 mix on both files
    ("read_at / psync", "kxarray", "psync", 1.2, ">=", lambda s, r: s == "256m" or r.startswith("randrw"), False),
    ("read_at / mmap", "kxarray", "mmap", 1.0, ">=", lambda s, r: s == "256m", False),
    ("zero-copy / psync", "kxarray-zc", "psync", 3.0, ">=", lambda s, r: True, False),
    ("zero-copy+touch / psync+touch", "kxarray-zc+touch", "psync+touch", 1.5, ">=", lambda s, r: True, False),
    ("read_at time / memcpy time", "kxarray", "memcpy", 1.3, "<=", lambda s, r: s == "1m", True),
]


def table(path):
    runs = {"wall": defaultdict(dict), "cpu": defaultdict(dict)}  # (size, row, jobs) -> engine -> round -> IOPS
    order, engines = [], []
    for line in open(path):
        cols = line.rstrip("\n").split("\t")
        if len(cols) < 6:
            continue
        rnd, size, row, jobs, eng = cols[:5]
        f = fields(cols[5:])
        if f.get("ok") != "1":
            print(f"warning: a failed run ({size} {row} {jobs} jobs {eng}, round {rnd})", file=sys.stderr)
            continue
        key = (size, row, jobs)
        if key not in runs["wall"]:
            order.append(key)
        if eng not in engines:
            engines.append(eng)
        runs["wall"][key].setdefault(eng, {})[rnd] = float(f["iops"])
        cpu = float(f.get("cpu_ns_per_io", 0))
        if cpu > 0:
            # I/Os per CPU-second of the process, times the jobs: what the
            # jobs would do on cores of their own.
            runs["cpu"][key].setdefault(eng, {})[rnd] = int(jobs) * 1e9 / cpu

    canon = ["kxarray", "kxarray+touch", "kxarray-zc", "kxarray-zc+touch", "kxarray-zc-batch", "psync",
             "psync+touch", "mmap", "mmap+touch", "memcpy", "memcpy+touch", "null"]
    engines.sort(key=lambda e: canon.index(e) if e in canon else len(canon))
    rounds = sorted({r for k in runs["wall"] for e in runs["wall"][k] for r in runs["wall"][k][e]}, key=int)
    for kind, title in (
        ("wall", "wall-clock KIOPS (reads + writes; 2 jobs: both together)"),
        ("cpu", "KIOPS per CPU: jobs x 1e9 / the process's CPU ns per I/O (waiting for a CPU on the shared machine does not count)"),
    ):
        r = runs[kind]
        print(f"\n### By {title}\n\nMedians over {len(rounds)} interleaved rounds:\n")
        print("| file | row | jobs | " + " | ".join(engines) + " |")
        print("|---|---|---:|" + "---:|" * len(engines))
        for key in order:
            cells = [kiops(med(list(r[key].get(e, {}).values()))) for e in engines]
            print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
        ratios(r, order, rounds)
        before_after(r, order, rounds, engines)
    print("\nTargets: read_at / psync >= 1.2 on every 256m row and on every 70/30 mix (randrw) row; read_at / mmap")
    print(">= 1.0 on every 256m row; zero-copy / psync >= 3 and zero-copy+touch / psync+touch >= 1.5 on every row; on the 1m")
    print("rows read_at's time per I/O at most 1.3x memcpy's (the gross ratio carries the mark; the net one is for reading).")


def before_after(runs, order, rounds, engines):
    """For every engine X run also as X@before (BEFORE_BIN): X / X@before."""
    pairs = [e for e in engines if not e.endswith("@before") and e + "@before" in engines]
    if not pairs:
        return
    print("\nThis build against BEFORE_BIN, the same engine (median of the per-round ratios [lowest-highest round]):\n")
    print("| file | row | jobs | " + " | ".join(f"{e} / {e}@before" for e in pairs) + " |")
    print("|---|---|---:|" + "---:|" * len(pairs))
    for key in order:
        e = runs[key]
        cells = []
        for x in pairs:
            per = [e[x][r] / e[x + "@before"][r] for r in rounds
                   if e.get(x, {}).get(r) and e.get(x + "@before", {}).get(r)]
            cells.append(f"{med(per):.2f} [{min(per):.2f}-{max(per):.2f}]" if per else "-")
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")


def ratios(runs, order, rounds):
    print("\nRatios: the median of the per-round ratios (both engines of a round ran back to back) [lowest-highest round];")
    print("a mark where the issue sets a target (met: +, missed: x). Time ratios are per I/O; \"net\" subtracts the null engine's")
    print("time per I/O (the harness's own cost).\n")
    names = [r[0] for r in RATIOS] + ["read_at time / memcpy time, net"]
    print("| file | row | jobs | " + " | ".join(names) + " |")
    print("|---|---|---:|" + "---:|" * len(names))
    met = missed = 0
    for key in order:
        size, row, jobs = key
        e = runs[key]
        cells = []
        for name, num, den, target, cmp, applies, cost in RATIOS:
            per = []
            for r in rounds:
                a, b = e.get(num, {}).get(r), e.get(den, {}).get(r)
                if a and b:
                    per.append(b / a if cost else a / b)
            if not per:
                cells.append("-")
                continue
            m = med(per)
            mark = ""
            if applies(size, row):
                ok = m >= target if cmp == ">=" else m <= target
                mark = " +" if ok else " x"
                met += ok
                missed += not ok
            cells.append(f"{m:.2f} [{min(per):.2f}-{max(per):.2f}]{mark}")
        # The floor net of the harness: time per I/O minus the null engine's.
        per = []
        for r in rounds:
            kx, mc, nl = (e.get(x, {}).get(r) for x in ("kxarray", "memcpy", "null"))
            if kx and mc and nl:
                t = lambda iops: int(jobs) * 1e9 / iops
                net_mc = t(mc) - t(nl)
                if net_mc > 0:
                    per.append((t(kx) - t(nl)) / net_mc)
        cells.append(f"{med(per):.2f} [{min(per):.2f}-{max(per):.2f}]" if per else "-")
        print(f"| {size} | {row} | {jobs} | " + " | ".join(cells) + " |")
    print(f"\nTargets met: {met} of {met + missed} cells that carry one.")


def fio_check(path):
    iops = defaultdict(lambda: defaultdict(dict))  # (engine, jobs) -> tool -> round -> IOPS
    cpu = defaultdict(lambda: defaultdict(dict))  # the same -> CPU ns per I/O
    for line in open(path):
        cols = line.split()
        if len(cols) != 6:
            continue
        rnd, jobs, tool, eng, x, c = cols
        iops[(eng, jobs)][tool][rnd] = float(x)
        cpu[(eng, jobs)][tool][rnd] = float(c)
    rounds = sorted({r for k in iops for t in iops[k] for r in iops[k][t]}, key=int)

    def per_round(f):
        xs = [x for x in (f(r) for r in rounds) if x is not None]
        return f"{med(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs else "-"

    def ratio(d, a, b, invert=False):
        def f(r):
            if r not in d[a] or r not in d[b] or not d[a][r] or not d[b][r]:
                return None
            return d[b][r] / d[a][r] if invert else d[a][r] / d[b][r]
        return f

    print(f"\nThe harness against the real fio, the same file and job ({len(rounds)} interleaved rounds). Medians, and ratios as the")
    print("median of the per-round ratios [lowest-highest round], above 1 when the harness measured the engine faster.\n")
    print("Wall clock: KIOPS.\n")
    print("| engine | jobs | fio (processes) | fio --thread | harness | harness / fio | harness / fio --thread |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (eng, jobs) in sorted(iops):
        t = iops[(eng, jobs)]
        m = {tool: med(list(t[tool].values())) for tool in ("fio", "fio-thread", "harness")}
        print(f"| {eng} | {jobs} | {kiops(m['fio'])} | {kiops(m['fio-thread'])} | {kiops(m['harness'])} | "
              f"{per_round(ratio(t, 'harness', 'fio'))} | {per_round(ratio(t, 'harness', 'fio-thread'))} |")
    print("\nCPU time per I/O, ns (the process's, or fio's per-job getrusage: time spent waiting for a CPU on the shared")
    print("machine does not count). \"net\": minus the same tool's null engine (its own bookkeeping per I/O), the engine's cost.\n")
    print("| engine | jobs | fio (processes) | fio --thread | harness | fio / harness | fio --thread / harness | net: fio / harness | net: fio --thread / harness |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (eng, jobs) in sorted(cpu):
        t = cpu[(eng, jobs)]
        nulls = cpu.get(("null", jobs), {})
        m = {tool: med(list(t[tool].values())) for tool in ("fio", "fio-thread", "harness")}

        def net(tool):
            def f(r):
                try:
                    h = t["harness"][r] - nulls["harness"][r]
                    o = t[tool][r] - nulls[tool][r]
                except KeyError:
                    return None
                return o / h if h > 0 else None
            return f

        cells = [f"{m[k]:.0f}" if m[k] else "-" for k in ("fio", "fio-thread", "harness")]
        nets = ["-", "-"] if eng == "null" else [per_round(net("fio")), per_round(net("fio-thread"))]
        print(f"| {eng} | {jobs} | " + " | ".join(cells) + f" | {per_round(ratio(t, 'harness', 'fio', True))} | "
              f"{per_round(ratio(t, 'harness', 'fio-thread', True))} | " + " | ".join(nets) + " |")


def fio_json(path):
    """One fio run's JSON (per-job, no group_reporting): the jobs' read
    IOPS summed, and the CPU ns per I/O from each job's usr_cpu + sys_cpu
    (percent of its runtime, from getrusage of its process or thread)."""
    import json
    jobs = json.load(open(path))["jobs"]
    cpu = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1e6 for j in jobs)
    ios = sum(j["read"]["total_ios"] for j in jobs)
    print(round(sum(j["read"]["iops"] for j in jobs)), round(cpu / max(ios, 1), 1))


def miss(path):
    """The miss-path table: median IOPS per jobs and tool, and
    the ratios of the kxarray rows to fio's psync (and the harness's),
    each the median of the per-round ratios with its range."""
    runs = defaultdict(dict)  # (round, jobs) -> tool -> iops
    for line in open(path):
        c = line.split()
        if len(c) == 4:
            runs[(c[0], c[1])][c[2]] = float(c[3])
    jobs_all = sorted({j for _, j in runs}, key=int)
    tools = ["kx-grow", "kx-steady", "psync", "fio"]
    print("| jobs | " + " | ".join(f"{t} KIOPS" for t in tools) + " | grow / fio | steady / fio | grow / psync | steady / psync |")
    print("|---" * (len(tools) + 5) + "|")
    for jobs in jobs_all:
        rs = [v for (r, j), v in runs.items() if j == jobs]
        cells = [kiops(med([r[t] for r in rs if r.get(t)])) for t in tools]

        def ratio(a, b):
            xs = sorted(r[a] / r[b] for r in rs if r.get(a) and r.get(b))
            if not xs:
                return "-"
            return f"{med(xs):.2f}x ({xs[0]:.2f}-{xs[-1]:.2f})"
        print(f"| {jobs} | " + " | ".join(cells) + f" | {ratio('kx-grow', 'fio')} | {ratio('kx-steady', 'fio')} | "
              f"{ratio('kx-grow', 'psync')} | {ratio('kx-steady', 'psync')} |")
    print("target: every kxarray / fio psync ratio at least 0.67x")
    if any(r.get("kx-steady@before") or r.get("kx-grow@before") for r in runs.values()):
        print()
        print("| jobs | grow@before KIOPS | grow KIOPS | grow after / before | steady@before KIOPS | steady KIOPS | steady after / before |")
        print("|---" * 7 + "|")
        for jobs in jobs_all:
            rs = [v for (r, j), v in runs.items() if j == jobs]
            cells = []
            for row in ("kx-grow", "kx-steady"):
                xs = sorted(r[row] / r[row + "@before"] for r in rs if r.get(row) and r.get(row + "@before"))
                span = f"{med(xs):.2f}x ({xs[0]:.2f}-{xs[-1]:.2f})" if xs else "-"
                cells += [kiops(med([r[row + "@before"] for r in rs if r.get(row + "@before")])),
                          kiops(med([r[row] for r in rs if r.get(row)])), span]
            print(f"| {jobs} | " + " | ".join(cells) + " |")
    if any(r.get("kx-steady-bg") for r in runs.values()):
        print()
        print("| jobs | steady KIOPS | steady-bg KIOPS | steady-bg / steady | steady-bg / fio |")
        print("|---" * 5 + "|")
        for jobs in jobs_all:
            rs = [v for (r, j), v in runs.items() if j == jobs]

            def span(a, b):
                xs = sorted(r[a] / r[b] for r in rs if r.get(a) and r.get(b))
                return f"{med(xs):.2f}x ({xs[0]:.2f}-{xs[-1]:.2f})" if xs else "-"
            print(f"| {jobs} | {kiops(med([r['kx-steady'] for r in rs if r.get('kx-steady')]))} | "
                  f"{kiops(med([r['kx-steady-bg'] for r in rs if r.get('kx-steady-bg')]))} | "
                  f"{span('kx-steady-bg', 'kx-steady')} | {span('kx-steady-bg', 'fio')} |")


def callgrind(path):
    counts = defaultdict(dict)  # (size, row, engine) -> ios -> instructions
    order = []
    for line in open(path):
        cols = line.split()
        if len(cols) != 5:
            continue
        size, row, eng, ios, ins = cols
        key = (size, row, eng)
        if key not in counts:
            order.append(key)
        counts[key][int(ios)] = int(ins)
    per = {}
    for key in order:
        c = counts[key]
        if len(c) >= 2:
            lo, hi = min(c), max(c)
            per[key] = (c[hi] - c[lo]) / (hi - lo)
    print("\nInstructions per I/O (valgrind --tool=callgrind, user space only; the difference of two runs of --ios N and 2N")
    print("over N, so setup, layout and warm-up cancel; \"net\" subtracts the null engine, the harness's own loop)\n")
    print("| file | row | engine | instructions per I/O | net of the harness |")
    print("|---|---|---|---:|---:|")
    for key in order:
        if key not in per:
            continue
        size, row, eng = key
        null = per.get((size, row, "null"))
        net = f"{per[key] - null:.0f}" if null is not None and eng != "null" else "-"
        print(f"| {size} | {row} | {eng} | {per[key]:.0f} | {net} |")


def functions(path):
    """Self instructions per function from a `callgrind_annotate
    --threshold=100` listing."""
    out = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        name = re.sub(r" \[[^\]]*\]$", "", m.group(2))
        name = name.split(":", 1)[1] if name.startswith(("???:", "./", "/")) and ":" in name else name
        out[name] = out.get(name, 0) + int(m.group(1).replace(",", ""))
    return out


def profile(lo_path, hi_path, n, title):
    """Where an engine's instructions per I/O go: the self instructions of
    each function in the 2N run minus the N run, over N."""
    lo, hi = functions(lo_path), functions(hi_path)
    n = int(n)
    rows = sorted(((hi.get(f, 0) - lo.get(f, 0)) / n, f) for f in set(lo) | set(hi))
    rows = [r for r in reversed(rows) if r[0] >= 0.5]
    print(f"\n{title}: self instructions per I/O by function (2N run minus N run, over N)\n")
    print("| instructions per I/O | function |")
    print("|---:|---|")
    for x, f in rows[:25]:
        print(f"| {x:.1f} | `{f[:110]}` |")
    print(f"| {sum(r[0] for r in rows):.1f} | (total of the functions listed and not) |")


if __name__ == "__main__":
    if sys.argv[1] == "profile":
        profile(*sys.argv[2:6])
    else:
        {"table": table, "fio-check": fio_check, "fio-json": fio_json, "callgrind": callgrind, "miss": miss}[sys.argv[1]](sys.argv[2])
