//! Blocking on file descriptors: `poll(2)` with a timeout, and
//! [`StopSignal`], an `eventfd` another thread sets to wake a poller.
//!
//! Owns the crate's `poll` and `eventfd` calls (with the budget
//! registry's `fcntl` lock, the only unsafe code of the memory module). Invariants: a timeout is rounded *up* to whole
//! milliseconds, so a poller woken at a deadline is never early and never
//! spins through sub-millisecond timeouts; once set, a [`StopSignal`]
//! stays set (its counter is never read), so no wake-up is lost whether
//! the poller is inside `poll` or about to enter it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A one-way wake-up for a thread blocked in `poll`: an `eventfd` that
/// becomes readable when [`set`](Self::set) and stays so.
///
/// A [`PressureSource`](super::PressureSource) polls it beside its own
/// descriptor and returns [`Wait::Stop`](super::Wait::Stop) once it is
/// set; a fake source can block on it with [`wait`](Self::wait).
///
/// ```
/// use kxarray::memory::StopSignal;
/// use std::time::Duration;
///
/// let stop = StopSignal::new().unwrap();
/// assert!(!stop.wait(Some(Duration::from_millis(1))).unwrap()); // timed out
/// stop.set();
/// assert!(stop.is_set());
/// assert!(stop.wait(None).unwrap()); // returns at once, and stays set
/// assert!(stop.is_set());
/// ```
#[derive(Debug)]
pub struct StopSignal {
    fd: File,
}

impl StopSignal {
    /// A signal not set.
    ///
    /// # Errors
    /// `eventfd`'s error (out of descriptors).
    pub fn new() -> io::Result<StopSignal> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor eventfd just opened and nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(StopSignal {
            fd: File::from(owned),
        })
    }

    /// Set the signal: every present and future poll of it returns.
    pub fn set(&self) {
        // An eventfd's counter saturates only after 2^64 - 2 writes; a
        // full counter (EAGAIN) is set already.
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    /// Whether it is set (without blocking).
    pub fn is_set(&self) -> bool {
        self.wait(Some(Duration::ZERO)).unwrap_or(false)
    }

    /// Block until it is set (`true`) or `timeout` passes (`false`;
    /// `None` waits for ever).
    ///
    /// # Errors
    /// `poll`'s error.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut fds = [pollfd(self.as_fd(), libc::POLLIN)];
        poll(&mut fds, timeout)?;
        Ok(fds[0].revents != 0)
    }
}

impl AsFd for StopSignal {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A `pollfd` asking for `events` on `fd`.
pub(crate) fn pollfd(fd: BorrowedFd<'_>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

/// `timeout` in milliseconds for `poll`, rounded up; -1 for `None`.
fn timeout_ms(timeout: Option<Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(libc::c_int::MAX as u128) as libc::c_int
        }
    }
}

/// `poll(2)` on `fds` for at most `timeout` (`None`: no limit): the number
/// of descriptors with events, 0 on a timeout or an interrupting signal
/// (the caller looks at the clock again either way).
///
/// # Errors
/// `poll`'s error other than `EINTR`.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
    // pollfd structures for the whole call; poll writes only their revents.
    let n = unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            timeout_ms(timeout),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            fds.iter_mut().for_each(|f| f.revents = 0);
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "poll(2) and eventfd(2) are foreign calls Miri does not run"
    )]
    fn timeouts_round_up() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(
            timeout_ms(Some(Duration::from_secs(u64::MAX))),
            libc::c_int::MAX
        );
    }

    /// A set from another thread wakes a waiter blocked with no timeout.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "poll(2) and eventfd(2) are foreign calls Miri does not run"
    )]
    fn set_wakes_a_blocked_waiter() {
        let stop = std::sync::Arc::new(StopSignal::new().unwrap());
        let s = std::sync::Arc::clone(&stop);
        let waiter = std::thread::spawn(move || s.wait(None).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        stop.set();
        assert!(waiter.join().unwrap());
    }
}
