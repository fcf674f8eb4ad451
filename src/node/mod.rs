//! Tree nodes: `CHUNK_SIZE` atomic slots, three mark bitmaps, and the
//! bookkeeping the writer needs (shift, offset in parent, counts, parent).
//!
//! Invariants (maintained by the writer, under the lock):
//! - `shift` and `offset` never change once a node is published.
//! - `count` is the number of non-empty slots (items, values, siblings,
//!   retry/zero entries and child nodes); `nr_values` counts value entries
//!   and the siblings of value entries.
//! - `occupied` has bit `i` set exactly when slot `i` is non-empty (so
//!   `count == occupied.count_ones()` on a live node). Searches skip empty
//!   slots with it (a `trailing_zeros`, not a scan of 64 slots). The writer
//!   sets a bit *before* it publishes a non-empty slot and clears it *after*
//!   it empties the slot, so a reader that can see an entry (through the
//!   slot's Release store) also sees its bit: an entry present for a whole
//!   lock-free search is never skipped. A stale word only makes a reader
//!   look at an empty slot, or miss an entry stored during its search.
//! - A node reachable from the head is never empty; a node detached from the
//!   tree is freed only through the epoch (`Guard::defer_unchecked`, into
//!   the default collector every reader pins), after its
//!   entries have been replaced by RETRY (or NULL, for a node that emptied),
//!   so a lock-free reader still inside it restarts instead of reading freed
//!   memory.
//! - Allocation goes through [`Node::alloc`], the one hook the fault
//!   injector ([`crate::fault`]) can make fail; nodes come from the node
//!   cache ([`cache`]: 2 MiB regions, huge pages for large trees) and go
//!   back to it, except under Miri, loom, fuzzing and AddressSanitizer,
//!   where each node is its own global allocation.
//! - Only this module writes a node: the mutators are private, reached from
//!   outside through the handles of [`handle`] (a [`NodeRef<Locked>`]
//!   made with a [`Writer`], an owned [`NodeBox`], a [`Dying`] node), so a
//!   write path without the lock does not compile. Reading needs a handle
//!   too; the only raw dereferences are in `handle`.

#[cfg(not(loom))]
pub(crate) mod cache;
pub(crate) mod handle;

pub(crate) use handle::{Dying, Locked, NodeRef, Shared, Writer};

use crate::entry::{AtomicEntry, RawEntry};
use crate::mark::Mark;
use crate::sync::{AtomicPtr, AtomicU64, AtomicU8, Ordering};
use core::ptr::NonNull;

pub(crate) use crate::geometry::{CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE, MAX_MARKS};

impl RawEntry {
    /// The entry for a node pointer (`xa_mk_node`).
    #[inline]
    pub(crate) fn node(node: NonNull<Node>) -> RawEntry {
        RawEntry::internal_ptr(node)
    }

    /// The node pointer of a node entry (`xa_to_node`).
    #[inline]
    pub(crate) fn to_node(self) -> NonNull<Node> {
        self.to_internal_ptr()
    }
}

/// A node of the radix tree, aligned to a cache line so that its header
/// (shift, counts, parent, occupancy and the first slots) is one line.
#[repr(C, align(64))]
pub(crate) struct Node {
    pub(crate) shift: u8,
    pub(crate) offset: u8,
    count: AtomicU8,
    nr_values: AtomicU8,
    parent: AtomicPtr<Node>,
    /// Bit `i` set iff slot `i` is non-empty (see the module invariants).
    occupied: AtomicU64,
    slots: [AtomicEntry; CHUNK_SIZE],
    marks: [AtomicU64; MAX_MARKS],
    /// Under loom, set when the node is freed (see `sync::Quarantine`).
    #[cfg(loom)]
    freed: crate::sync::Quarantine,
}

/// A prefetch hint for the cache line at `p` (x86-64 only; nothing under
/// Miri or loom, or on other targets). It never faults and reads nothing the
/// program observes, so any address is fine.
#[inline(always)]
pub(crate) fn prefetch(p: *const i8) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: SSE is part of the x86-64 baseline, so the intrinsic's target
    // feature is always present; a prefetch dereferences nothing.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = p;
}

/// Mask of the valid bits of a mark word.
const FULL: u64 = if CHUNK_SIZE == 64 {
    u64::MAX
} else {
    (1u64 << CHUNK_SIZE) - 1
};

#[cfg(any(loom, miri, fuzzing, kxarray_system_alloc))]
crate::sync::thread_local_const! {
    /// Nodes this thread allocated minus those it freed, when nodes come
    /// from the global allocator (the node cache counts its own).
    static SYSTEM_BALANCE: core::cell::Cell<isize> = core::cell::Cell::new(0);
}

/// Nodes this thread allocated minus those it freed, since it started.
pub(crate) fn thread_balance() -> isize {
    #[cfg(any(loom, miri, fuzzing, kxarray_system_alloc))]
    return SYSTEM_BALANCE.try_with(|b| b.get()).unwrap_or(0);
    #[cfg(not(any(loom, miri, fuzzing, kxarray_system_alloc)))]
    return cache::thread_balance();
}

/// Whether nodes come from the node cache in this build.
pub(crate) const CACHED: bool = cfg!(not(any(loom, miri, fuzzing, kxarray_system_alloc)));

impl Node {
    /// Allocate an empty node, or `None` when the allocator (or the fault
    /// injector) says no.
    pub(crate) fn alloc(shift: u8, offset: u8, parent: Option<NonNull<Node>>) -> Option<NodeBox> {
        if crate::fault::should_fail() {
            return None;
        }
        let node = Self::alloc_zeroed()?;
        // SAFETY: freshly allocated and not shared with anyone yet.
        let n = unsafe { &mut *node.as_ptr() };
        n.shift = shift;
        n.offset = offset;
        n.set_parent_init(parent);
        Some(NodeBox(node))
    }

    #[cfg(not(any(loom, miri, fuzzing, kxarray_system_alloc)))]
    #[inline]
    fn alloc_zeroed() -> Option<NonNull<Node>> {
        cache::alloc()
    }

    #[cfg(all(not(loom), any(miri, fuzzing, kxarray_system_alloc)))]
    fn alloc_zeroed() -> Option<NonNull<Node>> {
        let layout = std::alloc::Layout::new::<Node>();
        // SAFETY: Node has a non-zero size. All-zero bytes are a valid Node:
        // every field is an integer or an atomic integer.
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Node>();
        let p = NonNull::new(p)?;
        SYSTEM_BALANCE.with(|b| b.set(b.get() + 1));
        Some(p)
    }

    #[cfg(loom)]
    fn alloc_zeroed() -> Option<NonNull<Node>> {
        SYSTEM_BALANCE.with(|b| b.set(b.get() + 1));
        let n = Box::new(Node {
            shift: 0,
            offset: 0,
            count: AtomicU8::new(0),
            nr_values: AtomicU8::new(0),
            parent: AtomicPtr::new(core::ptr::null_mut()),
            occupied: AtomicU64::new(0),
            slots: core::array::from_fn(|_| AtomicEntry::new(RawEntry::NULL)),
            marks: core::array::from_fn(|_| AtomicU64::new(0)),
            freed: crate::sync::Quarantine::new(),
        });
        Some(NonNull::from(Box::leak(n)))
    }

    /// Free a node that no reader can reach.
    ///
    /// # Safety
    /// - `node` came from `alloc` and no reference to it survives.
    unsafe fn free(node: NonNull<Node>) {
        debug_assert!(node.is_aligned());
        #[cfg(any(loom, miri, fuzzing, kxarray_system_alloc))]
        // `try_with`: a node freed during this thread's teardown.
        let _ = SYSTEM_BALANCE.try_with(|b| b.set(b.get() - 1));
        #[cfg(loom)]
        {
            /// Release a node held by the quarantine.
            ///
            /// # Safety
            /// `addr` is a node from `alloc` that nothing else frees.
            unsafe fn release(addr: usize) {
                let p: *mut Node = core::ptr::with_exposed_provenance_mut(addr);
                debug_assert!(!p.is_null());
                // SAFETY: per the contract, a Box-allocated node, freed once.
                drop(unsafe { Box::from_raw(p) });
            }
            // SAFETY: the caller passes a live node nobody else frees; the
            // quarantine releases it with `release` once it is old enough.
            unsafe {
                let n = node.as_ref();
                n.freed.check();
                n.freed.bury(node.as_ptr().expose_provenance(), release);
            }
        }
        #[cfg(not(any(loom, miri, fuzzing, kxarray_system_alloc)))]
        // SAFETY: from `alloc_zeroed`, i.e. the node cache, and unused (the
        // contract).
        unsafe {
            cache::free(node)
        };
        #[cfg(all(not(loom), any(miri, fuzzing, kxarray_system_alloc)))]
        // SAFETY: allocated by `alloc_zeroed` with the global allocator and
        // Node's layout, which is exactly what Box expects.
        drop(unsafe { Box::from_raw(node.as_ptr()) });
    }

    /// Under loom, panic if this node was freed (`sync::Quarantine`).
    #[inline(always)]
    fn check_live(&self) {
        #[cfg(loom)]
        self.freed.check();
    }

    #[inline(always)]
    pub(crate) fn slot(&self, offset: usize) -> RawEntry {
        self.check_live();
        self.slots[offset].load()
    }
    #[inline(always)]
    pub(crate) fn slot_locked(&self, offset: usize) -> RawEntry {
        self.check_live();
        self.slots[offset].load_locked()
    }
    /// Publish `e` in a slot (a Release store), keeping `occupied` in step:
    /// the bit is set before a non-empty entry is published and cleared
    /// after the slot is emptied (module invariants).
    #[inline(always)]
    fn set_slot(&self, offset: usize, e: RawEntry) {
        let bit = 1u64 << offset;
        let occ = self.occupied.load(Ordering::Relaxed);
        if e.is_null() {
            self.slots[offset].store(e);
            if occ & bit != 0 {
                self.occupied.store(occ & !bit, Ordering::Relaxed);
            }
        } else {
            if occ & bit == 0 {
                self.occupied.store(occ | bit, Ordering::Relaxed);
            }
            self.slots[offset].store(e);
        }
    }

    /// The occupancy word: bit `i` set iff slot `i` is non-empty. Lock-free
    /// readers may see it a little stale (module invariants).
    #[inline(always)]
    pub(crate) fn occupied(&self) -> u64 {
        self.check_live();
        self.occupied.load(Ordering::Relaxed)
    }

    /// Ask the CPU to start loading the header line (shift, counts, parent,
    /// occupancy): a hint, with no effect on what the program reads.
    #[inline(always)]
    pub(crate) fn prefetch_header(&self) {
        prefetch(core::ptr::from_ref(self).cast());
    }

    /// Ask the CPU to start loading the line of slot `offset` (a hint).
    #[inline(always)]
    pub(crate) fn prefetch_slot(&self, offset: usize) {
        prefetch(core::ptr::from_ref(&self.slots[offset]).cast());
    }

    /// The first offset at or after `from` whose slot is non-empty (by the
    /// occupancy word), or `CHUNK_SIZE` when there is none.
    #[inline(always)]
    pub(crate) fn next_occupied(&self, from: usize) -> usize {
        if from >= CHUNK_SIZE {
            return CHUNK_SIZE;
        }
        let w = self.occupied() & (u64::MAX << from);
        if w == 0 {
            CHUNK_SIZE
        } else {
            w.trailing_zeros() as usize
        }
    }

    #[inline]
    pub(crate) fn count(&self) -> u8 {
        self.count.load(Ordering::Relaxed)
    }
    /// Write a slot no reader can see yet (a Relaxed store).
    #[inline]
    fn init_slot(&self, offset: usize, e: RawEntry) {
        let bit = 1u64 << offset;
        let occ = self.occupied.load(Ordering::Relaxed);
        let occ = if e.is_null() { occ & !bit } else { occ | bit };
        self.occupied.store(occ, Ordering::Relaxed);
        self.slots[offset].init(e)
    }
    /// Fill every slot of a node no reader can see yet with a non-empty
    /// entry, slot `i` getting `f(i)` (Relaxed stores), and set the
    /// occupancy word once to all slots: a loop of `init_slot`s would chain
    /// 64 read-modify-writes of the same word through store forwarding.
    #[inline]
    fn init_full(&self, f: impl Fn(usize) -> RawEntry) {
        for (i, slot) in self.slots.iter().enumerate() {
            let e = f(i);
            debug_assert!(!e.is_null(), "init_full with an empty slot {i}");
            slot.init(e);
        }
        self.occupied.store(FULL, Ordering::Relaxed);
    }
    /// Replace the non-empty entry of a slot with RETRY, leaving the
    /// occupancy word as it is (the slot stays non-empty).
    #[inline]
    fn poison(&self, offset: usize) {
        debug_assert!(self.occupied.load(Ordering::Relaxed) & (1 << offset) != 0);
        self.slots[offset].store(RawEntry::RETRY)
    }
    #[inline]
    fn set_count(&self, c: u8) {
        debug_assert!(c as usize <= CHUNK_SIZE);
        self.count.store(c, Ordering::Relaxed)
    }
    #[inline]
    fn add_count(&self, d: i32) {
        let c = self.count() as i32 + d;
        debug_assert!((0..=CHUNK_SIZE as i32).contains(&c), "count {c}");
        self.count.store(c as u8, Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn nr_values(&self) -> u8 {
        self.nr_values.load(Ordering::Relaxed)
    }
    #[inline]
    fn set_nr_values(&self, c: u8) {
        self.nr_values.store(c, Ordering::Relaxed)
    }
    #[inline]
    fn add_nr_values(&self, d: i32) {
        let c = self.nr_values() as i32 + d;
        debug_assert!((0..=CHUNK_SIZE as i32).contains(&c), "nr_values {c}");
        self.nr_values.store(c as u8, Ordering::Relaxed)
    }

    /// Follow the sibling entry `first`, read from slot `at`, to its
    /// canonical slot in this node; returns the entry there and its offset.
    ///
    /// Lock-free readers race with writers here, and get RETRY (restart from
    /// the head) in two cases: the canonical slot holds a node (a concurrent
    /// split or store replaced the entry), or the sibling slot no longer
    /// holds `first` (the entry was erased and another stored at the
    /// canonical slot, which need not cover the reader's index: the erase
    /// cleared the sibling before that store was published, and the Acquire
    /// load of the canonical slot orders this re-read after both).
    #[inline]
    pub(crate) fn resolve_sibling(&self, at: usize, first: RawEntry) -> (RawEntry, usize) {
        let mut e = first;
        let mut offset = at;
        while e.is_sibling() {
            offset = e.to_sibling();
            e = self.slot(offset);
            if e.is_node() {
                return (RawEntry::RETRY, offset);
            }
        }
        if self.slot(at) != first {
            return (RawEntry::RETRY, offset);
        }
        (e, offset)
    }

    /// The parent node (lock-free readers climb with this).
    #[inline]
    pub(crate) fn parent(&self) -> Option<NonNull<Node>> {
        self.check_live();
        NonNull::new(self.parent.load(Ordering::Acquire))
    }
    #[inline]
    fn set_parent(&self, p: Option<NonNull<Node>>) {
        let p = p.map_or(core::ptr::null_mut(), NonNull::as_ptr);
        self.parent.store(p, Ordering::Release)
    }
    fn set_parent_init(&self, p: Option<NonNull<Node>>) {
        let p = p.map_or(core::ptr::null_mut(), NonNull::as_ptr);
        self.parent.store(p, Ordering::Relaxed)
    }

    // ---- marks ----
    #[inline(always)]
    pub(crate) fn marks(&self, mark: Mark) -> u64 {
        self.check_live();
        self.marks[mark.index()].load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn get_mark(&self, offset: usize, mark: Mark) -> bool {
        self.marks(mark) & (1 << offset) != 0
    }
    /// Set a mark bit; returns whether it was already set.
    #[inline]
    fn set_mark(&self, offset: usize, mark: Mark) -> bool {
        let w = self.marks(mark);
        let bit = 1u64 << offset;
        if w & bit == 0 {
            self.marks[mark.index()].store(w | bit, Ordering::Relaxed);
            false
        } else {
            true
        }
    }
    /// Clear a mark bit; returns whether it was set.
    #[inline]
    fn clear_mark(&self, offset: usize, mark: Mark) -> bool {
        let w = self.marks(mark);
        let bit = 1u64 << offset;
        if w & bit != 0 {
            self.marks[mark.index()].store(w & !bit, Ordering::Relaxed);
            true
        } else {
            false
        }
    }
    #[inline]
    pub(crate) fn any_mark(&self, mark: Mark) -> bool {
        self.marks(mark) != 0
    }
    fn mark_all(&self, mark: Mark) {
        self.marks[mark.index()].store(FULL, Ordering::Relaxed)
    }
    fn set_marks_word(&self, mark: Mark, w: u64) {
        self.marks[mark.index()].store(w & FULL, Ordering::Relaxed)
    }
    /// The marks (bit i = mark i) of one slot.
    pub(crate) fn slot_marks(&self, offset: usize) -> u8 {
        let mut m = 0;
        for mark in Mark::ALL {
            if self.get_mark(offset, mark) {
                m |= 1 << mark.index();
            }
        }
        m
    }
}

/// An owned node not (yet) linked into a tree: freed on drop.
pub(crate) struct NodeBox(NonNull<Node>);

impl NodeBox {
    /// Place the node: its shift, its offset in the parent and the parent
    /// (before it is linked, so plain stores).
    pub(crate) fn place(&mut self, shift: u8, offset: u8, parent: Option<NonNull<Node>>) {
        // SAFETY: we own the allocation exclusively (nobody has seen it).
        let n = unsafe { self.0.as_mut() };
        n.shift = shift;
        n.offset = offset;
        n.set_parent_init(parent);
    }
    /// Give up ownership (the node is being linked into the tree).
    pub(crate) fn into_raw(self) -> NonNull<Node> {
        let p = self.0;
        core::mem::forget(self);
        p
    }
}

impl Drop for NodeBox {
    fn drop(&mut self) {
        // SAFETY: an unlinked node we own; nobody else has seen it.
        unsafe { Node::free(self.0) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fresh_node_is_empty() {
        let nb = Node::alloc(6, 3, None).unwrap();
        let p = nb.into_raw();
        // SAFETY: allocated above and not shared.
        let n = unsafe { p.as_ref() };
        assert_eq!((n.shift, n.offset, n.count(), n.nr_values()), (6, 3, 0, 0));
        assert!(n.parent().is_none());
        assert!((0..CHUNK_SIZE).all(|i| n.slot(i).is_null()));
        assert!(Mark::ALL.iter().all(|&m| !n.any_mark(m)));
        // SAFETY: never linked.
        unsafe { Node::free(p) };
    }

    #[test]
    fn mark_bits() {
        let nb = Node::alloc(0, 0, None).unwrap();
        let p = nb.into_raw();
        // SAFETY: allocated above and not shared.
        let n = unsafe { p.as_ref() };
        assert!(!n.set_mark(5, Mark::M1));
        assert!(n.set_mark(5, Mark::M1), "second set reports it was set");
        assert!(n.get_mark(5, Mark::M1) && !n.get_mark(5, Mark::M0));
        assert_eq!(n.slot_marks(5), 0b010);
        assert!(n.clear_mark(5, Mark::M1));
        assert!(!n.clear_mark(5, Mark::M1));
        assert!(!n.any_mark(Mark::M1));
        n.mark_all(Mark::M2);
        assert!((0..CHUNK_SIZE).all(|i| n.get_mark(i, Mark::M2)));
        n.set_marks_word(Mark::M2, u64::MAX);
        assert_eq!(n.marks(Mark::M2).count_ones() as usize, CHUNK_SIZE);
        // SAFETY: never linked.
        unsafe { Node::free(p) };
    }

    #[test]
    fn fault_injection_fails_allocation() {
        crate::fault::fail_next_allocations(2);
        assert!(Node::alloc(0, 0, None).is_none());
        assert!(Node::alloc(0, 0, None).is_none());
        let ok = Node::alloc(0, 0, None);
        assert!(ok.is_some());
    }

    #[test]
    fn node_fits_the_kernels_budget() {
        // 64 slots + 3 mark words + header: the kernel's xa_node is 576 bytes.
        if CHUNK_SIZE == 64 {
            assert!(
                core::mem::size_of::<Node>() <= 576,
                "{}",
                core::mem::size_of::<Node>()
            );
        }
    }
}
