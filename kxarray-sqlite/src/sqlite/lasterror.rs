//! The last error of a VFS call on this thread: its `errno` and a
//! human-readable reason, what `xGetLastError` answers (SQLite's
//! `sqlite3_system_errno()` after a `SQLITE_IOERR` or `SQLITE_CANTOPEN`,
//! and the text it may log), as the unix VFS answers with the thread's
//! `errno`.
//!
//! Any failing path records through [`set_last_error`] (both at once), or
//! [`note_errno`] where the system call failed and [`set_message`] where
//! the failure is reported (an open: the `errno` of the `open(2)` that
//! failed, then the message `xOpen` logs). `xOpen` starts with [`clear`],
//! so a failed open never answers with an older call's `errno`.
//!
//! Invariants: the record is per thread (SQLite calls the VFS on the
//! thread of the connection's call, and asks right after the call
//! failed), so threads never see each other's errors; a success leaves the
//! record alone (as `errno`); the message is at most [`MAX_MESSAGE`] bytes
//! (longer ones are cut at a character boundary).

use std::cell::{Cell, RefCell};
use std::io;
use std::os::raw::{c_char, c_int};

/// The longest message kept (bytes).
pub(crate) const MAX_MESSAGE: usize = 1024;

thread_local! {
    static ERRNO: Cell<c_int> = const { Cell::new(0) };
    static MESSAGE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Record a failure of this thread's VFS call: `errno` (0 when no system
/// call failed) and why, in words a user can act on.
pub(crate) fn set_last_error(errno: c_int, message: &str) {
    ERRNO.with(|e| e.set(errno));
    set_message(message);
}

/// Record the `errno` of a failed system call ([`errno_of`]), leaving the
/// message to the path that reports the failure.
pub(crate) fn note_errno(e: &io::Error) {
    ERRNO.with(|c| c.set(errno_of(e)));
}

/// The `errno` behind an I/O error: the system call's own, or, for an
/// error the page cache carried from an earlier write-back (which keeps
/// its kind and message, as the kernel's `errseq` keeps an errno), the
/// errno of its kind (`EIO` for a kind with none).
pub(crate) fn errno_of(e: &io::Error) -> c_int {
    use io::ErrorKind as K;
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::StorageFull => libc::ENOSPC,
        K::FileTooLarge => libc::EFBIG,
        K::QuotaExceeded => libc::EDQUOT,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::Interrupted => libc::EINTR,
        K::WouldBlock => libc::EAGAIN,
        K::TimedOut => libc::ETIMEDOUT,
        K::ResourceBusy => libc::EBUSY,
        K::InvalidInput => libc::EINVAL,
        K::OutOfMemory => libc::ENOMEM,
        _ => libc::EIO,
    }
}

/// Record why this thread's VFS call failed (the `errno` noted stays).
pub(crate) fn set_message(message: &str) {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    MESSAGE.with(|m| {
        let mut m = m.borrow_mut();
        m.clear();
        m.push_str(&message[..end]);
    });
}

/// Forget this thread's record (at the start of an open).
pub(crate) fn clear() {
    set_last_error(0, "");
}

/// The `errno` last recorded on this thread (0: none).
pub(crate) fn last_errno() -> c_int {
    ERRNO.with(Cell::get)
}

/// `xGetLastError(n, out)`: the message into `out` (at most `n - 1` bytes
/// and a NUL, nothing when `n` is 0 or `out` null), and the `errno`.
///
/// # Safety
/// - `out` is null or points to `n` writable bytes.
pub(crate) unsafe fn get_last_error(n: c_int, out: *mut c_char) -> c_int {
    let Ok(n) = usize::try_from(n) else {
        return last_errno();
    };
    if n > 0 && !out.is_null() {
        MESSAGE.with(|m| {
            let m = m.borrow();
            let len = m.len().min(n - 1);
            // SAFETY: per the caller, `out` has `n` writable bytes, and
            // `len + 1 <= n`.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len + 1) };
            dst[..len].copy_from_slice(&m.as_bytes()[..len]);
            dst[len] = 0;
        });
    }
    last_errno()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(n: usize) -> (c_int, Vec<u8>) {
        let mut buf = vec![0xffu8; n];
        // SAFETY: `buf` has `n` writable bytes.
        let e = unsafe { get_last_error(n as c_int, buf.as_mut_ptr().cast()) };
        (e, buf)
    }

    #[test]
    fn per_thread_with_a_message_cut_to_the_buffer() {
        set_last_error(libc::ENOENT, "kxarray: open /bogus/x.db: No such file");
        let (e, buf) = read(14);
        assert_eq!(e, libc::ENOENT);
        assert_eq!(&buf[..], b"kxarray: open\0");
        // SAFETY: a null buffer is never written.
        assert_eq!(unsafe { get_last_error(0, std::ptr::null_mut()) }, 2);
        std::thread::spawn(|| assert_eq!(last_errno(), 0))
            .join()
            .unwrap();
        note_errno(&io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(read(64).0, libc::EACCES);
        note_errno(&io::Error::new(
            io::ErrorKind::FileTooLarge,
            "writeback failed",
        ));
        assert_eq!(read(64).0, libc::EFBIG);
        clear();
        let (e, buf) = read(4);
        assert_eq!((e, buf[0]), (0, 0));
        let long = "é".repeat(MAX_MESSAGE);
        set_message(&long);
        MESSAGE.with(|m| assert!(m.borrow().len() <= MAX_MESSAGE));
    }
}
