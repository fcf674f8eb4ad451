//! The node cache: where tree nodes come from and go back to (the kernel's
//! `radix_tree_node_cachep` slab, in user space).
//!
//! Nodes are carved from 2 MiB regions, each aligned to its size, at a
//! stride of whole cache lines; from the second region on, a region is
//! advised for transparent huge pages (`madvise(MADV_HUGEPAGE)`, Linux), so
//! a large tree's nodes sit in a few huge pages rather than in 4 KiB pages
//! scattered through the heap, and a walk over a large sparse tree misses
//! the TLB far less (see docs/xarray-and-peers.md, "Sparse keys"). A small
//! program's first region stays in 4 KiB pages, so one small tree does not
//! fault in 2 MiB.
//!
//! What it owns:
//! - the regions: a header in the first stride of each, then `PER_REGION`
//!   node slots, each either never used (at or past the region's bump
//!   index), on the region's free list (its first word links the list), or
//!   handed out (counted in the region's `in_use`);
//! - the pool (one lock): the regions that have a slot to give (`partial`),
//!   how many regions exist, how many of the listed regions are empty;
//! - each thread's magazine: up to `MAGAZINE` free nodes, so that most
//!   allocations and frees take no lock. Nodes in a magazine count as
//!   handed out; a thread returns its magazine when it exits.
//!
//! Invariants:
//! - A slot is in at most one place: a tree (or a `NodeBox`, or a `Dying`
//!   waiting for its grace period), a magazine, or its region's free list.
//! - `in_use` of a region is the number of its slots handed out (in trees or
//!   magazines); a region with `in_use == 0` on the list is "empty", and at
//!   most one empty region is kept (the spare); another region that empties
//!   is given back to the global allocator at once.
//! - Every handed-out node is all zeros when `alloc` returns it.
//! - The pool lock is never held while calling the global allocator, so an
//!   allocator that itself uses this crate cannot deadlock on it.
//!
//! Not used under Miri, loom, cargo-fuzz (`cfg(fuzzing)`) or
//! `--cfg kxarray_system_alloc` (`.ci/asan.sh` sets it): there every node is
//! its own global allocation, so those tools see each node's lifetime and
//! a use after free is caught.

// Compiled (and its unit tests run) under Miri too, where nodes do not
// use it.
#![cfg_attr(any(miri, fuzzing, kxarray_system_alloc), allow(dead_code))]

use super::Node;
use crate::sync::{AtomicUsize, Lock, Ordering};
use core::alloc::Layout;
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;

/// Bytes of a region, and its alignment.
pub(crate) const REGION: usize = 2 << 20;
/// Bytes between consecutive nodes of a region: the node, which is a whole
/// number of cache lines.
pub(crate) const STRIDE: usize = core::mem::size_of::<Node>();
/// Node slots in a region (the first stride holds the header).
const PER_REGION: usize = REGION / STRIDE - 1;
/// Most free nodes a thread keeps; it gives back or takes `MAGAZINE / 2` at
/// a time.
const MAGAZINE: usize = 64;

const _: () = assert!(core::mem::size_of::<RegionHeader>() <= STRIDE);
const _: () = assert!(STRIDE.is_multiple_of(64) && core::mem::align_of::<Node>() == 64);
const _: () = assert!(PER_REGION >= 64);

/// A free slot's first word: the next free slot of its region.
struct FreeSlot {
    next: *mut FreeSlot,
}

/// The head of a region. Every field is read and written only under the
/// pool lock.
#[repr(C)]
struct RegionHeader {
    /// The region's free list.
    free: *mut FreeSlot,
    /// Slots `bump..PER_REGION` were never handed out.
    bump: usize,
    /// Slots handed out (in trees or in magazines).
    in_use: usize,
    /// Whether the region is on the pool's list (it has a slot to give).
    listed: bool,
    /// Neighbours on the pool's list (null at the ends); `next` also links
    /// regions being given back.
    prev: *mut RegionHeader,
    next: *mut RegionHeader,
}

impl RegionHeader {
    fn has_free(&self) -> bool {
        !self.free.is_null() || self.bump < PER_REGION
    }
}

/// The regions, under one lock. The pool itself allocates nothing: its
/// list runs through the region headers.
struct Pool {
    /// The regions with a slot to give, most recently listed first.
    head: *mut RegionHeader,
    /// Regions in existence.
    regions: usize,
    /// Listed regions with nothing handed out (at most one, the spare).
    empty: usize,
}

// SAFETY: the region pointers are owned by the pool and touched only under
// its lock.
unsafe impl Send for Pool {}

crate::sync::global! {
    static POOL: Lock<Pool> = Lock::new(Pool {
        head: core::ptr::null_mut(),
        regions: 0,
        empty: 0,
    });
}

/// Regions in existence (`Pool::regions`, readable without the lock).
static REGIONS: AtomicUsize = AtomicUsize::new(0);

/// Free nodes in a fixed array (no heap allocation).
struct Mag {
    len: usize,
    slots: [*mut Node; MAGAZINE],
}

impl Mag {
    const EMPTY: Mag = Mag {
        len: 0,
        slots: [core::ptr::null_mut(); MAGAZINE],
    };
    fn pop(&mut self) -> Option<NonNull<Node>> {
        self.len = self.len.checked_sub(1)?;
        NonNull::new(self.slots[self.len])
    }
    fn push(&mut self, p: NonNull<Node>) {
        self.slots[self.len] = p.as_ptr();
        self.len += 1;
    }
    /// The nodes from `from` on, taken out.
    fn drain_from(&mut self, from: usize) -> impl Iterator<Item = NonNull<Node>> + '_ {
        let to = core::mem::replace(&mut self.len, from);
        self.slots[from..to].iter().filter_map(|&p| NonNull::new(p))
    }
}

/// A thread's magazine, and its count of nodes allocated minus freed
/// (wherever they came from), for tests that check a code path frees
/// every node it allocates.
struct Magazine {
    nodes: RefCell<Mag>,
    balance: Cell<isize>,
}

impl Drop for Magazine {
    fn drop(&mut self) {
        give_back(self.nodes.get_mut().drain_from(0));
    }
}

std::thread_local! {
    static MAGAZINE_TLS: Magazine = const {
        Magazine {
            nodes: RefCell::new(Mag::EMPTY),
            balance: Cell::new(0),
        }
    };
}

fn region_layout() -> Layout {
    // A power of two, not zero: always a valid layout.
    match Layout::from_size_align(REGION, REGION) {
        Ok(l) => l,
        Err(_) => unreachable!("2 MiB is a valid size and alignment"),
    }
}

/// The region header of a node slot.
fn region_of(p: NonNull<Node>) -> NonNull<RegionHeader> {
    // Slots start one stride into their region, so the masked address is
    // the region's base, which is not zero.
    let base = p
        .as_ptr()
        .map_addr(|a| a & !(REGION - 1))
        .cast::<RegionHeader>();
    debug_assert!(!base.is_null());
    // SAFETY: a slot's region base is a live allocation's address, not null.
    unsafe { NonNull::new_unchecked(base) }
}

/// A new region from the global allocator, its header initialised; `None`
/// when the allocator refuses. Called without the pool lock.
fn new_region(advise: bool) -> Option<NonNull<RegionHeader>> {
    // SAFETY: the layout has a non-zero size.
    let base = NonNull::new(unsafe { std::alloc::alloc(region_layout()) })?;
    #[cfg(all(target_os = "linux", not(miri)))]
    if advise {
        // SAFETY: `base..base + REGION` is ours and mapped (just allocated);
        // MADV_HUGEPAGE only changes how the kernel backs it, never its
        // contents. A refusal (no THP support) changes nothing.
        unsafe {
            libc::madvise(base.as_ptr().cast(), REGION, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = advise;
    let header = base.cast::<RegionHeader>();
    // SAFETY: the region is at least a stride long and aligned for the
    // header; nobody else knows it yet.
    unsafe {
        header.write(RegionHeader {
            free: core::ptr::null_mut(),
            bump: 0,
            in_use: 0,
            listed: false,
            prev: core::ptr::null_mut(),
            next: core::ptr::null_mut(),
        });
    }
    Some(header)
}

impl Pool {
    /// Put `r` at the front of the list (it has something to give).
    ///
    /// # Safety
    /// - `r` is a live region of this pool, not listed.
    unsafe fn list(&mut self, r: NonNull<RegionHeader>) {
        // SAFETY: per the contract, a live region; we hold the pool lock.
        let h = unsafe { &mut *r.as_ptr() };
        debug_assert!(!h.listed);
        h.listed = true;
        h.prev = core::ptr::null_mut();
        h.next = self.head;
        // SAFETY: `head`, if not null, is a live listed region (not `r`,
        // which was not listed).
        if let Some(old) = unsafe { self.head.as_mut() } {
            old.prev = r.as_ptr();
        }
        self.head = r.as_ptr();
    }

    /// Take `r` off the list.
    ///
    /// # Safety
    /// - `r` is a live, listed region of this pool.
    unsafe fn unlist(&mut self, r: NonNull<RegionHeader>) {
        // SAFETY: per the contract, a live region; we hold the pool lock.
        let h = unsafe { &mut *r.as_ptr() };
        debug_assert!(h.listed);
        let (prev, next) = (h.prev, h.next);
        h.listed = false;
        h.prev = core::ptr::null_mut();
        h.next = core::ptr::null_mut();
        // SAFETY: a listed region's neighbours are live listed regions,
        // other than `r`.
        match unsafe { prev.as_mut() } {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        // SAFETY: as above.
        if let Some(n) = unsafe { next.as_mut() } {
            n.prev = prev;
        }
    }

    /// Move slots from the listed regions into `out` until it holds `want`.
    fn take(&mut self, out: &mut Mag, want: usize) {
        while out.len < want {
            let Some(r) = NonNull::new(self.head) else {
                return;
            };
            // SAFETY: a listed region is live; we hold the pool lock.
            let h = unsafe { &mut *r.as_ptr() };
            if h.in_use == 0 {
                self.empty -= 1;
            }
            while out.len < want && h.has_free() {
                let slot = if let Some(f) = NonNull::new(h.free) {
                    // SAFETY: a slot on the free list holds its link.
                    h.free = unsafe { f.as_ref().next };
                    f.cast::<Node>()
                } else {
                    h.bump += 1;
                    // SAFETY: slot `bump` (counted from 1, past the header)
                    // lies inside the region, since bump <= PER_REGION.
                    unsafe { r.cast::<u8>().add(h.bump * STRIDE).cast::<Node>() }
                };
                h.in_use += 1;
                out.push(slot);
            }
            if !h.has_free() {
                // SAFETY: `r` is listed.
                unsafe { self.unlist(r) };
            }
        }
    }

    /// Return `p` to its region. A region this empties beyond the spare is
    /// unlinked and pushed onto `released` (through its `next`).
    ///
    /// # Safety
    /// - `p` was handed out by this cache and is no longer used.
    unsafe fn put(&mut self, p: NonNull<Node>, released: &mut *mut RegionHeader) {
        let r = region_of(p);
        // SAFETY: `p` came from a region, which lives while it has slots
        // handed out; we hold the pool lock.
        let h = unsafe { &mut *r.as_ptr() };
        debug_assert!(h.in_use > 0);
        let slot = p.cast::<FreeSlot>();
        // SAFETY: the slot is ours again (the contract), at least a word
        // long and aligned.
        unsafe { slot.write(FreeSlot { next: h.free }) };
        h.free = slot.as_ptr();
        h.in_use -= 1;
        if !h.listed {
            // SAFETY: live and not listed.
            unsafe { self.list(r) };
        }
        if h.in_use == 0 {
            self.empty += 1;
            if self.empty > 1 {
                // SAFETY: listed (above, or before).
                unsafe { self.unlist(r) };
                self.empty -= 1;
                self.regions -= 1;
                // SAFETY: unlisted, so `next` is ours to link with.
                unsafe { (*r.as_ptr()).next = *released };
                *released = r.as_ptr();
            }
        }
    }
}

/// Return `nodes` to their regions under one lock, then give the regions
/// this emptied (beyond the spare) back to the global allocator.
fn give_back(nodes: impl Iterator<Item = NonNull<Node>>) {
    let mut released: *mut RegionHeader = core::ptr::null_mut();
    {
        let mut pool = POOL.lock();
        for p in nodes {
            // SAFETY: only unused, handed-out slots are given back.
            unsafe { pool.put(p, &mut released) };
        }
    }
    while let Some(r) = NonNull::new(released) {
        // SAFETY: `put` linked it after unlisting it with nothing handed
        // out; nobody else knows it now, so its header is ours to read.
        released = unsafe { (*r.as_ptr()).next };
        REGIONS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: as above; allocated by `new_region` with this layout.
        unsafe { std::alloc::dealloc(r.as_ptr().cast(), region_layout()) };
    }
}

/// Fill `out` up to `want` slots, making a region when none has one; false
/// when the global allocator refuses.
fn refill(out: &mut Mag, want: usize) -> bool {
    loop {
        let advise = {
            let mut pool = POOL.lock();
            pool.take(out, want);
            if out.len > 0 {
                return true;
            }
            pool.regions >= 1
        };
        // Outside the lock: the global allocator may be anything.
        let Some(r) = new_region(advise) else {
            return false;
        };
        REGIONS.fetch_add(1, Ordering::Relaxed);
        let mut pool = POOL.lock();
        pool.regions += 1;
        pool.empty += 1;
        // SAFETY: a fresh region, not listed.
        unsafe { pool.list(r) };
    }
}

/// A zeroed node slot, or `None` when the global allocator refuses.
#[inline]
pub(super) fn alloc() -> Option<NonNull<Node>> {
    let p = MAGAZINE_TLS
        .try_with(|m| {
            let p = match m.nodes.try_borrow_mut() {
                Ok(mut mag) => match mag.pop() {
                    Some(p) => Some(p),
                    None if refill(&mut mag, MAGAZINE / 2) => mag.pop(),
                    None => None,
                },
                // Re-entered (from the global allocator): bypass the
                // magazine.
                Err(_) => alloc_one(),
            };
            if p.is_some() {
                m.balance.set(m.balance.get() + 1);
            }
            p
        })
        // This thread's magazine is gone (thread exit).
        .unwrap_or_else(|_| alloc_one())?;
    // SAFETY: a handed-out slot is `STRIDE >= size_of::<Node>()` bytes of
    // its region, aligned to 64, and ours alone. All-zero bytes are a valid
    // Node (integers and atomic integers only).
    unsafe { p.as_ptr().write_bytes(0, 1) };
    Some(p)
}

/// One slot, without a magazine.
fn alloc_one() -> Option<NonNull<Node>> {
    let mut one = Mag::EMPTY;
    if !refill(&mut one, 1) {
        return None;
    }
    one.pop()
}

/// Give a node slot back.
///
/// # Safety
/// - `p` came from [`alloc`] and nothing uses it any more.
#[inline]
pub(super) unsafe fn free(p: NonNull<Node>) {
    debug_assert!(p.addr().get().is_multiple_of(64));
    let kept = MAGAZINE_TLS.try_with(|m| {
        m.balance.set(m.balance.get() - 1);
        let Ok(mut mag) = m.nodes.try_borrow_mut() else {
            return false;
        };
        if mag.len == MAGAZINE {
            give_back(mag.drain_from(MAGAZINE / 2));
        }
        mag.push(p);
        true
    });
    if kept != Ok(true) {
        give_back(core::iter::once(p));
    }
}

/// Nodes this thread allocated minus those it freed, since it started.
pub(crate) fn thread_balance() -> isize {
    MAGAZINE_TLS.try_with(|m| m.balance.get()).unwrap_or(0)
}

/// Regions (2 MiB each) the cache holds now, over all threads.
pub(crate) fn regions() -> usize {
    REGIONS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_zeroed_aligned_and_distinct() {
        let before = thread_balance();
        let n = if cfg!(miri) { 100 } else { 3 * PER_REGION };
        let mut v: Vec<NonNull<Node>> = (0..n).map(|_| alloc().unwrap()).collect();
        assert_eq!(thread_balance() - before, v.len() as isize);
        for p in &v {
            assert_eq!(p.addr().get() % 64, 0);
            // SAFETY: allocated above, unused.
            let bytes = unsafe {
                core::slice::from_raw_parts(p.as_ptr().cast::<u8>(), core::mem::size_of::<Node>())
            };
            assert!(bytes.iter().all(|&b| b == 0));
            // dirty it, so a reuse that skipped the zeroing would show
            // SAFETY: as above.
            unsafe {
                p.as_ptr()
                    .cast::<u8>()
                    .write_bytes(0xa5, core::mem::size_of::<Node>())
            };
        }
        let mut addrs: Vec<usize> = v.iter().map(|p| p.addr().get()).collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), v.len(), "a slot handed out twice");
        assert!(addrs.windows(2).all(|w| w[1] - w[0] >= STRIDE));
        for p in v.drain(..) {
            // SAFETY: from `alloc`, no longer used.
            unsafe { free(p) };
        }
        assert_eq!(thread_balance(), before);
        let again = alloc().unwrap();
        // SAFETY: as above.
        let bytes = unsafe {
            core::slice::from_raw_parts(again.as_ptr().cast::<u8>(), core::mem::size_of::<Node>())
        };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a reused slot was not zeroed"
        );
        // SAFETY: as above.
        unsafe { free(again) };
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "a thousand interpreted allocations; too slow under Miri"
    )]
    fn frees_from_other_threads_are_reused() {
        // Other tests of this binary allocate and free nodes at the same
        // time: they may take the freed slots first, or empty a region so
        // that it is given back. So one attempt may see no reuse; a cache
        // that never reuses a slot freed by another thread fails them all.
        let reused: Vec<usize> = (0..8).map(|_| cross_thread_reuse()).collect();
        assert!(
            reused.iter().any(|&r| r > 0),
            "reused per attempt: {reused:?}"
        );
    }

    /// Allocate 1000 nodes here, free them on another thread, allocate
    /// 1000 again here: how many of the new ones are old addresses.
    fn cross_thread_reuse() -> usize {
        let ptrs: Vec<usize> = (0..1000)
            .map(|_| alloc().unwrap().as_ptr().expose_provenance())
            .collect();
        let got = std::thread::spawn(move || {
            for &a in &ptrs {
                let p = NonNull::new(core::ptr::with_exposed_provenance_mut::<Node>(a)).unwrap();
                // SAFETY: from `alloc` on the parent thread, unused.
                unsafe { free(p) };
            }
            ptrs
        })
        .join()
        .unwrap();
        // Every slot is back in a region (the thread's magazine was
        // returned at its exit), so allocating again may reuse them.
        let again: Vec<NonNull<Node>> = (0..1000).map(|_| alloc().unwrap()).collect();
        let reused = again
            .iter()
            .filter(|p| got.contains(&p.addr().get()))
            .count();
        for p in again {
            // SAFETY: from `alloc`, unused.
            unsafe { free(p) };
        }
        reused
    }
}
