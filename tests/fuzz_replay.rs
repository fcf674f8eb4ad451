//! Replays the saved fuzz corpus (`fuzz/corpus/split_insert/`) and crash
//! regressions (`fuzz/regressions/split_insert/`) through the same harness
//! the `split_insert` fuzz target runs, so a plain `cargo test` checks them.

mod fuzz_common;

use fuzz_common::api;

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.expect("readable directory entry").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

fn replay(files: &[PathBuf], run: impl Fn(&[u8]) + std::panic::RefUnwindSafe) {
    for f in files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
        let r = std::panic::catch_unwind(|| run(&data));
        if let Err(e) = r {
            std::panic::resume_unwind(Box::new(format!(
                "fuzz input {} failed: {}",
                f.display(),
                e.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("(non-string panic)")
            )));
        }
    }
}

#[test]
fn replay_split_insert_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/split_insert");
    let files = inputs(&dir);
    assert!(
        !files.is_empty(),
        "fuzz corpus {} is missing or empty",
        dir.display()
    );
    replay(&files, fuzz_common::run_bytes);
}

#[test]
fn replay_split_insert_regressions() {
    // Optional: crash inputs saved after a fix (may not exist).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/split_insert");
    replay(&inputs(&dir), fuzz_common::run_bytes);
}

fn corpus(target: &str, kind: &str) -> Vec<PathBuf> {
    inputs(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/{kind}/{target}")))
}

#[test]
fn replay_api_corpus() {
    let files = corpus("api", "corpus");
    assert!(
        !files.is_empty(),
        "fuzz corpus fuzz/corpus/api is missing or empty"
    );
    let on = api::known_defect_ops(api::KNOWN_DEFECTS_FIXED);
    replay(&files, |d| api::run_bytes(d, on));
}

/// Inputs that reproduced a known issue-8 defect, replayed with the
/// defect-reaching operations on once `KNOWN_DEFECTS_FIXED` is set (until
/// then with their safe variants, which must pass).
#[test]
fn replay_api_regressions() {
    let on = api::known_defect_ops(api::KNOWN_DEFECTS_FIXED);
    replay(&corpus("api", "regressions"), |d| api::run_bytes(d, on));
}

/// The hand-written issue-8 seeds: each passes with its class off (the
/// safe variant), and with it on once `KNOWN_DEFECTS_FIXED`.
#[test]
fn replay_api_known_defect_seeds() {
    for (class, name, input) in api::known_defect_seeds() {
        let on = if api::KNOWN_DEFECTS_FIXED { class } else { 0 };
        let r = std::panic::catch_unwind(|| api::run(&input, on));
        assert!(r.is_ok(), "seed {name:?} failed");
    }
}

#[test]
fn replay_filemap_corpus() {
    let files = corpus("filemap", "corpus");
    assert!(
        !files.is_empty(),
        "fuzz corpus fuzz/corpus/filemap is missing or empty"
    );
    replay(&files, fuzz_common::filemap::run_bytes);
}

#[test]
fn replay_filemap_regressions() {
    replay(
        &corpus("filemap", "regressions"),
        fuzz_common::filemap::run_bytes,
    );
}

/// Debug aid: `[FUZZ_TARGET=api] FUZZ_INPUT=path cargo test --test fuzz_replay replay_one --
/// --nocapture` prints the decoded ops of one input, then runs it.
#[test]
fn replay_one() {
    let Some(path) = std::env::var_os("FUZZ_INPUT") else {
        return;
    };
    let data = std::fs::read(&path).expect("read FUZZ_INPUT");
    if std::env::var("FUZZ_TARGET").as_deref() == Ok("api") {
        let input = api::decode(&data).expect("decodes");
        println!("flags {}", input.flags);
        for (i, op) in input.ops.iter().enumerate().take(api::MAX_OPS) {
            println!("{i}: {op:?}");
        }
        api::run(&input, api::known_defect_ops(false));
        return;
    }
    match fuzz_common::decode(&data) {
        Some(ops) => {
            for (i, op) in ops.iter().enumerate().take(fuzz_common::MAX_OPS) {
                println!("{i}: {op:?}");
            }
            fuzz_common::run(&ops);
        }
        None => println!("input does not decode"),
    }
}
