//! Open-file-description byte-range locks (`F_OFD_SETLK`, `F_OFD_GETLK`)
//! on files processes share: try, wait a bounded time, release, and ask
//! whether another description holds one.
//!
//! OFD locks belong to the open file description (Linux 3.15): the kernel
//! drops them when the last descriptor of that description is closed,
//! also when its process dies, so a lock can say "this member is alive"
//! or "this member is inside the critical section" without trusting a pid.
//! Two descriptions conflict even in one process; a description shared by
//! a forked child is the parent's too, so a child that keeps it keeps the
//! parent's locks (see [`crate::fork::close_in_child`]).
//!
//! Invariant: nothing here blocks in the kernel (`F_OFD_SETLK`, never
//! `F_OFD_SETLKW`); [`lock_within`] sleeps between tries and gives up at
//! its deadline.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// A lock's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Shared (`F_RDLCK`).
    Read,
    /// Exclusive (`F_WRLCK`).
    Write,
}

fn raw(kind: Option<LockKind>) -> libc::c_short {
    (match kind {
        Some(LockKind::Read) => libc::F_RDLCK,
        Some(LockKind::Write) => libc::F_WRLCK,
        None => libc::F_UNLCK,
    }) as libc::c_short
}

fn fcntl(file: impl AsFd, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    loop {
        // SAFETY: the descriptor is open for the life of `file`, and `fl`
        // is a valid `flock` that outlives the call.
        let r = unsafe { libc::fcntl(file.as_fd().as_raw_fd(), cmd, fl as *mut libc::flock) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn flock(kind: Option<LockKind>, start: u64, len: u64) -> io::Result<libc::flock> {
    let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "lock range past i64::MAX");
    // SAFETY: an all-zero `flock` is a valid value (plain integers).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = raw(kind);
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = i64::try_from(start).map_err(|_| too_far())?;
    fl.l_len = i64::try_from(len).map_err(|_| too_far())?;
    fl.l_pid = 0; // required by the OFD commands
    Ok(fl)
}

/// Take a `kind` lock on `len` bytes at `start` (`len` 0: to the end and
/// beyond) of `file`'s open file description, without waiting:
/// `Ok(false)` when another description holds a conflicting one.
///
/// # Errors
/// `fcntl`'s error other than a conflict (`EBADF`, `ENOLCK`, ...).
///
/// ```
/// use kxarray::ipc::{held_elsewhere, try_lock, unlock, LockKind};
/// let path = tempfile::NamedTempFile::new().unwrap();
/// let rw = || std::fs::OpenOptions::new().read(true).write(true).open(path.path()).unwrap();
/// let (a, b) = (rw(), rw()); // two open file descriptions
/// assert!(try_lock(&a, LockKind::Write, 7, 1).unwrap());
/// assert!(!try_lock(&b, LockKind::Write, 7, 1).unwrap()); // two descriptions conflict
/// assert!(held_elsewhere(&b, LockKind::Write, 7, 1).unwrap());
/// unlock(&a, 7, 1).unwrap();
/// assert!(try_lock(&b, LockKind::Write, 7, 1).unwrap());
/// ```
pub fn try_lock(file: impl AsFd, kind: LockKind, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(Some(kind), start, len)?;
    match fcntl(file, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// [`try_lock`] again and again for at most `patience`, sleeping a little
/// longer between tries (50 us, doubling, at most 1 ms): `Ok(false)` when
/// the holder has not let go by then.
///
/// # Errors
/// As [`try_lock`].
pub fn lock_within(
    file: impl AsFd,
    kind: LockKind,
    start: u64,
    len: u64,
    patience: Duration,
) -> io::Result<bool> {
    let deadline = Instant::now() + patience;
    let mut nap = Duration::from_micros(50);
    loop {
        if try_lock(file.as_fd(), kind, start, len)? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(1));
    }
}

/// Release this description's locks on `len` bytes at `start`.
///
/// # Errors
/// `fcntl`'s error.
pub fn unlock(file: impl AsFd, start: u64, len: u64) -> io::Result<()> {
    let mut fl = flock(None, start, len)?;
    fcntl(file, libc::F_OFD_SETLK, &mut fl)
}

/// Whether another open file description holds a lock on `len` bytes at
/// `start` that would conflict with a `kind` lock of this one
/// (`F_OFD_GETLK`; this description's own locks never count).
///
/// # Errors
/// `fcntl`'s error.
pub fn held_elsewhere(file: impl AsFd, kind: LockKind, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(Some(kind), start, len)?;
    fcntl(file, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}
