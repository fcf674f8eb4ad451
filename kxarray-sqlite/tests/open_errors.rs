//! An open that fails says why, in SQLite's log (`sqlite3_log`, which a
//! program reads through its `SQLITE_CONFIG_LOG` callback and the shell
//! prints after `.log stderr`): a value that does not parse names its
//! setting and what was expected, a misspelt `kx_` parameter or
//! `KXARRAY_SQLITE_` variable fails the open with its name (instead of
//! leaving the default in force), and a file that cannot be opened is
//! named with the system's error. One test: the callback must be
//! configured before SQLite's first use in the process, and the
//! environment is the process's.

mod common;

use rusqlite::ErrorCode;
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

/// Open `db` through kxarray with `params`; it must fail with
/// `SQLITE_CANTOPEN`, and the log line of the failure (code
/// `SQLITE_CANTOPEN`, from the VFS) must hold every one of `says`.
fn refused(db: &std::path::Path, params: &str, says: &[&str]) {
    SEEN.lock().unwrap().clear();
    let e = common::open(db, params)
        .and_then(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS x(y)"))
        .unwrap_err();
    assert_eq!(
        e.sqlite_error_code(),
        Some(ErrorCode::CannotOpen),
        "{params}: {e}"
    );
    let seen = SEEN.lock().unwrap();
    let line = seen
        .iter()
        .find(|(c, m)| c & 0xff == rusqlite::ffi::SQLITE_CANTOPEN && m.starts_with("kxarray: "))
        .unwrap_or_else(|| panic!("{params}: no reason in SQLite's log: {seen:?}"));
    for s in says {
        assert!(line.1.contains(s), "{params}: {:?} lacks {s:?}", line.1);
    }
}

#[test]
fn a_failed_open_says_why_in_sqlites_log() {
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
    let db = dir.path().join("e.db");

    refused(&db, "kx_cache=abc", &["kx_cache=\"abc\"", "a size"]);
    refused(&db, "kx_cache=1k", &["kx_cache=\"1k\"", "at least 1m"]);
    refused(
        &db,
        "kx_locking=maybe",
        &["kx_locking", "shared or exclusive"],
    );
    refused(&db, "kx_budget=2", &["kx_budget", "0 or 1"]);
    // a misspelt parameter, and one in the wrong case, with the known list
    refused(
        &db,
        "kx_cahce=64m",
        &["kx_cahce", "kx_cache, kx_shared, kx_budget"],
    );
    refused(&db, "KX_CACHE=64m", &["KX_CACHE"]);
    // SQLite's own parameters are not the VFS's to refuse
    common::open(&db, "psow=0&cache=private")
        .unwrap()
        .execute_batch("CREATE TABLE IF NOT EXISTS ok(a)")
        .unwrap();

    // The environment: a bad value, and a misspelt variable. (The only
    // test of this binary, so no other thread reads the environment.)
    std::env::set_var("KXARRAY_SQLITE_CACHE", "lots");
    refused(&db, "", &["KXARRAY_SQLITE_CACHE=\"lots\""]);
    std::env::remove_var("KXARRAY_SQLITE_CACHE");
    std::env::set_var("KXARRAY_SQLITE_CAHCE", "64m");
    refused(&db, "", &["KXARRAY_SQLITE_CAHCE", "KXARRAY_SQLITE_CACHE"]);
    std::env::remove_var("KXARRAY_SQLITE_CAHCE");

    // A file that cannot be opened is named, with the system's reason.
    let missing = dir.path().join("no/such/dir/x.db");
    refused(
        &missing,
        "",
        &[missing.to_str().unwrap(), "No such file or directory"],
    );
}
