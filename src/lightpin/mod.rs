//! Light read-side pins: an asymmetric-fence epoch for the crate's own
//! value-only lock-free reads (`XArray::load_value`), the user-space-RCU
//! "membarrier" flavour.
//!
//! A crossbeam `pin()` costs a thread-local lookup, a locked instruction
//! (its `SeqCst` fence on x86) and, every 128 pins, a collection; the locked
//! instruction also stops the core from overlapping the cache misses of
//! consecutive lookups. A light pin is a relaxed-cost store to this thread's
//! slot and a compiler fence: the fence the reader needs is issued on its
//! behalf by the reclaimer, with `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`.
//!
//! What it owns:
//! - the global light epoch and the per-thread reader slots
//!   ([`registry`]): a slot holds `0` outside a light section and
//!   `(epoch << 1) | ACTIVE` inside one;
//! - the choice between the membarrier and the fence mode ([`barrier`]);
//! - the light limbo ([`limbo`]): tree nodes whose crossbeam grace period is
//!   over, freed only after a light grace period too.
//!
//! Reader (`read`): load the epoch (Acquire), store `(epoch << 1) | ACTIVE`
//! to the slot (Release), then `compiler_fence(SeqCst)` (membarrier mode) or
//! `fence(SeqCst)` (fence mode); run the section; store `0` (Release).
//! Reclaimer (`limbo::reclaim`): take the nodes in limbo, bump the epoch to
//! `e` (AcqRel), issue the heavy barrier (membarrier, or `fence(SeqCst)`),
//! then scan every slot (Acquire) and free the batch only if no slot is
//! ACTIVE with an epoch below `e`; otherwise keep it (with `e`) for a later
//! scan. Nothing ever waits for a reader.
//!
//! Soundness. A batch holds nodes that were unlinked from their trees (the
//! stores U making them unreachable) before crossbeam ran their deferred
//! free, which pushed them to the limbo, before the bump: U happens before
//! the bump and the heavy barrier. Take a light reader R and a node N of the
//! batch. membarrier makes R's compiler fence act, for this pairing, as a
//! `SeqCst` fence that is ordered, in the single total order of `SeqCst`
//! fences, either before or after the reclaimer's barrier (the kernel runs a
//! full barrier on every CPU running one of our threads, and a thread that
//! is not running passed one when it was switched out); in fence mode both
//! are real `SeqCst` fences.
//! - R's fence after the barrier: R's loads after its fence see U (U happens
//!   before the barrier), so R cannot reach N.
//! - R's fence before the barrier: R's slot store precedes its fence, so the
//!   scan, after the barrier, reads that store or a later one. If it reads
//!   the ACTIVE value, the batch is kept unless R's epoch is at least `e`;
//!   an Acquire load of the epoch that read the bump (or later) makes U
//!   happen before R's loads, so such an R cannot reach N either. If it reads
//!   a later value, that is R's unpin (or a later pin), a Release store after
//!   all of R's reads, so those reads happen before the free.
//!
//! A kept batch is checked again by later scans without a new barrier: the
//! argument above needs only a scan after the batch's own barrier.
//!
//! Who may use it: only crate code that never runs user code while pinned
//! (no callback, no item dropped), so a light section is short, never nests
//! by surprise and never blocks on a lock: `XArray::load_value` (nodes and
//! entry words only) and the page cache's read hit (`CachedFile::read_at`:
//! nodes, the folio an address space holds, the folio's buffer, and a copy
//! into the caller's buffer). It protects nodes; the targets of items of an
//! array made `with_light_items` (the page cache's address spaces), whose
//! drops go through crossbeam and then this limbo (`dispose_item`); and
//! folio buffers, retired the same way (`filemap::mem`). Items of other
//! arrays are freed after crossbeam's grace period alone, so a light
//! section must not touch them. The soundness argument below is the same
//! for every such object: it was unlinked before its crossbeam-deferred
//! free pushed it to the limbo. Nodes of
//! a tree reached through `&mut` (the unprotected guard) are freed at once,
//! which is fine since no reader, light or not, can hold `&XArray` then; an
//! `XArray` itself must not be freed through the epoch while a light reader
//! may hold `&` to it: the chunked index's overflow chunks are, so reads
//! there use crossbeam guards, which hold back a chunk's teardown; its
//! direct chunks live as long as the index, so `ChunkedXArray::load_value`
//! takes a light pin for them.
//!
//! Sections never nest: the crate never starts one inside another, and a
//! signal handler calling `load_value` while its thread is inside one is
//! not supported (the first call of a thread allocates anyway, which is not
//! async-signal-safe).
//!
//! Costs outside the reader: a reclaim attempt (every `BATCH` nodes, or a
//! queued drain) runs inside whichever crossbeam collection ran the nodes'
//! deferred frees, so an occasional `pin()` also pays one membarrier
//! system call. If that call ever fails after registration, the batch is
//! kept (and retried), never freed without its barrier.
//!
//! The mode: membarrier on Linux when `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`
//! succeeds, the fence mode otherwise (other systems, seccomp, Miri, loom,
//! or `KXARRAY_LIGHTPIN=fence` in the environment when the mode is chosen),
//! chosen once and never changed.

mod barrier;
mod limbo;
mod registry;

pub(crate) use limbo::arrivals;
pub(crate) use limbo::bulk;
#[cfg(all(test, not(loom)))]
use limbo::defer_free;
pub(crate) use limbo::reclaim;

use crate::guard::ProtectsNodes;
use crate::sync::Ordering;
use core::marker::PhantomData;
use registry::{Slot, ACTIVE};
use std::sync::Arc;

/// The witness of a light section (the nodes reachable while it is
/// borrowed stay allocated). Not `Send`: it belongs to this thread's slot.
#[derive(Debug)]
pub(crate) struct LightPin {
    _not_send: PhantomData<*const ()>,
}

// SAFETY: folio buffers are retired through crossbeam and then the light
// limbo (`filemap::mem`'s `Buf::retire`), which waits for every light
// section that may have seen them.
unsafe impl crate::guard::ProtectsBuffers for LightPin {}

// SAFETY: node frees wait for a light grace period after crossbeam's
// (`Dying::retire` into `limbo`), and a light grace period waits for every
// light section that may have seen the node (module comment).
unsafe impl ProtectsNodes for LightPin {}

/// Where this thread's slot pointer stands when it is not a slot.
const UNCLAIMED: usize = 0;
/// This thread's reader was torn down (thread exit): fall back.
const GONE: usize = 1;

crate::sync::thread_local_const! {
    /// This thread's slot (`UNCLAIMED` before the first section, `GONE`
    /// after the thread's [`Owner`] was dropped). Const-initialised without
    /// a destructor, so the fast path is one thread-local load.
    static SLOT: core::cell::Cell<*const Slot> =
        core::cell::Cell::new(core::ptr::without_provenance(UNCLAIMED));
}

/// Keeps this thread's slot claimed; its drop (at thread exit) releases
/// the slot and marks the thread's pointer `GONE`.
struct Owner(core::cell::RefCell<Option<Arc<Slot>>>);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(slot) = self.0.get_mut().take() {
            let _ = SLOT.try_with(|p| p.set(core::ptr::without_provenance(GONE)));
            slot.release();
        }
    }
}

crate::sync::thread_local_const! {
    static OWNER: Owner = Owner(core::cell::RefCell::new(None));
}

/// This thread's slot, claimed on first use; `None` once the thread's
/// reader is torn down.
#[inline(always)]
fn slot() -> Option<&'static Slot> {
    let p = SLOT.try_with(|p| p.get()).ok()?;
    if (p as usize) > GONE {
        // SAFETY: a non-sentinel pointer was set by `claim_slot` from an
        // `Arc<Slot>` that `OWNER` keeps until it resets the pointer to
        // `GONE`, and the registry keeps a clone for the process's life.
        return Some(unsafe { &*p });
    }
    claim_slot(p)
}

#[cold]
fn claim_slot(p: *const Slot) -> Option<&'static Slot> {
    if p as usize == GONE {
        return None;
    }
    let slot = registry::claim(barrier::readers_fence());
    let ptr = Arc::as_ptr(&slot);
    OWNER
        .try_with(|o| *o.0.borrow_mut() = Some(slot.clone()))
        .ok()?;
    SLOT.try_with(|c| c.set(ptr)).ok()?;
    // SAFETY: `OWNER` holds an `Arc` to it from now on (see `slot`).
    Some(unsafe { &*ptr })
}

impl Slot {
    #[inline(always)]
    fn section<R>(&self, f: impl FnOnce(&LightPin) -> R) -> R {
        let state = &self.state;
        let pin = LightPin {
            _not_send: PhantomData,
        };
        // Light sections never nest: only crate code that calls nothing
        // else runs inside one.
        debug_assert_eq!(state.load(Ordering::Relaxed), 0, "nested light section");
        let e = registry::epoch();
        debug_assert!(e != 0 && e < u64::MAX >> 1, "light epoch out of range");
        // Release: a scan that reads this value sees the previous section's
        // reads done (see the module comment).
        state.store((e << 1) | ACTIVE, Ordering::Release);
        barrier::light(self.fence_mode());
        /// Ends the section, also if `f` unwinds.
        struct Unpin<'a>(&'a crate::sync::AtomicU64);
        impl Drop for Unpin<'_> {
            #[inline(always)]
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _unpin = Unpin(state);
        f(&pin)
    }
}

/// Run `f` in a light section of this thread: the tree nodes it reaches
/// under the [`LightPin`] stay allocated until it returns. `None` (and `f`
/// not run) when this thread's reader is already torn down (thread exit);
/// the caller then reads under a crossbeam guard.
///
/// `f` must be crate code that touches nodes and entry words only: no item,
/// no user callback, no lock, no other light section (the module comment).
#[inline(always)]
pub(crate) fn read<R>(f: impl FnOnce(&LightPin) -> R) -> Option<R> {
    Some(slot()?.section(f))
}

/// Choose the barrier mode now (registering for `membarrier` if it is
/// the mode). A cache calls it when it is made: the kernel registers a
/// process that has one thread at once, but one with several threads only
/// after an RCU grace period (`sync_runqueues_membarrier_state`: 15 ms in
/// the `sqlite3` shell, whose VFS had started its pressure monitor's
/// thread before the first read chose the mode).
pub(crate) fn prepare() {
    let _ = barrier::readers_fence();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::AtomicBool;
    use core::ptr::NonNull;

    #[test]
    fn sections_mark_the_slot_and_unmark_it() {
        let seen = read(|_| slot().unwrap().state.load(Ordering::Relaxed)).unwrap();
        assert_eq!(seen & ACTIVE, ACTIVE);
        assert!(seen >> 1 >= 1);
        assert_eq!(slot().unwrap().state.load(Ordering::Relaxed), 0);
        // another thread gets another slot, and gives it back at exit
        let mine = slot().unwrap() as *const Slot as usize;
        let theirs = std::thread::spawn(|| {
            read(|_| ()).unwrap();
            slot().unwrap() as *const Slot as usize
        })
        .join()
        .unwrap();
        assert_ne!(mine, theirs);
    }

    static FREED: AtomicBool = AtomicBool::new(false);

    /// # Safety
    /// `p` is the leaked box of `limbo_drains_...`.
    unsafe fn free_marker(p: NonNull<u8>) {
        debug_assert!(!FREED.load(Ordering::Relaxed));
        // SAFETY: per the contract, a `Box<u64>` leaked by the test, freed once.
        drop(unsafe { Box::from_raw(p.cast::<u64>().as_ptr()) });
        FREED.store(true, Ordering::SeqCst);
    }

    #[test]
    fn limbo_drains_and_waits_for_active_sections() {
        let p = NonNull::from(Box::leak(Box::new(7u64))).cast::<u8>();
        // A light section on another thread, held open across reclaims.
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            read(|_| {
                entered_tx.send(()).unwrap();
                leave_rx.recv().unwrap();
            })
            .unwrap();
        });
        entered_rx.recv().unwrap();
        // SAFETY: nobody else has the box; `free_marker` frees it once.
        unsafe { defer_free(p, free_marker, 0) };
        for _ in 0..3 {
            reclaim();
        }
        assert!(
            !FREED.load(Ordering::SeqCst),
            "freed while a section that began before its retirement was open"
        );
        leave_tx.send(()).unwrap();
        t.join().unwrap();
        // Only the crossbeam-driven drain (the closure `defer_free` queued)
        // or direct reclaims free it now; drive crossbeam like a program
        // that keeps pinning would.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !FREED.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            crate::guard::pin().flush();
            std::thread::yield_now();
        }
        assert!(FREED.load(Ordering::SeqCst), "the limbo never drained");
    }

    #[test]
    fn load_value_races_node_frees() {
        // A writer grows and shrinks a tree (each round retires its nodes
        // and drives crossbeam and the limbo) while a reader descends it
        // with light pins; under Miri a premature free or a data race is
        // reported. Every value read is the one stored for its index.
        use crate::{Entry, XArray};
        let rounds = if cfg!(miri) { 12 } else { 400 };
        let xa: std::sync::Arc<XArray<Box<u64>>> = std::sync::Arc::new(XArray::new());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reader = {
            let (xa, stop) = (xa.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in [0u64, 1, 64, 65, 4095, 4096, 1 << 20] {
                        if let Some(v) = xa.load_value(i) {
                            assert_eq!(v, i + 1);
                            seen += 1;
                        }
                    }
                }
                seen
            })
        };
        for _ in 0..rounds {
            for i in [1u64, 64, 65, 4095, 4096, 1 << 20] {
                xa.store(i, Entry::Value(i + 1)).unwrap();
            }
            for i in [1u64, 64, 65, 4095, 4096, 1 << 20] {
                xa.erase(i);
            }
            crate::guard::pin().flush();
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(xa.node_count(), 0);
    }
}
