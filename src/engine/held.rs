//! The mutex guard inside an [`XaLock`](super::XaLock) and the work done
//! when the lock is released: the nodes `create_range` made that no store
//! filled are removed then.
//!
//! Invariant: no empty node outlives the lock (except in a poisoned array,
//! whose tree is abandoned).

use super::array::XArray;
use super::state::XaState;
use crate::guard::pin;
use crate::item::Item;
use crate::node::Writer;
use crate::sync::{MutexGuard, Ordering};

/// The mutex guard inside an [`XaLock`](super::XaLock): before unlocking, it removes the
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
