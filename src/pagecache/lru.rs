//! The reclaim lists: an inactive and an active list of folios
//! (`mm/vmscan.c`'s file LRUs), and the scan that picks victims.
//!
//! Owns list membership. New folios enter the inactive head; the hit path
//! only sets `REFERENCED` (no lock here), and the scan promotes a referenced
//! inactive tail folio to the active list (the second access), rotates a
//! referenced active tail folio (second chance) and demotes an unreferenced
//! one when the active list is above its cap.
//!
//! Invariants (all under the cache's LRU lock):
//! - a folio is counted in `nr_inactive`/`nr_active` exactly when its `LRU`
//!   flag is set, on the list its `ACTIVE` flag names;
//! - each folio sits in at most one list entry while `LRU` is set; entries
//!   of folios whose `LRU` flag was cleared (detached by truncate,
//!   invalidate or a dropped file) are stale and are dropped when the scan
//!   reaches them, so removal elsewhere is O(1);
//! - a folio a reclaim scan isolated (`take` on its entry, which the scan
//!   keeps) has its `LRU` flag cleared and no entry: it is out of every
//!   other scan's reach until the scan evicts it or puts it back with
//!   [`Lru::insert`] (which skips it if it was detached meanwhile).

use super::inode::FileShared;
use crate::filemap::{Folio, FolioFlags};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

/// How far ahead of the inactive tail the scan prefetches folio structs.
const PREFETCH_AHEAD: usize = 8;

/// One list entry: the folio and the file it belongs to.
pub(crate) struct LruEntry {
    pub(crate) file: Weak<FileShared>,
    pub(crate) folio: Arc<Folio>,
}

/// The two lists and their page counts.
#[derive(Default)]
pub(crate) struct Lru {
    inactive: VecDeque<LruEntry>,
    active: VecDeque<LruEntry>,
    pub(crate) nr_inactive: u64,
    pub(crate) nr_active: u64,
}

/// What the scan found at the inactive tail.
pub(crate) enum Scan {
    /// Both lists are empty (of live entries).
    Empty,
    /// A candidate victim, taken off the list: the caller evicts it or puts
    /// it back with [`Lru::rotate`].
    Victim(LruEntry),
}

impl Lru {
    /// Add a folio at the head of the inactive or (for a workingset
    /// refault) the active list. A detached folio is not added.
    pub(crate) fn insert(&mut self, file: Weak<FileShared>, folio: Arc<Folio>, active: bool) {
        if folio.test(FolioFlags::DETACHED) || folio.set(FolioFlags::LRU) {
            return;
        }
        let n = folio.nr_pages();
        let e = LruEntry { file, folio };
        if active {
            e.folio.set(FolioFlags::ACTIVE);
            self.nr_active += n;
            self.active.push_front(e);
        } else {
            e.folio.clear(FolioFlags::ACTIVE);
            self.nr_inactive += n;
            self.inactive.push_front(e);
        }
    }

    /// Take a folio off the lists' accounting (its entry goes stale).
    /// Returns whether it was on a list.
    pub(crate) fn forget(&mut self, folio: &Folio) -> bool {
        if !folio.clear(FolioFlags::LRU) {
            return false;
        }
        if folio.test(FolioFlags::ACTIVE) {
            self.nr_active -= folio.nr_pages();
        } else {
            self.nr_inactive -= folio.nr_pages();
        }
        true
    }

    /// Put a candidate back at the inactive head (busy, dirty or under
    /// writeback).
    pub(crate) fn rotate(&mut self, e: LruEntry) {
        self.inactive.push_front(e);
    }

    /// Move one folio from the active tail to the inactive head, giving
    /// referenced folios a second chance unless `force`. Returns false when
    /// the active list has no live entry.
    pub(crate) fn demote_one(&mut self, force: bool) -> bool {
        let mut budget = self.active.len();
        while let Some(e) = self.active.pop_back() {
            if !e.folio.test(FolioFlags::LRU) || !e.folio.test(FolioFlags::ACTIVE) {
                continue; // stale
            }
            if !force && budget > 0 && e.folio.clear(FolioFlags::REFERENCED) {
                budget -= 1;
                self.active.push_front(e);
                continue;
            }
            let n = e.folio.nr_pages();
            e.folio.clear(FolioFlags::ACTIVE);
            self.nr_active -= n;
            self.nr_inactive += n;
            self.inactive.push_front(e);
            return true;
        }
        false
    }

    /// Promote an inactive folio (taken off the tail) to the active head.
    pub(crate) fn activate(&mut self, e: LruEntry) {
        let n = e.folio.nr_pages();
        e.folio.set(FolioFlags::ACTIVE);
        self.nr_inactive -= n;
        self.nr_active += n;
        self.active.push_front(e);
    }

    /// The next candidate from the inactive tail, refilling the inactive
    /// list from the active one when it runs dry.
    pub(crate) fn next_candidate(&mut self) -> Scan {
        loop {
            match self.inactive.pop_back() {
                Some(e) => {
                    if !e.folio.test(FolioFlags::LRU) || e.folio.test(FolioFlags::ACTIVE) {
                        continue; // stale
                    }
                    self.prefetch_next();
                    return Scan::Victim(e);
                }
                None => {
                    if !self.demote_one(true) {
                        return Scan::Empty;
                    }
                }
            }
        }
    }

    /// Prefetch what the next candidates will need: the folio struct of
    /// the entry [`PREFETCH_AHEAD`] from the tail and the buffer header of
    /// the one half as far (whose folio was prefetched that many pops ago,
    /// so its pointer to the buffer is cached). At steady state a reclaim
    /// isolates a batch of candidates in a row, a few nanoseconds apart:
    /// a hint for the very next one (as before batches) came too late, and
    /// the victims' cold folio structs and buffer headers were cache misses
    /// under the LRU lock.
    #[inline]
    fn prefetch_next(&self) {
        let n = self.inactive.len();
        if n >= PREFETCH_AHEAD / 2 {
            self.inactive[n - PREFETCH_AHEAD / 2]
                .folio
                .prefetch_buffer();
        }
        if n >= PREFETCH_AHEAD {
            self.inactive[n - PREFETCH_AHEAD].folio.prefetch();
        }
    }

    /// Take a candidate off the accounting: one being evicted, or one a
    /// scan isolates (its entry is the scan's until it is put back).
    pub(crate) fn take(&mut self, e: &LruEntry) {
        if e.folio.clear(FolioFlags::LRU) {
            self.nr_inactive -= e.folio.nr_pages();
        }
    }

    /// Heap bytes of the two lists (their capacities times an entry).
    pub(crate) fn heap_bytes(&self) -> usize {
        (self.inactive.capacity() + self.active.capacity()) * core::mem::size_of::<LruEntry>()
    }

    /// Entries held, live or stale (for bounding a scan).
    pub(crate) fn entries(&self) -> usize {
        self.inactive.len() + self.active.len()
    }
}
