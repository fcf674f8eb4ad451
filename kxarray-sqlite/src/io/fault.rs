//! I/O errors injected into the VFS from a test, as SQLite's test build
//! injects them into `os_unix.c` (`SimulateIOError` and
//! `SimulateDiskfullError` of `os_common.h`), so that fault tests reach
//! kxarray's error paths: SQLite's own (`ioerr*.test`, `walfault.test`,
//! `backup_ioerr.test`, `pagerfault*.test` through `faultsim`) and the
//! crate's (`tests/io_faults.rs`).
//!
//! The operations counted, and what each answers when its turn comes, are
//! `os_unix.c`'s, at the same point of the same call, so that SQLite makes
//! the same calls in the same order on either VFS and a fault test sees
//! the same errors:
//!
//! | call | counted | answer |
//! |---|---|---|
//! | `xRead` | after the read | `SQLITE_IOERR_READ` |
//! | `xWrite` | after the write (an I/O error, then a full disk) | `SQLITE_IOERR_WRITE`, `SQLITE_FULL` |
//! | `xSync` | a full disk, then an I/O error, before the sync | `SQLITE_FULL`, `SQLITE_IOERR_FSYNC` |
//! | `xTruncate` | before | `SQLITE_IOERR_TRUNCATE` |
//! | `xFileSize` | after the `fstat` | `SQLITE_IOERR_FSTAT` |
//! | `xCheckReservedLock` | before | `SQLITE_IOERR_CHECKRESERVEDLOCK` |
//! | `xDelete` | before | `SQLITE_IOERR_DELETE` |
//! | `xAccess` | before | `SQLITE_IOERR_ACCESS` |
//! | `xOpen` of a temporary file (no name) | before (the unix VFS's temporary name) | `SQLITE_IOERR` |
//!
//! What a failed call leaves is what the same failure of kxarray's own
//! system calls would leave: a write that fails was taken (into the cache
//! for a database, into the file for a journal or WAL), as `os_unix.c`'s
//! `pwrite` had taken it; a sync that fails wrote nothing back and made
//! nothing durable, so a database's deferred writes stay dirty in the
//! cache and reach the file at its next sync point, and its journal or
//! WAL is kept until they do (`file::db_barrier`).
//!
//! Two sources of counters, with SQLite's meaning (`pending` counts down
//! to the failing operation; `persist` fails every one after it until
//! cleared; `hit` counts the faults taken, `hardhit` those not marked
//! benign; a full disk stays full):
//! - this thread's, armed with [`fail_io_at`] and [`disk_full_at`] (a
//!   test's knob: parallel tests do not disturb each other, and SQLite
//!   calls the VFS on the connection's thread);
//! - SQLite's own test-build globals (`sqlite3_io_error_pending`...,
//!   the Tcl variables `sqlite_io_error_pending`...), handed over by
//!   [`kxarray_sqlite_fault_counters`] from SQLite's `testfixture`
//!   (`scripts/testfixture/kxarray_init.c`); they then serve every thread,
//!   as in `os_unix.c`.
//!
//! Cost when unused: one relaxed load of a `false` flag per counted
//! operation; nothing is counted until a fault is armed or the counters
//! are handed over.

use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

/// Set once a fault is armed on any thread or SQLite's counters are handed
/// over.
static ARMED: AtomicBool = AtomicBool::new(false);

/// SQLite's counters, when its test build handed them over.
static SQLITE: OnceLock<[&'static AtomicI32; SLOTS]> = OnceLock::new();

/// The counters, in the order [`kxarray_sqlite_fault_counters`] takes them.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Pending = 0,
    Persist,
    Hit,
    HardHit,
    Benign,
    DiskFullPending,
    DiskFull,
}
const SLOTS: usize = 7;

thread_local! {
    static LOCAL: [Cell<i32>; SLOTS] = const { [const { Cell::new(0) }; SLOTS] };
}

fn get(s: Slot) -> i32 {
    match SQLITE.get() {
        Some(c) => c[s as usize].load(Ordering::Relaxed),
        None => LOCAL.with(|l| l[s as usize].get()),
    }
}

fn set(s: Slot, v: i32) {
    match SQLITE.get() {
        Some(c) => c[s as usize].store(v, Ordering::Relaxed),
        None => LOCAL.with(|l| l[s as usize].set(v)),
    }
}

/// Make the `n`-th counted operation from now on this thread fail with an
/// I/O error (as `sqlite3_io_error_pending = n`), and with `persist` every
/// one after it too until [`clear`]; 0 disarms. The hit count starts again
/// at 0.
///
/// ```
/// kxarray_sqlite::fault::fail_io_at(3, false);
/// // ... the third xRead, xWrite, xSync ... of this thread fails
/// kxarray_sqlite::fault::clear();
/// ```
pub fn fail_io_at(n: u32, persist: bool) {
    if n != 0 {
        ARMED.store(true, Ordering::Relaxed);
    }
    set(Slot::Pending, i32::try_from(n).unwrap_or(i32::MAX));
    set(Slot::Persist, i32::from(persist));
    set(Slot::Hit, 0);
    set(Slot::HardHit, 0);
}

/// Make the `n`-th `xWrite` or `xSync` from now on this thread, and every
/// one after it, fail with `SQLITE_FULL` until [`clear`] (as
/// `sqlite3_diskfull_pending = n`); 0 disarms.
pub fn disk_full_at(n: u32) {
    if n != 0 {
        ARMED.store(true, Ordering::Relaxed);
    }
    set(Slot::DiskFullPending, i32::try_from(n).unwrap_or(i32::MAX));
    set(Slot::DiskFull, 0);
    set(Slot::Hit, 0);
}

/// Disarm every fault of this thread (the counts stay readable).
pub fn clear() {
    for s in [
        Slot::Pending,
        Slot::Persist,
        Slot::DiskFullPending,
        Slot::DiskFull,
    ] {
        set(s, 0);
    }
}

/// Faults taken since the last [`fail_io_at`] or [`disk_full_at`] on this
/// thread.
pub fn hits() -> u32 {
    u32::try_from(get(Slot::Hit)).unwrap_or(0)
}

/// A fault was taken (`local_ioerr`).
fn taken() {
    set(Slot::Hit, get(Slot::Hit).wrapping_add(1));
    if get(Slot::Benign) == 0 {
        set(Slot::HardHit, get(Slot::HardHit).wrapping_add(1));
    }
}

/// One counted operation: whether it fails with an I/O error
/// (`SimulateIOError`'s condition).
#[inline]
pub(crate) fn io_error() -> bool {
    ARMED.load(Ordering::Relaxed) && io_error_armed()
}

#[cold]
#[inline(never)]
fn io_error_armed() -> bool {
    let fail = (get(Slot::Persist) != 0 && get(Slot::Hit) != 0) || {
        let p = get(Slot::Pending);
        set(Slot::Pending, p.wrapping_sub(1));
        p == 1
    };
    if fail {
        taken();
    }
    fail
}

/// One counted write or sync: whether the disk is full
/// (`SimulateDiskfullError`'s condition).
#[inline]
pub(crate) fn disk_full() -> bool {
    ARMED.load(Ordering::Relaxed) && disk_full_armed()
}

#[cold]
#[inline(never)]
fn disk_full_armed() -> bool {
    match get(Slot::DiskFullPending) {
        0 => false,
        1 => {
            taken();
            set(Slot::DiskFull, 1);
            set(Slot::Hit, 1);
            true
        }
        p => {
            set(Slot::DiskFullPending, p - 1);
            false
        }
    }
}

/// `code` for an injected fault, recorded as this thread's last error
/// (`EIO`, or `ENOSPC` for `SQLITE_FULL`) with `what` failed.
pub(crate) fn failed(code: c_int, what: &str) -> c_int {
    let errno = if code == crate::sqlite::ffi::SQLITE_FULL {
        libc::ENOSPC
    } else {
        libc::EIO
    };
    crate::sqlite::lasterror::set_last_error(errno, &format!("kxarray: injected fault in {what}"));
    code
}

/// An operation counted before (or right after) it runs: `code` when its
/// turn comes (see the module notes).
#[inline]
pub(crate) fn inject(code: c_int, what: &str) -> Option<c_int> {
    io_error().then(|| failed(code, what))
}

/// An `xWrite` counted after it wrote (`unixWrite`: an I/O error, then a
/// full disk, both counted): `SQLITE_FULL` or `SQLITE_IOERR_WRITE` when
/// their turn comes.
#[inline]
pub(crate) fn write_fault() -> Option<c_int> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    let (io, full) = (io_error(), disk_full());
    if full {
        Some(failed(crate::sqlite::ffi::SQLITE_FULL, "xWrite"))
    } else if io {
        Some(failed(crate::sqlite::ffi::SQLITE_IOERR_WRITE, "xWrite"))
    } else {
        None
    }
}

/// An `xSync` counted before it syncs (`unixSync`: a full disk, then an
/// I/O error): `SQLITE_FULL` or `SQLITE_IOERR_FSYNC` when their turn
/// comes; the sync then writes nothing back.
#[inline]
pub(crate) fn sync_fault() -> Option<c_int> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    if disk_full() {
        return Some(failed(crate::sqlite::ffi::SQLITE_FULL, "xSync"));
    }
    inject(crate::sqlite::ffi::SQLITE_IOERR_FSYNC, "xSync")
}

/// Hand the VFS SQLite's own fault counters (a test build's
/// `sqlite3_io_error_pending`, `_persist`, `_hit`, `_hardhit`, `_benign`,
/// `sqlite3_diskfull_pending` and `sqlite3_diskfull`, in that order): from
/// then on every thread's counted operations use them, as `os_unix.c`'s
/// do. The first call decides; later calls change nothing.
///
/// # Safety
/// - every pointer is non-null, aligned for `int`, and valid for reads
///   and writes for the rest of the process (SQLite's globals are);
/// - nothing reads or writes those ints concurrently with a VFS call
///   except through this VFS (SQLite's tests set them between statements).
#[no_mangle]
pub unsafe extern "C" fn kxarray_sqlite_fault_counters(
    pending: *mut c_int,
    persist: *mut c_int,
    hit: *mut c_int,
    hardhit: *mut c_int,
    benign: *mut c_int,
    diskfull_pending: *mut c_int,
    diskfull: *mut c_int,
) {
    let ptrs = [
        pending,
        persist,
        hit,
        hardhit,
        benign,
        diskfull_pending,
        diskfull,
    ];
    debug_assert!(ptrs.iter().all(|p| !p.is_null() && p.is_aligned()));
    if ptrs.iter().any(|p| p.is_null() || !p.is_aligned()) {
        return;
    }
    // SAFETY: per the caller, each pointer is an aligned int valid for the
    // life of the process and accessed only through these atomics while
    // the VFS runs (`AtomicI32` has the layout of `c_int`).
    let atomics = ptrs.map(|p| unsafe { AtomicI32::from_ptr(p) });
    if SQLITE.set(atomics).is_ok() {
        ARMED.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_down_as_sqlite_does() {
        fail_io_at(3, false);
        assert_eq!(
            [io_error(), io_error(), io_error(), io_error()],
            [false, false, true, false]
        );
        assert_eq!(hits(), 1);
        fail_io_at(2, true);
        assert_eq!([io_error(), io_error(), io_error()], [false, true, true]);
        assert_eq!(hits(), 2);
        clear();
        assert!(!io_error());
        disk_full_at(2);
        assert_eq!([disk_full(), disk_full(), disk_full()], [false, true, true]);
        clear();
        assert!(!disk_full());
        // another thread's counters are its own
        fail_io_at(1, true);
        std::thread::spawn(|| assert!(!io_error())).join().unwrap();
        assert!(io_error());
        clear();
    }
}
