#!/usr/bin/env python3
"""Tables for scripts/engine-compare.sh from its raw run outputs.

Usage:
  engine_compare_report.py bench RUN_DIR   # timing tables (markdown)
  engine_compare_report.py callgrind CG_DIR N1 N2

`bench`: RUN_DIR holds `<bench>-<part>-<label>-<round>.txt`, the stdout of
one bench binary run (label `before` or `after`). Three kinds of rows are
read from them:
- the `xarray` bench's own summary table: median ns/op of the kxarray
  column and of the "kxarray alt" column (cursor / replace);
- the `add_folio` bench's own summary table: median ns/add of the legacy
  and the optimised path (each measured in alternating batches);
- every criterion `time:` line: the middle (point) estimate, per criterion
  iteration (xarray: one chunk of 2^16 ops; add_folio: one add).
Per row and label the value is the median over the rounds; ratio =
after / before; the per-round ratios (round i of after over round i of
before, the two ran back to back) give the min-max column. A row whose
ratio is above 1.05 is flagged.

`callgrind`: CG_DIR holds `<label>-<path>-<n>.out`, the stderr of a
callgrind run of `engine_paths <path> <n>`; instructions per operation =
(Collected(N2) - Collected(N1)) / (N2 - N1).
"""
import os
import re
import statistics
import sys
from collections import defaultdict

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
FLAG = 1.05
PATHS = ["load", "next", "conflicts", "iter", "store", "add_folio"]


def parse_run(text, bench):
    rows = {}
    # criterion: "<id> time: [a u b u c u]" or "<id>\n   time: [...]"
    last_id = None
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s+time:\s+\[(\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\]", line)
        if m:
            rows[f"criterion {m.group(1)}"] = float(m.group(4)) * UNITS[m.group(5)]
            last_id = None
            continue
        m = re.match(r"^\s+time:\s+\[(\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\]", line)
        if m and last_id:
            rows[f"criterion {last_id}"] = float(m.group(3)) * UNITS[m.group(4)]
            last_id = None
            continue
        if line and not line[0].isspace() and re.match(r"^[\w./-]+$", line.strip()):
            last_id = line.strip()
    if bench == "xarray":
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 4 or cells[0] not in ("dense", "sparse40", "sparse64"):
                continue
            if len(cells) == 4:  # the bytes-per-entry table
                if cells[1] == "kxarray":
                    rows[f"xarray {cells[0]} kxarray bytes/entry (allocator)"] = float(cells[3])
                continue
            try:
                rows[f"xarray {cells[0]}/{cells[1]} kxarray (ns/op)"] = float(cells[2])
            except ValueError:
                continue
            m = re.match(r"^(\w+) ([\d.]+)", cells[3])
            if m:
                rows[f"xarray {cells[0]}/{cells[1]} kxarray/{m.group(1)} (ns/op)"] = float(m.group(2))
    if bench == "add_folio":
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 8 or not cells[1].endswith(" walks"):
                continue  # not a data row (the header says "legacy walks/add")
            rows[f"add_folio {cells[0]} legacy (ns/add)"] = float(cells[3])
            rows[f"add_folio {cells[0]} optimised (ns/add)"] = float(cells[6])
            rows[f"add_folio {cells[0]} optimised walks/add"] = float(cells[4].split()[0])
            rows[f"add_folio {cells[0]} optimised nodes/add"] = float(cells[5].split()[0])
    return rows


def fmt(v):
    if v >= 1e6:
        return f"{v / 1e6:.3f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.2f} µs"
    return f"{v:.2f}"


def bench_report(run_dir):
    # data[row][label][round] = value
    data = defaultdict(lambda: defaultdict(dict))
    order = []
    for f in sorted(os.listdir(run_dir)):
        m = re.match(r"^(xarray|add_folio)-(.+)-(before|after)-(\d+)\.txt$", f)
        if not m:
            continue
        bench, _, label, rnd = m.group(1), m.group(2), m.group(3), int(m.group(4))
        text = open(os.path.join(run_dir, f), encoding="utf-8", errors="replace").read()
        for row, v in parse_run(text, bench).items():
            if row not in data:
                order.append(row)
            data[row][label][rnd] = v
    summary = [r for r in order if not r.startswith("criterion ")]
    crit = [r for r in order if r.startswith("criterion ")]
    out = []
    ratios = []
    flagged = []
    for title, rows, unit in [
        ("Bench summary tables (the benches' own medians)", summary, ""),
        ("Criterion point estimates (per criterion iteration: xarray = 2^16 ops, add_folio = 1 add)", crit, ""),
    ]:
        out.append(f"### {title}")
        out.append("")
        out.append("| row | before | after | ratio after/before | per-round ratios (min–max) | rounds | flag |")
        out.append("|---|---:|---:|---:|---:|---:|---|")
        for r in rows:
            b, a = data[r].get("before", {}), data[r].get("after", {})
            if not b or not a:
                out.append(f"| {r} | {'—' if not b else fmt(statistics.median(b.values()))} | {'—' if not a else fmt(statistics.median(a.values()))} | — | — | — | missing |")
                continue
            bm, am = statistics.median(b.values()), statistics.median(a.values())
            counts = "walks/add" in r or "nodes/add" in r or "bytes/entry" in r
            if bm == 0:
                ratio = 1.0 if am == 0 else float("inf")
            else:
                ratio = am / bm
            paired = [a[k] / b[k] for k in sorted(set(a) & set(b)) if b[k] != 0]
            span = f"{min(paired):.3f}–{max(paired):.3f}" if paired else "—"
            flag = ""
            if counts:
                flag = "CHANGED" if am != bm else ""
            elif ratio > FLAG:
                flag = f"SLOWER {100 * (ratio - 1):+.1f}%"
                flagged.append(r)
            if not counts:
                ratios.append(ratio)
            out.append(
                f"| {r[len('criterion '):] if r.startswith('criterion ') else r} | {fmt(bm)} | {fmt(am)} | {ratio:.3f} | {span} | {len(paired)} | {flag} |"
            )
        out.append("")
    if ratios:
        dev = sorted(abs(x - 1) for x in ratios)
        out.append(
            f"Ratios over {len(ratios)} timing rows: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}; "
            f"median |ratio-1| {100 * statistics.median(dev):.1f}%, 90th percentile |ratio-1| {100 * dev[int(0.9 * (len(dev) - 1))]:.1f}%. "
            f"Rows flagged (> {100 * (FLAG - 1):.0f}% slower): {len(flagged)}."
        )
        out.append("")
    return "\n".join(out)


def collected(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    m = re.search(r"Collected\s*:\s*(\d+)", text)
    if not m:
        raise SystemExit(f"no 'Collected' line in {path}")
    return int(m.group(1))


def callgrind_report(cg_dir, n1, n2):
    n1, n2 = int(n1), int(n2)
    out = [
        f"| path | before instr/op | after instr/op | ratio after/before |",
        "|---|---:|---:|---:|",
    ]
    for path in PATHS:
        v = {}
        for label in ["before", "after"]:
            try:
                c1 = collected(os.path.join(cg_dir, f"{label}-{path}-{n1}.out"))
                c2 = collected(os.path.join(cg_dir, f"{label}-{path}-{n2}.out"))
                v[label] = (c2 - c1) / (n2 - n1)
            except (OSError, SystemExit):
                v[label] = None
        b, a = v["before"], v["after"]
        ratio = f"{a / b:.3f}" if a is not None and b else "—"
        if a is None and b is None:
            continue
        out.append(
            f"| {path} | {'—' if b is None else f'{b:.1f}'} | {'—' if a is None else f'{a:.1f}'} | {ratio} |"
        )
    return "\n".join(out)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "bench":
        print(bench_report(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "callgrind":
        print(callgrind_report(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
