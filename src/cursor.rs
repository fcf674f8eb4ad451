//! The XaState cursor: the crate's tree engine and the `xas_*` analog.
//!
//! A cursor names a range (`index`, `shift`, `sibs`: an aligned block of
//! `(sibs + 1) << shift` indices) and a position in the tree (`pos` plus
//! `offset`). Reads work lock-free under the epoch guard the cursor borrows;
//! writes take `&XaLock` as proof that the writer lock is held. Successive
//! operations continue from the cursor's position instead of walking from
//! the root again; [`XaState::walks`] counts the descents from the root.
//!
//! Invariants:
//! - Every node pointer in `pos` was read while `guard` was pinned, and nodes
//!   are only freed through the epoch, so dereferencing it is sound for the
//!   cursor's lifetime even if the node has since been detached.
//! - A write operation first re-validates the position: if the tree was
//!   modified (`XArray::seq`: bumped after every store, split and node
//!   change) since the cursor walked, it restarts from the root (the
//!   kernel's `xas_reset` after dropping the lock, made automatic). Only the
//!   writes that cannot change any slot's kind or a node's membership (an
//!   order-0 store into a plain leaf slot, marks) leave the counter alone,
//!   so a position the counter vouches for is exact: never a write through
//!   a slot that has become a sibling or a stale canonical slot.
//! - A panic inside a write (a bug, or an item's `Drop` run inline on the
//!   `&mut` paths) poisons the array ([`XArray::is_poisoned`]) through
//!   [`PoisonOnUnwind`], so a half-written tree is never used again.
//! - Node allocations for one operation happen before the tree is touched
//!   (`reserve`), so a failed allocation leaves the array unchanged.
//! - Nodes preallocated for a split (`split_nodes`) are tagged with the entry
//!   and order they were built for and are used for nothing else; a split
//!   whose entry or order no longer matches frees them instead.

use crate::entry::RawEntry;
use crate::error::{Error, Rejected};
use crate::guard::Guard;
use crate::item::{Entry, EntryRef, Item};
use crate::mark::Mark;
use crate::node::{Node, NodeBox, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};
use crate::xarray::{XArray, XaLock};
use core::ptr::NonNull;

mod range;
mod split;

pub use range::MAX_RANGE_NODES;

/// Where the cursor is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pos {
    /// Not walked yet (`XAS_RESTART`).
    Restart,
    /// The index is outside the tree, or an iteration ran off its end
    /// (`XAS_BOUNDS`).
    Bounds,
    /// At the head: the entry for index 0 is stored in the array itself
    /// (the kernel's `xa_node == NULL`).
    Head,
    /// In a node, at `offset`.
    Node(NonNull<Node>),
    /// An operation failed (`xas_error`).
    Error(Error),
}

/// A cursor over an [`XArray`]: the kernel's `struct xa_state`.
///
/// Reads (`load`, `next`, `find`, …) are lock-free and use the guard given
/// at construction; writes (`store`, `set_mark`, `find_conflict`, `split`,
/// …) take the array's [`XaLock`].
///
/// # Panics
///
/// Write methods panic if given the lock of a different array (a
/// programming error, like a `RefCell` borrowed twice).
///
/// ```
/// use kxarray::{Entry, XArray, XaState};
/// let xa: XArray<Box<u64>> = XArray::new();
/// let guard = kxarray::pin();
/// let lock = xa.lock();
/// let mut xas = XaState::new(&xa, &guard, 100);
/// xas.store(&lock, Some(Entry::Value(7))).unwrap();
/// assert_eq!(xas.load().and_then(|e| e.value()), Some(7));
/// assert_eq!(xas.walks(), 1); // the load reused the store's position
/// ```
pub struct XaState<'a, T: Item> {
    xa: &'a XArray<T>,
    guard: &'a Guard,
    index: u64,
    shift: u8,
    sibs: u8,
    offset: u8,
    pos: Pos,
    /// `XArray::seq` when the current position was established.
    seq: u64,
    walks: u64,
    /// `pos == Bounds` was decided at the root by this walk.
    bounds_at_root: bool,
    /// Preallocated nodes, boxed so that a cursor that allocates nothing
    /// (most of them) stays small and cheap to create and drop.
    pre: Option<Box<Prealloc>>,
}

/// Nodes a cursor holds in reserve.
#[derive(Default)]
struct Prealloc {
    /// Blank nodes reserved for this operation.
    alloc: Vec<NodeBox>,
    /// Nodes the last failed operation needed (for `nomem`).
    need: usize,
    /// Nodes for a split, with the (entry, order) they were made for.
    split_nodes: Vec<NodeBox>,
    split_for: Option<(RawEntry, u32)>,
    /// The split preallocation is for `try_split` (partial) rather than
    /// `split` (uniform).
    split_partial: bool,
}

/// Decoded order: `(shift, sibs)` for an order.
#[inline]
pub(crate) fn order_shape(order: u32) -> (u8, u8) {
    let rem = order % CHUNK_SHIFT;
    ((order - rem) as u8, ((1u32 << rem) - 1) as u8)
}

#[inline]
fn max_index(entry: RawEntry) -> u64 {
    if !entry.is_node() {
        return 0;
    }
    // SAFETY: node entries read from the tree point to live nodes (caller
    // holds the lock or a `Guard`, pinned on the default collector where
    // node frees are deferred).
    let shift = unsafe { entry.to_node().as_ref() }.shift as u32;
    ((CHUNK_SIZE as u64) << shift).wrapping_sub(1)
}

/// Poisons the array if dropped during a panic: armed at the start of a
/// write and defused (`mem::forget`) at its end, so the normal path costs
/// nothing.
pub(crate) struct PoisonOnUnwind<'a, T: Item>(&'a XArray<T>);

impl<'a, T: Item> PoisonOnUnwind<'a, T> {
    #[inline(always)]
    pub(crate) fn arm(xa: &'a XArray<T>) -> Self {
        PoisonOnUnwind(xa)
    }
    #[inline(always)]
    pub(crate) fn defuse(self) {
        core::mem::forget(self);
    }
}

impl<T: Item> Drop for PoisonOnUnwind<'_, T> {
    #[cold]
    fn drop(&mut self) {
        self.0.poison();
    }
}

struct SendPtr(usize);
// SAFETY: only moved into a deferred destructor that frees what it points
// to; the pointee types are Send (items: `Item: Send`; nodes: atomics).
unsafe impl Send for SendPtr {}

impl<'a, T: Item> XaState<'a, T> {
    /// A cursor for the single index `index`, not walked yet.
    #[inline]
    pub fn new(xa: &'a XArray<T>, guard: &'a Guard, index: u64) -> Self {
        XaState {
            xa,
            guard,
            index,
            shift: 0,
            sibs: 0,
            offset: 0,
            pos: Pos::Restart,
            seq: 0,
            walks: 0,
            bounds_at_root: false,
            pre: None,
        }
    }

    /// A cursor for the order-`order` block containing `index` (the index is
    /// rounded down to the order, as `XA_STATE_ORDER` does).
    pub fn with_order(
        xa: &'a XArray<T>,
        guard: &'a Guard,
        index: u64,
        order: u32,
    ) -> Result<Self, Error> {
        let mut xas = Self::new(xa, guard, index);
        xas.set_order(index, order)?;
        Ok(xas)
    }

    /// The array this cursor walks.
    pub fn array(&self) -> &'a XArray<T> {
        self.xa
    }
    /// The guard this cursor reads under.
    pub fn guard(&self) -> &'a Guard {
        self.guard
    }
    /// The current index.
    #[inline]
    pub fn index(&self) -> u64 {
        self.index
    }
    /// The order of the range the cursor operates on.
    pub fn order(&self) -> u32 {
        self.shift as u32 + (self.sibs as u32 + 1).trailing_zeros()
    }
    /// Descents from the root this cursor has made (restarts included).
    #[inline]
    pub fn walks(&self) -> u64 {
        self.walks
    }
    /// The error of the last operation, if it failed (`xas_error`).
    pub fn error(&self) -> Option<Error> {
        match self.pos {
            Pos::Error(e) => Some(e),
            _ => None,
        }
    }
    /// Whether the cursor has not been walked (`XAS_RESTART`).
    pub fn is_restart(&self) -> bool {
        self.pos == Pos::Restart
    }
    /// Whether the cursor ran off the tree (`XAS_BOUNDS`).
    pub fn is_bounds(&self) -> bool {
        self.pos == Pos::Bounds
    }
    /// Whether the cursor sits at the array's head (index 0 held directly).
    pub fn is_head(&self) -> bool {
        self.pos == Pos::Head
    }
    /// The shift of the node the cursor is in, if it is in one.
    pub fn node_shift(&self) -> Option<u32> {
        match self.pos {
            Pos::Node(n) => Some(self.nref(n).shift as u32),
            _ => None,
        }
    }
    /// `(count, nr_values)` of the node the cursor is in (test introspection).
    pub fn node_counts(&self) -> Option<(u32, u32)> {
        match self.pos {
            Pos::Node(n) => {
                let n = self.nref(n);
                Some((n.count() as u32, n.nr_values() as u32))
            }
            _ => None,
        }
    }

    /// Move to `index` (order 0) and forget the position (`xas_set`).
    #[inline]
    pub fn set_index(&mut self, index: u64) {
        self.index = index;
        self.shift = 0;
        self.sibs = 0;
        self.pos = Pos::Restart;
    }

    /// Operate on the order-`order` block containing `index`
    /// (`xas_set_order`); the index is rounded down to the order.
    pub fn set_order(&mut self, index: u64, order: u32) -> Result<(), Error> {
        if order > 63 {
            return Err(Error::OrderTooLarge(order));
        }
        let (shift, sibs) = order_shape(order);
        self.index = index & !((1u64 << order) - 1);
        self.shift = shift;
        self.sibs = sibs;
        self.pos = Pos::Restart;
        Ok(())
    }

    /// Forget the position (and any error): the next operation walks from
    /// the root (`xas_reset`).
    #[inline]
    pub fn reset(&mut self) {
        self.pos = Pos::Restart;
    }

    #[inline(always)]
    fn nref(&self, n: NonNull<Node>) -> &'a Node {
        // SAFETY: `n` was read under `self.guard` (or the lock's guard), a
        // `Guard` pinned on the default collector; nodes are freed only
        // through that collector, so it stays allocated for 'a.
        unsafe { &*n.as_ptr() }
    }

    #[inline]
    fn is_valid(&self) -> bool {
        matches!(self.pos, Pos::Node(_) | Pos::Head)
    }

    #[inline]
    fn set_err(&mut self, e: Error) {
        self.pos = Pos::Error(e);
    }

    #[inline]
    fn size(&self) -> u64 {
        (self.sibs as u64 + 1) << self.shift
    }

    // ------------------------------------------------------------------
    // Walking
    // ------------------------------------------------------------------

    /// Begin a walk (`xas_start`): reload if positioned, else read the head.
    #[inline(always)]
    fn start(&mut self) -> RawEntry {
        if self.is_valid() {
            return self.reload_raw();
        }
        if let Pos::Error(_) = self.pos {
            return RawEntry::NULL;
        }
        self.walks += 1;
        self.seq = self.xa.seq();
        let entry = self.xa.head.load();
        if !entry.is_node() {
            if self.index != 0 {
                return self.set_bounds_root();
            }
        } else if (self.index >> self.nref(entry.to_node()).shift) > CHUNK_MASK {
            return self.set_bounds_root();
        }
        self.pos = Pos::Head;
        entry
    }

    #[inline]
    fn set_bounds_root(&mut self) -> RawEntry {
        self.pos = Pos::Bounds;
        self.bounds_at_root = true;
        RawEntry::NULL
    }

    #[inline]
    fn set_bounds(&mut self) -> RawEntry {
        self.pos = Pos::Bounds;
        self.bounds_at_root = false;
        RawEntry::NULL
    }

    /// Step into `node` at the cursor's index, resolving siblings.
    #[inline(always)]
    fn descend(&mut self, node: NonNull<Node>) -> RawEntry {
        let shift = self.nref(node).shift as u32;
        self.descend_at(node, shift)
    }

    /// `descend` for a node whose shift the caller knows (a child's shift is
    /// its parent's minus CHUNK_SHIFT), so the node's header line is not
    /// touched: one cache line per level, the slot's.
    #[inline(always)]
    fn descend_at(&mut self, node: NonNull<Node>, shift: u32) -> RawEntry {
        let n = self.nref(node);
        debug_assert_eq!(n.shift as u32, shift);
        let mut offset = ((self.index >> shift) & CHUNK_MASK) as usize;
        let mut entry = n.slot(offset);
        self.pos = Pos::Node(node);
        if entry.is_sibling() {
            (entry, offset) = n.resolve_sibling(offset, entry);
        }
        self.offset = offset as u8;
        entry
    }

    /// `xas_load`: walk to the index (never expands the tree).
    #[inline]
    pub(crate) fn load_raw(&mut self) -> RawEntry {
        let mut entry = self.start();
        if !entry.is_node() {
            return entry;
        }
        // Only the first node's header is read; below it shifts step down
        // by CHUNK_SHIFT (they never change once published).
        let mut node = entry.to_node();
        let mut shift = self.nref(node).shift as u32;
        loop {
            if self.shift as u32 > shift {
                break;
            }
            entry = self.descend_at(node, shift);
            if shift == 0 || !entry.is_node() {
                break;
            }
            node = entry.to_node();
            shift -= CHUNK_SHIFT;
        }
        entry
    }

    /// `xas_reload`: re-read the slot at the current position.
    #[inline]
    fn reload_raw(&self) -> RawEntry {
        match self.pos {
            Pos::Head => self.xa.head.load(),
            Pos::Node(n) => {
                let n = self.nref(n);
                let offset = ((self.index >> n.shift) & CHUNK_MASK) as usize;
                let e = n.slot(offset);
                if !e.is_sibling() {
                    return e;
                }
                n.slot(e.to_sibling())
            }
            _ => RawEntry::NULL,
        }
    }

    /// Load the entry at the cursor's index, restarting from the root if a
    /// concurrent writer detached the node the cursor was in.
    #[inline]
    pub fn load(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.load_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: user entries read under `self.guard` (default
            // collector, where item frees are deferred) stay alive for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Re-read the slot the cursor is on without walking (`xas_reload`):
    /// the lock-free "did it change?" check. `Err(Stale)` when the node was
    /// detached (a RETRY entry) or the cursor is not positioned: restart with
    /// [`XaState::reset`] and load again.
    #[inline]
    pub fn reload(&self) -> Result<Option<EntryRef<'a, T>>, Stale> {
        if !self.is_valid() {
            return Err(Stale);
        }
        let e = self.reload_raw();
        if e.is_retry() || e.is_node() {
            return Err(Stale);
        }
        // SAFETY: as in `load`.
        Ok(unsafe { EntryRef::from_raw_opt(e) })
    }

    /// The order of the entry at the cursor (`xas_get_order`), read from the
    /// current node: no walk. Call after `load` or `find_conflict`.
    #[inline]
    pub fn get_order(&self) -> u32 {
        let Pos::Node(node) = self.pos else {
            return 0;
        };
        let n = self.nref(node);
        let mut order = 0u32;
        loop {
            let slot = self.offset as usize + (1usize << order);
            if slot >= CHUNK_SIZE || !n.slot(slot).is_sibling() {
                break;
            }
            order += 1;
        }
        order + n.shift as u32
    }

    // ------------------------------------------------------------------
    // Lock validation
    // ------------------------------------------------------------------

    #[inline]
    fn check_lock(&mut self, lock: &XaLock<'_, T>) {
        assert!(
            core::ptr::eq(lock.array(), self.xa),
            "kxarray: XaState used with the lock of another XArray"
        );
        // The position is still exact if no write that could move or retype
        // its slot happened since it was established; otherwise walk again.
        if self.is_valid() && self.seq != self.xa.seq() {
            self.pos = Pos::Restart;
        }
        if self.pos == Pos::Bounds && self.seq != self.xa.seq() {
            self.bounds_at_root = false;
        }
    }

    /// Whether the position taken before the lock was (re)acquired is still
    /// exact: true when no store, split or node change happened since (only
    /// order-0 stores into plain leaf slots and mark changes, which cannot
    /// move or retype a slot, do not count); otherwise the cursor is reset
    /// so that the next operation walks from the root.
    pub fn revalidate(&mut self, lock: &XaLock<'_, T>) -> bool {
        self.check_lock(lock);
        self.is_valid()
    }

    // ------------------------------------------------------------------
    // Node allocation
    // ------------------------------------------------------------------

    /// Make sure `need` blank nodes are at hand, allocating the rest now.
    /// On failure sets `Error::NoMemory`, remembers `need`, and allocates
    /// nothing.
    fn reserve(&mut self, need: usize) -> bool {
        if self.pre.as_ref().map_or(0, |p| p.alloc.len()) >= need {
            return true;
        }
        let pre = self.pre();
        while pre.alloc.len() < need {
            match Node::alloc(0, 0, None) {
                Some(n) => pre.alloc.push(n),
                None => {
                    pre.need = need;
                    self.set_err(Error::NoMemory);
                    return false;
                }
            }
        }
        true
    }

    /// The cursor's reserve, created on first use.
    fn pre(&mut self) -> &mut Prealloc {
        self.pre.get_or_insert_with(Box::default)
    }

    /// Forget (and free) any split preallocation.
    pub(crate) fn clear_split(&mut self) {
        if let Some(p) = self.pre.as_mut() {
            p.split_nodes.clear();
            p.split_for = None;
            p.split_partial = false;
        }
    }

    /// What the split preallocation was made for: (entry, order, partial).
    pub(crate) fn split_tag(&self) -> Option<(RawEntry, u32, bool)> {
        let p = self.pre.as_ref()?;
        p.split_for.map(|(e, o)| (e, o, p.split_partial))
    }

    pub(crate) fn set_split_tag(&mut self, entry: RawEntry, order: u32, partial: bool) {
        let p = self.pre();
        p.split_for = Some((entry, order));
        p.split_partial = partial;
    }

    pub(crate) fn push_split_node(&mut self, n: NodeBox) {
        self.pre().split_nodes.push(n);
    }

    pub(crate) fn pop_split_node(&mut self) -> NodeBox {
        self.pre
            .as_mut()
            .and_then(|p| p.split_nodes.pop())
            .expect("kxarray: split node preallocated")
    }

    /// Link a reserved node as a child of `parent` at `offset` (not yet
    /// published).
    fn take_node(
        &mut self,
        shift: u32,
        parent: Option<NonNull<Node>>,
        offset: usize,
    ) -> NonNull<Node> {
        let mut nb = self
            .pre
            .as_mut()
            .and_then(|p| p.alloc.pop())
            .expect("kxarray: node reserved before use");
        {
            let n = nb.node_mut();
            n.shift = shift as u8;
            n.offset = offset as u8;
            n.set_parent(parent);
        }
        if let Some(p) = parent {
            self.nref(p).add_count(1);
        }
        self.xa.node_added();
        nb.into_raw()
    }

    /// Free a node detached from the tree once no reader can see it.
    fn free_node(&mut self, node: NonNull<Node>) {
        self.xa.node_removed();
        let p = SendPtr(node.as_ptr() as usize);
        // SAFETY: the node is unreachable; `self.guard` is pinned on the
        // default collector (or is the unprotected guard under `&mut
        // XArray`), the one every reader's `Guard` pins, so readers delay the
        // deferred free until they leave; the closure owns the last reference.
        unsafe {
            self.guard.defer_unchecked(move || {
                let p = p;
                Node::free(NonNull::new_unchecked(p.0 as *mut Node))
            })
        }
    }

    /// Drop a displaced item once no reader can see it.
    pub(crate) fn dispose(&self, e: RawEntry) {
        if e.is_item() {
            dispose_item::<T>(self.guard, e);
        }
    }

    // ------------------------------------------------------------------
    // Create / expand
    // ------------------------------------------------------------------

    /// `xas_max`: the largest index the cursor's range needs.
    fn max_needed(&self) -> u64 {
        let mut max = self.index;
        if self.shift != 0 || self.sibs != 0 {
            let mask = self.size().wrapping_sub(1);
            max |= mask;
            if mask == max {
                max = max.wrapping_add(1);
            }
        }
        max
    }

    /// How many nodes a create from the head needs, counted before any
    /// change: new top levels plus the chain below them.
    fn plan_top(&self, head: RawEntry, allow_root: bool) -> usize {
        let order = self.shift as u32;
        let max = self.max_needed();
        let chain = |top_shift: u32| -> usize {
            // levels top_shift - CHUNK, ..., down to `order`
            if top_shift > order {
                ((top_shift - order) / CHUNK_SHIFT) as usize
            } else {
                0
            }
        };
        if head.is_null() {
            let mut shift = 0;
            if max == 0 {
                return if allow_root { 0 } else { chain(CHUNK_SHIFT) };
            }
            while (max >> shift) >= CHUNK_SIZE as u64 {
                shift += CHUNK_SHIFT;
            }
            return chain(shift + CHUNK_SHIFT);
        }
        // New top levels, as `expand` will add them.
        let mut levels = 0usize;
        let mut shift = if head.is_node() {
            self.nref(head.to_node()).shift as u32 + CHUNK_SHIFT
        } else {
            0
        };
        let mut cur_max = max_index(head);
        while max > cur_max {
            levels += 1;
            cur_max = ((CHUNK_SIZE as u64) << shift).wrapping_sub(1);
            shift += CHUNK_SHIFT;
        }
        if levels > 0 {
            let top_shift = shift - CHUNK_SHIFT;
            let offset = (self.index >> top_shift) & CHUNK_MASK;
            if offset != 0 {
                return levels + chain(top_shift);
            }
        }
        levels
    }

    /// `xas_expand`: grow the tree until the cursor's range fits. Returns the
    /// shift to descend from (top shift + CHUNK_SHIFT, or 0 for the head).
    /// Nodes must have been reserved by `plan_top`.
    fn expand(&mut self, mut head: RawEntry) -> u32 {
        let max = self.max_needed();
        let mut shift = 0u32;
        if head.is_null() {
            if max == 0 {
                return 0;
            }
            while (max >> shift) >= CHUNK_SIZE as u64 {
                shift += CHUNK_SHIFT;
            }
            return shift + CHUNK_SHIFT;
        } else if head.is_node() {
            shift = self.nref(head.to_node()).shift as u32 + CHUNK_SHIFT;
        }
        self.pos = Pos::Head;
        let xa = self.xa;
        while max > max_index(head) {
            let node = self.take_node(shift, None, 0);
            let n = self.nref(node);
            n.set_count(1);
            if head.is_value() {
                n.set_nr_values(1);
            }
            n.slots[0].init(head);
            for mark in Mark::ALL {
                if xa.track_free() && mark == Mark::FREE {
                    n.mark_all(Mark::FREE);
                    if !xa.marked(Mark::FREE) {
                        n.clear_mark(0, Mark::FREE);
                        xa.mark_set(Mark::FREE);
                    }
                } else if xa.marked(mark) {
                    n.set_mark(0, mark);
                }
            }
            if head.is_node() {
                self.nref(head.to_node()).set_parent(Some(node));
            }
            head = RawEntry::node(node);
            xa.head.store(head);
            xa.bump_seq();
            shift += CHUNK_SHIFT;
        }
        shift
    }

    /// `xas_create`: make the slot(s) for the cursor's range exist and return
    /// what is there now. NULL with an error set if allocation failed (in
    /// which case nothing was changed).
    fn create(&mut self, allow_root: bool) -> RawEntry {
        let order = self.shift as u32;
        let xa = self.xa;
        let mut shift: u32;
        let mut entry: RawEntry;
        let mut parent: Option<NonNull<Node>>;
        match self.pos {
            Pos::Restart | Pos::Bounds | Pos::Head => {
                // At the head already (or continuing a root visit that found
                // the index outside the tree): not a new walk.
                let continuing = self.pos == Pos::Head
                    || (self.pos == Pos::Bounds && self.bounds_at_root && self.seq == xa.seq());
                if !continuing {
                    self.walks += 1;
                }
                self.bounds_at_root = false;
                let mut head = xa.head.load_locked();
                if head.is_node() && self.max_needed() <= max_index(head) {
                    // The range fits under the current top node: no
                    // expansion to plan (the common case of a store).
                    shift = self.nref(head.to_node()).shift as u32 + CHUNK_SHIFT;
                } else {
                    if head.is_null() && xa.zero_busy() {
                        head = RawEntry::ZERO;
                    }
                    let need = self.plan_top(head, allow_root);
                    if !self.reserve(need) {
                        return RawEntry::NULL;
                    }
                    self.pos = Pos::Head;
                    shift = self.expand(head);
                    if shift == 0 && !allow_root {
                        shift = CHUNK_SHIFT;
                    }
                    head = xa.head.load_locked();
                }
                self.pos = Pos::Head;
                self.seq = xa.seq();
                // A top node made below sits at offset 0, whatever offset a
                // stale position left behind.
                self.offset = 0;
                entry = head;
                parent = None;
            }
            Pos::Error(_) => return RawEntry::NULL,
            Pos::Node(node) => {
                let n = self.nref(node);
                shift = n.shift as u32;
                entry = n.slot_locked(self.offset as usize);
                parent = Some(node);
            }
        }
        while shift > order {
            shift -= CHUNK_SHIFT;
            let node;
            if entry.is_null() {
                let need = ((shift - order) / CHUNK_SHIFT + 1) as usize;
                if !self.reserve(need) {
                    return RawEntry::NULL;
                }
                node = self.take_node(shift, parent, self.offset as usize);
                if xa.track_free() {
                    self.nref(node).mark_all(Mark::FREE);
                }
                match parent {
                    Some(p) => self
                        .nref(p)
                        .set_slot(self.offset as usize, RawEntry::node(node)),
                    None => xa.head.store(RawEntry::node(node)),
                }
                xa.bump_seq();
                self.seq = xa.seq();
            } else if entry.is_node() {
                node = entry.to_node();
            } else {
                break;
            }
            entry = self.descend(node);
            parent = Some(node);
        }
        entry
    }

    // ------------------------------------------------------------------
    // Store
    // ------------------------------------------------------------------

    /// `xas_store`. Returns the entry that was at the first slot of the range
    /// (NOT disposed: the caller owns it); every other displaced item and
    /// node is disposed of here.
    pub(crate) fn store_raw(&mut self, entry: RawEntry) -> RawEntry {
        let bomb = PoisonOnUnwind::arm(self.xa);
        let r = self.store_raw_inner(entry);
        bomb.defuse();
        r
    }

    fn store_raw_inner(&mut self, entry: RawEntry) -> RawEntry {
        let value = entry.is_value();
        let mut first = if !entry.is_null() {
            let allow_root = !entry.is_node() && !entry.is_zero();
            self.create(allow_root)
        } else {
            self.load_raw()
        };
        let node = match self.pos {
            Pos::Node(n) => Some(n),
            Pos::Head => None,
            _ => return first,
        };
        if let Some(n) = node {
            if (self.shift) < self.nref(n).shift {
                self.sibs = 0;
            }
        }
        if first == entry && self.sibs == 0 {
            return first;
        }
        let ret = first;
        let mut next = first;
        let mut offset = self.offset as usize;
        let max = offset + self.sibs as usize;
        if let Some(n) = node {
            if self.sibs != 0 {
                self.squash_marks(n);
            }
        }
        if entry.is_null() {
            self.init_marks_raw();
        }
        let mut cur = entry;
        let mut count: i32 = 0;
        let mut values: i32 = 0;
        let mut first_slot = true;
        let mut last_written: usize;
        loop {
            if !first_slot && next.is_item() {
                self.dispose(next);
            }
            match node {
                Some(n) => self.nref(n).set_slot(offset, cur),
                None => self.xa.head.store(cur),
            }
            last_written = offset;
            crate::fault::slot_written();
            if next.is_node() && node.is_none_or(|n| self.nref(n).shift != 0) {
                self.free_nodes(next.to_node());
                self.xa.bump_seq();
            }
            let Some(n) = node else { break };
            let n = self.nref(n);
            count += next.is_null() as i32 - cur.is_null() as i32;
            values += (!first.is_value()) as i32 - (!value) as i32;
            if !cur.is_null() {
                if offset == max {
                    break;
                }
                if !cur.is_sibling() {
                    cur = RawEntry::sibling(self.offset as usize);
                }
            } else if offset == CHUNK_MASK as usize {
                break;
            }
            offset += 1;
            next = n.slot_locked(offset);
            if !next.is_sibling() {
                if cur.is_null() && offset > max {
                    break;
                }
                first = next;
            }
            first_slot = false;
        }
        // A store into part of a larger entry rewrote only its first slots
        // (`sibs` was cut to the range); its remaining siblings now belong to
        // the new entry, so they change kind with it (`nr_values` counts the
        // siblings of value entries). The kernel leaves this count stale.
        if !cur.is_null() {
            if let Some(n) = node {
                let n = self.nref(n);
                let sib = RawEntry::sibling(self.offset as usize);
                let mut o = offset + 1;
                while o < CHUNK_SIZE && n.slot_locked(o) == sib {
                    values += (!first.is_value()) as i32 - (!value) as i32;
                    o += 1;
                }
            }
        }
        // Erasing a multi-index entry on an allocating array frees its
        // sibling slots too: mark them free, as `init_marks_raw` did the
        // canonical slot (and its ancestors). The kernel's `xas_store` marks
        // only the canonical slot, so `xa_alloc` never again hands out the
        // indices under the old siblings while the node lives (see the
        // README's deliberate differences).
        if entry.is_null() && self.xa.track_free() {
            if let Some(n) = node {
                let n = self.nref(n);
                for o in self.offset as usize + 1..=last_written {
                    n.set_mark(o, Mark::FREE);
                }
            }
        }
        self.update_node(node, count, values);
        // Every other cursor's position may be stale now (a slot became or
        // stopped being a sibling, a canonical slot moved, a node went):
        // bump after the last write, so a lock-free walk that read the old
        // counter is re-done. This cursor's own position is exact.
        self.xa.bump_seq();
        self.seq = self.xa.seq();
        ret
    }

    fn update_node(&mut self, node: Option<NonNull<Node>>, count: i32, values: i32) {
        let Some(node) = node else { return };
        let n = self.nref(node);
        if count != 0 || values != 0 {
            n.add_count(count);
            n.add_nr_values(values);
            if count < 0 {
                self.delete_node();
                return;
            }
        }
        // A top node holding only slot 0 whose entry was just replaced (a
        // reserved index 0 that a store has filled) shrinks into the head,
        // as an erase would leave it; a reserved entry stays in its leaf.
        // (Not after an insert into an empty slot: `create_range`'s nodes
        // must stay until the stores that follow it fill them.)
        if count == 0 && n.parent().is_none() && n.count() == 1 {
            let s0 = n.slot_locked(0);
            if !s0.is_null() && !s0.is_zero() {
                self.pos = Pos::Node(node);
                self.shrink();
            }
        }
    }

    /// `xas_delete_node`: free empty nodes upwards, then shrink.
    fn delete_node(&mut self) {
        let Pos::Node(mut node) = self.pos else {
            return;
        };
        loop {
            let n = self.nref(node);
            if n.count() != 0 {
                break;
            }
            let parent = n.parent();
            self.offset = n.offset;
            self.free_node(node);
            self.xa.bump_seq();
            match parent {
                None => {
                    self.xa.head.store(RawEntry::NULL);
                    self.pos = Pos::Bounds;
                    self.bounds_at_root = false;
                    return;
                }
                Some(p) => {
                    self.pos = Pos::Node(p);
                    let pn = self.nref(p);
                    pn.set_slot(self.offset as usize, RawEntry::NULL);
                    pn.add_count(-1);
                    node = p;
                }
            }
        }
        if self.nref(node).parent().is_none() {
            self.pos = Pos::Node(node);
            self.shrink();
        }
    }

    /// `xas_shrink`: remove top nodes that only hold slot 0.
    fn shrink(&mut self) {
        let Pos::Node(mut node) = self.pos else {
            return;
        };
        let xa = self.xa;
        loop {
            let n = self.nref(node);
            if n.count() != 1 {
                break;
            }
            let mut entry = n.slot_locked(0);
            if entry.is_null() {
                break;
            }
            if !entry.is_node() && n.shift != 0 {
                break;
            }
            if xa.zero_busy() {
                entry = entry.zero_to_null();
            }
            self.pos = Pos::Bounds;
            self.bounds_at_root = false;
            xa.head.store(entry);
            if xa.track_free() && !n.get_mark(0, Mark::FREE) {
                xa.mark_clear(Mark::FREE);
            }
            n.set_count(0);
            n.set_nr_values(0);
            if !entry.is_node() {
                n.set_slot(0, RawEntry::RETRY);
            }
            self.free_node(node);
            xa.bump_seq();
            if !entry.is_node() {
                break;
            }
            node = entry.to_node();
            self.nref(node).set_parent(None);
        }
    }

    /// `xas_free_nodes`: free a detached subtree, leaving RETRY behind for
    /// readers still inside it and disposing of its items.
    fn free_nodes(&mut self, top: NonNull<Node>) {
        let mut node = top;
        let mut offset = 0usize;
        loop {
            let n = self.nref(node);
            let entry = n.slot_locked(offset);
            if n.shift != 0 && entry.is_node() {
                node = entry.to_node();
                offset = 0;
                continue;
            }
            if !entry.is_null() {
                self.dispose(entry);
                n.set_slot(offset, RawEntry::RETRY);
            }
            offset += 1;
            while offset == CHUNK_SIZE {
                let n = self.nref(node);
                let parent = n.parent();
                offset = n.offset as usize + 1;
                n.set_count(0);
                n.set_nr_values(0);
                let done = node == top;
                self.free_node(node);
                if done {
                    return;
                }
                node = parent.expect("kxarray: subtree node without parent");
            }
        }
    }

    /// Store `entry` over the cursor's range (`xas_store`). Returns the entry
    /// previously at the cursor's index, still readable for the cursor's
    /// lifetime (its drop is deferred through the epoch). On failure the entry
    /// comes back in [`Rejected`] and the array is unchanged.
    ///
    /// Storing over part of a larger entry replaces it for all its indices,
    /// keeping its shape; storing `None` erases the whole entry.
    pub fn store(
        &mut self,
        lock: &XaLock<'_, T>,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'a, T>>, Rejected<T>> {
        self.check_lock(lock);
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let old = self.store_raw(raw);
        if let Some(err) = self.error() {
            let back = (!raw.is_null()).then(|| {
                // SAFETY: `raw` was never published (create failed first).
                unsafe { Entry::from_raw(raw) }
            });
            return Err(Rejected::new(err, back));
        }
        if !old.is_user() {
            return Ok(None);
        }
        self.dispose(old);
        // SAFETY: disposal is deferred through `self.guard` into the default
        // collector it is pinned on, for 'a.
        Ok(unsafe { EntryRef::from_raw_opt(old) })
    }

    /// The common store, fast: an order-0 item or value into a slot of an
    /// existing leaf. One locked descent, one slot write, the leaf's counts;
    /// marks are untouched (as `xas_store` leaves them for a non-NULL entry).
    /// Returns `None` when the case is not that simple; the cursor is then
    /// either positioned where the descent stopped (so `store_raw` carries on
    /// without another walk) or reset.
    #[inline]
    pub(crate) fn store_fast(&mut self, entry: RawEntry) -> Option<RawEntry> {
        if self.shift != 0 || self.sibs != 0 || !entry.is_user() || self.pos != Pos::Restart {
            return None;
        }
        let xa = self.xa;
        let head = xa.head.load_locked();
        if !head.is_node() {
            return None;
        }
        let mut node = head.to_node();
        let mut n = self.nref(node);
        let mut shift = n.shift as u32;
        if (self.index >> shift) > CHUNK_MASK {
            return None; // needs expansion: the general path walks
        }
        self.walks += 1;
        self.seq = xa.seq();
        self.bounds_at_root = false;
        loop {
            let off = ((self.index >> shift) & CHUNK_MASK) as usize;
            let e = n.slot_locked(off);
            if shift == 0 {
                self.pos = Pos::Node(node);
                self.offset = off as u8;
                if e.is_internal() {
                    // sibling, reserved or retry: let store_raw decide
                    if e.is_sibling() {
                        self.pos = Pos::Restart;
                        self.walks -= 1;
                    }
                    return None;
                }
                if off + 1 < CHUNK_SIZE && n.slot_locked(off + 1) == RawEntry::sibling(off) {
                    // the canonical slot of a multi-index entry: its
                    // siblings change kind with it, store_raw accounts them
                    return None;
                }
                n.set_slot(off, entry);
                if e.is_null() {
                    n.add_count(1);
                }
                let dv = entry.is_value() as i32 - e.is_value() as i32;
                if dv != 0 {
                    n.add_nr_values(dv);
                }
                return Some(e);
            }
            if !e.is_node() {
                if e.is_null() {
                    // a missing subtree: create() continues from here
                    self.pos = Pos::Node(node);
                    self.offset = off as u8;
                } else {
                    // a multi-index entry above the leaves
                    self.pos = Pos::Restart;
                    self.walks -= 1;
                }
                return None;
            }
            node = e.to_node();
            n = self.nref(node);
            shift -= CHUNK_SHIFT;
        }
    }

    /// Store through an exclusive borrow: the old entry is returned owned.
    pub(crate) fn store_owned(&mut self, raw: RawEntry) -> Result<RawEntry, Error> {
        if let Some(old) = self.store_fast(raw) {
            return Ok(old);
        }
        let old = self.store_raw(raw);
        match self.error() {
            Some(e) => Err(e),
            None => Ok(old),
        }
    }

    /// Allocate the nodes the last operation failed for, outside the lock
    /// (`xas_nomem`). Returns true if the caller should retry (the cursor was
    /// reset); false if there was no memory error or allocation failed again.
    pub fn nomem(&mut self) -> bool {
        if self.pos != Pos::Error(Error::NoMemory) {
            if let Some(p) = self.pre.as_mut() {
                p.alloc.clear();
            }
            return false;
        }
        let pre = self.pre();
        let need = pre.need.max(1);
        while pre.alloc.len() < need {
            match Node::alloc(0, 0, None) {
                Some(n) => pre.alloc.push(n),
                None => return false,
            }
        }
        self.pos = Pos::Restart;
        true
    }

    /// Free every node this cursor preallocated (`xas_destroy`).
    pub fn destroy(&mut self) {
        self.pre = None;
    }

    /// Nodes preallocated and not yet used (blank plus split nodes).
    pub fn preallocated(&self) -> usize {
        self.pre
            .as_ref()
            .map_or(0, |p| p.alloc.len() + p.split_nodes.len())
    }

    // ------------------------------------------------------------------
    // Marks
    // ------------------------------------------------------------------

    /// Whether the entry at the cursor has `mark` (`xas_get_mark`).
    #[inline]
    pub fn get_mark(&self, mark: Mark) -> bool {
        match self.pos {
            Pos::Head => self.xa.marked(mark),
            Pos::Node(n) => self.nref(n).get_mark(self.offset as usize, mark),
            _ => false,
        }
    }

    pub(crate) fn set_mark_raw(&self, mark: Mark) {
        let mut offset = self.offset as usize;
        let mut node = match self.pos {
            Pos::Node(n) => Some(n),
            Pos::Head => None,
            _ => return,
        };
        while let Some(n) = node {
            let nr = self.nref(n);
            if nr.set_mark(offset, mark) {
                return;
            }
            offset = nr.offset as usize;
            node = nr.parent();
        }
        self.xa.mark_set(mark);
    }

    pub(crate) fn clear_mark_raw(&self, mark: Mark) {
        let mut offset = self.offset as usize;
        let mut node = match self.pos {
            Pos::Node(n) => Some(n),
            Pos::Head => None,
            _ => return,
        };
        while let Some(n) = node {
            let nr = self.nref(n);
            if !nr.clear_mark(offset, mark) {
                return;
            }
            if nr.any_mark(mark) {
                return;
            }
            offset = nr.offset as usize;
            node = nr.parent();
        }
        self.xa.mark_clear(mark);
    }

    fn init_marks_raw(&self) {
        for mark in Mark::ALL {
            if self.xa.track_free() && mark == Mark::FREE {
                self.set_mark_raw(mark);
            } else {
                self.clear_mark_raw(mark);
            }
        }
    }

    fn squash_marks(&self, node: NonNull<Node>) {
        let n = self.nref(node);
        let off = self.offset as usize;
        let sibs = self.sibs as usize;
        let range: u64 = if sibs + 1 >= 64 {
            u64::MAX
        } else {
            ((1u64 << sibs) - 1) << (off + 1)
        };
        for mark in Mark::ALL {
            let w = n.marks(mark);
            if w & range != 0 {
                n.set_marks_word(mark, (w | (1 << off)) & !range);
            }
        }
    }

    /// Set `mark` on the entry at the cursor and its ancestors
    /// (`xas_set_mark`). Walks to the index first if the cursor is not
    /// positioned; does nothing on an empty slot.
    pub fn set_mark(&mut self, lock: &XaLock<'_, T>, mark: Mark) {
        self.check_lock(lock);
        if !self.is_valid() {
            let e = self.load_raw();
            if !e.is_user() && !e.is_zero() {
                return;
            }
        }
        self.set_mark_raw(mark);
    }

    /// Clear `mark` on the entry at the cursor, and on ancestors that no
    /// longer have a marked entry below them (`xas_clear_mark`).
    pub fn clear_mark(&mut self, lock: &XaLock<'_, T>, mark: Mark) {
        self.check_lock(lock);
        if !self.is_valid() {
            let e = self.load_raw();
            if !e.is_user() && !e.is_zero() {
                return;
            }
        }
        self.clear_mark_raw(mark);
    }

    /// Clear every mark of the entry at the cursor (`xas_init_marks`).
    pub fn init_marks(&mut self, lock: &XaLock<'_, T>) {
        self.check_lock(lock);
        if !self.is_valid() {
            self.load_raw();
        }
        self.init_marks_raw();
    }

    // ------------------------------------------------------------------
    // Iteration
    // ------------------------------------------------------------------

    #[inline]
    fn move_index(&mut self, n: &Node, offset: u64) {
        let shift = n.shift as u32;
        // the kernel's `~XA_CHUNK_MASK << shift`: clears the bits below the
        // node's offset too, so the index lands on the slot's first index
        self.index &= (!CHUNK_MASK) << shift;
        self.index = self.index.wrapping_add(offset << shift);
    }

    /// `xas_find`, raw: may return RETRY and ZERO entries.
    pub(crate) fn find_raw(&mut self, max: u64) -> RawEntry {
        match self.pos {
            Pos::Error(_) | Pos::Bounds => return RawEntry::NULL,
            _ => {}
        }
        if self.index > max {
            return self.set_bounds();
        }
        match self.pos {
            Pos::Head => {
                self.index = 1;
                return self.set_bounds();
            }
            Pos::Restart => {
                let entry = self.load_raw();
                if !entry.is_null() || !matches!(self.pos, Pos::Node(_)) {
                    return entry;
                }
            }
            Pos::Node(node) => {
                let n = self.nref(node);
                if self.offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
                    if n.shift == 0 {
                        self.offset = (((self.index.wrapping_sub(1)) & CHUNK_MASK) + 1) as u8;
                    } else {
                        self.offset = ((self.index >> n.shift) & CHUNK_MASK) as u8;
                    }
                }
            }
            _ => {}
        }
        let Pos::Node(mut node) = self.pos else {
            return RawEntry::NULL;
        };
        // xas_next_offset
        self.offset += 1;
        self.move_index(self.nref(node), self.offset as u64);
        loop {
            if self.index > max {
                break;
            }
            let n = self.nref(node);
            if self.offset as usize == CHUNK_SIZE {
                self.offset = n.offset + 1;
                match n.parent() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                        continue;
                    }
                    None => {
                        self.pos = Pos::Bounds;
                        self.bounds_at_root = false;
                        return RawEntry::NULL;
                    }
                }
            }
            let entry = n.slot(self.offset as usize);
            if entry.is_node() {
                node = entry.to_node();
                self.pos = Pos::Node(node);
                self.offset = 0;
                continue;
            }
            if !entry.is_null() && !entry.is_sibling() {
                return entry;
            }
            self.offset += 1;
            self.move_index(n, self.offset as u64);
            if self.index == 0 && self.offset as usize == CHUNK_SIZE {
                // wrapped past u64::MAX
                self.pos = Pos::Bounds;
                self.bounds_at_root = false;
                return RawEntry::NULL;
            }
        }
        RawEntry::NULL
    }

    /// The leaf the cursor sits on, for an iterator that scans its slots
    /// directly: `(leaf, current offset, last offset to scan, index of slot
    /// 0)`, the last offset bounded by `max`. `None` unless the cursor is on
    /// an entry in a leaf.
    #[inline]
    pub(crate) fn leaf_window(&self, max: u64) -> Option<(&'a Node, usize, usize, u64)> {
        let Pos::Node(n) = self.pos else { return None };
        let n = self.nref(n);
        if n.shift != 0 || self.offset as u64 != self.index & CHUNK_MASK || self.index > max {
            return None;
        }
        let base = self.index & !CHUNK_MASK;
        let last = (max - base).min(CHUNK_MASK);
        Some((n, self.offset as usize, last as usize, base))
    }

    /// Move the cursor to `offset` of the leaf it is on (after an iterator
    /// scanned the leaf directly).
    #[inline]
    pub(crate) fn set_leaf_offset(&mut self, offset: usize) {
        self.offset = offset as u8;
        self.index = (self.index & !CHUNK_MASK) | offset as u64;
    }

    /// `xas_next_entry`: the inline fast path of iteration within a leaf.
    #[inline(always)]
    fn next_entry_raw(&mut self, max: u64) -> RawEntry {
        if let Pos::Node(node) = self.pos {
            let n = self.nref(node);
            if n.shift == 0 && self.offset as u64 == self.index & CHUNK_MASK {
                loop {
                    if self.index >= max || self.offset as u64 == CHUNK_MASK {
                        break;
                    }
                    let entry = n.slot(self.offset as usize + 1);
                    if entry.is_internal() {
                        break;
                    }
                    self.offset += 1;
                    self.index += 1;
                    if !entry.is_null() {
                        return entry;
                    }
                }
            }
        }
        self.find_raw(max)
    }

    /// The next present entry at or after the cursor's index, up to `max`
    /// (`xas_find`). On an unwalked cursor this returns the entry at the
    /// index itself; on a walked one it moves past the current entry. The
    /// entry's index is then [`XaState::index`]. Multi-index entries are
    /// returned once.
    #[inline]
    pub fn find(&mut self, max: u64) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.next_entry_raw(max);
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            if e.is_zero() {
                continue;
            }
            // SAFETY: user entries read under `self.guard` (default
            // collector, where item frees are deferred) live for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// The next entry with `mark` at or after the index, up to `max`
    /// (`xas_find_marked`).
    pub fn find_marked(&mut self, max: u64, mark: Mark) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.find_marked_raw(max, mark);
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            if e.is_zero() {
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    #[inline]
    fn find_chunk(n: &Node, offset: usize, advance: bool, mark: Mark) -> usize {
        let offset = offset + advance as usize;
        if offset < CHUNK_SIZE {
            let data = n.marks(mark) & (u64::MAX << offset);
            if data != 0 {
                return data.trailing_zeros() as usize;
            }
        }
        CHUNK_SIZE
    }

    /// `xas_find_marked`, raw.
    pub(crate) fn find_marked_raw(&mut self, max: u64, mark: Mark) -> RawEntry {
        let xa = self.xa;
        let mut advance = true;
        let mut climbed = false;
        if let Pos::Error(_) = self.pos {
            return RawEntry::NULL;
        }
        if self.index > max {
            self.pos = Pos::Restart;
            return RawEntry::NULL;
        }
        let mut node;
        match self.pos {
            Pos::Head => {
                self.index = 1;
                return self.find_marked_out(max);
            }
            Pos::Restart | Pos::Bounds => {
                advance = false;
                self.walks += 1;
                self.seq = xa.seq();
                let entry = xa.head.load();
                self.pos = Pos::Head;
                if self.index > max_index(entry) {
                    return self.find_marked_out(max);
                }
                if !entry.is_node() {
                    if xa.marked(mark) {
                        return entry;
                    }
                    self.index = 1;
                    return self.find_marked_out(max);
                }
                node = entry.to_node();
                self.pos = Pos::Node(node);
                self.offset = (self.index >> self.nref(node).shift) as u8;
            }
            Pos::Node(n) => node = n,
            Pos::Error(_) => unreachable!(),
        }
        while self.index <= max {
            let n = self.nref(node);
            if self.offset as usize == CHUNK_SIZE {
                self.offset = n.offset + 1;
                match n.parent() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                    }
                    None => break,
                }
                advance = false;
                climbed = true;
                continue;
            }
            if !advance {
                let entry = n.slot(self.offset as usize);
                if entry.is_sibling() {
                    if climbed {
                        // Just climbed out of the child at the previous
                        // slot: a sibling here belongs to an entry stored
                        // over that child meanwhile, which lies behind the
                        // cursor. Moving back to it would make a lock-free
                        // walk go backwards; step past it instead.
                        advance = true;
                    } else {
                        self.offset = entry.to_sibling() as u8;
                        self.move_index(n, self.offset as u64);
                    }
                }
            }
            climbed = false;
            let offset = Self::find_chunk(n, self.offset as usize, advance, mark);
            if offset > self.offset as usize {
                advance = false;
                self.move_index(n, offset as u64);
                // mind the wrap
                if self.index.wrapping_sub(1) >= max {
                    self.pos = Pos::Restart;
                    return RawEntry::NULL;
                }
                self.offset = offset as u8;
                if offset == CHUNK_SIZE {
                    continue;
                }
            }
            let entry = n.slot(self.offset as usize);
            if entry.is_null() && !(xa.track_free() && mark == Mark::FREE) {
                advance = true;
                continue;
            }
            if entry.is_sibling() {
                advance = true;
                continue;
            }
            if !entry.is_node() {
                return entry;
            }
            node = entry.to_node();
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> self.nref(node).shift) & CHUNK_MASK) as u8;
        }
        self.find_marked_out(max)
    }

    fn find_marked_out(&mut self, max: u64) -> RawEntry {
        if self.index > max {
            self.pos = Pos::Restart;
            return RawEntry::NULL;
        }
        self.set_bounds()
    }

    /// Move to the next index and return its entry (`xas_next`); wraps from
    /// `u64::MAX` to 0. On an unwalked cursor, loads the current index
    /// without moving.
    #[allow(clippy::should_implement_trait)] // the kernel's name, not an Iterator
    pub fn next(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.next_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Move to the previous index and return its entry (`xas_prev`); wraps
    /// from 0 to `u64::MAX`.
    pub fn prev(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.prev_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    fn frozen(&self) -> bool {
        matches!(self.pos, Pos::Restart | Pos::Error(_))
    }

    pub(crate) fn next_raw(&mut self) -> RawEntry {
        // inline fast path
        if let Pos::Node(node) = self.pos {
            let n = self.nref(node);
            if n.shift == 0
                && (self.offset as u64) < CHUNK_MASK
                && self.offset as u64 == self.index & CHUNK_MASK
            {
                self.index += 1;
                self.offset += 1;
                return n.slot(self.offset as usize);
            }
        }
        if !self.frozen() {
            self.index = self.index.wrapping_add(1);
            // Stepping off the top of the index space. The kernel relies on
            // climbing past the top node's last slot instead, which a full
            // height tree (a 64-slot top node at shift 60 uses 16 slots)
            // never reaches: it went on reading slots 16.. of the top node
            // while its index counted 0, 1, 2... (a deliberate difference).
            if self.index == 0 && matches!(self.pos, Pos::Node(_)) {
                return self.set_bounds();
            }
        }
        let node = match self.pos {
            Pos::Head => return self.set_bounds(),
            Pos::Node(n) => n,
            _ => return self.load_raw(),
        };
        let mut node = node;
        let n = self.nref(node);
        if self.offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
            self.offset += 1;
        }
        while self.offset as usize == CHUNK_SIZE {
            let n = self.nref(node);
            self.offset = n.offset + 1;
            match n.parent() {
                Some(p) => {
                    node = p;
                    self.pos = Pos::Node(p);
                }
                None => return self.set_bounds(),
            }
        }
        loop {
            let n = self.nref(node);
            let entry = n.slot(self.offset as usize);
            if !entry.is_node() {
                return entry;
            }
            node = entry.to_node();
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> self.nref(node).shift) & CHUNK_MASK) as u8;
        }
    }

    pub(crate) fn prev_raw(&mut self) -> RawEntry {
        if let Pos::Node(node) = self.pos {
            let n = self.nref(node);
            if n.shift == 0 && self.offset != 0 && self.offset as u64 == self.index & CHUNK_MASK {
                self.index -= 1;
                self.offset -= 1;
                return n.slot(self.offset as usize);
            }
        }
        if !self.frozen() {
            self.index = self.index.wrapping_sub(1);
            // Stepping off the bottom of the index space (see `next_raw`).
            if self.index == u64::MAX && matches!(self.pos, Pos::Node(_)) {
                return self.set_bounds();
            }
        }
        let node = match self.pos {
            Pos::Head => return self.set_bounds(),
            Pos::Node(n) => n,
            _ => return self.load_raw(),
        };
        let mut node = node;
        let n = self.nref(node);
        // offset as i32 to model the kernel's 255 wrap
        let mut offset = self.offset as i32;
        if offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
            offset -= 1;
        }
        while offset == -1 {
            let n = self.nref(node);
            offset = n.offset as i32 - 1;
            match n.parent() {
                Some(p) => {
                    node = p;
                    self.pos = Pos::Node(p);
                }
                None => return self.set_bounds(),
            }
        }
        self.offset = offset as u8;
        loop {
            let n = self.nref(node);
            let entry = n.slot(self.offset as usize);
            if !entry.is_node() {
                return entry;
            }
            node = entry.to_node();
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> self.nref(node).shift) & CHUNK_MASK) as u8;
        }
    }

    /// Prepare to drop the lock (or guard) mid-iteration (`xas_pause`): the
    /// index moves past the current entry and its siblings and the position
    /// is forgotten, so the next `find` resumes correctly.
    pub fn pause(&mut self) {
        let node = match self.pos {
            Pos::Node(n) => n,
            Pos::Head => {
                self.pos = Pos::Restart;
                self.index = self.index.wrapping_add(1);
                return;
            }
            _ => return,
        };
        self.pos = Pos::Restart;
        let n = self.nref(node);
        let mut offset = self.offset as usize;
        loop {
            offset += 1;
            if offset >= CHUNK_SIZE || !n.slot(offset).is_sibling() {
                break;
            }
        }
        // Resume at the slot after the entry, counted from the node's first
        // index. The kernel adds `offset - xa_offset` to the index instead,
        // which overshoots (skipping entries) when a load left the index
        // inside a multi-index entry past its canonical slot; see the
        // README's deliberate differences.
        let shift = n.shift as u32;
        let node_span_bits = shift + CHUNK_SHIFT;
        let base = if node_span_bits >= 64 {
            0
        } else {
            self.index & (u64::MAX << node_span_bits)
        };
        self.index = base.wrapping_add((offset as u64) << shift);
        if self.index == 0 {
            self.pos = Pos::Bounds;
            self.bounds_at_root = false;
        }
    }

    /// An iterator over the present entries from the cursor's index to
    /// `max` (inclusive), yielding `(index, entry)` (`xas_for_each`).
    pub fn iter<'c>(&'c mut self, max: u64) -> CursorIter<'c, 'a, T> {
        CursorIter { xas: self, max }
    }

    // ------------------------------------------------------------------
    // Conflicts
    // ------------------------------------------------------------------

    /// `xas_find_conflict`, raw.
    pub(crate) fn find_conflict_raw(&mut self) -> RawEntry {
        match self.pos {
            Pos::Error(_) | Pos::Head => return RawEntry::NULL,
            Pos::Restart | Pos::Bounds => {
                self.pos = Pos::Restart;
                let mut curr = self.start();
                if curr.is_null() {
                    return RawEntry::NULL;
                }
                while curr.is_node() {
                    curr = self.descend(curr.to_node());
                }
                if !curr.is_null() {
                    return curr;
                }
            }
            Pos::Node(_) => {}
        }
        let Pos::Node(mut node) = self.pos else {
            return RawEntry::NULL;
        };
        if self.nref(node).shift > self.shift {
            return RawEntry::NULL;
        }
        loop {
            let n = self.nref(node);
            if n.shift == self.shift {
                if (self.offset & self.sibs) == self.sibs {
                    break;
                }
            } else if self.offset as u64 == CHUNK_MASK {
                self.offset = n.offset;
                match n.parent() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                        continue;
                    }
                    None => {
                        self.pos = Pos::Head;
                        break;
                    }
                }
            }
            self.offset += 1;
            let mut curr = self.nref(node).slot_locked(self.offset as usize);
            if curr.is_sibling() {
                continue;
            }
            while curr.is_node() {
                node = curr.to_node();
                self.pos = Pos::Node(node);
                self.offset = 0;
                curr = self.nref(node).slot_locked(0);
            }
            if !curr.is_null() {
                return curr;
            }
        }
        // u8 arithmetic like the kernel's: after climbing out of the top
        // node (cursor at the head) the offset is meaningless and may wrap
        self.offset = self.offset.wrapping_sub(self.sibs);
        RawEntry::NULL
    }

    /// The next entry present in the cursor's range, i.e. one that a store of
    /// the cursor's order would overwrite (`xas_find_conflict`). A larger
    /// entry covering the range is returned once, with the cursor on its
    /// canonical slot so [`XaState::get_order`] reads its order in place.
    /// After the last conflict the cursor is left ready for `store` over the
    /// range without another walk.
    pub fn find_conflict(&mut self, lock: &XaLock<'_, T>) -> Option<EntryRef<'a, T>> {
        self.check_lock(lock);
        loop {
            let e = self.find_conflict_raw();
            if e.is_zero() {
                continue;
            }
            // SAFETY: read under the lock and `self.guard` (default
            // collector, where item frees are deferred); lives for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Every conflicting entry in the range, in index order
    /// (`xas_for_each_conflict`).
    pub fn conflicts<'c, 'l>(&'c mut self, lock: &'c XaLock<'l, T>) -> Conflicts<'c, 'a, 'l, T> {
        Conflicts { xas: self, lock }
    }

    // ------------------------------------------------------------------
    // Ranges
    // ------------------------------------------------------------------

    // ------------------------------------------------------------------
    // Crate-internal helpers for the array's own operations
    // ------------------------------------------------------------------

    pub(crate) fn set_shape(&mut self, shift: u8, sibs: u8) {
        self.shift = shift;
        self.sibs = sibs;
        self.index &= !(self.size().wrapping_sub(1));
        self.pos = Pos::Restart;
    }

    /// The first and last index of the entry the cursor is on, after a
    /// `load_raw` that found one: its canonical slot and the sibling slots
    /// that follow it, at the node's shift (wrapping arithmetic: the top
    /// node of a full-height tree spans all of `u64`).
    pub(crate) fn entry_extent(&self) -> (u64, u64) {
        let Pos::Node(node) = self.pos else {
            return (self.index, self.index);
        };
        let n = self.nref(node);
        let shift = n.shift as u32;
        let canon = self.offset as usize;
        let mut end = canon;
        while end + 1 < CHUNK_SIZE && n.slot_locked(end + 1) == RawEntry::sibling(canon) {
            end += 1;
        }
        let base = self.index & !((CHUNK_SIZE as u64) << shift).wrapping_sub(1);
        let first = base + ((canon as u64) << shift);
        let last = first
            .wrapping_add(((end - canon + 1) as u64) << shift)
            .wrapping_sub(1);
        (first, last)
    }

    /// `xas_sibling`: the index lies past the canonical slot of the entry
    /// the cursor is on (it was found through a sibling).
    pub(crate) fn on_sibling_index(&self) -> bool {
        let Pos::Node(n) = self.pos else { return false };
        let n = self.nref(n);
        let mask = ((CHUNK_SIZE as u64) << n.shift).wrapping_sub(1);
        (self.index & mask) > ((self.offset as u64) << n.shift)
    }

    /// `xa_destroy`: empty the array, disposing of every node and item.
    pub(crate) fn destroy_all(&mut self) {
        let xa = self.xa;
        let head = xa.head.load_locked();
        xa.head.store(RawEntry::NULL);
        for mark in Mark::ALL {
            if xa.track_free() && mark == Mark::FREE {
                if xa.zero_busy() {
                    xa.mark_clear(mark);
                } else {
                    xa.mark_set(mark);
                }
            } else {
                xa.mark_clear(mark);
            }
        }
        if head.is_node() {
            self.free_nodes(head.to_node());
            xa.bump_seq();
        } else {
            self.dispose(head);
        }
        self.pos = Pos::Restart;
    }

    // ------------------------------------------------------------------
    // Split
    // ------------------------------------------------------------------

    /// Preallocate, without the lock, the nodes needed to split a value entry
    /// of order `order` into entries of the cursor's order
    /// (`xas_split_alloc`). The nodes are prefilled with `value` and tagged
    /// with it, so [`XaState::split`] can check that the entry it splits is
    /// still the one they were built for.
    pub fn split_alloc(&mut self, value: u64, order: u32) -> Result<(), Error> {
        if value > crate::entry::MAX_VALUE {
            return Err(Error::ValueOutOfRange(value));
        }
        if order > 63 {
            return Err(Error::OrderTooLarge(order));
        }
        self.clear_split();
        let entry = RawEntry::value(value);
        if self.shift as u32 + 2 * CHUNK_SHIFT <= order {
            return Err(Error::InvalidSplit);
        }
        if order <= self.order() {
            return Err(Error::InvalidSplit);
        }
        if self.shift as u32 + CHUNK_SHIFT <= order {
            let sibs = (1usize << (order % CHUNK_SHIFT)) - 1;
            for _ in 0..=sibs {
                let Some(mut nb) = Node::alloc(0, 0, None) else {
                    self.clear_split();
                    return Err(Error::NoMemory);
                };
                self.fill_for_split(nb.node_mut(), entry);
                self.push_split_node(nb);
            }
        }
        self.set_split_tag(entry, order, false);
        Ok(())
    }

    fn fill_for_split(&self, n: &mut Node, entry: RawEntry) {
        let mask = self.sibs as usize;
        let mut sibling = RawEntry::NULL;
        for i in 0..CHUNK_SIZE {
            if i & mask == 0 {
                n.slots[i].init(entry);
                sibling = RawEntry::sibling(i);
            } else {
                n.slots[i].init(sibling);
            }
        }
    }

    /// Split the value entry of order `order` at the cursor into entries of
    /// the cursor's order, all holding `value` (`xas_split`), using the
    /// nodes from [`XaState::split_alloc`]. No allocation happens here.
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`] if `value` does not fit in 63 bits (it
    /// cannot be the entry's); [`Error::InvalidSplit`] if the entry at the
    /// cursor is not `value` of order `order`, or if the preallocation was
    /// made for another entry or order: the check the kernel's pre-6.10 page
    /// cache lacked. Either way the array is unchanged and the preallocation
    /// freed.
    pub fn split(&mut self, lock: &XaLock<'_, T>, value: u64, order: u32) -> Result<(), Error> {
        self.check_lock(lock);
        if value > crate::entry::MAX_VALUE {
            self.clear_split();
            return Err(Error::ValueOutOfRange(value));
        }
        let entry = RawEntry::value(value);
        if self.split_tag() != Some((entry, order, false)) {
            self.clear_split();
            return Err(Error::InvalidSplit);
        }
        let curr = self.load_raw();
        let node = match self.pos {
            Pos::Node(n) => n,
            _ => {
                self.destroy();
                return Err(Error::InvalidSplit);
            }
        };
        if curr != entry || self.get_order() != order {
            self.destroy();
            return Err(Error::InvalidSplit);
        }
        let bomb = PoisonOnUnwind::arm(self.xa);
        let n = self.nref(node);
        let sibs = (1usize << (order % CHUNK_SHIFT)) - 1;
        let marks = n.slot_marks(self.offset as usize);
        let mut values: i32 = 0;
        let mut offset = self.offset as usize + sibs;
        let xa = self.xa;
        loop {
            if (self.shift) < n.shift {
                let mut child = self.pop_split_node();
                {
                    let c = child.node_mut();
                    c.shift = n.shift - CHUNK_SHIFT as u8;
                    c.offset = offset as u8;
                    c.set_count(CHUNK_SIZE as u8);
                    c.set_nr_values(if entry.is_value() {
                        CHUNK_SIZE as u8
                    } else {
                        0
                    });
                    c.set_parent(Some(node));
                }
                let child = child.into_raw();
                xa.node_added();
                self.set_split_marks(n, offset, Some(self.nref(child)), marks);
                n.set_slot(offset, RawEntry::node(child));
                crate::fault::slot_written();
                if curr.is_value() {
                    values -= 1;
                }
            } else {
                let canon = offset - self.sibs as usize;
                self.set_split_marks(n, canon, None, marks);
                n.set_slot(canon, entry);
                crate::fault::slot_written();
                while offset > canon {
                    n.set_slot(offset, RawEntry::sibling(canon));
                    offset -= 1;
                }
                values +=
                    (entry.is_value() as i32 - curr.is_value() as i32) * (self.sibs as i32 + 1);
            }
            if offset == self.offset as usize {
                break;
            }
            offset -= 1;
        }
        n.add_nr_values(values);
        xa.bump_seq();
        self.seq = xa.seq();
        bomb.defuse();
        self.clear_split();
        Ok(())
    }

    fn set_split_marks(&self, n: &Node, offset: usize, child: Option<&Node>, marks: u8) {
        for mark in Mark::ALL {
            if marks & (1 << mark.index()) != 0 {
                n.set_mark(offset, mark);
                if let Some(c) = child {
                    if self.sibs == 0 {
                        c.mark_all(mark);
                    } else {
                        let mut i = 0;
                        while i < CHUNK_SIZE {
                            c.set_mark(i, mark);
                            i += self.sibs as usize + 1;
                        }
                    }
                }
            }
        }
    }
}

pub(crate) fn dispose_item<T: Item>(guard: &Guard, e: RawEntry) {
    let p = SendPtr(e.bits());
    // SAFETY: the item is unreachable; `guard` is pinned on the default
    // collector (or is the unprotected guard under `&mut XArray`), the one
    // every reader's `Guard` pins, so readers delay the deferred drop until
    // they leave; the closure owns the array's reference to it.
    unsafe {
        guard.defer_unchecked(move || {
            let p = p;
            let ptr: NonNull<T::Target> =
                NonNull::new_unchecked(core::ptr::with_exposed_provenance_mut(p.0));
            drop(T::from_raw(ptr));
        })
    }
}

/// Returned by [`XaState::reload`] when the cursor's node was detached by a
/// writer (or the cursor is not positioned): reset and load again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale;

impl core::fmt::Display for Stale {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("cursor position is stale; reset and reload")
    }
}

impl std::error::Error for Stale {}

/// Iterator over present entries from a cursor; see [`XaState::iter`].
pub struct CursorIter<'c, 'a, T: Item> {
    xas: &'c mut XaState<'a, T>,
    max: u64,
}

impl<'a, T: Item> Iterator for CursorIter<'_, 'a, T> {
    type Item = (u64, EntryRef<'a, T>);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let e = self.xas.find(self.max)?;
        Some((self.xas.index, e))
    }
}

/// Iterator over conflicting entries; see [`XaState::conflicts`].
pub struct Conflicts<'c, 'a, 'l, T: Item> {
    xas: &'c mut XaState<'a, T>,
    lock: &'c XaLock<'l, T>,
}

impl<'a, T: Item> Iterator for Conflicts<'_, 'a, '_, T> {
    type Item = EntryRef<'a, T>;
    fn next(&mut self) -> Option<Self::Item> {
        self.xas.find_conflict(self.lock)
    }
}

impl<T: Item> core::fmt::Debug for XaState<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XaState")
            .field("index", &self.index)
            .field("shift", &self.shift)
            .field("sibs", &self.sibs)
            .field("offset", &self.offset)
            .field("pos", &self.pos)
            .field("walks", &self.walks)
            .finish()
    }
}
