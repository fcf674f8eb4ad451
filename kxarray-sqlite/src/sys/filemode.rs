//! The permissions and owner of a file the VFS opens with
//! `SQLITE_OPEN_CREATE`, as `os_unix.c` gives them: [`create_mode`]
//! (`findCreateFileMode`) and [`settle`] (`robust_open`'s `fchmod`, then
//! `robustFchown`).
//!
//! - a journal or WAL (`<db>-journal`, `<db>-wal`, and the
//!   `<db>-journalNN`/`<db>-walNN` chunks of SQLite's multiplex shim) gets
//!   exactly its database's mode (`st_mode & 0777`), whatever the umask,
//!   and, when the process runs as root, its database's owner and group:
//!   a journal holds page images of the database, so it must be no more
//!   readable than the database, and every user who may write the
//!   database must be able to write (or roll back) its journal and WAL;
//! - the `-shm` gets the database's mode and, as root, its owner (`shm`
//!   calls [`settle`] with them);
//! - a file opened `SQLITE_OPEN_DELETEONCLOSE` gets 0600;
//! - a main database opened by URI with `modeof=<file>` gets that file's
//!   mode (and no owner change, as on the unix VFS);
//! - any other file: 0644 less the umask, as `open(2)` leaves it.
//!
//! Invariants: a mode is forced with `fchmod` only on a file that is empty
//! when opened (one this open created, or an empty leftover), never on a
//! file with contents, as `robust_open`; `fchown` is tried only by root
//! (it cannot succeed for anyone else), and its failure is ignored, as on
//! the unix VFS.

use crate::sqlite::ffi::{
    SQLITE_IOERR_FSTAT, SQLITE_OPEN_DELETEONCLOSE, SQLITE_OPEN_MAIN_JOURNAL, SQLITE_OPEN_WAL,
};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The mode `open(2)` gets when nothing else decides
/// (`SQLITE_DEFAULT_FILE_PERMISSIONS`).
pub(crate) const DEFAULT_MODE: u32 = 0o644;

/// What a file is created with: its mode, and the owner to give it when
/// the process runs as root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Create {
    /// Permission bits (`& 0777`), forced past the umask on an empty file.
    pub(crate) mode: u32,
    /// The owner and group (a journal's or WAL's database's, a `-shm`'s).
    pub(crate) owner: Option<(u32, u32)>,
}

/// The database a journal or WAL named `path` belongs to, by
/// `findCreateFileMode`'s rule: the name up to its last `-` after its last
/// `.` (`-journal`, `-wal`, `-journal01`, `-wal01`); `None` when the name
/// has no such `-` (8+3 names, a super-journal's odd name).
fn database_of(path: &Path) -> Option<&Path> {
    let name = path.as_os_str().as_bytes();
    let mut n = name.len().checked_sub(1)?;
    while n > 0 && name[n] != b'.' {
        if name[n] == b'-' {
            return Some(Path::new(std::ffi::OsStr::from_bytes(&name[..n])));
        }
        n -= 1;
    }
    None
}

/// The mode and owner of `file` (`getFileMode`).
fn mode_of(file: &Path) -> std::io::Result<(u32, (u32, u32))> {
    let m = std::fs::metadata(file)?;
    Ok((m.mode() & 0o777, (m.uid(), m.gid())))
}

/// How a file SQLite opens with `flags` is created (`findCreateFileMode`):
/// `None` for the default mode. `modeof` is a main database's `modeof` URI
/// parameter.
///
/// # Errors
/// `SQLITE_IOERR_FSTAT` and the `stat` error when a journal's or WAL's
/// database, or the `modeof` file, cannot be `stat`ed (as the unix VFS,
/// which fails the open then).
pub(crate) fn create_mode(
    path: &Path,
    flags: c_int,
    modeof: Option<&Path>,
) -> Result<Option<Create>, (c_int, std::io::Error)> {
    let fstat = |e| (SQLITE_IOERR_FSTAT, e);
    if flags & (SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL) != 0 {
        let Some(db) = database_of(path) else {
            return Ok(None);
        };
        let (mode, owner) = mode_of(db).map_err(fstat)?;
        return Ok(Some(Create {
            mode,
            owner: Some(owner),
        }));
    }
    if flags & SQLITE_OPEN_DELETEONCLOSE != 0 {
        return Ok(Some(Create {
            mode: 0o600,
            owner: None,
        }));
    }
    match modeof {
        Some(f) => {
            let (mode, _) = mode_of(f).map_err(fstat)?;
            Ok(Some(Create { mode, owner: None }))
        }
        None => Ok(None),
    }
}

/// Whether the process runs as root (the only user `fchown` can succeed
/// for).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Give the file just opened as `fd` the mode and owner of `how`: the mode
/// when the file is empty and its mode differs (`robust_open`), the owner
/// when the process runs as root (`robustFchown`). Failures are ignored,
/// as on the unix VFS (the file is usable; a failed `fchmod` leaves the
/// mode `open(2)` gave it).
pub(crate) fn settle(fd: &File, how: Create) {
    let raw = fd.as_raw_fd();
    if let Ok(m) = fd.metadata() {
        if m.len() == 0 && m.mode() & 0o777 != how.mode {
            // SAFETY: `raw` is an open descriptor `fd` owns for the call.
            unsafe { libc::fchmod(raw, how.mode as libc::mode_t) };
        }
    }
    if let Some((uid, gid)) = how.owner {
        if is_root() {
            // SAFETY: as above.
            unsafe { libc::fchown(raw, uid, gid) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_s_database_is_its_name_up_to_the_last_dash() {
        let db = |s: &str| database_of(Path::new(s)).map(|p| p.to_str().unwrap().to_owned());
        assert_eq!(db("/d/x.db-journal").as_deref(), Some("/d/x.db"));
        assert_eq!(db("/d/x.db-wal").as_deref(), Some("/d/x.db"));
        assert_eq!(db("/d/x.db-journal01").as_deref(), Some("/d/x.db"));
        assert_eq!(db("/d/a-b/x-y-wal").as_deref(), Some("/d/a-b/x-y"));
        assert_eq!(db("/d/a-b.c/x.db"), None);
        assert_eq!(db("-"), None);
        assert_eq!(db(""), None);
    }

    #[test]
    fn delete_on_close_is_private_and_a_database_default() {
        let p = Path::new("/nonexistent/x");
        assert_eq!(
            create_mode(p, SQLITE_OPEN_DELETEONCLOSE, None).unwrap(),
            Some(Create {
                mode: 0o600,
                owner: None
            })
        );
        assert_eq!(create_mode(p, 0, None).unwrap(), None);
        let e = create_mode(Path::new("/nonexistent/x-wal"), SQLITE_OPEN_WAL, None).unwrap_err();
        assert_eq!(e.0, SQLITE_IOERR_FSTAT);
    }
}
