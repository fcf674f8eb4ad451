//! The crate's epoch guard, [`Guard`] (the `rcu_read_lock` analog), and
//! [`pin`], the only public way to get one.
//!
//! Invariant: every `Guard` outside this crate is pinned on crossbeam-epoch's
//! default collector, the one every deferred free of the crate goes through
//! (nodes in `XaState::free_node`, items in `cursor::dispose_item`, both via
//! [`Guard::defer_unchecked`]). So a reader's guard always holds back the
//! frees a writer defers, and a writer's guard always defers into the
//! collector readers pin. The type wraps `crossbeam_epoch::Guard` with a
//! private field so that a guard pinned on another `Collector` cannot be
//! passed where a `Guard` is expected:
//!
//! ```compile_fail,E0308
//! // A guard from a foreign collector does not protect against frees
//! // deferred into the default one, so it is not a `kxarray::Guard`.
//! let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
//! let handle = crossbeam_epoch::Collector::new().register();
//! let foreign = handle.pin();
//! let _ = xa.load(1, &foreign);
//! ```
//!
//! ```
//! // The same load with the crate's guard compiles.
//! let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
//! let guard = kxarray::pin();
//! assert!(xa.load(1, &guard).is_none());
//! ```
//!
//! The one exception is the crate-internal [`Guard::unprotected`], used only
//! through `&mut XArray` (no reader can exist) and never handed out.

use crate::sync::epoch;
use core::fmt;

/// The epoch guard readers hold (the RCU read lock analog), pinned on
/// crossbeam-epoch's default collector. Entries loaded under it stay readable
/// until it is dropped. Made only by [`pin`].
///
/// ```compile_fail,E0308
/// // No guard pinned elsewhere is accepted, not even by a cursor writing.
/// let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
/// let foreign = crossbeam_epoch::Collector::new().register().pin();
/// let _ = kxarray::XaState::new(&xa, &foreign, 1);
/// ```
#[repr(transparent)]
pub struct Guard(epoch::Guard);

/// Pin the current thread's epoch on the default collector: entries loaded
/// under the returned guard stay readable until it is dropped
/// (`rcu_read_lock`).
#[inline]
pub fn pin() -> Guard {
    Guard(epoch::pin())
}

impl Guard {
    /// Push this thread's deferred frees to the global queue and try to
    /// advance the epoch, so that frees deferred earlier can run (useful in
    /// tests and before measuring memory).
    pub fn flush(&self) {
        self.0.flush()
    }

    /// Unpin and pin again (on the same default collector), letting the
    /// epoch advance past this guard. Entries loaded under it must not be
    /// held across the call, which the `&mut` borrow enforces.
    pub fn repin(&mut self) {
        self.0.repin()
    }

    /// Defer `f` until no guard pinned now on the default collector remains.
    ///
    /// # Safety
    /// - `f` must be safe to run on any thread once every guard pinned on
    ///   the default collector at the time of the call has been dropped
    ///   (what it frees is unreachable for readers pinning later).
    /// - On the [`unprotected`](Guard::unprotected) guard `f` runs at once:
    ///   the caller must then have exclusive access to what `f` frees.
    #[inline]
    pub(crate) unsafe fn defer_unchecked<F: FnOnce() + Send>(&self, f: F) {
        // Both conditions are about reachability by other threads, which
        // cannot be observed here (no debug check possible).
        // SAFETY: forwarded from this function's contract.
        unsafe { self.0.defer_unchecked(f) }
    }

    /// Whether this is the [`unprotected`](Guard::unprotected) guard.
    #[inline]
    pub(crate) fn is_unprotected(&self) -> bool {
        self.0.collector().is_none()
    }

    /// A guard that protects nothing: deferred functions run at once.
    ///
    /// # Safety
    /// - The caller has exclusive access (`&mut`) to every structure whose
    ///   frees it defers through the returned guard, so no reader can see
    ///   what is freed.
    /// - The guard is never handed to code outside the crate (a reader using
    ///   it would not be protected).
    #[inline]
    pub(crate) unsafe fn unprotected() -> &'static Guard {
        // Exclusivity is the caller's `&mut` borrow: nothing to check at
        // run time beyond the guard being crossbeam's unprotected one.
        // SAFETY: the caller upholds the contract above.
        let g: &'static epoch::Guard = unsafe { epoch::unprotected() };
        debug_assert!(g.collector().is_none());
        // SAFETY: `Guard` is `repr(transparent)` over `epoch::Guard`, so the
        // reference cast keeps layout and validity.
        unsafe { &*core::ptr::from_ref(g).cast::<Guard>() }
    }
}

/// A read-side section that keeps tree nodes allocated: the lock-free
/// descents (`XArray::load_raw`, node handles) take one as the witness that
/// the nodes they reach stay readable while it is borrowed. Implemented by
/// [`Guard`] and by the light reader's pin (`LightPin` in the `lightpin` module),
/// which protects nodes only, never items.
///
/// # Safety
///
/// An implementor promises that a tree node reachable from a live tree at
/// any point while `&self` is borrowed is not freed before that borrow
/// ends.
pub(crate) unsafe trait ProtectsNodes {}

/// A read-side section that keeps folio buffers allocated
/// (`filemap::mem`): a buffer reached through a folio read under it is not
/// freed before the borrow ends. Implemented by [`Guard`] and by the light
/// pin: a buffer is freed only after a crossbeam grace period and then a
/// light one.
///
/// # Safety
///
/// An implementor promises that a folio buffer that was a folio's current
/// buffer at any point while `&self` is borrowed is not freed before that
/// borrow ends.
pub(crate) unsafe trait ProtectsBuffers {}

// SAFETY: buffer frees are deferred through the default collector this
// guard is pinned on before they go to the light limbo (`Buf::retire`).
unsafe impl ProtectsBuffers for Guard {}

// SAFETY: every node free is deferred through the default collector this
// guard is pinned on (the module invariant), and then waits for the light
// readers too (`Dying::retire`); the unprotected guard is only used on trees
// nobody else can reach, whose frees run at once by the `&mut` owner.
unsafe impl ProtectsNodes for Guard {}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Guard { .. }")
    }
}
