//! Sleeping on a word of the region until another process changes it: the
//! kernel's shared futex (`FUTEX_WAIT` without `FUTEX_PRIVATE_FLAG`, keyed
//! by the page and offset, so it works between processes that map the same
//! file at different addresses).
//!
//! Owns the only futex calls of the crate. Every wait is bounded by a
//! timeout: a waiter wakes to check whether the owner it waits for is still
//! alive (a dead owner wakes no one), so a lost wake-up costs at most one
//! timeout and never a hang. Under loom a wait is a yield.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Sleep while `word` holds `expected`, for at most `timeout` (spurious
/// wake-ups allowed: callers re-check).
#[cfg(all(target_os = "linux", not(loom)))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a live 4-byte aligned atomic (a reference); the
    // kernel only reads it and compares it with `expected`; `ts` lives for
    // the call. A shared futex (no PRIVATE flag) because the word is in
    // memory other processes map.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wake every process and thread sleeping on `word`.
#[cfg(all(target_os = "linux", not(loom)))]
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live aligned atomic; FUTEX_WAKE only uses its
    // address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Under loom (or off Linux): let another thread run.
#[cfg(any(loom, not(target_os = "linux")))]
pub(crate) fn wait(_word: &AtomicU32, _expected: u32, _timeout: Duration) {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::sleep(_timeout.min(Duration::from_millis(1)));
}

/// Under loom (or off Linux): nothing to wake (waiters poll).
#[cfg(any(loom, not(target_os = "linux")))]
pub(crate) fn wake_all(_word: &AtomicU32) {}

/// A spin-then-sleep backoff for a lock or state word another member holds.
#[derive(Debug)]
pub(crate) struct Backoff {
    spins: u32,
}

/// Spins before a waiter sleeps.
const SPINS: u32 = 64;

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff { spins: 0 }
    }

    /// Whether the caller should still spin (true for the first [`SPINS`]
    /// calls); after that it should sleep on the word.
    #[inline]
    pub(crate) fn spin(&mut self) -> bool {
        if self.spins < SPINS {
            self.spins += 1;
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            core::hint::spin_loop();
            true
        } else {
            false
        }
    }
}
