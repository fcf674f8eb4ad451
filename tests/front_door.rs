//! The README stays a front door: short enough to read in five minutes,
//! its first code block the two commands a newcomer runs, and every page
//! it sends readers to there. Every benchmark page in `docs/` names the
//! command that reproduces it; every local link of the README,
//! `ARCHITECTURE.md`, `docs/` and the crates' READMEs resolves to a file,
//! inside the package when the page is packaged (a link out of it is the
//! repository's absolute address, which names a file of the repository);
//! no link goes to a registry page the crate does not have; the README says
//! how to depend on the crate today and which tools the full test suite
//! uses; its commands leave nothing in the clone; every manifest names the
//! repository; a skipped test says why; no text names an issue or a branch;
//! the CHANGELOG's `[Unreleased]` has one heading of each kind.
//!
//! Each check is a function over text, tried first on planted bad input
//! (so a checker that passes everything fails here), then on the real
//! files. A check that needs the repository (files a packaged crate leaves
//! out) reports itself ignored in a packaged crate. Run with
//! `cargo test --test front_door`.

mod harness;

use std::path::{Path, PathBuf};

/// The README's longest allowed length, in lines.
const MAX_README_LINES: usize = 320;

/// The commands the README's first code block must hold, in order.
const TWO_COMMANDS: [&str; 2] = ["cargo run --release --example fio", "cargo test"];

/// A fenced code block: its info string (`sh`, `rust,ignore`, empty) and
/// its lines.
#[derive(Debug)]
struct Block {
    info: String,
    lines: Vec<String>,
}

/// The fenced code blocks of a Markdown text (fences of three or more
/// backticks or tildes, closed by the same kind of fence).
fn blocks(text: &str) -> Vec<Block> {
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
fn commands(b: &Block) -> Vec<String> {
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
fn is_shell(b: &Block) -> bool {
    matches!(
        b.info.as_str(),
        "" | "sh" | "bash" | "shell" | "console" | "text"
    )
}

/// Problems with the README as a front door.
fn readme_problems(text: &str) -> Vec<String> {
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
fn names_a_command(text: &str) -> bool {
    blocks(text).iter().filter(|b| is_shell(b)).any(|b| {
        commands(b).iter().any(|c| {
            c.split_whitespace()
                .any(|w| w == "cargo" || w.contains("scripts/") || w == ".ci/run")
        })
    })
}

/// The link targets of a Markdown text (`[text](target)`), outside code
/// blocks, without their `#anchor` part; pure anchors left out.
fn links(text: &str) -> Vec<String> {
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
fn local_links(text: &str) -> Vec<String> {
    links(text)
        .into_iter()
        .filter(|l| !l.contains("://") && !l.starts_with("mailto:"))
        .collect()
}

/// `dir/link` with `.` and `..` resolved, relative to the root; `None`
/// when it climbs out of the root.
fn normalize(dir: &Path, link: &str) -> Option<PathBuf> {
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
struct Repo {
    /// The `repository` of the root manifest, without a trailing `/`.
    url: String,
    /// The package's `exclude` list (paths left out of `cargo package`).
    excluded: Vec<String>,
}

impl Repo {
    /// Whether `rel` (relative to the root) is left out of the package.
    fn is_excluded(&self, rel: &Path) -> bool {
        let r = rel.to_string_lossy();
        self.excluded
            .iter()
            .any(|e| r == e.trim_end_matches('/') || r.starts_with(e.as_str()))
    }

    /// The repository path an absolute link names, if it is one of the
    /// repository's files or directories (`URL/blob/main/PATH`).
    fn path_of<'a>(&self, link: &'a str) -> Option<&'a str> {
        let rest = link.strip_prefix(self.url.as_str())?;
        rest.strip_prefix("/blob/main/")
            .or_else(|| rest.strip_prefix("/tree/main/"))
    }
}

/// The registry pages of a crate that is not published yet.
const UNPUBLISHED: [&str; 3] = [
    "docs.rs/kxarray",
    "crates.io/crates/kxarray",
    "lib.rs/crates/kxarray",
];

/// Problems of the links of `text` (the page at `path`, relative to the
/// repository root `root`): local links naming no file, local links out of
/// the package from a packaged page, registry pages of the unpublished
/// crate, and, with `repo_files`, absolute links into the repository
/// naming no file of it.
fn link_problems(
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

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether this is a packaged crate (`cargo package` writes
/// `Cargo.toml.orig` beside the normalized manifest).
fn packaged() -> bool {
    root().join("Cargo.toml.orig").exists()
}

/// Skip the running test in a packaged crate, which lacks what it checks.
fn needs_the_repository(what: &str) {
    if packaged() {
        harness::skip_now(format!(
            "a packaged crate has no {what} (left out of the package): run it in a clone"
        ));
    }
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The root manifest as written (`Cargo.toml.orig` in a packaged crate).
fn manifest() -> String {
    if packaged() {
        read("Cargo.toml.orig")
    } else {
        read("Cargo.toml")
    }
}

/// The value of `key = "..."` in a manifest's text (first occurrence).
fn manifest_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix(key)?.trim_start().strip_prefix('=')?;
        Some(v.trim().trim_matches('"').to_string())
    })
}

fn repo() -> Repo {
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
fn doc_pages() -> Vec<PathBuf> {
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
fn crate_dirs() -> Vec<PathBuf> {
    ["", "kxarray-nbd", "kxarray-sqlite", "bench-peers", "fuzz"]
        .iter()
        .map(PathBuf::from)
        .filter(|d| root().join(d).join("Cargo.toml").exists())
        .collect()
}

/// Every page a reader is sent to: the READMEs, `ARCHITECTURE.md`, the
/// CHANGELOG and `docs/`.
fn pages() -> Vec<PathBuf> {
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
fn section<'a>(text: &'a str, title: &str) -> Option<&'a str> {
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
fn use_problems(readme: &str) -> Vec<String> {
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
fn apt_packages(text: &str) -> Vec<String> {
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
fn tools_needed(src: &str) -> Vec<(String, String)> {
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
fn test_sources() -> Vec<(PathBuf, String)> {
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
fn harness_false_tests(manifest: &str) -> Vec<String> {
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
fn skip_problems(path: &Path, src: &str, harness_false: bool) -> Vec<String> {
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
fn leftover_problems(path: &Path, text: &str) -> Vec<String> {
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
fn fuzz_run_problems(path: &Path, text: &str) -> Vec<String> {
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
fn ignores(gitignore: &str, name: &str) -> bool {
    gitignore
        .lines()
        .map(str::trim)
        .any(|pat| match pat.strip_prefix('*') {
            Some(suffix) => name.ends_with(suffix),
            None => pat == name,
        })
}

/// The dependency names of the `kxarray` package in a `Cargo.lock` text.
fn locked_deps_of_kxarray(lock: &str) -> Option<Vec<String>> {
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
fn normal_deps(manifest: &str) -> Vec<String> {
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
fn history_references(text: &str) -> Vec<(usize, String)> {
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
fn text_files() -> Vec<PathBuf> {
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
const CHANGE_KINDS: [&str; 6] = [
    "Added",
    "Changed",
    "Deprecated",
    "Removed",
    "Fixed",
    "Security",
];

/// Problems of a CHANGELOG's `[Unreleased]` section: a `###` heading that
/// is not one of [`CHANGE_KINDS`], or one kind twice.
fn changelog_problems(text: &str) -> Vec<String> {
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
const MAX_SQLITE_DOC_LINES: usize = 440;

fn the_checks_reject_planted_problems() {
    let good = "# x\n\n```sh\n# the demo\ncargo run --release --example fio\n\n# the tests\ncargo test\n```\n";
    assert!(
        readme_problems(good).is_empty(),
        "{:?}",
        readme_problems(good)
    );
    let long = format!("{good}{}", "line\n".repeat(MAX_README_LINES));
    assert_eq!(readme_problems(&long).len(), 1);
    let extra = good.replace("cargo test\n", "cargo test\ncargo bench\n");
    assert_eq!(readme_problems(&extra).len(), 1);
    let other_first = format!("```rust\nlet x = 1;\n```\n{good}");
    assert_eq!(readme_problems(&other_first).len(), 1);
    assert_eq!(readme_problems("# no code\n").len(), 1);

    assert!(names_a_command(
        "# t\n\n```sh\nKX=1 cargo bench --bench xarray\n```\n"
    ));
    assert!(names_a_command(
        "```\nkxarray-nbd/scripts/nbd-bench.sh 3 3 512M\n```\n"
    ));
    assert!(!names_a_command("# t\n\nRun `cargo bench`.\n"));
    assert!(!names_a_command(
        "```rust\n// cargo test\nlet cargo = 1;\n```\n"
    ));
    assert!(!names_a_command("```sh\n# cargo test\n```\n"));

    // links
    let dir = std::env::temp_dir().join(format!("kx-front-door-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("docs/a.md"), "").unwrap();
    std::fs::write(dir.join("sub/b.md"), "").unwrap();
    let repo = Repo {
        url: "https://example.org/kx".into(),
        excluded: vec!["sub/".into()],
    };
    let text = "[a](docs/a.md#x) [b](docs/b.md) [web](https://x.org/y.md) [anchor](#z)\n\
                [out](sub/b.md) [abs](https://example.org/kx/blob/main/sub/b.md) \
                [gone](https://example.org/kx/blob/main/sub/c.md) [dead](https://docs.rs/kxarray)\n\
                ```\n[not a link](docs/c.md)\n```\n";
    let p = link_problems(&dir, Path::new("README.md"), text, &repo, true);
    assert_eq!(p.len(), 4, "{p:#?}");
    assert!(p[0].contains("broken link `docs/b.md`"), "{p:?}");
    assert!(
        p[1].contains("leaves the package: link https://example.org/kx/blob/main/sub/b.md"),
        "{p:?}"
    );
    assert!(p[2].contains("names no file"), "{p:?}");
    assert!(p[3].contains("not on crates.io"), "{p:?}");
    // a page out of the package may link within the repository
    let sub = link_problems(
        &dir,
        Path::new("sub/README.md"),
        "[b](b.md) [a](../docs/a.md)",
        &repo,
        true,
    );
    assert!(sub.is_empty(), "{sub:?}");
    assert_eq!(
        link_problems(&dir, Path::new("README.md"), "[x](../up.md)", &repo, true).len(),
        1
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // the Use section
    let ok = "## Use\n\nNot published: not on crates.io yet.\n\n```sh\ncargo add --path ../kxarray\n```\n## Next\n";
    assert!(use_problems(ok).is_empty(), "{:?}", use_problems(ok));
    assert_eq!(
        use_problems("## Use\n\n```sh\ncargo add kxarray\n```\n").len(),
        3
    );
    assert_eq!(use_problems("# x\n").len(), 1);

    // tools, skips, leftovers, locks, history, the CHANGELOG
    assert_eq!(
        apt_packages("x\n    apt-get install -y sqlite3 fio # tools\n"),
        ["sqlite3", "fio"]
    );
    assert_eq!(
        tools_needed(
            "let s = harness::tool(\"sqlite3\", \"sqlite3\"); harness::tool(\"nm\", \"binutils\")"
        ),
        [
            ("sqlite3".to_string(), "sqlite3".to_string()),
            ("nm".into(), "binutils".into())
        ]
    );
    let m = "[[test]]\nname = \"a\"\nharness = false\n\n[[test]]\nname = \"b\"\n\n[dependencies]\nx = \"1\"\n";
    assert_eq!(harness_false_tests(m), ["a"]);
    assert_eq!(normal_deps(m), ["x"]);
    let src = "#[test]\n#[ignore]\nfn a() {}\n#[test]\n#[ignore = \"why\"]\nfn b() {}\n";
    assert_eq!(skip_problems(Path::new("t.rs"), src, false).len(), 1);
    assert_eq!(skip_problems(Path::new("t.rs"), src, true).len(), 3);
    let cmd = "```sh\nsqlite3 -cmd \".open 'file:test.db?vfs=kxarray'\"\nsqlite3 -cmd \".open 'file:/tmp/t.db?vfs=kxarray'\"\n```\n";
    assert_eq!(leftover_problems(Path::new("README.md"), cmd).len(), 1);
    assert!(ignores("/target\n*.db\n", "test.db") && !ignores("/target\n", "test.db"));
    let fz = "```sh\ncd fuzz && cargo +nightly fuzz run api -- -max_total_time=300\n\
              cargo fuzz run api corpus/api\ncargo fuzz run api /tmp/c corpus/api -- -runs=9\n```\n";
    assert_eq!(fuzz_run_problems(Path::new("t.md"), fz).len(), 2);
    let lock = "[[package]]\nname = \"kxarray\"\nversion = \"0.1.0\"\ndependencies = [\n \"libc\",\n \"log 0.4.1\",\n]\n";
    assert_eq!(locked_deps_of_kxarray(lock).unwrap(), ["libc", "log"]);
    let i = ["iss", "ue"].concat();
    for bad in [
        format!("see {i} 38"),
        format!("({i}s 36 and 37)"),
        format!("the {i}-8 defects"),
        format!("{i} #12"),
        ["merge h3", "8-wal"].concat(),
        ["se", "ed 004"].concat(),
    ] {
        assert_eq!(history_references(&bad).len(), 1, "{bad}");
    }
    for fine in [
        "an issue with 3 parts",
        "GitHub issues",
        "h2 headings",
        "the h-index",
        "shape",
    ] {
        assert!(history_references(fine).is_empty(), "{fine}");
    }
    let cl = "# C\n\n## [Unreleased]\n\n### Added\n\n- a\n\n### Changed\n\n- b\n\n### Added\n\n### Round two\n\n## [0.1.0]\n\n### Added\n";
    assert_eq!(
        changelog_problems(cl).len(),
        2,
        "{:?}",
        changelog_problems(cl)
    );
    assert_eq!(
        section("# A\n## Use\nx\n### Sub\ny\n## Next\nz\n", "Use"),
        Some("x\n### Sub\ny\n")
    );
    assert_eq!(
        section("## Use\n```sh\n# a comment\n```\n## B\n", "Use"),
        Some("```sh\n# a comment\n```\n")
    );
}

fn readme_is_a_front_door() {
    let readme = read("README.md");
    let mut problems = readme_problems(&readme);
    problems.extend(use_problems(&readme));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn every_docs_page_names_its_command() {
    let pages = doc_pages();
    assert!(!pages.is_empty(), "docs/ has no page");
    let missing: Vec<_> = pages
        .iter()
        .filter(|p| !names_a_command(&read(p.to_str().unwrap())))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages that name no reproducing command (a shell block with `cargo` or `scripts/`): {missing:?}"
    );
}

/// Local links resolve (inside the package from a packaged page), and no
/// link goes to a registry page the crate does not have.
fn every_local_link_resolves() {
    let repo = repo();
    let mut broken = Vec::new();
    for f in pages() {
        broken.extend(link_problems(
            &root(),
            &f,
            &read(f.to_str().unwrap()),
            &repo,
            false,
        ));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    // The README sends readers to every docs/ page.
    let readme = read("README.md");
    let linked = local_links(&readme);
    let unlinked: Vec<_> = doc_pages()
        .into_iter()
        .map(|p| p.to_str().unwrap().to_string())
        .filter(|p| !linked.contains(p))
        .collect();
    assert!(
        unlinked.is_empty(),
        "docs/ pages the README does not link: {unlinked:?}"
    );
}

/// A link out of the package (the repository's address) names a file of
/// the repository.
fn links_out_of_the_package_name_files_of_the_repository() {
    needs_the_repository("sub-crates to link to");
    let repo = repo();
    let mut broken = Vec::new();
    let mut seen = 0;
    for f in pages() {
        let text = read(f.to_str().unwrap());
        seen += links(&text)
            .iter()
            .filter(|l| repo.path_of(l).is_some())
            .count();
        broken.extend(link_problems(&root(), &f, &text, &repo, true));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    assert!(seen > 0, "no link into the repository checked");
}

/// Every manifest names the repository and a homepage.
fn every_manifest_names_the_repository() {
    let url = repo().url;
    for d in crate_dirs() {
        let m = if d.as_os_str().is_empty() {
            manifest()
        } else {
            read(d.join("Cargo.toml").to_str().unwrap())
        };
        for key in ["repository", "homepage"] {
            let v = manifest_value(&m, key);
            assert!(
                v.as_deref().is_some_and(|v| v.starts_with(&url)),
                "{}/Cargo.toml: {key} = {v:?}, not the repository {url}",
                d.display()
            );
        }
        assert!(manifest_value(&m, "documentation")
            .is_none_or(|v| !UNPUBLISHED.iter().any(|u| v.contains(u))));
    }
}

/// A test ignored says why, and a `harness = false` binary runs every
/// test it has.
fn skipped_tests_say_why() {
    let mut harness_false = Vec::new();
    for d in crate_dirs() {
        let m = read(d.join("Cargo.toml").to_str().unwrap());
        for t in harness_false_tests(&m) {
            harness_false.push(d.join("tests").join(format!("{t}.rs")));
        }
    }
    let sources = test_sources();
    assert!(sources.len() > 20, "{} test files", sources.len());
    let mut p = Vec::new();
    for (path, src) in &sources {
        p.extend(skip_problems(path, src, harness_false.contains(path)));
    }
    assert!(p.is_empty(), "{}", p.join("\n"));
}

/// Packages every Debian system has (`Essential: yes`).
const ESSENTIAL: [&str; 1] = ["coreutils"];

/// The README's `apt-get install` line names every tool a test skips
/// without (but those of every Debian system).
fn the_readme_names_the_tools_the_tests_use() {
    let readme = read("README.md");
    let mut listed = apt_packages(&readme);
    assert!(
        !listed.is_empty(),
        "README.md has no `apt-get install -y` line"
    );
    listed.extend(ESSENTIAL.map(String::from));
    let mut missing = Vec::new();
    for (path, src) in test_sources() {
        for (tool, pkg) in tools_needed(&src) {
            if !listed.contains(&pkg) {
                missing.push(format!("{}: {tool} ({pkg})", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "packages the README's apt-get line lacks: {missing:?}"
    );
}

/// The READMEs' commands write nothing into the clone, and what SQLite
/// leaves beside a database is ignored by git anyway.
fn the_readmes_commands_leave_nothing_in_the_clone() {
    let mut p = Vec::new();
    for f in pages() {
        let text = read(f.to_str().unwrap());
        if f.file_name().is_some_and(|n| n == "README.md") {
            p.extend(leftover_problems(&f, &text));
        }
        p.extend(fuzz_run_problems(&f, &text));
    }
    assert!(p.is_empty(), "{}", p.join("\n"));
    needs_the_repository(".gitignore");
    let gi = read(".gitignore");
    for name in ["test.db", "test.db-journal", "test.db-wal", "test.db-shm"] {
        assert!(ignores(&gi, name), ".gitignore does not ignore {name}");
    }
}

/// `fuzz/Cargo.lock` locks what the library depends on now, so `cargo
/// fuzz` does not rewrite it.
fn the_fuzz_lock_file_is_current() {
    needs_the_repository("fuzz/");
    let lock = read("fuzz/Cargo.lock");
    let locked = locked_deps_of_kxarray(&lock).expect("kxarray in fuzz/Cargo.lock");
    let wanted = normal_deps(&manifest());
    assert_eq!(
        locked, wanted,
        "fuzz/Cargo.lock is stale: run `cargo update -p kxarray --manifest-path fuzz/Cargo.toml`"
    );
}

/// No text of the project names an issue, a branch or a seed of its
/// history: the docs describe the software, the CHANGELOG what changed.
fn no_issue_numbers_or_branch_names() {
    let mut found = Vec::new();
    let files = text_files();
    assert!(files.len() > 50, "{} files", files.len());
    for f in files {
        let Ok(text) = std::fs::read_to_string(root().join(&f)) else {
            continue;
        };
        for (n, line) in history_references(&text) {
            found.push(format!("{}:{n}: {line}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "{} lines name an issue or a branch:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The SQLite page describes the VFS, briefly enough to read.
fn the_sqlite_page_is_short() {
    let n = read("docs/sqlite.md").lines().count();
    assert!(
        n <= MAX_SQLITE_DOC_LINES,
        "docs/sqlite.md has {n} lines, more than {MAX_SQLITE_DOC_LINES}"
    );
}

/// Keep a Changelog's form: one heading of each kind under `[Unreleased]`.
fn the_changelog_has_one_heading_of_each_kind() {
    let p = changelog_problems(&read("CHANGELOG.md"));
    assert!(p.is_empty(), "{}", p.join("\n"));
}

harness::main!(
    tests: [
        the_checks_reject_planted_problems,
        readme_is_a_front_door,
        every_docs_page_names_its_command,
        every_local_link_resolves,
        links_out_of_the_package_name_files_of_the_repository,
        every_manifest_names_the_repository,
        skipped_tests_say_why,
        the_readme_names_the_tools_the_tests_use,
        the_readmes_commands_leave_nothing_in_the_clone,
        the_fuzz_lock_file_is_current,
        no_issue_numbers_or_branch_names,
        the_sqlite_page_is_short,
        the_changelog_has_one_heading_of_each_kind,
    ],
);
