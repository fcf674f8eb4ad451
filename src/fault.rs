//! Fault injection for node allocation, so tests can drive the
//! out-of-memory paths (the kernel's user-space harness fails `GFP_NOWAIT`
//! allocations for the same reason).
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

use std::cell::Cell;

thread_local! {
    static FAIL: Cell<u64> = const { Cell::new(0) };
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

/// Make the next `n` node allocations on this thread fail (0 disables).
pub fn fail_next_allocations(n: u64) {
    FAIL.with(|f| f.set(n));
}

/// Node allocations this thread has made so far (successful ones).
pub fn allocations() -> u64 {
    ALLOCATED.with(|a| a.get())
}

#[inline]
pub(crate) fn should_fail() -> bool {
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
