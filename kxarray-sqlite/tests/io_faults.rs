//! I/O errors injected into the VFS (`kxarray_sqlite::fault`), as SQLite's
//! test build injects them into `os_unix.c`:
//! - each counted operation fails with the unix VFS's code for it, at the
//!   same point (a write that fails was taken, a truncation or a delete
//!   that fails did nothing), and uncounted ones (locks) never fail;
//! - SQLite's `do_ioerr_test` loop, run on kxarray: the `n`-th counted
//!   operation of a transaction fails (once, or from then on), for every
//!   `n` until the transaction runs clean, in each journal mode and with a
//!   full disk; each time SQLite reports an I/O error (never corruption),
//!   the database in the file (read back by the unix VFS) is whole and
//!   holds the transaction either entirely or not at all, and once the
//!   fault clears the same connection commits again and that commit
//!   reaches the file.

mod common;

use kxarray_sqlite::fault;
use rusqlite::{ffi, Connection, OpenFlags};
use std::os::raw::c_int;
use std::path::Path;

fn open(db: &Path, vfs: &str) -> Connection {
    if vfs == "kxarray" {
        common::setup();
    }
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).unwrap()
}

/// The main database file of a connection, its methods called directly.
struct File<'c> {
    f: *mut ffi::sqlite3_file,
    m: &'c ffi::sqlite3_io_methods,
}

impl<'c> File<'c> {
    fn of(c: &'c Connection) -> File<'c> {
        let mut f: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: FILE_POINTER takes a sqlite3_file** it fills.
        let rc =
            unsafe { common::file_control(c, ffi::SQLITE_FCNTL_FILE_POINTER, (&raw mut f).cast()) };
        assert_eq!(rc, 0);
        // SAFETY: the open file (it lives as long as the connection) ...
        let m = unsafe { (*f).pMethods };
        // SAFETY: ... and its methods with it.
        let m = unsafe { &*m };
        File { f, m }
    }
    fn read(&self, buf: &mut [u8; 4096], off: i64) -> c_int {
        // SAFETY: the file's own method, a buffer of 4096 bytes.
        unsafe { self.m.xRead.unwrap()(self.f, buf.as_mut_ptr().cast(), 4096, off) }
    }
    fn write(&self, buf: &[u8; 4096], off: i64) -> c_int {
        // SAFETY: as in `read`.
        unsafe { self.m.xWrite.unwrap()(self.f, buf.as_ptr().cast(), 4096, off) }
    }
    fn size(&self) -> (c_int, i64) {
        let mut n = 0;
        // SAFETY: the file's own method, a writable i64.
        (unsafe { self.m.xFileSize.unwrap()(self.f, &mut n) }, n)
    }
    fn sync(&self) -> c_int {
        // SAFETY: the file's own method.
        unsafe { self.m.xSync.unwrap()(self.f, ffi::SQLITE_SYNC_NORMAL) }
    }
    fn truncate(&self, n: i64) -> c_int {
        // SAFETY: the file's own method.
        unsafe { self.m.xTruncate.unwrap()(self.f, n) }
    }
    fn lock(&self, l: c_int) -> c_int {
        // SAFETY: the file's own method.
        unsafe { self.m.xLock.unwrap()(self.f, l) }
    }
    fn unlock(&self, l: c_int) -> c_int {
        // SAFETY: the file's own method.
        unsafe { self.m.xUnlock.unwrap()(self.f, l) }
    }
    fn reserved(&self) -> c_int {
        let mut r = 0;
        // SAFETY: the file's own method, a writable int.
        unsafe { self.m.xCheckReservedLock.unwrap()(self.f, &mut r) }
    }
}

/// The registered kxarray VFS's `xDelete` and `xAccess` of `name`.
fn vfs_delete_access(name: &std::ffi::CStr) -> (c_int, c_int) {
    // SAFETY: a NUL-terminated name.
    let vfs = unsafe { ffi::sqlite3_vfs_find(c"kxarray".as_ptr()) };
    assert!(!vfs.is_null());
    // SAFETY: the registered VFS, alive for the process.
    let v = unsafe { &*vfs };
    let mut out: c_int = 0;
    // SAFETY: its own methods, a NUL-terminated name, a writable int.
    let d = unsafe { v.xDelete.unwrap()(vfs, name.as_ptr(), 0) };
    // SAFETY: as above.
    let a = unsafe { v.xAccess.unwrap()(vfs, name.as_ptr(), ffi::SQLITE_ACCESS_EXISTS, &mut out) };
    (d, a)
}

#[test]
fn each_operation_fails_with_the_unix_vfs_s_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let c = open(&db, "kxarray");
    c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(9000));")
        .unwrap();
    let f = File::of(&c);
    let mut buf = [0u8; 4096];
    let before = f.size().1;

    fault::fail_io_at(3, false);
    let reads: Vec<c_int> = (0..4).map(|_| f.read(&mut buf, 0)).collect();
    assert_eq!(reads, [0, 0, ffi::SQLITE_IOERR_READ, 0]);
    assert_eq!(fault::hits(), 1);

    fault::fail_io_at(1, false);
    assert_eq!(f.lock(ffi::SQLITE_LOCK_SHARED), 0, "locks are not counted");
    assert_eq!(f.size().0, ffi::SQLITE_IOERR_FSTAT);
    fault::fail_io_at(1, false);
    assert_eq!(f.reserved(), ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);

    assert_eq!(f.lock(ffi::SQLITE_LOCK_RESERVED), 0);
    assert_eq!(f.lock(ffi::SQLITE_LOCK_EXCLUSIVE), 0);
    // a failed write was taken, as os_unix.c's pwrite had taken it
    let page = [7u8; 4096];
    fault::fail_io_at(1, false);
    assert_eq!(f.write(&page, 4096), ffi::SQLITE_IOERR_WRITE);
    assert_eq!(f.read(&mut buf, 4096), 0);
    assert_eq!(buf, page);
    fault::disk_full_at(1);
    assert_eq!(f.write(&page, 8192), ffi::SQLITE_FULL);
    assert_eq!(f.sync(), ffi::SQLITE_FULL, "the disk stays full");
    fault::clear();
    fault::fail_io_at(1, false);
    assert_eq!(f.sync(), ffi::SQLITE_IOERR_FSYNC);
    // a failed truncation did nothing
    fault::fail_io_at(1, false);
    assert_eq!(f.truncate(4096), ffi::SQLITE_IOERR_TRUNCATE);
    assert!(f.size().1 >= before);
    assert_eq!(f.sync(), 0);
    assert_eq!(f.unlock(ffi::SQLITE_LOCK_NONE), 0);

    // the VFS's own: xDelete (did nothing) and xAccess
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"x").unwrap();
    let name = std::ffi::CString::new(victim.to_str().unwrap()).unwrap();
    fault::fail_io_at(1, true);
    assert_eq!(
        vfs_delete_access(&name),
        (ffi::SQLITE_IOERR_DELETE, ffi::SQLITE_IOERR_ACCESS)
    );
    fault::clear();
    assert!(victim.exists(), "a failed delete deleted nothing");
    drop(c);
    // what the file holds: the page of the "failed" write
    let disk = std::fs::read(&db).unwrap();
    assert_eq!(&disk[4096..8192], &page[..]);
}

/// The table's contents, in a form two states compare by.
fn digest(c: &Connection) -> rusqlite::Result<String> {
    c.query_row(
        "SELECT count(*) || ':' || total(k) || ':' || total(length(CAST(v AS BLOB))) FROM t",
        [],
        |r| r.get(0),
    )
}

const WORK: &str = "BEGIN;
    UPDATE t SET v = v || randomblob(50) WHERE k % 3 = 0;
    INSERT INTO t SELECT k + 1000, randomblob(300) FROM t WHERE k < 60;
    DELETE FROM t WHERE k % 7 = 0;
    COMMIT;";

#[derive(Clone, Copy, Debug)]
enum Fault {
    Transient,
    Persistent,
    DiskFull,
}

/// One round: a fresh database in `journal` mode, the `n`-th counted
/// operation of [`WORK`] on kxarray failing as `kind`; whether the fault
/// was reached.
fn round(dir: &Path, journal: &str, kind: Fault, n: u32) -> bool {
    let db = dir.join(format!("{journal}-{kind:?}-{n}.db"));
    {
        let u = open(&db, "unix");
        u.execute_batch(&format!(
            "PRAGMA journal_mode={journal}; CREATE TABLE t(k INTEGER PRIMARY KEY, v);
             WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100)
             INSERT INTO t SELECT i, randomblob(200) FROM s;"
        ))
        .unwrap();
    }
    let before = digest(&open(&db, "unix")).unwrap();
    // the state WORK leaves (its digest does not depend on the random
    // bytes: counts, keys and lengths)
    let committed = {
        let p = dir.join(format!("{journal}-{kind:?}-{n}-ref.db"));
        std::fs::copy(&db, &p).unwrap();
        let u = open(&p, "unix");
        u.execute_batch(WORK).unwrap();
        digest(&u).unwrap()
    };
    assert_ne!(committed, before);
    let c = open(&db, "kxarray");
    c.execute_batch("PRAGMA cache_size=5").unwrap();
    match kind {
        Fault::Transient => fault::fail_io_at(n, false),
        Fault::Persistent => fault::fail_io_at(n, true),
        Fault::DiskFull => fault::disk_full_at(n),
    }
    let r = c.execute_batch(WORK);
    let hit = fault::hits() > 0;
    fault::clear();
    let case = format!("journal_mode={journal}, {kind:?} fault at operation {n}");
    if let Err(e) = &r {
        let code = e.sqlite_error().map(|e| e.extended_code & 0xff);
        assert!(
            matches!(code, Some(ffi::SQLITE_IOERR | ffi::SQLITE_FULL)),
            "{case}: {e}"
        );
        assert!(hit, "{case}: failed without a fault: {e}");
    }
    // Once the fault clears, the same connection goes on: a transaction
    // left open is rolled back, and a new commit lands.
    let _ = c.execute_batch("ROLLBACK");
    c.execute_batch("CREATE TABLE IF NOT EXISTS after(x); INSERT INTO after VALUES (1);")
        .unwrap_or_else(|e| panic!("{case}: the commit after the fault: {e}"));
    let kx_view = digest(&c).unwrap();
    drop(c);
    // the file, read by the unix VFS
    let u = open(&db, "unix");
    let check: String = u
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "{case}");
    let now = digest(&u).unwrap();
    assert_eq!(kx_view, now, "{case}: what kxarray read is the file");
    let n_after: i64 = u
        .query_row("SELECT count(*) FROM after", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n_after, 1, "{case}: the commit after the fault");
    if r.is_ok() {
        assert_eq!(now, committed, "{case}: committed");
    } else {
        // all or nothing
        assert!(now == before || now == committed, "{case}: {now}");
    }
    hit
}

/// Every `n` for each kind of fault, in `journal` mode.
fn every_fault(journal: &str) {
    // a few thousand small transactions, each synced: on a tmpfs when
    // there is one (the syncs cost nothing there; what is tested is what
    // each step returns and leaves in the file)
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    for kind in [Fault::Transient, Fault::Persistent, Fault::DiskFull] {
        let mut n = 1;
        while round(dir.path(), journal, kind, n) {
            n += 1;
            assert!(n < 2000, "journal_mode={journal}, {kind:?}: no end");
        }
        // the fault reached the VFS in round after round
        assert!(n > 8, "journal_mode={journal}, {kind:?}: {} rounds", n - 1);
    }
}

#[test]
fn every_injected_fault_of_a_transaction_is_survived_delete() {
    every_fault("delete");
}

#[test]
fn every_injected_fault_of_a_transaction_is_survived_truncate() {
    every_fault("truncate");
}

#[test]
fn every_injected_fault_of_a_transaction_is_survived_persist() {
    every_fault("persist");
}

#[test]
fn every_injected_fault_of_a_transaction_is_survived_wal() {
    every_fault("wal");
}
