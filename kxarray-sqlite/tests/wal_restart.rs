//! A WAL restarted by another process between two of a kxarray reader's
//! transactions, after a checkpoint copied frames the reader had not seen
//! copied (the reader used to drop its whole cache). The old generation's frames past the new one's are still
//! in the WAL file; their pages, and only those, must go. One test in its
//! own binary: the coherence counters are per process.

mod common;

use common::{open, stat};
use rusqlite::Connection;

/// The other process (the unix VFS here) commits A1 and A2 and
/// checkpoints only A1 (a reader holds A1's mark); the kxarray reader
/// reads (it knows A1 copied, A2 not); the other commits B (the table's
/// last page), checkpoints A2 and B, and commits C, which restarts the WAL
/// (one frame, over A1's first). At its next transaction the reader must
/// see A2's and B's rows, whose pages it cached before their checkpoint,
/// and must not have dropped its whole cache: their frames still carry
/// the old salts. Then the same reader, idle while another process's 300
/// commits restart the WAL and fill its new generation, must not drop its
/// whole cache either.
#[test]
fn a_wal_restart_after_a_checkpoint_drops_only_the_copied_pages() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("restart.db");
    let other = Connection::open(&db).unwrap();
    other
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);
             WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 2000)
             INSERT INTO t SELECT i, zeroblob(400) FROM g;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    let kx = open(&db, "").unwrap();
    kx.execute_batch("PRAGMA cache_size=0").unwrap();
    let sum = |c: &Connection| {
        c.query_row("SELECT sum(length(v)), max(v) FROM t", [], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
        })
        .unwrap()
    };
    let v = |c: &Connection, id: i64| {
        c.query_row("SELECT hex(v) FROM t WHERE id = ?1", [id], |r| {
            r.get::<_, String>(0)
        })
        .unwrap()
    };
    sum(&kx); // every page cached
    let ckpt = |c: &Connection| {
        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        })
        .unwrap()
    };
    // A1: rows on 8 pages; A2: rows on 20 other pages; a reader of the
    // other process holds A1's mark, so the checkpoint copies only A1
    other
        .execute("UPDATE t SET v = x'a1' WHERE id % 250 = 2", [])
        .unwrap();
    let reader = Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(v(&reader, 2), "A1");
    other
        .execute("UPDATE t SET v = x'a2' WHERE id % 100 = 50", [])
        .unwrap();
    let (log_a, done_a) = ckpt(&other);
    assert!(
        0 < done_a && done_a < log_a,
        "A: {done_a} of {log_a} frames copied"
    );
    // the reader knows A1 copied, not A2, and caches every page again
    assert_eq!(v(&kx, 2), "A1");
    assert_eq!(v(&kx, 50), "A2");
    sum(&kx);
    reader.execute_batch("COMMIT").unwrap();
    let full0 = stat(&kx, "coherence_full_drops");
    // B: the last row, appended to the WAL, then A2 and B checkpointed;
    // C restarts the WAL (its one frame over A1's first)
    other
        .execute("UPDATE t SET v = x'0b0b0b' WHERE id = 2000", [])
        .unwrap();
    let (log, done) = ckpt(&other);
    assert!(
        done == log && log > log_a,
        "B: {done} of {log} frames copied"
    );
    other
        .execute("UPDATE t SET v = x'0c0c0c' WHERE id = 1000", [])
        .unwrap();
    let (log_c, _) = ckpt(&other);
    assert!(
        log_c < done_a,
        "C restarted the WAL ({log_c} frames after {log})"
    );
    let misses0 = stat(&kx, "misses");
    assert_eq!(v(&kx, 2000), "0B0B0B", "B's row after the restart");
    for id in (50..=2000).step_by(100) {
        assert_eq!(v(&kx, id), "A2", "A2's row {id} after the restart");
    }
    assert_eq!(v(&kx, 1000), "0C0C0C", "C's row");
    assert_eq!(
        stat(&kx, "coherence_full_drops"),
        full0,
        "a full drop of the reader's cache"
    );
    // the table scanned again misses only the pages B and C changed (and
    // their folios), not the whole table
    sum(&kx);
    let misses = stat(&kx, "misses") - misses0;
    let pages: i64 = kx.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    assert!(
        (misses as i64) < pages / 4,
        "{misses} misses of {pages} pages after the restart"
    );

    // Then: everything checkpointed and known to the reader; 300 commits
    // elsewhere, the first restarting the WAL, before the reader's next
    // transaction (a reader idle while a writer runs).
    let (log, done) = ckpt(&other);
    assert_eq!(done, log);
    sum(&kx);
    let full0 = stat(&kx, "coherence_full_drops");
    for i in 0..300 {
        other
            .execute("UPDATE t SET v = x'0d' WHERE id = ?1", [1 + i * 6])
            .unwrap();
    }
    let (log, _) = ckpt(&other);
    assert!(log >= 300, "{log} frames");
    assert_eq!(v(&kx, 1 + 299 * 6), "0D", "the last commit's row");
    assert_eq!(v(&kx, 2000), "0B0B0B");
    assert_eq!(
        stat(&kx, "coherence_full_drops"),
        full0,
        "a full drop after 300 commits of a new WAL generation"
    );
}
