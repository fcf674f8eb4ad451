//! The VFS under rusqlite (bundled SQLite, static registration): journal
//! modes, WAL, locks across connections and threads, temporary files,
//! truncation, size hints, fetch, pragmas, settings.

mod common;

use common::{int, open, stat, text};
use rusqlite::{params, Connection, ErrorCode};
use std::path::Path;
use std::time::Duration;

fn fill(db: &Connection, rows: i64) {
    db.execute_batch("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB, s TEXT)")
        .unwrap();
    let tx = db.unchecked_transaction().unwrap();
    {
        let mut st = tx
            .prepare("INSERT INTO t(v, s) VALUES (randomblob(300), printf('row %d', ?1))")
            .unwrap();
        for i in 0..rows {
            st.execute([i]).unwrap();
        }
    }
    tx.commit().unwrap();
}

fn check(db: &Connection) {
    assert_eq!(text(db, "PRAGMA integrity_check"), "ok");
}

#[test]
fn every_journal_mode_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["delete", "truncate", "persist", "wal", "memory", "off"] {
        for sync in ["off", "normal", "full"] {
            let p = dir.path().join(format!("{mode}-{sync}.db"));
            {
                let db = open(&p, "").unwrap();
                assert_eq!(text(&db, &format!("PRAGMA journal_mode={mode}")), mode);
                db.execute_batch(&format!("PRAGMA synchronous={sync}"))
                    .unwrap();
                fill(&db, 500);
                db.execute("UPDATE t SET s = s || '!' WHERE id % 3 = 0", [])
                    .unwrap();
                db.execute("DELETE FROM t WHERE id % 7 = 0", []).unwrap();
                // a rolled-back transaction leaves nothing
                db.execute_batch("BEGIN; DELETE FROM t; ROLLBACK;").unwrap();
                check(&db);
                assert_eq!(int(&db, "SELECT count(*) FROM t"), 500 - 500 / 7);
            }
            // reopened (a new inode in the process table): same content
            let db = open(&p, "").unwrap();
            check(&db);
            assert_eq!(int(&db, "SELECT count(*) FROM t"), 500 - 500 / 7);
            assert_eq!(
                int(&db, "SELECT count(*) FROM t WHERE s LIKE '%!'"),
                167 - 24
            );
            drop(db);
            // and the unix VFS (bundled SQLite's default) reads the same
            let u = Connection::open(&p).unwrap();
            check(&u);
            assert_eq!(int(&u, "SELECT count(*) FROM t"), 500 - 500 / 7);
        }
    }
}

#[test]
fn pragmas_and_vfsname() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir.path().join("p.db"), "kx_fetch=0").unwrap();
    fill(&db, 10);
    let s = text(&db, "PRAGMA kx_stats");
    assert!(s.contains("capacity=") && s.contains("hits="), "{s}");
    assert!(stat(&db, "writes") > 0);
    let set = text(&db, "PRAGMA kx_settings");
    assert!(set.contains("fetch=0") && set.contains("direct=0"), "{set}");
    // SQLITE_FCNTL_VFSNAME (what `.vfsname` prints)
    let name = common::vfsname(&db);
    assert_eq!(name, "kxarray");
    // other pragmas are still SQLite's
    assert_eq!(int(&db, "PRAGMA page_size"), 4096);
    assert!(kxarray_sqlite::stats().unwrap().contains("misses="));
}

#[test]
fn bad_settings_refuse_to_open() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        "kx_cache=lots",
        "kx_cache=4k",
        "kx_direct=maybe",
        "kx_fetch=2",
    ] {
        let e = open(&dir.path().join("bad.db"), bad)
            .and_then(|db| db.execute_batch("CREATE TABLE x(y)"))
            .unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(ErrorCode::CannotOpen),
            "{bad}: {e}"
        );
    }
}

#[test]
fn lock_levels_across_connections() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("locks.db");
    let a = open(&p, "").unwrap();
    let b = open(&p, "").unwrap();
    fill(&a, 10);
    // two writers: the second is busy
    a.execute_batch("BEGIN IMMEDIATE").unwrap();
    let e = b.execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    // a reader can read while a writer holds RESERVED
    assert_eq!(int(&b, "SELECT count(*) FROM t"), 10);
    a.execute("INSERT INTO t(v, s) VALUES (1, 'a')", [])
        .unwrap();
    // the reader does not see uncommitted rows
    assert_eq!(int(&b, "SELECT count(*) FROM t"), 10);
    // a reader inside a transaction keeps its SHARED lock: COMMIT is busy
    b.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
    let mut st = b.prepare("SELECT id FROM t").unwrap();
    let mut rows = st.query([]).unwrap();
    rows.next().unwrap();
    let e = a.execute_batch("COMMIT").unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    drop(rows);
    drop(st);
    b.execute_batch("COMMIT").unwrap();
    a.execute_batch("COMMIT").unwrap();
    assert_eq!(int(&b, "SELECT count(*) FROM t"), 11);
    check(&b);
}

#[test]
fn wal_readers_and_a_writer_on_threads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("wal.db");
    let db = open(&p, "").unwrap();
    assert_eq!(text(&db, "PRAGMA journal_mode=wal"), "wal");
    fill(&db, 100);
    let writer = {
        let p = p.clone();
        std::thread::spawn(move || {
            let w = open(&p, "").unwrap();
            w.busy_timeout(Duration::from_secs(10)).unwrap();
            for i in 0..300 {
                w.execute("INSERT INTO t(v, s) VALUES (zeroblob(100), ?1)", params![i])
                    .unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let r = open(&p, "").unwrap();
                r.busy_timeout(Duration::from_secs(10)).unwrap();
                let mut last = 0;
                for _ in 0..200 {
                    // a snapshot only grows, and is consistent
                    let (n, m): (i64, i64) = r
                        .query_row("SELECT count(*), max(id) FROM t", [], |x| {
                            Ok((x.get(0)?, x.get(1)?))
                        })
                        .unwrap();
                    assert!(n >= last);
                    assert_eq!(n, m);
                    last = n;
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 400);
    int(&db, "PRAGMA wal_checkpoint(TRUNCATE)");
    check(&db);
    drop(db);
    let u = Connection::open(&p).unwrap();
    assert_eq!(int(&u, "SELECT count(*) FROM t"), 400);
}

#[test]
fn temporary_files_and_temp_databases() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir.path().join("tmp.db"), "").unwrap();
    db.execute_batch("PRAGMA temp_store=FILE; PRAGMA cache_size=10;")
        .unwrap();
    fill(&db, 3000);
    // a sort bigger than the page cache spills to temporary files
    let first: String = db
        .query_row("SELECT s FROM t ORDER BY v LIMIT 1", [], |r| r.get(0))
        .unwrap();
    assert!(first.starts_with("row "));
    db.execute_batch("CREATE TEMP TABLE tt AS SELECT * FROM t; CREATE INDEX temp.i ON tt(v);")
        .unwrap();
    assert_eq!(int(&db, "SELECT count(*) FROM tt"), 3000);
    // an anonymous attached database (a temporary file with no name)
    db.execute_batch("ATTACH '' AS anon; CREATE TABLE anon.x AS SELECT id FROM t;")
        .unwrap();
    assert_eq!(int(&db, "SELECT sum(id) FROM anon.x"), 3000 * 3001 / 2);
}

#[test]
fn truncation_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("trunc.db");
    let db = open(&p, "").unwrap();
    fill(&db, 4000);
    let big = std::fs::metadata(&p).unwrap().len();
    db.execute_batch("DELETE FROM t WHERE id > 100; VACUUM;")
        .unwrap();
    let small = std::fs::metadata(&p).unwrap().len();
    assert!(small * 4 < big, "{small} vs {big}");
    assert_eq!(small as i64, int(&db, "PRAGMA page_count") * 4096);
    check(&db);
    // xFileSize agrees with the file
    let size = common::vfs_file_size(&db);
    assert_eq!(size as u64, small);
}

#[test]
fn chunk_size_and_size_hint_grow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("chunk.db");
    let db = open(&p, "").unwrap();
    assert_eq!(
        common::file_control_int(&db, rusqlite::ffi::SQLITE_FCNTL_CHUNK_SIZE, 1 << 20),
        0
    );
    fill(&db, 10);
    // SQLite hints the size before growing the file: whole chunks
    let len = std::fs::metadata(&p).unwrap().len();
    assert_eq!(len % (1 << 20), 0, "{len}");
    assert!(len >= 1 << 20);
    assert_eq!(
        common::file_control_i64(&db, rusqlite::ffi::SQLITE_FCNTL_SIZE_HINT, 5 << 20),
        0
    );
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 5 << 20);
    check(&db);
}

#[test]
fn fetch_serves_mmap_reads_and_stays_coherent() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fetch.db");
    let db = open(&p, "kx_fetch=1&kx_shared=0").unwrap();
    fill(&db, 2000);
    db.execute_batch("PRAGMA mmap_size=268435456").unwrap();
    let before = stat(&db, "fetches");
    let sum = int(&db, "SELECT sum(length(v)) FROM t");
    assert_eq!(sum, 2000 * 300);
    assert!(
        stat(&db, "fetches") > before,
        "mmap reads went through xFetch"
    );
    // a second connection writes; the first sees the new bytes after
    let w = open(&p, "").unwrap();
    w.execute("UPDATE t SET s = 'changed' WHERE id = 7", [])
        .unwrap();
    drop(w);
    assert_eq!(text(&db, "SELECT s FROM t WHERE id = 7"), "changed");
    check(&db);
    // with kx_fetch=0 no fetch is served
    let n = open(&p, "kx_fetch=0").unwrap();
    n.execute_batch("PRAGMA mmap_size=268435456").unwrap();
    let before = stat(&n, "fetches");
    assert_eq!(int(&n, "SELECT count(*) FROM t"), 2000);
    assert_eq!(stat(&n, "fetches"), before);
}

/// A connection keeps the references of pages SQLite let go of and reuses
/// them only while they hold the file's bytes: another connection's
/// commits (rollback journal: into the database file) and checkpoints
/// (WAL) must show up in the next read, round after round, on the same hot
/// pages.
#[test]
fn kept_fetch_references_never_serve_stale_pages() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["delete", "wal"] {
        let p = dir.path().join(format!("kept-{mode}.db"));
        let r = open(&p, "kx_fetch=1&kx_shared=0").unwrap();
        assert_eq!(text(&r, &format!("PRAGMA journal_mode={mode}")), mode);
        fill(&r, 300);
        r.execute_batch("PRAGMA mmap_size=268435456").unwrap();
        let w = open(&p, "").unwrap();
        let mut now: Vec<String> = (0..=300).map(|i| format!("row {}", i - 1)).collect();
        let before = stat(&r, "fetches");
        for round in 0..60 {
            let id = 1 + round % 12;
            let q = format!("SELECT s FROM t WHERE id = {id}");
            assert_eq!(text(&r, &q), now[id], "{mode}, round {round}");
            let v = format!("{mode} round {round}");
            w.execute("UPDATE t SET s = ?1 WHERE id = ?2", params![v, id as i64])
                .unwrap();
            if mode == "wal" {
                w.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
            }
            now[id] = v;
            assert_eq!(text(&r, &q), now[id], "{mode}, round {round}: a stale page");
        }
        assert!(
            stat(&r, "fetches") > before,
            "{mode}: reads went through xFetch"
        );
        check(&r);
    }
}

/// Pages a reader holds hot (fetched again and again: the B-tree's root
/// and interior pages, a one-page table) never serve stale bytes while a
/// writer on another thread commits (rollback journal: into the database
/// file; WAL: checkpointed after every commit): two rows the writer keeps
/// equal always read equal, and never older than the last commit that
/// returned before the read began. The reader must have served pages from
/// held references, or the test proves nothing.
#[test]
fn held_hot_pages_never_serve_stale_bytes_across_threads() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    for mode in ["delete", "wal"] {
        let p = dir.path().join(format!("hot-{mode}.db"));
        let r = open(&p, "kx_fetch=1&kx_shared=0").unwrap();
        r.busy_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(text(&r, &format!("PRAGMA journal_mode={mode}")), mode);
        fill(&r, 2000);
        r.execute_batch(
            "CREATE TABLE c(k INTEGER PRIMARY KEY, n INTEGER);
             INSERT INTO c VALUES (1, 0), (2, 0);
             PRAGMA mmap_size=268435456;",
        )
        .unwrap();
        let committed = Arc::new(AtomicI64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (p, committed, done) = (p.clone(), Arc::clone(&committed), Arc::clone(&done));
            std::thread::spawn(move || {
                let w = open(&p, "").unwrap();
                w.busy_timeout(Duration::from_secs(30)).unwrap();
                for n in 1..=300i64 {
                    w.execute_batch("BEGIN IMMEDIATE").unwrap();
                    w.execute("UPDATE c SET n = ?1", [n]).unwrap();
                    // and a row of t, so interior pages of t move too
                    w.execute(
                        "UPDATE t SET s = printf('w %d', ?1) WHERE id = 1 + ?1 * 7 % 2000",
                        [n],
                    )
                    .unwrap();
                    w.execute_batch("COMMIT").unwrap();
                    committed.store(n, SeqCst);
                    if mode == "wal" {
                        w.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                            .unwrap();
                    }
                }
                done.store(true, SeqCst);
            })
        };
        let held = stat(&r, "fetches_held");
        let mut reads = 0;
        let mut q = r
            .prepare(
                "SELECT (SELECT n FROM c WHERE k = 1), (SELECT n FROM c WHERE k = 2),
                        (SELECT length(v) FROM t WHERE id = ?1)",
            )
            .unwrap();
        while !done.load(SeqCst) || reads < 100 {
            let floor = committed.load(SeqCst);
            let (a, b, len): (i64, i64, i64) = q
                .query_row([1 + reads % 2000], |x| {
                    Ok((x.get(0)?, x.get(1)?, x.get(2)?))
                })
                .unwrap();
            assert_eq!(a, b, "{mode}: read {reads} saw a torn commit");
            assert!(
                a >= floor,
                "{mode}: read {reads} saw {a}, older than {floor}"
            );
            assert_eq!(len, 300);
            reads += 1;
        }
        drop(q);
        writer.join().unwrap();
        assert!(
            stat(&r, "fetches_held") > held,
            "{mode}: no fetch was served from a held page"
        );
        assert_eq!(int(&r, "SELECT n FROM c WHERE k = 2"), 300);
        check(&r);
    }
}

/// The reproduction: with fetch on, a cache spill writes a page of
/// a folio that a fetched page of the other table holds. Run in a thread;
/// a hang fails the test after 60 s instead of hanging it.
#[test]
fn update_with_tiny_cache_and_fetch_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("spill.db");
    let (tx, rx) = std::sync::mpsc::channel();
    let p2 = p.clone();
    std::thread::spawn(move || {
        let r = (|| -> rusqlite::Result<i64> {
            let db = open(&p2, "kx_fetch=1")?;
            db.execute_batch(
                "CREATE TABLE a(id INTEGER PRIMARY KEY, v BLOB);
                 CREATE TABLE b(id INTEGER PRIMARY KEY, v BLOB);",
            )?;
            let txn = db.unchecked_transaction()?;
            for i in 0..4000 {
                // interleaved inserts: the two tables' pages interleave
                txn.execute("INSERT INTO a VALUES (?1, randomblob(300))", [i])?;
                txn.execute("INSERT INTO b VALUES (?1, zeroblob(300))", [i])?;
            }
            txn.commit()?;
            // Reopen: the file's folios go with its last handle, and the
            // reads below come back through readahead in large folios
            // holding pages of both tables.
            drop(db);
            let db = open(&p2, "kx_fetch=1")?;
            db.execute_batch("PRAGMA mmap_size=268435456; PRAGMA cache_size=5;")?;
            let n: i64 =
                db.query_row("SELECT count(*) FROM a JOIN b USING(id)", [], |r| r.get(0))?;
            assert_eq!(n, 4000);
            db.execute("UPDATE b SET v=(SELECT v FROM a WHERE a.id=b.id)", [])?;
            db.query_row(
                "SELECT count(*) FROM a JOIN b USING(id) WHERE a.v = b.v",
                [],
                |r| r.get(0),
            )
        })();
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => assert_eq!(r.unwrap(), 4000),
        Err(_) => panic!("the UPDATE hung for 60 s (self-deadlock on a fetched folio)"),
    }
}

#[test]
fn a_second_cache_size_is_a_notice_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(&dir.path().join("c1.db"), "kx_cache=64m").unwrap();
    fill(&a, 5);
    let b = open(&dir.path().join("c2.db"), "kx_cache=32m").unwrap();
    fill(&b, 5);
    // one process-wide cache: both report the same capacity
    assert_eq!(stat(&a, "capacity"), stat(&b, "capacity"));
}

#[test]
fn read_only_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro.db");
    {
        let db = open(&p, "").unwrap();
        fill(&db, 20);
    }
    common::setup();
    let ro = Connection::open_with_flags(
        format!("file:{}?vfs=kxarray", p.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    assert_eq!(int(&ro, "SELECT count(*) FROM t"), 20);
    let e = ro.execute("DELETE FROM t", []).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::ReadOnly));
    assert!(Path::new(&p).exists());
}

/// `kx_locking=exclusive`: the one OFD lock over SQLite's lock bytes
/// conflicts with the unix VFS's POSIX locks (even in the same process),
/// for as long as kxarray has the file open.
#[test]
fn with_kx_locking_exclusive_the_unix_vfs_is_kept_out() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("excl.db");
    let db = open(&p, "kx_locking=exclusive").unwrap();
    fill(&db, 5);
    let u = Connection::open(&p).unwrap();
    let e = u
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy), "{e}");
    drop(db);
    // released with the last kxarray handle
    assert_eq!(int(&u, "SELECT count(*) FROM t"), 5);
    // and the other way round: kxarray waits for the unix VFS's lock
    u.execute_batch("BEGIN IMMEDIATE").unwrap();
    let k = open(&p, "kx_locking=exclusive").unwrap();
    let e = k
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy), "{e}");
    u.execute_batch("COMMIT").unwrap();
    drop(u);
    assert_eq!(int(&k, "SELECT count(*) FROM t"), 5);
}

/// The default (shared) locking mode takes the unix VFS's locks on its
/// bytes: a unix-VFS connection reads while kxarray has the file open, a
/// kxarray reader reads beside a unix-VFS writer's RESERVED lock, and a
/// second writer gets `SQLITE_BUSY` exactly where the unix VFS gives it.
#[test]
fn shared_locking_takes_the_unix_vfs_locks() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shared.db");
    let db = open(&p, "").unwrap();
    fill(&db, 5);
    let u = Connection::open(&p).unwrap();
    for c in [&db, &u] {
        c.busy_timeout(Duration::ZERO).unwrap();
    }
    assert_eq!(int(&u, "SELECT count(*) FROM t"), 5);
    u.execute_batch("BEGIN IMMEDIATE; INSERT INTO t(id) VALUES(100);")
        .unwrap();
    // a reader beside RESERVED, which does not see the uncommitted row
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 5);
    // a second writer: busy at RESERVED, as between two unix-VFS connections
    let e = db.execute("INSERT INTO t(id) VALUES(101)", []).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy), "{e}");
    u.execute_batch("COMMIT").unwrap();
    // the unix VFS's commit is seen by kxarray's next transaction
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 6);
    // a kxarray reader holds SHARED: the unix writer cannot commit
    db.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
    let e = u.execute("INSERT INTO t(id) VALUES(102)", []).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy), "{e}");
    db.execute_batch("COMMIT").unwrap();
    u.execute("INSERT INTO t(id) VALUES(102)", []).unwrap();
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 7);
    drop(u);
}

/// Two connections of one thread in WAL mode with fetch on: a reader in
/// the middle of a scan holds fetched pages; the other connection's
/// checkpoint writes pages of the same folios. Today's `FolioRef` makes the
/// checkpoint's write wait for the reader, on the reader's own thread. Run
/// in a thread; a hang fails the test after 60 s.
#[test]
fn checkpoint_under_a_reader_holding_fetched_pages_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ckpt.db");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| -> rusqlite::Result<i64> {
            {
                let db = open(&p, "kx_fetch=1&kx_shared=0")?;
                db.execute_batch(
                    "PRAGMA journal_mode=wal;
                     CREATE TABLE a(id INTEGER PRIMARY KEY, v BLOB);
                     CREATE TABLE b(id INTEGER PRIMARY KEY, v BLOB);",
                )?;
                let txn = db.unchecked_transaction()?;
                for i in 0..4000 {
                    txn.execute("INSERT INTO a VALUES (?1, randomblob(300))", [i])?;
                    txn.execute("INSERT INTO b VALUES (?1, zeroblob(300))", [i])?;
                }
                txn.commit()?;
                int(&db, "PRAGMA wal_checkpoint(TRUNCATE)");
            }
            // Fresh inode: reads come back in large folios.
            let w = open(&p, "kx_fetch=1&kx_shared=0")?;
            let r = open(&p, "kx_fetch=1&kx_shared=0")?;
            r.execute_batch("PRAGMA mmap_size=268435456")?;
            let both: i64 =
                r.query_row("SELECT count(*) FROM a JOIN b USING(id)", [], |x| x.get(0))?;
            assert_eq!(both, 4000);
            w.execute_batch("PRAGMA wal_autocheckpoint=0; UPDATE b SET v = randomblob(300);")?;
            let mut st = r.prepare("SELECT length(v) FROM a")?;
            let mut rows = st.query([])?;
            let mut n = 0i64;
            // into the middle of the table, where readahead made the folios
            // large
            for _ in 0..2000 {
                n += rows.next()?.unwrap().get::<_, i64>(0)?;
            }
            // the reader holds fetched pages of a; b's pages go to the db
            let ck: (i64, i64, i64) = w.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |x| {
                Ok((x.get(0)?, x.get(1)?, x.get(2)?))
            })?;
            assert!(ck.2 > 0, "the checkpoint wrote pages: {ck:?}");
            while let Some(row) = rows.next()? {
                n += row.get::<_, i64>(0)?;
            }
            Ok(n)
        })();
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => assert_eq!(r.unwrap(), 4000 * 300),
        Err(_) => panic!("the checkpoint hung for 60 s behind a fetched folio"),
    }
}
