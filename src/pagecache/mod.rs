//! A page cache over any [`Backend`]: buffered reads and writes through
//! [`AddressSpace`](crate::filemap::AddressSpace)s, workingset eviction with shadow entries, tag-driven
//! writeback with `errseq` error reporting, a background flusher, dirty
//! throttling, readahead into large folios, and zero-copy folio references
//! that never block a writer.
//!
//! Owns [`PageCache`] (one cache, a capacity in bytes, many files) and its
//! configuration; the per-file handle is [`CachedFile`]. Each concept has
//! its own module, and they run one way (checked by `tests/module_graph.rs`):
//! `file` (the per-file operations, on top) uses `inode` (the file's shared
//! state), `folio_write` ([`FolioWrite`]), `folio` ([`FolioRef`]), `borrow`
//! ([`FolioBorrow`]), `writeback`, `throttle`, `reclaim` (the scan and
//! eviction), `lru` (the two lists), `workingset` (shadows, refault
//! distance, shadow-node cap), `blocks` (per-block state), `readahead`,
//! `errseq`, `flusher`, `kswapd` (the background reclaimer, on `reclaim`),
//! `retry` (the writeback backoff of folios and files whose writes failed),
//! `reuse` (which read misses are admitted and which pass the cache by),
//! `passthrough` (the reads that pass it by: straight into the caller's
//! buffer, through the file's `ring`, or dropped behind the reader) and
//! `stats` (the counters, at the bottom).
//!
//! Reads that hit take no lock and write nothing shared but the thread's
//! own counter slot: they copy a folio's bytes optimistically and keep the
//! copy only if the folio's version did not move (see `filemap::mem`).
//! Folio memory comes from 2 MiB regions advised for transparent huge pages
//! ([`frame_stats`](crate::filemap::frame_stats)).
//!
//! Invariants: `nr_cached` is the number of pages in folios present in some
//! file's address space; the cache holds at most `capacity` bytes of folios
//! after every miss, except for dirty, pinned or in-use folios reclaim could
//! not evict yet (it writes dirty ones back, those whose last write failed
//! only at their retry time, and goes on while that makes progress), and except
//! the bytes that zero-copy references pinned before a writer copied or
//! truncation dropped the folio (they belong to the reference); lock order
//! is a file's writeback lock, then its size lock, then a folio's lock,
//! then the LRU lock, then a tree's lock (reclaim, which holds the LRU
//! lock, only ever *tries* a folio's lock).
//!
//! ```
//! use kxarray::backend::RamDisk;
//! use kxarray::pagecache::{CacheConfig, PageCache};
//!
//! let cache = PageCache::new(CacheConfig::default().capacity(1 << 20));
//! let file = cache.open(RamDisk::new(1 << 20)).unwrap();
//! file.write_at(b"hello, page cache", 4096).unwrap();
//! let mut buf = [0u8; 5];
//! assert_eq!(file.read_at(&mut buf, 4096).unwrap(), 5);
//! assert_eq!(&buf, b"hello");
//! file.sync().unwrap(); // the RAM disk now holds the bytes
//! let page = file.read_folio(1).unwrap(); // zero-copy
//! assert_eq!(&page[..5], b"hello");
//! assert!(cache.stats().hits >= 1);
//! ```

mod behind;
mod blocks;
mod borrow;
#[cfg(target_os = "linux")]
mod budget;
mod capacity;
mod demand;
mod errseq;
mod file;
mod fill;
mod fill_state;
mod flusher;
mod folio;
mod folio_write;
mod inode;
mod kswapd;
mod lru;
mod options;
mod passthrough;
mod paths;
mod read_async;
mod readahead;
mod reclaim;
mod retry;
mod reuse;
mod ring;
mod stats;
mod throttle;
mod workingset;
mod write_queue;
mod write_through;
mod writeback;

pub use borrow::FolioBorrow;
pub use capacity::{CapacityError, MAX_CAPACITY};
pub use file::CachedFile;
pub use folio::{FolioRef, HeldFolio};
pub use folio_write::FolioWrite;
pub use options::{FileOptions, OpenError, MAX_BLOCK_SIZE, MAX_WRITE_FOLIO_SIZE, MIN_BLOCK_SIZE};
pub use paths::MAX_FILE_SIZE;
pub use read_async::ReadFuture;
pub use readahead::{Advice, DEFAULT_READAHEAD_BYTES};
pub use retry::{WRITEBACK_RETRY_MAX, WRITEBACK_RETRY_MIN};
pub use reuse::ReadFlags;
pub use stats::CacheStats;
pub use throttle::{ThrottleMode, MAX_PAUSE, STUCK_PAUSES};

use crate::backend::Backend;
use crate::filemap::PAGE_SIZE;
use crate::sync::{AtomicU64, Lock, Ordering};
use inode::FileShared;
use lru::Lru;
use stats::Counters;
use std::io;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use workingset::Workingset;

/// A page cache's settings. Fields are public; the methods are a builder.
///
/// ```
/// use kxarray::pagecache::CacheConfig;
/// use std::time::Duration;
/// let c = CacheConfig::default()
///     .capacity(64 << 20)
///     .max_folio_order(5)
///     .dirty_expire(Duration::from_millis(500))
///     .flusher(false);
/// assert_eq!(c.capacity, 64 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes of folio data the cache holds before reclaiming (rounded down
    /// to whole pages): the starting capacity, from one page to
    /// [`MAX_CAPACITY`] (less or more is refused as
    /// [`PageCache::set_capacity`] refuses it: [`CacheConfig::validate`],
    /// [`PageCache::try_new`]); [`PageCache::set_capacity`] changes it at
    /// run time.
    pub capacity: u64,
    /// Largest folio order readahead allocates (4 = 64 KiB with 4 KiB
    /// pages). Clamped to at least 4 and at most
    /// [`MAX_FOLIO_ORDER`](crate::filemap::MAX_FOLIO_ORDER).
    pub max_folio_order: u32,
    /// Dirty bytes (over the whole cache) above which the flusher starts
    /// writing back (default 10% of the capacity).
    pub dirty_background_bytes: u64,
    /// Bytes not yet on the backend (dirty or under writeback) above which
    /// writers are throttled (default 20% of the capacity): they pause, at
    /// most [`MAX_PAUSE`] at a time, until the flusher brings those bytes
    /// back under it (with no flusher thread, a throttled writer writes back
    /// itself). A writer stops waiting when writeback makes no progress (a
    /// failing backend, whose error the next `sync` reports): at most ten
    /// pauses. Bytes whose write failed do not count here
    /// ([`CacheStats::unwritable_bytes`]); while they are above this limit,
    /// writes to a file whose writeback fails return its writeback error
    /// (`docs/memory.md`, "A failing backend"). The flusher
    /// writes back early only above `dirty_background_bytes`: keep that
    /// below this limit, or a throttled writer pauses for nothing until it
    /// gives up after ten pauses and goes on with the bytes still dirty.
    pub dirty_bytes: u64,
    /// Pages a thread dirties between two reads of the global dirty count
    /// ([`ThrottleMode::Ratelimited`]; default 32).
    pub ratelimit_pages: u64,
    /// How writers read the global dirty count.
    pub throttle_mode: ThrottleMode,
    /// Age after which dirty data is written back by the flusher.
    pub dirty_expire: Duration,
    /// Run a background flusher thread (stopped when the last
    /// [`PageCache`] handle is dropped).
    pub flusher: bool,
    /// Run a background reclaimer thread (the kernel's `kswapd`; stopped
    /// when the last [`PageCache`] handle is dropped): it evicts ahead of
    /// the readers once the cache is within a 64th of its capacity (at most
    /// 2 MiB) of it, so that a miss does not reclaim itself. Caches under
    /// 8 MiB reclaim in their readers only. Default off: on the project's
    /// 2-core machine it took a fifth of a miss's instructions off the
    /// reader but gained nothing with one reader and lost with two
    /// (`docs/miss-path.md`); it is for machines with cores to spare.
    pub background_reclaim: bool,
    /// Let a sequential read of a file larger than the capacity pass the
    /// cache by (default on): its misses are read without a frame (into
    /// the caller's buffer, or through the file's 256 KiB ring) and not
    /// kept, so the scan neither evicts what is hot nor pays a frame's fill
    /// and an eviction for pages a second scan would not find anyway (`docs/memory.md`, "Reads that pass the cache
    /// by"). Off: only reads that ask ([`ReadFlags::NOREUSE`], a file
    /// advised [`Advice::NoReuse`]) pass it by.
    pub passthrough: bool,
    /// Cache files in the region shared by this user's processes
    /// ([`CacheConfig::shared`]) instead of this cache's own memory; `None`
    /// (the default) keeps every file private.
    pub shared: Option<SharedConfig>,
}

/// Where a cache shared by processes lives and how large it may grow
/// ([`CacheConfig::shared`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedConfig {
    /// The user's own directory the region file lives in (mode 0700; made
    /// if missing, refused if it is not the user's alone). `None` (the
    /// default): the user's runtime directory, where the shared memory
    /// budget's registry lives too: `$XDG_RUNTIME_DIR/kxarray` when that is
    /// the user's, else `/dev/shm/kxarray-<euid>`
    /// ([`RuntimeDir::for_user`](crate::ipc::RuntimeDir::for_user)).
    pub dir: Option<std::path::PathBuf>,
    /// The region's name in it: processes that name the same region share
    /// it (default `cache`).
    pub name: String,
    /// The most bytes the region can ever hold, fixed when it is made
    /// (its index is sized for it: about 0.6% of this). Default: four
    /// times the cache's capacity, at least 256 MiB.
    pub max_bytes: Option<u64>,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig {
            dir: None,
            name: "cache".into(),
            max_bytes: None,
        }
    }
}

impl Default for CacheConfig {
    /// 64 MiB, order-4 readahead cap, 10% background threshold, 20% dirty
    /// limit, ratelimit 32 pages, 1 s expiry, flusher on, background
    /// reclaim off, scans larger than the cache passing it by.
    fn default() -> Self {
        CacheConfig {
            capacity: 64 << 20,
            max_folio_order: 4,
            dirty_background_bytes: (64 << 20) / 10,
            dirty_bytes: (64 << 20) / 5,
            ratelimit_pages: 32,
            throttle_mode: ThrottleMode::Ratelimited,
            dirty_expire: Duration::from_secs(1),
            flusher: true,
            background_reclaim: false,
            shared: None,
            passthrough: true,
        }
    }
}

impl CacheConfig {
    /// Set the capacity in bytes (and the background threshold to 10% of
    /// it, the dirty limit to 20%). A capacity below one page or above
    /// [`MAX_CAPACITY`] is refused when the cache is made
    /// ([`PageCache::try_new`]), or before ([`validate`](CacheConfig::validate)).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self.dirty_background_bytes = bytes / 10;
        self.dirty_bytes = bytes / 5;
        self
    }
    /// Whether a cache can be made with this configuration: its capacity
    /// is checked as [`PageCache::set_capacity`] checks one (a command
    /// line checks `--cache-size` with it before anything starts).
    ///
    /// # Errors
    /// [`CapacityError::TooSmall`] below one page,
    /// [`CapacityError::TooLarge`] above [`MAX_CAPACITY`].
    ///
    /// ```
    /// use kxarray::pagecache::{CacheConfig, CapacityError};
    /// assert_eq!(CacheConfig::default().capacity(0).validate(), Err(CapacityError::TooSmall(0)));
    /// assert_eq!(CacheConfig::default().capacity(4096).validate(), Ok(()));
    /// ```
    pub fn validate(&self) -> Result<(), CapacityError> {
        capacity::pages_for(self.capacity).map(drop)
    }

    /// Set the dirty limit in bytes.
    pub fn dirty_bytes(mut self, bytes: u64) -> Self {
        self.dirty_bytes = bytes;
        self
    }
    /// Set the pages a thread dirties between reads of the global count.
    pub fn ratelimit_pages(mut self, pages: u64) -> Self {
        self.ratelimit_pages = pages;
        self
    }
    /// Set how writers read the global dirty count.
    pub fn throttle_mode(mut self, mode: ThrottleMode) -> Self {
        self.throttle_mode = mode;
        self
    }
    /// Set the readahead folio order cap.
    pub fn max_folio_order(mut self, order: u32) -> Self {
        self.max_folio_order = order;
        self
    }
    /// Set the flusher's dirty threshold in bytes.
    pub fn dirty_background_bytes(mut self, bytes: u64) -> Self {
        self.dirty_background_bytes = bytes;
        self
    }
    /// Set the dirty expiry interval.
    pub fn dirty_expire(mut self, d: Duration) -> Self {
        self.dirty_expire = d;
        self
    }
    /// Turn the background flusher on or off.
    pub fn flusher(mut self, on: bool) -> Self {
        self.flusher = on;
        self
    }
    /// Turn the background reclaimer on or off (off: every eviction is
    /// made by the miss that finds the cache over its capacity).
    pub fn background_reclaim(mut self, on: bool) -> Self {
        self.background_reclaim = on;
        self
    }
    /// Let sequential reads of files larger than the capacity pass the
    /// cache by, or not ([`CacheConfig::passthrough`]).
    pub fn passthrough(mut self, on: bool) -> Self {
        self.passthrough = on;
        self
    }
    /// Share the cache with this user's other processes: files that are
    /// files of a file system (a [`FileBackend`](crate::backend::FileBackend))
    /// are cached in one region of shared memory that every process with
    /// this setting maps (see [`shared`](crate::shared)), so a page any of
    /// them read is a hit for all and is held once. Other backends, and
    /// every file when the region cannot be joined (said once through the
    /// `log` crate), stay in this cache's own memory. The capacity is the
    /// region's when this process makes it; a process whose capacity is
    /// larger raises the region's when it joins.
    ///
    /// ```no_run
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().capacity(256 << 20).shared());
    /// let file = cache.open(FileBackend::create("/tmp/data".as_ref()).unwrap()).unwrap();
    /// file.write_at(b"seen by every member at once", 0).unwrap();
    /// assert!(cache.region().is_some());
    /// ```
    pub fn shared(self) -> Self {
        self.shared_with(SharedConfig::default())
    }
    /// [`shared`](Self::shared) with the region's place and size given.
    pub fn shared_with(mut self, s: SharedConfig) -> Self {
        self.shared = Some(s);
        self
    }
}

/// The state every handle of one cache shares.
pub(crate) struct CacheInner {
    pub(crate) config: CacheConfig,
    /// The capacity in pages ([`PageCache::set_capacity`] changes it).
    capacity_pages: AtomicU64,
    /// The flusher's threshold and the dirty limit in bytes: the
    /// configuration's, scaled with the capacity when it changes.
    dirty_background: AtomicU64,
    dirty_limit: AtomicU64,
    /// Serializes capacity changes.
    resize: Lock<()>,
    pub(crate) max_order: u32,
    pub(crate) lru: Lock<Lru>,
    pub(crate) nr_cached: AtomicU64,
    pub(crate) workingset: Workingset,
    pub(crate) counters: Counters,
    pub(crate) throttle: throttle::Throttle,
    files: Lock<Vec<Weak<FileShared>>>,
    next_file_id: AtomicU64,
    start: Instant,
    pub(crate) flusher_event: std::sync::OnceLock<Arc<crate::sync::Event>>,
    pub(crate) kswapd_event: std::sync::OnceLock<Arc<crate::sync::Event>>,
    /// The region shared with other processes, when joined.
    #[cfg(all(target_os = "linux", not(loom)))]
    pub(crate) region: Option<Arc<crate::shared::Region>>,
    /// What waits for the first miss in a process (`demand`).
    pub(crate) demand: demand::Demand,
}

impl CacheInner {
    /// Milliseconds since the cache was made, plus one (0 means "never").
    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// The capacity in pages now.
    #[inline]
    pub(crate) fn capacity_pages(&self) -> u64 {
        self.capacity_pages.load(Ordering::Relaxed)
    }

    /// Dirty bytes above which the flusher writes back now.
    #[inline]
    pub(crate) fn dirty_background_bytes(&self) -> u64 {
        self.dirty_background.load(Ordering::Relaxed)
    }

    /// Unwritten bytes above which writers are throttled now.
    #[inline]
    pub(crate) fn dirty_bytes_limit(&self) -> u64 {
        self.dirty_limit.load(Ordering::Relaxed)
    }

    /// Pages the active list may hold: all but an eighth of the capacity.
    pub(crate) fn active_cap(&self) -> u64 {
        let cap = self.capacity_pages();
        cap - (cap / 8).max(1).min(cap)
    }

    /// The live files.
    pub(crate) fn files(&self) -> Vec<Arc<FileShared>> {
        let mut v = self.files.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(|w| w.upgrade()).collect()
    }
}

/// A page cache: one capacity shared by many files. Cloning is cheap (an
/// `Arc`); the flusher thread stops when the last clone is dropped (files
/// stay usable without it).
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// // Scans keep what they read here (a scan of a file larger than the
/// // cache would pass it by: `CacheConfig::passthrough`).
/// let config = CacheConfig::default().capacity(64 * 4096).flusher(false).passthrough(false);
/// let cache = PageCache::new(config);
/// let a = cache.open(RamDisk::new(1 << 20)).unwrap();
/// let b = cache.clone().open(RamDisk::new(1 << 20)).unwrap(); // the same cache
/// let mut buf = [0u8; 4096];
/// for page in 0..256 {
///     a.read_at(&mut buf, page * 4096).unwrap();
///     b.read_at(&mut buf, page * 4096).unwrap();
/// }
/// let s = cache.stats(); // 512 pages read; the two files share 64
/// assert!(s.cached_pages <= 64 && s.evictions > 0);
/// assert_eq!(a.cached_pages() + b.cached_pages(), s.cached_pages);
/// ```
#[derive(Clone)]
pub struct PageCache {
    inner: Arc<CacheInner>,
    _flusher: Option<Arc<flusher::Flusher>>,
    _kswapd: Option<Arc<kswapd::Kswapd>>,
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCache")
            .field("capacity", &self.capacity())
            .field("stats", &self.stats())
            .finish()
    }
}

impl PageCache {
    /// A cache with `config` (starting its flusher thread if asked).
    ///
    /// # Panics
    /// When `config`'s capacity is refused ([`CacheConfig::validate`]: less
    /// than one page or more than [`MAX_CAPACITY`]). A capacity that comes
    /// from input goes to [`try_new`](PageCache::try_new), which returns
    /// the error instead.
    ///
    /// ```
    /// use kxarray::pagecache::{CacheConfig, CacheStats, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
    /// assert_eq!(cache.config().capacity, 1 << 20);
    /// let s = cache.stats();
    /// assert_eq!(s.capacity_bytes, 1 << 20);
    /// let counted = CacheStats { capacity_bytes: 1 << 20, ..CacheStats::default() };
    /// assert_eq!(CacheStats { frame_bytes_free: 0, ..s }, counted); // nothing cached or counted yet
    /// ```
    pub fn new(config: CacheConfig) -> PageCache {
        PageCache::try_new(config).unwrap_or_else(|e| panic!("PageCache::new: {e}"))
    }

    /// A cache with `config`, or why its capacity is refused (as
    /// [`set_capacity`](PageCache::set_capacity) refuses one).
    ///
    /// # Errors
    /// [`CapacityError`] as [`CacheConfig::validate`].
    ///
    /// ```
    /// use kxarray::pagecache::{CacheConfig, CapacityError, PageCache};
    ///
    /// let e = PageCache::try_new(CacheConfig::default().capacity(0)).unwrap_err();
    /// assert_eq!(e, CapacityError::TooSmall(0));
    /// let cache = PageCache::try_new(CacheConfig::default().capacity(1 << 20)).unwrap();
    /// assert_eq!(cache.capacity(), 1 << 20);
    /// ```
    pub fn try_new(config: CacheConfig) -> Result<PageCache, CapacityError> {
        let capacity_pages = capacity::pages_for(config.capacity)?;
        let max_order = config
            .max_folio_order
            .clamp(4, crate::filemap::MAX_FOLIO_ORDER);
        crate::filemap::retain_frames(capacity_pages as usize * PAGE_SIZE, true);
        // Before the cache's threads (flusher, prefaulter, a monitor the
        // caller starts next): the membarrier registration is cheap while
        // the process has one thread.
        crate::lightpin::prepare();
        let inner = Arc::new(CacheInner {
            capacity_pages: AtomicU64::new(capacity_pages),
            dirty_background: AtomicU64::new(config.dirty_background_bytes),
            dirty_limit: AtomicU64::new(config.dirty_bytes),
            resize: Lock::new(()),
            max_order,
            lru: Lock::new(Lru::default()),
            nr_cached: AtomicU64::new(0),
            workingset: Workingset::new(capacity_pages),
            counters: Counters::new(),
            throttle: throttle::Throttle::new(),
            files: Lock::new(Vec::new()),
            next_file_id: AtomicU64::new(1),
            start: Instant::now(),
            flusher_event: std::sync::OnceLock::new(),
            kswapd_event: std::sync::OnceLock::new(),
            #[cfg(all(target_os = "linux", not(loom)))]
            region: config
                .shared
                .as_ref()
                .and_then(|s| join_region(s, config.capacity)),
            demand: demand::Demand::new(),
            config,
        });
        let flusher = if inner.config.flusher && !cfg!(loom) {
            Some(Arc::new(flusher::Flusher::start(&inner)))
        } else {
            None
        };
        let kswapd = if inner.config.background_reclaim && !cfg!(loom) {
            Some(Arc::new(kswapd::Kswapd::start(&inner)))
        } else {
            None
        };
        Ok(PageCache {
            inner,
            _flusher: flusher,
            _kswapd: kswapd,
        })
    }

    /// Cache `backend` as a file with the default [`FileOptions`]. Its
    /// current length is the file's length.
    ///
    /// # Errors
    /// The backend's error from reading its length.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(3 * 4096)).unwrap();
    /// assert_eq!(file.len(), 3 * 4096); // the backend's length
    /// assert_eq!(file.cached_pages(), 0); // nothing read yet
    /// ```
    pub fn open<B: Backend + 'static>(&self, backend: B) -> io::Result<CachedFile> {
        Ok(self.open_with(backend, FileOptions::default())?)
    }

    /// Cache `backend` as a file with `opts` (block size, write folio
    /// size, whole-folio mode).
    ///
    /// # Errors
    /// [`OpenError::BlockSize`] or [`OpenError::FolioSize`] for invalid
    /// options (checked before the backend is touched);
    /// [`OpenError::Io`] with the backend's error reading its length.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().folio_size(16 << 10);
    /// let file = cache.open_with(RamDisk::new(1 << 20), opts).unwrap();
    /// file.write_at(b"x", 0).unwrap();
    /// assert_eq!(file.cached_pages(), 4); // the write allocated one 16 KiB folio
    ///
    /// let e = cache.open_with(RamDisk::new(4096), FileOptions::default().folio_size(3 << 20));
    /// let e = e.unwrap_err();
    /// assert!(matches!(e, OpenError::FolioSize(s) if s == 3 << 20));
    /// assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::InvalidInput);
    /// ```
    pub fn open_with<B: Backend + 'static>(
        &self,
        backend: B,
        opts: FileOptions,
    ) -> Result<CachedFile, OpenError> {
        opts.validate()?;
        // In a forked child: the inherited pages go first (`demand`).
        self.inner.demand_at_open();
        #[cfg(all(target_os = "linux", not(loom)))]
        let region_file = match &self.inner.region {
            Some(r) if opts.share => share(r, &backend, opts.check_at_open),
            _ => None,
        };
        let len = backend.len().map_err(OpenError::Io)?;
        let id = self.inner.next_file_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(FileShared::new(
            id,
            Arc::clone(&self.inner),
            Box::new(backend),
            len,
            opts,
        )?);
        self.inner.files.lock().push(Arc::downgrade(&shared));
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(r) = region_file {
            return Ok(CachedFile::in_region(shared, r));
        }
        Ok(CachedFile::new(shared))
    }

    /// The region this cache shares with other processes, if it joined one
    /// ([`CacheConfig::shared`]).
    #[cfg(all(target_os = "linux", not(loom)))]
    pub fn region(&self) -> Option<&Arc<crate::shared::Region>> {
        self.inner.region.as_ref()
    }

    /// The configuration the cache was made with.
    ///
    /// ```
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().capacity(8 << 20).flusher(false));
    /// assert_eq!(cache.config().dirty_bytes, (8 << 20) / 5); // set by `capacity`
    /// assert_eq!(cache.clone().config(), cache.config()); // clones share it
    /// ```
    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// A snapshot of the counters.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// let mut buf = [0u8; 100];
    /// file.read_at(&mut buf, 40960).unwrap(); // a miss: the page is read from the RAM disk
    /// file.read_at(&mut buf, 40960).unwrap(); // a hit
    /// let s = cache.stats();
    /// assert_eq!((s.misses, s.hits, s.cached_pages), (1, 1, 1));
    /// assert_eq!(s.backend_read_bytes, 4096);
    /// ```
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let t = &self.inner.throttle;
        let files = self.inner.files();
        let shadows = files.iter().map(|f| f.mapping.nr_shadow_pages()).sum();
        let cached_pages = self.inner.nr_cached.load(Ordering::Relaxed);
        CacheStats {
            hits: c.hits.sum(),
            misses: c.misses.sum(),
            refaults: c.refaults.load(Ordering::Relaxed),
            activations: c.activations.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            shadows,
            shadow_nodes_reclaimed: c.shadow_nodes_reclaimed.load(Ordering::Relaxed),
            dirty_bytes: c.dirty_bytes.read(),
            throttled: t.throttled.load(Ordering::Relaxed),
            pauses: t.pauses.load(Ordering::Relaxed),
            pause_ns: t.pause_ns.load(Ordering::Relaxed),
            max_pause_ns: t.max_pause_ns.load(Ordering::Relaxed),
            max_pause_asked_ns: t.max_pause_asked_ns.load(Ordering::Relaxed),
            dirty_global_reads: t.global_reads.load(Ordering::Relaxed),
            background_kicks: t.background_kicks.load(Ordering::Relaxed),
            flusher_runs: c.flusher_runs.load(Ordering::Relaxed) as u64,
            background_evictions: c.background_evictions.load(Ordering::Relaxed),
            writeback_bytes: c.writeback_bytes.load(Ordering::Relaxed),
            writeback_errors: c.writeback_errors.load(Ordering::Relaxed),
            unwritable_bytes: c.unwritable_bytes.load(Ordering::Relaxed),
            backend_read_bytes: c.backend_read_bytes.load(Ordering::Relaxed),
            backend_written_bytes: c.backend_written_bytes.load(Ordering::Relaxed),
            cached_pages,
            readahead_pages: c.readahead_pages.load(Ordering::Relaxed),
            passthrough_pages: c.passthrough_pages.load(Ordering::Relaxed),
            passthrough_bytes: c.passthrough_bytes.load(Ordering::Relaxed),
            capacity_bytes: self.capacity(),
            cached_bytes: cached_pages * PAGE_SIZE as u64,
            frame_bytes_free: crate::filemap::frame_stats().bytes_free as u64,
            metadata_bytes: self.inner.metadata_bytes(&files),
        }
    }

    /// The capacity now, in bytes (whole pages): the configuration's until
    /// [`set_capacity`](PageCache::set_capacity) changes it.
    ///
    /// ```
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().capacity(10_000).flusher(false));
    /// assert_eq!(cache.capacity(), 8192); // whole pages
    /// ```
    pub fn capacity(&self) -> u64 {
        self.inner.capacity_pages() * PAGE_SIZE as u64
    }

    /// Change the capacity at run time (rounded down to whole pages).
    /// Growing takes effect at once. Whenever the cache holds more than
    /// the capacity set (a shrink, or the same capacity again after pins or
    /// failed writes held the cache over), this evicts, in the caller,
    /// until the cache holds at most that capacity (dirty folios are
    /// written back first, except those whose last write failed before
    /// their retry time, [`WRITEBACK_RETRY_MIN`]; folios pinned or in use
    /// stay until they are let go, as at any capacity), then returns the memory the evicted
    /// folios held to the system (free frames beyond the sum of the live
    /// caches' capacities are released). The dirty thresholds scale with
    /// the capacity (10% and 20% of it by default) and so does the
    /// workingset's cap on shadow-only tree nodes (an eighth). What
    /// [`config`](PageCache::config) returns does not change: it is the
    /// configuration the cache was made with.
    ///
    /// # Errors
    /// [`CapacityError::TooSmall`] under one page, [`CapacityError::TooLarge`]
    /// above [`MAX_CAPACITY`]; nothing changes.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.write_at(&[7; 1 << 20], 0).unwrap(); // 256 pages, all dirty
    /// cache.set_capacity(64 << 10).unwrap(); // 16 pages: written back, then evicted
    /// let s = cache.stats();
    /// assert_eq!((s.capacity_bytes, s.dirty_bytes), (64 << 10, 0));
    /// assert!(s.cached_bytes <= 64 << 10);
    /// let mut b = [0u8; 4];
    /// file.read_at(&mut b, 900_000).unwrap(); // nothing lost
    /// assert_eq!(b, [7; 4]);
    /// cache.set_capacity(2 << 20).unwrap();
    /// assert_eq!(cache.capacity(), 2 << 20);
    /// ```
    pub fn set_capacity(&self, bytes: u64) -> Result<(), CapacityError> {
        let pages = capacity::pages_for(bytes)?;
        self.inner.resize(pages);
        Ok(())
    }

    /// Write back every dirty folio of every file (without flushing the
    /// backends), as the flusher does.
    ///
    /// # Errors
    /// The first writeback error; it is also recorded for each file's next
    /// `sync`.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::sync::Arc;
    ///
    /// let disk = Arc::new(RamDisk::new(1 << 20));
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(Arc::clone(&disk)).unwrap();
    /// file.write_at(b"dirty", 0).unwrap();
    /// assert_eq!(cache.stats().dirty_bytes, 4096); // one dirty block
    /// cache.writeback_all().unwrap();
    /// assert_eq!(cache.stats().dirty_bytes, 0);
    /// let mut b = [0u8; 5];
    /// disk.read_exact_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"dirty");
    /// ```
    pub fn writeback_all(&self) -> io::Result<()> {
        let mut first = Ok(());
        for f in self.inner.files() {
            if let Err(e) = writeback::writeback(&f, 0, u64::MAX, writeback::Mode::Wait) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::backend::RamDisk;
    use crate::sync::AtomicBool;

    /// A reader hitting under light pins while another thread invalidates
    /// and rewrites the pages it reads, driving the epoch and the
    /// light limbo: under Miri a folio or buffer freed while the reader
    /// copies from it is reported; every byte read is its page's or zero.
    #[test]
    fn light_hits_race_frees() {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let file = std::sync::Arc::new(cache.open(RamDisk::new(4 * 4096)).unwrap());
        for p in 0..4u8 {
            file.write_at(&[p + 1; 4096], p as u64 * 4096).unwrap();
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reads = std::sync::Arc::new(crate::sync::AtomicU64::new(0));
        let reader = {
            let (file, stop, reads) = (file.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = n % 4;
                    let got = file.read_at(&mut buf, p * 4096 + 100).unwrap();
                    assert!(buf[..got].iter().all(|&b| b == p as u8 + 1 || b == 0));
                    n += 1;
                    reads.store(n, Ordering::Relaxed);
                }
                n
            })
        };
        // Rounds go on until the reader has run beside them (on a loaded
        // machine it may start late).
        let (rounds, min_reads) = if cfg!(miri) { (6, 4) } else { (200, 1000) };
        let mut round = 0;
        while round < rounds || reads.load(Ordering::Relaxed) < min_reads {
            let p = round % 4;
            file.sync().unwrap();
            file.invalidate(p * 4096..(p + 1) * 4096).unwrap();
            file.write_at(&[p as u8 + 1; 4096], p * 4096).unwrap();
            crate::pin().flush();
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}

/// Join the region `s` names (raising its capacity to `capacity` if it is
/// smaller), or say once why not and keep every file private.
#[cfg(all(target_os = "linux", not(loom)))]
fn join_region(s: &SharedConfig, capacity: u64) -> Option<Arc<crate::shared::Region>> {
    let page = PAGE_SIZE as u64;
    let max = s
        .max_bytes
        .unwrap_or_else(|| capacity.saturating_mul(4).max(256 << 20));
    let dir = match &s.dir {
        Some(p) => crate::ipc::RuntimeDir::create(p),
        None => crate::ipc::RuntimeDir::for_user(),
    };
    let place = match &dir {
        Ok(d) => d.path().join(&s.name),
        Err(e) => e.path.join(&s.name),
    };
    let joined = dir
        .map_err(|e| crate::shared::RegionError::Refused(e.to_string()))
        .and_then(|d| crate::shared::Region::join_dir(d, &s.name, max / page));
    match joined {
        Ok(r) => {
            if r.capacity() < capacity {
                if let Err(e) = r.set_capacity(capacity) {
                    log::warn!(
                        "kxarray: shared cache {}: cannot grow to {} MiB ({e}); it stays at {} MiB",
                        r.path().display(),
                        capacity >> 20,
                        r.capacity() >> 20
                    );
                }
            }
            Some(r)
        }
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                log::warn!(
                    "kxarray: shared cache {}: {e}; this process caches privately",
                    place.display()
                )
            });
            None
        }
    }
}

/// `backend`'s file opened in `region`, if it is a file that can be shared.
#[cfg(all(target_os = "linux", not(loom)))]
fn share<B: Backend>(
    region: &Arc<crate::shared::Region>,
    backend: &B,
    check: bool,
) -> Option<crate::shared::SharedFile> {
    use std::os::unix::ffi::OsStrExt;
    let (fd, path) = backend.file_for_sharing()?;
    let bytes = path.as_os_str().as_bytes();
    match crate::shared::SharedFile::open_checked(Arc::clone(region), fd, bytes, check) {
        Ok(f) => Some(f),
        Err(e) => {
            log::debug!("kxarray: {} cached privately: {e}", path.display());
            None
        }
    }
}
