//! Fault injection, so tests can drive the out-of-memory paths (the
//! kernel's user-space harness fails `GFP_NOWAIT` allocations for the same
//! reason) and the panic-safety path (a panic in the middle of a write).
//!
//! The knob is per thread, so parallel tests do not disturb each other:
//! [`fail_next_allocations`] makes the next `n` node allocations made by the
//! calling thread fail with [`crate::Error::NoMemory`]. Every failing path
//! leaves the array unchanged. Like the kernel's `xa_store`, the one-call
//! API retries once after allocating outside the failed attempt
//! ([`crate::XaState::nomem`]), so a single injected failure is absorbed.
//!
//! ```
//! use kxarray::{fault, Entry, Error, XArray};
//! let xa: XArray<Box<u32>> = XArray::new();
//! // Fail every allocation, including the retry after `nomem`.
//! fault::fail_next_allocations(u64::MAX);
//! let err = xa.store(1000, Entry::Value(1)).unwrap_err();
//! assert_eq!(err.error, Error::NoMemory);
//! assert!(xa.is_empty());
//! fault::fail_next_allocations(0);
//! xa.store(1000, Entry::Value(1)).unwrap();
//! ```

//!
//! Cost when unused: every hook first reads one process-wide flag
//! (`sync::HookFlag`) that only arming a fault sets, so a program
//! that never calls [`fail_next_allocations`] or [`panic_after_slot_writes`]
//! pays one relaxed load of a `false` flag per hook and never touches the
//! per-thread state. [`allocations`] is not a test hook: it counts node
//! allocations for `add_folio`'s statistics, and always runs.

use crate::sync::HookFlag;
use std::cell::Cell;

/// Set by the first `fail_next_allocations`/`panic_after_slot_writes` with
/// a non-zero count.
static ARMED: HookFlag = HookFlag::new();

thread_local! {
    static FAIL: Cell<u64> = const { Cell::new(0) };
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
    static PANIC_AFTER: Cell<u64> = const { Cell::new(0) };
}

/// Make the `n`-th slot write of a multi-slot write path (the general
/// store, `store_range`, both splits) on this thread panic right after the
/// slot was written, leaving the write half done (0 disarms). The array is
/// then poisoned ([`crate::XArray::is_poisoned`]): this is how tests check
/// that a panic under the lock never leaves a half-written tree in use.
///
/// ```
/// use kxarray::{fault, Entry, XArray};
/// let xa: XArray<Box<u32>> = XArray::new();
/// xa.store_order(0, 4, Entry::Value(1)).unwrap();
/// fault::panic_after_slot_writes(1);
/// let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
///     xa.store_range(0, 100, Some(2))
/// }));
/// fault::panic_after_slot_writes(0);
/// assert!(r.is_err());
/// assert!(xa.is_poisoned());
/// assert_eq!(xa.load_value(0), None); // a poisoned array reads as empty
/// ```
pub fn panic_after_slot_writes(n: u64) {
    if n != 0 {
        ARMED.set();
    }
    PANIC_AFTER.with(|c| c.set(n));
}

/// Called after a slot write on the multi-slot write paths.
#[inline(always)]
pub(crate) fn slot_written() {
    if ARMED.is_set() {
        slot_written_armed();
    }
}

#[cold]
#[inline(never)]
fn slot_written_armed() {
    PANIC_AFTER.with(|c| {
        let n = c.get();
        if n != 0 {
            c.set(n - 1);
            if n == 1 {
                panic!("kxarray::fault: injected panic in the middle of a write");
            }
        }
    })
}

/// Make the next `n` node allocations on this thread fail (0 disables).
pub fn fail_next_allocations(n: u64) {
    if n != 0 {
        ARMED.set();
    }
    FAIL.with(|f| f.set(n));
}

/// Node allocations this thread has made so far (successful ones).
pub fn allocations() -> u64 {
    ALLOCATED.with(|a| a.get())
}

#[inline]
pub(crate) fn should_fail() -> bool {
    if !ARMED.is_set() {
        ALLOCATED.with(|a| a.set(a.get() + 1));
        return false;
    }
    FAIL.with(|f| {
        let n = f.get();
        if n > 0 {
            f.set(n - 1);
            true
        } else {
            ALLOCATED.with(|a| a.set(a.get() + 1));
            false
        }
    })
}
