//! `PRAGMA locking_mode=EXCLUSIVE` in the default shared locking mode: a
//! connection that holds the database's EXCLUSIVE lock under it reads its
//! WAL (or journal) through the process's cache for as long as it holds
//! the lock (`src/locking/hold.rs`), and hands the database over whole:
//! when the lock is released (`locking_mode=NORMAL`, then a transaction)
//! another process on the unix VFS reads every commit, and when this
//! process takes the lock again after that process wrote, nothing stale is
//! served.
//! Its own test binary: it reads the process-wide counters. Without
//! `sqlite3` the shell tests report themselves ignored, with the reason
//! (CI installs it).

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::procs::{is_error, Shell};
use common::{int, open, stat, text};
use rusqlite::Connection;

/// The tests read the process-wide cache's counters: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Insert `n` rows of 300 random bytes numbered from `from`.
fn insert(db: &Connection, from: i64, n: i64) {
    let tx = db.unchecked_transaction().unwrap();
    {
        let mut st = tx
            .prepare("INSERT INTO t(n, v) VALUES (?1, randomblob(300))")
            .unwrap();
        for i in from..from + n {
            st.execute([i]).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// `count(*)` and `sum(n)` of `t`, as the shell prints them.
fn totals(db: &Connection) -> String {
    db.query_row("SELECT count(*) || '|' || sum(n) FROM t", [], |r| {
        r.get::<_, String>(0)
    })
    .unwrap()
}

/// The bytes of rows 1..=2500, summed up (each row's first 16 bytes, in
/// order, and the total length).
const DIGEST: &str = "SELECT sum(length(v)) || '|' || group_concat(hex(substr(v, 1, 16)), '') \
     FROM (SELECT v FROM t WHERE id <= 2500 ORDER BY id)";

fn expected(rows: i64) -> String {
    format!("{rows}|{}", rows * (rows - 1) / 2)
}

/// Hand the database over: `locking_mode=NORMAL`, then a transaction
/// (which finds `rows` rows) releases the hold; a unix-VFS shell opened
/// next finds the same rows and is returned.
fn hand_over(db: &Connection, p: &std::path::Path, rows: i64) -> Shell {
    db.execute_batch("PRAGMA locking_mode=NORMAL;").unwrap();
    assert_eq!(totals(db), expected(rows));
    let mut sh = Shell::unix(p, 10_000);
    assert_eq!(
        sh.one("SELECT count(*) || '|' || sum(n) FROM t;"),
        expected(rows)
    );
    sh
}

/// A scan whose pages SQLite's own cache (10 pages) cannot hold: each is
/// read from the VFS, here from the WAL.
fn scan(db: &Connection) -> i64 {
    int(db, "SELECT sum(length(v)) FROM t")
}

fn a_wal_is_read_through_the_cache_while_locking_mode_exclusive_holds_the_lock() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("held.db");
    let db = open(&p, "").unwrap();
    assert!(text(&db, "PRAGMA kx_settings").ends_with("locking=shared"));
    db.execute_batch(
        "PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=wal; PRAGMA wal_autocheckpoint=0;
         PRAGMA cache_size=10; CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, v BLOB);",
    )
    .unwrap();
    insert(&db, 0, 3000);
    // Every page of t is in the WAL (no checkpoint): the scans read it.
    let pages = int(&db, "PRAGMA page_count");
    assert!(pages > 200, "{pages} pages");
    assert_eq!(scan(&db), 3000 * 300);
    let (hits, held) = (stat(&db, "hits"), stat(&db, "held_reads"));
    assert_eq!(scan(&db), 3000 * 300);
    let hits = stat(&db, "hits") - hits;
    let held = stat(&db, "held_reads") - held;
    // Read through the cache, and the second scan found the frames there
    // (before: `pread` on the WAL, which the cache never sees).
    let most = pages * 9 / 10;
    assert!(
        held as i64 >= most,
        "{held} reads of the WAL through the cache, {pages} pages"
    );
    assert!(
        hits as i64 >= most,
        "{hits} hits for a scan of {pages} pages from the WAL"
    );

    // A checkpoint that truncates the WAL, then more frames at the same
    // offsets: still right, through the same cache.
    assert_eq!(int(&db, "PRAGMA wal_checkpoint(TRUNCATE)"), 0, "not busy");
    db.execute("UPDATE t SET n = n + 1", []).unwrap();
    db.execute("UPDATE t SET n = n - 1", []).unwrap();
    assert_eq!(totals(&db), expected(3000));
    assert_eq!(scan(&db), 3000 * 300);
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");
    drop(db);
    let unix = Connection::open(&p).unwrap();
    assert_eq!(totals(&unix), expected(3000));
}

fn without_the_pragma_a_shared_wal_stays_out_of_the_cache() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("plain.db");
    let db = open(&p, "").unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=wal; PRAGMA wal_autocheckpoint=0; PRAGMA cache_size=10;
         CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, v BLOB);",
    )
    .unwrap();
    insert(&db, 0, 1000);
    let held = stat(&db, "held_reads");
    assert_eq!(scan(&db), 1000 * 300);
    assert_eq!(stat(&db, "held_reads"), held, "no hold without the pragma");
}

/// This process holds the database under `locking_mode=EXCLUSIVE` and
/// reads its WAL through the cache; the shell (unix VFS) is locked out;
/// `locking_mode=NORMAL` and a transaction hand it over; the shell sees
/// every commit, restarts the WAL and writes frames at the offsets this
/// process cached; this process takes the lock again and reads them right.
fn the_hold_hands_the_wal_over_to_another_process_and_back() {
    harness::require(harness::tool("sqlite3", "sqlite3"));
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("handover.db");
    let db = open(&p, "").unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=wal; PRAGMA wal_autocheckpoint=0; PRAGMA cache_size=10;
         CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, v BLOB);",
    )
    .unwrap();
    insert(&db, 0, 200);
    // The WAL and its -shm are open: now the pragma, then a write takes
    // EXCLUSIVE and keeps it.
    db.execute_batch("PRAGMA locking_mode=EXCLUSIVE;").unwrap();
    insert(&db, 200, 1800);
    let held = stat(&db, "held_reads");
    assert_eq!(scan(&db), 2000 * 300);
    assert!(
        stat(&db, "held_reads") > held,
        "the WAL read through the cache"
    );

    let mut probe = Shell::unix(&p, 0);
    let out = probe.run("SELECT count(*) FROM t;");
    assert!(
        out.iter().any(|l| is_error(l) && l.contains("locked")),
        "the hold keeps others out: {out:?}"
    );
    probe.quit(); // with the error's status

    // Hand over: NORMAL, then a transaction releases the lock.
    let mut sh = hand_over(&db, &p, 2000);
    // The shell checkpoints and restarts the WAL, then writes frames from
    // its start: the offsets this process's cache held, other bytes now.
    sh.ok("PRAGMA wal_checkpoint(RESTART);");
    sh.ok("UPDATE t SET v = randomblob(300) WHERE n % 3 = 0;");
    sh.ok(
        "WITH RECURSIVE k(i) AS (SELECT 2000 UNION ALL SELECT i + 1 FROM k WHERE i < 2499) \
         INSERT INTO t(n, v) SELECT i, zeroblob(300) FROM k;",
    );
    let sums = sh.one(&format!("{DIGEST};"));
    assert_eq!(totals(&db), expected(2500));
    // A WAL-mode connection keeps SHARED while it is open: the shell goes.
    assert!(sh.quit());

    // Take the lock again: a new hold, whose cache must not serve the
    // frames of the last one.
    db.execute_batch("PRAGMA locking_mode=EXCLUSIVE;").unwrap();
    insert(&db, 2500, 1);
    let held = stat(&db, "held_reads");
    let mine = text(&db, DIGEST);
    assert!(
        stat(&db, "held_reads") > held,
        "read through the cache again"
    );
    assert_eq!(mine, sums, "the rows the shell wrote, as it wrote them");
    assert_eq!(totals(&db), expected(2501));
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");

    // And over again: every frame of this hold is in the file.
    let mut sh = hand_over(&db, &p, 2501);
    assert_eq!(sh.one("PRAGMA integrity_check;"), "ok");
    assert!(sh.quit());
}

/// The rollback journal the same way: under the hold a rollback reads the
/// journal through the cache; handed over, the shell sees every commit and
/// none of the rolled-back changes, writes its own, and a new hold rolls
/// back over the journal the shell's transactions left.
fn a_rollback_journal_under_the_hold_and_handed_over() {
    harness::require(harness::tool("sqlite3", "sqlite3"));
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("journal.db");
    let db = open(&p, "").unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=delete; PRAGMA cache_size=10;
         CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, v BLOB);",
    )
    .unwrap();
    insert(&db, 0, 1000);
    db.execute_batch("PRAGMA locking_mode=EXCLUSIVE;").unwrap();
    let rollback = |db: &Connection| {
        db.execute_batch("BEGIN; UPDATE t SET n = -1, v = zeroblob(10); ROLLBACK;")
            .unwrap();
    };
    db.execute("UPDATE t SET v = v WHERE id = 1", []).unwrap(); // takes EXCLUSIVE
    let held = stat(&db, "held_reads");
    rollback(&db);
    assert!(
        stat(&db, "held_reads") > held,
        "the journal read through the cache"
    );
    assert_eq!(totals(&db), expected(1000));
    assert_eq!(scan(&db), 1000 * 300);

    let mut sh = hand_over(&db, &p, 1000);
    sh.ok("UPDATE t SET v = randomblob(300) WHERE n % 2 = 0;");
    sh.ok(
        "WITH RECURSIVE k(i) AS (SELECT 1000 UNION ALL SELECT i + 1 FROM k WHERE i < 1499) \
         INSERT INTO t(n, v) SELECT i, zeroblob(300) FROM k;",
    );
    let sums = sh.one(&format!("{DIGEST};"));
    assert!(sh.quit());

    db.execute_batch("PRAGMA locking_mode=EXCLUSIVE;").unwrap();
    db.execute("UPDATE t SET v = v WHERE id = 1", []).unwrap();
    rollback(&db);
    assert_eq!(
        text(&db, DIGEST),
        sums,
        "the shell's rows, as it wrote them"
    );
    assert_eq!(totals(&db), expected(1500));
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");
    let mut sh = hand_over(&db, &p, 1500);
    assert_eq!(sh.one("PRAGMA integrity_check;"), "ok");
    assert!(sh.quit());
}

harness::main!(
    tests: [
        a_wal_is_read_through_the_cache_while_locking_mode_exclusive_holds_the_lock,
        without_the_pragma_a_shared_wal_stays_out_of_the_cache,
        the_hold_hands_the_wal_over_to_another_process_and_back,
        a_rollback_journal_under_the_hold_and_handed_over,
    ],
);
