//! `store_range` (`xa_store_range`): a range stored as the fewest aligned
//! power-of-two multi-index entries that tile it.
//!
//! Invariant: every entry this stores is an aligned block of order at most
//! 63, so no unaligned run of slots exists for `get_order`, conflict scans
//! or splits to misread, and any range up to all of `0..=u64::MAX` is
//! stored whole.

use super::XaLock;
use crate::engine::order_shape;
use crate::entry::{RawEntry, MAX_VALUE};
use crate::error::Error;
use crate::item::Item;
use crate::mark::Mark;

impl<T: Item> XaLock<'_, T> {
    /// Store a value over a range under the held lock; see
    /// [`XArray::store_range`](crate::XArray::store_range).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::store_range`](crate::XArray::store_range).
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store_range(10, 20, Some(3)).unwrap();
    /// assert_eq!(lock.load(15).and_then(|e| e.value()), Some(3));
    /// ```
    pub fn store_range(&self, first: u64, last: u64, value: Option<u64>) -> Result<(), Error> {
        if last < first {
            return Err(Error::InvalidRange { first, last });
        }
        let entry = match value {
            Some(v) if v > MAX_VALUE => return Err(Error::ValueOutOfRange(v)),
            Some(v) => RawEntry::value(v),
            None => RawEntry::NULL,
        };
        // The range is cut into maximal aligned power-of-two blocks (the
        // largest order `first` is aligned to that still ends by `last`,
        // at most 63), each stored as one multi-index entry, so no unaligned
        // run of slots ever exists. Every entry is such a block too, so an
        // entry covering `first` either lies inside the block (the block
        // store replaces it) or contains the block; the latter is replaced
        // (or erased) whole, as a `store` into any of its indices would be,
        // and the range continues after it.
        let mut first = first;
        loop {
            let order = range_block_order(first, last);
            let block_last = first + ((1u64 << order) - 1);
            let (mut xas, end) = match self.extent_at(first) {
                Some((s, t)) if s < first || t > block_last => (self.cursor(first), t),
                _ => {
                    let mut xas = self.cursor(first);
                    let (shift, sibs) = order_shape(order);
                    xas.set_shape(shift, sibs);
                    (xas, block_last)
                }
            };
            // `nomem` allocates without dropping the lock, so the same
            // cursor retries the same step with its preallocated nodes.
            // On allocating arrays a stored block is no longer free (an
            // erased one is marked free again by `store_raw`), as `store` does.
            let clear_free = self.xa.track_free() && !entry.is_null();
            let old = self.with_retry(&mut xas, |xas, w| {
                let old = xas.store_raw(w, entry);
                if clear_free && xas.error().is_none() {
                    xas.clear_mark_raw(w, Mark::FREE);
                }
                old
            });
            if let Some(e) = xas.error() {
                return Err(e);
            }
            // SAFETY: `store_raw` unlinked `old` and left it to the caller;
            // disposed once, here.
            unsafe { xas.dispose(old) };
            if end >= last {
                return Ok(());
            }
            first = end + 1;
        }
    }

    /// The first and last index of the entry at `index`, if there is one.
    fn extent_at(&self, index: u64) -> Option<(u64, u64)> {
        let mut probe = self.cursor(index);
        if probe.load_raw().is_null() {
            return None;
        }
        Some(probe.entry_extent())
    }
}

/// The order of the block `store_range` stores at `first`: the largest
/// power of two `first` is aligned to that fits in `first..=last`, capped
/// at 63 (so `0..=u64::MAX` is two order-63 blocks).
fn range_block_order(first: u64, last: u64) -> u32 {
    let len_log2 = match (last - first).checked_add(1) {
        Some(len) => 63 - len.leading_zeros(),
        None => 64,
    };
    first.trailing_zeros().min(len_log2).min(63)
}
