//! Which process an engine belongs to: a fork generation, bumped in every
//! child `fork(2)` makes, so an engine (its rings, their in-flight tables,
//! its pool threads) can tell it was inherited from the parent and must not
//! be touched.
//!
//! Why: after `fork` the child holds the ring's descriptor and its shared
//! submission and completion queues (the same pages as the parent's), a
//! copy of the in-flight table and none of the engine's threads. A child
//! that submits to the inherited ring puts its request into the parent's
//! ring, and the parent's reaper completes one of its own requests with the
//! child's result; a child that drains it steals the parent's completions.
//!
//! Owns the generation counter and its `pthread_atfork` child handler.
//! Invariants:
//! - [`generation`] is the same in a process from the first call of
//!   [`watch`] on, until that process forks: the child then sees a greater
//!   value (the handler runs in the child, before `fork` returns there);
//! - the handler only increments an atomic (async-signal-safe, as a
//!   handler run in a child of a multithreaded process must be);
//! - a process that never forks pays one relaxed load per check.
//!
//! A child made without the C library's `fork` (a raw `clone` system call)
//! runs no handler; such a child must not use an engine it inherited (it
//! usually calls `execve` at once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// Bumped in each child, by the `pthread_atfork` handler.
static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Install the handler (once per process; an engine calls this when it is
/// made, before recording [`generation`]). Returns the generation.
pub(crate) fn watch() -> u64 {
    static ONCE: Once = Once::new();
    #[cfg(target_os = "linux")]
    ONCE.call_once(|| {
        // SAFETY: `in_child` is a plain `extern "C" fn()` living for the
        // whole process, and async-signal-safe (one atomic increment);
        // the other two handlers are absent (null is allowed).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            log::warn!(
                "kxarray: pthread_atfork failed ({rc}): a forked child must not use this process's I/O engine"
            );
        }
    });
    generation()
}

/// This process's fork generation (see the module notes).
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}
