//! A file's record of its fills (`fill`): the errors of failed reads,
//! kept for the reader that needs the failed folio, and the wakers of
//! async readers waiting for a read in flight.
//!
//! Owns `FillCtx`, shared by the file's state and every fill in flight
//! (so a completion needs nothing else of the file). Invariants: an error
//! is taken at most once, by the reader that removes the failed folio, and
//! only for that folio: it is kept with a weak reference to the folio (the
//! folio's allocation cannot be reused for another folio while the error
//! is kept, so no later folio at the same address inherits it) and
//! forgotten when the folio leaves the file otherwise (invalidation,
//! revalidation, truncation, eviction); a
//! waker is registered only while its folio's read is in flight (checked
//! under the waiters' lock, which a completion takes after the read ends),
//! so no wake-up is lost.

use crate::filemap::{Folio, FolioFlags};
use crate::sync::Lock;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Weak};
use std::task::Waker;

/// Failed fills remembered per file, at most (the oldest goes first: a
/// reader that comes later re-reads without the old error).
const MAX_ERRORS: usize = 256;

/// A file's record of failed fills and the async readers waiting for fills.
pub(crate) struct FillCtx {
    /// (the folio, the read's error) of fills that failed and whose folio
    /// no reader has removed yet. Weak: the folio's allocation outlives
    /// the entry, so its address names it alone.
    errors: Lock<VecDeque<(Weak<Folio>, io::Error)>>,
    /// Async readers waiting for a fill of this file: (the folio's
    /// address, the reader's waker).
    waiters: Lock<Vec<(usize, Waker)>>,
}

impl FillCtx {
    pub(crate) fn new() -> Arc<FillCtx> {
        Arc::new(FillCtx {
            errors: Lock::new(VecDeque::new()),
            waiters: Lock::new(Vec::new()),
        })
    }

    pub(crate) fn record(&self, f: &Arc<Folio>, e: io::Error) {
        let mut q = self.errors.lock();
        if q.len() >= MAX_ERRORS {
            q.pop_front();
        }
        q.push_back((Arc::downgrade(f), e));
    }

    /// The error recorded for the failed fill of `f`, taken.
    pub(crate) fn take(&self, f: &Folio) -> Option<io::Error> {
        let mut q = self.errors.lock();
        let at = q.iter().position(|(w, _)| core::ptr::eq(w.as_ptr(), f))?;
        q.remove(at).map(|(_, e)| e)
    }

    /// `f` left the file without a reader taking its error: drop it.
    pub(crate) fn forget(&self, f: &Folio) {
        let mut q = self.errors.lock();
        if !q.is_empty() {
            q.retain(|(w, _)| !core::ptr::eq(w.as_ptr(), f));
        }
    }

    /// Register `w` to be woken when the read of `f` ends, if it is still
    /// in flight (`LOCKED`); whether it is. Checked under the waiters'
    /// lock, which the completion takes after it clears `LOCKED`, so the
    /// wake-up cannot be missed.
    pub(crate) fn wait_for(&self, f: &Folio, w: &Waker) -> bool {
        let mut v = self.waiters.lock();
        if !f.test(FolioFlags::LOCKED) {
            return false;
        }
        let key = f as *const Folio as usize;
        if !v.iter().any(|(k, x)| *k == key && x.will_wake(w)) {
            v.push((key, w.clone()));
        }
        true
    }

    /// Wake the waiters of `f`'s read (it ended).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn wake(&self, f: &Folio) {
        let key = f as *const Folio as usize;
        let mut woken = Vec::new();
        {
            let mut v = self.waiters.lock();
            if v.is_empty() {
                return;
            }
            v.retain(|(k, w)| {
                if *k == key {
                    woken.push(w.clone());
                    false
                } else {
                    true
                }
            });
        }
        for w in woken {
            w.wake();
        }
    }
}
