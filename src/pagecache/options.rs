//! Per-file options ([`FileOptions`]: block size, the folio size writes
//! allocate, whole-folio dirty tracking) and the typed error an invalid
//! choice gives at open ([`OpenError`]).
//!
//! Owns the validation: a block size is a power of two from
//! [`MIN_BLOCK_SIZE`] to [`MAX_BLOCK_SIZE`]; a write folio size is a power
//! of two from one page to 2 MiB. Invalid options never open a file.

use crate::filemap::PAGE_SIZE;
use std::fmt;
use std::io;

/// Smallest block size (one sector).
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest block size (one page).
pub const MAX_BLOCK_SIZE: u32 = PAGE_SIZE as u32;
/// Largest folio size writes may allocate (order 9 with 4 KiB pages).
pub const MAX_WRITE_FOLIO_SIZE: u64 = 2 << 20;

/// How one cached file tracks and writes back its data.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let opts = FileOptions::default().block_size(512).folio_size(64 << 10);
/// let file = cache.open_with(RamDisk::new(1 << 20), opts).unwrap();
/// file.write_at(&[1u8; 512], 4096).unwrap(); // dirties one 512 B block
/// assert_eq!(cache.stats().dirty_bytes, 512);
///
/// let bad = FileOptions::default().block_size(1000);
/// assert!(matches!(
///     cache.open_with(RamDisk::new(4096), bad),
///     Err(OpenError::BlockSize(1000))
/// ));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Bytes per block: the unit of dirty and uptodate state inside a
    /// folio, of read-modify-write and of writeback.
    pub block_size: u32,
    /// Bytes of the folios a write allocates on a miss (when its
    /// neighbourhood in the index is free; else one page).
    pub folio_size: u64,
    /// Track dirty state per folio instead of per block (the baseline the
    /// kernel had before iomap tracked sub-folio dirty state): a partial
    /// write first reads the whole folio, and writeback writes it whole.
    pub whole_folio: bool,
    /// Cache the file in the region the cache shares with other processes
    /// when it has one ([`CacheConfig::shared`](super::CacheConfig::shared))
    /// and the file can be shared (default); `false` keeps it in this
    /// process's own memory whatever the cache's setting (a file only this
    /// process reads, or one another process writes without the cache).
    pub share: bool,
    /// With `share`: whether opening the file in the region checks it
    /// against what members last left (its size and times) and drops its
    /// frames when someone else changed it (default); `false` when the
    /// caller keeps the frames coherent itself
    /// ([`SharedFile::open_checked`](crate::shared::SharedFile::open_checked)).
    pub check_at_open: bool,
}

impl Default for FileOptions {
    /// 4 KiB blocks, one-page write folios, per-block dirty tracking.
    fn default() -> Self {
        FileOptions {
            block_size: PAGE_SIZE as u32,
            folio_size: PAGE_SIZE as u64,
            whole_folio: false,
            share: true,
            check_at_open: true,
        }
    }
}

impl FileOptions {
    /// Set the block size in bytes.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
    /// use kxarray::pagecache::{MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().block_size(MIN_BLOCK_SIZE);
    /// let file = cache.open_with(RamDisk::new(1 << 20), opts).unwrap();
    /// file.write_at(b"x", 0).unwrap(); // dirties one 512-byte block...
    /// let s = cache.stats();
    /// // ...after reading the 511 bytes of it the write does not cover
    /// assert_eq!((s.backend_read_bytes, s.dirty_bytes), (511, 512));
    /// let too_big = FileOptions::default().block_size(2 * MAX_BLOCK_SIZE);
    /// let e = cache.open_with(RamDisk::new(4096), too_big).unwrap_err();
    /// assert!(matches!(e, OpenError::BlockSize(8192)));
    /// ```
    pub fn block_size(mut self, bytes: u32) -> Self {
        self.block_size = bytes;
        self
    }
    /// Set the folio size writes allocate, in bytes.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
    /// use kxarray::pagecache::MAX_WRITE_FOLIO_SIZE;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().folio_size(MAX_WRITE_FOLIO_SIZE); // 2 MiB
    /// let file = cache.open_with(RamDisk::new(4 << 20), opts).unwrap();
    /// file.write_at(b"x", 0).unwrap();
    /// assert_eq!(file.cached_pages(), 512); // one folio
    /// let odd = FileOptions::default().folio_size(12 << 10); // not a power of two
    /// let e = cache.open_with(RamDisk::new(4096), odd).unwrap_err();
    /// assert!(matches!(e, OpenError::FolioSize(s) if s == 12 << 10));
    /// ```
    pub fn folio_size(mut self, bytes: u64) -> Self {
        self.folio_size = bytes;
        self
    }
    /// Turn whole-folio dirty tracking on or off.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().folio_size(16 << 10).whole_folio(true);
    /// let file = cache.open_with(RamDisk::new(1 << 20), opts).unwrap();
    /// file.write_at(b"x", 0).unwrap(); // one byte: the whole 16 KiB folio is dirtied
    /// let s = cache.stats();
    /// // and read first, all but the byte written
    /// assert_eq!((s.backend_read_bytes, s.dirty_bytes), ((16 << 10) - 1, 16 << 10));
    /// ```
    pub fn whole_folio(mut self, on: bool) -> Self {
        self.whole_folio = on;
        self
    }

    /// Whether the file may go in the cache's shared region
    /// ([`FileOptions::share`]).
    ///
    /// ```
    /// use kxarray::pagecache::FileOptions;
    ///
    /// let private = FileOptions::default().share(false);
    /// assert!(!private.share && FileOptions::default().share);
    /// ```
    pub fn share(mut self, on: bool) -> Self {
        self.share = on;
        self
    }

    /// Whether opening a shared file checks it
    /// ([`FileOptions::check_at_open`]).
    pub fn check_at_open(mut self, on: bool) -> Self {
        self.check_at_open = on;
        self
    }

    /// Check the options; on success, `(log2 block size, write folio order)`.
    ///
    /// # Errors
    /// [`OpenError::BlockSize`] or [`OpenError::FolioSize`].
    pub(crate) fn validate(&self) -> Result<(u32, u32), OpenError> {
        let b = self.block_size;
        if !b.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&b) {
            return Err(OpenError::BlockSize(b));
        }
        let f = self.folio_size;
        if !f.is_power_of_two() || !(PAGE_SIZE as u64..=MAX_WRITE_FOLIO_SIZE).contains(&f) {
            return Err(OpenError::FolioSize(f));
        }
        Ok((b.trailing_zeros(), (f / PAGE_SIZE as u64).trailing_zeros()))
    }
}

/// Why [`PageCache::open_with`](super::PageCache::open_with) refused a file.
///
/// [`PageCache::open`](super::PageCache::open) and `?` in a function
/// returning [`io::Result`] turn it into an [`io::Error`]: the backend's own
/// error, or [`io::ErrorKind::InvalidInput`] for invalid options.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let bad = FileOptions::default().block_size(1000);
/// let e = cache.open_with(RamDisk::new(4096), bad).unwrap_err();
/// assert!(matches!(e, OpenError::BlockSize(1000)));
/// assert_eq!(e.to_string(), "block size 1000 is not a power of two from 512 to 4096");
/// let e = std::io::Error::from(e);
/// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The block size is not a power of two from 512 to 4096 bytes.
    BlockSize(u32),
    /// The write folio size is not a power of two from 4 KiB to 2 MiB.
    FolioSize(u64),
    /// The backend's error reading its length.
    Io(io::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::BlockSize(b) => write!(
                f,
                "block size {b} is not a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}"
            ),
            OpenError::FolioSize(s) => write!(
                f,
                "folio size {s} is not a power of two from {PAGE_SIZE} to {MAX_WRITE_FOLIO_SIZE}"
            ),
            OpenError::Io(e) => write!(f, "backend: {e}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> io::Error {
        match e {
            OpenError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}
