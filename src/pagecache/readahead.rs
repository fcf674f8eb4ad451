//! Readahead sizing (`page_cache_ra_order`): sequential misses grow the
//! folio order, random misses stay at order 0.
//!
//! Owns one file's readahead window: the page index after the last miss
//! and the order the next sequential miss gets. Invariant: the order never
//! exceeds the cache's cap, and a folio never starts before the index
//! asked for (which is aligned to the order) nor ends past the file's end.

use crate::sync::Lock;

struct State {
    next: u64,
    order: u32,
}

/// One file's readahead state.
pub(crate) struct Readahead(Lock<State>);

impl Readahead {
    pub(crate) fn new() -> Self {
        Readahead(Lock::new(State {
            next: u64::MAX,
            order: 0,
        }))
    }

    /// The order of the folio to allocate for a read miss at `index`, for a
    /// file of `size_pages` pages: doubles the window (one order up) when
    /// the miss continues the previous one, falls back to 0 otherwise.
    pub(crate) fn on_miss(&self, index: u64, max_order: u32, size_pages: u64) -> u32 {
        let mut s = self.0.lock();
        let mut order = if index == s.next {
            (s.order + 1).min(max_order)
        } else {
            0
        };
        // Start the folio at `index` (aligned to its order, so it never
        // overlaps the previous one) and keep it inside the file.
        while order > 0 {
            if index.trailing_zeros() >= order && index + (1u64 << order) <= size_pages.max(1) {
                break;
            }
            order -= 1;
        }
        s.order = order;
        s.next = index + (1u64 << order);
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_grows_random_stays() {
        let ra = Readahead::new();
        let mut idx = 0;
        let mut orders = Vec::new();
        for _ in 0..6 {
            let o = ra.on_miss(idx, 4, 1 << 20);
            orders.push(o);
            idx += 1 << o;
        }
        assert_eq!(orders, vec![0, 0, 1, 2, 3, 4]);
        assert_eq!(ra.on_miss(1000, 4, 1 << 20), 0, "a jump resets");
        assert_eq!(ra.on_miss(7, 4, 8), 0, "no folio past the end");
    }
}
