//! `fork()` in a process that has the database open through rusqlite on
//! the kxarray VFS, as pre-fork servers and Python's multiprocessing do:
//! the child never touches the parent's connection (SQLite forbids it); it
//! opens the database afresh, reads and writes. The parent's connection,
//! its locks and its cache must not be disturbed: when the parent takes a
//! lock after the fork, the child and a third process are refused as they
//! should be, also after the child's own transactions released their
//! locks; each sees the other's commits (not pages inherited across the
//! fork); the parent keeps working.

mod common;

use common::procs::{child, child_spec, is_busy, open_vfs, say};
use common::{int, open, text};
use rusqlite::Connection;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the parent waits for a step of the child (a hang guard, not a
/// timed assertion: each step takes milliseconds).
const STEP: Duration = Duration::from_secs(20);

/// One fork at a time in this binary (a fork copies only the calling
/// thread; another test's thread inside SQLite would leave its mutexes
/// held in the child).
static FORKS: Mutex<()> = Mutex::new(());

/// The child entry for the third process: a write on the unix VFS with no
/// busy timeout; says "busy" or "ok".
#[test]
#[ignore = "a child process of the fork tests, not a test"]
fn fork_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    assert_eq!(role, "try-write");
    let db = std::path::PathBuf::from(&args["db"]);
    let c = open_vfs(&db, "unix", "").unwrap();
    c.busy_timeout(Duration::ZERO).unwrap();
    match c.execute("INSERT INTO t(who) VALUES ('third')", []) {
        Ok(_) => say("ok"),
        Err(e) if is_busy(&e) => say("busy"),
        Err(e) => say(&format!("error {e}")),
    }
    std::process::exit(0);
}

/// A write from a third process (unix VFS, no busy timeout): "busy" or "ok".
fn third_process_write(db: &Path) -> String {
    let mut p = child(
        "fork_child",
        "try-write",
        &[("db", db.display().to_string())],
    );
    let line = p.at_line();
    assert!(p.wait().0);
    line
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors into a 2-int array.
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: a fresh descriptor owned by nobody else.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    (r, w)
}

fn put(fd: &OwnedFd, b: u8) {
    use std::os::fd::AsRawFd;
    // SAFETY: one byte from a live buffer to an open descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), (&raw const b).cast(), 1) };
    assert_eq!(n, 1);
}

/// One byte from `fd`, or None at end of file or when nothing came for
/// [`STEP`] (a hung peer).
fn get(fd: &OwnedFd) -> Option<u8> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = STEP.as_millis() as i32;
    // SAFETY: poll(2) on one live pollfd.
    if unsafe { libc::poll(&mut pfd, 1, ms) } != 1 {
        return None;
    }
    let mut b = 0u8;
    // SAFETY: one byte into a live buffer from an open descriptor.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut b).cast(), 1) };
    (n == 1).then_some(b)
}

/// The child's part (steps 1, 3 and 5 below); its result goes back as the
/// exit status (0 = all good) and a message in the report file.
fn in_child(
    db: &Path,
    journal: &str,
    to_parent: &OwnedFd,
    from_parent: &OwnedFd,
) -> Result<(), String> {
    let c = open(db, "").map_err(|e| format!("open in the child: {e}"))?;
    c.busy_timeout(Duration::ZERO).map_err(|e| e.to_string())?;
    let q = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
    let who1 = || {
        c.query_row("SELECT who FROM t WHERE id = 1", [], |r| {
            r.get::<_, String>(0)
        })
    };
    // 1. the parent's rows, through a new connection
    let n = q("SELECT count(*) FROM t").map_err(|e| format!("the child's first read: {e}"))?;
    if n != 100 {
        return Err(format!("the child read {n} rows, not 100"));
    }
    put(to_parent, 1);
    if get(from_parent) != Some(2) {
        return Err("the parent did not go on (2)".into());
    }
    // 3. the parent now holds a lock: reads still see the committed rows
    // (in DELETE mode beside its read lock; in WAL mode beside its write
    // lock); a write is refused
    let n = q("SELECT count(*) FROM t")
        .map_err(|e| format!("the child's read beside the parent's lock: {e}"))?;
    if n != 100 {
        return Err(format!(
            "beside the parent's lock the child read {n} rows, not 100"
        ));
    }
    match c.execute("INSERT INTO t(who) VALUES ('child-early')", []) {
        Err(e) if is_busy(&e) => {}
        Ok(_) => return Err("the child wrote while the parent held its lock".into()),
        Err(e) => return Err(format!("the child's early write: {e}")),
    }
    put(to_parent, 3);
    if get(from_parent) != Some(4) {
        return Err("the parent did not go on (4)".into());
    }
    // 5. the parent has committed (WAL: its pending row; both: row 1
    // renamed): the child sees it, not pages it inherited or cached
    c.busy_timeout(Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let want = if journal == "wal" { 101 } else { 100 };
    let n = q("SELECT count(*) FROM t").map_err(|e| format!("the child's last read: {e}"))?;
    let w = who1().map_err(|e| e.to_string())?;
    if n != want || w != "parent-renamed" {
        return Err(format!(
            "after the parent's commit the child read {n} rows (not {want}) and row 1 by {w:?}"
        ));
    }
    c.execute(
        "INSERT INTO t(who, b) VALUES ('child', randomblob(5000))",
        [],
    )
    .map_err(|e| format!("the child's write: {e}"))?;
    let ic: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ic != "ok" {
        return Err(format!("integrity_check in the child: {ic}"));
    }
    drop(c);
    Ok(())
}

fn fork_beside_an_open_connection(journal: &str) {
    let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fork.db");
    let parent = open(&p, "").unwrap();
    parent.busy_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        text(&parent, &format!("PRAGMA journal_mode={journal}")),
        journal
    );
    parent
        .execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, who TEXT, b BLOB);
             WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 100)
             INSERT INTO t(who, b) SELECT 'parent', randomblob(900) FROM g;",
        )
        .unwrap();
    // the parent's cache holds every page; its connection stays open
    // (idle: SQLite forbids carrying a transaction across fork, and with
    // the unix VFS a child after a fork inside a transaction inherits the
    // parent's lock bookkeeping and is refused for ever)
    assert_eq!(
        int(&parent, "SELECT count(*) FROM t WHERE length(b) = 900"),
        100
    );
    let report = dir.path().join("child-report");
    let (from_child, to_parent) = pipe();
    let (from_parent, to_child) = pipe();
    // SAFETY: fork(2); the child runs only the code below and leaves with
    // _exit, never returning into the test harness or dropping the
    // parent's objects.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_child(&p, journal, &to_parent, &from_parent)
        }));
        let (code, msg) = match r {
            Ok(Ok(())) => (0, "ok".to_string()),
            Ok(Err(e)) => (1, e),
            Err(_) => (2, "the child panicked".to_string()),
        };
        let _ = std::fs::write(&report, msg);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    drop((to_parent, from_parent));
    let child_report = || std::fs::read_to_string(&report).unwrap_or_default();
    let reap = || {
        let t0 = Instant::now();
        loop {
            let mut st = 0;
            // SAFETY: waitpid on our own child with a live int.
            let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
            if r == pid {
                return st;
            }
            if t0.elapsed() > STEP {
                // SAFETY: kill our own hung child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the child hung: {}", child_report());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let step = |want: u8| {
        if get(&from_child) != Some(want) {
            let st = reap();
            panic!(
                "the child stopped before step {want} ({st}): {}",
                child_report()
            );
        }
    };
    step(1);
    // 2. the parent takes a lock after the fork: the write lock with a
    // pending row (WAL), a read lock (DELETE)
    if journal == "wal" {
        parent
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO t(who) VALUES ('parent-pending');")
            .unwrap();
    } else {
        parent
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .unwrap();
    }
    put(&to_child, 2);
    step(3);
    // 4. the child's locking and unlocking left the parent's lock in force
    // against a third process
    assert_eq!(
        third_process_write(&p),
        "busy",
        "a third process wrote while the parent held its lock, after the child's transactions"
    );
    if journal == "wal" {
        assert_eq!(int(&parent, "SELECT count(*) FROM t"), 101);
    }
    parent.execute_batch("COMMIT").unwrap();
    parent
        .execute("UPDATE t SET who = 'parent-renamed' WHERE id = 1", [])
        .unwrap();
    put(&to_child, 4);
    let status = reap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed ({status}): {}",
        child_report()
    );
    // the parent sees the child's commit and keeps working
    let base = if journal == "wal" { 101 } else { 100 };
    assert_eq!(int(&parent, "SELECT count(*) FROM t"), base + 1);
    assert_eq!(
        int(&parent, "SELECT count(*) FROM t WHERE who = 'child'"),
        1
    );
    parent
        .execute("INSERT INTO t(who) VALUES ('parent-after')", [])
        .unwrap();
    // its locks still work: a third process is kept out during a write
    // transaction, and let in after it
    parent
        .execute_batch("BEGIN IMMEDIATE; UPDATE t SET who = 'p2' WHERE id = 2;")
        .unwrap();
    assert_eq!(third_process_write(&p), "busy");
    parent.execute_batch("COMMIT").unwrap();
    assert_eq!(third_process_write(&p), "ok");
    assert_eq!(int(&parent, "SELECT count(*) FROM t"), base + 3);
    assert_eq!(text(&parent, "PRAGMA integrity_check"), "ok");
    drop(parent);
    let u = Connection::open(&p).unwrap();
    assert_eq!(int(&u, "SELECT count(*) FROM t"), base + 3);
}

#[test]
fn a_child_after_fork_opens_afresh_beside_the_parent_wal() {
    fork_beside_an_open_connection("wal");
}

#[test]
fn a_child_after_fork_opens_afresh_beside_the_parent_delete() {
    fork_beside_an_open_connection("delete");
}
