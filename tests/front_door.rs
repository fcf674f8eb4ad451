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

mod front_door_checks;

use front_door_checks::*;
use std::path::Path;

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
        ["(se", "ed `000_bc9e.txt`)"].concat(),
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
