//! A pre-fork server (gunicorn `--preload`, uWSGI, php-fpm, Python's
//! multiprocessing): a parent opens a WAL database through the VFS, reads
//! it, and forks four workers that each open it afresh and serve reads
//! and writes. Every worker is a member of the shared memory budget of its
//! own, the members' capacities stay within the budget, no worker keeps
//! the pages of the parent's files, and a parent killed with SIGKILL while
//! it holds the registry's lock leaves no lock behind (its children closed
//! the description they inherited). And an idle process: one that opened
//! a database and read nothing has no thread of ours.
//!
//! Each test's processes use a private `XDG_RUNTIME_DIR` of the test's
//! own, so their registry is theirs alone.

mod common;

use common::procs::{child_spec, child_with, hear, say};
use common::{int, open, stat};
use kxarray::ipc::RuntimeDir;
use kxarray::memory::{Registry, RegistryError, Scope};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WORKERS: usize = 4;

/// The child entry: the parent of the pre-fork run (`prefork-parent`) or
/// the idle process (`idle`).
#[test]
#[ignore = "a child process of the tests in this file, not a test"]
fn prefork_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    let db = PathBuf::from(&args["db"]);
    match role.as_str() {
        "prefork-parent" => prefork_parent(&db, Path::new(&args["dir"])),
        "idle" => idle(&db),
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

/// Our threads in this process (named `kx…`: the budget's, the pressure
/// monitor's, the frames', the I/O engine's).
fn our_threads() -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let comm = e.unwrap().path().join("comm");
        if let Ok(name) = std::fs::read_to_string(comm) {
            let name = name.trim().to_string();
            if name.starts_with("kx") {
                v.push(name);
            }
        }
    }
    v.sort();
    v
}

fn idle(db: &Path) {
    let c = open(db, "").unwrap();
    say(&format!("open {}", our_threads().join(",")));
    let n = int(&c, "SELECT count(*) FROM t");
    say(&format!("read {n} {}", our_threads().join(",")));
}

/// A private directory for the processes' `XDG_RUNTIME_DIR`.
fn private_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn make_db(path: &Path, rows: i64) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x INTEGER PRIMARY KEY, pad BLOB);")
        .unwrap();
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO t SELECT i, randomblob(800) FROM n",
        [rows],
    )
    .unwrap();
}

/// An idle process that opened a database has no thread of ours until it
/// reads (then the reads' threads start: the I/O engine's). Before, the
/// open started the budget's thread and the pressure monitor's arming
/// thread, and the first reads the frames' prefaulter too.
#[test]
fn an_idle_process_has_no_thread_of_ours_until_it_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("idle.db");
    make_db(&db, 2000);
    let xdg = private_dir();
    let mut p = child_with(
        "prefork_child",
        "idle",
        &[("db", db.display().to_string())],
        None,
        &[("XDG_RUNTIME_DIR", xdg.path().to_str().unwrap())],
    );
    let open = p.at_line();
    let read = p.at_line();
    assert!(p.wait().0);
    assert_eq!(open, "open ", "threads of ours after the open");
    assert!(read.starts_with("read 2000 "), "the read ran: {read}");
}

/// The parent: open, read everything, join the budget (the VFS does),
/// open a registry description of its own, fork the workers, and when told,
/// take the registry's lock on that description and hold it until killed.
fn prefork_parent(db: &Path, dir: &Path) {
    // (the private cache's rules across fork: the shared cache's workers
    // share the parent's pages, `tests/prefork_server.rs`)
    let c = open(db, "kx_shared=0").unwrap();
    assert_eq!(int(&c, "SELECT count(*) FROM t"), 2000);
    let parent_pages = stat(&c, "cached_pages");
    let key = Scope::from_system().unwrap().key;
    let mut reg = Registry::open(&RuntimeDir::for_user().unwrap(), &key).unwrap();
    say(&format!(
        "parent {} pages {parent_pages}",
        std::process::id()
    ));
    let mut pids = Vec::new();
    for w in 0..WORKERS {
        // SAFETY: the child runs the worker and leaves with `_exit`; the
        // parent's connection is never used or dropped there.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = std::panic::catch_unwind(|| worker(db, dir, w)).map_or(101, |()| 0);
            // SAFETY: leaving the worker without the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        pids.push(pid);
    }
    // Every worker has served its first requests.
    let start = Instant::now();
    while (0..WORKERS).any(|w| !dir.join(format!("ready-{w}")).exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "workers not ready"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    say("ready");
    assert_eq!(hear().as_deref(), Some("lock"));
    reg.update(false, |_, _| {
        say("locked");
        std::thread::sleep(Duration::from_secs(3600));
        (false, ())
    })
    .unwrap();
    drop(c);
}

/// A worker: its own connection, reads and writes, reports, then serves
/// until the test's `stop` file appears; `after` makes it report again.
fn worker(db: &Path, dir: &Path, w: usize) {
    let c = open(db, "kx_shared=0").unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    let at_open = stat(&c, "cached_pages");
    let serve = |i: i64| {
        let n = int(&c, "SELECT count(*) FROM t WHERE x % 7 = 3");
        c.execute("INSERT INTO t(pad) VALUES (randomblob(100))", [])
            .unwrap();
        assert!(n > 0 && i >= 0);
    };
    for i in 0..50 {
        serve(i);
    }
    say(&format!(
        "worker {w} pid {} at_open {at_open} capacity {}",
        std::process::id(),
        stat(&c, "capacity")
    ));
    std::fs::write(dir.join(format!("ready-{w}")), b"").unwrap();
    let mut reported = false;
    let mut i = 0;
    // Until the test says stop (or, should the test die first, a while).
    let deadline = Instant::now() + Duration::from_secs(120);
    while dir.exists() && !dir.join("stop").exists() && Instant::now() < deadline {
        serve(i);
        i += 1;
        if !reported && dir.join("after").exists() {
            reported = true;
            say(&format!(
                "after {w} members {} fallback {}",
                stat(&c, "budget_members"),
                stat(&c, "budget_fallback")
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The registry of the test's processes: live members' pids and their
/// capacities' sum, and the budget's total (half the scope's limit).
fn look(xdg: &Path) -> Result<(Vec<u32>, u64, u64), RegistryError> {
    let scope = Scope::from_system().unwrap();
    let dir = RuntimeDir::locate(Some(xdg), Path::new("/nonexistent")).unwrap();
    let mut r = Registry::open(&dir, &scope.key)?;
    let (pids, sum) = r.update(false, |t, _| {
        let live: Vec<_> = t.slots.iter().filter(|s| s.pid != 0).collect();
        let pids = live.iter().map(|s| s.pid).collect();
        let sum = live.iter().map(|s| s.capacity).sum();
        (false, (pids, sum))
    })?;
    let limit = scope.usage().unwrap().limit;
    Ok((pids, sum, limit / 2))
}

/// Writes the workers' `stop` file when dropped (also when the test
/// fails), so no worker outlives it.
struct Stop(PathBuf);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("stop"), b"");
    }
}

#[test]
fn pre_fork_workers_are_members_of_their_own_and_outlive_a_parent_killed_in_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let _stop = Stop(tmp.path().to_path_buf());
    let db = tmp.path().join("prefork.db");
    make_db(&db, 2000);
    let xdg = private_dir();
    let mut parent = child_with(
        "prefork_child",
        "prefork-parent",
        &[
            ("db", db.display().to_string()),
            ("dir", tmp.path().display().to_string()),
        ],
        None,
        &[("XDG_RUNTIME_DIR", xdg.path().to_str().unwrap())],
    );
    let first = parent.at_line();
    let parent_pages: u64 = first.rsplit(' ').next().unwrap().parse().unwrap();
    let parent_pid: u32 = first.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(
        parent_pages >= 100,
        "the parent cached the database: {first}"
    );
    let mut workers = Vec::new();
    loop {
        let l = parent.at_line();
        if l == "ready" {
            break;
        }
        workers.push(l);
    }
    assert_eq!(workers.len(), WORKERS, "{workers:?}");
    let mut worker_pids = Vec::new();
    for w in &workers {
        // "worker <w> pid <pid> at_open <pages> capacity <bytes>"
        let f: Vec<&str> = w.split(' ').collect();
        worker_pids.push(f[3].parse::<u32>().unwrap());
        let at_open: u64 = f[5].parse().unwrap();
        assert!(
            at_open <= 16,
            "a worker kept the parent's pages: {w} (the parent cached {parent_pages})"
        );
    }
    // Every worker a member, beside the parent; their capacities within
    // the budget once each has looked again (every 200 ms: the parent's
    // thread started when it forked, the workers' at their misses).
    let start = Instant::now();
    let (pids, sum, total) = loop {
        let (pids, sum, total) = look(xdg.path()).unwrap();
        if sum <= total || start.elapsed() > Duration::from_secs(10) {
            break (pids, sum, total);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for p in worker_pids.iter().chain([&parent_pid]) {
        assert!(pids.contains(p), "{p} is not a member: {pids:?}");
    }
    assert_eq!(pids.len(), WORKERS + 1, "{pids:?}");
    assert!(sum <= total, "capacities {sum} over the budget {total}");

    // The parent takes the lock and dies holding it.
    parent.send("lock\n");
    assert_eq!(parent.at_line(), "locked");
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(parent_pid as i32, libc::SIGKILL) };
    // SAFETY: reaping it.
    unsafe { libc::waitpid(parent_pid as i32, std::ptr::null_mut(), 0) };
    let start = Instant::now();
    let after = loop {
        match look(xdg.path()) {
            Ok(l) => break l,
            Err(RegistryError::Busy(_)) if start.elapsed() < Duration::from_secs(1) => {}
            Err(e) => panic!("the registry after the parent's death: {e}"),
        }
    };
    let mut live = after.0.clone();
    live.sort_unstable();
    let mut want = worker_pids.clone();
    want.sort_unstable();
    assert_eq!(live, want, "the workers are the members left");
    // The workers' own looks go on (none stalls on the lock).
    std::fs::write(tmp.path().join("after"), b"").unwrap();
    let mut seen = 0;
    while seen < WORKERS {
        let l = parent.at_line();
        if let Some(rest) = l.strip_prefix("after ") {
            assert!(rest.ends_with("fallback 0"), "{l}");
            seen += 1;
        }
    }
    std::fs::write(tmp.path().join("stop"), b"").unwrap();
    for p in worker_pids {
        // A guard: they stop by themselves at the stop file.
        let t = Instant::now();
        while Path::new(&format!("/proc/{p}")).exists() && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) of a process of this test (reparented).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    parent.kill();
}
