//! What a cache does at its first miss in a process: work that should not
//! run (or start a thread) before the cache is used, and the pages a
//! forked child inherited.
//!
//! Owns `Demand` (the hooks [`PageCache::on_demand`] registers and the
//! fork generations they were run for) and `FileShared::forget_pages`.
//!
//! - **Hooks** run at the cache's misses (the start of a miss, before any
//!   lock of the miss path is taken; at most once a millisecond), in each
//!   process, until every one of them has returned `true`; then a miss
//!   pays one load and one compare. A forked child runs them again. An
//!   open runs none (it only forgets a child's inherited pages): a file
//!   in the shared region misses in the region, never here, and the
//!   region's place in the budget is such a hook.
//!   The SQLite VFS starts its budget thread and pressure monitor this
//!   way, so a process that opened a database and reads nothing has no
//!   thread of ours.
//! - **A child after fork** (a new [`crate::fork`] generation) first
//!   forgets every page of the files opened before the fork, dirty ones
//!   too, without writing anything back: they are copies of the parent's
//!   memory (the parent writes its own dirty pages), and the files'
//!   handles may be out of reach in the child (the SQLite VFS forgets the
//!   parent's inodes). The files stay open and read from their backends
//!   again. A folio whose lock was held at the fork (a read in flight in
//!   the parent) or under writeback (the parent's write) is left where it
//!   is.
//!
//! Invariants: a hook never runs under a lock of the cache; `settled` is
//! the generation in which every hook returned `true` (and the inherited
//! pages were forgotten), 0 before; a hook registered later makes the
//! cache run the hooks again.

use super::inode::FileShared;
use super::{CacheInner, PageCache};
use crate::filemap::FolioFlags;
use crate::sync::{AtomicU64, Lock, Ordering};
use std::sync::Arc;

/// A hook: run until it returns `true`.
type Hook = Arc<dyn Fn() -> bool + Send + Sync>;

/// The hooks and what they were run for.
pub(crate) struct Demand {
    hooks: Lock<Vec<Hook>>,
    /// The generation in which everything was done (0: not yet).
    settled: AtomicU64,
    /// The generation whose pages the cache holds.
    pages_of: AtomicU64,
    /// When the hooks last ran (`CacheInner::now_ms`): at most once per
    /// millisecond while some are not done.
    last_run: AtomicU64,
}

impl Demand {
    pub(crate) fn new() -> Demand {
        Demand {
            hooks: Lock::new(Vec::new()),
            settled: AtomicU64::new(0),
            pages_of: AtomicU64::new(crate::fork::generation()),
            last_run: AtomicU64::new(0),
        }
    }
}

impl CacheInner {
    /// A miss (or an open) in this process: run what waits for one (see
    /// the module notes). One load and one compare once nothing does.
    #[inline]
    pub(crate) fn demand(&self) {
        if self.demand.settled.load(Ordering::Relaxed) != crate::fork::generation() {
            self.demand_slow();
        }
    }

    /// An open in this process: in a child after `fork`, the inherited
    /// pages go first; what else waits for demand (the budget's and the
    /// shared region's members, their threads) waits for a miss, so that
    /// a process that opens and never reads starts no thread.
    #[inline]
    pub(crate) fn demand_at_open(&self) {
        let gen = crate::fork::generation();
        if self.demand.pages_of.load(Ordering::Acquire) != gen && self.forget_inherited(gen) {
            self.demand.pages_of.store(gen, Ordering::Release);
        }
    }

    #[cold]
    #[inline(never)]
    fn demand_slow(&self) {
        let gen = crate::fork::generation();
        if self.demand.pages_of.load(Ordering::Acquire) != gen {
            if !self.forget_inherited(gen) {
                return; // tried again at the next miss
            }
            self.demand.pages_of.store(gen, Ordering::Release);
        }
        // Misses come thousands a second: the hooks run once a
        // millisecond at most (the first miss always).
        let now = self.now_ms();
        let last = self.demand.last_run.load(Ordering::Relaxed);
        if last != 0 && now <= last {
            return;
        }
        self.demand.last_run.store(now, Ordering::Relaxed);
        let Some(hooks) = self.demand.hooks.try_lock().map(|h| h.clone()) else {
            return;
        };
        // Not under the lock: a hook may resize the cache.
        let mut done = true;
        for h in hooks {
            done &= h();
        }
        if done {
            self.demand.settled.store(gen, Ordering::Relaxed);
        }
    }

    /// A child's first look: forget the pages of files opened in another
    /// process; `false` when the list of files is locked (someone else is
    /// at it, or a thread of the parent held it at the fork).
    fn forget_inherited(&self, gen: u64) -> bool {
        let files: Vec<Arc<FileShared>> = match self.files.try_lock() {
            Some(v) => v.iter().filter_map(|w| w.upgrade()).collect(),
            None => return false,
        };
        let mut pages = 0;
        for f in files.iter().filter(|f| f.generation != gen) {
            pages += f.forget_pages();
        }
        if pages > 0 {
            log::debug!(
                "kxarray: a child process forgets the {pages} cached pages of the files \
                 opened before its fork"
            );
        }
        true
    }
}

impl FileShared {
    /// Drop every folio and shadow of the file, dirty ones too, writing
    /// nothing back (a forked child's copies of its parent's pages);
    /// folios whose lock is held stay. Returns the pages dropped.
    pub(crate) fn forget_pages(&self) -> u64 {
        let (folios, shadows) = self.folios_in(0, u64::MAX);
        let mut dropped = 0;
        for f in folios {
            let Some(mut w) = f.mem().try_lock() else {
                continue;
            };
            // Under writeback: the parent's write in flight, whose end only
            // the parent sees.
            if f.test(FolioFlags::DETACHED) || f.test(FolioFlags::WRITEBACK) {
                continue;
            }
            self.detach(&f, &mut w, None);
            dropped += f.nr_pages();
        }
        for i in shadows {
            self.mapping.drop_shadow(i);
        }
        dropped
    }
}

impl PageCache {
    /// Run `hook` at this cache's misses in this process until
    /// it returns `true`, and again in a child after `fork` (see the
    /// module notes): for work that waits until the cache is used, such as
    /// starting a thread. It never runs under one of the cache's locks,
    /// so it may resize the cache.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let runs = Arc::new(AtomicUsize::new(0));
    /// let r = Arc::clone(&runs);
    /// cache.on_demand(move || r.fetch_add(1, Ordering::Relaxed) >= 1); // done at its 2nd run
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap(); // an open does not run it
    /// assert_eq!(runs.load(Ordering::Relaxed), 0);
    /// let mut b = [0u8; 1];
    /// file.read_at(&mut b, 0).unwrap(); // the first miss runs it
    /// assert_eq!(runs.load(Ordering::Relaxed), 1);
    /// for page in 1..4 {
    ///     std::thread::sleep(std::time::Duration::from_millis(2)); // (once a millisecond at most)
    ///     file.read_at(&mut b, page * 4096).unwrap(); // misses
    /// }
    /// assert_eq!(runs.load(Ordering::Relaxed), 2); // not after it returned true
    /// ```
    pub fn on_demand(&self, hook: impl Fn() -> bool + Send + Sync + 'static) {
        self.inner.demand.hooks.lock().push(Arc::new(hook));
        self.inner.demand.settled.store(0, Ordering::Relaxed);
        self.inner.demand.last_run.store(0, Ordering::Relaxed);
    }
}
