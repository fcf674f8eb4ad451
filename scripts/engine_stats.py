#!/usr/bin/env python3
"""Static figures of a crate's src/ for a before/after comparison.

Usage: engine_stats.py BEFORE_SRC AFTER_SRC

Prints markdown to stdout:
- per file (path relative to src/), for both trees: line count, `unsafe {`
  blocks, `unsafe fn`s, `// SAFETY:` comments, `# Safety` doc sections and
  `debug_assert*!` calls, with totals;
- the module import graph of each tree: the edges `a -> b` between
  top-level modules (every `crate::b` path in a file of module `a`,
  including the names inside `use crate::{...}` groups), then the same for
  the second level (`a::x -> a::y`, from `crate::a::y` and `super::y` paths
  inside module `a`), and any cycle among them.

Counting rules (plain text, no parsing): comment lines (`//`, `///`, `//!`)
are skipped for `unsafe {`, `unsafe fn` and `debug_assert`; the whole file
counts, `#[cfg(test)]` code included.
"""
import os
import re
import sys

UNSAFE_BLOCK = re.compile(r"\bunsafe\s*\{")
UNSAFE_FN = re.compile(r"\bunsafe\s+(?:extern\s+\"[^\"]*\"\s+)?fn\b")
SAFETY_COMMENT = re.compile(r"//\s*SAFETY:")
SAFETY_SECTION = re.compile(r"^\s*//[/!]\s*#+\s*Safety\s*$")
DEBUG_ASSERT = re.compile(r"\bdebug_assert(?:_eq|_ne)?!")

COLS = ["lines", "unsafe {", "unsafe fn", "// SAFETY:", "# Safety", "debug_assert!"]


def rust_files(src):
    out = []
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(root, f)
                out.append(os.path.relpath(p, src))
    return sorted(out)


def file_counts(path):
    c = dict.fromkeys(COLS, 0)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            c["lines"] += 1
            s = line.strip()
            if SAFETY_COMMENT.search(line):
                c["// SAFETY:"] += 1
            if SAFETY_SECTION.match(line):
                c["# Safety"] += 1
            if s.startswith("//"):
                continue
            c["unsafe {"] += len(UNSAFE_BLOCK.findall(line))
            c["unsafe fn"] += len(UNSAFE_FN.findall(line))
            c["debug_assert!"] += len(DEBUG_ASSERT.findall(line))
    return c


def counts_table(before, after):
    fb = {f: file_counts(os.path.join(before, f)) for f in rust_files(before)}
    fa = {f: file_counts(os.path.join(after, f)) for f in rust_files(after)}
    files = sorted(set(fb) | set(fa))
    head = "| file | " + " | ".join(f"{c} (before → after)" for c in COLS) + " |"
    rows = [head, "|---|" + "---:|" * len(COLS)]

    def cell(b, a, col):
        bv = "—" if b is None else str(b[col])
        av = "—" if a is None else str(a[col])
        return bv if bv == av else f"{bv} → {av}"

    for f in files:
        b, a = fb.get(f), fa.get(f)
        rows.append(f"| {f} | " + " | ".join(cell(b, a, c) for c in COLS) + " |")
    tb = {c: sum(v[c] for v in fb.values()) for c in COLS}
    ta = {c: sum(v[c] for v in fa.values()) for c in COLS}
    rows.append("| **total** | " + " | ".join(cell(tb, ta, c) for c in COLS) + " |")
    over = [f"{f} ({v['lines']})" for f, v in fa.items() if v["lines"] > 1000]
    rows.append("")
    rows.append(
        f"Files: {len(fb)} → {len(fa)}. Files over 1,000 lines (after): "
        + (", ".join(over) if over else "none")
        + "."
    )
    return "\n".join(rows)


def strip_tests(text):
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests", text)
    return text[: cut.start()] if cut else text


def brace_group(text, start):
    """The text inside the `{...}` that opens at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return text[start + 1 :]


def top_names(group):
    """Top-level path heads inside a `{a::x, b, c::{d, e}}` group."""
    names, depth, tok = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(tok)
            tok = ""
            continue
        if depth == 0:
            tok += ch
    names.append(tok)
    out = []
    for n in names:
        m = re.match(r"\s*([a-z_][a-z0-9_]*)", n)
        if m and m.group(1) != "self":
            out.append(m.group(1))
    return out


def path_heads(text, prefix):
    """Module names that follow `prefix::` (e.g. `crate`), braces included."""
    heads = []
    for m in re.finditer(re.escape(prefix) + r"::\s*(\{|[a-z_][a-z0-9_]*)", text):
        if m.group(1) == "{":
            heads += top_names(brace_group(text, m.start(1)))
        else:
            heads.append(m.group(1))
    return heads


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def graphs(src):
    files = rust_files(src)
    tops = set()
    subs = {}
    for f in files:
        p = module_of(f)
        if p[0] in ("lib", "main"):
            continue
        tops.add(p[0])
        if len(p) >= 2:
            subs.setdefault(p[0], set()).add(p[1])
    top_edges = {t: set() for t in tops}
    sub_edges = {}
    for f in files:
        p = module_of(f)
        if p[0] in ("lib", "main"):
            continue
        text = strip_tests(open(os.path.join(src, f), encoding="utf-8", errors="replace").read())
        for h in path_heads(text, "crate"):
            if h in tops and h != p[0]:
                top_edges[p[0]].add(h)
        # second level: inside a directory module, edges between its children
        if len(p) >= 2 and p[0] in subs:
            me = f"{p[0]}::{p[1]}"
            kids = subs[p[0]]
            for h in path_heads(text, f"crate::{p[0]}"):
                if h in kids and h != p[1]:
                    sub_edges.setdefault(me, set()).add(f"{p[0]}::{h}")
            if len(p) == 2:  # `super::` from a direct child is the parent module
                for h in path_heads(text, "super"):
                    if h in kids and h != p[1]:
                        sub_edges.setdefault(me, set()).add(f"{p[0]}::{h}")
    return top_edges, sub_edges


def find_cycle(edges):
    color, stack = {}, []

    def dfs(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if color.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if not color.get(v):
                c = dfs(v)
                if c:
                    return c
        color[u] = 2
        stack.pop()
        return None

    for m in sorted(edges):
        if not color.get(m):
            c = dfs(m)
            if c:
                return c
    return None


def graph_text(src):
    top, sub = graphs(src)
    lines = []
    n = sum(len(v) for v in top.values())
    lines.append(f"Top-level modules: {len(top)}, edges: {n}.")
    lines.append("")
    lines.append("```text")
    for m in sorted(top):
        lines.append(f"{m} -> {', '.join(sorted(top[m])) or '(none)'}")
    lines.append("```")
    two_way = sorted({tuple(sorted((a, b))) for a in top for b in top[a] if a in top.get(b, ())})
    c = find_cycle(top)
    lines.append("")
    lines.append(
        "Top-level cycles: "
        + ("none" if not c else " -> ".join(c))
        + ("" if not two_way else "; two-way imports: " + ", ".join(f"{a} <-> {b}" for a, b in two_way))
        + "."
    )
    if sub:
        lines.append("")
        lines.append("Inside directory modules (`crate::dir::x` and `super::x` paths between siblings):")
        lines.append("")
        lines.append("```text")
        for m in sorted(sub):
            lines.append(f"{m} -> {', '.join(sorted(sub[m]))}")
        lines.append("```")
        c2 = find_cycle(sub)
        lines.append("")
        lines.append("Second-level cycles: " + ("none" if not c2 else " -> ".join(c2)) + ".")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    before, after = sys.argv[1], sys.argv[2]
    print("### Per-file counts (src/)")
    print()
    print(counts_table(before, after))
    print()
    print("### Module import graph: before")
    print()
    print(graph_text(before))
    print()
    print("### Module import graph: after")
    print()
    print(graph_text(after))


if __name__ == "__main__":
    main()
