//! The server's cached backend in the shared memory budget: it joins by
//! default (a slot with its pid in the registry of its cgroup or machine,
//! in the user's runtime directory: here a private `XDG_RUNTIME_DIR` of
//! the test's own), `--no-budget` keeps it out, and a server killed with
//! SIGKILL has its slot freed by the next look (its life byte is gone).

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::process::spawn_unix;
use kxarray::ipc::RuntimeDir;
use kxarray::memory::{Registry, Scope};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The registry slots holding `pid` (the look frees dead members' slots).
fn slots_of(xdg: &Path, pid: u32) -> usize {
    let key = Scope::from_system().unwrap().key;
    let dir = RuntimeDir::locate(Some(xdg), Path::new("/nonexistent")).unwrap();
    let mut r = Registry::open(&dir, &key).unwrap();
    r.update(false, |t, _| {
        (false, t.slots.iter().filter(|s| s.pid == pid).count())
    })
    .unwrap()
}

fn the_cached_backend_joins_the_budget_unless_told_not_to() {
    let xdg = tempfile::tempdir().unwrap();
    std::fs::set_permissions(xdg.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let env = [("XDG_RUNTIME_DIR", xdg.path().to_str().unwrap())];
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let args = |file: &Path, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--size",
            "16M",
            "--backend",
            "cached",
            "--cache-size",
            "64M",
            "--file",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(file.display().to_string());
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let a_args = args(&a, &[]);
    let b_args = args(&b, &["--no-budget"]);
    let mut joined = spawn_unix(&a_args.iter().map(String::as_str).collect::<Vec<_>>(), &env);
    let fixed = spawn_unix(&b_args.iter().map(String::as_str).collect::<Vec<_>>(), &env);
    assert_eq!(slots_of(xdg.path(), joined.pid()), 1, "{}", joined.stderr());
    assert_eq!(slots_of(xdg.path(), fixed.pid()), 0, "{}", fixed.stderr());
    let pid = joined.pid();
    joined.signal(libc::SIGKILL);
    assert!(joined
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some());
    assert_eq!(
        slots_of(xdg.path(), pid),
        0,
        "the killed server's slot is freed"
    );
}

harness::main!(
    tests: [
        the_cached_backend_joins_the_budget_unless_told_not_to,
    ],
);
