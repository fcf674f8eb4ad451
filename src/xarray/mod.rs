//! The array: the head pointer, the root mark flags, the writer lock and
//! the public API built on the cursor engine.
//!
//! Concurrency model (the kernel's, with crossbeam-epoch standing in for
//! RCU):
//! - Writers serialize on one lock ([`XArray::lock`] returns an [`XaLock`],
//!   the `xa_lock` analog). Every mutation happens under it.
//! - Readers take no lock. They pin an epoch guard ([`crate::pin`]) and walk
//!   the tree with Acquire loads; writers publish with Release stores, so a
//!   reader sees for each index either the old or the new entry.
//! - A node or item removed from the tree is handed to the epoch and freed
//!   only after every guard that could have seen it is dropped. Readers
//!   inside a detached node find RETRY entries and restart from the root.
//! - Owned items come back only through `&mut self` methods (no reader can
//!   exist then); through `&self`, removed items come back as [`Retired`]
//!   (which keeps the epoch pinned) or as [`EntryRef`] under a guard.
//!
//! Invariants (checked by [`XArray::check_invariants`]): node counts match
//! their slots; marks propagate to parents and to the root flags; no node
//! reachable from the head is empty; the tree is no taller than its largest
//! index needs; every multi-index entry is an aligned power-of-two block.
//!
//! Panic safety: a panic inside a write (a bug in the crate, or an item's
//! `Drop` run inline on the `&mut` paths) poisons the array: the tree as
//! the panic left it is detached and leaked (never freed, never read
//! again), readers see an empty array, and [`XArray::lock`] panics. A panic
//! anywhere else (an item's `Drop` run by the epoch, user code holding the
//! lock) leaves the tree consistent and the array usable.

use crate::engine::state::XaState;
use crate::entry::RawEntry;
use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, Retired};
use crate::mark::Mark;
use crate::node::{Node, NodeRef, Shared, CHUNK_SHIFT};
use crate::rejected::Rejected;
use crate::sync::Ordering;
use core::ops::{Bound, RangeBounds, RangeInclusive};

mod iter;
mod lock;
mod range;

pub use crate::engine::{Flags, XArray, XaLock};
pub use iter::{IntoIter, Iter};

impl<T: Item> XArray<T> {
    // ------------------------------------------------------------------
    // Lock-free reads
    // ------------------------------------------------------------------

    /// The entry at `index` (`xa_load`), lock-free. The result borrows the
    /// guard: the entry stays readable until the guard is dropped, even if a
    /// writer removes it meanwhile.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(4, Entry::Value(40)).unwrap();
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.load(4, &guard).and_then(|e| e.value()), Some(40));
    /// assert!(xa.load(5, &guard).is_none());
    /// ```
    #[inline]
    pub fn load<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        let e = self.load_raw(index, guard);
        // SAFETY: read under `guard`, pinned on the default collector (the
        // `Guard` invariant), into which every removed item's free is
        // deferred: it runs only after `guard` is dropped.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    /// Same as [`XArray::load`] (the std-collections name).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(4, Entry::Item(Box::new(7))).unwrap();
    /// let guard = kxarray::pin();
    /// assert_eq!(*xa.get(4, &guard).unwrap().item().unwrap(), 7);
    /// ```
    #[inline]
    pub fn get<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        self.load(index, guard)
    }

    /// Whether `index` holds an entry (reserved slots do not count).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.reserve(1).unwrap();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// assert!(!xa.contains(1) && xa.contains(2));
    /// ```
    pub fn contains(&self, index: u64) -> bool {
        let guard = pin();
        self.load(index, &guard).is_some()
    }

    /// The value entry at `index`, if it holds one (no guard needed).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(9, Entry::Value(90)).unwrap();
    /// assert_eq!(xa.load_value(9), Some(90));
    /// assert_eq!(xa.load_value(8), None);
    /// ```
    #[inline]
    pub fn load_value(&self, index: u64) -> Option<u64> {
        // A light pin (no locked instruction): the descent reads nodes and
        // the entry word only, never an item.
        let value = |e: RawEntry| e.is_value().then(|| e.to_value());
        crate::lightpin::read(|p| value(self.load_raw(index, p))).unwrap_or_else(|| {
            let guard = pin(); // this thread's light reader is torn down
            self.load(index, &guard).and_then(|e| e.value())
        })
    }

    /// Whether the entry at `index` has `mark` (`xa_get_mark`), lock-free.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(3, Entry::Value(3)).unwrap();
    /// xa.set_mark(3, Mark::M0);
    /// assert!(xa.get_mark(3, Mark::M0) && !xa.get_mark(3, Mark::M1));
    /// ```
    pub fn get_mark(&self, index: u64, mark: Mark) -> bool {
        let guard = pin();
        let mut xas = XaState::new(self, &guard, index);
        loop {
            let e = xas.load_raw();
            if e.is_retry() {
                xas.reset();
                continue;
            }
            if e.is_null() {
                return false;
            }
            return xas.get_mark(mark);
        }
    }

    /// The order of the entry at `index`, 0 if there is none (`xa_get_order`).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(64, 6, Entry::Value(1)).unwrap();
    /// assert_eq!(xa.get_order(100), 6);
    /// assert_eq!(xa.get_order(0), 0);
    /// ```
    pub fn get_order(&self, index: u64) -> u32 {
        let guard = pin();
        let mut xas = XaState::new(self, &guard, index);
        match xas.load() {
            Some(_) => xas.get_order(),
            None => 0,
        }
    }

    /// Whether the array holds nothing (reserved entries count as
    /// something, as in the kernel).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// assert!(xa.is_empty());
    /// xa.reserve(5).unwrap();
    /// assert!(!xa.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.head.load().is_null()
    }

    /// The first entry at or after `start` and at most `max` that matches
    /// `filter` (`xa_find`): `None` for any entry, `Some(mark)` for marked
    /// ones. Returns its index and the entry.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(10, Entry::Value(1)).unwrap();
    /// xa.store(20, Entry::Value(2)).unwrap();
    /// xa.set_mark(20, Mark::M0);
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.find(5, u64::MAX, None, &guard).map(|(i, _)| i), Some(10));
    /// assert_eq!(xa.find(5, u64::MAX, Some(Mark::M0), &guard).map(|(i, _)| i), Some(20));
    /// ```
    pub fn find<'g>(
        &'g self,
        start: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)> {
        let mut xas = XaState::new(self, guard, start);
        let e = match filter {
            Some(m) => xas.find_marked(max, m),
            None => xas.find(max),
        }?;
        Some((xas.index(), e))
    }

    /// The first matching entry strictly after the entry containing `index`
    /// (`xa_find_after`): siblings of a multi-index entry are skipped.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(0, 2, Entry::Value(1)).unwrap(); // 0..=3
    /// xa.store(9, Entry::Value(2)).unwrap();
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.find_after(1, u64::MAX, None, &guard).map(|(i, _)| i), Some(9));
    /// ```
    pub fn find_after<'g>(
        &'g self,
        index: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)> {
        let start = index.checked_add(1)?;
        let mut xas = XaState::new(self, guard, start);
        loop {
            let e = match filter {
                Some(m) => xas.find_marked(max, m),
                None => xas.find(max),
            };
            let e = e?;
            // A marked search that starts on a sibling slot moves the index
            // back to the entry's first index (`xas_find_marked`), i.e. to
            // the entry containing `index`: skip it too, or a find_after
            // loop over a marked multi-index entry never advances.
            if xas.on_sibling_index() || xas.index() <= index {
                continue;
            }
            return Some((xas.index(), e));
        }
    }

    /// An ordered iterator over every entry (one item per multi-index entry).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    /// Entries stored or erased while the iteration runs may or may not be
    /// seen; each entry seen was present at some instant.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// for i in [5, 1, 3] {
    ///     xa.store(i, Entry::Value(i * 10)).unwrap();
    /// }
    /// let guard = kxarray::pin();
    /// let v: Vec<(u64, u64)> = xa.iter(&guard).map(|(i, e)| (i, e.value().unwrap())).collect();
    /// assert_eq!(v, [(1, 10), (3, 30), (5, 50)]);
    /// ```
    pub fn iter<'g>(&'g self, guard: &'g Guard) -> Iter<'g, T> {
        Iter::new(self, guard, 0, u64::MAX, None)
    }

    /// An ordered iterator over the entries in `range`.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// for i in 0..10 {
    ///     xa.store(i, Entry::Value(i)).unwrap();
    /// }
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.range(3..6, &guard).count(), 3);
    /// ```
    pub fn range<'g, R: RangeBounds<u64>>(&'g self, range: R, guard: &'g Guard) -> Iter<'g, T> {
        let (start, end) = bounds(range);
        match end {
            Some(end) => Iter::new(self, guard, start, end, None),
            None => Iter::empty(self, guard),
        }
    }

    /// An ordered iterator over the entries in `range` that carry `mark`.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// for i in 0..10 {
    ///     xa.store(i, Entry::Value(i)).unwrap();
    /// }
    /// xa.set_mark(7, Mark::M2);
    /// let guard = kxarray::pin();
    /// let v: Vec<u64> = xa.iter_marked(.., Mark::M2, &guard).map(|(i, _)| i).collect();
    /// assert_eq!(v, [7]);
    /// ```
    pub fn iter_marked<'g, R: RangeBounds<u64>>(
        &'g self,
        range: R,
        mark: Mark,
        guard: &'g Guard,
    ) -> Iter<'g, T> {
        let (start, end) = bounds(range);
        match end {
            Some(end) => Iter::new(self, guard, start, end, Some(mark)),
            None => Iter::empty(self, guard),
        }
    }

    // ------------------------------------------------------------------
    // Locked writes, one call each (the kernel's `xa_*` normal API)
    // ------------------------------------------------------------------

    pub(crate) fn retire(raw: RawEntry, guard: Guard) -> Option<Retired<T>> {
        if raw.is_user() {
            // SAFETY: the caller deferred the item's drop through `guard`,
            // pinned on the default collector; `Retired` keeps it pinned.
            Some(unsafe { Retired::new(raw, guard) })
        } else {
            None
        }
    }

    /// Store `entry` at `index` (`xa_store`). Storing into a multi-index
    /// entry replaces it for every index it covers; marks are unchanged.
    /// Returns the entry that was there.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::NoMemory`] (after one retry with memory allocated outside the
    /// lock) or [`Error::ValueOutOfRange`]; the entry comes back in the
    /// [`Rejected`] and the array is unchanged.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// assert!(xa.store(1, Entry::Value(1)).unwrap().is_none());
    /// let old = xa.store(1, Entry::Value(2)).unwrap().unwrap();
    /// assert_eq!(old.value(), Some(1));
    /// assert!(xa.store(2, Entry::Value(u64::MAX)).is_err());
    /// ```
    pub fn store(&self, index: u64, entry: Entry<T>) -> Result<Option<Retired<T>>, Rejected<T>> {
        let lock = self.lock();
        let raw = lock.store_raw(index, 0, Some(entry))?;
        let guard = lock.into_guard();
        Ok(Self::retire(raw, guard))
    }

    /// Store `entry` as one multi-index entry covering the `2^order`
    /// indices starting at `index`, which must be aligned to the order.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::Misaligned`], [`Error::OrderTooLarge`], or as
    /// [`XArray::store`]; the entry comes back in the [`Rejected`].
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(512, 9, Entry::Value(3)).unwrap();
    /// assert_eq!(xa.load_value(1000), Some(3));
    /// assert_eq!(xa.get_order(700), 9);
    /// assert!(xa.store_order(513, 9, Entry::Value(3)).is_err());
    /// ```
    pub fn store_order(
        &self,
        index: u64,
        order: u32,
        entry: Entry<T>,
    ) -> Result<Option<Retired<T>>, Rejected<T>> {
        if let Err(e) = check_order(index, order) {
            return Err(Rejected::new(e, Some(entry)));
        }
        let lock = self.lock();
        let raw = lock.store_raw(index, order, Some(entry))?;
        let guard = lock.into_guard();
        Ok(Self::retire(raw, guard))
    }

    /// Erase the entry at `index` (`xa_erase`); a multi-index entry is
    /// erased for all its indices. Returns what was there.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(8, 3, Entry::Value(1)).unwrap();
    /// assert_eq!(xa.erase(10).and_then(|r| r.value()), Some(1));
    /// assert_eq!(xa.load_value(8), None);
    /// ```
    pub fn erase(&self, index: u64) -> Option<Retired<T>> {
        let lock = self.lock();
        let raw = lock.erase_raw(index);
        let guard = lock.into_guard();
        Self::retire(raw, guard)
    }

    /// Store `entry` only if `index` is empty (`xa_insert`); `None` reserves
    /// the index. Fails with [`Error::Busy`] if an entry (or a reservation)
    /// is there.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] if occupied or reserved, or as [`XArray::store`]; the
    /// entry comes back in the [`Rejected`].
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Error, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.insert(1, Some(Entry::Value(1))).unwrap();
    /// let r = xa.insert(1, Some(Entry::Value(2))).unwrap_err();
    /// assert_eq!(r.error, Error::Busy);
    /// assert_eq!(r.entry.and_then(|e| e.value()), Some(2));
    /// ```
    pub fn insert(&self, index: u64, entry: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        self.lock().insert(index, entry)
    }

    /// Replace the entry at `index` with `new` if it currently is `old`
    /// (`xa_cmpxchg`), comparing the raw entry as the kernel does: `old ==
    /// None` matches an empty index only, not a reserved one (use
    /// [`XArray::cmpxchg_reserved`] for that), and storing `new == None`
    /// erases, in allocating arrays too (the index becomes free for
    /// [`XArray::alloc`] again).
    ///
    /// On success returns the replaced entry (readable under `guard`).
    ///
    /// # Errors
    ///
    /// [`Error::Mismatch`] if the entry is not `old` ([`XArray::load`] tells
    /// what is there), [`Error::ValueOutOfRange`] if `old` or `new` is a
    /// value above [`MAX_VALUE`](crate::MAX_VALUE), [`Error::NoMemory`]; `new` comes back in
    /// the [`Rejected`] and the array is unchanged.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, EntryRef, Error, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// // None: only an empty index matches
    /// assert!(xa.cmpxchg(5, None, Some(Entry::Value(1)), &guard).unwrap().is_none());
    /// let r = xa.cmpxchg(5, None, Some(Entry::Value(2)), &guard).unwrap_err();
    /// assert_eq!(r.error, Error::Mismatch);
    /// // a reserved index is not empty for cmpxchg
    /// xa.reserve(6).unwrap();
    /// let r = xa.cmpxchg(6, None, Some(Entry::Value(2)), &guard).unwrap_err();
    /// assert_eq!(r.error, Error::Mismatch);
    /// // replacing with None erases
    /// let old = xa.cmpxchg(5, Some(EntryRef::Value(1)), None, &guard).unwrap();
    /// assert_eq!(old.and_then(|e| e.value()), Some(1));
    /// assert!(xa.load(5, &guard).is_none());
    /// ```
    pub fn cmpxchg<'g>(
        &'g self,
        index: u64,
        old: Option<EntryRef<'_, T>>,
        new: Option<Entry<T>>,
        guard: &'g Guard,
    ) -> Result<Option<EntryRef<'g, T>>, Rejected<T>> {
        let lock = self.lock();
        let expect = old.map_or(Ok(RawEntry::NULL), EntryRef::to_raw);
        let raw = lock.cmpxchg_entry(index, expect, new, guard)?;
        // SAFETY: deferred through `guard` into the default collector it is
        // pinned on, and `guard` outlives 'g.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    /// Replace a reserved entry at `index` with `new` (the kernel's
    /// `xa_cmpxchg(xa, index, XA_ZERO_ENTRY, new)`): an empty or occupied
    /// index is left alone. `new == None` releases the reservation.
    ///
    /// # Errors
    ///
    /// [`Error::Mismatch`] if `index` is not reserved,
    /// [`Error::ValueOutOfRange`], [`Error::NoMemory`]; `new` comes back in
    /// the [`Rejected`] and the array is unchanged.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Error, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let r = xa.cmpxchg_reserved(3, Some(Entry::Value(7))).unwrap_err();
    /// assert_eq!(r.error, Error::Mismatch); // empty: nothing stored
    /// assert_eq!(xa.load_value(3), None);
    /// xa.reserve(3).unwrap();
    /// xa.cmpxchg_reserved(3, Some(Entry::Value(7))).unwrap();
    /// assert_eq!(xa.load_value(3), Some(7));
    /// ```
    pub fn cmpxchg_reserved(&self, index: u64, new: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        self.lock().cmpxchg_reserved(index, new)
    }

    /// Reserve `index` (`xa_reserve`): it reads as empty but a later store
    /// needs no allocation. No-op if occupied.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::NoMemory`]; nothing changed.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.reserve(5).unwrap();
    /// assert!(!xa.contains(5));
    /// assert!(xa.insert(5, Some(Entry::Value(1))).is_err()); // reserved is busy
    /// ```
    pub fn reserve(&self, index: u64) -> Result<(), Error> {
        let lock = self.lock();
        match lock.cmpxchg_raw(index, RawEntry::NULL, RawEntry::ZERO, &lock.epoch) {
            Ok(_) | Err(Error::Mismatch) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Undo a reservation (`xa_release`); no-op if the index was used.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.reserve(5).unwrap();
    /// xa.release(5);
    /// assert!(xa.is_empty());
    /// ```
    pub fn release(&self, index: u64) {
        let lock = self.lock();
        lock.release(index);
    }

    /// Store the value `value` at every index in `first..=last`
    /// (`xa_store_range`), as aligned power-of-two multi-index entries (the
    /// fewest that tile the range; any range up to all of `0..=u64::MAX`);
    /// `None` erases the range. Value entries only: an item has a single
    /// owner.
    ///
    /// An existing multi-index entry that reaches outside the range is
    /// replaced (or erased) whole, as a [`store`](XArray::store) into any of
    /// its indices would; every index of the range is stored either way
    /// (the kernel's `xa_store_range` can miss part of the range there).
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRange`] when `last < first`, [`Error::ValueOutOfRange`],
    /// [`Error::NoMemory`].
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(4, 2, Entry::Value(1)).unwrap(); // indices 4..=7
    /// xa.store_range(6, 9, Some(2)).unwrap();
    /// let v: Vec<_> = (4..=10).map(|i| xa.load_value(i)).collect();
    /// assert_eq!(v, [Some(2), Some(2), Some(2), Some(2), Some(2), Some(2), None]);
    /// ```
    pub fn store_range(&self, first: u64, last: u64, value: Option<u64>) -> Result<(), Error> {
        self.lock().store_range(first, last, value)
    }

    /// Set `mark` on the entry at `index` (no-op if empty).
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// xa.set_mark(2, Mark::M1);
    /// assert!(xa.get_mark(2, Mark::M1) && xa.marked(Mark::M1));
    /// ```
    pub fn set_mark(&self, index: u64, mark: Mark) {
        self.lock().set_mark(index, mark)
    }

    /// Clear `mark` on the entry at `index`.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// xa.set_mark(2, Mark::M1);
    /// xa.clear_mark(2, Mark::M1);
    /// assert!(!xa.marked(Mark::M1));
    /// ```
    pub fn clear_mark(&self, index: u64, mark: Mark) {
        self.lock().clear_mark(index, mark)
    }

    /// Allocate a free ID in `limit` and store `entry` there (`xa_alloc`).
    /// The array must have been created with [`Flags::ALLOC`] or
    /// [`Flags::ALLOC1`]. [`Error::Busy`] when the range is full.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when `limit` is full, [`Error::NotAllocating`],
    /// [`Error::ValueOutOfRange`], [`Error::NoMemory`]; the entry comes back
    /// in the [`Rejected`].
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Flags, XArray};
    /// let ids: XArray<Box<u32>> = XArray::with_flags(Flags::ALLOC1);
    /// assert_eq!(ids.alloc(0..=u32::MAX as u64, Some(Entry::Value(9))).unwrap(), 1);
    /// assert_eq!(ids.alloc(0..=u32::MAX as u64, None).unwrap(), 2);
    /// ```
    pub fn alloc(
        &self,
        limit: RangeInclusive<u64>,
        entry: Option<Entry<T>>,
    ) -> Result<u64, Rejected<T>> {
        self.lock().alloc(limit, entry)
    }

    /// Allocate cyclically (`xa_alloc_cyclic`): search from `*next`, wrap to
    /// the start of `limit`. Returns the ID and whether the allocation
    /// wrapped (the kernel's return value 1); `*next` becomes the ID after
    /// it.
    ///
    /// As in the kernel, the wrap is also recorded on the array
    /// (`XA_FLAGS_ALLOC_WRAPPED`): an allocation that leaves `*next` at 0
    /// sets it, and the array's next successful cyclic allocation, through
    /// whichever `next`, reports the wrap and clears it. For a 32-bit range
    /// (`limit` ending at or below `u32::MAX`) `*next` counts as the kernel's
    /// `u32` does, wrapping to 0 after `u32::MAX`; wider ranges wrap after
    /// `u64::MAX`.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when `limit` is full, [`Error::NotAllocating`],
    /// [`Error::ValueOutOfRange`], [`Error::NoMemory`]; the entry comes back
    /// in the [`Rejected`].
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Flags, XArray};
    /// let ids: XArray<Box<u32>> = XArray::with_flags(Flags::ALLOC);
    /// let mut next = u64::from(u32::MAX);
    /// let limit = 0..=u64::from(u32::MAX);
    /// assert_eq!(ids.alloc_cyclic(limit.clone(), &mut next, None).unwrap(), (u32::MAX.into(), false));
    /// assert_eq!(next, 0); // wrapped, as the kernel's u32 does
    /// assert_eq!(ids.alloc_cyclic(limit, &mut next, None).unwrap(), (0, true));
    /// ```
    pub fn alloc_cyclic(
        &self,
        limit: RangeInclusive<u64>,
        next: &mut u64,
        entry: Option<Entry<T>>,
    ) -> Result<(u64, bool), Rejected<T>> {
        self.lock().alloc_cyclic(limit, next, entry)
    }

    /// Remove every entry (`xa_destroy`): nodes and items are freed once
    /// readers are done with them; marks are cleared.
    ///
    /// Context: takes the writer lock for the call (do not hold it).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(1 << 40, Entry::Value(1)).unwrap();
    /// xa.clear();
    /// assert!(xa.is_empty() && xa.node_count() == 0);
    /// ```
    pub fn clear(&self) {
        let lock = self.lock();
        lock.clear();
    }

    // ------------------------------------------------------------------
    // Exclusive access: no lock, no epoch, owned results
    // ------------------------------------------------------------------

    /// Store through an exclusive borrow: no lock, no epoch; the old entry
    /// comes back owned.
    ///
    /// # Errors
    ///
    /// The entry is handed back in [`Rejected`] when a value is out of range
    /// or a node cannot be allocated; the array is then unchanged.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]).
    ///
    /// Context: `&mut self` (no other access exists): no lock, no epoch.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let mut xa: XArray<Box<u32>> = XArray::new();
    /// assert!(xa.replace(3, Entry::Item(Box::new(1))).unwrap().is_none());
    /// let old = xa.replace(3, Entry::Item(Box::new(2))).unwrap();
    /// assert_eq!(old.and_then(|e| e.into_item()).map(|b| *b), Some(1));
    /// ```
    pub fn replace(
        &mut self,
        index: u64,
        entry: Entry<T>,
    ) -> Result<Option<Entry<T>>, Rejected<T>> {
        let raw = match entry.into_raw() {
            Ok(r) => r,
            Err((e, entry)) => return Err(Rejected::new(e, Some(entry))),
        };
        let (mut xas, w) = self.excl_cursor(index);
        loop {
            match xas.store_owned(w, raw) {
                Ok(old) => {
                    if old.is_user() {
                        // SAFETY: unlinked from the tree and not disposed:
                        // ownership passes to the caller.
                        return Ok(Some(unsafe { Entry::from_raw(old) }));
                    }
                    return Ok(None);
                }
                Err(Error::NoMemory) if xas.nomem() => continue,
                Err(e) => {
                    // SAFETY: `raw` (from `into_raw` above) was never
                    // published: the store failed before writing a slot.
                    return Err(unsafe { Rejected::unpublished(e, raw) });
                }
            }
        }
    }

    /// Remove the entry at `index` and return it owned.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]).
    ///
    /// Context: `&mut self` (no other access exists): no lock, no epoch.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let mut xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(3, Entry::Item(Box::new(1))).unwrap();
    /// assert_eq!(xa.remove(3).and_then(|e| e.into_item()).map(|b| *b), Some(1));
    /// assert!(xa.remove(3).is_none());
    /// ```
    pub fn remove(&mut self, index: u64) -> Option<Entry<T>> {
        let (mut xas, w) = self.excl_cursor(index);
        let old = xas.store_owned(w, RawEntry::NULL).ok()?;
        if old.is_user() {
            // SAFETY: unlinked and not disposed: ownership passes to the caller.
            Some(unsafe { Entry::from_raw(old) })
        } else {
            None
        }
    }

    /// A shared view of the entry at `index` without pinning the epoch.
    ///
    /// Context: `&mut self` (no other access exists): no lock, no epoch.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`](crate::XArray::is_poisoned)).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let mut xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(3, Entry::Value(3)).unwrap();
    /// assert_eq!(xa.get_excl(3).and_then(|e| e.value()), Some(3));
    /// ```
    pub fn get_excl(&mut self, index: u64) -> Option<EntryRef<'_, T>> {
        let e = self.load_excl(index);
        // SAFETY: the exclusive borrow keeps every entry alive for '_.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    /// A mutable reference to the item at `index` (for uniquely owned item
    /// types such as `Box`).
    ///
    /// Context: `&mut self` (no other access exists): no lock, no epoch.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let mut xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(3, Entry::Item(Box::new(1))).unwrap();
    /// *xa.get_mut(3).unwrap() += 1;
    /// let guard = kxarray::pin();
    /// assert_eq!(*xa.load(3, &guard).unwrap().item().unwrap(), 2);
    /// ```
    pub fn get_mut(&mut self, index: u64) -> Option<&mut T::Target>
    where
        T: crate::item::ItemMut,
    {
        let e = self.load_excl(index);
        if !e.is_item() {
            return None;
        }
        // SAFETY: `&mut self` excludes every other access; `ItemMut` means
        // the array's owner is unique, so this is the only reference.
        Some(unsafe { &mut *e.to_item::<T::Target>().as_ptr() })
    }

    // ------------------------------------------------------------------
    // Introspection
    // ------------------------------------------------------------------

    /// Nodes currently in the tree.
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// assert_eq!(xa.node_count(), 0);
    /// xa.store(1000, Entry::Value(1)).unwrap();
    /// assert!(xa.node_count() >= 1);
    /// ```
    pub fn node_count(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Levels of nodes (0 when the head holds the only entry or nothing).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(0, Entry::Value(1)).unwrap();
    /// assert_eq!(xa.height(), 0); // index 0 lives in the head
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// assert_eq!(xa.height(), 1);
    /// ```
    pub fn height(&self) -> u32 {
        let guard = pin();
        let head = self.head.load();
        if !head.is_node() {
            return 0;
        }
        // SAFETY: the top node, read from the head under `guard`, pinned on
        // the default collector where node frees are deferred.
        let shift = unsafe { NodeRef::<Shared>::from_entry(head, &guard) }.shift as u32;
        shift / CHUNK_SHIFT + 1
    }

    /// Bytes of memory the tree uses (nodes plus the array itself).
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let empty = xa.memory_usage();
    /// xa.store(1000, Entry::Value(1)).unwrap();
    /// assert!(xa.memory_usage() >= empty + XArray::<Box<u32>>::NODE_BYTES);
    /// ```
    pub fn memory_usage(&self) -> usize {
        self.node_count() * core::mem::size_of::<Node>() + core::mem::size_of::<Self>()
    }

    /// Size of one node in bytes.
    pub const NODE_BYTES: usize = core::mem::size_of::<Node>();
}

pub(crate) fn bounds<R: RangeBounds<u64>>(range: R) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => match s.checked_add(1) {
            Some(s) => s,
            None => return (0, None),
        },
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => Some(e),
        Bound::Excluded(&e) => e.checked_sub(1),
        Bound::Unbounded => Some(u64::MAX),
    };
    match end {
        Some(e) if e >= start => (start, Some(e)),
        _ => (start, None),
    }
}

pub(crate) fn check_order(index: u64, order: u32) -> Result<(), Error> {
    if order > 63 {
        return Err(Error::OrderTooLarge(order));
    }
    if index & ((1u64 << order) - 1) != 0 {
        return Err(Error::Misaligned { index, order });
    }
    Ok(())
}
