//! What the coherence check costs a WAL writer: a read
//! transaction runs the WAL check before its first read of the database
//! file, not at its read lock, so a commit whose pages SQLite's own cache
//! holds (one writer's single-row commits) runs none; a commit and a
//! checkpoint by another process are still seen at the next read. One
//! test in its own binary: `coherence_checks` counts the whole process's
//! checks.

mod common;

use common::{int, open, stat};
use rusqlite::Connection;

#[test]
fn commits_served_from_sqlite_s_cache_run_no_check_and_another_process_s_commit_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("commits.db");
    let kx = open(&p, "").unwrap();
    kx.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v);
         INSERT INTO t(v) VALUES(0);",
    )
    .unwrap();
    let commits = 100;
    let before = stat(&kx, "coherence_checks");
    for i in 0..commits {
        kx.execute("INSERT INTO t(v) VALUES(?1)", [i]).unwrap();
    }
    let after = stat(&kx, "coherence_checks");
    assert_eq!(
        after - before,
        0,
        "{commits} commits from SQLite's cache ran {} coherence checks",
        after - before
    );
    // This process copies the WAL into the database file; a second
    // connection of it (SQLite's cache empty) reads row 1 through the
    // process's cache, which then holds its page.
    kx.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let reader = open(&p, "").unwrap();
    assert_eq!(int(&reader, "SELECT v FROM t WHERE id = 1"), 0);
    let after = stat(&kx, "coherence_checks");
    // Another process (the unix VFS: its POSIX locks and ours exclude
    // each other as two processes' do) changes row 1, copies it into the
    // database file and empties the WAL.
    let other = Connection::open(&p).unwrap();
    other
        .execute("UPDATE t SET v = 42 WHERE id = 1", [])
        .unwrap();
    let (busy, log, copied) = other
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .unwrap();
    assert_eq!((busy, log, copied), (0, 0, 0), "the checkpoint was refused");
    // The reader's next read transaction reads the file (SQLite's cache
    // is stale): it checks first and sees the other process's row, not
    // the page this process cached.
    assert_eq!(int(&reader, "SELECT v FROM t WHERE id = 1"), 42);
    assert!(stat(&kx, "coherence_checks") > after);
    assert_eq!(int(&kx, "SELECT v FROM t WHERE id = 1"), 42);
    assert_eq!(int(&kx, "SELECT count(*) FROM t"), commits + 1);
    assert_eq!(
        common::text(&kx, "PRAGMA integrity_check"),
        "ok",
        "integrity after the other process's checkpoint"
    );
}
