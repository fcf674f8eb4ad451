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

use crate::cursor::{dispose_item, order_shape, XaState};
use crate::entry::{AtomicEntry, RawEntry};
use crate::error::{Error, Rejected};
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, ItemRef, Retired};
use crate::mark::Mark;
use crate::node::{Node, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};
use crate::sync::{AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};
use core::fmt::Write as _;
use core::marker::PhantomData;
use core::ops::{Bound, RangeBounds, RangeInclusive};
use core::ptr::NonNull;

mod held;
mod poison;
mod range;

use held::Held;

const FLAG_MARK_SHIFT: u8 = 0; // bits 0..=2: root marks
const FLAG_TRACK_FREE: u8 = 1 << 3;
const FLAG_ZERO_BUSY: u8 = 1 << 4;
const FLAG_ALLOC_WRAPPED: u8 = 1 << 5;
const FLAG_POISONED: u8 = 1 << 6;

/// Array flags (the kernel's `xa_flags` for allocating arrays).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flags(u8);

impl Flags {
    /// A plain array.
    pub const NONE: Flags = Flags(0);
    /// An allocating array whose IDs start at 0 (`XA_FLAGS_ALLOC`).
    pub const ALLOC: Flags = Flags(FLAG_TRACK_FREE | (1 << Mark::FREE.index()));
    /// An allocating array whose IDs start at 1 (`XA_FLAGS_ALLOC1`).
    pub const ALLOC1: Flags = Flags(FLAG_TRACK_FREE | FLAG_ZERO_BUSY);
}

/// A kernel-style XArray: a sparse array of items and value entries indexed
/// by `u64`, with lock-free readers.
///
/// ```
/// use kxarray::{Entry, XArray};
/// use std::sync::Arc;
///
/// let xa: XArray<Arc<String>> = XArray::new();
/// xa.store(4096, Entry::Item(Arc::new("page".to_string()))).unwrap();
/// xa.store(7, Entry::Value(42)).unwrap();
///
/// let guard = kxarray::pin();
/// assert_eq!(&**xa.load(4096, &guard).unwrap().item().unwrap(), "page");
/// assert_eq!(xa.load(7, &guard).unwrap().value(), Some(42));
/// assert!(xa.load(8, &guard).is_none());
///
/// let indices: Vec<u64> = xa.iter(&guard).map(|(i, _)| i).collect();
/// assert_eq!(indices, [7, 4096]);
/// ```
pub struct XArray<T: Item> {
    pub(crate) head: AtomicEntry,
    flags: AtomicU8,
    seq: AtomicU64,
    nodes: AtomicUsize,
    /// The span `create_range` made nodes for under the held lock
    /// (`first > last`: none); nodes in it still empty when the lock is
    /// released are removed then.
    created_first: AtomicU64,
    created_last: AtomicU64,
    lock: Mutex,
    _t: PhantomData<T>,
}

impl<T: Item> Default for XArray<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The held writer lock of an [`XArray`] (`xa_lock`), with an epoch guard
/// for the entries it hands out. Write methods on the lock and on
/// [`XaState`] take it as proof that the lock is held.
pub struct XaLock<'a, T: Item> {
    xa: &'a XArray<T>,
    epoch: Guard,
    _held: Held<'a, T>,
}

impl<T: Item> XArray<T> {
    /// An empty array.
    pub fn new() -> Self {
        Self::with_flags(Flags::NONE)
    }

    /// An empty array with flags ([`Flags::ALLOC`] or [`Flags::ALLOC1`] for
    /// ID allocation).
    pub fn with_flags(flags: Flags) -> Self {
        XArray {
            head: AtomicEntry::new(RawEntry::NULL),
            flags: AtomicU8::new(flags.0),
            seq: AtomicU64::new(0),
            nodes: AtomicUsize::new(0),
            created_first: AtomicU64::new(u64::MAX),
            created_last: AtomicU64::new(0),
            lock: Mutex::new(),
            _t: PhantomData,
        }
    }

    // ---- internal flag helpers ----
    #[inline]
    fn flags(&self) -> u8 {
        self.flags.load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn track_free(&self) -> bool {
        self.flags() & FLAG_TRACK_FREE != 0
    }
    #[inline]
    pub(crate) fn zero_busy(&self) -> bool {
        self.flags() & FLAG_ZERO_BUSY != 0
    }
    /// Whether any entry carries `mark` (`xa_marked`): O(1).
    #[inline]
    pub fn marked(&self, mark: Mark) -> bool {
        self.flags() & (1 << (FLAG_MARK_SHIFT + mark.index() as u8)) != 0
    }
    pub(crate) fn mark_set(&self, mark: Mark) {
        let f = self.flags();
        let bit = 1 << (FLAG_MARK_SHIFT + mark.index() as u8);
        if f & bit == 0 {
            self.flags.store(f | bit, Ordering::Relaxed);
        }
    }
    pub(crate) fn mark_clear(&self, mark: Mark) {
        let f = self.flags();
        let bit = 1 << (FLAG_MARK_SHIFT + mark.index() as u8);
        if f & bit != 0 {
            self.flags.store(f & !bit, Ordering::Relaxed);
        }
    }
    /// The modification sequence: bumped under the lock after every write
    /// that can move or retype a slot (every general store, every split,
    /// every node added or removed, every head change), so cursors can tell
    /// whether their position survived a dropped lock.
    #[inline]
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
    #[inline]
    pub(crate) fn bump_seq(&self) {
        self.seq
            .store(self.seq.load(Ordering::Relaxed) + 1, Ordering::Release);
    }
    #[inline]
    pub(crate) fn node_added(&self) {
        self.nodes
            .store(self.nodes.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn node_removed(&self) {
        self.nodes
            .store(self.nodes.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
    }

    /// Take the writer lock (`xa_lock`).
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]): a panic inside an
    /// earlier write left it unusable. Every writing method panics for the
    /// same reason.
    #[inline]
    pub fn lock(&self) -> XaLock<'_, T> {
        let held = self.lock.lock();
        if self.flags() & FLAG_POISONED != 0 {
            drop(held);
            Self::poisoned_panic();
        }
        XaLock {
            xa: self,
            epoch: pin(),
            _held: Held {
                xa: self,
                _guard: held,
            },
        }
    }

    /// Whether the writer lock is currently held by someone.
    pub fn is_locked(&self) -> bool {
        self.lock.is_locked()
    }

    // ------------------------------------------------------------------
    // Lock-free reads
    // ------------------------------------------------------------------

    /// The entry at `index` (`xa_load`), lock-free. The result borrows the
    /// guard: the entry stays readable until the guard is dropped, even if a
    /// writer removes it meanwhile.
    #[inline]
    pub fn load<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        let _ = guard;
        let e = self.load_raw(index);
        // SAFETY: read under `guard`, pinned on the default collector (the
        // `Guard` invariant), into which every removed item's free is
        // deferred: it runs only after `guard` is dropped.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    /// Same as [`XArray::load`] (the std-collections name).
    #[inline]
    pub fn get<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        self.load(index, guard)
    }

    /// Whether `index` holds an entry (reserved slots do not count).
    pub fn contains(&self, index: u64) -> bool {
        let guard = pin();
        self.load(index, &guard).is_some()
    }

    /// The value entry at `index`, if it holds one (no guard needed).
    pub fn load_value(&self, index: u64) -> Option<u64> {
        let guard = pin();
        self.load(index, &guard).and_then(|e| e.value())
    }

    /// The lock-free descent. Caller holds a guard (or the lock).
    #[inline(always)]
    pub(crate) fn load_raw(&self, index: u64) -> RawEntry {
        loop {
            let head = self.head.load();
            if !head.is_node() {
                // an entry for index 0 held in the head (or nothing)
                return if index == 0 {
                    head.zero_to_null()
                } else {
                    RawEntry::NULL
                };
            }
            // SAFETY: the caller holds a `Guard` (pinned on the default
            // collector, where node frees are deferred) or the lock, so node
            // pointers read now stay allocated.
            let mut n: &Node = unsafe { &*head.to_node().as_ptr() };
            // Only the top node's shift is read: a child's shift is its
            // parent's minus CHUNK_SHIFT (shifts never change once published),
            // so each level touches one cache line (the slot), and the loop
            // below has one well-predicted exit per level.
            let mut shift = n.shift as u32;
            if (index >> shift) > CHUNK_MASK {
                return RawEntry::NULL;
            }
            let entry = loop {
                let mut e = n.slot(((index >> shift) & CHUNK_MASK) as usize);
                if !e.is_internal() {
                    break e; // an item, a value, or empty: the common exit
                }
                if e.is_node() {
                    // SAFETY: as above.
                    n = unsafe { &*e.to_node().as_ptr() };
                    shift = shift.wrapping_sub(CHUNK_SHIFT);
                    debug_assert_eq!(n.shift as u32, shift);
                    continue;
                }
                // A sibling of a multi-index entry (or RETRY, or a reserved
                // entry): follow it to its canonical slot in this node.
                if e.is_sibling() {
                    let off = ((index >> shift) & CHUNK_MASK) as usize;
                    e = n.resolve_sibling(off, e).0;
                }
                break e;
            };
            if entry.is_retry() {
                continue;
            }
            return entry.zero_to_null();
        }
    }

    /// Whether the entry at `index` has `mark` (`xa_get_mark`), lock-free.
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
    pub fn is_empty(&self) -> bool {
        self.head.load().is_null()
    }

    /// The first entry at or after `start` and at most `max` that matches
    /// `filter` (`xa_find`): `None` for any entry, `Some(mark)` for marked
    /// ones. Returns its index and the entry.
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
    pub fn iter<'g>(&'g self, guard: &'g Guard) -> Iter<'g, T> {
        Iter::new(self, guard, 0, u64::MAX, None)
    }

    /// An ordered iterator over the entries in `range`.
    pub fn range<'g, R: RangeBounds<u64>>(&'g self, range: R, guard: &'g Guard) -> Iter<'g, T> {
        let (start, end) = bounds(range);
        match end {
            Some(end) => Iter::new(self, guard, start, end, None),
            None => Iter::empty(self, guard),
        }
    }

    /// An ordered iterator over the entries in `range` that carry `mark`.
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

    fn retire(raw: RawEntry, guard: Guard) -> Option<Retired<T>> {
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
    pub fn store(&self, index: u64, entry: Entry<T>) -> Result<Option<Retired<T>>, Rejected<T>> {
        let lock = self.lock();
        let raw = lock.store_raw(index, 0, Some(entry))?;
        let guard = lock.into_guard();
        Ok(Self::retire(raw, guard))
    }

    /// Store `entry` as one multi-index entry covering the `2^order`
    /// indices starting at `index`, which must be aligned to the order.
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
    pub fn erase(&self, index: u64) -> Option<Retired<T>> {
        let lock = self.lock();
        let raw = lock.erase_raw(index);
        let guard = lock.into_guard();
        Self::retire(raw, guard)
    }

    /// Store `entry` only if `index` is empty (`xa_insert`); `None` reserves
    /// the index. Fails with [`Error::Busy`] if an entry (or a reservation)
    /// is there.
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
    pub fn reserve(&self, index: u64) -> Result<(), Error> {
        let lock = self.lock();
        match lock.cmpxchg_raw(index, RawEntry::NULL, RawEntry::ZERO, &lock.epoch) {
            Ok(_) | Err(Error::Mismatch) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Undo a reservation (`xa_release`); no-op if the index was used.
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
    pub fn set_mark(&self, index: u64, mark: Mark) {
        self.lock().set_mark(index, mark)
    }

    /// Clear `mark` on the entry at `index`.
    pub fn clear_mark(&self, index: u64, mark: Mark) {
        self.lock().clear_mark(index, mark)
    }

    /// Allocate a free ID in `limit` and store `entry` there (`xa_alloc`).
    /// The array must have been created with [`Flags::ALLOC`] or
    /// [`Flags::ALLOC1`]. [`Error::Busy`] when the range is full.
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
    pub fn clear(&self) {
        let lock = self.lock();
        lock.clear();
    }

    // ------------------------------------------------------------------
    // Exclusive access: no lock, no epoch, owned results
    // ------------------------------------------------------------------

    fn excl_cursor(&mut self, index: u64) -> XaState<'_, T> {
        if self.is_poisoned() {
            Self::poisoned_panic();
        }
        self.excl_cursor_unchecked(index)
    }

    fn excl_cursor_unchecked(&mut self, index: u64) -> XaState<'_, T> {
        // SAFETY: `&mut self` means no reader or writer can see the tree, so
        // deferred destruction may run at once; the cursor (and the guard)
        // stays inside this crate's `&mut self` methods.
        let guard: &'static Guard = unsafe { Guard::unprotected() };
        XaState::new(self, guard, index)
    }

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
    pub fn replace(
        &mut self,
        index: u64,
        entry: Entry<T>,
    ) -> Result<Option<Entry<T>>, Rejected<T>> {
        let raw = match entry.into_raw() {
            Ok(r) => r,
            Err((e, entry)) => return Err(Rejected::new(e, Some(entry))),
        };
        let mut xas = self.excl_cursor(index);
        loop {
            match xas.store_owned(raw) {
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
                    // SAFETY: never published.
                    return Err(Rejected::new(e, Some(unsafe { Entry::from_raw(raw) })));
                }
            }
        }
    }

    /// Remove the entry at `index` and return it owned.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]).
    pub fn remove(&mut self, index: u64) -> Option<Entry<T>> {
        let mut xas = self.excl_cursor(index);
        let old = xas.store_owned(RawEntry::NULL).ok()?;
        if old.is_user() {
            // SAFETY: unlinked and not disposed: ownership passes to the caller.
            Some(unsafe { Entry::from_raw(old) })
        } else {
            None
        }
    }

    /// A shared view of the entry at `index` without pinning the epoch.
    pub fn get_excl(&mut self, index: u64) -> Option<EntryRef<'_, T>> {
        let e = self.load_raw(index);
        // SAFETY: the exclusive borrow keeps every entry alive for '_.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    /// A mutable reference to the item at `index` (for uniquely owned item
    /// types such as `Box`).
    pub fn get_mut(&mut self, index: u64) -> Option<&mut T::Target>
    where
        T: crate::item::ItemMut,
    {
        let e = self.load_raw(index);
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
    pub fn node_count(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Levels of nodes (0 when the head holds the only entry or nothing).
    pub fn height(&self) -> u32 {
        let guard = pin();
        let _ = &guard;
        let head = self.head.load();
        if !head.is_node() {
            return 0;
        }
        // SAFETY: read under `guard`, pinned on the default collector where
        // node frees are deferred.
        let shift = unsafe { head.to_node().as_ref() }.shift as u32;
        shift / CHUNK_SHIFT + 1
    }

    /// Bytes of memory the tree uses (nodes plus the array itself).
    pub fn memory_usage(&self) -> usize {
        self.node_count() * core::mem::size_of::<Node>() + core::mem::size_of::<Self>()
    }

    /// Size of one node in bytes.
    pub const NODE_BYTES: usize = core::mem::size_of::<Node>();

    /// Check the structural invariants; `Err` describes the first violation.
    /// Takes the lock.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.is_poisoned() {
            return Err("array poisoned by a panic inside a write".into());
        }
        let lock = self.lock();
        let head = self.head.load_locked();
        let mut nodes = 0usize;
        let mut root_marks = [false; 3];
        let mut tall = None;
        if head.is_node() {
            let top = head.to_node();
            // SAFETY: under the lock, reachable nodes are live.
            let t = unsafe { top.as_ref() };
            if t.parent().is_some() {
                return Err("top node has a parent".into());
            }
            let m = check_node(top, None, 0, &mut nodes, self.track_free())?;
            for (i, r) in root_marks.iter_mut().enumerate() {
                *r = m & (1 << i) != 0;
            }
            // Minimal height: a top node that only uses slot 0 would have been
            // shrunk (`xas_shrink`), except a leaf holding a reserved index 0
            // in an array where index 0 is not implicitly busy.
            let s0 = t.slot_locked(0);
            let shrinkable = t.count() == 1 && !s0.is_null() && (s0.is_node() || t.shift == 0);
            let reserved_leaf = t.shift == 0 && s0.is_zero() && !self.zero_busy();
            // Reported last, after the checks below: `store_range`'s
            // pre-create and `split` can leave such a tree, as in the kernel.
            if shrinkable && !reserved_leaf {
                tall = Some(format!(
                    "tree not minimal: top node (shift {}) only holds slot 0",
                    t.shift
                ));
            }
        } else if head.is_internal() && !head.is_zero() {
            return Err(format!("bad head entry {head:?}"));
        }
        if nodes != self.node_count() {
            return Err(format!(
                "node counter {} but {} nodes reachable",
                self.node_count(),
                nodes
            ));
        }
        if head.is_node() {
            for mark in Mark::ALL {
                if self.track_free() && mark == Mark::FREE {
                    continue;
                }
                if root_marks[mark.index()] != self.marked(mark) {
                    return Err(format!(
                        "root flag {mark:?} is {} but subtree says {}",
                        self.marked(mark),
                        root_marks[mark.index()]
                    ));
                }
            }
        } else if head.is_null() {
            for mark in Mark::ALL {
                if !(self.track_free() && mark == Mark::FREE) && self.marked(mark) {
                    return Err(format!("empty array has root flag {mark:?}"));
                }
            }
        }
        drop(lock);
        match tall {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A readable dump of the tree (one line per node and entry).
    pub fn dump(&self) -> String {
        let _lock = self.lock();
        let mut out = String::new();
        let head = self.head.load_locked();
        let _ = writeln!(
            out,
            "xarray flags {:#x} nodes {} head {:?}",
            self.flags(),
            self.node_count(),
            head
        );
        if head.is_node() {
            dump_node(&mut out, head.to_node(), 0, 0);
        }
        out
    }
}

fn bounds<R: RangeBounds<u64>>(range: R) -> (u64, Option<u64>) {
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

/// Validate a subtree; returns its aggregated marks (bit i = mark i).
fn check_node(
    node: NonNull<Node>,
    parent: Option<NonNull<Node>>,
    base: u64,
    nodes: &mut usize,
    track_free: bool,
) -> Result<u8, String> {
    *nodes += 1;
    // SAFETY: called under the lock on reachable nodes.
    let n = unsafe { node.as_ref() };
    if n.parent() != parent {
        return Err(format!(
            "node at {base:#x} shift {} has a wrong parent",
            n.shift
        ));
    }
    let mut count = 0u32;
    let mut values = 0u32;
    let mut agg = 0u8;
    let mut canon_is_value = false;
    let mut canon: Option<usize> = None;
    for off in 0..CHUNK_SIZE {
        let e = n.slot_locked(off);
        if e.is_null() {
            // Free-tracking arrays hand out exactly the indices marked
            // free: an empty slot without the mark is an ID lost to alloc.
            if track_free && !n.get_mark(off, Mark::FREE) {
                return Err(format!(
                    "empty slot {off} of node at {base:#x} is not marked free"
                ));
            }
            for mark in Mark::ALL {
                // Free-tracking arrays mark empty slots free.
                if n.get_mark(off, mark) && mark != Mark::FREE {
                    return Err(format!(
                        "empty slot {off} of node at {base:#x} has mark {mark:?}"
                    ));
                }
            }
            canon = None;
            continue;
        }
        count += 1;
        if e.is_sibling() {
            let c = e.to_sibling();
            if canon != Some(c) || c >= off {
                return Err(format!("slot {off} of node at {base:#x}: sibling({c}) does not follow its canonical slot"));
            }
            if canon_is_value {
                values += 1;
            }
            for mark in Mark::ALL {
                if n.get_mark(off, mark) && mark != Mark::FREE {
                    return Err(format!(
                        "sibling slot {off} of node at {base:#x} carries mark {mark:?}"
                    ));
                }
            }
            continue;
        }
        canon = Some(off);
        canon_is_value = e.is_value();
        if e.is_value() {
            values += 1;
        }
        let child_base = base | ((off as u64) << n.shift);
        let slot_marks = n.slot_marks(off);
        if e.is_node() {
            if n.shift == 0 {
                return Err(format!("leaf at {base:#x} holds a node"));
            }
            let child = e.to_node();
            // SAFETY: reachable under the lock.
            let c = unsafe { child.as_ref() };
            if c.shift as u32 + CHUNK_SHIFT != n.shift as u32 || c.offset as usize != off {
                return Err(format!(
                    "child at slot {off} of node at {base:#x} has shift {} offset {}",
                    c.shift, c.offset
                ));
            }
            if c.count() == 0 {
                return Err(format!("empty node at {child_base:#x}"));
            }
            let m = check_node(child, Some(node), child_base, nodes, track_free)?;
            for mark in Mark::ALL {
                if mark == Mark::FREE && (slot_marks & 1 != 0 || m & 1 != 0) {
                    // free-tracking arrays: parents may be marked free
                    // conservatively; only check non-FREE marks strictly
                    continue;
                }
                let bit = 1 << mark.index();
                if (m & bit) != (slot_marks & bit) {
                    return Err(format!(
                        "mark {mark:?} at slot {off} of node at {base:#x} is {} but child says {}",
                        slot_marks & bit != 0,
                        m & bit != 0
                    ));
                }
            }
            agg |= slot_marks;
        } else {
            if e.is_retry() {
                return Err(format!("RETRY entry in live node at {base:#x}"));
            }
            agg |= slot_marks;
        }
    }
    if count != n.count() as u32 {
        return Err(format!(
            "node at {base:#x}: count {} but {} slots used",
            n.count(),
            count
        ));
    }
    if values != n.nr_values() as u32 {
        return Err(format!(
            "node at {base:#x}: nr_values {} but {} value slots",
            n.nr_values(),
            values
        ));
    }
    if count == 0 {
        return Err(format!("empty node at {base:#x}"));
    }
    Ok(agg)
}

fn dump_node(out: &mut String, node: NonNull<Node>, base: u64, depth: usize) {
    // SAFETY: called under the lock on reachable nodes.
    let n = unsafe { node.as_ref() };
    let _ = writeln!(
        out,
        "{:indent$}node {:#x} shift {} offset {} count {} values {} marks {:#x} {:#x} {:#x}",
        "",
        base,
        n.shift,
        n.offset,
        n.count(),
        n.nr_values(),
        n.marks(Mark::M0),
        n.marks(Mark::M1),
        n.marks(Mark::M2),
        indent = depth * 2
    );
    for off in 0..CHUNK_SIZE {
        let e = n.slot_locked(off);
        if e.is_null() {
            continue;
        }
        let idx = base | ((off as u64) << n.shift);
        if e.is_node() && n.shift != 0 {
            dump_node(out, e.to_node(), idx, depth + 1);
        } else {
            let _ = writeln!(
                out,
                "{:indent$}{:#x}: {:?}",
                "",
                idx,
                e,
                indent = depth * 2 + 2
            );
        }
    }
}

impl<T: Item> Drop for XArray<T> {
    fn drop(&mut self) {
        // A poisoned array's old tree is leaked; what the head holds is not.
        let mut xas = self.excl_cursor_unchecked(0);
        xas.destroy_all();
    }
}

impl<T: Item> core::fmt::Debug for XArray<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XArray")
            .field("nodes", &self.node_count())
            .field("empty", &self.is_empty())
            .finish()
    }
}

// ----------------------------------------------------------------------
// The locked API
// ----------------------------------------------------------------------

impl<'a, T: Item> XaLock<'a, T> {
    /// The array this lock belongs to.
    pub fn array(&self) -> &'a XArray<T> {
        self.xa
    }

    /// The epoch guard held with the lock: entries returned by the lock's
    /// methods are readable while it lives.
    pub fn guard(&self) -> &Guard {
        &self.epoch
    }

    fn into_guard(self) -> Guard {
        let XaLock { epoch, _held, .. } = self;
        drop(_held);
        epoch
    }

    /// A cursor at `index` reading under this lock's guard.
    pub fn cursor(&self, index: u64) -> XaState<'_, T> {
        XaState::new(self.xa, &self.epoch, index)
    }

    /// Run a cursor operation, retrying once memory has been found for it.
    fn with_retry<R>(
        &self,
        xas: &mut XaState<'_, T>,
        mut f: impl FnMut(&mut XaState<'_, T>) -> R,
    ) -> R {
        loop {
            let r = f(xas);
            if xas.error() == Some(Error::NoMemory) && xas.nomem() {
                continue;
            }
            return r;
        }
    }

    fn store_raw(
        &self,
        index: u64,
        order: u32,
        entry: Option<Entry<T>>,
    ) -> Result<RawEntry, Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let mut raw = raw;
        if raw.is_null() && self.xa.track_free() {
            raw = RawEntry::ZERO;
        }
        let mut xas = self.cursor(index);
        if order > 0 {
            let (shift, sibs) = order_shape(order);
            xas.set_shape(shift, sibs);
        }
        let track_free = self.xa.track_free();
        let old = self.with_retry(&mut xas, |xas| {
            let old = match xas.store_fast(raw) {
                Some(old) => old,
                None => xas.store_raw(raw),
            };
            if track_free && xas.error().is_none() {
                xas.clear_mark_raw(Mark::FREE);
            }
            old
        });
        if let Some(e) = xas.error() {
            // SAFETY: never published.
            let back = if raw.is_user() {
                Some(unsafe { Entry::from_raw(raw) })
            } else {
                None
            };
            return Err(Rejected::new(e, back));
        }
        let old = old.zero_to_null();
        if old.is_user() {
            xas.dispose(old);
            Ok(old)
        } else {
            Ok(RawEntry::NULL)
        }
    }

    /// Store under the held lock (`__xa_store`); see [`XArray::store`].
    pub fn store(
        &self,
        index: u64,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        let raw = self.store_raw(index, 0, entry)?;
        // SAFETY: disposed through the lock's guard (pinned on the default
        // collector, where the free is deferred), alive for '_.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    /// Store a multi-index entry under the held lock; see
    /// [`XArray::store_order`].
    pub fn store_order(
        &self,
        index: u64,
        order: u32,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        if let Err(e) = check_order(index, order) {
            return Err(Rejected::new(e, entry));
        }
        let raw = self.store_raw(index, order, entry)?;
        // SAFETY: as in `store`.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    fn erase_raw(&self, index: u64) -> RawEntry {
        let mut xas = self.cursor(index);
        let old = xas.store_raw(RawEntry::NULL).zero_to_null();
        if old.is_user() {
            xas.dispose(old);
            old
        } else {
            RawEntry::NULL
        }
    }

    /// Erase under the held lock (`__xa_erase`).
    pub fn erase(&self, index: u64) -> Option<EntryRef<'_, T>> {
        let raw = self.erase_raw(index);
        // SAFETY: as in `store`.
        unsafe { EntryRef::from_raw_opt(raw) }
    }

    /// Insert under the held lock (`__xa_insert`); see [`XArray::insert`].
    pub fn insert(&self, index: u64, entry: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        let raw = match entry {
            None => RawEntry::ZERO,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let mut xas = self.cursor(index);
        let track_free = self.xa.track_free();
        let busy = self.with_retry(&mut xas, |xas| {
            let curr = xas.load_raw();
            if !curr.is_null() {
                return true;
            }
            xas.store_raw(raw);
            if track_free && xas.error().is_none() {
                xas.clear_mark_raw(Mark::FREE);
            }
            false
        });
        let err = if busy { Some(Error::Busy) } else { xas.error() };
        match err {
            None => Ok(()),
            Some(e) => {
                // SAFETY: never published.
                let back = if raw.is_user() {
                    Some(unsafe { Entry::from_raw(raw) })
                } else {
                    None
                };
                Err(Rejected::new(e, back))
            }
        }
    }

    /// `__xa_cmpxchg_raw`: if the raw entry at `index` is exactly `expect`
    /// (NULL matches an empty index only, ZERO a reserved one), store `new`
    /// as is (NULL erases, in allocating arrays too). Returns the replaced
    /// entry with ZERO read as NULL; a displaced item is disposed of through
    /// `guard`. On any error the array is unchanged.
    fn cmpxchg_raw(
        &self,
        index: u64,
        expect: RawEntry,
        new: RawEntry,
        guard: &Guard,
    ) -> Result<RawEntry, Error> {
        let mut xas = XaState::new(self.xa, guard, index);
        let track_free = self.xa.track_free();
        let result = self.with_retry(&mut xas, |xas| {
            let curr = xas.load_raw();
            if curr != expect {
                return Err(Error::Mismatch);
            }
            xas.store_raw(new);
            if track_free && xas.error().is_none() && !new.is_null() && curr.is_null() {
                xas.clear_mark_raw(Mark::FREE);
            }
            Ok(curr)
        });
        if let Some(e) = xas.error() {
            return Err(e);
        }
        let curr = result?.zero_to_null();
        // only items are owned pointers; a value must not be freed
        if curr.is_item() {
            dispose_item::<T>(guard, curr);
        }
        Ok(curr)
    }

    /// [`Self::cmpxchg_raw`] for a caller's `new` entry, which comes back in
    /// the [`Rejected`] on any error (including a bad `expect`).
    fn cmpxchg_entry(
        &self,
        index: u64,
        expect: Result<RawEntry, Error>,
        new: Option<Entry<T>>,
        guard: &Guard,
    ) -> Result<RawEntry, Rejected<T>> {
        let raw = match new {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        expect
            .and_then(|expect| self.cmpxchg_raw(index, expect, raw, guard))
            .map_err(|e| {
                // SAFETY: never published (the array is unchanged on error).
                let back = raw.is_user().then(|| unsafe { Entry::from_raw(raw) });
                Rejected::new(e, back)
            })
    }

    /// Compare-and-exchange under the held lock; see [`XArray::cmpxchg`].
    ///
    /// # Errors
    ///
    /// As [`XArray::cmpxchg`].
    pub fn cmpxchg(
        &self,
        index: u64,
        old: Option<EntryRef<'_, T>>,
        new: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        let expect = old.map_or(Ok(RawEntry::NULL), EntryRef::to_raw);
        let raw = self.cmpxchg_entry(index, expect, new, &self.epoch)?;
        // SAFETY: disposed through the lock's guard (pinned on the default
        // collector, where the free is deferred), alive for '_.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    /// Replace a reserved entry under the held lock; see
    /// [`XArray::cmpxchg_reserved`].
    ///
    /// # Errors
    ///
    /// As [`XArray::cmpxchg_reserved`].
    pub fn cmpxchg_reserved(&self, index: u64, new: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        self.cmpxchg_entry(index, Ok(RawEntry::ZERO), new, &self.epoch)
            .map(|_| ())
    }

    /// Undo a reservation under the held lock.
    pub fn release(&self, index: u64) {
        let mut xas = self.cursor(index);
        let curr = xas.load_raw();
        if curr.is_zero() {
            xas.store_raw(RawEntry::NULL);
        }
    }

    /// Set `mark` on the entry at `index` (`__xa_set_mark`).
    pub fn set_mark(&self, index: u64, mark: Mark) {
        let mut xas = self.cursor(index);
        let e = xas.load_raw();
        if !e.is_null() {
            xas.set_mark_raw(mark);
        }
    }

    /// Clear `mark` on the entry at `index` (`__xa_clear_mark`).
    pub fn clear_mark(&self, index: u64, mark: Mark) {
        let mut xas = self.cursor(index);
        let e = xas.load_raw();
        if !e.is_null() {
            xas.clear_mark_raw(mark);
        }
    }

    /// The entry at `index`, read under the lock.
    pub fn load(&self, index: u64) -> Option<EntryRef<'_, T>> {
        let e = self.xa.load_raw(index);
        // SAFETY: read under the lock and its guard, pinned on the default
        // collector where removed items' frees are deferred; alive for '_.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    fn alloc_raw(&self, min: u64, max: u64, raw: RawEntry) -> Result<u64, Error> {
        if !self.xa.track_free() {
            return Err(Error::NotAllocating);
        }
        // An ALLOC1 array never hands out index 0, whatever the marks say:
        // the kernel relies on index 0's free mark alone, which an erase
        // over index 0 (of a multi-index entry, or of the placeholder)
        // sets again, after which `xa_alloc` returns 0.
        let min = if self.xa.zero_busy() { min.max(1) } else { min };
        if min > max {
            return Err(Error::Busy);
        }
        let raw = if raw.is_null() { RawEntry::ZERO } else { raw };
        let mut xas = self.cursor(min);
        let mut id = 0;
        let r = self.with_retry(&mut xas, |xas| {
            xas.set_index(min);
            xas.find_marked_raw(max, Mark::FREE);
            if xas.is_restart() {
                return Err(Error::Busy);
            }
            id = xas.index();
            xas.store_raw(raw);
            if xas.error().is_none() {
                xas.clear_mark_raw(Mark::FREE);
            }
            Ok(())
        });
        r?;
        if let Some(e) = xas.error() {
            return Err(e);
        }
        Ok(id)
    }

    /// Allocate an ID under the held lock; see [`XArray::alloc`].
    pub fn alloc(
        &self,
        limit: RangeInclusive<u64>,
        entry: Option<Entry<T>>,
    ) -> Result<u64, Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let (min, max) = (*limit.start(), *limit.end());
        let r = if min > max {
            Err(Error::Busy)
        } else {
            self.alloc_raw(min, max, raw)
        };
        r.map_err(|e| {
            // SAFETY: never published.
            let back = if raw.is_user() {
                Some(unsafe { Entry::from_raw(raw) })
            } else {
                None
            };
            Rejected::new(e, back)
        })
    }

    /// Allocate cyclically under the held lock; see [`XArray::alloc_cyclic`].
    pub fn alloc_cyclic(
        &self,
        limit: RangeInclusive<u64>,
        next: &mut u64,
        entry: Option<Entry<T>>,
    ) -> Result<(u64, bool), Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let (min, max) = (*limit.start(), *limit.end());
        let xa = self.xa;
        let lo = min.max(*next);
        let mut wrapped = false;
        let mut r = if lo > max {
            Err(Error::Busy)
        } else {
            self.alloc_raw(lo, max, raw)
        };
        if r.is_ok() && xa.flags() & FLAG_ALLOC_WRAPPED != 0 {
            xa.flags
                .store(xa.flags() & !FLAG_ALLOC_WRAPPED, Ordering::Relaxed);
            wrapped = true;
        }
        if r.is_err() && lo > min && r != Err(Error::NotAllocating) {
            r = self.alloc_raw(min, max, raw);
            if r.is_ok() {
                wrapped = true;
            }
        }
        match r {
            Ok(id) => {
                // A 32-bit range counts with the kernel's `u32 *next`: after
                // u32::MAX it wraps to 0. Wider ranges wrap after u64::MAX.
                *next = if max <= u64::from(u32::MAX) {
                    u64::from((id as u32).wrapping_add(1))
                } else {
                    id.wrapping_add(1)
                };
                if *next == 0 {
                    xa.flags
                        .store(xa.flags() | FLAG_ALLOC_WRAPPED, Ordering::Relaxed);
                }
                Ok((id, wrapped))
            }
            Err(e) => {
                // SAFETY: never published.
                let back = if raw.is_user() {
                    Some(unsafe { Entry::from_raw(raw) })
                } else {
                    None
                };
                Err(Rejected::new(e, back))
            }
        }
    }

    /// Remove every entry under the held lock; see [`XArray::clear`].
    pub fn clear(&self) {
        let mut xas = self.cursor(0);
        xas.destroy_all();
    }
}

impl<T: Item> core::fmt::Debug for XaLock<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XaLock").finish_non_exhaustive()
    }
}

// ----------------------------------------------------------------------
// Iteration
// ----------------------------------------------------------------------

/// An ordered, lock-free iterator over entries (one item per multi-index
/// entry), yielding `(index, entry)`. See [`XArray::iter`].
pub struct Iter<'g, T: Item> {
    xas: XaState<'g, T>,
    max: u64,
    mark: Option<Mark>,
    done: bool,
    /// Fast path for unmarked iteration: the leaf being scanned, the offset
    /// of the last entry returned, the last offset to scan, and the index of
    /// slot 0. The cursor is brought up to date before any slow step.
    leaf: Option<(&'g Node, usize, usize, u64)>,
}

impl<'g, T: Item> Iter<'g, T> {
    fn new(xa: &'g XArray<T>, guard: &'g Guard, start: u64, max: u64, mark: Option<Mark>) -> Self {
        Iter {
            xas: XaState::new(xa, guard, start),
            max,
            mark,
            done: false,
            leaf: None,
        }
    }
    fn empty(xa: &'g XArray<T>, guard: &'g Guard) -> Self {
        Iter {
            xas: XaState::new(xa, guard, 0),
            max: 0,
            mark: None,
            done: true,
            leaf: None,
        }
    }
}

impl<'g, T: Item> Iterator for Iter<'g, T> {
    type Item = (u64, EntryRef<'g, T>);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some((leaf, off, last, base)) = &mut self.leaf {
            while *off < *last {
                let e = leaf.slot(*off + 1);
                if e.is_internal() {
                    break; // sibling, retry, reserved: the cursor decides
                }
                *off += 1;
                if !e.is_null() {
                    // SAFETY: read under the iterator's guard, which lives
                    // for 'g and is pinned on the default collector, where
                    // removed items' frees are deferred: they wait for it.
                    return Some((*base + *off as u64, unsafe { EntryRef::from_raw(e) }));
                }
            }
            let off = *off;
            self.xas.set_leaf_offset(off);
            self.leaf = None;
        }
        if self.done {
            return None;
        }
        let e = match self.mark {
            None => self.xas.find(self.max),
            Some(m) => self.xas.find_marked(self.max, m),
        };
        match e {
            Some(e) => {
                if self.mark.is_none() {
                    self.leaf = self.xas.leaf_window(self.max);
                }
                Some((self.xas.index(), e))
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

/// An owning iterator, in index order; see `XArray::into_iter`.
pub struct IntoIter<T: Item> {
    xa: XArray<T>,
    next: Option<u64>,
}

impl<T: Item> Iterator for IntoIter<T> {
    type Item = (u64, Entry<T>);
    fn next(&mut self) -> Option<Self::Item> {
        let start = self.next?;
        let index = {
            let guard = pin();
            let (i, _) = self.xa.find(start, u64::MAX, None, &guard)?;
            i
        };
        self.next = index.checked_add(1);
        let e = self.xa.remove(index)?;
        Some((index, e))
    }
}

impl<T: Item> IntoIterator for XArray<T> {
    type Item = (u64, Entry<T>);
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter {
            xa: self,
            next: Some(0),
        }
    }
}

impl<T: Item> FromIterator<(u64, Entry<T>)> for XArray<T> {
    fn from_iter<I: IntoIterator<Item = (u64, Entry<T>)>>(iter: I) -> Self {
        let mut xa = XArray::new();
        for (i, e) in iter {
            // Values out of range are dropped with their error; items always fit.
            let _ = xa.replace(i, e);
        }
        xa
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<XArray<Box<u64>>>();
    let _ = ItemRef::<Box<u64>>::get;
}
