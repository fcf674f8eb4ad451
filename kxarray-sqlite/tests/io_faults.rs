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
use std::os::raw::{c_int, c_void};
use std::path::Path;

fn open(db: &Path, vfs: &str) -> Connection {
    if vfs == "kxarray" {
        common::setup();
    }
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).unwrap()
}

/// The main database's `sqlite3_file` and its methods.
fn main_file(c: &Connection) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let mut f: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: FILE_POINTER takes a sqlite3_file** it fills.
    let rc = unsafe { common::file_control(c, ffi::SQLITE_FCNTL_FILE_POINTER, (&raw mut f).cast()) };
    assert_eq!(rc, 0);
    // SAFETY: the open file's methods live while it is open (the caller
    // keeps the connection).
    (f, unsafe { &*(*f).pMethods })
}

#[test]
fn each_operation_fails_with_the_unix_vfs_s_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let c = open(&db, "kxarray");
    c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(9000));")
        .unwrap();
    let (f, m) = main_file(&c);
    let mut buf = [0u8; 4096];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY (every call below): the open file's own methods, with a
    // buffer of 4096 bytes and offsets inside the file.
    let read = |off: i64| unsafe { m.xRead.unwrap()(f, p, 4096, off) };
    let size = || {
        let mut n = 0i64;
        // SAFETY: as above.
        (unsafe { m.xFileSize.unwrap()(f, &mut n) }, n)
    };
    let before = size().1;

    fault::fail_io_at(3, false);
    assert_eq!([read(0), read(0), read(0), read(0)], [0, 0, ffi::SQLITE_IOERR_READ, 0]);
    assert_eq!(fault::hits(), 1);

    fault::fail_io_at(1, false);
    // SAFETY: as above.
    assert_eq!(unsafe { m.xLock.unwrap()(f, ffi::SQLITE_LOCK_SHARED) }, 0, "locks are not counted");
    assert_eq!(size().0, ffi::SQLITE_IOERR_FSTAT);

    fault::fail_io_at(1, false);
    let mut res = 0;
    // SAFETY: as above.
    let rc = unsafe { m.xCheckReservedLock.unwrap()(f, &mut res) };
    assert_eq!(rc, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);

    // SAFETY: as above (RESERVED, then EXCLUSIVE: this connection's alone).
    assert_eq!(unsafe { m.xLock.unwrap()(f, ffi::SQLITE_LOCK_RESERVED) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { m.xLock.unwrap()(f, ffi::SQLITE_LOCK_EXCLUSIVE) }, 0);
    // a failed write was taken, as os_unix.c's pwrite had taken it
    let page = [7u8; 4096];
    fault::fail_io_at(1, false);
    // SAFETY: as above.
    let rc = unsafe { m.xWrite.unwrap()(f, page.as_ptr().cast(), 4096, 4096) };
    assert_eq!(rc, ffi::SQLITE_IOERR_WRITE);
    assert_eq!((read(4096), buf), (0, page));
    fault::disk_full_at(1);
    // SAFETY: as above.
    let rc = unsafe { m.xWrite.unwrap()(f, page.as_ptr().cast(), 4096, 8192) };
    assert_eq!(rc, ffi::SQLITE_FULL);
    // SAFETY: as above.
    assert_eq!(unsafe { m.xSync.unwrap()(f, ffi::SQLITE_SYNC_NORMAL) }, ffi::SQLITE_FULL, "the disk stays full");
    fault::clear();
    fault::fail_io_at(1, false);
    // SAFETY: as above.
    assert_eq!(unsafe { m.xSync.unwrap()(f, ffi::SQLITE_SYNC_NORMAL) }, ffi::SQLITE_IOERR_FSYNC);
    // a failed truncation did nothing
    fault::fail_io_at(1, false);
    // SAFETY: as above.
    assert_eq!(unsafe { m.xTruncate.unwrap()(f, 4096) }, ffi::SQLITE_IOERR_TRUNCATE);
    assert!(size().1 >= before);
    // the errno of an injected fault
    let mut last = 0;
    // SAFETY: LAST_ERRNO takes an int*.
    unsafe { common::file_control(&c, ffi::SQLITE_FCNTL_LAST_ERRNO, (&raw mut last).cast()) };
    assert_eq!(last, 0, "the handle's own failures only");
    // SAFETY: as above.
    assert_eq!(unsafe { m.xSync.unwrap()(f, ffi::SQLITE_SYNC_NORMAL) }, 0);
    // SAFETY: as above (back to no lock; the write back happens here).
    assert_eq!(unsafe { m.xUnlock.unwrap()(f, ffi::SQLITE_LOCK_NONE) }, 0);

    // the VFS's own: xDelete and xAccess
    // SAFETY: a NUL-terminated name.
    let vfs = unsafe { ffi::sqlite3_vfs_find(c"kxarray".as_ptr()) };
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"x").unwrap();
    let name = std::ffi::CString::new(victim.to_str().unwrap()).unwrap();
    fault::fail_io_at(1, false);
    // SAFETY: the VFS's own methods, a NUL-terminated name.
    let del = unsafe { (*vfs).xDelete }.unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { del(vfs, name.as_ptr(), 0) }, ffi::SQLITE_IOERR_DELETE);
    assert!(victim.exists(), "a failed delete deleted nothing");
    fault::fail_io_at(1, false);
    let mut out: c_int = 0;
    // SAFETY: as above.
    let access = unsafe { (*vfs).xAccess }.unwrap();
    // SAFETY: as above.
    let rc = unsafe { access(vfs, name.as_ptr(), ffi::SQLITE_ACCESS_EXISTS, &mut out) };
    assert_eq!(rc, ffi::SQLITE_IOERR_ACCESS);
    fault::clear();
    drop(c);
    // what the file holds: the page written by the "failed" write
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
