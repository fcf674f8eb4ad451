//! The concurrency shim: every atomic, lock and epoch primitive the crate uses
//! comes from here.
//!
//! Under `cfg(loom)` the std atomics and the `parking_lot` mutex are swapped
//! for loom's, so the loom models in `tests/loom_*.rs` run the real tree code
//! rather than a copy of it. crossbeam-epoch follows along when it is built
//! with `--cfg crossbeam_loom` and its `loom` feature (see `Cargo.toml`).
//!
//! Invariant: no other module names `std::sync::atomic`, `parking_lot` or
//! `loom` directly.

/// crossbeam-epoch, wrapped by the `guard` module (the only one naming it).
pub(crate) use crossbeam_epoch as epoch;

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

    /// The writer lock (the kernel's `xa_lock`).
    pub(crate) struct Mutex(parking_lot::Mutex<()>);
    pub(crate) type MutexGuard<'a> = parking_lot::MutexGuard<'a, ()>;

    impl Mutex {
        pub(crate) fn new() -> Self {
            Mutex(parking_lot::Mutex::new(()))
        }
        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_> {
            self.0.lock()
        }
        #[inline]
        pub(crate) fn is_locked(&self) -> bool {
            self.0.is_locked()
        }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

    /// The writer lock, loom's mutex with parking_lot's shape (no poisoning).
    pub(crate) struct Mutex(loom::sync::Mutex<()>, loom::sync::atomic::AtomicBool);
    pub(crate) struct MutexGuard<'a>(
        Option<loom::sync::MutexGuard<'a, ()>>,
        &'a loom::sync::atomic::AtomicBool,
    );

    impl Drop for MutexGuard<'_> {
        fn drop(&mut self) {
            self.1.store(false, Ordering::Relaxed);
            self.0.take();
        }
    }

    impl Mutex {
        pub(crate) fn new() -> Self {
            Mutex(
                loom::sync::Mutex::new(()),
                loom::sync::atomic::AtomicBool::new(false),
            )
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_> {
            let g = self.0.lock().unwrap();
            self.1.store(true, Ordering::Relaxed);
            MutexGuard(Some(g), &self.1)
        }
        pub(crate) fn is_locked(&self) -> bool {
            self.1.load(Ordering::Relaxed)
        }
    }
}

pub(crate) use imp::*;
