//! A chunked index: the `u64` key space cut into chunks of `2^shift`
//! indices, each chunk its own [`XArray`] with its own lock, indexed by the
//! offset inside the chunk. This is the swap cache's layout (one address
//! space per 64 MiB of swap): every tree stays a few levels deep
//! however large the key space, and writers on different chunks never share
//! a lock.
//!
//! This module owns [`ChunkedXArray`], its directory and its chunks.
//!
//! - **Directory.** Chunk `c` (holding indices `c << shift ..= c << shift |
//!   mask`) sits inline in a flat table when `c` is below the table's
//!   length (its address is computed, not loaded: the kernel's
//!   `swapper_spaces[]` array of address spaces), and in an `XArray` of
//!   boxed chunks keyed by `c` beyond it. Both are read lock-free.
//! - **Overflow chunks are created lazily** by the first write that needs
//!   one, and **dropped when a write leaves them empty**; a direct chunk is
//!   always there and counts as a chunk while it holds anything (empty, its
//!   tree has no node).
//!
//! Invariants (the chunk life cycle is in the private `directory` module):
//! - Chunk `c` holds only the offsets `0..=mask` of the indices
//!   `c << shift ..= c << shift | mask`; a multi-index entry never crosses a
//!   chunk.
//! - Every write goes through `Directory::with_chunk`: under the chunk's
//!   lock, never into a dead (unlinked) chunk, and a chunk it leaves empty
//!   is unlinked before the lock is released.
//! - When no writer is running, no linked chunk is empty
//!   ([`ChunkedXArray::check_invariants`]).

mod directory;
mod iter;
#[cfg(all(test, not(loom)))]
mod tests;

pub use iter::Iter;

use crate::entry::MAX_VALUE;
use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, ItemMut, Retired};
use crate::mark::Mark;
use crate::rejected::Rejected;
use crate::xarray::{check_order, XArray};
use core::ops::RangeBounds;
use directory::{Chunk, Directory};
use iter::bounds;

/// The default chunk shift: 2^14 indices per chunk, the swap cache's 64 MiB
/// of 4 KiB pages (`SWAP_ADDRESS_SPACE_SHIFT`).
pub const DEFAULT_SHIFT: u32 = 14;

/// Chunks the flat directory table covers by default (64 chunks: the first
/// 2^20 indices at the default shift; a 4 KiB table of 64-byte inline
/// chunks).
pub const DEFAULT_DIRECT_CHUNKS: usize = 64;

/// The largest flat directory table [`ChunkedXArray::with_capacity`] makes
/// (2^16 inline chunks of 64 bytes, 4 MiB); chunks beyond it go to the
/// overflow `XArray`.
pub const MAX_DIRECT_CHUNKS: usize = 1 << 16;

/// An index over the whole `u64` key space made of many small [`XArray`]s,
/// one per chunk of `2^shift` consecutive indices (the swap cache's
/// per-64-MiB address spaces).
///
/// Compared with one `XArray`: each tree is at most `ceil(shift / 6)` levels
/// deep however large the indices, writers on different chunks take
/// different locks, and a chunk is created on the first store into it and
/// dropped when it becomes empty. Reads, finds and iteration are lock-free
/// (an epoch guard, as for `XArray`) and iteration runs in index order
/// across chunks.
///
/// Differences from `XArray`:
/// - A multi-index entry must fit in one chunk: [`store_order`] rejects an
///   order above the shift with [`Error::CrossesChunk`].
/// - [`store_range`] over several chunks is split into one range store per
///   chunk, done in index order. As with `XArray::store_range` (which stores
///   block by block), a reader may see part of the range stored, and after
///   an error the chunks before the failing one stay stored.
/// - There is no batch lock and no ID allocation: each write takes the lock
///   of its chunk.
///
/// [`store_order`]: ChunkedXArray::store_order
/// [`store_range`]: ChunkedXArray::store_range
///
/// ```
/// use kxarray::{ChunkedXArray, Entry, Mark};
///
/// // 2^14 indices per chunk (the default), a direct table for 2^25 indices
/// let swap: ChunkedXArray<Box<String>> = ChunkedXArray::with_capacity(14, (1 << 25) - 1).unwrap();
/// swap.store(5, Entry::Item(Box::new("page".into()))).unwrap();
/// swap.store(3 << 14 | 7, Entry::Value(42)).unwrap(); // a shadow in chunk 3
/// swap.set_mark(5, Mark::M0);
/// assert_eq!(swap.chunk_count(), 2);
///
/// let guard = kxarray::pin();
/// assert_eq!(&**swap.load(5, &guard).unwrap().item().unwrap(), "page");
/// assert_eq!(swap.load_value(3 << 14 | 7), Some(42));
/// let keys: Vec<u64> = swap.iter(&guard).map(|(i, _)| i).collect();
/// assert_eq!(keys, [5, 3 << 14 | 7]);
/// assert!(swap.height() <= 3); // ceil(14 / 6) levels at most
///
/// swap.erase(3 << 14 | 7);
/// assert_eq!(swap.chunk_count(), 1); // the empty chunk is gone
/// ```
pub struct ChunkedXArray<T: Item> {
    shift: u32,
    mask: u64,
    dir: Directory<T>,
}

impl<T: Item> Default for ChunkedXArray<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Item> ChunkedXArray<T> {
    /// An empty index with chunks of 2^[`DEFAULT_SHIFT`] indices and a
    /// direct table of [`DEFAULT_DIRECT_CHUNKS`] chunks.
    pub fn new() -> Self {
        Self::build(DEFAULT_SHIFT, DEFAULT_DIRECT_CHUNKS)
    }

    /// An empty index with chunks of `2^shift` indices (`shift` in `0..=63`)
    /// and a direct table of [`DEFAULT_DIRECT_CHUNKS`] chunks.
    ///
    /// # Errors
    /// [`Error::InvalidChunkShift`] if `shift > 63`.
    pub fn with_shift(shift: u32) -> Result<Self, Error> {
        if shift > 63 {
            return Err(Error::InvalidChunkShift(shift));
        }
        Ok(Self::build(shift, DEFAULT_DIRECT_CHUNKS))
    }

    /// An empty index with chunks of `2^shift` indices whose flat directory
    /// table covers every chunk up to the one holding `max_index` (at most
    /// [`MAX_DIRECT_CHUNKS`] chunks; indices beyond still work, through the
    /// overflow `XArray`). Size it to the device, as the swap cache does.
    ///
    /// # Errors
    /// [`Error::InvalidChunkShift`] if `shift > 63`.
    pub fn with_capacity(shift: u32, max_index: u64) -> Result<Self, Error> {
        if shift > 63 {
            return Err(Error::InvalidChunkShift(shift));
        }
        let chunks = (max_index >> shift).saturating_add(1);
        let direct = chunks.min(MAX_DIRECT_CHUNKS as u64) as usize;
        Ok(Self::build(shift, direct))
    }

    fn build(shift: u32, direct: usize) -> Self {
        debug_assert!(shift <= 63);
        ChunkedXArray {
            shift,
            mask: (1u64 << shift) - 1,
            dir: Directory::new(direct),
        }
    }

    /// The chunk shift: each chunk holds `2^shift` indices.
    pub fn shift(&self) -> u32 {
        self.shift
    }

    /// How many chunks the flat directory table covers.
    pub fn direct_chunks(&self) -> usize {
        self.dir.direct_len()
    }

    /// The chunk number and the offset inside it.
    #[inline(always)]
    fn split(&self, index: u64) -> (u64, u64) {
        (index >> self.shift, index & self.mask)
    }

    /// The first index of chunk `c`.
    #[inline(always)]
    fn base(&self, c: u64) -> u64 {
        c << self.shift
    }

    // ------------------------------------------------------------------
    // Lock-free reads
    // ------------------------------------------------------------------

    /// The entry at `index`, lock-free: a directory load, then the chunk's
    /// `XArray::load`. The result borrows the guard.
    #[inline]
    pub fn load<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        let (c, off) = self.split(index);
        self.dir.get(c, guard)?.xa.load(off, guard)
    }

    /// Same as [`ChunkedXArray::load`].
    #[inline]
    pub fn get<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<EntryRef<'g, T>> {
        self.load(index, guard)
    }

    /// Whether `index` holds an entry (reserved indices do not count).
    pub fn contains(&self, index: u64) -> bool {
        let guard = pin();
        self.load(index, &guard).is_some()
    }

    /// The value entry at `index`, if it holds one (no guard needed).
    ///
    /// Context: lock-free; takes no lock and never blocks. In a chunk of
    /// the flat directory table this is [`XArray::load_value`] (a light
    /// pin, no locked instruction): such a chunk is never freed while the
    /// index lives. An overflow chunk can be unlinked and freed through the
    /// epoch, so a lookup there holds a crossbeam guard.
    ///
    /// ```
    /// use kxarray::{ChunkedXArray, Entry};
    /// let cx: ChunkedXArray<Box<u32>> = ChunkedXArray::new();
    /// cx.store(5, Entry::Value(50)).unwrap();
    /// cx.store(1 << 40, Entry::Value(7)).unwrap(); // an overflow chunk
    /// assert_eq!(cx.load_value(5), Some(50));
    /// assert_eq!(cx.load_value(1 << 40), Some(7));
    /// assert_eq!(cx.load_value(6), None);
    /// ```
    #[inline]
    pub fn load_value(&self, index: u64) -> Option<u64> {
        let (c, off) = self.split(index);
        if let Some(chunk) = self.dir.direct(c) {
            return chunk.xa.load_value(off);
        }
        let guard = pin();
        self.load(index, &guard).and_then(EntryRef::value)
    }

    /// Whether the entry at `index` carries `mark`.
    pub fn get_mark(&self, index: u64, mark: Mark) -> bool {
        let guard = pin();
        let (c, off) = self.split(index);
        self.dir
            .get(c, &guard)
            .is_some_and(|ch| ch.xa.get_mark(off, mark))
    }

    /// The order of the entry at `index`, 0 if there is none.
    pub fn get_order(&self, index: u64) -> u32 {
        let guard = pin();
        let (c, off) = self.split(index);
        self.dir.get(c, &guard).map_or(0, |ch| ch.xa.get_order(off))
    }

    /// Whether any entry carries `mark` (one flag per chunk).
    pub fn marked(&self, mark: Mark) -> bool {
        self.any_chunk(|ch| ch.xa.marked(mark))
    }

    /// Whether the index holds nothing (reserved entries count as
    /// something, as in `XArray`).
    pub fn is_empty(&self) -> bool {
        !self.any_chunk(|ch| !ch.xa.is_empty())
    }

    fn any_chunk(&self, mut f: impl FnMut(&Chunk<T>) -> bool) -> bool {
        let guard = pin();
        let mut c = 0;
        while let Some((n, ch)) = self.dir.next(c, u64::MAX, &guard) {
            if f(ch) {
                return true;
            }
            match n.checked_add(1) {
                Some(next) => c = next,
                None => break,
            }
        }
        false
    }

    /// The first entry at or after `start` and at most `max` matching
    /// `filter` (`None`: any entry; `Some(mark)`: marked ones), with its
    /// index (`xa_find`).
    pub fn find<'g>(
        &'g self,
        start: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)> {
        if start > max {
            return None;
        }
        let (first_c, last_c) = (start >> self.shift, max >> self.shift);
        let mut c = first_c;
        loop {
            let (n, ch) = self.dir.next(c, last_c, guard)?;
            let lo = if n == first_c { start & self.mask } else { 0 };
            let hi = if n == last_c {
                max & self.mask
            } else {
                self.mask
            };
            let skip = filter.is_some_and(|m| !ch.xa.marked(m));
            if !skip {
                if let Some((i, e)) = ch.xa.find(lo, hi, filter, guard) {
                    return Some((self.base(n) | i, e));
                }
            }
            c = n.checked_add(1)?;
        }
    }

    /// The first matching entry strictly after the entry containing `index`
    /// and at most `max` (`xa_find_after`): the other indices of a
    /// multi-index entry are skipped.
    pub fn find_after<'g>(
        &'g self,
        index: u64,
        max: u64,
        filter: Option<Mark>,
        guard: &'g Guard,
    ) -> Option<(u64, EntryRef<'g, T>)> {
        if index >= max {
            return None;
        }
        let (c, off) = self.split(index);
        if let Some(ch) = self.dir.get(c, guard) {
            let hi = if c == max >> self.shift {
                max & self.mask
            } else {
                self.mask
            };
            if let Some((i, e)) = ch.xa.find_after(off, hi, filter, guard) {
                return Some((self.base(c) | i, e));
            }
        }
        // Entries never cross a chunk, so the rest starts at the next chunk.
        let next = (self.base(c) | self.mask).checked_add(1)?;
        self.find(next, max, filter, guard)
    }

    /// An ordered iterator over every entry, across chunks in index order
    /// (one item per multi-index entry).
    pub fn iter<'g>(&'g self, guard: &'g Guard) -> Iter<'g, T> {
        Iter::new(self, guard, 0, Some(u64::MAX), None)
    }

    /// An ordered iterator over the entries in `range`.
    pub fn range<'g, R: RangeBounds<u64>>(&'g self, range: R, guard: &'g Guard) -> Iter<'g, T> {
        let (start, end) = bounds(range);
        Iter::new(self, guard, start, end, None)
    }

    /// An ordered iterator over the entries in `range` that carry `mark`;
    /// chunks whose root flag says they hold no such entry are skipped
    /// without a walk.
    pub fn iter_marked<'g, R: RangeBounds<u64>>(
        &'g self,
        range: R,
        mark: Mark,
        guard: &'g Guard,
    ) -> Iter<'g, T> {
        let (start, end) = bounds(range);
        Iter::new(self, guard, start, end, Some(mark))
    }

    // ------------------------------------------------------------------
    // Writes, each under its chunk's lock
    // ------------------------------------------------------------------

    /// Store `entry` at `index` (`xa_store`), creating the chunk if needed.
    /// Returns the entry that was there.
    ///
    /// # Errors
    /// As [`XArray::store`] ([`Error::ValueOutOfRange`],
    /// [`Error::NoMemory`]), with the entry handed back.
    pub fn store(&self, index: u64, entry: Entry<T>) -> Result<Option<Retired<T>>, Rejected<T>> {
        self.store_with_order(index, 0, entry)
    }

    /// Store `entry` as one multi-index entry over the `2^order` indices
    /// from `index`, which must be aligned to the order and, since an entry
    /// lives in one chunk, `order <= shift`.
    ///
    /// ```
    /// use kxarray::{ChunkedXArray, Entry, Error};
    /// let xa: ChunkedXArray<Box<u32>> = ChunkedXArray::with_shift(12).unwrap();
    /// xa.store_order(4096, 9, Entry::Value(1)).unwrap();
    /// assert_eq!(xa.get_order(4600), 9);
    /// let err = xa.store_order(8192, 13, Entry::Value(2)).unwrap_err();
    /// assert_eq!(err.error, Error::CrossesChunk { index: 8192, order: 13, shift: 12 });
    /// ```
    ///
    /// # Errors
    /// [`Error::CrossesChunk`] when `order > shift`, otherwise as
    /// [`XArray::store_order`]; the entry is handed back.
    pub fn store_order(
        &self,
        index: u64,
        order: u32,
        entry: Entry<T>,
    ) -> Result<Option<Retired<T>>, Rejected<T>> {
        if let Err(e) = check_order(index, order) {
            return Err(Rejected::new(e, Some(entry)));
        }
        if order > self.shift {
            let e = Error::CrossesChunk {
                index,
                order,
                shift: self.shift,
            };
            return Err(Rejected::new(e, Some(entry)));
        }
        self.store_with_order(index, order, entry)
    }

    fn store_with_order(
        &self,
        index: u64,
        order: u32,
        entry: Entry<T>,
    ) -> Result<Option<Retired<T>>, Rejected<T>> {
        if let Entry::Value(v) = entry {
            if v > MAX_VALUE {
                return Err(Rejected::new(Error::ValueOutOfRange(v), Some(entry)));
            }
        }
        let guard = pin();
        let (c, off) = self.split(index);
        let r = self.dir.with_chunk(c, true, &guard, entry, |l, e| {
            // A loaded entry always encodes (`to_raw` fails only for
            // caller-built values above MAX_VALUE).
            l.store_order(off, order, Some(e))
                .map(|old| old.and_then(|r| r.to_raw().ok()))
        });
        match r {
            Ok(Some(Ok(old))) => Ok(old.map(|raw| {
                // SAFETY: the old item was disposed through the chunk lock's
                // guard on this thread while `guard` (pinned before it) was
                // pinned; `Retired` keeps `guard`.
                unsafe { Retired::new(raw, guard) }
            })),
            Ok(Some(Err(rej))) => Err(rej),
            Ok(None) => unreachable_created(),
            Err((e, entry)) => Err(Rejected::new(e, Some(entry))),
        }
    }

    /// Erase the entry at `index` (a multi-index entry for all its indices);
    /// the chunk is dropped if that leaves it empty. Returns what was there.
    pub fn erase(&self, index: u64) -> Option<Retired<T>> {
        let guard = pin();
        let (c, off) = self.split(index);
        let raw = self
            .dir
            .with_chunk(c, false, &guard, (), |l, ()| {
                l.erase(off).and_then(|r| r.to_raw().ok())
            })
            .ok()
            .flatten()
            .flatten()?;
        // SAFETY: as in `store`: disposed through the chunk lock's guard on
        // this thread while `guard` was pinned.
        Some(unsafe { Retired::new(raw, guard) })
    }

    /// Store `entry` only if `index` is empty (`xa_insert`); `None` reserves
    /// the index.
    ///
    /// # Errors
    /// [`Error::Busy`] if an entry or a reservation is there; otherwise as
    /// [`XArray::insert`]. The entry is handed back.
    pub fn insert(&self, index: u64, entry: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        let guard = pin();
        let (c, off) = self.split(index);
        match self
            .dir
            .with_chunk(c, true, &guard, entry, |l, e| l.insert(off, e))
        {
            Ok(Some(r)) => r,
            Ok(None) => unreachable_created(),
            Err((e, entry)) => Err(Rejected::new(e, entry)),
        }
    }

    /// Replace the entry at `index` with `new` if it is currently `old`
    /// (`xa_cmpxchg`, raw semantics as [`XArray::cmpxchg`]: `old == None` matches an
    /// empty index only, not a reserved one).
    /// Returns the replaced entry, readable under `guard`.
    ///
    /// # Errors
    /// [`Error::Mismatch`] with `new` handed back if the entry differs;
    /// otherwise as [`XArray::cmpxchg`].
    pub fn cmpxchg<'g>(
        &'g self,
        index: u64,
        old: Option<EntryRef<'_, T>>,
        new: Option<Entry<T>>,
        guard: &'g Guard,
    ) -> Result<Option<EntryRef<'g, T>>, Rejected<T>> {
        let (c, off) = self.split(index);
        let create = new.is_some();
        let r = self.dir.with_chunk(c, create, guard, new, |l, new| {
            l.cmpxchg(off, old, new)
                .map(|prev| prev.and_then(|r| r.to_raw().ok()))
        });
        match r {
            Ok(Some(Ok(prev))) => Ok(prev.map(|raw| {
                // SAFETY: the previous item was disposed through the chunk
                // lock's guard on this thread while `guard` (a guard of this
                // thread, as guards are !Send) was pinned, so it outlives 'g.
                unsafe { EntryRef::from_raw(raw) }
            })),
            Ok(Some(Err(rej))) => Err(rej),
            // No chunk: the index is empty and `new` is None.
            Ok(None) if old.is_none() => Ok(None),
            Ok(None) => Err(Rejected::new(Error::Mismatch, None)),
            Err((e, new)) => Err(Rejected::new(e, new)),
        }
    }

    /// Reserve `index` (`xa_reserve`): it reads as empty but keeps its chunk
    /// and its slot. No-op if occupied.
    ///
    /// # Errors
    /// [`Error::NoMemory`].
    pub fn reserve(&self, index: u64) -> Result<(), Error> {
        let guard = pin();
        let (c, off) = self.split(index);
        match self
            .dir
            .with_chunk(c, true, &guard, (), |l, ()| l.insert(off, None))
        {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(Some(Err(r))) if r.error == Error::Busy => Ok(()),
            Ok(Some(Err(r))) => Err(r.error),
            Ok(None) => unreachable_created(),
            Err((e, ())) => Err(e),
        }
    }

    /// Undo a reservation (`xa_release`); no-op if the index was used.
    pub fn release(&self, index: u64) {
        let guard = pin();
        let (c, off) = self.split(index);
        let _ = self
            .dir
            .with_chunk(c, false, &guard, (), |l, ()| l.release(off));
    }

    /// Store the value `value` at every index in `first..=last`
    /// (`xa_store_range`); `None` erases the range. The range is cut at
    /// chunk boundaries and each part stored under its chunk's lock, in
    /// index order (storing creates every chunk the range touches; erasing
    /// visits only the chunks that exist).
    ///
    /// ```
    /// use kxarray::ChunkedXArray;
    /// let xa: ChunkedXArray<Box<u32>> = ChunkedXArray::with_shift(6).unwrap();
    /// xa.store_range(60, 70, Some(5)).unwrap(); // chunks 0 and 1
    /// assert_eq!(xa.chunk_count(), 2);
    /// assert_eq!(xa.load_value(64), Some(5));
    /// xa.store_range(0, 63, None).unwrap();
    /// assert_eq!(xa.chunk_count(), 1);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRange`] if `last < first`,
    /// [`Error::ValueOutOfRange`] (nothing stored), [`Error::NoMemory`]
    /// (the chunks before the failing one are stored).
    pub fn store_range(&self, first: u64, last: u64, value: Option<u64>) -> Result<(), Error> {
        if last < first {
            return Err(Error::InvalidRange { first, last });
        }
        if let Some(v) = value {
            if v > MAX_VALUE {
                return Err(Error::ValueOutOfRange(v));
            }
        }
        let guard = pin();
        let (first_c, last_c) = (first >> self.shift, last >> self.shift);
        let mut c = first_c;
        loop {
            if value.is_none() {
                match self.dir.next(c, last_c, &guard) {
                    Some((n, _)) => c = n,
                    None => return Ok(()),
                }
            }
            let lo = if c == first_c { first & self.mask } else { 0 };
            let hi = if c == last_c {
                last & self.mask
            } else {
                self.mask
            };
            let r = self
                .dir
                .with_chunk(c, value.is_some(), &guard, (), |l, ()| {
                    l.store_range(lo, hi, value)
                });
            match r {
                Ok(None) | Ok(Some(Ok(()))) => {}
                Ok(Some(Err(e))) | Err((e, ())) => return Err(e),
            }
            if c == last_c {
                return Ok(());
            }
            c += 1;
        }
    }

    /// Set `mark` on the entry at `index` (no-op if empty).
    pub fn set_mark(&self, index: u64, mark: Mark) {
        let guard = pin();
        let (c, off) = self.split(index);
        let _ = self
            .dir
            .with_chunk(c, false, &guard, (), |l, ()| l.set_mark(off, mark));
    }

    /// Clear `mark` on the entry at `index`.
    pub fn clear_mark(&self, index: u64, mark: Mark) {
        let guard = pin();
        let (c, off) = self.split(index);
        let _ = self
            .dir
            .with_chunk(c, false, &guard, (), |l, ()| l.clear_mark(off, mark));
    }

    /// Remove every entry and every chunk; items are freed once readers are
    /// done with them.
    pub fn clear(&self) {
        let guard = pin();
        let mut c = 0;
        while let Some((n, _)) = self.dir.next(c, u64::MAX, &guard) {
            let _ = self.dir.with_chunk(n, false, &guard, (), |l, ()| l.clear());
            match n.checked_add(1) {
                Some(next) => c = next,
                None => break,
            }
        }
    }

    // ------------------------------------------------------------------
    // Exclusive access
    // ------------------------------------------------------------------
    /// Store through an exclusive borrow: no lock, no epoch; the old entry
    /// comes back owned.
    ///
    /// # Errors
    /// As [`XArray::replace`], with the entry handed back.
    pub fn replace(
        &mut self,
        index: u64,
        entry: Entry<T>,
    ) -> Result<Option<Entry<T>>, Rejected<T>> {
        let (c, off) = self.split(index);
        let r = match self.dir.get_or_create_mut(c) {
            Ok(ch) => ch.xa.replace(off, entry),
            Err(e) => return Err(Rejected::new(e, Some(entry))),
        };
        self.dir.drop_if_empty(c);
        r
    }

    /// Remove the entry at `index` and return it owned; the chunk is
    /// dropped if that leaves it empty.
    pub fn remove(&mut self, index: u64) -> Option<Entry<T>> {
        let (c, off) = self.split(index);
        let e = self.dir.get_mut(c)?.xa.remove(off);
        self.dir.drop_if_empty(c);
        e
    }

    /// A mutable reference to the item at `index` (for uniquely owned item
    /// types such as `Box`).
    pub fn get_mut(&mut self, index: u64) -> Option<&mut T::Target>
    where
        T: ItemMut,
    {
        let (c, off) = self.split(index);
        self.dir.get_mut(c)?.xa.get_mut(off)
    }

    // ------------------------------------------------------------------
    // Introspection
    // ------------------------------------------------------------------

    /// Chunks currently linked.
    pub fn chunk_count(&self) -> usize {
        self.dir.fold(0, |n, _, _| n + 1)
    }

    /// Nodes in all the chunks' trees (the overflow directory's nodes are
    /// in [`directory_node_count`](ChunkedXArray::directory_node_count)).
    pub fn node_count(&self) -> usize {
        self.dir.fold(0, |n, _, ch| n + ch.xa.node_count())
    }

    /// Nodes of the overflow directory `XArray` (0 while every chunk is in
    /// the flat table).
    pub fn directory_node_count(&self) -> usize {
        self.dir.overflow().node_count()
    }

    /// The tallest chunk tree, in levels of nodes (at most
    /// `ceil(shift / 6)` with 64-slot nodes).
    pub fn height(&self) -> u32 {
        self.dir.fold(0, |h, _, ch| h.max(ch.xa.height()))
    }

    /// Levels of the overflow directory (0 while every chunk is in the flat
    /// table).
    pub fn directory_height(&self) -> u32 {
        self.dir.overflow().height()
    }

    /// Bytes in use: the flat table, the overflow directory, and every
    /// chunk with its tree.
    pub fn memory_usage(&self) -> usize {
        // The overflow `XArray` counts its own struct, which `Self` holds.
        let fixed = core::mem::size_of::<Self>()
            + self.dir.table_bytes()
            + self.dir.overflow().memory_usage()
            - core::mem::size_of::<XArray<Box<Chunk<T>>>>();
        // Each chunk's `XArray` counts its own struct, which `Chunk` holds;
        // a direct chunk's struct is already in the table's bytes.
        self.dir.fold(fixed, |b, c, ch| {
            let own = if self.dir.is_direct(c) {
                0
            } else {
                core::mem::size_of::<Chunk<T>>()
            };
            b + own + ch.xa.memory_usage() - core::mem::size_of::<XArray<T>>()
        })
    }

    /// Check every chunk's invariants and the directory's; `Err` describes
    /// the first violation. Meant for a quiescent index: a writer in flight
    /// may briefly have an empty chunk linked.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.dir
            .overflow()
            .check_invariants()
            .map_err(|e| format!("directory: {e}"))?;
        let guard = pin();
        let mut c = 0;
        while let Some((n, ch)) = self.dir.next(c, u64::MAX, &guard) {
            ch.xa
                .check_invariants()
                .map_err(|e| format!("chunk {n}: {e}"))?;
            if ch.xa.is_empty() {
                return Err(format!("chunk {n} is linked but empty"));
            }
            if ch.is_dead() {
                return Err(format!("chunk {n} is linked but dead"));
            }
            if let Some(beyond) = self.mask.checked_add(1) {
                if let Some((i, _)) = ch.xa.find(beyond, u64::MAX, None, &guard) {
                    return Err(format!("chunk {n} holds offset {i:#x} beyond its mask"));
                }
            }
            match n.checked_add(1) {
                Some(next) => c = next,
                None => break,
            }
        }
        Ok(())
    }
}

#[cold]
fn unreachable_created() -> ! {
    // `with_chunk(create = true)` returns `Ok(None)` only when no chunk
    // exists and creation was not asked for.
    unreachable!("kxarray: a chunk that was just created is missing")
}

impl<T: Item> core::fmt::Debug for ChunkedXArray<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ChunkedXArray")
            .field("shift", &self.shift)
            .field("chunks", &self.chunk_count())
            .field("nodes", &self.node_count())
            .finish()
    }
}

impl<T: Item> FromIterator<(u64, Entry<T>)> for ChunkedXArray<T> {
    fn from_iter<I: IntoIterator<Item = (u64, Entry<T>)>>(iter: I) -> Self {
        let mut xa = ChunkedXArray::new();
        for (i, e) in iter {
            // Values out of range are dropped with their error; items always fit.
            let _ = xa.replace(i, e);
        }
        xa
    }
}
