//! Open-file-description byte-range locks (`F_OFD_SETLK`, `F_OFD_GETLK`):
//! the one system call behind every lock this VFS takes, on a database
//! file (`inode`) and on its `-shm` file (`shm`).
//!
//! OFD locks belong to the open file description, not to the process: two
//! descriptions of one file in one process exclude each other, closing
//! another descriptor of the file releases nothing, and they conflict with
//! the classic POSIX locks (`F_SETLK`) the unix VFS takes, in both
//! directions (fcntl(2)). So a kxarray process and a unix-VFS process
//! exclude each other exactly as two unix-VFS processes do.
//!
//! Invariant: nothing here waits (`F_OFD_SETLK`, never `F_OFD_SETLKW`); a
//! conflict is `Err` with `EAGAIN` (or `EACCES`), which callers turn into
//! `SQLITE_BUSY` ([`is_busy`]).
//!
//! [`set`] runs on every WAL lock (six per commit), so on 64-bit Linux it
//! makes the system call itself (`syscall(SYS_fcntl)`, where `struct
//! flock` is the kernel's) instead of through glibc's `fcntl`, whose
//! variadic wrapper and command dispatch cost more instructions than the
//! rest of a WAL lock's work in user space.

use std::io;
use std::os::fd::AsRawFd;
use std::os::raw::c_int;

/// The lock kinds (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A read (shared) lock.
    Read,
    /// A write (exclusive) lock.
    Write,
    /// No lock (release).
    Unlock,
}

impl Kind {
    fn raw(self) -> c_int {
        match self {
            Kind::Read => libc::F_RDLCK,
            Kind::Write => libc::F_WRLCK,
            Kind::Unlock => libc::F_UNLCK,
        }
    }
}

fn flock(kind: Kind, start: i64, len: i64) -> libc::flock {
    // SAFETY: an all-zero `flock` is a valid value (plain integers).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind.raw() as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start as _;
    fl.l_len = len as _;
    fl.l_pid = 0; // required by the OFD commands
    fl
}

/// Set (`Read`, `Write`) or release (`Unlock`) an OFD lock on `len` bytes
/// at `start` of `fd`'s open file description, without waiting. `len` 0
/// means to the end of the file and beyond.
///
/// # Errors
/// `EAGAIN`/`EACCES` when another description holds a conflicting lock
/// ([`is_busy`]); `EBADF` for a write lock on a descriptor not open for
/// writing; any other error of `fcntl`.
#[inline]
pub(crate) fn set(fd: &impl AsRawFd, kind: Kind, start: i64, len: i64) -> io::Result<()> {
    let fl = flock(kind, start, len);
    loop {
        let r = set_lock(fd.as_raw_fd(), &fl);
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `fcntl(fd, F_OFD_SETLK, fl)`: 0, or -1 with `errno` set.
#[inline]
fn set_lock(fd: c_int, fl: &libc::flock) -> libc::c_long {
    let fl: *const libc::flock = fl;
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    // SAFETY: `F_OFD_SETLK` reads one `struct flock` at its third argument,
    // which `fl` points to (valid for the call); on 64-bit Linux the C
    // library's `struct flock` is the kernel's (64-bit offsets, no
    // translation: glibc's `fcntl` passes it through unchanged). A bad
    // descriptor is an `EBADF` error, not undefined behaviour.
    let r = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_OFD_SETLK, fl) };
    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    // SAFETY: as above, through the C library's wrapper.
    let r = libc::c_long::from(unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, fl) });
    r
}

/// Whether another open file description (of this process or another;
/// OFD or POSIX) holds a lock on `len` bytes at `start` that would conflict
/// with `kind`: the conflicting lock's kind, or `None`.
///
/// # Errors
/// `fcntl`'s error.
pub(crate) fn conflict(
    fd: &impl AsRawFd,
    kind: Kind,
    start: i64,
    len: i64,
) -> io::Result<Option<Kind>> {
    let mut fl = flock(kind, start, len);
    // SAFETY: `fd` is an open descriptor; `fl` is a valid `flock` the call
    // reads and overwrites with the conflicting lock, if any.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(match c_int::from(fl.l_type) {
        libc::F_RDLCK => Some(Kind::Read),
        libc::F_WRLCK => Some(Kind::Write),
        _ => None,
    })
}

/// Whether a lock error is a conflict (SQLite's `SQLITE_BUSY`, as
/// `os_unix.c`'s `sqliteErrorFromPosixError` maps `EAGAIN`, `EACCES`,
/// `EBUSY`, `EINTR`, `ETIMEDOUT` and `ENOLCK`).
pub(crate) fn is_busy(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EAGAIN
                | libc::EACCES
                | libc::EBUSY
                | libc::EINTR
                | libc::ETIMEDOUT
                | libc::ENOLCK
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_descriptions_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let a = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .unwrap();
        let b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        set(&a, Kind::Read, 100, 10).unwrap();
        set(&b, Kind::Read, 105, 1).unwrap();
        let e = set(&b, Kind::Write, 100, 1).unwrap_err();
        assert!(is_busy(&e), "{e}");
        assert_eq!(conflict(&b, Kind::Write, 100, 1).unwrap(), Some(Kind::Read));
        assert_eq!(conflict(&b, Kind::Write, 200, 1).unwrap(), None);
        set(&a, Kind::Unlock, 0, 0).unwrap();
        set(&b, Kind::Write, 100, 1).unwrap();
        // a dup shares the description (and its locks)
        let c = b.try_clone().unwrap();
        set(&c, Kind::Write, 100, 1).unwrap();
        assert_eq!(conflict(&a, Kind::Read, 100, 1).unwrap(), Some(Kind::Write));
    }
}
