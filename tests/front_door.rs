//! The README stays a front door (issue 25): short enough to read in five
//! minutes, its first code block the two commands a newcomer runs, and
//! every page it sends readers to there. Every benchmark page in `docs/`
//! names the command that reproduces it, and every local link in the
//! README, `ARCHITECTURE.md` and `docs/` resolves to a file.
//!
//! Each check is a function over text, tried first on planted bad input
//! (so a checker that passes everything fails here), then on the real
//! files. Run with `cargo test --test front_door`.

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

/// The local link targets of a Markdown text (`[text](target)`, without
/// URLs, pure anchors and the `#anchor` part).
fn local_links(text: &str) -> Vec<String> {
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
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            out.push(path.to_string());
        }
    }
    out
}

/// Links of `file` (at `path`, relative to the repository root `root`)
/// that name no existing file or directory.
fn broken_links(root: &Path, path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().unwrap_or(Path::new(""));
    local_links(text)
        .into_iter()
        .filter(|l| !root.join(dir).join(l).exists())
        .map(|l| format!("{}: broken link `{l}`", path.display()))
        .collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
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

#[test]
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

    let dir = std::env::temp_dir().join(format!("kx-front-door-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/a.md"), "").unwrap();
    let text = "[a](docs/a.md#x) [b](docs/b.md) [web](https://x.org/y.md) [anchor](#z)\n\
                ```\n[not a link](docs/c.md)\n```\n";
    let broken = broken_links(&dir, Path::new("README.md"), text);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken, ["README.md: broken link `docs/b.md`"]);
}

#[test]
fn readme_is_a_front_door() {
    let problems = readme_problems(&read("README.md"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
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

#[test]
fn every_local_link_resolves() {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    files.extend(doc_pages());
    let mut broken = Vec::new();
    for f in &files {
        broken.extend(broken_links(&root(), f, &read(f.to_str().unwrap())));
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
