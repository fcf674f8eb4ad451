//! The writer lock: [`XaLock`] (`xa_lock`), the mutex guard inside it, the
//! [`Writer`] witness it mints for the engine's write paths, and the work
//! done when the lock is released: the nodes `create_range` made that no
//! store filled are removed then.
//!
//! Invariants: a `Writer` is minted only while the mutex is held (by an
//! `XaLock`, or by the unlock sweep before the guard is released); no empty
//! node outlives the lock (except in a poisoned array, whose tree is
//! abandoned).

use super::array::{XArray, FLAG_POISONED};
use super::state::XaState;
use crate::guard::{pin, Guard};
use crate::item::Item;
use crate::node::Writer;
use crate::sync::{MutexGuard, Ordering};

/// The held writer lock of an [`XArray`] (`xa_lock`), with an epoch guard
/// for the entries it hands out. Write methods on the lock and on
/// [`XaState`] take it as proof that the lock is held.
pub struct XaLock<'a, T: Item> {
    pub(crate) xa: &'a XArray<T>,
    pub(crate) epoch: Guard,
    pub(crate) _held: Held<'a, T>,
}

/// The mutex guard inside an [`XaLock`]: before unlocking, it removes the
/// nodes `create_range` made that no store filled, so no empty node
/// outlives the lock.
pub(crate) struct Held<'a, T: Item> {
    pub(crate) xa: &'a XArray<T>,
    pub(crate) _guard: MutexGuard<'a>,
}

impl<T: Item> Drop for Held<'_, T> {
    fn drop(&mut self) {
        let xa = self.xa;
        let first = xa.created_first.load(Ordering::Relaxed);
        let last = xa.created_last.load(Ordering::Relaxed);
        if first <= last {
            xa.created_first.store(u64::MAX, Ordering::Relaxed);
            xa.created_last.store(0, Ordering::Relaxed);
            if !xa.is_poisoned() {
                let guard = pin();
                // SAFETY: `self` holds the array's mutex until the end of this
                // drop, past the sweep.
                let w = unsafe { Writer::new(|| xa.is_locked()) };
                XaState::new(xa, &guard, first).sweep_empty(w, first, last);
            }
        }
    }
}

impl<T: Item> XArray<T> {
    /// Record (under the lock) that `create_range` made nodes for
    /// `first..=last`; see [`Held`].
    pub(crate) fn note_created(&self, first: u64, last: u64) {
        let f = self.created_first.load(Ordering::Relaxed).min(first);
        let l = self.created_last.load(Ordering::Relaxed).max(last);
        self.created_first.store(f, Ordering::Relaxed);
        self.created_last.store(l, Ordering::Relaxed);
    }
}

impl<T: Item> XArray<T> {
    /// Take the writer lock (`xa_lock`).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]): a panic inside an
    /// earlier write left it unusable. Every writing method panics for the
    /// same reason.
    ///
    /// Context: blocks until the lock is free; do not take it twice on one
    /// thread (it is not reentrant). Readers are never blocked by it.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// lock.set_mark(1, Mark::M0);
    /// drop(lock);
    /// assert!(xa.get_mark(1, Mark::M0));
    /// ```
    #[inline]
    pub fn lock(&self) -> XaLock<'_, T> {
        // Pin before taking the mutex: a pin may run deferred item
        // destructors, and one that locks an `XArray` (this one included)
        // must not run while this lock is held.
        let epoch = pin();
        let held = self.lock.lock();
        if self.flags() & FLAG_POISONED != 0 {
            drop(held);
            Self::poisoned_panic();
        }
        XaLock {
            xa: self,
            epoch,
            _held: Held {
                xa: self,
                _guard: held,
            },
        }
    }

    /// Whether the writer lock is currently held by someone.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// assert!(xa.is_locked());
    /// drop(lock);
    /// assert!(!xa.is_locked());
    /// ```
    pub fn is_locked(&self) -> bool {
        self.lock.is_locked()
    }
}

impl<'a, T: Item> XaLock<'a, T> {
    /// The array this lock belongs to.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// assert!(std::ptr::eq(lock.array(), &xa));
    /// ```
    pub fn array(&self) -> &'a XArray<T> {
        self.xa
    }

    /// The epoch guard held with the lock: entries returned by the lock's
    /// methods are readable while it lives.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// assert!(xa.load(1, lock.guard()).is_some());
    /// ```
    pub fn guard(&self) -> &Guard {
        &self.epoch
    }

    pub(crate) fn into_guard(self) -> Guard {
        let XaLock { epoch, _held, .. } = self;
        drop(_held);
        epoch
    }

    /// A cursor at `index` reading under this lock's guard.
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let mut xas = lock.cursor(5);
    /// xas.store(&lock, Some(Entry::Value(5))).unwrap();
    /// assert_eq!(lock.load(5).and_then(|e| e.value()), Some(5));
    /// ```
    pub fn cursor(&self, index: u64) -> XaState<'_, T> {
        XaState::new(self.xa, &self.epoch, index)
    }

    /// The witness that this lock is held, for the engine's write paths.
    #[inline(always)]
    pub(crate) fn writer(&self) -> Writer<'_> {
        // SAFETY: `self` holds the array's mutex for as long as it is
        // borrowed, which bounds the writer's lifetime.
        unsafe { Writer::new(|| self.xa.is_locked()) }
    }
}
