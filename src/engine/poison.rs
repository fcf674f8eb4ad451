//! Poisoning: a panic inside a write (a bug, or an injected fault) marks
//! the array poisoned and detaches its half-written tree, which is leaked.
//!
//! Invariant: a poisoned array never serves its old tree again: readers
//! see it empty, the writer lock and every writing method panic, and
//! `check_invariants` reports the poisoning.

use super::array::{XArray, FLAG_POISONED};
use crate::entry::RawEntry;
use crate::item::Item;
use crate::sync::Ordering;

impl<T: Item> XArray<T> {
    /// Whether a panic inside a write poisoned the array (see the module
    /// documentation): it then reads as empty and refuses writes.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// assert!(!xa.is_poisoned());
    /// ```
    pub fn is_poisoned(&self) -> bool {
        self.flags() & FLAG_POISONED != 0
    }

    /// Called under the lock when a write unwinds: detach (and leak) the
    /// half-written tree so that nothing reads or frees it again.
    #[cold]
    pub(crate) fn poison(&self) {
        self.flags
            .store(self.flags() | FLAG_POISONED, Ordering::Relaxed);
        self.head.store(RawEntry::NULL);
        self.bump_seq();
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn poisoned_panic() -> ! {
        panic!("kxarray: the array was poisoned by a panic inside a write")
    }
}
