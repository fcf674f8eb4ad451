//! [`CachedFile`], the handle of a cached file: positional reads and
//! writes, truncation, the sync calls, invalidation, zero-copy references
//! and in-place writes, each a call into the paths over the file's shared
//! state (`paths`, on `FileShared`). A cached file is itself a
//! [`Backend`].
//!
//! Owns the handle's error-sequence cursor: each clone reports a writeback
//! error once.

use super::borrow::FolioBorrow;
use super::folio::{FolioRef, HeldFolio};
use super::folio_write::FolioWrite;
use super::inode::FileShared;
use super::paths::{check_size, Fill};
use super::reuse::ReadFlags;
use super::writeback::{self, Mode};
use crate::backend::Backend;
use crate::filemap::PAGE_SIZE;
use crate::Guard;
use std::io;
use std::ops::Range;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

/// A file in a [`PageCache`](super::PageCache): buffered positional I/O
/// over its backend. Clones share the file; each clone reports a writeback
/// error once from its own `sync` (the kernel's per-`struct file`
/// `errseq_t` cursor).
///
/// Reads that hit take no lock: they copy optimistically and check the
/// folio did not change meanwhile, so readers on many cores share nothing
/// but the folios' bytes. Writers serialize per folio and never wait for
/// readers or for zero-copy references ([`FolioRef`], [`FolioBorrow`]),
/// which keep the bytes they pinned.
///
/// Dropping the last handle writes back dirty data (errors are lost then:
/// call [`sync`](CachedFile::sync) first to see them) and releases the
/// file's folios.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().capacity(1 << 20));
/// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
/// file.write_at(b"hello", 10).unwrap();
/// let mut buf = [0u8; 5];
/// assert_eq!(file.read_at(&mut buf, 10).unwrap(), 5);
/// assert_eq!(&buf, b"hello");
/// file.sync().unwrap();
/// ```
pub struct CachedFile {
    pub(super) shared: Arc<FileShared>,
    pub(super) since: crate::sync::Lock<u64>,
    /// The file in the region shared with other processes, when the cache
    /// shares ([`CacheConfig::shared`](super::CacheConfig::shared)) and the
    /// backend is a file: every operation runs there, and the private
    /// state above holds nothing.
    #[cfg(all(target_os = "linux", not(loom)))]
    pub(super) region: Option<crate::shared::SharedFile>,
}

/// Run `$e` on the shared file and return, when the handle has one.
macro_rules! in_region {
    ($self:ident, $s:ident => $e:expr) => {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some($s) = &$self.region {
            return $e;
        }
    };
}

/// The error of a zero-copy call on a file in the shared region.
#[cfg(all(target_os = "linux", not(loom)))]
fn zero_copy_unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "zero-copy references are made of private folios: a file in the shared cache reads and writes by copy",
    )
}

impl Clone for CachedFile {
    fn clone(&self) -> Self {
        CachedFile {
            shared: Arc::clone(&self.shared),
            since: crate::sync::Lock::new(*self.since.lock()),
            #[cfg(all(target_os = "linux", not(loom)))]
            region: self.region.clone(),
        }
    }
}

impl std::fmt::Debug for CachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedFile")
            .field("len", &self.len())
            .field("backend", &self.shared.backend)
            .finish()
    }
}

impl CachedFile {
    /// The file's shared state (for the handle's methods in other modules).
    pub(crate) fn shared(&self) -> &Arc<FileShared> {
        &self.shared
    }

    pub(crate) fn new(shared: Arc<FileShared>) -> Self {
        let since = shared.errseq.sample();
        CachedFile {
            shared,
            since: crate::sync::Lock::new(since),
            #[cfg(all(target_os = "linux", not(loom)))]
            region: None,
        }
    }

    /// A handle whose operations run on `region`'s frames.
    #[cfg(all(target_os = "linux", not(loom)))]
    pub(crate) fn in_region(shared: Arc<FileShared>, region: crate::shared::SharedFile) -> Self {
        let mut f = CachedFile::new(shared);
        f.region = Some(region);
        f
    }

    /// The file in the region shared with other processes, when it is
    /// cached there: for what only the region has (its writer mark and
    /// stamps, [`SharedFile::mark_writer`](crate::shared::SharedFile::mark_writer)).
    #[cfg(all(target_os = "linux", not(loom)))]
    pub fn shared_file(&self) -> Option<&crate::shared::SharedFile> {
        self.region.as_ref()
    }

    /// Whether the file is cached in the region shared with other
    /// processes ([`CacheConfig::shared`](super::CacheConfig::shared)).
    pub fn is_shared(&self) -> bool {
        #[cfg(all(target_os = "linux", not(loom)))]
        return self.region.is_some();
        #[cfg(not(all(target_os = "linux", not(loom))))]
        false
    }

    /// Read up to `buf.len()` bytes at `offset`. Returns fewer at the end
    /// of the file and 0 at or past it (or for an empty `buf`).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when `offset` is past
    /// [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE) or `offset + buf.len()` overflows `u64` (the
    /// kernel's `EINVAL`); the backend's read error for a page not cached
    /// (nothing is cached for it); [`io::ErrorKind::OutOfMemory`] if the
    /// index or a buffer could not grow.
    ///
    /// ```
    /// # use kxarray::backend::RamDisk;
    /// # use kxarray::pagecache::{CacheConfig, PageCache, MAX_FILE_SIZE};
    /// # let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(8192)).unwrap();
    /// let mut buf = [0u8; 16];
    /// assert_eq!(file.read_at(&mut buf, 8190).unwrap(), 2); // the end of the file
    /// assert_eq!(file.read_at(&mut buf, 1 << 20).unwrap(), 0); // past it
    /// let e = file.read_at(&mut buf, MAX_FILE_SIZE + 1).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// ```
    #[inline]
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        in_region!(self, s => {
            let (n, pages, misses) = s.read_counted(buf, offset)?;
            let c = &self.shared.cache.counters;
            c.hits.add(pages - misses);
            if misses != 0 {
                c.misses.add(misses);
                // what waits for a miss (the budget's member, the region's)
                self.shared.cache.demand();
            }
            Ok(n)
        });
        self.shared.read_at(buf, offset)
    }

    /// [`read_at`](CachedFile::read_at) with `flags` (as `preadv2(2)`):
    /// with [`ReadFlags::NOREUSE`], the pages no folio holds are read from
    /// the backend without a frame (128 KiB or more straight into `buf`,
    /// one copy; less through the file's 256 KiB ring) and not kept, unless one
    /// was passed by so recently that the workingset would keep it; cached
    /// pages, dirty or clean, are read from the cache as always, so the
    /// bytes returned are what `read_at` returns (`docs/memory.md`, "Reads
    /// that pass the cache by").
    ///
    /// # Errors
    /// As [`read_at`](CachedFile::read_at).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache, ReadFlags};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.write_at(b"cached", 0).unwrap(); // dirty in the cache
    /// let mut buf = [0u8; 6];
    /// file.read_at_with(&mut buf, 0, ReadFlags::NOREUSE).unwrap();
    /// assert_eq!(&buf, b"cached"); // a cached page is read from the cache
    /// file.read_at_with(&mut buf, 512 << 10, ReadFlags::NOREUSE).unwrap();
    /// assert_eq!(file.cached_pages(), 1); // the miss was not kept
    /// assert_eq!(cache.stats().passthrough_pages, 1);
    /// ```
    #[inline]
    pub fn read_at_with(&self, buf: &mut [u8], offset: u64, flags: ReadFlags) -> io::Result<usize> {
        // (the shared region keeps what it reads: its clock decides)
        if self.is_shared() {
            return self.read_at(buf, offset);
        }
        if flags.contains(ReadFlags::NOREUSE) {
            self.shared.read_at_as::<true>(buf, offset)
        } else {
            self.shared.read_at(buf, offset)
        }
    }

    /// Write all of `buf` at `offset`, extending the file if it ends past
    /// the end. Returns `buf.len()`. The data is dirty in the cache until
    /// written back ([`sync`](CachedFile::sync) or the flusher).
    ///
    /// # Errors
    /// [`io::ErrorKind::PermissionDenied`] with a
    /// [`ReadOnly`](crate::backend::ReadOnly) error when the backend is
    /// read-only ([`FileBackend::open_read_only`](crate::backend::FileBackend::open_read_only);
    /// nothing is written);
    /// [`io::ErrorKind::FileTooLarge`] when `offset + buf.len()` is past
    /// [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE) (the kernel's `EFBIG`; nothing is written); the
    /// backend's error when the file must grow and cannot (a
    /// [`RamDisk`](crate::backend::RamDisk) has a fixed size), in which case
    /// nothing was written; a read error of a partly overwritten page not
    /// cached, or [`io::ErrorKind::OutOfMemory`] (the bytes before that page
    /// were written).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache, MAX_FILE_SIZE};
    /// use std::io::ErrorKind;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(8192)).unwrap();
    /// assert_eq!(file.write_at(b"hi", 8190).unwrap(), 2);
    /// assert_eq!(cache.stats().dirty_bytes, 4096); // dirty in the cache
    /// // Growing a RAM disk is refused, and nothing is written.
    /// let e = file.write_at(b"abc", 8190).unwrap_err();
    /// assert_eq!((e.kind(), file.len()), (ErrorKind::Unsupported, 8192));
    /// let e = file.write_at(b"x", MAX_FILE_SIZE).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::FileTooLarge);
    /// let mut b = [0u8; 2];
    /// file.read_at(&mut b, 8190).unwrap();
    /// assert_eq!(&b, b"hi");
    /// ```
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        in_region!(self, s => s.write_at(buf, offset));
        self.shared.write_at(buf, offset)
    }

    /// The file's length in bytes.
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let backend = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// let file = cache.open(backend).unwrap();
    /// assert_eq!(file.len(), 0);
    /// file.write_at(b"grow", 10).unwrap(); // a write past the end extends the file
    /// assert_eq!(file.len(), 14);
    /// ```
    pub fn len(&self) -> u64 {
        in_region!(self, s => s.len());
        self.shared.len()
    }

    /// Whether the file is empty.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// assert!(cache.open(RamDisk::new(0)).unwrap().is_empty());
    /// assert!(!cache.open(RamDisk::new(1)).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Truncate or extend. Cached pages past the new end and their shadows
    /// are dropped (dirty ones too: their bytes are gone), the cut page's
    /// tail is zeroed, and an extension reads as zeros. Zero-copy references
    /// to dropped pages keep the bytes they pinned.
    ///
    /// # Errors
    /// [`io::ErrorKind::FileTooLarge`] when `len` is past [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE);
    /// a [`ReadOnly`](crate::backend::ReadOnly) error over a read-only backend;
    /// the backend's error (e.g. [`io::ErrorKind::Unsupported`] for a RAM
    /// disk); the file is unchanged then.
    ///
    /// ```
    /// use kxarray::backend::{FileBackend, RamDisk};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let tmp = tempfile::tempfile().unwrap(); // deleted when closed
    /// let file = cache.open(FileBackend::from_file(tmp.try_clone().unwrap())).unwrap();
    /// file.write_at(b"hello world", 0).unwrap();
    /// file.set_len(5).unwrap(); // the cut page's tail is zeroed...
    /// file.set_len(4096).unwrap(); // ...so the extension reads as zeros
    /// let mut b = [1u8; 11];
    /// file.read_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"hello\0\0\0\0\0\0");
    /// assert_eq!(tmp.metadata().unwrap().len(), 4096); // the backend's length too
    ///
    /// let ram = cache.open(RamDisk::new(4096)).unwrap();
    /// let e = ram.set_len(8192).unwrap_err();
    /// assert_eq!((e.kind(), ram.len()), (std::io::ErrorKind::Unsupported, 4096));
    /// ```
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        in_region!(self, s => s.set_len(len));
        self.shared.set_len(len)
    }

    /// Write back every dirty page and flush the backend (`fsync`).
    ///
    /// # Errors
    /// A writeback error recorded since this handle last reported one (by
    /// this call or by the flusher), once; the pages stay dirty and a later
    /// `sync` retries them. Or the backend's flush error.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::sync::Arc;
    ///
    /// let disk = Arc::new(RamDisk::new(1 << 16));
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(Arc::clone(&disk)).unwrap();
    /// file.write_at(b"durable", 0).unwrap();
    /// assert_eq!(disk.pages_allocated(), 0); // only in the cache so far
    /// file.sync().unwrap();
    /// let mut b = [0u8; 7];
    /// disk.read_exact_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"durable");
    /// assert_eq!(cache.stats().dirty_bytes, 0);
    /// ```
    pub fn sync(&self) -> io::Result<()> {
        in_region!(self, s => s.sync());
        self.sync_range(0..u64::MAX)
    }

    /// Write back every dirty page and make the data durable with the
    /// backend's [`flush_data`](Backend::flush_data) (`fdatasync`: no
    /// timestamps), what a database's commit needs.
    ///
    /// # Errors
    /// As [`sync`](CachedFile::sync).
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache
    ///     .open(FileBackend::from_file(tempfile::tempfile().unwrap()))
    ///     .unwrap();
    /// file.write_at(b"commit", 0).unwrap();
    /// file.sync_data().unwrap();
    /// assert_eq!(cache.stats().dirty_bytes, 0);
    /// ```
    pub fn sync_data(&self) -> io::Result<()> {
        in_region!(self, s => s.sync_data());
        let written = self.write_back(0..u64::MAX);
        let flushed = self.shared.backend.flush_data();
        written.and(flushed)
    }

    /// [`sync`](CachedFile::sync) limited to the pages overlapping `range`
    /// (`sync_file_range` + `fsync` of the backend).
    ///
    /// # Errors
    /// As [`sync`](CachedFile::sync).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::sync::Arc;
    ///
    /// let disk = Arc::new(RamDisk::new(1 << 16));
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(Arc::clone(&disk)).unwrap();
    /// file.write_at(&[1; 4096], 0).unwrap();
    /// file.write_at(&[2; 4096], 8192).unwrap();
    /// file.sync_range(0..100).unwrap(); // page 0 only
    /// assert_eq!(disk.pages_allocated(), 1);
    /// assert_eq!(cache.stats().dirty_bytes, 4096); // page 2 is still dirty
    /// ```
    pub fn sync_range(&self, range: Range<u64>) -> io::Result<()> {
        in_region!(self, s => s.sync_range(range));
        let written = self.write_back(range);
        let flushed = self.shared.backend.flush();
        written.and(flushed)
    }

    /// Write back the dirty pages overlapping `range` to the backend and
    /// wait for it, without flushing the backend (`sync_file_range` with
    /// `SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER`): the bytes
    /// reach the backend, a buffered file's kernel page cache for instance,
    /// and survive this process, but not a power failure.
    ///
    /// # Errors
    /// A writeback error recorded since this handle last reported one (by
    /// this call, a [`sync`](CachedFile::sync) or the flusher), once: the
    /// pages that failed stay dirty, and every other handle of the file
    /// reports the error once too.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::sync::Arc;
    ///
    /// let disk = Arc::new(RamDisk::new(1 << 16));
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(Arc::clone(&disk)).unwrap();
    /// file.write_at(b"journal", 4096).unwrap();
    /// file.write_back(4096..4103).unwrap();
    /// let mut b = [0u8; 7];
    /// disk.read_exact_at(&mut b, 4096).unwrap();
    /// assert_eq!(&b, b"journal");
    /// ```
    pub fn write_back(&self, range: Range<u64>) -> io::Result<()> {
        in_region!(self, s => s.write_back(range));
        if range.end > range.start {
            // Its error is in the error sequence, checked just below.
            let _ = writeback::writeback(
                &self.shared,
                range.start / PAGE,
                (range.end - 1) / PAGE,
                Mode::Wait,
            );
        }
        self.shared.errseq.check_and_advance(&mut self.since.lock())
    }

    /// Drop the clean, idle cached folios lying wholly inside `range`
    /// (`invalidate_mapping_pages`); dirty ones and ones under writeback
    /// stay. Returns the pages dropped.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for backends that must be told.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// file.write_at(&[1; 8192], 0).unwrap();
    /// assert_eq!(file.invalidate(0..8192).unwrap(), 0); // dirty pages stay
    /// file.sync().unwrap();
    /// assert_eq!(file.invalidate(0..6000).unwrap(), 1); // only page 0 is wholly inside
    /// assert_eq!(file.cached_pages(), 1);
    /// let mut b = [0u8; 1];
    /// file.read_at(&mut b, 0).unwrap(); // read back from the backend
    /// assert_eq!(b, [1]);
    /// ```
    pub fn invalidate(&self, range: Range<u64>) -> io::Result<u64> {
        in_region!(self, s => Ok(s.invalidate(range)));
        Ok(self.shared.invalidate(range))
    }

    /// The bytes of `range` changed in the backend behind the cache
    /// (another process wrote them): drop every clean page holding any
    /// byte of the range. A large folio that reaches past the range is
    /// split, as the kernel's non-uniform `folio_split` does: its pages
    /// outside the range stay cached, copied into the largest aligned
    /// folios that hold none of the range (8, 4, 2 and 1 pages of a 16-page
    /// folio with one page changed), so a 4 KiB change does not cost its
    /// 64 KiB readahead folio (a folio that cannot be
    /// split, one a write made with blocks not read, is dropped whole). A
    /// folio whose read is in flight is waited for first and then dropped
    /// (its read may have fetched the bytes from before the change), as
    /// the kernel's `invalidate_inode_pages2_range` waits on locked pages;
    /// [`invalidate`](CachedFile::invalidate) passes such a folio over.
    /// Returns the pages dropped. Meant for short ranges (one lookup per
    /// page that holds no folio). Zero-copy references to a split folio
    /// keep their bytes and are no longer current.
    ///
    /// # Errors
    /// [`io::ErrorKind::ResourceBusy`] when a folio of the range is dirty
    /// or under writeback (newer than the backend: it stays; the clean
    /// ones are dropped all the same): write it back first.
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::os::unix::fs::FileExt;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let tmp = tempfile::tempfile().unwrap();
    /// tmp.write_all_at(&[1; 4 * 4096], 0).unwrap();
    /// let file = cache.open(FileBackend::from_file(tmp.try_clone().unwrap())).unwrap();
    /// let mut b = [0u8; 4 * 4096];
    /// file.read_at(&mut b, 0).unwrap(); // cached
    /// tmp.write_all_at(&[2; 10], 4096 + 100).unwrap(); // behind the cache's back
    /// let cached = file.cached_pages();
    /// assert_eq!(file.revalidate_range(4096 + 100..4096 + 110).unwrap(), 1);
    /// assert_eq!(file.cached_pages(), cached - 1); // the other pages stay
    /// file.read_at(&mut b[..10], 4096 + 100).unwrap();
    /// assert_eq!(b[..10], [2; 10]);
    /// ```
    pub fn revalidate_range(&self, range: Range<u64>) -> io::Result<u64> {
        in_region!(self, s => s.revalidate_range(range));
        match self.shared.revalidate_range(range) {
            (dropped, 0) => Ok(dropped),
            (_, busy) => Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{busy} dirty pages are newer than the backend"),
            )),
        }
    }

    /// Forget what the cache knows of the backend because someone else
    /// changed it (another process wrote the file): drop every clean, idle
    /// folio and every shadow of the file, and take the backend's length
    /// again; the next reads come from the backend. The kernel's
    /// `invalidate_inode_pages2` with an attribute revalidation, as a
    /// network file system does when it reopens a file another client
    /// wrote. Zero-copy references keep the bytes they pinned, and
    /// [`is_current`](CachedFile::is_current) is false for them afterwards.
    ///
    /// Meant for a caller that keeps writers of this file out while it runs
    /// (a reader racing it reads the old bytes or the new ones).
    ///
    /// # Errors
    /// The backend's length error; [`io::ErrorKind::ResourceBusy`] when
    /// the file holds dirty or under-writeback pages (they are newer than
    /// the backend and stay cached; the size is left as it was): write
    /// them back first.
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::os::unix::fs::FileExt;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let tmp = tempfile::tempfile().unwrap();
    /// tmp.write_all_at(b"old", 0).unwrap();
    /// let file = cache.open(FileBackend::from_file(tmp.try_clone().unwrap())).unwrap();
    /// let mut b = [0u8; 3];
    /// file.read_at(&mut b, 0).unwrap(); // cached now
    /// tmp.write_all_at(b"new, and longer", 0).unwrap(); // behind the cache's back
    /// file.read_at(&mut b, 0).unwrap();
    /// assert_eq!((&b, file.len()), (b"old", 3)); // the cache still says so
    /// file.revalidate().unwrap();
    /// file.read_at(&mut b, 0).unwrap();
    /// assert_eq!((&b, file.len()), (b"new", 15));
    /// ```
    pub fn revalidate(&self) -> io::Result<()> {
        in_region!(self, s => s.revalidate().map(drop));
        self.shared.revalidate()
    }

    /// Take the backend's length again because someone else grew or cut
    /// the file (another process), keeping the cached pages that lie
    /// wholly before the lower of the old and new ends; the folio holding
    /// that end and every one after it are dropped (their bytes past the
    /// old end were zeros the cache made up, or lie past the new end).
    /// Returns the pages dropped. As [`revalidate`](CachedFile::revalidate)
    /// without forgetting the rest: for a caller that knows the bytes
    /// before the ends did not change.
    ///
    /// # Errors
    /// The backend's length error; [`io::ErrorKind::ResourceBusy`] when a
    /// folio to drop is dirty or under writeback (the size is left as it
    /// was).
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::os::unix::fs::FileExt;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let tmp = tempfile::tempfile().unwrap();
    /// tmp.write_all_at(&[7; 8192], 0).unwrap();
    /// let file = cache.open(FileBackend::from_file(tmp.try_clone().unwrap())).unwrap();
    /// let mut b = [0u8; 8192];
    /// file.read_at(&mut b, 0).unwrap(); // two pages cached
    /// tmp.write_all_at(&[9; 4096], 8192).unwrap(); // grown behind the cache's back
    /// assert_eq!(file.len(), 8192);
    /// file.refresh_len().unwrap();
    /// assert_eq!(file.len(), 12288);
    /// assert_eq!(file.cached_pages(), 2); // the pages before the old end stay
    /// let mut c = [0u8; 1];
    /// file.read_at(&mut c, 8192).unwrap();
    /// assert_eq!(c, [9]);
    /// ```
    pub fn refresh_len(&self) -> io::Result<u64> {
        in_region!(self, s => s.refresh_len());
        self.shared.refresh_len()
    }

    /// A zero-copy reference to the folio holding page `index` (reading it
    /// from the backend on a miss). It pins the folio's bytes: see
    /// [`FolioRef`] for what that keeps and what it never blocks.
    ///
    /// # Errors
    /// [`io::ErrorKind::UnexpectedEof`] when the page starts at or past the
    /// end of the file; the backend's read error on a miss.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(2 * 4096)).unwrap();
    /// file.write_at(b"zero-copy", 4096).unwrap();
    /// let folio = file.read_folio(1).unwrap();
    /// assert_eq!(folio.index(), 1);
    /// assert_eq!(&folio.page(1)[..9], b"zero-copy");
    /// let e = file.read_folio(2).unwrap_err(); // page 2 starts at the end
    /// assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    /// ```
    pub fn read_folio(&self, index: u64) -> io::Result<FolioRef> {
        in_region!(self, _s => Err(zero_copy_unsupported()));
        let s = &self.shared;
        if index.checked_mul(PAGE).is_none_or(|p| p >= s.len()) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("page {index} is past the end of the file"),
            ));
        }
        loop {
            if let Some(r) = s.folio_hit(index) {
                return Ok(r);
            }
            if let Some(r) = s.folio_locked(index)? {
                return Ok(r);
            }
        }
    }

    /// [`read_folio`](CachedFile::read_folio) if the page is cached and
    /// wholly read now, without reading the backend or waiting for a lock:
    /// `None` otherwise (a miss, a fill or a write in progress). Never
    /// blocks.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// assert!(file.try_read_folio(3).is_none()); // not cached
    /// file.write_at(&[5; 4096], 3 * 4096).unwrap();
    /// assert_eq!(file.try_read_folio(3).unwrap().page(3)[0], 5);
    /// ```
    pub fn try_read_folio(&self, index: u64) -> Option<FolioRef> {
        in_region!(self, _s => None);
        let s = &self.shared;
        if index.checked_mul(PAGE).is_none_or(|p| p >= s.len()) {
            return None;
        }
        s.folio_hit(index).or_else(|| s.marker_hit(index))
    }

    /// Whether `page`, a reference [`read_folio`](CachedFile::read_folio)
    /// returned for this file, still holds the file's bytes: no write,
    /// truncation, invalidation or eviction has touched its folio since.
    /// Then it can stand in for a new `read_folio` of its pages, and this
    /// check, unlike taking a reference, writes no memory another thread
    /// reads (a caller that keeps the references of its hot pages spares
    /// itself a shared counter per access). A reference from another file
    /// answers `false` (no two folios share a buffer).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// file.write_at(&[1; 4096], 0).unwrap();
    /// let page = file.read_folio(0).unwrap();
    /// assert!(file.is_current(&page));
    /// file.write_at(&[2; 8], 100).unwrap(); // the folio's bytes move on
    /// assert!(!file.is_current(&page));
    /// assert_eq!(page.page(0)[100], 1); // the reference keeps its bytes
    /// ```
    #[inline]
    pub fn is_current(&self, page: &FolioRef) -> bool {
        self.shared.is_current(page)
    }

    /// Keep `page`, a reference [`read_folio`](CachedFile::read_folio)
    /// returned for this file, with its folio, so that
    /// [`HeldFolio::is_current`] can answer without looking the folio up;
    /// or give it back when it is not current now (or is another file's).
    ///
    /// # Errors
    /// `page` itself, when it does not hold this file's bytes now.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// let page = file.read_folio(1).unwrap();
    /// file.write_at(b"new", 4096).unwrap();
    /// let stale = file.hold(page).unwrap_err(); // written since
    /// assert_eq!(stale.index(), 1);
    /// let held = file.hold(file.read_folio(1).unwrap()).unwrap();
    /// assert_eq!(&held.page(1)[..3], b"new");
    /// ```
    pub fn hold(&self, page: FolioRef) -> Result<HeldFolio, FolioRef> {
        match self.shared.cached(page.index()) {
            Some(f) if page.is_current_in(&f) => Ok(HeldFolio::new(f, page)),
            _ => Err(page),
        }
    }

    /// [`read_folio`](CachedFile::read_folio) borrowing under an epoch
    /// guard the caller pinned: the cheapest zero-copy read, with no
    /// reference count on the folio and no epoch pin per call, for engines
    /// that parse many pages in place (pin once per batch with
    /// [`crate::pin`]).
    ///
    /// The borrow pins the folio's bytes as a [`FolioRef`] does: writers do
    /// not wait for it (they write a copy), reclaim passes the folio over.
    /// It lives as long as the guard, and while the guard lives nothing
    /// unlinked meanwhile is freed, so keep both short.
    ///
    /// # Errors
    /// As [`read_folio`](CachedFile::read_folio):
    /// [`io::ErrorKind::UnexpectedEof`] past the end of the file, or the
    /// backend's read error on a miss.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// file.write_at(b"in place", 4096).unwrap();
    /// let guard = kxarray::pin();
    /// let page = file.read_folio_in(1, &guard).unwrap();
    /// assert_eq!(&page.page(1)[..8], b"in place");
    /// ```
    #[inline]
    pub fn read_folio_in<'g>(
        &'g self,
        index: u64,
        guard: &'g Guard,
    ) -> io::Result<FolioBorrow<'g>> {
        in_region!(self, _s => Err(zero_copy_unsupported()));
        match self.shared.folio_hit_in(index, guard) {
            Some(b) => Ok(b),
            None => self.read_folio_in_miss(index, guard),
        }
    }

    /// The miss path of `read_folio_in`, kept out of line so the hit stays
    /// small.
    #[cold]
    #[inline(never)]
    fn read_folio_in_miss<'g>(
        &'g self,
        index: u64,
        guard: &'g Guard,
    ) -> io::Result<FolioBorrow<'g>> {
        loop {
            // `read_folio` reads the folio in (and fills any blocks a write
            // left unread, checking the end of the file) and pins it; then
            // borrow it from the tree under the caller's guard (the
            // reference it returns cannot lend for `'g`). Evicted or partly
            // invalidated in between: again. (The fill counted a miss; the
            // borrow counts a hit as well.)
            let held = self.read_folio(index)?;
            if let Some(b) = self.shared.folio_hit_in(index, guard) {
                return Ok(b);
            }
            drop(held);
        }
    }

    /// Begin a write of up to `len` bytes at `pos` into the cached folio
    /// holding `pos` (the kernel's `write_begin`): the returned guard
    /// dereferences to the current bytes of `pos..pos + n`, where `n` is
    /// `len` clipped at the end of that folio (the guard's `len()`); edit
    /// them in place, and when the guard is dropped (or
    /// [`commit`](FolioWrite::commit)ted) they become visible to readers
    /// all at once and only the blocks they touch are marked dirty
    /// (`write_end`). The file grows to `pos + n` if it is shorter.
    ///
    /// While the guard lives it holds the folio's lock: other writers to
    /// this folio wait, readers do not (they see the bytes as they were),
    /// and the thread holding it must not write, truncate or zero-copy read
    /// the same folio (that would wait for itself).
    ///
    /// # Errors
    /// [`io::ErrorKind::FileTooLarge`] past [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE); the
    /// backend's errors growing the file or reading the blocks the range
    /// covers in part; [`io::ErrorKind::OutOfMemory`].
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().block_size(512);
    /// let file = cache.open_with(RamDisk::new(1 << 16), opts).unwrap();
    /// {
    ///     let mut w = file.write_begin(4096 + 100, 8).unwrap();
    ///     w.copy_from_slice(b"in place");
    /// } // write_end: one 512-byte block dirty
    /// assert_eq!(cache.stats().dirty_bytes, 512);
    /// let mut b = [0u8; 8];
    /// file.read_at(&mut b, 4096 + 100).unwrap();
    /// assert_eq!(&b, b"in place");
    /// ```
    pub fn write_begin(&self, pos: u64, len: usize) -> io::Result<FolioWrite<'_>> {
        in_region!(self, _s => Err(zero_copy_unsupported()));
        self.shared.writable()?;
        let end = check_size("write", pos, len as u64)?;
        let s = &self.shared;
        loop {
            let f = s.get_folio(pos / PAGE, Fill::Write)?;
            if let Some(w) = FolioWrite::begin(s, f, pos, end, true)? {
                return Ok(w);
            }
        }
    }

    /// [`write_begin`](CachedFile::write_begin) without waiting: only when
    /// the folio holding `pos` is cached, no one holds its lock, the file
    /// need not grow and no block must be read from the backend first;
    /// otherwise [`io::ErrorKind::WouldBlock`].
    ///
    /// # Errors
    /// [`io::ErrorKind::WouldBlock`] as above; [`io::ErrorKind::FileTooLarge`]
    /// past [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE); [`io::ErrorKind::OutOfMemory`].
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::io::ErrorKind;
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// let e = file.try_write_begin(0, 4).unwrap_err(); // not cached
    /// assert_eq!(e.kind(), ErrorKind::WouldBlock);
    /// file.write_at(&[0; 4096], 0).unwrap();
    /// let mut w = file.try_write_begin(0, 4).unwrap();
    /// w.copy_from_slice(b"fast");
    /// let e = file.try_write_begin(8, 4).unwrap_err(); // `w` holds the folio's lock
    /// assert_eq!(e.kind(), ErrorKind::WouldBlock);
    /// w.commit().unwrap();
    /// let mut b = [0u8; 4];
    /// file.read_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"fast");
    /// ```
    pub fn try_write_begin(&self, pos: u64, len: usize) -> io::Result<FolioWrite<'_>> {
        in_region!(self, _s => Err(zero_copy_unsupported()));
        self.shared.writable()?;
        let end = check_size("write", pos, len as u64)?;
        let s = &self.shared;
        let would_block = || io::Error::from(io::ErrorKind::WouldBlock);
        if end > s.len() {
            return Err(would_block());
        }
        let f = s.mapping.lookup(pos / PAGE).ok_or_else(would_block)?;
        FolioWrite::begin(s, f, pos, end, false)?.ok_or_else(would_block)
    }

    /// Pages of this file in the cache now.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let a = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// let b = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// a.write_at(&[1; 3 * 4096], 0).unwrap();
    /// b.write_at(&[1; 4096], 0).unwrap();
    /// assert_eq!((a.cached_pages(), b.cached_pages()), (3, 1));
    /// assert_eq!(cache.stats().cached_pages, 4); // the whole cache
    /// ```
    pub fn cached_pages(&self) -> u64 {
        in_region!(self, s => s.cached_pages());
        self.shared.mapping.nr_pages()
    }
}

/// A cached file is itself a [`Backend`], so whatever serves or stacks
/// backends (the NBD server, another cache) can run through the page cache:
/// reads and writes go through the cache, `flush` is [`CachedFile::sync`]
/// (every dirty page written back, then the backend flushed).
impl Backend for CachedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        CachedFile::read_at(self, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        CachedFile::write_at(self, buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.sync()
    }

    fn flush_data(&self) -> io::Result<()> {
        self.sync_data()
    }

    /// A write past the end grows a cached file.
    fn extends_on_write(&self) -> bool {
        true
    }

    fn len(&self) -> io::Result<u64> {
        Ok(CachedFile::len(self))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        CachedFile::set_len(self, len)
    }

    /// A cache over a read-only backend is read-only.
    fn is_read_only(&self) -> bool {
        self.shared.read_only
    }
}
