//! `xCurrentTime` and `xCurrentTimeInt64` are the default (unix) VFS's,
//! so one process has one clock whichever VFS a connection uses, and a
//! clock the unix VFS is given (SQLite's test clock, `sqlite3_current_time`
//! in a test build) is kxarray's too.
//!
//! The test replaces the registered "unix" VFS by a copy of it whose clock
//! is fixed: this file holds that one test, alone in its process.

mod common;

use rusqlite::ffi;
use std::os::raw::c_int;

/// 2000-01-01 12:00:00 UTC, in Julian milliseconds.
const FIXED_MS: i64 = 211_813_444_800_000 + 43_200_000;

unsafe extern "C" fn fixed_time64(_vfs: *mut ffi::sqlite3_vfs, out: *mut i64) -> c_int {
    // SAFETY: SQLite passes a writable i64.
    unsafe { *out = FIXED_MS };
    0
}

unsafe extern "C" fn fixed_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: SQLite passes a writable double.
    unsafe { *out = FIXED_MS as f64 / 86_400_000.0 };
    0
}

fn now(vfs: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let c = common::procs::open_vfs(&dir.path().join("t.db"), vfs, "").unwrap();
    c.query_row("SELECT datetime('now')", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn the_clock_is_the_default_vfs_s() {
    common::setup();
    // SAFETY: a NUL-terminated name.
    let unix = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    assert!(!unix.is_null());
    // A copy of the unix VFS (same methods, same app data) with a fixed
    // clock, registered under its name in its place.
    // SAFETY: the registered unix VFS, read once.
    let mut copy = unsafe { std::ptr::read(unix) };
    copy.pNext = std::ptr::null_mut();
    copy.xCurrentTime = Some(fixed_time);
    copy.xCurrentTimeInt64 = Some(fixed_time64);
    let copy = Box::leak(Box::new(copy));
    // SAFETY: unregistering and registering static and leaked objects.
    unsafe {
        ffi::sqlite3_vfs_unregister(unix);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { ffi::sqlite3_vfs_register(copy, 1) }, 0);
    let (u, k) = (now("unix"), now("kxarray"));
    // SAFETY: as above: the real one back.
    unsafe {
        ffi::sqlite3_vfs_unregister(copy);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { ffi::sqlite3_vfs_register(unix, 1) }, 0);
    assert_eq!(u, "2000-01-01 12:00:00");
    assert_eq!(k, u, "kxarray asks the default VFS");
    assert_ne!(now("kxarray"), u, "and the real clock again");
}
