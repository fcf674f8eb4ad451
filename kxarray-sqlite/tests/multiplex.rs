//! Below a VFS shim that splits a database into chunk files and sends
//! every lock and file control to chunk 0 only (SQLite's multiplex shim;
//! here `common::split`), kxarray keeps the chunks coherent with other
//! processes and durable as the unix VFS does: chunks 1 and up never lock
//! and never see a sync point of their own, so they are read and written
//! on their descriptors (`src/io/lockless.rs`).
//!
//! - another process's commit is seen in every chunk (rollback journal,
//!   and WAL after a checkpoint copied the frames into the chunks);
//! - a commit that returned with `synchronous=OFF` survives SIGKILL: the
//!   chunks' pages are in the files before the journal goes.

mod common;

use common::procs::{child, child_spec, hear, say};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// Open `db` through the splitting shim over `below` ("kxarray", "unix").
fn open(db: &Path, below: &str) -> Connection {
    if below == "kxarray" {
        common::setup();
    }
    let vfs = common::split::register(below);
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs.as_str()).unwrap()
}

/// 512 rows of 4 KB: three chunks of [`common::split::CHUNK`].
fn fill(c: &Connection, journal: &str) {
    let mode: String = c
        .query_row(&format!("PRAGMA journal_mode={journal}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, journal);
    c.execute_batch(
        "CREATE TABLE t1(a, b);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 512)
         INSERT INTO t1 SELECT 0, randomblob(4000) FROM n;",
    )
    .unwrap();
}

fn sum(c: &Connection) -> String {
    c.query_row("SELECT sum(a) || ' ' || count(*) FROM t1", [], |r| {
        r.get::<_, String>(0)
    })
    .unwrap_or_else(|e| format!("error: {e}"))
}

fn chunks(db: &Path) -> usize {
    (1..)
        .take_while(|i| common::procs::sidecar(db, &format!("{i:03}")).exists())
        .count()
        + 1
}

/// The child processes: `reader` answers `sum` with [`sum`] through the
/// shim over `below`; `writer` fills the database with `synchronous=OFF`,
/// says so, and waits to be killed.
#[test]
#[ignore = "a child process of the tests in this file"]
fn multiplex_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    let db = Path::new(&args["db"]);
    let c = open(db, &args["below"]);
    match role.as_str() {
        "reader" => {
            say("ready");
            while let Some(cmd) = hear() {
                assert_eq!(cmd, "sum");
                say(&sum(&c));
            }
        }
        "writer" => {
            c.execute_batch("PRAGMA synchronous=OFF").unwrap();
            fill(&c, &args["journal"]);
            say("committed");
            while hear().is_some() {}
        }
        r => panic!("unknown role {r}"),
    }
}

/// What a reader in another process sees of the table before and after
/// this process's `UPDATE t1 SET a = 1` (and, in WAL mode, a checkpoint
/// that copies it into the chunks).
fn other_process_sees_the_update(below: &str, journal: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let a = open(&db, below);
    fill(&a, journal);
    if journal == "wal" {
        a.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    assert_eq!(chunks(&db), 3, "512 rows of 4 KB in three chunks");
    let args = [
        ("db", db.display().to_string()),
        ("below", below.to_string()),
    ];
    let mut b = child("multiplex_child", "reader", &args);
    assert_eq!(b.at_line(), "ready");
    b.send("sum\n");
    let before = b.at_line();
    a.execute_batch("UPDATE t1 SET a = 1").unwrap();
    if journal == "wal" {
        a.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    b.send("sum\n");
    let after = b.at_line();
    drop(b);
    (before, after)
}

#[test]
fn another_process_s_commit_is_seen_in_every_chunk() {
    for journal in ["delete", "wal"] {
        for below in ["unix", "kxarray"] {
            let (before, after) = other_process_sees_the_update(below, journal);
            assert_eq!(
                (before.as_str(), after.as_str()),
                ("0 512", "512 512"),
                "{below}, journal_mode={journal}"
            );
        }
    }
}

/// A writer process below the shim fills the database with
/// `synchronous=OFF` and is killed right after its COMMIT returned; the
/// unix VFS then checks the files.
fn survives_a_kill_after_commit(below: &str, journal: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let args = [
        ("db", db.display().to_string()),
        ("below", below.to_string()),
        ("journal", journal.to_string()),
    ];
    let mut w = child("multiplex_child", "writer", &args);
    assert_eq!(w.at_line(), "committed");
    drop(w); // SIGKILL
    let c = open(&db, "unix");
    let check: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| format!("error: {e}"));
    (check, sum(&c))
}

#[test]
fn a_commit_with_synchronous_off_survives_a_kill_below_the_shim() {
    for journal in ["delete", "truncate", "persist", "wal"] {
        for below in ["unix", "kxarray"] {
            let (check, rows) = survives_a_kill_after_commit(below, journal);
            assert_eq!(
                (check.as_str(), rows.as_str()),
                ("ok", "0 512"),
                "{below}, journal_mode={journal}"
            );
        }
    }
}
