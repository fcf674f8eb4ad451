//! The light limbo: objects (tree nodes) whose crossbeam grace period is
//! over, held until a light grace period (the parent module's comment) lets
//! them be freed.
//!
//! Invariants:
//! - `open` holds objects pushed since the last attempt; `sealed` holds
//!   batches whose heavy barrier (after the bump to their epoch) is done,
//!   so a scan made after they were taken from the limbo decides them.
//! - While the limbo holds anything, a drain is queued in crossbeam's
//!   default collector (`drain_queued`), so the limbo empties as long as
//!   the program keeps pinning (as crossbeam's own garbage does), even if
//!   nothing else is ever retired. A full `open` batch (`BATCH` objects) is
//!   attempted at once by the thread that filled it.
//! - Nothing here waits for a reader: a batch that a reader still holds is
//!   kept for a later attempt.

use super::{barrier, registry};
use crate::sync::Lock;
use core::ptr::NonNull;

/// Objects per batch that trigger an immediate attempt: one membarrier per
/// 256 nodes (140 KB); under loom and Miri every object, so that the models
/// and the Miri tests free while readers run.
const BATCH: usize = if cfg!(any(loom, miri)) { 1 } else { 256 };

/// Bytes (as the pushers weigh their objects) that trigger an immediate
/// attempt too: 2 MiB. Folio buffers are up to 2 MiB each, so 256 of them
/// would hold far more memory out of reach than 256 nodes (a
/// cache of 64 KiB folios kept 16 MiB beyond its capacity waiting here).
const BATCH_BYTES: usize = 2 << 20;

/// Where crossbeam's deferred frees hand their objects over: normally
/// straight to [`defer_free`]. Under loom, a model's statics are torn down
/// before crossbeam's collector runs what is left in it, so a free running
/// then must not touch them: the handle carries its own queue (a lock loom
/// does not model), which the next [`arrivals`] call inside the model
/// moves into the limbo.
pub(crate) struct Arrivals {
    #[cfg(loom)]
    queue: std::sync::Arc<crate::sync::PlainLock<Vec<Garbage>>>,
}

#[cfg(loom)]
loom::lazy_static! {
    static ref ARRIVED: std::sync::Arc<crate::sync::PlainLock<Vec<Garbage>>> =
        std::sync::Arc::new(crate::sync::PlainLock::new(Vec::new()));
}

/// The handle a retirement gives its deferred free (under loom, this also
/// moves the objects that arrived since the last call into the limbo).
pub(crate) fn arrivals() -> Arrivals {
    #[cfg(loom)]
    {
        let arrived = core::mem::take(&mut *ARRIVED.lock().unwrap_or_else(|e| e.into_inner()));
        for g in arrived {
            // SAFETY: handed over by `Arrivals::push`, whose contract is
            // `defer_free`'s.
            unsafe { defer_free(g.addr, g.free, 0) };
        }
        Arrivals {
            queue: ARRIVED.clone(),
        }
    }
    #[cfg(not(loom))]
    Arrivals {}
}

impl core::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.pad("Arrivals")
    }
}

impl Arrivals {
    /// Hand `addr` over for its light grace period.
    ///
    /// # Safety
    ///
    /// As for [`defer_free`].
    #[inline]
    pub(crate) unsafe fn push(self, addr: NonNull<u8>, free: unsafe fn(NonNull<u8>)) {
        // SAFETY: forwarded.
        unsafe { self.push_sized(addr, free, 0) }
    }

    /// [`Arrivals::push`] for an object holding `bytes` of memory (a folio
    /// buffer): the limbo attempts a grace period early once the bytes it
    /// holds reach [`BATCH_BYTES`].
    ///
    /// # Safety
    ///
    /// As for [`defer_free`].
    #[inline]
    pub(crate) unsafe fn push_sized(
        self,
        addr: NonNull<u8>,
        free: unsafe fn(NonNull<u8>),
        bytes: usize,
    ) {
        debug_assert!(addr.as_ptr() as usize != 0);
        #[cfg(loom)]
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Garbage { addr, free });
        #[cfg(loom)]
        let _ = bytes;
        #[cfg(not(loom))]
        // SAFETY: forwarded from this function's contract.
        unsafe {
            defer_free(addr, free, bytes)
        }
    }
}

/// One object waiting for its light grace period.
struct Garbage {
    addr: NonNull<u8>,
    free: unsafe fn(NonNull<u8>),
}

// SAFETY: only ever freed once by `free`, which `defer_free`'s contract
// allows from any thread; nothing else dereferences `addr`.
unsafe impl Send for Garbage {}

struct Limbo {
    open: Vec<Garbage>,
    /// Bytes the objects in `open` hold, as their pushers weighed them.
    open_bytes: usize,
    sealed: Vec<(u64, Vec<Garbage>)>,
    drain_queued: bool,
}

crate::sync::global! {
    static LIMBO: Lock<Limbo> = Lock::new(Limbo {
        open: Vec::new(),
        open_bytes: 0,
        sealed: Vec::new(),
        drain_queued: false,
    });
}

/// Free `addr` with `free` once every light section that may have reached
/// it has ended.
///
/// # Safety
///
/// - No reader that pins from now on (crossbeam or light) can reach
///   `addr`: it was unlinked, and every crossbeam guard that could have seen
///   it is gone (this runs from the object's crossbeam-deferred free).
/// - This is the only reference that will free it; `free(addr)` frees it
///   and may run on any thread.
pub(super) unsafe fn defer_free(addr: NonNull<u8>, free: unsafe fn(NonNull<u8>), bytes: usize) {
    debug_assert!(addr.as_ptr() as usize != 0);
    let (full, queue) = {
        let mut l = LIMBO.lock();
        l.open.push(Garbage { addr, free });
        l.open_bytes += bytes;
        let queue = !l.drain_queued;
        l.drain_queued = true;
        (l.open.len() >= BATCH || l.open_bytes >= BATCH_BYTES, queue)
    };
    if queue {
        queue_drain();
    }
    if full && !in_bulk() {
        reclaim();
    }
}

crate::sync::thread_local_const! {
    /// Open [`Bulk`] scopes on this thread.
    static BULK: core::cell::Cell<u32> = core::cell::Cell::new(0);
}

/// A scope in which this thread's pushes to the limbo make no attempt of
/// their own (one `membarrier` per 256 objects): a bulk release (a whole
/// file's folios when its last handle goes: 110,000 buffers for a 456 MB
/// file made 430 barriers, tens of milliseconds at a process's exit) makes
/// one attempt when the scope ends. The objects wait in the limbo
/// meanwhile, as they would for a reader; the queued drain still runs.
#[must_use = "the scope ends when the value is dropped"]
pub(crate) struct Bulk(());

/// Whether this thread is inside a [`Bulk`] scope.
fn in_bulk() -> bool {
    BULK.with(|b| b.get()) > 0
}

/// Open a [`Bulk`] scope on this thread.
pub(crate) fn bulk() -> Bulk {
    BULK.with(|b| b.set(b.get() + 1));
    Bulk(())
}

impl Drop for Bulk {
    fn drop(&mut self) {
        let left = BULK.with(|b| {
            b.set(b.get() - 1);
            b.get()
        });
        if left == 0 {
            reclaim();
        }
    }
}

/// Queue a drain in crossbeam's default collector: it runs at a later
/// collection, on whichever thread pins then.
///
/// Not under loom: loom tears a model's statics down before crossbeam's
/// collector runs what is left in it, and a drain run then would touch
/// them. The models rely on `BATCH` being 1 there instead.
#[cfg(loom)]
fn queue_drain() {}

/// Queue a drain in crossbeam's default collector: it runs at a later
/// collection, on whichever thread pins then.
#[cfg(not(loom))]
fn queue_drain() {
    let guard = crate::guard::pin();
    // SAFETY: the closure frees only what `reclaim` proves no reader can
    // reach; it may run on any thread at any later time.
    unsafe { guard.defer_unchecked(drain) }
}

/// The queued drain: an attempt, then queue another if anything is left.
#[cfg(not(loom))]
fn drain() {
    if in_bulk() {
        // Run inside a bulk scope on this thread: its end attempts. Stay
        // queued (`drain_queued` is still set) for the pins after it.
        queue_drain();
        return;
    }
    LIMBO.lock().drain_queued = false;
    reclaim();
    let again = {
        let mut l = LIMBO.lock();
        let left = !l.open.is_empty() || !l.sealed.is_empty();
        let again = left && !l.drain_queued;
        l.drain_queued |= left;
        again
    };
    if again {
        queue_drain();
    }
}

/// One attempt: seal the open batch (bump, heavy barrier), then scan the
/// readers once and free every sealed batch no reader can still hold.
/// Never waits.
pub(crate) fn reclaim() {
    let (open, mut sealed) = {
        let mut l = LIMBO.lock();
        l.open_bytes = 0;
        (core::mem::take(&mut l.open), core::mem::take(&mut l.sealed))
    };
    if !open.is_empty() {
        let e = registry::bump();
        if barrier::heavy() {
            sealed.push((e, open));
        } else {
            LIMBO.lock().open.extend(open);
        }
    }
    if sealed.is_empty() {
        return;
    }
    // Every batch in `sealed` had its barrier before this scan.
    let oldest = registry::oldest_active();
    let (done, keep): (Vec<_>, Vec<_>) = sealed.into_iter().partition(|&(e, _)| e <= oldest);
    if !keep.is_empty() {
        LIMBO.lock().sealed.extend(keep);
    }
    for (_, batch) in done {
        for g in batch {
            // SAFETY: pushed by `defer_free` (unreachable for new readers,
            // freed only here) and its light grace period is over: no
            // section older than the batch's epoch is active.
            unsafe { (g.free)(g.addr) }
        }
    }
}
