//! Two processes on one database, each on the kxarray VFS or the unix VFS
//! (rusqlite's bundled SQLite), in WAL and rollback-journal modes: each
//! sees the other's commits at its next transaction, a WAL reader is never
//! blocked by a writer in another process, `SQLITE_BUSY` comes where the
//! unix VFS gives it, and a kxarray reader's cache stays coherent at the
//! cost of the pages another process's checkpoint copied.
//!
//! The other process is this test binary again (`--ignored --exact
//! mp_child`), driven line by line over its standard input: `Q <sql>`
//! answers every row (its columns joined by `|`), joined by `,`; `X <sql>` runs a
//! batch and answers `OK`; an error answers `ERR <code>`.

mod common;

use common::{int, open, stat, text};
use rusqlite::Connection;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// Which VFS a process opens the database with.
#[derive(Clone, Copy, Debug)]
enum Vfs {
    /// kxarray, a member of the shared cache (the default).
    Kx,
    /// kxarray with the pages in the process's own cache (`kx_shared=0`).
    KxPrivate,
    Unix,
}

fn connect(p: &Path, vfs: Vfs) -> Connection {
    let c = match vfs {
        Vfs::Kx => open(p, "").unwrap(),
        Vfs::KxPrivate => open(p, "kx_shared=0").unwrap(),
        Vfs::Unix => Connection::open(p).unwrap(),
    };
    c.busy_timeout(Duration::ZERO).unwrap();
    c
}

/// One command of the line protocol against `db`.
fn answer(db: &Connection, line: &str) -> String {
    let run = || -> rusqlite::Result<String> {
        if let Some(sql) = line.strip_prefix("Q ") {
            let mut st = db.prepare(sql)?;
            let n = st.column_count();
            let rows: Vec<String> = st
                .query_map([], |r| {
                    let mut cols = Vec::with_capacity(n);
                    for i in 0..n {
                        cols.push(match r.get_ref(i)? {
                            rusqlite::types::ValueRef::Integer(i) => i.to_string(),
                            rusqlite::types::ValueRef::Text(t) => {
                                String::from_utf8_lossy(t).into_owned()
                            }
                            rusqlite::types::ValueRef::Null => "NULL".into(),
                            v => format!("{v:?}"),
                        });
                    }
                    Ok(cols.join("|"))
                })?
                .collect::<Result<_, _>>()?;
            Ok(rows.join(","))
        } else if let Some(sql) = line.strip_prefix("X ") {
            db.execute_batch(sql)?;
            Ok("OK".into())
        } else {
            Ok(format!("BAD {line}"))
        }
    };
    match run() {
        Ok(s) => s,
        Err(e) => format!("ERR {}", e.sqlite_error().map_or(-1, |e| e.extended_code)),
    }
}

/// The other process: opens `KX_MP_DB` with `KX_MP_VFS` and answers its
/// standard input line by line.
#[test]
#[ignore = "a child process of the multi-process tests, not a test"]
fn mp_child() {
    let (Ok(db), Ok(vfs)) = (std::env::var("KX_MP_DB"), std::env::var("KX_MP_VFS")) else {
        return;
    };
    let vfs = match vfs.as_str() {
        "kx" => Vfs::Kx,
        "kx-private" => Vfs::KxPrivate,
        _ => Vfs::Unix,
    };
    let db = connect(Path::new(&db), vfs);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let a = answer(&db, &line);
        writeln!(out, "@@ {a}").unwrap();
        out.flush().unwrap();
    }
}

/// A child process and its pipes.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(db: &Path, vfs: Vfs) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "mp_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KX_MP_DB", db)
            .env(
                "KX_MP_VFS",
                match vfs {
                    Vfs::Kx => "kx",
                    Vfs::KxPrivate => "kx-private",
                    Vfs::Unix => "unix",
                },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
        }
    }

    /// Send one command, wait for its answer.
    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut l = String::new();
        loop {
            l.clear();
            assert!(
                self.stdout.read_line(&mut l).unwrap() > 0,
                "the child died at {line:?}"
            );
            // (the first answer follows libtest's "test mp_child ... ")
            if let Some(i) = l.find("@@ ") {
                return l[i + 3..].trim_end().to_string();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Frames the machine's region evicted so far (0 when this process is not
/// a member): a page dropped by the region's clock is read again, which a
/// test counting the misses of coherence allows for. The region is the
/// machine's, so other processes' pages compete for it.
fn region_evictions(db: &Connection) -> u64 {
    text(db, "PRAGMA kx_stats")
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("region_evictions="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The VFS's counters are the process's: the tests of this file run one
/// at a time, so that one's counts are not another's.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// `SQLITE_BUSY` as an answer.
const BUSY: &str = "ERR 5";

/// The same conversation for every pair of VFSes and both journal modes.
fn conversation(journal: &str, me: Vfs, other: Vfs) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mp.db");
    let db = connect(&p, me);
    db.execute_batch(&format!(
        "PRAGMA journal_mode={journal}; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         INSERT INTO t VALUES (1, 'one');"
    ))
    .unwrap();
    let ctx = format!("{journal}, this process {me:?}, the other {other:?}");
    let mut peer = Peer::spawn(&p, other);
    // the other process reads what this one committed, and writes
    assert_eq!(peer.cmd("Q SELECT v FROM t ORDER BY id"), "one", "{ctx}");
    assert_eq!(peer.cmd("X INSERT INTO t VALUES (2, 'two')"), "OK", "{ctx}");
    // this one sees it at its next transaction, and writes
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 2, "{ctx}");
    db.execute_batch("UPDATE t SET v = 'uno' WHERE id = 1")
        .unwrap();
    assert_eq!(
        peer.cmd("Q SELECT v FROM t ORDER BY id"),
        "uno,two",
        "{ctx}"
    );
    // a read transaction open in the other process
    assert_eq!(peer.cmd("X BEGIN"), "OK");
    assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), "2", "{ctx}");
    let commit = db.execute_batch("INSERT INTO t VALUES (3, 'three')");
    if journal == "wal" {
        // a WAL reader never blocks a writer; its snapshot stays
        commit.unwrap();
        assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), "2", "{ctx}");
    } else {
        // its SHARED lock keeps a rollback-journal writer from committing
        let e = commit.unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy),
            "{ctx}: {e}"
        );
        if !db.is_autocommit() {
            db.execute_batch("ROLLBACK").unwrap();
        }
    }
    assert_eq!(peer.cmd("X COMMIT"), "OK");
    if journal != "wal" {
        db.execute_batch("INSERT INTO t VALUES (3, 'three')")
            .unwrap();
    }
    assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), "3", "{ctx}");
    // a write transaction open in this process: the other's write waits
    db.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (4, 'four')")
        .unwrap();
    assert_eq!(
        peer.cmd("X INSERT INTO t VALUES (5, 'five')"),
        BUSY,
        "{ctx}"
    );
    // and it reads the last committed state meanwhile
    assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), "3", "{ctx}");
    db.execute_batch("COMMIT").unwrap();
    assert_eq!(
        peer.cmd("X INSERT INTO t VALUES (5, 'five')"),
        "OK",
        "{ctx}"
    );
    // a checkpoint in the other process, then more commits on both sides
    if journal == "wal" {
        assert_ne!(peer.cmd("Q PRAGMA wal_checkpoint(TRUNCATE)"), BUSY, "{ctx}");
    }
    for i in 6..40 {
        if i % 2 == 0 {
            db.execute("INSERT INTO t VALUES (?1, printf('row %d', ?1))", [i])
                .unwrap();
        } else {
            let a = peer.cmd(&format!(
                "X INSERT INTO t VALUES ({i}, printf('row %d', {i}))"
            ));
            assert_eq!(a, "OK", "{ctx}");
        }
        if i % 10 == 0 && journal == "wal" {
            db.execute_batch("PRAGMA wal_checkpoint(RESTART)").unwrap();
        }
    }
    let mine: String = db
        .query_row(
            "SELECT group_concat(v, '|') FROM (SELECT v FROM t ORDER BY id)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let theirs = peer.cmd("Q SELECT group_concat(v, '|') FROM (SELECT v FROM t ORDER BY id)");
    assert_eq!(mine, theirs, "{ctx}");
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 39, "{ctx}");
    assert_eq!(peer.cmd("Q PRAGMA integrity_check"), "ok", "{ctx}");
}

#[test]
fn wal_kxarray_beside_unix() {
    conversation("wal", Vfs::Kx, Vfs::Unix);
}

#[test]
fn wal_unix_beside_kxarray() {
    conversation("wal", Vfs::Unix, Vfs::Kx);
}

#[test]
fn wal_kxarray_beside_kxarray() {
    conversation("wal", Vfs::Kx, Vfs::Kx);
}

#[test]
fn delete_kxarray_beside_unix() {
    conversation("delete", Vfs::Kx, Vfs::Unix);
}

#[test]
fn delete_unix_beside_kxarray() {
    conversation("delete", Vfs::Unix, Vfs::Kx);
}

#[test]
fn delete_kxarray_beside_kxarray() {
    conversation("delete", Vfs::Kx, Vfs::Kx);
}

#[test]
fn wal_member_beside_private_cache() {
    conversation("wal", Vfs::Kx, Vfs::KxPrivate);
}

#[test]
fn wal_private_cache_beside_member() {
    conversation("wal", Vfs::KxPrivate, Vfs::Kx);
}

#[test]
fn delete_member_beside_private_cache() {
    conversation("delete", Vfs::Kx, Vfs::KxPrivate);
}

#[test]
fn delete_private_cache_beside_member() {
    conversation("delete", Vfs::KxPrivate, Vfs::Kx);
}

/// The coherence cost: a kxarray reader with the whole table cached; the
/// other process (unix VFS) updates one row and checkpoints. The reader's
/// next transaction drops the pages that checkpoint copied and nothing
/// else (`coherence_partial_drops`, no full drop), re-reads at most those
/// pages, and sees the new row. Then a checkpoint that restarts the WAL
/// between two of the reader's transactions: the index no longer shows
/// what was copied, so everything is dropped, and the reader is right.
#[test]
fn a_one_row_commit_elsewhere_costs_the_pages_it_changed() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cost.db");
    let db = connect(&p, Vfs::Kx);
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA cache_size=0;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<5000)
         INSERT INTO t SELECT x, printf('%0200d', x) FROM c;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    let scan = "SELECT sum(length(v)) + count(*) FROM t";
    let total = int(&db, scan);
    int(&db, scan); // warm
    let mut peer = Peer::spawn(&p, Vfs::Unix);
    assert_eq!(
        peer.cmd("X UPDATE t SET v = 'changed' WHERE id = 2500"),
        "OK"
    );
    // busy, frames in the WAL, frames copied
    let ck = peer.cmd("Q PRAGMA wal_checkpoint(PASSIVE)");
    let copied: u64 = ck
        .rsplit('|')
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{ck}"));
    assert!(copied >= 1, "{ck}");
    let (full0, pages0, partial0, misses0, evicted0) = (
        stat(&db, "coherence_full_drops"),
        stat(&db, "coherence_pages_dropped"),
        stat(&db, "coherence_partial_drops"),
        stat(&db, "misses"),
        region_evictions(&db),
    );
    let after = int(&db, scan);
    assert_eq!(after, total - 200 + 7);
    assert_eq!(
        db.query_row("SELECT v FROM t WHERE id = 2500", [], |r| r
            .get::<_, String>(0))
            .unwrap(),
        "changed"
    );
    let dropped = stat(&db, "coherence_pages_dropped") - pages0;
    let misses = stat(&db, "misses") - misses0;
    let evicted = region_evictions(&db) - evicted0;
    eprintln!(
        "one-row commit elsewhere: {copied} frames copied, {dropped} pages dropped, \
         {misses} misses, {evicted} frames evicted by the region"
    );
    assert_eq!(
        stat(&db, "coherence_full_drops"),
        full0,
        "a one-row commit emptied the cache"
    );
    assert!(stat(&db, "coherence_partial_drops") > partial0);
    // at most the pages of the frames copied (each in its own folio block
    // at worst: 16 pages), and the reader re-read no more than it dropped
    // and the region evicted meanwhile
    assert!(
        dropped >= 1 && dropped <= copied * 16,
        "dropped {dropped}, copied {copied}"
    );
    assert!(
        misses <= dropped + evicted,
        "misses {misses}, dropped {dropped}, evicted {evicted}"
    );

    // the other process commits, checkpoints and restarts the WAL, then
    // commits again, all between two of the reader's transactions
    for sql in [
        "X UPDATE t SET v = 'again' WHERE id = 10",
        "Q PRAGMA wal_checkpoint(TRUNCATE)",
        "X UPDATE t SET v = 'third' WHERE id = 4000",
        "Q PRAGMA wal_checkpoint(PASSIVE)",
    ] {
        let a = peer.cmd(sql);
        assert!(a == "OK" || a.starts_with("0|"), "{sql}: {a}");
    }
    let full1 = stat(&db, "coherence_full_drops");
    assert_eq!(int(&db, scan), total - 200 + 7 - 200 + 5 - 200 + 5);
    assert!(stat(&db, "coherence_full_drops") > full1);
    let v: String = db
        .query_row("SELECT v FROM t WHERE id = 4000", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "third");
    assert_eq!(peer.cmd("Q PRAGMA integrity_check"), "ok");
}

/// Rollback journal: a kxarray reader's cache, warm, then another process
/// (unix VFS) commits: the reader's next transaction sees the commit (the
/// change counter moved: one full drop), and the next transaction after
/// no commit elsewhere keeps the cache (no drop, no miss).
#[test]
fn rollback_mode_revalidates_at_a_lock_gap_only_when_the_file_moved() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rb.db");
    let db = connect(&p, Vfs::Kx);
    db.execute_batch(
        "PRAGMA cache_size=0; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<2000)
         INSERT INTO t SELECT x, printf('%0100d', x) FROM c;",
    )
    .unwrap();
    let scan = "SELECT sum(length(v)) FROM t";
    let total = int(&db, scan);
    let (full0, misses0, evicted0) = (
        stat(&db, "coherence_full_drops"),
        stat(&db, "misses"),
        region_evictions(&db),
    );
    assert_eq!(int(&db, scan), total);
    assert_eq!(stat(&db, "coherence_full_drops"), full0);
    // a page is read again only if the machine's region evicted a frame
    let (misses, evicted) = (
        stat(&db, "misses") - misses0,
        region_evictions(&db) - evicted0,
    );
    assert!(
        misses <= evicted,
        "an unchanged file was read again: {misses} misses, {evicted} frames evicted"
    );
    let mut peer = Peer::spawn(&p, Vfs::Unix);
    assert_eq!(peer.cmd("X UPDATE t SET v = 'x' WHERE id = 7"), "OK");
    assert_eq!(int(&db, scan), total - 99);
    assert!(stat(&db, "coherence_full_drops") > full0);
}

/// `PRAGMA locking_mode=EXCLUSIVE`, SQLite's own switch, in WAL mode on
/// the shared (default) VFS: SQLite keeps the WAL index in its heap (no
/// `-shm` file) and holds the database's lock until close, so another
/// process gets `SQLITE_BUSY`, as beside the unix VFS; this process reads
/// and writes without a coherence drop after its first lock.
#[test]
fn locking_mode_exclusive_keeps_others_out_without_a_shm() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.db");
    let db = connect(&p, Vfs::Kx);
    db.execute_batch(
        "PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=WAL;
         CREATE TABLE t(x); INSERT INTO t VALUES (1);",
    )
    .unwrap();
    assert!(!dir.path().join("x.db-shm").exists());
    let full0 = stat(&db, "coherence_full_drops");
    let mut peer = Peer::spawn(&p, Vfs::Unix);
    assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), BUSY);
    for i in 2..20 {
        db.execute("INSERT INTO t VALUES (?1)", [i]).unwrap();
        assert_eq!(int(&db, "SELECT count(*) FROM t"), i);
    }
    assert_eq!(stat(&db, "coherence_full_drops"), full0);
    drop(db);
    assert_eq!(peer.cmd("Q SELECT count(*) FROM t"), "19");
}

/// `readonly_shm=1`: a read-only kxarray open maps the `-shm` of a WAL
/// database another process (unix VFS) has open, read-only, and reads
/// that process's commits (SQLite's own read path for a read-only index).
#[test]
fn readonly_shm_reads_beside_a_writer() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro.db");
    let mut peer = Peer::spawn(&p, Vfs::Unix);
    assert_eq!(
        peer.cmd("X PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1)"),
        "OK"
    );
    common::setup();
    let ro = Connection::open_with_flags(
        format!("file:{}?vfs=kxarray&readonly_shm=1", p.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    assert_eq!(int(&ro, "SELECT count(*) FROM t"), 1);
    assert_eq!(peer.cmd("X INSERT INTO t VALUES (2)"), "OK");
    assert_eq!(int(&ro, "SELECT count(*) FROM t"), 2);
    // the -shm is the writer's, untouched by the read-only reader
    assert!(dir.path().join("ro.db-shm").exists());
}

/// A checkpoint elsewhere that grows the database (rows appended by the
/// other process) costs the pages it copied and the new length, not the
/// whole cache (`CachedFile::refresh_len`), and the reader sees every new
/// row.
#[test]
fn a_checkpoint_that_grows_the_file_keeps_the_rest_of_the_cache() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("grow.db");
    let db = connect(&p, Vfs::Kx);
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA cache_size=0;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<3000)
         INSERT INTO t SELECT x, printf('%0200d', x) FROM c;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    let len0 = std::fs::metadata(&p).unwrap().len();
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 3000);
    let mut peer = Peer::spawn(&p, Vfs::Unix);
    assert_eq!(
        peer.cmd(
            "X WITH RECURSIVE c(x) AS (SELECT 3001 UNION ALL SELECT x+1 FROM c WHERE x<3400) \
             INSERT INTO t SELECT x, printf('%0200d', x) FROM c"
        ),
        "OK"
    );
    let ck = peer.cmd("Q PRAGMA wal_checkpoint(PASSIVE)");
    assert!(ck.starts_with("0|"), "{ck}");
    assert!(std::fs::metadata(&p).unwrap().len() > len0, "the file grew");
    let (full0, partial0) = (
        stat(&db, "coherence_full_drops"),
        stat(&db, "coherence_partial_drops"),
    );
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 3400);
    assert_eq!(
        int(&db, "SELECT sum(length(v)) FROM t WHERE id > 3000"),
        400 * 200
    );
    assert_eq!(stat(&db, "coherence_full_drops"), full0);
    assert!(stat(&db, "coherence_partial_drops") > partial0);
    assert_eq!(peer.cmd("Q PRAGMA integrity_check"), "ok");
}

/// Zero-copy fetch (`PRAGMA mmap_size`, `kx_fetch=1`) never serves a
/// page another process's checkpoint changed, in WAL and rollback modes:
/// the held references of the reader's hot pages are of folios the check
/// dropped, so they are not current any more.
#[test]
fn fetched_pages_follow_another_process_commits() {
    let _serial = serial();
    for journal in ["wal", "delete"] {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fetch.db");
        // (xFetch's loans are the private cache's)
        let db = connect(&p, Vfs::KxPrivate);
        db.execute_batch(&format!(
            "PRAGMA journal_mode={journal}; PRAGMA cache_size=0; PRAGMA mmap_size=67108864;
             CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<2000)
             INSERT INTO t SELECT x, printf('%0100d', x) FROM c;"
        ))
        .unwrap();
        if journal == "wal" {
            db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        }
        let fetches0 = stat(&db, "fetches");
        let q = "SELECT v FROM t WHERE id = 1000";
        let read = |db: &Connection| db.query_row(q, [], |r| r.get::<_, String>(0)).unwrap();
        assert_eq!(read(&db), format!("{:0100}", 1000));
        let mut peer = Peer::spawn(&p, Vfs::Unix);
        for round in 0..5 {
            let a = peer.cmd(&format!(
                "X UPDATE t SET v = 'round {round}' WHERE id = 1000"
            ));
            assert_eq!(a, "OK", "{journal}");
            if journal == "wal" {
                assert!(peer
                    .cmd("Q PRAGMA wal_checkpoint(PASSIVE)")
                    .starts_with("0|"));
            }
            assert_eq!(read(&db), format!("round {round}"), "{journal}");
        }
        assert!(
            stat(&db, "fetches") > fetches0,
            "{journal}: no page was fetched"
        );
    }
}
