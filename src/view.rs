//! [`XaView`]: a read-only view of an [`XArray`], for owners that keep
//! bookkeeping in step with the array (the page cache's `nr_pages` and
//! `nr_shadow_pages`) and so must not hand the array out writable.
//!
//! Invariant: nothing reachable from an `XaView` writes to the array: it
//! exposes lock-free reads, iteration, mark tests and introspection only,
//! and never the `&XArray` itself (which would give `store`, `lock`, and
//! cursors whose `array()` leads back to it).

use crate::guard::Guard;
use crate::item::{EntryRef, Item};
use crate::mark::Mark;
use crate::xarray::{Iter, XArray};
use core::fmt;
use core::ops::RangeBounds;

/// A read-only view of an [`XArray`]: every read method of the array, no
/// write.
///
/// ```
/// use kxarray::filemap::{AddressSpace, Folio};
/// use std::sync::Arc;
///
/// let mapping = AddressSpace::new();
/// mapping.add_folio(&Arc::new(Folio::new(8, 3).unwrap())).unwrap();
/// let pages = mapping.pages(); // an XaView: loads, iteration, marks
/// assert_eq!(pages.get_order(13), 3);
/// let guard = kxarray::pin();
/// assert_eq!(pages.iter(&guard).count(), 1);
/// pages.check_invariants().unwrap();
/// ```
pub struct XaView<'a, T: Item> {
    xa: &'a XArray<T>,
}

impl<T: Item> Clone for XaView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Item> Copy for XaView<'_, T> {}

impl<T: Item> fmt::Debug for XaView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("XaView").field(self.xa).finish()
    }
}

impl<'a, T: Item> XaView<'a, T> {
    /// A read-only view of `xa`.
    pub fn new(xa: &'a XArray<T>) -> Self {
        XaView { xa }
    }

    /// See [`XArray::load`].
    #[inline]
    pub fn load<'g>(&self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>>
    where
        'a: 'g,
    {
        self.xa.load(index, guard)
    }
    /// See [`XArray::contains`].
    pub fn contains(&self, index: u64) -> bool {
        self.xa.contains(index)
    }
    /// See [`XArray::load_value`].
    pub fn load_value(&self, index: u64) -> Option<u64> {
        self.xa.load_value(index)
    }
    /// See [`XArray::get_mark`].
    pub fn get_mark(&self, index: u64, mark: Mark) -> bool {
        self.xa.get_mark(index, mark)
    }
    /// See [`XArray::marked`].
    pub fn marked(&self, mark: Mark) -> bool {
        self.xa.marked(mark)
    }
    /// See [`XArray::get_order`].
    pub fn get_order(&self, index: u64) -> u32 {
        self.xa.get_order(index)
    }
    /// See [`XArray::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.xa.is_empty()
    }
    /// See [`XArray::find`].
    pub fn find<'g>(
        &self,
        start: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)>
    where
        'a: 'g,
    {
        self.xa.find(start, max, filter, guard)
    }
    /// See [`XArray::find_after`].
    pub fn find_after<'g>(
        &self,
        index: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)>
    where
        'a: 'g,
    {
        self.xa.find_after(index, max, filter, guard)
    }
    /// See [`XArray::iter`].
    pub fn iter<'g>(&self, guard: &'g Guard) -> Iter<'g, T>
    where
        'a: 'g,
    {
        self.xa.iter(guard)
    }
    /// See [`XArray::range`].
    pub fn range<'g, R: RangeBounds<u64>>(&self, range: R, guard: &'g Guard) -> Iter<'g, T>
    where
        'a: 'g,
    {
        self.xa.range(range, guard)
    }
    /// See [`XArray::iter_marked`].
    pub fn iter_marked<'g, R: RangeBounds<u64>>(
        &self,
        range: R,
        mark: Mark,
        guard: &'g Guard,
    ) -> Iter<'g, T>
    where
        'a: 'g,
    {
        self.xa.iter_marked(range, mark, guard)
    }
    /// See [`XArray::node_count`].
    pub fn node_count(&self) -> usize {
        self.xa.node_count()
    }
    /// See [`XArray::height`].
    pub fn height(&self) -> u32 {
        self.xa.height()
    }
    /// See [`XArray::memory_usage`].
    pub fn memory_usage(&self) -> usize {
        self.xa.memory_usage()
    }
    /// See [`XArray::check_invariants`] (takes the lock, writes nothing).
    ///
    /// # Errors
    ///
    /// A description of the first violated invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.xa.check_invariants()
    }
    /// See [`XArray::dump`].
    pub fn dump(&self) -> String {
        self.xa.dump()
    }
}
