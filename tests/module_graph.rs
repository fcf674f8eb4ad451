//! The crate's modules run one way: no import cycle between the top-level
//! modules of `src/` (and of the servers' crates, `kxarray-nbd/src/` and
//! `kxarray-sqlite/src/`), nor among the files of any folder module
//! (`src/pagecache/file.rs` may use `inode`, `writeback` and `stats`, but
//! none of them may use `file`). A folder's `mod.rs` is its face and is left
//! out, as are `#[cfg(test)] mod tests` bodies and comments.
//!
//! An import is any path `crate::a` (an edge to top-level module `a`, and,
//! inside folder `a`, `crate::a::b` to sibling `b`) or `super::b` /
//! `super::{b, c}` (siblings). Run with `cargo test --test module_graph`; a
//! failure prints the cycle.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The file's code without comments and without its unit-test module.
fn code(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers following every occurrence of `prefix` (`crate::`,
/// `super::`), including each name of a `prefix{a, b::c}` group.
fn names_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // part of a longer path, e.g. `foo_super::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// A cycle of `g`, if any.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn dfs(
        g: &Graph,
        u: &str,
        color: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        color.insert(u.to_string(), 1);
        stack.push(u.to_string());
        for v in g.get(u).into_iter().flatten() {
            match color.get(v).copied().unwrap_or(0) {
                1 => {
                    let i = stack.iter().position(|s| s == v).unwrap();
                    let mut c = stack[i..].to_vec();
                    c.push(v.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = dfs(g, v, color, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        color.insert(u.to_string(), 2);
        stack.pop();
        None
    }
    let mut color = BTreeMap::new();
    for u in g.keys() {
        if color.get(u).copied().unwrap_or(0) == 0 {
            if let Some(c) = dfs(g, u, &mut color, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The module graphs of a source tree: (top level, one per folder).
fn graphs(src: &Path) -> (Graph, BTreeMap<String, Graph>) {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut top: Graph = BTreeMap::new();
    let mut folders: BTreeMap<String, Graph> = BTreeMap::new();
    for p in &files {
        let rel = p.strip_prefix(src).unwrap();
        let parts: Vec<String> = rel
            .iter()
            .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
            continue;
        }
        let text = code(p);
        let module = parts[0].clone();
        let uses = top.entry(module.clone()).or_default();
        for n in names_after(&text, "crate::") {
            if n != module {
                uses.insert(n);
            }
        }
        // A file directly inside a folder (not its mod.rs).
        if parts.len() == 2 && parts[1] != "mod" {
            let me = parts[1].clone();
            let g = folders.entry(module.clone()).or_default();
            let sib = g.entry(me.clone()).or_default();
            let mut names = names_after(&text, "super::");
            let inner = format!("crate::{module}::");
            names.extend(names_after(&text, &inner));
            for n in names {
                if n != me {
                    sib.insert(n);
                }
            }
        }
    }
    // Keep only edges to modules that exist.
    let known: BTreeSet<String> = top.keys().cloned().collect();
    for v in top.values_mut() {
        v.retain(|n| known.contains(n));
    }
    for g in folders.values_mut() {
        let known: BTreeSet<String> = g.keys().cloned().collect();
        for v in g.values_mut() {
            v.retain(|n| known.contains(n));
        }
    }
    (top, folders)
}

/// The servers' crates run one way too (a packaged `kxarray` has no
/// workspace around it: the test reports itself ignored there).
fn no_import_cycle_in_the_servers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if root.join("Cargo.toml.orig").exists() && !root.join("kxarray-sqlite").is_dir() {
        harness::skip_now(
            "a packaged crate has no kxarray-nbd/ or kxarray-sqlite/: run it in a clone",
        );
    }
    for krate in ["kxarray-nbd", "kxarray-sqlite"] {
        let src = root.join(krate).join("src");
        assert!(src.is_dir(), "{} is missing", src.display());
        let (top, folders) = graphs(&src);
        assert!(top.len() >= 5, "{krate}: found {} modules", top.len());
        if let Some(c) = cycle(&top) {
            panic!("import cycle in {krate}: {}", c.join(" -> "));
        }
        for (folder, g) in &folders {
            if let Some(c) = cycle(g) {
                panic!(
                    "import cycle inside {krate}/src/{folder}/: {}",
                    c.join(" -> ")
                );
            }
        }
    }
}

fn no_import_cycle_anywhere_in_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (top, folders) = graphs(&src);
    assert!(top.len() > 10, "found {} top-level modules", top.len());
    assert!(
        folders.get("pagecache").is_some_and(|g| g.len() > 10),
        "the pagecache folder's files were found"
    );
    if let Some(c) = cycle(&top) {
        panic!("import cycle between top-level modules: {}", c.join(" -> "));
    }
    for (folder, g) in &folders {
        if let Some(c) = cycle(g) {
            panic!("import cycle inside src/{folder}/: {}", c.join(" -> "));
        }
    }
    // The page cache's layering, named: file operations sit above the
    // file's state, writeback, throttling and the counters.
    let pc = &folders["pagecache"];
    for below in ["inode", "writeback", "throttle", "stats"] {
        assert!(
            !pc[below].contains("file"),
            "pagecache::{below} imports pagecache::file"
        );
    }
}

/// The I/O engine is its own layer below `backend`: it imports only the
/// `sync` shim and `fork` (which process an engine belongs to), `backend`
/// uses it and never the page cache; `fork` and `ipc` (what processes
/// share) import nothing of the crate, and `memory` only those two; inside
/// `aio` the engines sit on the in-flight record, which sits on the
/// buffers and the completion side.
fn the_io_engine_sits_below_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (top, folders) = graphs(&src);
    let aio: Vec<&String> = top["aio"].iter().collect();
    assert_eq!(
        aio,
        ["fork", "sync"],
        "aio imports only the sync shim and fork"
    );
    assert!(
        top.get("fork").is_none_or(|s| s.is_empty()),
        "fork imports nothing"
    );
    assert!(
        top.get("ipc").is_none_or(|s| s.is_empty()),
        "ipc imports nothing"
    );
    let memory: Vec<&String> = top["memory"].iter().collect();
    assert_eq!(memory, ["fork", "ipc"], "memory imports only fork and ipc");
    assert!(top["backend"].contains("aio"), "backend submits to aio");
    assert!(
        !top["backend"].contains("pagecache"),
        "backend imports pagecache"
    );
    let g = &folders["aio"];
    for (below, above) in [
        ("buf", "op"),
        ("completion", "op"),
        ("op", "uring"),
        ("op", "pool"),
    ] {
        assert!(
            !g[below].contains(above),
            "aio::{below} imports aio::{above}"
        );
    }
    assert!(!g["uring"].contains("pool") && !g["pool"].contains("uring"));
}

/// The checker itself finds a cycle when there is one.
fn the_checker_sees_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("kx-modgraph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("f")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a; mod f;").unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::f::x;").unwrap();
    std::fs::write(dir.join("f/mod.rs"), "mod x; mod y;").unwrap();
    std::fs::write(
        dir.join("f/x.rs"),
        "use super::y::Y; // crate::a in a comment",
    )
    .unwrap();
    std::fs::write(
        dir.join("f/y.rs"),
        "use super::{x::X, z};\n#[cfg(test)]\nmod tests { use crate::a; }",
    )
    .unwrap();
    let (top, folders) = graphs(&dir);
    assert_eq!(cycle(&top), None, "{top:?}");
    assert_eq!(
        cycle(&folders["f"]),
        Some(vec!["x".into(), "y".into(), "x".into()])
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

harness::main!(
    tests: [
        no_import_cycle_in_the_servers,
        no_import_cycle_anywhere_in_src,
        the_io_engine_sits_below_backend,
        the_checker_sees_a_planted_cycle,
    ],
);
