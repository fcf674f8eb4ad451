//! Node handles: what a piece of code may do with a node, carried in its type
//! (std's btree `NodeRef<BorrowType, ..>` idea, cut to this tree's needs).
//!
//! - [`NodeRef<'g, Shared>`]: a node read lock-free under an epoch guard that
//!   lives for `'g`. It can only load (slots, marks, counts, parent).
//! - [`NodeRef<'l, Locked>`]: a node of a tree whose writer lock is held for
//!   `'l`. Only it (and the owned [`NodeBox`](super::NodeBox)) can write
//!   slots, counts, marks and parent links, and it can only be made with a
//!   [`Writer`], the witness that the lock is held (or the array is
//!   exclusively borrowed).
//! - [`NodeBox`](super::NodeBox): an owned node not yet linked into a tree.
//! - [`Dying`]: a node unlinked from its tree (no new reader can reach it),
//!   on its way to the epoch: its slots can be poisoned with RETRY for the
//!   readers still inside, and it can be retired, once, which consumes it.
//!
//! Invariants: every handle points to a live `Node` for its lifetime. The
//! only ways in are the `unsafe` constructors below (whose callers prove the
//! pointer came from a tree under the right guard or lock), `NodeBox`, and
//! the safe steps between handles that keep that proof (a locked handle
//! gives up writing to become a shared one; a child of a dying node is
//! dying).

use super::Node;
use crate::entry::RawEntry;
use crate::guard::{Guard, ProtectsNodes};
use crate::mark::Mark;
use core::marker::PhantomData;
use core::ptr::NonNull;

/// The kinds of [`NodeRef`].
pub(crate) mod marker {
    /// Read-only, lock-free, under an epoch guard.
    #[derive(Debug)]
    pub(crate) enum Shared {}
    /// Read and write, under the tree's writer lock.
    #[derive(Debug)]
    pub(crate) enum Locked {}
}
pub(crate) use marker::{Locked, Shared};

/// The right to write one tree's nodes for `'l`: the writer lock is held
/// for all of `'l`, or the tree is exclusively borrowed (`&mut XArray`).
///
/// Only the lock ([`XaLock`](crate::XaLock)) and the `&mut` paths mint one;
/// every internal write function takes one, so a write path that forgot the
/// lock does not compile.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Writer<'l>(PhantomData<&'l ()>);

impl Writer<'_> {
    /// Witness that the caller may write a tree's nodes.
    ///
    /// # Safety
    ///
    /// - For all of the returned lifetime, the caller holds the writer lock
    ///   of the tree whose nodes it will write through this witness, or
    ///   has that tree exclusively (no other thread can reach it).
    /// - `held` checks the first point where a check is possible (the
    ///   lock's `is_locked`), or returns `true`; it runs in debug builds
    ///   only, so the release hot path pays nothing for it.
    #[inline(always)]
    pub(crate) unsafe fn new(held: impl FnOnce() -> bool) -> Self {
        debug_assert!(held(), "kxarray: Writer minted without the lock");
        Writer(PhantomData)
    }
}

/// A handle to a node of a tree, of kind `K` ([`Shared`] or [`Locked`]),
/// valid for `'a`. `Copy`: a handle is a pointer plus a proof.
pub(crate) struct NodeRef<'a, K> {
    ptr: NonNull<Node>,
    _k: PhantomData<(&'a Node, K)>,
}

impl<K> Clone for NodeRef<'_, K> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for NodeRef<'_, K> {}

impl<K> PartialEq for NodeRef<'_, K> {
    fn eq(&self, other: &Self) -> bool {
        self.ptr == other.ptr
    }
}

impl<K> Eq for NodeRef<'_, K> {}

impl<K> From<NodeRef<'_, K>> for NonNull<Node> {
    #[inline(always)]
    fn from(n: NodeRef<'_, K>) -> Self {
        n.ptr
    }
}

impl<K> core::fmt::Debug for NodeRef<'_, K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("NodeRef").field(&self.ptr).finish()
    }
}

impl<'a, K> NodeRef<'a, K> {
    /// The node, for reading, for all of `'a`.
    #[inline(always)]
    pub(crate) fn get(self) -> &'a Node {
        // SAFETY: every handle points to a live node for `'a` (module
        // invariant, established by the constructors).
        unsafe { self.ptr.as_ref() }
    }

    /// The raw pointer (to store in a cursor position or an entry).
    #[inline(always)]
    pub(crate) fn as_ptr(self) -> NonNull<Node> {
        self.ptr
    }
}

impl<'a, K> NodeRef<'a, K> {
    /// The parent node, the same kind of handle.
    ///
    /// A parent link always points to a node that was reachable (under the
    /// guard or lock this handle was made with) no later than the child:
    /// a node's parent is retired only after the node is unlinked from it
    /// (`delete_node` retires only empty nodes, `shrink` clears the new top
    /// node's parent link before retiring the old top, and `free_nodes`
    /// retires a detached subtree that no new reader can enter), so a
    /// reader that reached the child under its guard also has the parent
    /// protected.
    #[inline]
    pub(crate) fn parent_ref(self) -> Option<NodeRef<'a, K>> {
        self.get().parent().map(|ptr| NodeRef {
            ptr,
            _k: PhantomData,
        })
    }

    /// The child node in slot `offset`, if the slot holds one (never in a
    /// leaf): the same kind of handle, since a node linked from a node
    /// reached under a guard (or the lock) is reached under it too.
    #[inline]
    pub(crate) fn child(self, offset: usize) -> Option<NodeRef<'a, K>> {
        // Acquire: a lock-free reader's handle must see the child's contents.
        let e = self.get().slot(offset);
        (self.get().shift != 0 && e.is_node()).then(|| NodeRef {
            ptr: e.to_node(),
            _k: PhantomData,
        })
    }
}

impl<K> core::ops::Deref for NodeRef<'_, K> {
    type Target = Node;
    #[inline(always)]
    fn deref(&self) -> &Node {
        self.get()
    }
}

impl<'g> NodeRef<'g, Shared> {
    /// A read handle for a node reached under `guard` (a crossbeam
    /// [`Guard`] or a light pin).
    ///
    /// # Safety
    ///
    /// - `ptr` points to a node that was reachable from a live tree (its
    ///   head or a slot of one of its nodes) while `guard` was borrowed, or
    ///   that the caller holds under the tree's lock: nodes are freed only
    ///   after the grace periods of crossbeam's default collector (which
    ///   every `Guard` pins) and of the light readers ([`ProtectsNodes`]),
    ///   so it stays allocated for `'g`.
    #[inline(always)]
    pub(crate) unsafe fn new<P: ProtectsNodes>(ptr: NonNull<Node>, guard: &'g P) -> Self {
        debug_assert!(ptr.is_aligned());
        let _ = guard;
        NodeRef {
            ptr,
            _k: PhantomData,
        }
    }
}

impl<'g> NodeRef<'g, Shared> {
    /// [`NodeRef::new`] from a node entry, without the null check of
    /// `RawEntry::to_node` (the lock-free descent's form).
    ///
    /// # Safety
    ///
    /// - `e` is a node entry (`e.is_node()`), and its node satisfies
    ///   [`NodeRef::new`]'s contract for `guard`.
    #[inline(always)]
    pub(crate) unsafe fn from_entry<P: ProtectsNodes>(e: RawEntry, guard: &'g P) -> Self {
        debug_assert!(e.is_node());
        // SAFETY: a node word is a node pointer (never null) plus the tag.
        let ptr = unsafe { NonNull::new_unchecked(e.internal_raw_ptr::<Node>()) };
        // SAFETY: forwarded from this function's contract.
        unsafe { Self::new(ptr, guard) }
    }
}

impl<'l> NodeRef<'l, Locked> {
    /// A write handle for a node of the tree `w` is the writer of.
    ///
    /// # Safety
    ///
    /// - `ptr` points to a node of the tree whose lock `w` witnesses:
    ///   linked in it, linked by the current write, or unlinked by the
    ///   current write and not yet retired (it is freed only through the
    ///   epoch, after `'l`).
    #[inline(always)]
    pub(crate) unsafe fn new(ptr: NonNull<Node>, w: Writer<'l>) -> Self {
        debug_assert!(ptr.is_aligned());
        let _ = w;
        NodeRef {
            ptr,
            _k: PhantomData,
        }
    }

    /// Give up writing: the same node, read-only.
    #[inline(always)]
    pub(crate) fn shared(self) -> NodeRef<'l, Shared> {
        NodeRef {
            ptr: self.ptr,
            _k: PhantomData,
        }
    }

    /// Turn a node just unlinked from its tree into a [`Dying`] one.
    ///
    /// # Safety
    ///
    /// - Neither the head nor any slot still linked in the tree points to
    ///   the node, so no reader that starts from now on can reach it (a
    ///   reader already inside keeps it alive through its guard).
    /// - No other handle to it is used to write it afterwards, and it is
    ///   retired at most once.
    #[inline]
    pub(crate) unsafe fn into_dying(self) -> Dying<'l> {
        debug_assert!(self.ptr.is_aligned());
        Dying {
            ptr: self.ptr,
            _l: PhantomData,
        }
    }

    #[inline(always)]
    pub(crate) fn set_slot(self, offset: usize, e: RawEntry) {
        self.get().set_slot(offset, e)
    }
    /// Write a slot of a node no reader can see yet (linked by the current
    /// write but not yet published: a Relaxed store).
    #[inline]
    pub(crate) fn init_slot(self, offset: usize, e: RawEntry) {
        self.get().init_slot(offset, e)
    }
    /// Fill every slot of a node no reader can see yet with a non-empty
    /// entry: slot `i` gets `f(i)` (Relaxed stores; the occupancy word is
    /// written once).
    #[inline]
    pub(crate) fn init_full(self, f: impl Fn(usize) -> RawEntry) {
        self.get().init_full(f)
    }
    #[inline]
    pub(crate) fn set_count(self, c: u8) {
        self.get().set_count(c)
    }
    #[inline]
    pub(crate) fn add_count(self, d: i32) {
        self.get().add_count(d)
    }
    #[inline]
    pub(crate) fn set_nr_values(self, c: u8) {
        self.get().set_nr_values(c)
    }
    #[inline]
    pub(crate) fn add_nr_values(self, d: i32) {
        self.get().add_nr_values(d)
    }
    /// Set a mark bit; returns whether it was already set.
    #[inline]
    pub(crate) fn set_mark(self, offset: usize, mark: Mark) -> bool {
        self.get().set_mark(offset, mark)
    }
    /// Clear a mark bit; returns whether it was set.
    #[inline]
    pub(crate) fn clear_mark(self, offset: usize, mark: Mark) -> bool {
        self.get().clear_mark(offset, mark)
    }
    #[inline]
    pub(crate) fn mark_all(self, mark: Mark) {
        self.get().mark_all(mark)
    }
    #[inline]
    pub(crate) fn set_marks_word(self, mark: Mark, w: u64) {
        self.get().set_marks_word(mark, w)
    }
    #[inline]
    pub(crate) fn set_parent(self, p: Option<NonNull<Node>>) {
        self.get().set_parent(p)
    }
}

/// A node unlinked from its tree, on its way to the epoch; see
/// [`NodeRef::into_dying`]. Not `Copy`: [`Dying::retire`] consumes it.
pub(crate) struct Dying<'l> {
    ptr: NonNull<Node>,
    _l: PhantomData<&'l Node>,
}

impl core::fmt::Debug for Dying<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Dying").field(&self.ptr).finish()
    }
}

impl<'l> Dying<'l> {
    /// The node, for reading.
    #[inline]
    pub(crate) fn get(&self) -> &Node {
        // SAFETY: a dying node is not freed before `retire` consumes the
        // handle (`into_dying`'s contract).
        unsafe { self.ptr.as_ref() }
    }

    /// The child node in `offset`, if the slot holds one: dying too (its
    /// only link is from this node, which no new reader can reach).
    #[inline]
    pub(crate) fn child(&self, offset: usize) -> Option<Dying<'l>> {
        let e = self.get().slot_locked(offset);
        (self.get().shift != 0 && e.is_node()).then(|| Dying {
            ptr: e.to_node(),
            _l: PhantomData,
        })
    }

    /// Replace a non-empty slot with RETRY, so a reader still inside
    /// restarts from the head instead of using what the slot held.
    #[inline]
    pub(crate) fn poison_slot(&self, offset: usize) {
        self.get().poison(offset)
    }

    /// Zero the counts (the node holds nothing any more).
    #[inline]
    pub(crate) fn clear_counts(&self) {
        self.get().set_count(0);
        self.get().set_nr_values(0);
    }

    /// Free the node once every reader pinned now has left: deferred
    /// through `guard` (pinned on the default collector every reader pins),
    /// then through the light limbo, which waits for the light readers
    /// (`crate::lightpin`) too. On the unprotected guard of a tree nobody
    /// else can reach it is freed at once.
    pub(crate) fn retire(self, guard: &Guard) {
        if guard.is_unprotected() {
            // SAFETY: `&mut` access to the tree (the unprotected guard's
            // contract): no reader of either kind can hold the node, and
            // `Dying` is consumed, so this is the last reference.
            unsafe { Node::free(self.ptr) };
            return;
        }
        /// The node's free for the light limbo.
        ///
        /// # Safety
        /// `p` is a retired node nothing else frees, unreachable to every
        /// reader (`lightpin::defer_free`'s contract).
        unsafe fn free_erased(p: NonNull<u8>) {
            debug_assert!(p.cast::<Node>().is_aligned());
            // SAFETY: per the contract, the last reference to the node.
            unsafe { Node::free(p.cast()) }
        }
        /// A node pointer moved into the deferred free.
        struct SendNode(NonNull<Node>);
        // SAFETY: only moved into the deferred free; a node is atomics and
        // plain integers, fine to free from any thread.
        unsafe impl Send for SendNode {}
        let p = SendNode(self.ptr);
        let arrivals = crate::lightpin::arrivals();
        let free = move || {
            let p = p;
            // SAFETY: the closure holds the last reference to the node
            // (`Dying` is consumed and no new reader can reach it), and
            // crossbeam runs it after every guard that could see the node
            // is gone; the limbo then waits for the light readers.
            unsafe { arrivals.push(p.0.cast(), free_erased) };
        };
        // Unreachable for new readers (`into_dying`); `guard` is pinned on the
        // default collector, so readers still inside delay the free until
        // they leave.
        // SAFETY: as above; the closure owns the last reference.
        unsafe { guard.defer_unchecked(free) }
    }
}

impl super::NodeBox {
    /// Write the owned node: exclusive ownership is as good as the lock.
    #[inline]
    pub(crate) fn as_locked(&mut self) -> NodeRef<'_, Locked> {
        NodeRef {
            ptr: self.0,
            _k: PhantomData,
        }
    }
}
