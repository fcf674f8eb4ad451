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

use super::array::XArray;
use crate::entry::RawEntry;
use crate::error::Error;
use crate::guard::Guard;
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{Locked, Node, NodeBox, NodeRef, Shared, Writer, CHUNK_SHIFT, CHUNK_SIZE};
use core::ptr::NonNull;

/// Where the cursor is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pos<'a> {
    /// Not walked yet (`XAS_RESTART`).
    Restart,
    /// The index is outside the tree, or an iteration ran off its end
    /// (`XAS_BOUNDS`).
    Bounds,
    /// At the head: the entry for index 0 is stored in the array itself
    /// (the kernel's `xa_node == NULL`).
    Head,
    /// In a node, at `offset`.
    Node(NodeRef<'a, Shared>),
    /// An operation failed (`xas_error`).
    Error(Error),
}

/// Where a cursor is: the kernel's `xa_state.xa_node` decoded (its
/// `XAS_RESTART`/`XAS_BOUNDS` sentinels, the head, a node, or an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CursorState {
    /// Not walked yet, reset or paused (`XAS_RESTART`): the next operation
    /// walks from the root.
    Restart,
    /// The index is outside the tree, or an iteration ran off its end
    /// (`XAS_BOUNDS`).
    Bounds,
    /// At the array's head: the entry for index 0 is held in the array
    /// itself (the kernel's `xa_node == NULL`).
    Head,
    /// In a node, at the slot for the cursor's index.
    Node,
    /// The last operation failed (`xas_error`); [`XaState::reset`] clears it.
    Error(Error),
}

/// A cursor over an [`XArray`]: the kernel's `struct xa_state`.
///
/// Reads (`load`, `next`, `find`, …) are lock-free and use the guard given
/// at construction; writes (`store`, `set_mark`, `find_conflict`, `split`,
/// …) take the array's [`XaLock`](crate::XaLock).
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
    pub(crate) xa: &'a XArray<T>,
    pub(crate) guard: &'a Guard,
    pub(crate) index: u64,
    pub(crate) shift: u8,
    pub(crate) sibs: u8,
    pub(crate) offset: u8,
    pub(crate) pos: Pos<'a>,
    /// `XArray::seq` when the current position was established.
    pub(crate) seq: u64,
    pub(crate) walks: u64,
    /// `pos == Bounds` was decided at the root by this walk.
    pub(crate) bounds_at_root: bool,
    /// The indices of the last subtrees the search lookahead prefetched
    /// (`lookahead.rs`); empty when none.
    pub(crate) prefetched: core::ops::Range<u64>,
    /// Preallocated nodes, boxed so that a cursor that allocates nothing
    /// (most of them) stays small and cheap to create and drop.
    pub(crate) pre: Option<Box<Prealloc>>,
}

/// Nodes a cursor holds in reserve.
#[derive(Default)]
pub(crate) struct Prealloc {
    /// Blank nodes reserved for this operation.
    pub(crate) alloc: Vec<NodeBox>,
    /// Nodes the last failed operation needed (for `nomem`).
    pub(crate) need: usize,
    /// Nodes for a split, with the (entry, order) they were made for.
    pub(crate) split_nodes: Vec<NodeBox>,
    pub(crate) split_for: Option<(RawEntry, u32)>,
    /// The split preallocation is for `try_split` (partial) rather than
    /// `split` (uniform).
    pub(crate) split_partial: bool,
}

/// Decoded order: `(shift, sibs)` for an order.
#[inline]
pub(crate) fn order_shape(order: u32) -> (u8, u8) {
    let rem = order % CHUNK_SHIFT;
    ((order - rem) as u8, ((1u32 << rem) - 1) as u8)
}

/// The largest index a tree with top node `top` can hold (`xa_max_index`
/// of the head; 0 for a head without a node).
#[inline]
pub(crate) fn max_index<K>(top: Option<NodeRef<'_, K>>) -> u64 {
    match top {
        Some(n) => ((CHUNK_SIZE as u64) << n.shift).wrapping_sub(1),
        None => 0,
    }
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

/// A pointer moved into a deferred destructor (which may run on another
/// thread).
pub(crate) struct SendPtr(pub(crate) NonNull<()>);
// SAFETY: only moved into a deferred destructor that frees what it points
// to; the pointee types are Send (items: `Item: Send`; nodes: atomics).
unsafe impl Send for SendPtr {}

impl<'a, T: Item> XaState<'a, T> {
    /// A cursor for the single index `index`, not walked yet.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::new(&xa, &guard, 9);
    /// assert_eq!((xas.index(), xas.order()), (9, 0));
    /// ```
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
            prefetched: 0..0,
            pre: None,
        }
    }

    /// A cursor for the order-`order` block containing `index` (the index is
    /// rounded down to the order, as `XA_STATE_ORDER` does).
    ///
    /// # Errors
    ///
    /// [`Error::OrderTooLarge`] for an order above 63.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::with_order(&xa, &guard, 9, 2).unwrap();
    /// assert_eq!((xas.index(), xas.order()), (8, 2));
    /// ```
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
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::new(&xa, &guard, 0);
    /// assert!(std::ptr::eq(xas.array(), &xa));
    /// ```
    pub fn array(&self) -> &'a XArray<T> {
        self.xa
    }
    /// The guard this cursor reads under.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::new(&xa, &guard, 0);
    /// assert!(std::ptr::eq(xas.guard(), &guard));
    /// ```
    pub fn guard(&self) -> &'a Guard {
        self.guard
    }
    /// The current index.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert_eq!(XaState::new(&xa, &guard, 3).index(), 3);
    /// ```
    #[inline]
    pub fn index(&self) -> u64 {
        self.index
    }
    /// The order of the range the cursor operates on.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert_eq!(XaState::with_order(&xa, &guard, 0, 9).unwrap().order(), 9);
    /// ```
    pub fn order(&self) -> u32 {
        self.shift as u32 + (self.sibs as u32 + 1).trailing_zeros()
    }
    /// Descents from the root this cursor has made (restarts included).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(100, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 100);
    /// xas.load();
    /// xas.load();
    /// assert_eq!(xas.walks(), 1);
    /// ```
    #[inline]
    pub fn walks(&self) -> u64 {
        self.walks
    }
    /// The error of the last operation, if it failed (`xas_error`).
    ///
    /// ```
    /// use kxarray::{fault, Entry, Error, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let lock = xa.lock();
    /// let mut xas = XaState::new(&xa, &guard, 1 << 30);
    /// fault::fail_next_allocations(u64::MAX);
    /// assert!(xas.store(&lock, Some(Entry::Value(1))).is_err());
    /// fault::fail_next_allocations(0);
    /// assert_eq!(xas.error(), Some(Error::NoMemory));
    /// ```
    pub fn error(&self) -> Option<Error> {
        match self.pos {
            Pos::Error(e) => Some(e),
            _ => None,
        }
    }
    /// Where the cursor is (see [`CursorState`]).
    ///
    /// ```
    /// use kxarray::{CursorState, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 1 << 40);
    /// assert_eq!(xas.state(), CursorState::Restart);
    /// xas.load();
    /// assert_eq!(xas.state(), CursorState::Bounds); // beyond an empty tree
    /// ```
    #[inline]
    pub fn state(&self) -> CursorState {
        match self.pos {
            Pos::Restart => CursorState::Restart,
            Pos::Bounds => CursorState::Bounds,
            Pos::Head => CursorState::Head,
            Pos::Node(_) => CursorState::Node,
            Pos::Error(e) => CursorState::Error(e),
        }
    }
    /// Whether the cursor has not been walked (`XAS_RESTART`).
    ///
    /// ```
    /// #![allow(deprecated)]
    /// use kxarray::{XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert!(XaState::new(&xa, &guard, 0).is_restart());
    /// ```
    #[deprecated(note = "use `state() == CursorState::Restart`")]
    pub fn is_restart(&self) -> bool {
        self.pos == Pos::Restart
    }
    /// Whether the cursor ran off the tree (`XAS_BOUNDS`).
    ///
    /// ```
    /// #![allow(deprecated)]
    /// use kxarray::{XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 5);
    /// xas.load();
    /// assert!(xas.is_bounds());
    /// ```
    #[deprecated(note = "use `state() == CursorState::Bounds`")]
    pub fn is_bounds(&self) -> bool {
        self.pos == Pos::Bounds
    }
    /// Whether the cursor sits at the array's head (index 0 held directly).
    ///
    /// ```
    /// #![allow(deprecated)]
    /// use kxarray::{Entry, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(0, Entry::Value(1)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.load();
    /// assert!(xas.is_head());
    /// ```
    #[deprecated(note = "use `state() == CursorState::Head`")]
    pub fn is_head(&self) -> bool {
        self.pos == Pos::Head
    }
    /// The shift of the node the cursor is in, if it is in one.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(5, Entry::Value(5)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 5);
    /// xas.load();
    /// assert_eq!(xas.node_shift(), Some(0)); // a leaf
    /// ```
    pub fn node_shift(&self) -> Option<u32> {
        match self.pos {
            Pos::Node(n) => Some(n.shift as u32),
            _ => None,
        }
    }
    /// `(count, nr_values)` of the node the cursor is in (test introspection).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(5, Entry::Value(5)).unwrap();
    /// xa.store(6, Entry::Value(6)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 5);
    /// xas.load();
    /// assert_eq!(xas.node_counts(), Some((2, 2)));
    /// ```
    pub fn node_counts(&self) -> Option<(u32, u32)> {
        match self.pos {
            Pos::Node(n) => Some((n.count() as u32, n.nr_values() as u32)),
            _ => None,
        }
    }

    /// Move to `index` (order 0) and forget the position (`xas_set`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.set_index(42);
    /// assert_eq!(xas.index(), 42);
    /// ```
    #[inline]
    pub fn set_index(&mut self, index: u64) {
        self.index = index;
        self.shift = 0;
        self.sibs = 0;
        self.pos = Pos::Restart;
    }

    /// Operate on the order-`order` block containing `index`
    /// (`xas_set_order`); the index is rounded down to the order.
    ///
    /// # Errors
    ///
    /// [`Error::OrderTooLarge`] for an order above 63 (the cursor is unchanged).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.set_order(70, 3).unwrap();
    /// assert_eq!((xas.index(), xas.order()), (64, 3));
    /// assert!(xas.set_order(0, 64).is_err());
    /// ```
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
    ///
    /// ```
    /// use kxarray::{CursorState, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 3);
    /// xas.load();
    /// xas.reset();
    /// assert_eq!(xas.state(), CursorState::Restart);
    /// ```
    #[inline]
    pub fn reset(&mut self) {
        self.pos = Pos::Restart;
    }

    /// A read handle for the node of the node entry `e`, valid for the
    /// cursor's guard lifetime (no null check: the descent's form).
    ///
    /// # Safety
    ///
    /// - `e` is a node entry (`e.is_node()`) read from this cursor's array
    ///   (its head or a slot of one of its nodes) while `self.guard` (or the
    ///   lock, whose guard the cursor reads under) was held.
    #[inline(always)]
    pub(crate) unsafe fn node_of(&self, e: RawEntry) -> NodeRef<'a, Shared> {
        debug_assert!(e.is_node(), "not a node entry: {e:?}");
        // SAFETY: the caller's contract, which is `from_entry`'s.
        unsafe { NodeRef::<Shared>::from_entry(e, self.guard) }
    }

    /// The cursor position for a node written under the lock: a node of
    /// this tree stays allocated while the cursor's guard is pinned.
    #[inline(always)]
    pub(crate) fn at(&self, n: NodeRef<'_, Locked>) -> NodeRef<'a, Shared> {
        // SAFETY: a locked handle is a node of this tree (linked, or
        // unlinked by the current write and not yet retired); nodes are
        // retired only through the epoch, after `self.guard` is dropped.
        unsafe { NodeRef::<Shared>::new(n.as_ptr(), self.guard) }
    }

    /// A write handle for the node behind `n`, valid while `w` is.
    ///
    /// # Safety
    ///
    /// - `n` is a node of this cursor's array (linked, or linked or
    ///   unlinked by the current write and not yet retired), read under
    ///   the lock `w` witnesses;
    /// - `w` is the writer of this cursor's array (the public entry points
    ///   check the lock against the array before minting it).
    #[inline(always)]
    pub(crate) unsafe fn nmut<'l>(
        &self,
        n: impl Into<NonNull<Node>>,
        w: Writer<'l>,
    ) -> NodeRef<'l, Locked> {
        let n: NonNull<Node> = n.into();
        debug_assert!(n.as_ptr().is_aligned(), "not a node pointer: {n:p}");
        debug_assert!(self.xa.is_locked() || self.guard.is_unprotected());
        // SAFETY: the caller's contract: a node of the tree `w` writes.
        unsafe { NodeRef::<Locked>::new(n, w) }
    }

    #[inline]
    pub(crate) fn is_valid(&self) -> bool {
        matches!(self.pos, Pos::Node(_) | Pos::Head)
    }

    #[inline]
    pub(crate) fn set_err(&mut self, e: Error) {
        self.pos = Pos::Error(e);
    }

    #[inline]
    pub(crate) fn size(&self) -> u64 {
        (self.sibs as u64 + 1) << self.shift
    }

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
        let n = node;
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
        let mask = ((CHUNK_SIZE as u64) << n.shift).wrapping_sub(1);
        (self.index & mask) > ((self.offset as u64) << n.shift)
    }

    /// `xa_destroy`: empty the array, disposing of every node and item.
    pub(crate) fn destroy_all(&mut self, w: Writer<'_>) {
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
            // SAFETY: the top node of this tree, read from the head under the
            // lock `w` witnesses.
            let top = unsafe { self.nmut(head.to_node(), w) };
            // SAFETY: the head, which linked the top node, was cleared above:
            // the whole tree is unreachable for new readers.
            let dying = unsafe { top.into_dying() };
            self.free_nodes(dying);
            xa.bump_seq();
        } else {
            // SAFETY: the head, which held the entry, was cleared above.
            unsafe { self.dispose(head) };
        }
        self.pos = Pos::Restart;
    }
}

/// Drop the item of `e` once every reader pinned now has left: every
/// crossbeam guard, and with `light` (an array with light items) every light
/// section too.
///
/// # Safety
///
/// - `e` is an item entry of an array of `T`s, just unlinked from it (no
///   slot and not the head holds it any more), and this is its only
///   disposal;
/// - `guard` is the guard the unlinking writer reads under (pinned on the
///   default collector, or the unprotected guard of an exclusively held
///   array).
pub(crate) unsafe fn dispose_item<T: Item>(guard: &Guard, e: RawEntry, light: bool) {
    debug_assert!(e.is_item());
    let p = SendPtr(e.to_item::<T::Target>().cast());
    // Under loom the page cache reads no folio under a light pin (its
    // `LIGHT_HITS`), and a drop delayed into a later model execution would
    // touch that execution's state: items go straight to crossbeam there.
    if light && !guard.is_unprotected() && !cfg!(loom) {
        /// The item's drop for the light limbo.
        ///
        /// # Safety
        /// `p` is the pointer of an item of type `T` unlinked from its array,
        /// this its only drop, unreachable to every reader
        /// (`lightpin`'s `defer_free` contract).
        unsafe fn drop_erased<T: Item>(p: NonNull<u8>) {
            // SAFETY: per the contract, the array's reference to the item.
            unsafe { drop(T::from_raw(p.cast())) }
        }
        let arrivals = crate::lightpin::arrivals();
        let to_limbo = move || {
            let p = p;
            // SAFETY: crossbeam runs this after every guard that could see
            // the item is gone; the limbo then waits for the light readers;
            // the closure owns the array's reference.
            unsafe { arrivals.push(p.0.cast(), drop_erased::<T>) };
        };
        // SAFETY: as below; the limbo step only delays the drop further.
        unsafe { guard.defer_unchecked(to_limbo) };
        return;
    }
    let drop_item = move || {
        let p = p;
        // SAFETY: `p` is the item pointer of a user entry; the closure owns
        // the array's reference to it (see below).
        unsafe { drop(T::from_raw(p.0.cast())) };
    };
    // SAFETY: the item is unreachable; `guard` is pinned on the default
    // collector (or is the unprotected guard under `&mut XArray`), the one
    // every reader's `Guard` pins, so readers delay the deferred drop until
    // they leave; the closure owns the array's reference to it.
    unsafe { guard.defer_unchecked(drop_item) }
}

impl<T: Item> XArray<T> {
    /// A cursor on an exclusively borrowed array, and the [`Writer`] the
    /// borrow is as good as.
    pub(crate) fn excl_cursor(&mut self, index: u64) -> (XaState<'_, T>, Writer<'_>) {
        if self.is_poisoned() {
            Self::poisoned_panic();
        }
        self.excl_cursor_unchecked(index)
    }

    pub(crate) fn excl_cursor_unchecked(&mut self, index: u64) -> (XaState<'_, T>, Writer<'_>) {
        // SAFETY: `&mut self` means no reader or writer can see the tree, so
        // deferred destruction may run at once; the cursor (and the guard)
        // stays inside this crate's `&mut self` methods.
        let guard: &'static Guard = unsafe { Guard::unprotected() };
        // SAFETY: `&mut self`: this thread has the tree exclusively for the
        // borrow, which bounds the writer's lifetime.
        let w = unsafe { Writer::new(|| true) };
        (XaState::new(self, guard, index), w)
    }
}

impl<T: Item> Drop for XArray<T> {
    fn drop(&mut self) {
        // A poisoned array's old tree is leaked; what the head holds is not.
        let (mut xas, w) = self.excl_cursor_unchecked(0);
        xas.destroy_all(w);
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
