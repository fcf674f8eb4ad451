//! The light readers' registry: the global light epoch and one slot per
//! thread that has taken a light pin.
//!
//! Invariants: a slot is owned by at most one live thread (claimed under
//! the registry lock, released when its thread's reader is dropped) and is
//! never removed, so a thread's `Arc` and the scans always see the same
//! slot; a slot is `0` unless its owner is inside a light section. The
//! epoch starts at 1 and only grows (by one per reclaim attempt).

use crate::sync::{AtomicBool, AtomicU64, Lock, Ordering};
use std::sync::Arc;

/// The low bit of a slot: its thread is inside a light section.
pub(super) const ACTIVE: u64 = 1;

/// One thread's reader slot, alone on its cache lines (readers write it on
/// every section, the reclaimer reads all of them).
#[repr(align(128))]
#[derive(Debug)]
pub(super) struct Slot {
    /// `0` outside a section, `(epoch << 1) | ACTIVE` inside one.
    pub(super) state: AtomicU64,
    /// Whether a live thread owns the slot.
    owned: AtomicBool,
    /// The fence mode (`barrier::readers_fence`), set when claimed.
    fence: AtomicBool,
}

crate::sync::global! {
    /// The global light epoch.
    static EPOCH: AtomicU64 = AtomicU64::new(1);
}

crate::sync::global! {
    /// Every slot ever made; reused, never removed.
    static SLOTS: Lock<Vec<Arc<Slot>>> = Lock::new(Vec::new());
}

/// The current light epoch, for a reader entering a section (Acquire: a
/// reader that sees a bump sees what happened before it).
#[inline(always)]
pub(super) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// Start a grace period: bump the epoch and return the new value. A
/// reader that loads it or a later value cannot reach what was unlinked
/// before the bump.
pub(super) fn bump() -> u64 {
    EPOCH.fetch_add(1, Ordering::AcqRel) + 1
}

/// Claim a free slot for this thread, or make one; `fence`: the readers'
/// mode.
pub(super) fn claim(fence: bool) -> Arc<Slot> {
    let mut slots = SLOTS.lock();
    for s in slots.iter() {
        if s.owned
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            debug_assert_eq!(s.state.load(Ordering::Relaxed), 0);
            s.fence.store(fence, Ordering::Relaxed);
            return s.clone();
        }
    }
    let s = Arc::new(Slot {
        state: AtomicU64::new(0),
        owned: AtomicBool::new(true),
        fence: AtomicBool::new(fence),
    });
    slots.push(s.clone());
    s
}

impl Slot {
    /// Whether its owner issues `fence(SeqCst)` itself (the fence mode).
    #[inline(always)]
    pub(super) fn fence_mode(&self) -> bool {
        self.fence.load(Ordering::Relaxed)
    }

    /// Give the slot back (its thread is exiting, outside any section).
    pub(super) fn release(&self) {
        debug_assert_eq!(self.state.load(Ordering::Relaxed), 0);
        self.owned.store(false, Ordering::Release);
    }
}

/// The oldest epoch a thread inside a light section entered with,
/// `u64::MAX` when no thread is inside one.
pub(super) fn oldest_active() -> u64 {
    let slots = SLOTS.lock();
    slots
        .iter()
        .map(|s| s.state.load(Ordering::Acquire))
        .filter(|v| v & ACTIVE != 0)
        .map(|v| v >> 1)
        .min()
        .unwrap_or(u64::MAX)
}
