//! Replays the saved fuzz corpora (`fuzz/corpus/<target>/`) and crash
//! regressions (`fuzz/regressions/<target>/`) through the same harnesses
//! the fuzz targets run, so a plain `cargo test` checks them. In a
//! packaged crate (`cargo package`), which leaves `fuzz/` out, these tests
//! report themselves ignored with that reason; in the repository a missing
//! corpus is a failure.

mod harness;

mod fuzz_common;

use fuzz_common::api;

use std::path::{Path, PathBuf};

/// Whether this is a packaged crate (`cargo package` writes
/// `Cargo.toml.orig` beside the normalized manifest).
fn packaged() -> bool {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("Cargo.toml.orig")
        .exists()
}

/// `fuzz/<kind>/<target>` of the repository; a packaged crate has no
/// `fuzz/`, and the test skips.
fn fuzz_dir(kind: &str, target: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if packaged() && !root.join("fuzz").exists() {
        harness::skip_now(
            "a packaged crate has no fuzz/ (the corpus stays in the repository): \
             run the tests in a clone",
        );
    }
    root.join(format!("fuzz/{kind}/{target}"))
}

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

fn replay_split_insert_corpus() {
    let dir = fuzz_dir("corpus", "split_insert");
    let files = inputs(&dir);
    assert!(
        !files.is_empty(),
        "fuzz corpus {} is missing or empty",
        dir.display()
    );
    replay(&files, fuzz_common::run_bytes);
}

fn replay_split_insert_regressions() {
    // Optional: crash inputs saved after a fix (may not exist).
    let dir = fuzz_dir("regressions", "split_insert");
    replay(&inputs(&dir), fuzz_common::run_bytes);
}

fn corpus(target: &str, kind: &str) -> Vec<PathBuf> {
    inputs(&fuzz_dir(kind, target))
}

fn replay_api_corpus() {
    let files = corpus("api", "corpus");
    assert!(
        !files.is_empty(),
        "fuzz corpus fuzz/corpus/api is missing or empty"
    );
    let on = api::known_defect_ops(api::KNOWN_DEFECTS_FIXED);
    replay(&files, |d| api::run_bytes(d, on));
}

/// Inputs that reproduced a known defect, replayed with the
/// defect-reaching operations on once `KNOWN_DEFECTS_FIXED` is set (until
/// then with their safe variants, which must pass).
fn replay_api_regressions() {
    let on = api::known_defect_ops(api::KNOWN_DEFECTS_FIXED);
    replay(&corpus("api", "regressions"), |d| api::run_bytes(d, on));
}

/// The hand-written known-defect seeds: each passes with its class off (the
/// safe variant), and with it on once `KNOWN_DEFECTS_FIXED`.
fn replay_api_known_defect_seeds() {
    for (class, name, input) in api::known_defect_seeds() {
        let on = if api::KNOWN_DEFECTS_FIXED { class } else { 0 };
        let r = std::panic::catch_unwind(|| api::run(&input, on));
        assert!(r.is_ok(), "seed {name:?} failed");
    }
}

fn replay_filemap_corpus() {
    let files = corpus("filemap", "corpus");
    assert!(
        !files.is_empty(),
        "fuzz corpus fuzz/corpus/filemap is missing or empty"
    );
    replay(&files, fuzz_common::filemap::run_bytes);
}

fn replay_filemap_regressions() {
    replay(
        &corpus("filemap", "regressions"),
        fuzz_common::filemap::run_bytes,
    );
}

/// Debug aid: `[FUZZ_TARGET=api] FUZZ_INPUT=path cargo test --test fuzz_replay replay_one --
/// --nocapture` prints the decoded ops of one input, then runs it.
fn replay_one() {
    let Some(path) = std::env::var_os("FUZZ_INPUT") else {
        harness::skip_now("a debug aid: FUZZ_INPUT=path replays one input");
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

harness::main!(
    tests: [
        replay_split_insert_corpus,
        replay_split_insert_regressions,
        replay_api_corpus,
        replay_api_regressions,
        replay_api_known_defect_seeds,
        replay_filemap_corpus,
        replay_filemap_regressions,
        replay_one,
    ],
);
