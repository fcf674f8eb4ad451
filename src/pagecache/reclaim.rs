//! Reclaim (`shrink_folio_list` and friends): placing new folios on the
//! lists (with the refault decision), and evicting from the inactive tail
//! until the cache is back under its capacity.
//!
//! Owns the eviction step. Once over capacity, a scan reclaims down to a
//! batch below it (`low_mark`), isolating up to `BATCH` candidates per
//! LRU lock hold and evicting them after the lock is dropped. A victim is
//! evicted only when it is clean, not under writeback, not referenced
//! since it was last scanned, and its data lock can be taken for writing
//! without waiting (nobody reads or writes it) and no one else holds a
//! reference to it; it then leaves a shadow carrying the eviction clock.
//! Dirty victims are rotated and written back after the LRU lock is
//! dropped, then the scan runs once more. Invariants: the LRU lock is
//! never held across I/O, a tree's lock or a buffer's release, nor while
//! blocking on a folio's data lock; an isolated candidate is evicted or put
//! back before the scan returns.

use super::inode::FileShared;
use super::lru::{Lru, LruEntry, Scan};
use super::stats::{bump, drop_gauge};
use super::writeback::{self, Mode};
use super::CacheInner;
use crate::filemap::{Folio, FolioFlags, Shadow};
use crate::sync::Ordering;
use std::sync::Arc;

/// Candidates isolated per LRU lock hold (the kernel's `SWAP_CLUSTER_MAX`).
const BATCH: usize = 32;

/// Dirty victims a reclaim pass found, each with its file, to write back.
pub(crate) type DirtyVictims = Vec<(Arc<FileShared>, Arc<Folio>)>;

impl CacheInner {
    /// Put a piece of a split folio on the list the folio was on (active
    /// while that list is under its cap). No reclaim: the pieces replace
    /// more pages than they are.
    pub(crate) fn insert_piece(&self, file: &Arc<FileShared>, folio: &Arc<Folio>, active: bool) {
        let mut lru = self.lru.lock();
        let active = active && lru.nr_active + folio.nr_pages() <= self.active_cap();
        lru.insert(Arc::downgrade(file), Arc::clone(folio), active);
    }

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
        let cached = self.nr_cached.load(Ordering::Relaxed);
        if cached > self.capacity_pages() {
            // Direct reclaim: the background reclaimer (if any) fell
            // behind, or pins, dirty folios or failed writes held the
            // cache over its capacity; back down to it, for as long as
            // reclaim makes progress.
            self.shrink_to_capacity();
        } else if cached > self.kswapd_wake_mark() {
            self.kick_kswapd();
        }
    }

    /// Evict until the cache is at most at capacity.
    pub(crate) fn reclaim(&self) {
        for _round in 0..2 {
            let (dirty, _) = self.scan(self.low_mark(), true);
            if dirty.is_empty() || self.nr_cached.load(Ordering::Relaxed) <= self.capacity_pages() {
                break;
            }
            // Write the dirty victims back (`pageout`), then scan again.
            for (file, folio) in dirty {
                let i = folio.index();
                let _ = writeback::writeback(&file, i, i + folio.nr_pages() - 1, Mode::Pageout);
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

    /// Pages the cache is reclaimed down to once it is over capacity: a
    /// batch's worth below it (up to [`BATCH`] - 1 pages, at most a 64th
    /// of the capacity), so that the next misses of order 0 add their
    /// folios without reclaiming and a scan isolates and evicts its victims
    /// together (the kernel's reclaim works in `SWAP_CLUSTER_MAX` batches
    /// and its `kswapd` reclaims up to a high watermark).
    #[inline]
    fn low_mark(&self) -> u64 {
        let cap = self.capacity_pages();
        cap - (cap / 64).min(BATCH as u64 - 1)
    }

    /// One reclaim pass down to `target` pages; returns dirty victims to
    /// write back and the pages evicted. A `direct` pass (a reader's, over
    /// capacity) stops once the cache is at most at capacity (another
    /// thread evicted meanwhile); the background reclaimer's goes on to its
    /// target below the capacity.
    ///
    /// Works in batches (`isolate_lru_folios`, then `shrink_folio_list`):
    /// under the LRU lock, up to [`BATCH`] candidates from the inactive
    /// tail are isolated (off the lists, their `LRU` flag cleared, as the
    /// kernel's isolation does; referenced ones are promoted and dirty ones
    /// rotated there as before); after the lock is dropped each is evicted
    /// under its own data lock, taken without waiting, as truncation's
    /// removal does ([`FileShared::detach`]): the tree removal with its
    /// shadow, the workingset's note and the buffer's release. Busy or
    /// newly referenced candidates go back to the inactive head under the
    /// next lock hold. With the tree's lock and the retirement of the
    /// buffer (crossbeam's collection, the light limbo's barrier) under the
    /// LRU lock, two readers took turns on every miss.
    pub(crate) fn scan(&self, target: u64, direct: bool) -> (DirtyVictims, u64) {
        let mut dirty = Vec::new();
        let mut evicted = 0;
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
        let mut isolated: [Option<(Arc<FileShared>, LruEntry)>; BATCH] = [const { None }; BATCH];
        let mut back: [Option<LruEntry>; BATCH] = [const { None }; BATCH];
        let mut nr_back = 0;
        // Bounded by the lists' length when the scan starts (every entry
        // twice: one promotion or rotation, then an eviction).
        let mut budget = usize::MAX;
        loop {
            let mut lru = self.lru.lock();
            for e in back[..nr_back].iter_mut().filter_map(Option::take) {
                putback(&mut lru, e);
            }
            nr_back = 0;
            if budget == usize::MAX {
                budget = 2 * lru.entries() + 64;
                if !direct {
                    // The background reclaimer looks at a few candidates
                    // per page it wants, not the whole list: a cache full
                    // of dirty folios would have it rotate them all on every
                    // wake-up (the flusher and direct reclaim deal with them).
                    let cached = self.nr_cached.load(Ordering::Relaxed);
                    let want = cached.saturating_sub(target) as usize;
                    budget = budget.min(4 * want + 2 * BATCH);
                }
            }
            let cached = self.nr_cached.load(Ordering::Relaxed);
            let mut want = cached.saturating_sub(target);
            if direct && cached <= self.capacity_pages() && want > 0 {
                // Under capacity again (another thread evicted): done.
                want = 0;
            }
            let mut n = 0;
            while n < BATCH && want > 0 && budget > 0 {
                budget -= 1;
                while lru.nr_active > self.active_cap() {
                    if !lru.demote_one(false) {
                        break;
                    }
                }
                let e = match lru.next_candidate() {
                    Scan::Empty => break,
                    Scan::Victim(e) => e,
                };
                let Some(file) = e.file.upgrade() else {
                    lru.take(&e);
                    continue;
                };
                if e.folio.clear(FolioFlags::REFERENCED) {
                    if e.folio.test(FolioFlags::DROPBEHIND) {
                        // Read ahead for a stream that passes the cache
                        // by, not yet read: a second chance, never the
                        // active list.
                        lru.rotate(e);
                        keep(file);
                        continue;
                    }
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
                // Isolate: off the lists' accounting, out of every other
                // scan's reach; the entry is ours.
                lru.take(&e);
                want = want.saturating_sub(e.folio.nr_pages());
                isolated[n] = Some((file, e));
                n += 1;
            }
            drop(lru);
            if n == 0 {
                break;
            }
            for k in 0..n {
                // The next victim's folio and buffer header arrive while
                // this one is evicted (its lock, flags and counts are read
                // first thing).
                if let Some((_, next)) = isolated.get(k + 1).and_then(Option::as_ref) {
                    next.folio.prefetch_buffer();
                }
                let Some((file, e)) = isolated[k].take() else {
                    continue;
                };
                if self.try_evict(&file, &e, !direct) {
                    evicted += e.folio.nr_pages();
                } else if !e.folio.test(FolioFlags::DETACHED) {
                    back[nr_back] = Some(e);
                    nr_back += 1;
                }
                keep(file);
            }
            if budget == 0 || self.nr_cached.load(Ordering::Relaxed) <= target {
                break;
            }
        }
        if nr_back > 0 {
            let mut lru = self.lru.lock();
            for e in back[..nr_back].iter_mut().filter_map(Option::take) {
                putback(&mut lru, e);
            }
        }
        drop(last);
        drop(files);
        (dirty, evicted)
    }

    /// Evict an isolated candidate (off the lists, the LRU lock not held)
    /// if it is still clean, unreferenced and unused: take its data lock
    /// without waiting, set `DETACHED`, leave a shadow carrying the
    /// eviction clock in its place and drop its bytes. Returns whether it
    /// was evicted, counted as the background reclaimer's if `background`.
    fn try_evict(&self, file: &Arc<FileShared>, e: &LruEntry, background: bool) -> bool {
        let folio = &e.folio;
        let Some(mut w) = folio.mem().try_lock() else {
            return false;
        };
        // References: the tree's and the list entry's. Any other is a
        // reader or writer between lookup and lock (the kernel's refcount
        // freeze): evicting under it would make that caller miss again,
        // and with a tiny cache loop forever. A reference since isolation
        // keeps it too (the next scan promotes it).
        if folio.test(FolioFlags::DETACHED)
            || folio.test(FolioFlags::DIRTY)
            || folio.test(FolioFlags::WRITEBACK)
            || folio.test(FolioFlags::REFERENCED)
            || Arc::strong_count(folio) > 2
            || w.is_pinned()
        {
            return false;
        }
        folio.set(FolioFlags::DETACHED);
        // Clean, so no dirty bytes; drops a partly-uptodate folio's state.
        file.blocks.forget(folio);
        if !folio.test(FolioFlags::UPTODATE) {
            // A failed fill's error goes with its folio.
            file.fills.forget(folio);
        }
        let nr = folio.nr_pages();
        let shadow = self
            .workingset
            .eviction(nr, folio.test(FolioFlags::WORKINGSET));
        if file.mapping.remove_folio(folio, Some(shadow)) {
            drop_gauge(&self.nr_cached, nr);
            self.workingset.note_shadow(file.id, &e.file, folio.index());
        }
        w.release();
        // The background count first, beside the eviction it counts (both
        // Relaxed: a snapshot taken meanwhile may see one without the
        // other; the counts agree once the pass is over).
        if background {
            bump(&self.counters.background_evictions, 1);
        }
        bump(&self.counters.evictions, 1);
        true
    }
}

/// Put an isolated candidate that was not evicted back at the inactive
/// head (`folio_putback_lru`), unless it left the cache meanwhile.
fn putback(lru: &mut Lru, e: LruEntry) {
    lru.insert(e.file, e.folio, false);
}

#[cfg(test)]
mod tests {
    use crate::backend::RamDisk;
    use crate::pagecache::{CacheConfig, PageCache};

    const PAGE: u64 = 4096;
    const BATCH: u64 = super::BATCH as u64;

    /// Once over capacity, one reclaim evicts a batch: the cache goes down
    /// to `BATCH - 1` pages below its capacity, and the next misses evict
    /// nothing until it is over again. A pinned candidate is put back on
    /// the lists (still counted there, still cached).
    #[test]
    #[cfg_attr(miri, ignore = "8,000 reads of a 4,096-page cache: minutes under Miri")]
    fn reclaim_evicts_a_batch_and_puts_busy_victims_back() {
        let cap = 4096u64; // pages: a 64th of it is more than a batch
        let config = CacheConfig::default()
            .capacity(cap * PAGE)
            .max_folio_order(0)
            .flusher(false)
            .background_reclaim(false); // every eviction counted here is a miss's
        let c = PageCache::new(config);
        let f = c.open(RamDisk::new(2 * cap * PAGE)).unwrap();
        // Random advice: a read of page 0 would otherwise start a window.
        f.advise(0, 0, crate::pagecache::Advice::Random).unwrap();
        // Page `i` of a shuffled order (an odd stride modulo a power of
        // two), so that readahead sees random reads and adds nothing.
        let read = |i: u64| {
            let mut b = [0u8; 1];
            let page = i.wrapping_mul(0x9e37_79b9) % (2 * cap);
            f.read_at(&mut b, page * PAGE).unwrap();
        };
        let on_lists = || {
            let lru = c.inner.lru.lock();
            lru.nr_inactive + lru.nr_active
        };
        for i in 0..cap {
            read(i);
        }
        assert_eq!((c.stats().cached_pages, c.stats().evictions), (cap, 0));
        // The oldest folio held (a reference taken between a lookup and
        // the folio's lock, which marks no access): the first candidate,
        // busy. read(0) is page 0.
        let pinned = c.inner.files()[0].cached(0).unwrap();
        read(cap);
        let s = c.stats();
        // A batch isolated: one busy (put back), the others evicted.
        assert_eq!(s.evictions, BATCH - 1, "{s:?}");
        assert_eq!(s.cached_pages, cap + 1 - (BATCH - 1));
        assert_eq!(on_lists(), s.cached_pages, "the held folio is back");
        let mut next = cap + 1;
        while c.stats().cached_pages < cap {
            read(next);
            next += 1;
        }
        let s = c.stats();
        assert_eq!(
            (s.evictions, s.cached_pages),
            (BATCH - 1, cap),
            "no reclaim"
        );
        let misses = s.misses;
        read(0);
        assert_eq!(c.stats().misses, misses, "the held page stayed");
        drop(pinned);
        read(next);
        assert_eq!(c.stats().evictions, 2 * BATCH - 1);
        assert_eq!(on_lists(), c.stats().cached_pages);
    }
}
