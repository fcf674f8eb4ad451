//! Why an open failed: [`OpenError`], the one value every failed `xOpen`
//! (and `xFullPathname`, the step SQLite takes before it) ends in: the
//! SQLite result code the call returns and the reason a person reads
//! (`kx_cache="lots" is not a size...`, `open /db/x.db: Permission denied`),
//! naming the setting or the file. [`report`] is the one place a failure
//! leaves the VFS: SQLite's log (`sqlite3_log` with the code), which the
//! `sqlite3` shell prints after `.log stderr` and a program receives
//! through its `SQLITE_CONFIG_LOG` callback, and this thread's last-error
//! record (`lasterror`, behind `xGetLastError`). SQLite itself returns
//! only the code to the caller (`unable to open database file`) and the
//! errno (`sqlite3_system_errno`).
//!
//! Invariant: no failed open returns its code without passing through
//! [`report`] (the `xOpen` and `xFullPathname` callbacks call it on every
//! error they return).

use crate::sqlite::config::SettingError;
use crate::sqlite::ffi::SQLITE_CANTOPEN;
use crate::sqlite::process::api;
use std::fmt;
use std::os::raw::c_int;

/// A failed open: the SQLite result code and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpenError {
    /// What `xOpen` (or `xFullPathname`) returns: `SQLITE_CANTOPEN` or one
    /// of its extended codes.
    pub(crate) code: c_int,
    /// Why, for a person: the setting or the file and what went wrong.
    pub(crate) reason: String,
}

impl OpenError {
    /// `SQLITE_CANTOPEN` for `reason`.
    pub(crate) fn cant_open(reason: impl Into<String>) -> OpenError {
        OpenError::new(SQLITE_CANTOPEN, reason)
    }

    /// `code` for `reason`.
    pub(crate) fn new(code: c_int, reason: impl Into<String>) -> OpenError {
        OpenError {
            code,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for OpenError {
    /// `kxarray: ` and the reason, as the log line reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kxarray: {}", self.reason)
    }
}

impl std::error::Error for OpenError {}

impl From<SettingError> for OpenError {
    fn from(e: SettingError) -> OpenError {
        OpenError::cant_open(e.to_string())
    }
}

/// Say why an open failed, and return the code the callback returns.
/// Every failed open passes here: the place that also hands the reason to
/// whatever else should carry it (a last-error record behind
/// `xGetLastError`).
pub(crate) fn report(e: &OpenError) -> c_int {
    let text = e.to_string();
    crate::sqlite::lasterror::set_message(&text);
    api().log(e.code, &text);
    e.code
}
