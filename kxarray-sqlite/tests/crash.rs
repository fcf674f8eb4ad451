//! The crash test, short: a few SIGKILLs per mode (the benchmark script
//! runs 200), and a control run showing the test catches a VFS that keeps
//! writes in its private cache.

#[path = "../../tests/harness/mod.rs"]
mod harness;

#[path = "../examples/sqlite_crash.rs"]
#[allow(dead_code)]
mod crash_tool;

use crash_tool::{all_modes, find_cdylib, run_mode, table, ChildCmd, Mode};
use rand::SeedableRng;

/// The child entry: the crash tool's writer and verifier run in this test
/// binary, started with `--ignored --exact crash_child`.
fn crash_child() {
    if let Some(code) = crash_tool::child_main_from_env() {
        std::process::exit(code);
    }
}

fn child_cmd(writer_env: Vec<(String, String)>) -> ChildCmd {
    let exe = std::env::current_exe().unwrap();
    ChildCmd {
        argv: [
            exe.as_os_str(),
            "--ignored".as_ref(),
            "--exact".as_ref(),
            "crash_child".as_ref(),
            "--nocapture".as_ref(),
            "--test-threads=1".as_ref(),
        ]
        .iter()
        .map(|s| s.to_os_string())
        .collect(),
        writer_env,
    }
}

/// The modes `pick` selects, each killed `KXARRAY_CRASH_KILLS` times (2
/// by default) at random moments, all recovered with every committed
/// transaction.
fn modes_survive_sigkill(pick: impl Fn(&Mode) -> bool) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cmd = child_cmd(Vec::new());
    let lib = find_cdylib();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let kills = std::env::var("KXARRAY_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let modes: Vec<Mode> = all_modes().into_iter().filter(|m| pick(m)).collect();
    assert!(!modes.is_empty());
    if modes.iter().any(|m| m.direct) {
        harness::require(harness::direct_io(dir.path()));
    }
    if modes.iter().any(|m| m.shell) {
        harness::require(harness::tool("sqlite3", "sqlite3"));
        harness::require(harness::tool("stdbuf", "coreutils"));
    }
    // The stock shell starts slower than a writer child (`stdbuf`, the
    // shell, loading the extension, joining the shared cache: 100-300 ms
    // of a debug build on a loaded machine), so its kills come within
    // 1.5 s instead of 0.3 s, or a run may end before any commit.
    let max_delay_ms = if modes.iter().any(|m| m.shell) {
        1500
    } else {
        300
    };
    let outcomes: Vec<_> = modes
        .iter()
        .map(|m| {
            run_mode(
                &cmd,
                lib.as_deref(),
                dir.path(),
                m,
                kills,
                &mut rng,
                max_delay_ms,
            )
        })
        .collect();
    println!("{}", table(&outcomes));
    for o in &outcomes {
        assert_eq!(o.skipped, None, "{}", o.mode);
        assert!(o.failures.is_empty(), "{}: {:?}", o.mode, o.failures);
        assert_eq!(o.kills, kills, "{}", o.mode);
    }
    // the transactions really ran (not a check that cannot fail)
    let logged: u64 = outcomes.iter().map(|o| o.logged).sum();
    assert!(
        logged > outcomes.len() as u64,
        "only {logged} commits in {} modes",
        outcomes.len()
    );
}

/// Rusqlite writers on buffered files, in every journal mode and
/// `synchronous` setting, and beside the unix VFS.
fn buffered_modes_survive_sigkill() {
    modes_survive_sigkill(|m| !m.direct && !m.shell);
}

/// The same over `O_DIRECT` (`kx_direct=1`).
fn direct_modes_survive_sigkill() {
    modes_survive_sigkill(|m| m.direct && !m.shell);
}

/// The stock shell loading the extension as the writer.
fn shell_modes_survive_sigkill() {
    modes_survive_sigkill(|m| m.shell && !m.direct);
}

/// The stock shell as the writer over `O_DIRECT`.
fn shell_direct_modes_survive_sigkill() {
    modes_survive_sigkill(|m| m.shell && m.direct);
}

/// With write-through off (writes kept in the process's cache until
/// xSync), WAL at synchronous=NORMAL loses committed transactions on
/// SIGKILL, and the crash test says so.
fn the_crash_test_catches_a_cache_that_loses_commits() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cmd = child_cmd(vec![("KXARRAY_SQLITE_WRITE_BACK".into(), "1".into())]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let m = Mode::plain("wal", "normal", false, false);
    // A kill lands before the first commit on a loaded machine now and
    // then: try a few rounds; one must log commits and catch their loss.
    let mut rounds = Vec::new();
    for _ in 0..6 {
        let o = run_mode(&cmd, None, dir.path(), &m, 3, &mut rng, 800);
        let caught = o.logged > 0
            && o.failures.iter().any(|f| {
                f.contains("was logged as committed") || f.contains("the tables are gone")
            });
        rounds.push(o);
        if caught {
            return;
        }
    }
    panic!("lost commits went unnoticed: {rounds:?}");
}

harness::main!(
    tests: [
        buffered_modes_survive_sigkill,
        direct_modes_survive_sigkill,
        shell_modes_survive_sigkill,
        shell_direct_modes_survive_sigkill,
        the_crash_test_catches_a_cache_that_loses_commits,
    ],
    children: [
        crash_child,
    ],
);
