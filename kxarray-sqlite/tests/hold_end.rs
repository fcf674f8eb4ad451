//! A hold's end (a connection of this process leaves EXCLUSIVE) never
//! takes what the file holds then as this process's own unless this
//! process wrote it: a database rewritten outside SQLite while a
//! connection held it (a backup restored with plain file I/O under
//! `test_superlock.c`'s superlock, SQLite's `exclusive2.test`) is seen by
//! the process's other connections at their next lock, as on the unix VFS.

mod common;

use rusqlite::{ffi, Connection, OpenFlags};
use std::os::raw::c_void;
use std::path::Path;

fn open(db: &Path, vfs: &str) -> Connection {
    if vfs == "kxarray" {
        common::setup();
    }
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).unwrap()
}

fn names(c: &Connection) -> Vec<String> {
    let mut s = c
        .prepare("SELECT name FROM sqlite_master ORDER BY name")
        .unwrap();
    s.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The rollback-mode case: a second connection holds EXCLUSIVE
/// (`BEGIN EXCLUSIVE`, writing nothing) while the file is overwritten with
/// another database's bytes; the first connection then reads the new file.
fn overwritten_under_begin_exclusive(vfs: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let (db, other) = (dir.path().join("test.db"), dir.path().join("other.db"));
    // three transactions: a change counter SQLite's pager tells from the
    // old file's two
    open(&other, "unix")
        .execute_batch(
            "CREATE TABLE t2(b); INSERT INTO t2 VALUES('new'); INSERT INTO t2 VALUES('new');",
        )
        .unwrap();
    let c = open(&db, vfs);
    c.execute_batch("CREATE TABLE t1(a); INSERT INTO t1 VALUES('old');")
        .unwrap();
    assert_eq!(names(&c), ["t1"]);
    let lk = open(&db, vfs);
    lk.execute_batch("BEGIN EXCLUSIVE").unwrap();
    std::fs::write(&db, std::fs::read(&other).unwrap()).unwrap();
    lk.execute_batch("COMMIT").unwrap();
    drop(lk);
    names(&c)
}

#[test]
fn a_file_rewritten_under_another_connection_s_exclusive_lock_is_seen() {
    assert_eq!(overwritten_under_begin_exclusive("unix"), ["t2"]);
    assert_eq!(overwritten_under_begin_exclusive("kxarray"), ["t2"]);
}

/// `exclusive2-2.x`: under `locking_mode=EXCLUSIVE` a connection writes,
/// then the file's pages and change counter are overwritten outside
/// SQLite; SQLite keeps serving its own cache while it holds the lock, and
/// once `locking_mode=normal` lets the lock go, the next statement finds
/// the header moved, rereads the (zeroed) pages and reports the corruption.
fn exclusive2_2(vfs: &str) -> (String, String, Result<String, String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("test.db");
    let c = open(&db, vfs);
    let sig = |c: &Connection| -> rusqlite::Result<String> {
        c.query_row(
            "SELECT count(*) || ':' || sum(length(a)) FROM t1",
            [],
            |r| r.get(0),
        )
    };
    c.execute_batch(
        "PRAGMA page_size=1024; PRAGMA cache_size=1000; PRAGMA locking_mode=exclusive;
         BEGIN;
         CREATE TABLE t1(a, b);
         INSERT INTO t1(a) VALUES(randomblob(400));
         INSERT INTO t1(a) VALUES(randomblob(400));
         INSERT INTO t1(a) SELECT randomblob(400) FROM t1;
         INSERT INTO t1(a) SELECT randomblob(400) FROM t1;
         INSERT INTO t1(a) SELECT randomblob(400) FROM t1;
         INSERT INTO t1(a) SELECT randomblob(400) FROM t1;
         INSERT INTO t1(a) SELECT randomblob(400) FROM t1;
         COMMIT;",
    )
    .unwrap();
    let before = sig(&c).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
        f.write_all_at(&[0u8; 10000], 1024).unwrap();
        f.write_all_at(&5u32.to_be_bytes(), 24).unwrap();
    }
    let held = sig(&c).unwrap();
    c.execute_batch("PRAGMA locking_mode=normal").unwrap();
    sig(&c).unwrap();
    let after = sig(&c).map_err(|e| e.to_string());
    (before, held, after)
}

#[test]
fn exclusive2_corruption_is_seen_once_the_exclusive_lock_goes() {
    for vfs in ["unix", "kxarray"] {
        let (before, held, after) = exclusive2_2(vfs);
        assert_eq!(before, "64:25600", "{vfs}");
        assert_eq!(
            held, before,
            "{vfs}: served from SQLite's cache under the lock"
        );
        assert_eq!(
            after,
            Err("database disk image is malformed".into()),
            "{vfs}: after the lock went"
        );
    }
}

/// `sqlite3demo_superlock` (`test_superlock.c`) on a WAL database: a
/// connection's `BEGIN EXCLUSIVE` and `COMMIT` (no other connection is in
/// a transaction), then the WAL recovery lock, the index header zeroed (every other connection must
/// run recovery), and every read-mark lock, all through the file's own
/// `xShmMap`/`xShmLock`.
struct Superlock {
    db: Connection,
    file: *mut ffi::sqlite3_file,
}

impl Superlock {
    fn take(path: &Path, vfs: &str) -> Superlock {
        let db = open(path, vfs);
        // as `sqlite3demo_superlock`: BEGIN EXCLUSIVE, and in WAL mode its
        // COMMIT (the WAL locks it took would conflict with the new ones)
        db.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let mode: String = db
            .query_row("PRAGMA main.journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        db.execute_batch("COMMIT").unwrap();
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: FILE_POINTER takes a sqlite3_file** it fills.
        let rc = unsafe {
            common::file_control(&db, ffi::SQLITE_FCNTL_FILE_POINTER, (&raw mut file).cast())
        };
        assert_eq!(rc, 0);
        let s = Superlock { db, file };
        assert_eq!(s.shm_lock(2, 1, ffi::SQLITE_SHM_LOCK), 0);
        let mut p: *mut c_void = std::ptr::null_mut();
        let map = s.methods().xShmMap.unwrap();
        // SAFETY: region 0 of 32 KiB, extended if missing.
        assert_eq!(unsafe { map(s.file, 0, 32 * 1024, 1, &mut p) }, 0);
        // SAFETY: the mapped region holds at least 32 bytes; the recovery
        // lock keeps every other writer of them out.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, 32) };
        assert_eq!(s.shm_lock(3, 5, ffi::SQLITE_SHM_LOCK), 0);
        s
    }

    /// The open file's methods, alive while it is open.
    fn methods(&self) -> &ffi::sqlite3_io_methods {
        // SAFETY: the open file ...
        let m = unsafe { (*self.file).pMethods };
        // SAFETY: ... and its methods table.
        unsafe { &*m }
    }

    fn shm_lock(&self, at: i32, n: i32, op: i32) -> i32 {
        let lock = self.methods().xShmLock.unwrap();
        // SAFETY: its own method, on slots within the eight.
        unsafe { lock(self.file, at, n, op | ffi::SQLITE_SHM_EXCLUSIVE) }
    }

    fn release(self) {
        assert_eq!(self.shm_lock(2, 1, ffi::SQLITE_SHM_UNLOCK), 0);
        assert_eq!(self.shm_lock(3, 5, ffi::SQLITE_SHM_UNLOCK), 0);
        drop(self.db);
    }
}

fn content(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_default()
}

/// `superlock.test`'s `db_swap`: superlock both databases, exchange their
/// files' and WALs' contents, release.
fn db_swap(a: &Path, b: &Path, vfs: &str) {
    let (la, lb) = (Superlock::take(a, vfs), Superlock::take(b, vfs));
    let wal = |p: &Path| common::procs::sidecar(p, "-wal");
    let (da, db) = (content(a), content(b));
    std::fs::write(a, db).unwrap();
    std::fs::write(b, da).unwrap();
    let (wa, wb) = (content(&wal(a)), content(&wal(b)));
    std::fs::write(wal(a), wb).unwrap();
    std::fs::write(wal(b), wa).unwrap();
    la.release();
    lb.release();
}

fn try_rows(c: &Connection, sql: &str) -> Result<Vec<String>, String> {
    let mut s = c.prepare(sql).map_err(|e| e.to_string())?;
    let rows = s
        .query_map([], |r| r.get::<_, rusqlite::types::Value>(0))
        .map_err(|e| e.to_string())?;
    rows.map(|r| r.map(|v| format!("{v:?}")).map_err(|e| e.to_string()))
        .collect()
}

/// `superlock-6.*`: the answers of a connection that stays open while
/// its database and another are swapped under superlocks, again and again,
/// with a checkpoint and a VACUUM to another page size between.
fn superlock_6(vfs: &str) -> Vec<Result<Vec<String>, String>> {
    let dir = tempfile::tempdir().unwrap();
    let (t, t2) = (dir.path().join("test.db"), dir.path().join("test.db2"));
    let c = open(&t, vfs);
    c.execute_batch(&format!(
        "ATTACH '{}' AS aux;
         PRAGMA aux.journal_mode = wal;
         CREATE TABLE aux.t2(x, y);
         INSERT INTO aux.t2 VALUES('a', 'b');
         PRAGMA schema_version = 450;
         DETACH aux;
         PRAGMA main.journal_mode = wal;
         CREATE TABLE t1(a, b);
         INSERT INTO t1 VALUES(1, 2);
         INSERT INTO t1 VALUES(3, 4);",
        t2.display()
    ))
    .unwrap();
    let mut out = Vec::new();
    let look = |c: &Connection, out: &mut Vec<_>| {
        out.push(try_rows(c, "SELECT a FROM t1"));
        out.push(try_rows(c, "SELECT x FROM t2"));
    };
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    c.execute_batch("PRAGMA wal_checkpoint").unwrap();
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    for sql in [
        "PRAGMA journal_mode = delete",
        "PRAGMA page_size = 512",
        "VACUUM",
        "PRAGMA journal_mode = wal",
        "INSERT INTO t1 VALUES(5, 6)",
    ] {
        // one statement at a time, each stepped to its end (as Tcl's
        // `db eval` runs them)
        try_rows(&c, sql).unwrap();
    }
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    db_swap(&t2, &t, vfs);
    look(&c, &mut out);
    out
}

#[test]
fn superlock_swaps_are_seen_by_the_connection_left_open() {
    let unix = superlock_6("unix");
    // the expectations of superlock-6.2 to 6.15
    let t1 = |v: &[i64]| Ok(v.iter().map(|x| format!("Integer({x})")).collect());
    let t2 = Ok(vec![r#"Text("a")"#.to_string()]);
    let no = |t: &str| Err(format!("no such table: {t}"));
    let want = vec![
        no("t1"),
        t2.clone(),
        t1(&[1, 3]),
        no("t2"),
        no("t1"),
        t2.clone(),
        t1(&[1, 3]),
        no("t2"),
        no("t1"),
        t2,
        t1(&[1, 3, 5]),
        no("t2"),
    ];
    assert_eq!(unix, want, "unix");
    assert_eq!(superlock_6("kxarray"), want, "kxarray");
}
