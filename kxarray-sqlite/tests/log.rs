//! kxarray's `log` records reach SQLite's log (`sqlite3_log`, seen by the
//! program's `SQLITE_CONFIG_LOG` callback), not the program's standard
//! error: the VFS installs the forwarder when it registers. One test: the callback must be configured before SQLite's
//! first use in the process.

mod common;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

static SEEN: Mutex<Vec<(c_int, String)>> = Mutex::new(Vec::new());

extern "C" fn on_log(_: *mut c_void, code: c_int, msg: *const c_char) {
    // SAFETY: SQLite passes a NUL-terminated message valid for the call.
    let msg = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    SEEN.lock().unwrap().push((code, msg));
}

#[test]
fn kxarrays_log_records_reach_sqlite3_log() {
    let cb: extern "C" fn(*mut c_void, c_int, *const c_char) = on_log;
    // SAFETY: SQLITE_CONFIG_LOG takes a callback of this signature and a
    // context pointer; called before SQLite is initialised in this process.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_LOG,
            cb,
            std::ptr::null_mut::<c_void>(),
        )
    };
    assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
    let dir = tempfile::tempdir().unwrap();
    let db = common::open(&dir.path().join("log.db"), "").unwrap();
    db.execute_batch("CREATE TABLE t(a); INSERT INTO t VALUES (1);")
        .unwrap();
    kxarray::aio::IoEngine::global();
    log::warn!("kxarray-sqlite test: a warning record");
    let seen = SEEN.lock().unwrap();
    assert!(
        seen.iter()
            .any(|(c, m)| *c == rusqlite::ffi::SQLITE_NOTICE
                && m.starts_with("kxarray: I/O engine: ")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|(c, m)| *c == rusqlite::ffi::SQLITE_WARNING
            && m == "kxarray-sqlite test: a warning record"),
        "{seen:?}"
    );
}
