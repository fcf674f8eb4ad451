//! A process's clock batch: the frames of the region's clock hand a member
//! claims at once ([`BATCH`]), handed to its threads one at a time, so a
//! member's evictions touch the shared hand once per batch.
//!
//! Owns the batch word. Invariants:
//! - it is one atomic word (the frames left in the top [`LEFT`] bits, the
//!   next frame below them, a number before the modulo), never a lock: a
//!   process's threads allocate at any moment, and a child after `fork` or
//!   a raw `clone` gets the word as it stood, where a lock a thread of the
//!   parent held would stay held in the child for ever;
//! - a frame number is handed out at most once: a thread takes one only by
//!   moving the word on, by compare-and-swap, from the value that named it,
//!   and a new batch is installed by compare-and-swap over the used-up one
//!   its claimer saw, so two threads that find the batch used up at once
//!   claim one batch each, one installs its own and the rest of the other
//!   is passed over (other batches sweep those frames). Only `reset`, at a
//!   new membership, stores the word plainly. (Every change being a
//!   compare-and-swap also keeps the loom model clear of a known loom
//!   defect, tokio-rs/loom#254: a plain store ordered inside another
//!   thread's read-modify-write);
//! - frame numbers grow without wrapping for 2^56 claims: the word never
//!   comes back to a value it held.

use super::layout::BATCH;
use crate::sync::{AtomicU64, Ordering};

/// The shift of the frames left in a batch, in the word.
const LEFT: u32 = 56;
/// The next frame's bits, in the word.
const NEXT: u64 = (1 << LEFT) - 1;

const _: () = assert!(BATCH < 1 << (64 - LEFT));

/// One process's clock batch (see the module notes).
#[derive(Debug)]
pub(crate) struct Hand(AtomicU64);

impl Hand {
    /// An empty batch: the first [`next`](Hand::next) claims one.
    pub(crate) fn new() -> Hand {
        Hand(AtomicU64::new(0))
    }

    /// Forget the batch (a new membership claims its own).
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// The next frame of the batch, claiming a new batch of [`BATCH`]
    /// frames (`claim` returns its first frame) when it is used up.
    #[inline]
    pub(crate) fn next(&self, claim: impl FnOnce() -> u64) -> u64 {
        self.next_of(BATCH, claim)
    }

    /// [`next`](Hand::next) with batches of `batch` frames (1 to [`BATCH`]).
    pub(crate) fn next_of(&self, batch: u64, claim: impl FnOnce() -> u64) -> u64 {
        debug_assert!((1..=BATCH).contains(&batch));
        let mut h = self.0.load(Ordering::Relaxed);
        while h >> LEFT != 0 {
            let next = ((h + 1) & NEXT) | (((h >> LEFT) - 1) << LEFT);
            match self
                .0
                .compare_exchange_weak(h, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return h & NEXT,
                Err(now) => h = now,
            }
        }
        let start = claim();
        let rest = ((batch - 1) << LEFT) | (start.wrapping_add(1) & NEXT);
        // Installed only over the used-up batch this thread saw: a batch
        // another thread installed meanwhile stays, and the rest of this one
        // is passed over. Every change of the word is a compare-and-swap,
        // so each value of it is taken at most once.
        let _ = self
            .0
            .compare_exchange(h, rest, Ordering::Relaxed, Ordering::Relaxed);
        start
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_thread_walks_each_batch_in_order_then_claims_the_next() {
        let h = Hand::new();
        let mut claims = 0;
        let got: Vec<u64> = (0..2 * BATCH)
            .map(|_| {
                h.next(|| {
                    claims += 1;
                    100 * claims
                })
            })
            .collect();
        let want: Vec<u64> = (100..100 + BATCH).chain(200..200 + BATCH).collect();
        assert_eq!((got, claims), (want, 2));
        h.reset();
        assert_eq!(h.next(|| 7), 7, "a reset batch is claimed anew");
    }
}
