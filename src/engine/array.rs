//! The raw array state: the head word, the flags (root marks, allocation, poison),
//! the modification sequence, node count and the writer mutex (taken through
//! [`XaLock`](super::XaLock), in `lock`), plus the lock-free descent every `load`
//! takes.
//!
//! Invariants: `head` holds NULL, the entry for index 0, or the top node; `seq` is
//! bumped under the lock after every write that can move or retype a slot; the
//! lock is the only writer.

use crate::entry::{AtomicEntry, RawEntry};
use crate::guard::{Guard, ProtectsNodes};
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{NodeRef, Shared, CHUNK_MASK, CHUNK_SHIFT};
use crate::sync::{AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};
use core::marker::PhantomData;

pub(crate) const FLAG_MARK_SHIFT: u8 = 0; // bits 0..=2: root marks
pub(crate) const FLAG_TRACK_FREE: u8 = 1 << 3;
pub(crate) const FLAG_ZERO_BUSY: u8 = 1 << 4;
pub(crate) const FLAG_ALLOC_WRAPPED: u8 = 1 << 5;
pub(crate) const FLAG_POISONED: u8 = 1 << 6;
/// Set at construction, never changed: items this array drops wait for a
/// light grace period too (`crate::lightpin`), so a light section may read
/// the target of an item it loaded ([`XArray::load_item_light`]).
pub(crate) const FLAG_LIGHT_ITEMS: u8 = 1 << 7;

/// Array flags (the kernel's `xa_flags` for allocating arrays).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flags(pub(crate) u8);

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
    pub(crate) flags: AtomicU8,
    pub(crate) seq: AtomicU64,
    pub(crate) nodes: AtomicUsize,
    /// The span `create_range` made nodes for under the held lock
    /// (`first > last`: none); nodes in it still empty when the lock is
    /// released are removed then.
    pub(crate) created_first: AtomicU64,
    pub(crate) created_last: AtomicU64,
    pub(crate) lock: Mutex,
    pub(crate) _t: PhantomData<T>,
}

impl<T: Item> Default for XArray<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Item> XArray<T> {
    /// An empty array.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// assert!(xa.is_empty());
    /// ```
    pub fn new() -> Self {
        Self::with_flags(Flags::NONE)
    }

    /// An empty array with flags ([`Flags::ALLOC`] or [`Flags::ALLOC1`] for
    /// ID allocation).
    ///
    /// ```
    /// use kxarray::{Entry, Flags, XArray};
    /// let ids: XArray<Box<u32>> = XArray::with_flags(Flags::ALLOC);
    /// assert_eq!(ids.alloc(0..=9, Some(Entry::Value(1))).unwrap(), 0);
    /// ```
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

    /// An empty array whose items are dropped after a light grace period
    /// as well as crossbeam's, so light sections may read their targets
    /// (the page cache's address spaces: its hit path reads folios under a
    /// light pin).
    pub(crate) fn with_light_items() -> Self {
        let xa = Self::new();
        xa.flags.store(FLAG_LIGHT_ITEMS, Ordering::Relaxed);
        xa
    }

    /// Whether this array's items wait for light readers too.
    #[inline]
    pub(crate) fn light_items(&self) -> bool {
        self.flags() & FLAG_LIGHT_ITEMS != 0
    }

    /// The target of the item at `index`, read in a light section: `None`
    /// for an empty slot, a value, or an array made without light items.
    ///
    /// The reference lives as long as the light pin's borrow: the item's
    /// drop waits for a light grace period after crossbeam's
    /// (`FLAG_LIGHT_ITEMS`), and the section is inside both.
    #[inline(always)]
    pub(crate) fn load_item_light<'p>(
        &'p self,
        index: u64,
        pin: &'p crate::lightpin::LightPin,
    ) -> Option<&'p T::Target> {
        if !self.light_items() {
            return None;
        }
        let e = self.load_raw(index, pin);
        if !e.is_item() {
            return None;
        }
        let p = e.to_item::<T::Target>();
        // SAFETY: an item entry loaded under `pin` from an array with light
        // items: its drop is deferred through crossbeam and then the light
        // limbo (`dispose_item`), so it stays alive while this light section
        // (which began before the item could be unlinked, or saw it linked)
        // lasts; `Item` targets are `Sync`.
        Some(unsafe { p.as_ref() })
    }

    // ---- internal flag helpers ----
    #[inline]
    pub(crate) fn flags(&self) -> u8 {
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
    ///
    /// Context: lock-free; takes no lock and never blocks.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// assert!(!xa.marked(Mark::M0));
    /// xa.set_mark(1, Mark::M0);
    /// assert!(xa.marked(Mark::M0));
    /// ```
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

    /// The lock-free descent, under `guard` (a reader's or the lock's
    /// guard, a light pin, or the unprotected guard on the `&mut` paths).
    #[inline(always)]
    pub(crate) fn load_raw<P: ProtectsNodes>(&self, index: u64, guard: &P) -> RawEntry {
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
            // SAFETY: a node word (`is_node` checked above) read from the head
            // under `guard`; node frees are deferred past it (default collector).
            let mut n = unsafe { NodeRef::<Shared>::from_entry(head, guard) };
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
                    // SAFETY: as above: a node word (`e.is_node()` checked)
                    // read from a slot of a node reached under `guard`.
                    n = unsafe { NodeRef::<Shared>::from_entry(e, guard) };
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

    /// The entry at `index` of an exclusively borrowed array.
    #[inline]
    pub(crate) fn load_excl(&mut self, index: u64) -> RawEntry {
        // SAFETY: `&mut self`: no reader can see the tree, and the guard is
        // used only for this descent.
        let guard: &'static Guard = unsafe { Guard::unprotected() };
        self.load_raw(index, guard)
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
