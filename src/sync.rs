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
//!
//! Under loom it also keeps freed nodes in quarantine (`Quarantine`): a
//! node freed while a reader can still reach it is reported by the next
//! access instead of being silently read after the free.

/// A process-wide switch for the test hooks (the `fault` module): off until a
/// test arms a hook, so the hooks cost one relaxed load of a flag that
/// stays `false` in every program that does not use them.
///
/// Deliberately a std atomic under loom too: it guards no data and is set
/// before the code under test runs, so modelling it would only add states.
#[derive(Debug)]
pub(crate) struct HookFlag(std::sync::atomic::AtomicBool);

impl HookFlag {
    pub(crate) const fn new() -> Self {
        HookFlag(std::sync::atomic::AtomicBool::new(false))
    }
    /// Whether any hook was ever armed.
    #[inline(always)]
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Arm: from now on the hooks consult their per-thread state.
    pub(crate) fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// crossbeam-epoch, wrapped by the `guard` module (the only one naming it).
pub(crate) use crossbeam_epoch as epoch;

/// A process-wide static: a plain `static` (its initialiser must be
/// `const`) normally, and under loom a lazily made one that loom rebuilds
/// for every execution (loom's atomics and locks are not `const`). Used as
/// `global! { static NAME: Type = init; }`, then `NAME.method()`.
macro_rules! global {
    ($(#[$m:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(loom))]
        $(#[$m])*
        static $name: $t = $init;
        #[cfg(loom)]
        loom::lazy_static! {
            $(#[$m])*
            static ref $name: $t = $init;
        }
    };
}
pub(crate) use global;

/// A const-initialised thread-local (`thread_local_const! { static NAME:
/// Type = init; }`): std's `const { init }` form normally, so that a type
/// without a destructor costs one thread-local load per access; loom's
/// plain form under loom (its macro has no `const` form).
macro_rules! thread_local_const {
    ($(#[$m:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(loom))]
        std::thread_local! {
            $(#[$m])*
            static $name: $t = const { $init };
        }
        #[cfg(loom)]
        loom::thread_local! {
            $(#[$m])*
            static $name: $t = $init;
        }
    };
}
pub(crate) use thread_local_const;

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{
        compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
        Ordering,
    };

    /// A mutex around data (page-cache lists, per-file state).
    pub(crate) type Lock<T> = parking_lot::Mutex<T>;
    /// Its guard.
    pub(crate) type LockGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A background thread's wake-up: a stop flag and a pending request,
    /// which it sleeps on with a timeout. A request made while the thread
    /// is awake stays pending until it takes it, so none is lost.
    pub(crate) struct Event {
        stop: parking_lot::Mutex<bool>,
        cv: parking_lot::Condvar,
        pending: std::sync::atomic::AtomicBool,
    }

    impl Event {
        pub(crate) fn new() -> Self {
            Event {
                stop: parking_lot::Mutex::new(false),
                cv: parking_lot::Condvar::new(),
                pending: std::sync::atomic::AtomicBool::new(false),
            }
        }
        /// Sleep up to `d`, or until a request is pending or the event is
        /// set; returns whether it is set.
        pub(crate) fn wait_timeout(&self, d: std::time::Duration) -> bool {
            let mut g = self.stop.lock();
            if !*g && !self.pending.load(Ordering::Acquire) {
                let _ = self.cv.wait_for(&mut g, d);
            }
            *g
        }
        /// Make a request and wake the sleeper. While one is pending this
        /// is a single load of a flag nobody writes.
        pub(crate) fn kick(&self) {
            if self.pending.load(Ordering::Relaxed) || self.pending.swap(true, Ordering::AcqRel) {
                return;
            }
            // Under the lock: the sleeper is either before its check of
            // `pending` (and sees it) or asleep (and is woken).
            let _g = self.stop.lock();
            self.cv.notify_all();
        }
        /// Take the pending request; whether there was one.
        pub(crate) fn take(&self) -> bool {
            self.pending.swap(false, Ordering::AcqRel)
        }
        /// Whether the event is set.
        pub(crate) fn is_set(&self) -> bool {
            *self.stop.lock()
        }
        /// Set the flag and wake every sleeper.
        pub(crate) fn set(&self) {
            *self.stop.lock() = true;
            self.cv.notify_all();
        }
    }

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

    /// Hand a held [`Lock`] over to whoever will finish with it elsewhere
    /// (an I/O completion, on another thread): the guard is forgotten and
    /// the lock stays held until [`lock_resume`] makes a guard again.
    pub(crate) fn lock_handover<T>(g: LockGuard<'_, T>) {
        core::mem::forget(g);
    }

    /// A guard for a [`Lock`] handed over with [`lock_handover`]; dropping
    /// it unlocks. parking_lot's mutex is not tied to the thread that
    /// locked it (its unlock is an atomic store and a wake-up), so the
    /// thread that resumes may be another.
    ///
    /// # Safety
    /// - `lock` is held by a guard [`lock_handover`] forgot, and the caller
    ///   owns that acquisition (it resumes it once; nobody else will).
    pub(crate) unsafe fn lock_resume<T>(lock: &Lock<T>) -> LockGuard<'_, T> {
        debug_assert!(lock.is_locked());
        // SAFETY: the caller owns the acquisition the forgotten guard held
        // (the contract); the marker is parking_lot's guard state for it
        // (stateless).
        unsafe { lock.make_guard_unchecked(parking_lot::lock_api::GuardNoSend::new()) }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };

    /// loom's mutex around data, parking_lot's shape.
    pub(crate) struct Lock<T>(loom::sync::Mutex<T>);
    /// Its guard.
    pub(crate) type LockGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Lock<T> {
        pub(crate) fn new(t: T) -> Self {
            Lock(loom::sync::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap()
        }
        pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    /// Under loom background threads are not started; the event only
    /// records the flag and the request.
    pub(crate) struct Event(AtomicBool, AtomicBool);

    impl Event {
        pub(crate) fn new() -> Self {
            Event(AtomicBool::new(false), AtomicBool::new(false))
        }
        pub(crate) fn wait_timeout(&self, _d: std::time::Duration) -> bool {
            loom::thread::yield_now();
            self.0.load(Ordering::Acquire)
        }
        pub(crate) fn kick(&self) {
            self.1.store(true, Ordering::Release);
        }
        pub(crate) fn take(&self) -> bool {
            self.1.swap(false, Ordering::AcqRel)
        }
        pub(crate) fn is_set(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
        pub(crate) fn set(&self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// Use-after-free detection for the loom models.
    ///
    /// Loom does not notice a read of freed memory, so under loom a freed
    /// node is not returned to the allocator at once: it is marked dead and
    /// kept in a bounded FIFO (the last [`Quarantine::CAPACITY`] frees), and
    /// every slot or mark read checks the mark. A node freed while a reader
    /// can still reach it (a free not deferred through the epoch, or an
    /// epoch advanced too early) then fails that check in the interleaving
    /// where the reader comes back to it, instead of being undefined
    /// behaviour that loom cannot see.
    pub(crate) struct Quarantine(std::sync::atomic::AtomicBool);

    /// Freed nodes still held: (address, the function that frees it).
    type Held = std::collections::VecDeque<(usize, unsafe fn(usize))>;
    static HELD: std::sync::Mutex<Held> = std::sync::Mutex::new(Held::new());

    impl Quarantine {
        /// Frees held back before the oldest is released; far more than a
        /// model frees in one execution.
        pub(crate) const CAPACITY: usize = 4096;

        pub(crate) const fn new() -> Self {
            Quarantine(std::sync::atomic::AtomicBool::new(false))
        }

        /// Panics if the object this flag belongs to was freed.
        #[inline]
        #[track_caller]
        pub(crate) fn check(&self) {
            assert!(
                !self.0.load(std::sync::atomic::Ordering::SeqCst),
                "kxarray (loom): a node was read after it was freed"
            );
        }

        /// Mark the object dead and hold it; `free(addr)` releases it later.
        ///
        /// # Safety
        /// `addr` is an object that nobody will free otherwise, `self` is
        /// inside it, and `free(addr)` releases it.
        pub(crate) unsafe fn bury(&self, addr: usize, free: unsafe fn(usize)) {
            debug_assert!(addr != 0, "bury: null object");
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            let old = {
                let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
                held.push_back((addr, free));
                if held.len() > Self::CAPACITY {
                    held.pop_front()
                } else {
                    None
                }
            };
            if let Some((a, f)) = old {
                // SAFETY: `a` was buried with its own `f` (the contract
                // above) and has been held through CAPACITY later frees.
                unsafe { f(a) }
            }
        }
    }

    /// A lock loom does not model, for state that must stay usable after a
    /// model's end (see `lightpin::limbo::Arrivals`).
    pub(crate) type PlainLock<T> = std::sync::Mutex<T>;

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
