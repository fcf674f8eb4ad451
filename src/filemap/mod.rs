//! The page cache's address space: an [`XArray`] of folios and shadow
//! entries, with the kernel's tags and the one-walk `add_folio`.
//!
//! - [`AddressSpace::add_folio`] is `__filemap_add_folio` after Linux 6.10
//!   (Kairui Song's "mm/filemap: optimize filemap folio adding"), improved
//!   further: one locked conflict scan reads the order of a shadow in place
//!   (`get_order`, no walk); when a larger shadow must be split, the lock is
//!   dropped to preallocate one node per level crossed (a partial split, as
//!   `xas_try_split` leaves it), and on relocking the position is re-validated
//!   without a walk when the tree kept its shape. After the split the cursor
//!   already sits on the folio's slot, so the store needs no walk either.
//! - [`legacy::add_folio_legacy`] is the algorithm before that patch, kept on
//!   the same cursor API as the measured baseline.
//!
//! Invariants: every folio in the tree is stored at its own index with its
//! own order; shadows are value entries and never carry tags; `nr_pages`
//! and `nr_shadow_pages` count the indices covered by folios and shadows
//! and change only under the lock; no error path leaves a partial insert or
//! leaks a node (preallocations live in the cursor and are freed with it).

mod folio;
mod frames;
pub mod legacy;
mod mem;
#[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
mod regions;
mod shadow;

pub use folio::{Folio, FolioFlags, MAX_FOLIO_ORDER, PAGE_SIZE};
pub use frames::{frame_stats, trim_frames, FrameStats};
pub(crate) use frames::{
    retain as retain_frames, trim_to_limit as trim_frames_to_limit,
    HEADER_BYTES as FRAME_HEADER_BYTES,
};
pub use mem::AllocError;
#[cfg(not(loom))]
pub(crate) use mem::RawFill;
pub(crate) use mem::{BufPin, InstallError, MemBorrow, MemWrite};
pub use shadow::{Shadow, ShadowFields, EVICTION_BITS, MEMCG_BITS, NODE_BITS};

use crate::sync::{AtomicU64, Ordering};
use crate::{fault, pin, Entry, EntryRef, Error, Mark, XArray, XaLock, XaState, XaView};
use core::fmt;
use std::sync::Arc;

/// Page-cache tags, on the XArray's marks (`include/linux/fs.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// `PAGECACHE_TAG_DIRTY` (mark 0).
    Dirty,
    /// `PAGECACHE_TAG_WRITEBACK` (mark 1).
    Writeback,
    /// `PAGECACHE_TAG_TOWRITE` (mark 2).
    Towrite,
}

impl Tag {
    /// The XArray mark carrying this tag.
    pub const fn mark(self) -> Mark {
        match self {
            Tag::Dirty => Mark::M0,
            Tag::Writeback => Mark::M1,
            Tag::Towrite => Mark::M2,
        }
    }
}

/// Why a folio could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddError {
    /// A folio already covers part of the range (`-EEXIST`).
    Exists,
    /// Node allocation failed (`-ENOMEM`); nothing was inserted.
    NoMemory,
    /// The folio's index is not aligned to its order.
    Misaligned {
        /// The index.
        index: u64,
        /// The order.
        order: u32,
    },
    /// The order is above [`MAX_FOLIO_ORDER`].
    OrderTooLarge(u32),
    /// The folio would extend past the last index.
    IndexOverflow {
        /// The index.
        index: u64,
        /// The order.
        order: u32,
    },
    /// The XArray refused the operation for another reason (for example
    /// [`Error::InvalidSplit`] when a split found a different entry); the
    /// error is passed through unchanged, never mistaken for `NoMemory`.
    Array(Error),
}

impl fmt::Display for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Exists => f.write_str("a folio is already present in the range"),
            AddError::NoMemory => f.write_str("node allocation failed"),
            AddError::Misaligned { index, order } => {
                write!(f, "index {index} not aligned to order {order}")
            }
            AddError::OrderTooLarge(o) => write!(f, "folio order {o} above {MAX_FOLIO_ORDER}"),
            AddError::IndexOverflow { index, order } => {
                write!(
                    f,
                    "folio of order {order} at {index} runs past the last index"
                )
            }
            AddError::Array(e) => write!(f, "xarray: {e}"),
        }
    }
}

impl std::error::Error for AddError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AddError::Array(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for AddError {
    fn from(e: Error) -> AddError {
        match e {
            Error::Misaligned { index, order } => AddError::Misaligned { index, order },
            Error::OrderTooLarge(o) => AddError::OrderTooLarge(o),
            Error::NoMemory => AddError::NoMemory,
            other => AddError::Array(other),
        }
    }
}

/// What one `add_folio` call cost: walks from the root, nodes allocated,
/// and lock round-trips for allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddStats {
    /// Descents from the root (all cursors the call used).
    pub walks: u64,
    /// Tree nodes allocated (including preallocations later freed).
    pub nodes: u64,
    /// Times the lock was dropped to allocate and the call went round again.
    pub relocks: u64,
    /// Split preallocations thrown away because the entry they were made
    /// for changed while the lock was dropped (the race the 6.10 patch
    /// closed; here detected and redone).
    pub stale: u64,
}

impl core::ops::AddAssign for AddStats {
    fn add_assign(&mut self, o: AddStats) {
        self.walks += o.walks;
        self.nodes += o.nodes;
        self.relocks += o.relocks;
        self.stale += o.stale;
    }
}

/// A lookup result: a folio, or the shadow an evicted one left.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// A cached folio (a new reference).
    Folio(Arc<Folio>),
    /// A shadow entry.
    Shadow(Shadow),
}

/// An address space (the kernel's `struct address_space`): the page cache
/// of one file.
///
/// ```
/// use kxarray::filemap::{AddressSpace, Folio, Shadow, ShadowFields};
/// use std::sync::Arc;
///
/// let mapping = AddressSpace::new();
/// let folio = Arc::new(Folio::new(8, 3).unwrap());
/// assert_eq!(mapping.add_folio(&folio).unwrap(), None);
/// assert!(Arc::ptr_eq(&mapping.lookup(13).unwrap(), &folio));
///
/// // Evict it, leaving a shadow; the refault gets the shadow back.
/// let shadow = Shadow::pack(ShadowFields { eviction: 42, ..Default::default() }).unwrap();
/// assert!(mapping.remove_folio(&folio, Some(shadow)));
/// let again = Arc::new(Folio::new(12, 0).unwrap());
/// assert_eq!(mapping.add_folio(&again).unwrap(), Some(shadow));
/// ```
pub struct AddressSpace {
    pages: XArray<Arc<Folio>>,
    nr_pages: AtomicU64,
    nr_shadow_pages: AtomicU64,
}

impl Default for AddressSpace {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AddressSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressSpace")
            .field("nr_pages", &self.nr_pages())
            .field("nr_shadow_pages", &self.nr_shadow_pages())
            .finish()
    }
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> Self {
        AddressSpace {
            pages: XArray::with_light_items(),
            nr_pages: AtomicU64::new(0),
            nr_shadow_pages: AtomicU64::new(0),
        }
    }

    /// The underlying array (`mapping->i_pages`), read-only: a write that
    /// bypassed the address space would leave `nr_pages` and
    /// `nr_shadow_pages` out of step with the tree.
    ///
    /// ```compile_fail,E0599
    /// use kxarray::filemap::AddressSpace;
    /// let mapping = AddressSpace::new();
    /// // a shadow stored behind the mapping's back: not possible
    /// mapping.pages().store_order(0, 2, kxarray::Entry::Value(1));
    /// ```
    pub fn pages(&self) -> XaView<'_, Arc<Folio>> {
        XaView::new(&self.pages)
    }

    /// The folio at `index`, read in a light section (no reference taken):
    /// the address space's folios are dropped only after a light grace
    /// period as well as crossbeam's. `None` for a shadow or a hole.
    #[inline(always)]
    pub(crate) fn folio_light<'p>(
        &'p self,
        index: u64,
        pin: &'p crate::lightpin::LightPin,
    ) -> Option<&'p Folio> {
        self.pages.load_item_light(index, pin)
    }
    /// Pages held by cached folios (`mapping->nrpages`).
    pub fn nr_pages(&self) -> u64 {
        self.nr_pages.load(Ordering::Relaxed)
    }
    /// Indices covered by shadow entries.
    pub fn nr_shadow_pages(&self) -> u64 {
        self.nr_shadow_pages.load(Ordering::Relaxed)
    }

    fn account_add(&self, folio_pages: u64, shadow_pages: u64) {
        self.nr_pages.fetch_add(folio_pages, Ordering::Relaxed);
        self.nr_shadow_pages
            .fetch_sub(shadow_pages, Ordering::Relaxed);
    }

    /// Add a folio (`__filemap_add_folio`). Returns the last shadow entry the
    /// range held (`*shadowp`), or `None`. Fails with [`AddError::Exists`]
    /// if any folio overlaps the range; nothing is inserted on any error.
    pub fn add_folio(&self, folio: &Arc<Folio>) -> Result<Option<Shadow>, AddError> {
        let mut stats = AddStats::default();
        self.add_folio_stats(folio, &mut stats)
    }

    /// [`AddressSpace::add_folio`], adding what the call cost to `stats`.
    ///
    /// ```
    /// use kxarray::filemap::{AddStats, AddressSpace, Folio, Shadow, ShadowFields};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let big = Arc::new(Folio::new(0, 9).unwrap()); // 512 pages
    /// mapping.add_folio(&big).unwrap();
    /// let shadow = Shadow::pack(ShadowFields { eviction: 42, ..Default::default() }).unwrap();
    /// assert!(mapping.remove_folio(&big, Some(shadow)));
    /// // One page refaults: the order-9 shadow is split around it.
    /// let mut stats = AddStats::default();
    /// let page = Arc::new(Folio::new(5, 0).unwrap());
    /// assert_eq!(mapping.add_folio_stats(&page, &mut stats).unwrap(), Some(shadow));
    /// assert_eq!(mapping.nr_shadow_pages(), 511);
    /// assert_eq!(stats.walks, 1); // the split leaves the cursor on the slot
    /// assert!(stats.nodes >= 1);
    /// ```
    pub fn add_folio_stats(
        &self,
        folio: &Arc<Folio>,
        stats: &mut AddStats,
    ) -> Result<Option<Shadow>, AddError> {
        let index = folio.index();
        let forder = folio.order();
        let nr = folio.nr_pages();
        let allocs0 = fault::allocations();
        let guard = pin();
        let mut xas = XaState::with_order(&self.pages, &guard, index, forder)?;
        // (shadow value, order) the preallocated split nodes are for
        let mut alloced: Option<(u64, u32)> = None;
        let result = loop {
            let lock = self.pages.lock();
            let mut old: Option<u64> = None;
            let mut order = 0u32;
            let mut shadow_pages = 0u64;
            let mut resumed = false;
            if let Some((v, o)) = alloced {
                // Re-check after dropping the lock. If the tree kept its
                // shape the cursor still points at the shadow: reload it
                // in place instead of walking again.
                if xas.revalidate(&lock) {
                    if let Ok(Some(EntryRef::Value(cur))) = xas.reload() {
                        if cur == v && xas.get_order() == o {
                            old = Some(v);
                            order = o;
                            shadow_pages = 1 << o;
                            resumed = true;
                        }
                    }
                }
                if !resumed {
                    xas.reset();
                }
            }
            if !resumed {
                let mut exists = false;
                let mut first = true;
                while let Some(e) = xas.find_conflict(&lock) {
                    match e {
                        EntryRef::Item(_) => {
                            exists = true;
                            break;
                        }
                        EntryRef::Value(v) => {
                            let o = xas.get_order();
                            if first {
                                // A larger entry is the first and only one.
                                order = o;
                                first = false;
                            }
                            old = Some(v);
                            shadow_pages += 1 << o;
                        }
                    }
                }
                if exists {
                    break Err(AddError::Exists);
                }
                if alloced.is_some() && alloced != old.map(|v| (v, order)) {
                    // Raced while unlocked: the preallocation is stale.
                    xas.destroy();
                    alloced = None;
                    stats.stale += 1;
                }
            }
            if let Some(v) = old {
                if order > forder {
                    if alloced.is_none() {
                        if xas.try_split_nodes(order) == 0 {
                            // Split inside one node: nothing to allocate, so
                            // no reason to drop the lock.
                            if let Err(e) = xas.try_split_alloc(v, order) {
                                break Err(e.into());
                            }
                        } else {
                            drop(lock);
                            if let Err(e) = xas.try_split_alloc(v, order) {
                                break Err(e.into());
                            }
                            alloced = Some((v, order));
                            stats.relocks += 1;
                            continue;
                        }
                    }
                    if xas.try_split(&lock, v, order).is_err() {
                        // The entry changed after all: start over.
                        alloced = None;
                        stats.stale += 1;
                        xas.reset();
                        drop(lock);
                        continue;
                    }
                    alloced = None;
                    shadow_pages = nr;
                }
            }
            match self.store_folio(&mut xas, lock, folio, shadow_pages, stats) {
                Ok(true) => break Ok(old.map(Shadow::from_value)),
                Ok(false) => continue,
                Err(e) => break Err(e),
            }
        };
        stats.walks += xas.walks();
        stats.nodes += fault::allocations() - allocs0;
        result
    }

    /// The last step of both add algorithms: store the folio over the
    /// cursor's range and account it. `Ok(false)` means a node was missing:
    /// the lock was dropped, memory found (`xas_nomem`), and the caller must
    /// go round again.
    pub(super) fn store_folio(
        &self,
        xas: &mut XaState<'_, Arc<Folio>>,
        lock: XaLock<'_, Arc<Folio>>,
        folio: &Arc<Folio>,
        shadow_pages: u64,
        stats: &mut AddStats,
    ) -> Result<bool, AddError> {
        match xas.store(&lock, Some(Entry::Item(Arc::clone(folio)))) {
            Ok(_) => {
                self.account_add(folio.nr_pages(), shadow_pages);
                Ok(true)
            }
            Err(r) if r.error == Error::NoMemory => {
                drop(lock);
                if xas.nomem() {
                    stats.relocks += 1;
                    return Ok(false);
                }
                Err(AddError::NoMemory)
            }
            Err(r) => Err(r.error.into()),
        }
    }

    /// The folio covering `index`, lock-free (`filemap_get_folio` without
    /// the I/O): pin, load, take a reference, re-check that the slot still
    /// holds that folio (`folio_try_get` + `xas_reload`), retry otherwise.
    pub fn lookup(&self, index: u64) -> Option<Arc<Folio>> {
        match self.lookup_entry(index)? {
            Lookup::Folio(f) => Some(f),
            Lookup::Shadow(_) => None,
        }
    }

    /// The folio or shadow at `index`, lock-free.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Lookup, Shadow, ShadowFields};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(0, 0).unwrap());
    /// mapping.add_folio(&folio).unwrap();
    /// let found = mapping.lookup_entry(0);
    /// assert!(matches!(found, Some(Lookup::Folio(f)) if Arc::ptr_eq(&f, &folio)));
    /// let shadow = Shadow::pack(ShadowFields { eviction: 9, ..Default::default() }).unwrap();
    /// mapping.remove_folio(&folio, Some(shadow));
    /// assert!(matches!(mapping.lookup_entry(0), Some(Lookup::Shadow(s)) if s == shadow));
    /// assert!(mapping.lookup(0).is_none()); // `lookup` wants a folio
    /// assert!(mapping.lookup_entry(1).is_none()); // a hole
    /// ```
    pub fn lookup_entry(&self, index: u64) -> Option<Lookup> {
        let guard = pin();
        let mut xas = XaState::new(&self.pages, &guard, index);
        loop {
            match xas.load()? {
                EntryRef::Value(v) => return Some(Lookup::Shadow(Shadow::from_value(v))),
                EntryRef::Item(r) => {
                    let folio = r.to_owned();
                    match xas.reload() {
                        Ok(Some(EntryRef::Item(again))) if again.ptr_eq(r) => {
                            return Some(Lookup::Folio(folio))
                        }
                        _ => xas.reset(),
                    }
                }
            }
        }
    }

    /// Remove `folio` from the cache, leaving `shadow` (of the folio's order)
    /// in its place, or nothing (`page_cache_delete`). Tags are cleared.
    /// Returns false if the folio was not in the cache.
    pub fn remove_folio(&self, folio: &Arc<Folio>, shadow: Option<Shadow>) -> bool {
        let lock = self.pages.lock();
        let mut xas =
            match XaState::with_order(&self.pages, lock.guard(), folio.index(), folio.order()) {
                Ok(x) => x,
                Err(_) => return false,
            };
        match xas.load() {
            Some(EntryRef::Item(r)) if core::ptr::eq(r.as_ptr(), Arc::as_ptr(folio)) => {}
            _ => return false,
        }
        let entry = shadow.map(|s| Entry::Value(s.to_value()));
        if xas.store(&lock, entry).is_err() {
            // Replacing an existing entry in place never allocates.
            return false;
        }
        xas.init_marks(&lock);
        let nr = folio.nr_pages();
        self.nr_pages.fetch_sub(nr, Ordering::Relaxed);
        if shadow.is_some() {
            self.nr_shadow_pages.fetch_add(nr, Ordering::Relaxed);
        }
        true
    }

    /// Drop the shadow entry at `index` (shadow-node reclaim), all the
    /// indices it covers; true if one was there.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Shadow, ShadowFields};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(4, 2).unwrap()); // pages 4..8
    /// mapping.add_folio(&folio).unwrap();
    /// let shadow = Shadow::pack(ShadowFields { eviction: 1, ..Default::default() }).unwrap();
    /// mapping.remove_folio(&folio, Some(shadow));
    /// assert_eq!(mapping.nr_shadow_pages(), 4);
    /// assert!(mapping.drop_shadow(5)); // any index it covers
    /// assert_eq!(mapping.nr_shadow_pages(), 0);
    /// assert!((4..8).all(|i| mapping.lookup_entry(i).is_none()));
    /// assert!(!mapping.drop_shadow(5));
    /// ```
    pub fn drop_shadow(&self, index: u64) -> bool {
        let lock = self.pages.lock();
        let mut xas = XaState::new(&self.pages, lock.guard(), index);
        if let Some(EntryRef::Value(_)) = xas.load() {
            let order = xas.get_order();
            let _ = xas.store(&lock, None);
            self.nr_shadow_pages
                .fetch_sub(1 << order, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether any folio carries `tag` (`mapping_tagged`): O(1).
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(0, 0).unwrap());
    /// mapping.add_folio(&folio).unwrap();
    /// assert!(!mapping.tagged(Tag::Dirty));
    /// mapping.mark_dirty(0);
    /// assert!(mapping.tagged(Tag::Dirty));
    /// mapping.remove_folio(&folio, None); // removal clears its tags
    /// assert!(!mapping.tagged(Tag::Dirty));
    /// ```
    pub fn tagged(&self, tag: Tag) -> bool {
        self.pages.marked(tag.mark())
    }

    fn with_folio_at(
        &self,
        lock: &XaLock<'_, Arc<Folio>>,
        index: u64,
        f: impl FnOnce(&mut XaState<'_, Arc<Folio>>, &Folio),
    ) -> bool {
        let mut xas = XaState::new(&self.pages, lock.guard(), index);
        match xas.load() {
            Some(EntryRef::Item(r)) => {
                let folio: &Folio = r.get();
                f(&mut xas, folio);
                true
            }
            _ => false,
        }
    }

    /// Mark the folio at `index` dirty: the folio flag and the DIRTY tag
    /// (`__folio_mark_dirty`). False if no folio is cached there.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, FolioFlags, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(4, 2).unwrap()); // pages 4..8
    /// mapping.add_folio(&folio).unwrap();
    /// assert!(mapping.mark_dirty(5)); // any index inside the folio
    /// assert!(folio.test(FolioFlags::DIRTY) && mapping.tagged(Tag::Dirty));
    /// assert!(!mapping.mark_dirty(8)); // nothing cached there
    /// ```
    pub fn mark_dirty(&self, index: u64) -> bool {
        let lock = self.pages.lock();
        self.with_folio_at(&lock, index, |xas, folio| {
            folio.set(FolioFlags::DIRTY);
            xas.set_mark(&lock, Tag::Dirty.mark());
        })
    }

    /// Copy DIRTY to TOWRITE on every dirty folio in `start..=end`
    /// (`tag_pages_for_writeback`), pausing the walk and dropping the lock
    /// every 4096 folios so writers are not starved. Returns how many folios
    /// were tagged.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// for i in 0..3 {
    ///     mapping.add_folio(&Arc::new(Folio::new(i, 0).unwrap())).unwrap();
    /// }
    /// mapping.mark_dirty(0);
    /// mapping.mark_dirty(2);
    /// assert_eq!(mapping.tag_for_writeback(0, 1), 1); // folio 1 is clean, 2 is outside
    /// let towrite = mapping.folios_tagged(0, u64::MAX, Tag::Towrite);
    /// assert_eq!(towrite.len(), 1);
    /// assert_eq!(towrite[0].index(), 0);
    /// ```
    pub fn tag_for_writeback(&self, start: u64, end: u64) -> u64 {
        const CHECK_SCHED: u64 = 4096;
        let guard = pin();
        let mut xas = XaState::new(&self.pages, &guard, start);
        let mut tagged = 0u64;
        let mut lock = self.pages.lock();
        loop {
            if xas.find_marked(end, Tag::Dirty.mark()).is_none() {
                break;
            }
            xas.set_mark(&lock, Tag::Towrite.mark());
            tagged += 1;
            if tagged.is_multiple_of(CHECK_SCHED) {
                xas.pause();
                drop(lock);
                std::thread::yield_now();
                lock = self.pages.lock();
            }
        }
        drop(lock);
        tagged
    }

    /// Start writeback of the folio at `index` (`__folio_start_writeback`):
    /// set WRITEBACK (flag and tag), clear DIRTY (flag and tag), and clear
    /// TOWRITE. False if no folio is cached there.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, FolioFlags, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(0, 0).unwrap());
    /// mapping.add_folio(&folio).unwrap();
    /// mapping.mark_dirty(0);
    /// mapping.tag_for_writeback(0, 0);
    /// assert!(mapping.start_writeback(0));
    /// assert!(folio.test(FolioFlags::WRITEBACK) && !folio.test(FolioFlags::DIRTY));
    /// assert!(mapping.tagged(Tag::Writeback));
    /// assert!(!mapping.tagged(Tag::Dirty) && !mapping.tagged(Tag::Towrite));
    /// ```
    pub fn start_writeback(&self, index: u64) -> bool {
        let lock = self.pages.lock();
        self.with_folio_at(&lock, index, |xas, folio| {
            folio.set(FolioFlags::WRITEBACK);
            folio.clear(FolioFlags::DIRTY);
            xas.set_mark(&lock, Tag::Writeback.mark());
            xas.clear_mark(&lock, Tag::Dirty.mark());
            xas.clear_mark(&lock, Tag::Towrite.mark());
        })
    }

    /// End writeback of the folio at `index` (`__folio_end_writeback`):
    /// clear WRITEBACK (flag and tag). False if no folio is cached there.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, FolioFlags, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(0, 0).unwrap());
    /// mapping.add_folio(&folio).unwrap();
    /// mapping.start_writeback(0);
    /// assert!(mapping.end_writeback(0));
    /// assert!(!folio.test(FolioFlags::WRITEBACK) && !mapping.tagged(Tag::Writeback));
    /// assert!(!mapping.end_writeback(1)); // nothing cached there
    /// ```
    pub fn end_writeback(&self, index: u64) -> bool {
        let lock = self.pages.lock();
        self.with_folio_at(&lock, index, |xas, folio| {
            folio.clear(FolioFlags::WRITEBACK);
            xas.clear_mark(&lock, Tag::Writeback.mark());
        })
    }

    /// The folios in `start..=end` carrying `tag`, in index order, found
    /// lock-free (`filemap_get_folios_tag`); shadows are skipped.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Tag};
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// for (index, order) in [(0, 0), (2, 0), (4, 2)] {
    ///     mapping.add_folio(&Arc::new(Folio::new(index, order).unwrap())).unwrap();
    /// }
    /// mapping.mark_dirty(2);
    /// mapping.mark_dirty(4);
    /// let at = |s, e| -> Vec<u64> {
    ///     mapping.folios_tagged(s, e, Tag::Dirty).iter().map(|f| f.index()).collect()
    /// };
    /// assert_eq!(at(0, 7), [2, 4]);
    /// assert_eq!(at(5, 7), [4]); // the folio covering 4..8 overlaps 5..=7
    /// ```
    pub fn folios_tagged(&self, start: u64, end: u64, tag: Tag) -> Vec<Arc<Folio>> {
        let guard = pin();
        self.pages
            .iter_marked(start..=end, tag.mark(), &guard)
            .filter_map(|(_, e)| e.item().map(|r| r.to_owned()))
            .collect()
    }
}
