//! Ordered iteration over a [`ChunkedXArray`]: the chunks in number order,
//! each chunk's own `XArray` iterator inside, indices rebuilt from the chunk
//! number and the offset.

use super::ChunkedXArray;
use crate::guard::Guard;
use crate::item::{EntryRef, Item};
use crate::mark::Mark;
use crate::xarray::Iter as XaIter;
use core::ops::{Bound, RangeBounds};

/// `(start, Some(end))` for a range, `None` when it is empty.
pub(super) fn bounds<R: RangeBounds<u64>>(range: R) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => Some(e),
        Bound::Excluded(&e) => e.checked_sub(1),
        Bound::Unbounded => Some(u64::MAX),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e => (s, Some(e)),
        _ => (0, None),
    }
}

/// An ordered, lock-free iterator over a [`ChunkedXArray`], yielding
/// `(index, entry)` across chunks in index order.
pub struct Iter<'g, T: Item> {
    array: &'g ChunkedXArray<T>,
    guard: &'g Guard,
    start: u64,
    end: u64,
    mark: Option<Mark>,
    /// The next chunk number to look for; `None` when done.
    next_chunk: Option<u64>,
    /// The first index of the chunk being walked, and its iterator.
    cur: Option<(u64, XaIter<'g, T>)>,
}

impl<'g, T: Item> Iter<'g, T> {
    pub(super) fn new(
        array: &'g ChunkedXArray<T>,
        guard: &'g Guard,
        start: u64,
        end: Option<u64>,
        mark: Option<Mark>,
    ) -> Self {
        Iter {
            array,
            guard,
            start,
            end: end.unwrap_or(0),
            mark,
            next_chunk: end.map(|_| start >> array.shift),
            cur: None,
        }
    }
}

impl<T: Item> core::fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Iter")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("mark", &self.mark)
            .field("next_chunk", &self.next_chunk)
            .finish_non_exhaustive()
    }
}

impl<'g, T: Item> Iterator for Iter<'g, T> {
    type Item = (u64, EntryRef<'g, T>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((base, it)) = &mut self.cur {
                if let Some((i, e)) = it.next() {
                    return Some((*base | i, e));
                }
                self.cur = None;
            }
            let a = self.array;
            let from = self.next_chunk?;
            let (first_c, last_c) = (self.start >> a.shift, self.end >> a.shift);
            let Some((n, ch)) = a.dir.next(from, last_c, self.guard) else {
                self.next_chunk = None;
                return None;
            };
            self.next_chunk = if n < last_c { Some(n + 1) } else { None };
            let lo = if n == first_c { self.start & a.mask } else { 0 };
            let hi = if n == last_c {
                self.end & a.mask
            } else {
                a.mask
            };
            let it = match self.mark {
                None => ch.xa.range(lo..=hi, self.guard),
                Some(m) if ch.xa.marked(m) => ch.xa.iter_marked(lo..=hi, m, self.guard),
                Some(_) => continue,
            };
            self.cur = Some((a.base(n), it));
        }
    }
}
