//! The light readers' fences and the reclaimer's heavy barrier, and the
//! choice between the membarrier mode and the fence mode.
//!
//! Invariant: the mode is chosen once (the first reader or reclaimer to ask)
//! and never changes, and the membarrier mode is chosen only after the
//! process registered for `MEMBARRIER_CMD_PRIVATE_EXPEDITED`. So whenever a
//! reader relies on a compiler fence alone, every heavy barrier is a
//! membarrier.

use crate::sync::{fence, AtomicU8, Ordering};

const UNDECIDED: u8 = 0;
const MEMBARRIER: u8 = 1;
const FENCE: u8 = 2;

crate::sync::global! {
    /// The mode: `UNDECIDED`, then `MEMBARRIER` or `FENCE` for good.
    static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);
}

/// The mode, choosing it on first use.
fn mode() -> u8 {
    let m = MODE.load(Ordering::Relaxed);
    if m != UNDECIDED {
        return m;
    }
    let want = if membarrier::register() {
        MEMBARRIER
    } else {
        FENCE
    };
    // The first choice stands (two threads racing both registered or both
    // failed; a registration that lost to FENCE is unused, which is fine).
    match MODE.compare_exchange(UNDECIDED, want, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => want,
        Err(m) => m,
    }
}

/// Whether readers must issue `fence(SeqCst)` themselves (the fence mode).
pub(super) fn readers_fence() -> bool {
    mode() == FENCE
}

/// The reader's fence after its slot store.
/// (Under loom the mode is always the fence mode.)
#[inline(always)]
pub(super) fn light(fence_mode: bool) {
    #[cfg(not(loom))]
    if !fence_mode {
        // The membarrier mode: the reclaimer's membarrier supplies the
        // hardware fence; this one keeps the compiler from moving the
        // section's loads above the slot store.
        crate::sync::compiler_fence(Ordering::SeqCst);
        return;
    }
    debug_assert!(fence_mode, "loom runs the fence mode");
    fence(Ordering::SeqCst);
}

/// The reclaimer's barrier after the bump: a full fence on every thread
/// of the process (membarrier mode) or a `fence(SeqCst)` here (fence mode).
/// `false` if the membarrier call failed (no grace period can be
/// concluded from this attempt).
pub(super) fn heavy() -> bool {
    if mode() == MEMBARRIER {
        membarrier::private_expedited()
    } else {
        fence(Ordering::SeqCst);
        true
    }
}

#[cfg(all(target_os = "linux", not(miri), not(loom)))]
mod membarrier {
    //! The `membarrier(2)` system call (constants from
    //! `include/uapi/linux/membarrier.h`).
    use libc::c_int;

    const CMD_QUERY: c_int = 0;
    const CMD_PRIVATE_EXPEDITED: c_int = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: c_int = 1 << 4;

    fn call(cmd: c_int) -> libc::c_long {
        // SAFETY: membarrier takes three integers and touches no memory of
        // ours; any failure is reported through the return value.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as c_int, 0 as c_int) }
    }

    /// Register the process for private expedited barriers; whether that
    /// worked (and the environment does not ask for the fence mode).
    pub(super) fn register() -> bool {
        if std::env::var_os("KXARRAY_LIGHTPIN").is_some_and(|v| v == "fence") {
            return false;
        }
        let supported = call(CMD_QUERY);
        supported >= 0
            && supported & libc::c_long::from(CMD_PRIVATE_EXPEDITED) != 0
            && call(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A full memory barrier on every running thread of the process.
    pub(super) fn private_expedited() -> bool {
        let ok = call(CMD_PRIVATE_EXPEDITED) == 0;
        debug_assert!(ok, "membarrier failed after registration");
        ok
    }
}

#[cfg(not(all(target_os = "linux", not(miri), not(loom))))]
mod membarrier {
    //! No membarrier here: always the fence mode.
    pub(super) fn register() -> bool {
        false
    }
    /// Never called: the membarrier mode is never chosen here.
    pub(super) fn private_expedited() -> bool {
        false
    }
}
