//! The records of the `log` facade (kxarray's: the I/O engine's line and
//! warnings, ...) forwarded to `sqlite3_log`, so a program that loaded the
//! VFS sees them where it sees SQLite's own messages (its
//! `SQLITE_CONFIG_LOG` callback) and never on its standard error.
//!
//! Owns the process's `log` logger when the VFS installs it: only when no
//! other logger is set (an application with a logger of its own keeps
//! it), at `info` and above. Invariant: a record is forwarded only after
//! the VFS is registered (the SQLite API is known then).

use crate::sqlite::ffi::{SQLITE_ERROR, SQLITE_NOTICE, SQLITE_WARNING};
use log::{Level, LevelFilter, Log, Metadata, Record};

/// Forwards each record to `sqlite3_log`.
struct SqliteLog;

impl Log for SqliteLog {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= Level::Info
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let code = match r.level() {
            Level::Error => SQLITE_ERROR,
            Level::Warn => SQLITE_WARNING,
            _ => SQLITE_NOTICE,
        };
        crate::sqlite::process::api().log(code, &r.args().to_string());
    }

    fn flush(&self) {}
}

/// Install the forwarder, unless the program set a logger already.
pub(crate) fn install() {
    static LOGGER: SqliteLog = SqliteLog;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(LevelFilter::Info);
    }
}
