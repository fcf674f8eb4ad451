//! The checks of `tests/front_door.rs`, each a function over text (a
//! Markdown page, a manifest, a lock file, a test source) that returns what
//! is wrong with it, and the helpers that find the repository's files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The README's longest allowed length, in lines.
pub(crate) const MAX_README_LINES: usize = 320;

/// The commands the README's first code block must hold, in order.
pub(crate) const TWO_COMMANDS: [&str; 2] = ["cargo run --release --example fio", "cargo test"];

/// A fenced code block: its info string (`sh`, `rust,ignore`, empty) and
/// its lines.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) info: String,
    pub(crate) lines: Vec<String>,
}

/// The fenced code blocks of a Markdown text (fences of three or more
/// backticks or tildes, closed by the same kind of fence).
pub(crate) fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, Block)> = None;
    for line in text.lines() {
        let t = line.trim_start();
        let fence: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
        let is_fence =
            fence.len() >= 3 && fence.chars().all(|c| c == fence.chars().next().unwrap());
        match open.take() {
            None if is_fence => {
                let info = t[fence.len()..].trim().to_string();
                open = Some((
                    fence,
                    Block {
                        info,
                        lines: Vec::new(),
                    },
                ));
            }
            None => {}
            Some((f, b))
                if is_fence && fence.starts_with(&f) && t[fence.len()..].trim().is_empty() =>
            {
                out.push(b);
            }
            Some((f, mut b)) => {
                b.lines.push(line.to_string());
                open = Some((f, b));
            }
        }
    }
    out
}

/// The commands of a shell block: its lines without comments, blank lines
/// and continuation lines (a line after one ending in `\`).
pub(crate) fn commands(b: &Block) -> Vec<String> {
    let mut out = Vec::new();
    let mut continued = false;
    for l in &b.lines {
        let t = l.trim();
        let was_continued = continued;
        continued = t.ends_with('\\');
        if was_continued || t.is_empty() || t.starts_with('#') {
            continue;
        }
        out.push(t.to_string());
    }
    out
}

/// Whether a block is shell (or plain text) rather than code in a language.
pub(crate) fn is_shell(b: &Block) -> bool {
    matches!(
        b.info.as_str(),
        "" | "sh" | "bash" | "shell" | "console" | "text"
    )
}

/// Problems with the README as a front door.
pub(crate) fn readme_problems(text: &str) -> Vec<String> {
    let mut p = Vec::new();
    let n = text.lines().count();
    if n > MAX_README_LINES {
        p.push(format!(
            "README.md has {n} lines, more than {MAX_README_LINES}"
        ));
    }
    match blocks(text).first() {
        None => p.push("README.md has no code block".into()),
        Some(b) => {
            let got = commands(b);
            if got != TWO_COMMANDS {
                p.push(format!(
                    "README.md's first code block must hold exactly the two commands {TWO_COMMANDS:?}, has {got:?}"
                ));
            }
        }
    }
    p
}

/// Whether a page names a command that reproduces it: a shell block with a
/// `cargo` command or a script of the repository.
pub(crate) fn names_a_command(text: &str) -> bool {
    blocks(text).iter().filter(|b| is_shell(b)).any(|b| {
        commands(b).iter().any(|c| {
            c.split_whitespace()
                .any(|w| w == "cargo" || w.contains("scripts/") || w == ".ci/run")
        })
    })
}

/// The link targets of a Markdown text (`[text](target)`), outside code
/// blocks, without their `#anchor` part; pure anchors left out.
pub(crate) fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            rest = &rest[end..];
            let path = target.split('#').next().unwrap_or("");
            if !path.is_empty() {
                out.push(path.to_string());
            }
        }
    }
    out
}

/// The local link targets of a Markdown text (no URLs, no `mailto:`).
pub(crate) fn local_links(text: &str) -> Vec<String> {
    links(text)
        .into_iter()
        .filter(|l| !l.contains("://") && !l.starts_with("mailto:"))
        .collect()
}

/// `dir/link` with `.` and `..` resolved, relative to the root; `None`
/// when it climbs out of the root.
pub(crate) fn normalize(dir: &Path, link: &str) -> Option<PathBuf> {
    let mut out = Vec::new();
    for c in dir.join(link).components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop()?;
            }
            std::path::Component::Normal(n) => out.push(n.to_os_string()),
            _ => {}
        }
    }
    Some(out.iter().collect())
}

/// What the link checks need to know of the repository.
pub(crate) struct Repo {
    /// The `repository` of the root manifest, without a trailing `/`.
    pub(crate) url: String,
    /// The package's `exclude` list (paths left out of `cargo package`).
    pub(crate) excluded: Vec<String>,
}

impl Repo {
    /// Whether `rel` (relative to the root) is left out of the package.
    pub(crate) fn is_excluded(&self, rel: &Path) -> bool {
        let r = rel.to_string_lossy();
        self.excluded
            .iter()
            .any(|e| r == e.trim_end_matches('/') || r.starts_with(e.as_str()))
    }

    /// The repository path an absolute link names, if it is one of the
    /// repository's files or directories (`URL/blob/main/PATH`).
    pub(crate) fn path_of<'a>(&self, link: &'a str) -> Option<&'a str> {
        let rest = link.strip_prefix(self.url.as_str())?;
        rest.strip_prefix("/blob/main/")
            .or_else(|| rest.strip_prefix("/tree/main/"))
    }
}

/// The registry pages of a crate that is not published yet.
pub(crate) const UNPUBLISHED: [&str; 3] = [
    "docs.rs/kxarray",
    "crates.io/crates/kxarray",
    "lib.rs/crates/kxarray",
];

/// Problems of the links of `text` (the page at `path`, relative to the
/// repository root `root`): local links naming no file, local links out of
/// the package from a packaged page, registry pages of the unpublished
/// crate, and, with `repo_files`, absolute links into the repository
/// naming no file of it.
pub(crate) fn link_problems(
    root: &Path,
    path: &Path,
    text: &str,
    repo: &Repo,
    repo_files: bool,
) -> Vec<String> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let page_packaged = !repo.is_excluded(path);
    let mut p = Vec::new();
    for l in links(text) {
        let here = path.display();
        if UNPUBLISHED.iter().any(|u| l.contains(u)) {
            p.push(format!("{here}: `{l}`: the crate is not on crates.io yet"));
        } else if let Some(rel) = repo.path_of(&l) {
            if repo_files && !root.join(rel).exists() {
                p.push(format!("{here}: `{l}` names no file of the repository"));
            }
        } else if l.contains("://") || l.starts_with("mailto:") {
        } else {
            match normalize(dir, &l) {
                None => p.push(format!("{here}: `{l}` climbs out of the repository")),
                Some(rel) if !root.join(&rel).exists() => {
                    p.push(format!("{here}: broken link `{l}`"))
                }
                Some(rel) if page_packaged && repo.is_excluded(&rel) => p.push(format!(
                    "{here}: `{l}` leaves the package: link {}/blob/main/{}",
                    repo.url,
                    rel.display()
                )),
                Some(_) => {}
            }
        }
    }
    p
}

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether this is a packaged crate (`cargo package` writes
/// `Cargo.toml.orig` beside the normalized manifest).
pub(crate) fn packaged() -> bool {
    root().join("Cargo.toml.orig").exists()
}

/// Skip the running test in a packaged crate, which lacks what it checks.
pub(crate) fn needs_the_repository(what: &str) {
    if packaged() {
        crate::harness::skip_now(format!(
            "a packaged crate has no {what} (left out of the package): run it in a clone"
        ));
    }
}

pub(crate) fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The root manifest as written (`Cargo.toml.orig` in a packaged crate).
pub(crate) fn manifest() -> String {
    if packaged() {
        read("Cargo.toml.orig")
    } else {
        read("Cargo.toml")
    }
}

/// The value of `key = "..."` in a manifest's text (first occurrence).
pub(crate) fn manifest_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix(key)?.trim_start().strip_prefix('=')?;
        Some(v.trim().trim_matches('"').to_string())
    })
}

pub(crate) fn repo() -> Repo {
    let m = manifest();
    let url = manifest_value(&m, "repository").expect("the manifest names its repository");
    let excluded = manifest_value(&m, "exclude")
        .map(|v| {
            v.trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|e| e.trim().trim_matches('"').to_string())
                .filter(|e| !e.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Repo {
        url: url.trim_end_matches('/').to_string(),
        excluded,
    }
}

/// The Markdown pages under `docs/`, as paths relative to the root.
pub(crate) fn doc_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    pages.sort();
    pages
}

/// The crates of the workspace present here: the root, and the members
/// a clone has (a packaged crate has only the root).
pub(crate) fn crate_dirs() -> Vec<PathBuf> {
    ["", "kxarray-nbd", "kxarray-sqlite", "bench-peers", "fuzz"]
        .iter()
        .map(PathBuf::from)
        .filter(|d| root().join(d).join("Cargo.toml").exists())
        .collect()
}

/// Every page a reader is sent to: the READMEs, `ARCHITECTURE.md`, the
/// CHANGELOG and `docs/`.
pub(crate) fn pages() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("CHANGELOG.md"),
    ];
    for d in crate_dirs() {
        let r = d.join("README.md");
        if !d.as_os_str().is_empty() && root().join(&r).exists() {
            files.push(r);
        }
    }
    files.extend(doc_pages());
    files
}

/// The section of a Markdown text under the heading `title` (any level),
/// up to the next heading of the same or a higher level.
pub(crate) fn section<'a>(text: &'a str, title: &str) -> Option<&'a str> {
    let mut start = None;
    let mut level = 0;
    let mut offset = 0;
    let mut in_code = false;
    for line in text.split_inclusive('\n') {
        if line.starts_with("```") || line.starts_with("~~~") {
            in_code = !in_code;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let is_heading = !in_code && hashes > 0 && line[hashes..].starts_with(' ');
        match start {
            None if is_heading && line[hashes..].trim() == title => {
                start = Some(offset + line.len());
                level = hashes;
            }
            Some(s) if is_heading && hashes <= level => return Some(&text[s..offset]),
            _ => {}
        }
        offset += line.len();
    }
    start.map(|s| &text[s..])
}

/// Problems of the README's "Use" section: it must say the crate is not
/// on crates.io yet and give a dependency that works today (a path or git
/// dependency), never a bare `cargo add kxarray`.
pub(crate) fn use_problems(readme: &str) -> Vec<String> {
    let Some(u) = section(readme, "Use") else {
        return vec!["README.md has no \"Use\" section".into()];
    };
    let mut p = Vec::new();
    if !u.contains("not on crates.io yet") {
        p.push("README.md's Use section does not say the crate is not on crates.io yet".into());
    }
    let works_today = |l: &str| {
        l.contains("--path") || l.contains("--git") || l.contains("path =") || l.contains("git =")
    };
    for b in blocks(u) {
        for c in commands(&b) {
            if c.starts_with("cargo add") && !works_today(&c) {
                p.push(format!("README.md: `{c}` needs crates.io"));
            }
        }
    }
    if !blocks(u)
        .iter()
        .any(|b| b.lines.iter().any(|l| works_today(l)))
    {
        p.push("README.md's Use section gives no path or git dependency".into());
    }
    p
}

/// The packages of the `apt-get install -y` lines of a text.
pub(crate) fn apt_packages(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split("apt-get install -y ").nth(1))
        .flat_map(|rest| {
            rest.split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The (tool, package) pairs a test source skips without
/// (`harness::tool("sqlite3", "sqlite3")`).
pub(crate) fn tools_needed(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("harness::tool(\"") {
        rest = &rest[i + "harness::tool(\"".len()..];
        let mut parts = rest.splitn(4, '"');
        let (Some(tool), Some(_), Some(pkg)) = (parts.next(), parts.next(), parts.next()) else {
            break;
        };
        out.push((tool.to_string(), pkg.to_string()));
    }
    out
}

/// The test sources of the crates here (`tests/*.rs`, one level down
/// too), as (path relative to the root, text).
pub(crate) fn test_sources() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for d in crate_dirs() {
        let mut stack = vec![root().join(&d).join("tests")];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    out.push((p.strip_prefix(root()).unwrap().to_path_buf(), text));
                }
            }
        }
    }
    out.sort();
    out
}

/// The `[[test]]` targets a manifest declares with `harness = false`.
pub(crate) fn harness_false_tests(manifest: &str) -> Vec<String> {
    manifest
        .split("[[test]]")
        .skip(1)
        .filter(|t| {
            let t = t.split("\n[").next().unwrap_or("");
            t.lines().any(|l| l.replace(' ', "") == "harness=false")
        })
        .filter_map(|t| manifest_value(t, "name"))
        .collect()
}

/// Problems of a test source: an `#[ignore]` without its reason, and, in a
/// `harness = false` binary, a `#[test]` function its harness never runs.
pub(crate) fn skip_problems(path: &Path, src: &str, harness_false: bool) -> Vec<String> {
    let mut p = Vec::new();
    for (n, l) in src.lines().enumerate() {
        let t = l.trim();
        if t == "#[ignore]" {
            p.push(format!(
                "{}:{}: #[ignore] without a reason (#[ignore = \"why\"])",
                path.display(),
                n + 1
            ));
        }
        if harness_false && t == "#[test]" {
            p.push(format!(
                "{}:{}: #[test] in a harness = false binary never runs: list it in harness::main!",
                path.display(),
                n + 1
            ));
        }
    }
    p
}

/// Problems of what a README's commands leave in the clone: a database
/// opened by a relative name (`.open 'file:test.db?...'`) lands in the
/// clone.
pub(crate) fn leftover_problems(path: &Path, text: &str) -> Vec<String> {
    let mut p = Vec::new();
    for b in blocks(text).iter().filter(|b| is_shell(b)) {
        for l in &b.lines {
            let mut rest = l.as_str();
            while let Some(i) = rest.find("file:") {
                rest = &rest[i + 5..];
                let name: String = rest
                    .chars()
                    .take_while(|&c| c != '?' && c != '\'' && c != '"')
                    .collect();
                if !name.starts_with('/') && !name.starts_with('$') {
                    p.push(format!(
                        "{}: `file:{name}` writes into the clone: use an absolute path (/tmp/...)",
                        path.display()
                    ));
                }
            }
        }
    }
    p
}

/// Problems of a page's `cargo fuzz run` commands: one whose first corpus
/// directory (where libFuzzer writes new inputs) is not a scratch
/// directory outside the clone fills the tree with corpus files.
pub(crate) fn fuzz_run_problems(path: &Path, text: &str) -> Vec<String> {
    let mut p = Vec::new();
    for b in blocks(text).iter().filter(|b| is_shell(b)) {
        for c in commands(b) {
            let Some(rest) = c.split("fuzz run ").nth(1) else {
                continue;
            };
            let mut args = rest.split_whitespace().filter(|a| !a.starts_with('-'));
            let _target = args.next();
            match args.next() {
                Some(dir) if dir.starts_with('/') || dir.starts_with('$') => {}
                other => p.push(format!(
                    "{}: `{c}` writes new inputs into {}: give a scratch directory first",
                    path.display(),
                    other.map_or("fuzz/corpus/<target>".to_string(), str::to_string)
                )),
            }
        }
    }
    p
}

/// Whether a `.gitignore` text ignores a file named `name` (patterns
/// `*.ext`, `*suffix`, and plain names only).
pub(crate) fn ignores(gitignore: &str, name: &str) -> bool {
    gitignore
        .lines()
        .map(str::trim)
        .any(|pat| match pat.strip_prefix('*') {
            Some(suffix) => name.ends_with(suffix),
            None => pat == name,
        })
}

/// The dependency names of the `kxarray` package in a `Cargo.lock` text.
pub(crate) fn locked_deps_of_kxarray(lock: &str) -> Option<Vec<String>> {
    let pkg = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"kxarray\"\n"))?;
    let deps = pkg.split("dependencies = [").nth(1)?.split(']').next()?;
    let mut v: Vec<String> = deps
        .split(',')
        .map(|d| d.trim().trim_matches('"'))
        .filter(|d| !d.is_empty())
        .map(|d| d.split(' ').next().unwrap().to_string())
        .collect();
    v.sort();
    v.dedup();
    Some(v)
}

/// The names of a manifest's dependencies, every target's, dev and build
/// dependencies left out.
pub(crate) fn normal_deps(manifest: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut in_deps = false;
    for l in manifest.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            in_deps = t.ends_with("dependencies]")
                && !t.contains("dev-dependencies")
                && !t.contains("build-dependencies");
            continue;
        }
        if in_deps && !t.starts_with('#') {
            if let Some((name, _)) = t.split_once('=') {
                v.push(name.trim().to_string());
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

/// Where a text names an issue or a branch of this project's history
/// (an issue's number, a branch named `h`, digits, a dash and a word, a
/// seed's number), by line.
pub(crate) fn history_references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.to_ascii_lowercase();
        let b = l.as_bytes();
        let digit_after = |mut i: usize| {
            while i < b.len() && matches!(b[i], b' ' | b'-' | b'#') {
                i += 1;
            }
            i < b.len() && b[i].is_ascii_digit()
        };
        for (i, _) in l.match_indices("issue") {
            let mut j = i + 5;
            if b.get(j) == Some(&b's') {
                j += 1;
            }
            if j < b.len() && matches!(b[j], b' ' | b'-' | b'#') && digit_after(j) {
                out.push((n + 1, line.trim().to_string()));
            }
        }
        for (i, _) in l.match_indices("seed 0") {
            if b.get(i + 6).is_some_and(u8::is_ascii_digit) {
                out.push((n + 1, line.trim().to_string()));
            }
        }
        // a seed file (`000_bc9eebafdc41bc11.txt`)
        if l.contains(&["seed `", "0"].concat()) {
            out.push((n + 1, line.trim().to_string()));
        }
        // a branch name: h, digits, a dash, a letter, at a word start
        for i in 0..b.len() {
            let starts = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
            if starts && b[i] == b'h' {
                let d = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let k = i + 1 + d;
                if d > 0
                    && b.get(k) == Some(&b'-')
                    && b.get(k + 1).is_some_and(u8::is_ascii_lowercase)
                {
                    out.push((n + 1, line.trim().to_string()));
                }
            }
        }
    }
    out.dedup();
    out
}

/// The project's own text files (sources, scripts, docs, manifests), as
/// paths relative to the root; build output, fuzz data and `.git` left
/// out.
pub(crate) fn text_files() -> Vec<PathBuf> {
    let skip = [
        "target",
        ".git",
        "corpus",
        "found",
        "regressions",
        "artifacts",
    ];
    let mut out = Vec::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !skip.contains(&name.as_str()) {
                    stack.push(p);
                }
                continue;
            }
            let text_like = ["rs", "md", "sh", "py", "toml", "txt", "yml"]
                .iter()
                .any(|x| p.extension().is_some_and(|e| e == *x))
                || name == "run";
            if text_like && name != "Cargo.lock" {
                out.push(p.strip_prefix(root()).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The kinds of change Keep a Changelog names.
pub(crate) const CHANGE_KINDS: [&str; 6] = [
    "Added",
    "Changed",
    "Deprecated",
    "Removed",
    "Fixed",
    "Security",
];

/// Problems of a CHANGELOG's `[Unreleased]` section: a `###` heading that
/// is not one of [`CHANGE_KINDS`], or one kind twice.
pub(crate) fn changelog_problems(text: &str) -> Vec<String> {
    let Some(u) = text.split("## [Unreleased]").nth(1) else {
        return vec!["CHANGELOG.md has no [Unreleased] section".into()];
    };
    let u = u.split("\n## ").next().unwrap_or("");
    let mut seen = Vec::new();
    let mut p = Vec::new();
    for l in u.lines() {
        let Some(h) = l.strip_prefix("### ") else {
            continue;
        };
        let h = h.trim();
        if !CHANGE_KINDS.contains(&h) {
            p.push(format!(
                "CHANGELOG.md: [Unreleased] heading `{h}` is not one of {CHANGE_KINDS:?}"
            ));
        } else if seen.contains(&h) {
            p.push(format!("CHANGELOG.md: [Unreleased] has `### {h}` twice"));
        }
        seen.push(h);
    }
    p
}

/// The longest `docs/sqlite.md` may be: the page describes the VFS as it
/// is, its history is in the CHANGELOG.
pub(crate) const MAX_SQLITE_DOC_LINES: usize = 440;
