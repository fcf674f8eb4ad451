//! Reclaim (`shrink_folio_list` and friends): placing new folios on the
//! lists (with the refault decision), and evicting from the inactive tail
//! until the cache is back under its capacity.
//!
//! Owns the eviction step. A victim is evicted only when it is clean, not
//! under writeback, not referenced since it was last scanned, and its data
//! lock can be taken for writing without waiting (nobody reads or writes
//! it) and no one else holds a reference to it; it then leaves a shadow carrying the eviction clock. Dirty victims
//! are rotated and written back after the LRU lock is dropped, then the
//! scan runs once more. Invariant: the LRU lock is never held across I/O
//! or while blocking on a folio's data lock.

use super::inode::FileShared;
use super::lru::{LruEntry, Scan};
use super::stats::{bump, drop_gauge};
use super::writeback::{self, Mode};
use super::CacheInner;
use crate::filemap::{Folio, FolioFlags, MemWrite, Shadow};
use crate::sync::Ordering;
use std::sync::{Arc, Weak};

impl CacheInner {
    /// Put a just-filled folio on the lists: a refault whose distance fits
    /// in the cache goes straight to the active list while that list is
    /// under its cap (`workingset_refault`); everything else starts
    /// inactive. Then reclaim if the cache is over capacity.
    pub(crate) fn insert_new(
        &self,
        file: &Arc<FileShared>,
        folio: &Arc<Folio>,
        shadow: Option<Shadow>,
    ) {
        let nr = folio.nr_pages();
        let mut activate = false;
        if let Some(s) = shadow {
            bump(&self.counters.refaults, 1);
            let distance = self.workingset.refault_distance(s);
            if distance <= self.capacity_pages() {
                folio.set(FolioFlags::WORKINGSET);
                activate = true;
            }
        }
        {
            let mut lru = self.lru.lock();
            if activate && lru.nr_active + nr > self.active_cap() {
                activate = false;
            }
            lru.insert(Arc::downgrade(file), Arc::clone(folio), activate);
        }
        if activate {
            bump(&self.counters.activations, 1);
        }
        if self.nr_cached.load(Ordering::Relaxed) > self.capacity_pages() {
            self.reclaim();
        }
    }

    /// Evict until the cache is at most at capacity.
    pub(crate) fn reclaim(&self) {
        for _round in 0..2 {
            let dirty = self.scan();
            if dirty.is_empty() || self.nr_cached.load(Ordering::Relaxed) <= self.capacity_pages() {
                break;
            }
            // Write the dirty victims back (`pageout`), then scan again.
            for (file, folio) in dirty {
                let i = folio.index();
                let _ = writeback::writeback(&file, i, i + folio.nr_pages() - 1, Mode::Wait);
            }
        }
        let dropped = self.workingset.shrink();
        bump(&self.counters.shadow_nodes_reclaimed, dropped);
    }

    /// Evict until the cache is at most at its capacity (after the capacity
    /// was lowered): reclaim rounds, each writing back the dirty victims it
    /// found (`pageout`, as the kernel's reclaim does), for as long as they
    /// make progress. Folios pinned or in use stay (the capacity's stated
    /// exception).
    pub(crate) fn shrink_to_capacity(&self) {
        loop {
            let before = self.nr_cached.load(Ordering::Relaxed);
            if before <= self.capacity_pages() {
                return;
            }
            self.reclaim();
            if self.nr_cached.load(Ordering::Relaxed) >= before {
                return; // nothing evictable left
            }
        }
    }

    /// One reclaim pass; returns dirty victims to write back.
    ///
    /// The LRU lock is held only for the lists' work: picking a victim,
    /// the checks, and claiming it (its data lock taken without waiting,
    /// `DETACHED` set, taken off the lists). The claimed victim's removal
    /// from its file's tree, its shadow, the workingset's note and the
    /// release of its buffer run after the LRU lock is dropped, under the
    /// victim's data lock alone, as truncation's removal does
    /// ([`FileShared::detach`]). Another thread's miss can add its folio to
    /// the lists meanwhile; with the tree's lock and the retirement of the
    /// buffer (crossbeam's collection, the light limbo's barrier) under
    /// the LRU lock, two readers took turns on every miss.
    fn scan(&self) -> Vec<(Arc<FileShared>, Arc<Folio>)> {
        let mut dirty = Vec::new();
        // Files upgraded during the scan are released after the LRU lock
        // (declared first, dropped last): dropping a file's last handle
        // detaches its folios, which takes the LRU lock. The last file
        // kept is held apart: a handle of the same file again is dropped at
        // once (not the last one: `last` holds another), so a scan of one
        // file's folios allocates nothing.
        let mut files: Vec<Arc<FileShared>> = Vec::new();
        let mut last: Option<Arc<FileShared>> = None;
        let mut keep = |file: Arc<FileShared>| match &last {
            Some(l) if Arc::ptr_eq(l, &file) => drop(file),
            _ => {
                if let Some(old) = last.replace(file) {
                    files.push(old);
                }
            }
        };
        // Bounded by the lists' length when the scan starts (every entry
        // twice: one promotion or rotation, then an eviction).
        let mut budget = usize::MAX;
        'pass: while self.nr_cached.load(Ordering::Relaxed) > self.capacity_pages() && budget > 0 {
            let mut lru = self.lru.lock();
            if budget == usize::MAX {
                budget = 2 * lru.entries() + 64;
            }
            // A clean candidate: its file and its entry.
            let (file, e) = loop {
                if budget == 0 || self.nr_cached.load(Ordering::Relaxed) <= self.capacity_pages() {
                    break 'pass;
                }
                budget -= 1;
                while lru.nr_active > self.active_cap() {
                    if !lru.demote_one(false) {
                        break;
                    }
                }
                let e = match lru.next_candidate() {
                    Scan::Empty => break 'pass,
                    Scan::Victim(e) => e,
                };
                let Some(file) = e.file.upgrade() else {
                    lru.take(&e);
                    continue;
                };
                if e.folio.clear(FolioFlags::REFERENCED) {
                    // The second access: promote.
                    lru.activate(e);
                    bump(&self.counters.activations, 1);
                    keep(file);
                    continue;
                }
                if e.folio.test(FolioFlags::DIRTY) || e.folio.test(FolioFlags::WRITEBACK) {
                    if dirty.len() < 64 {
                        dirty.push((Arc::clone(&file), Arc::clone(&e.folio)));
                    }
                    lru.rotate(e);
                    keep(file);
                    continue;
                }
                break (file, e);
            };
            let folio = Arc::clone(&e.folio);
            let Some((w, weak)) = self.claim(&mut lru, &folio, e) else {
                keep(file);
                continue;
            };
            drop(lru);
            self.evict(&file, &weak, &folio, w);
            keep(file);
        }
        drop(last);
        drop(files);
        dirty
    }

    /// Claim a clean candidate under the LRU lock: take its data lock
    /// without waiting, check nobody else uses it, set `DETACHED` and take
    /// it off the lists. A busy candidate is rotated (`None`).
    fn claim<'f>(
        &self,
        lru: &mut super::lru::Lru,
        folio: &'f Arc<Folio>,
        e: LruEntry,
    ) -> Option<(MemWrite<'f>, Weak<FileShared>)> {
        let Some(w) = folio.mem().try_lock() else {
            lru.rotate(e);
            return None;
        };
        if folio.test(FolioFlags::DETACHED) {
            lru.take(&e);
            return None;
        }
        // References: the tree's, the list entry's and `folio`. Any other
        // is a reader or writer between lookup and lock (the kernel's
        // refcount freeze): evicting under it would make that caller miss
        // again, and with a tiny cache loop forever.
        if folio.test(FolioFlags::DIRTY)
            || folio.test(FolioFlags::WRITEBACK)
            || Arc::strong_count(folio) > 3
            || w.is_pinned()
        {
            lru.rotate(e);
            return None;
        }
        lru.take(&e);
        folio.set(FolioFlags::DETACHED);
        Some((w, e.file))
    }

    /// Evict a claimed victim (its data lock held, `DETACHED` set, off the
    /// lists; the LRU lock not held): leave a shadow carrying the eviction
    /// clock in its place and drop its bytes.
    fn evict(
        &self,
        file: &Arc<FileShared>,
        weak: &Weak<FileShared>,
        folio: &Arc<Folio>,
        mut w: MemWrite<'_>,
    ) {
        // Clean, so no dirty bytes; drops a partly-uptodate folio's state.
        file.blocks.forget(folio);
        let nr = folio.nr_pages();
        let shadow = self
            .workingset
            .eviction(nr, folio.test(FolioFlags::WORKINGSET));
        if file.mapping.remove_folio(folio, Some(shadow)) {
            drop_gauge(&self.nr_cached, nr);
            self.workingset.note_shadow(file.id, weak, folio.index());
        }
        w.release();
        bump(&self.counters.evictions, 1);
    }
}
