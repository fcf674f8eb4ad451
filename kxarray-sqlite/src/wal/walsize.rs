//! A WAL's two lengths: the one SQLite sees ([`WalSize::len`], the end of
//! what it wrote) and the file's own, grown ahead of SQLite's appends in
//! steps of [`STEP`], always a whole number of pages, zeros past `len`.
//!
//! Why: an append past the end of a cached file cannot be written through
//! from SQLite's buffer (`CachedFile::write_through` sends a write that
//! extends the file through the cache: a fresh folio zeroed, the bytes
//! copied into it, into a writeback run and by the kernel). A fresh WAL
//! grows with every frame, so every frame of a bulk load took that path.
//! With the file grown ahead, each frame lands inside it and is written
//! through with one copy, the kernel's, as the unix VFS writes it.
//!
//! Owns [`WalSize`] (one per WAL inode, shared by its handles: SQLite's WAL
//! write lock gives it one writer at a time).
//!
//! Invariants:
//! - the cached file's length (the backing file's) is a multiple of the
//!   page size and at least `len`: made so when the inode is made (before
//!   any handle can read it), then changed only to page multiples;
//! - so no new bytes ever land in a page that straddled the file's end: a
//!   read filling a page under an older length filled only pages wholly
//!   inside it, and `write_through` (inside the length) keeps those and
//!   the backend coherent;
//! - what SQLite reads and is told of stops at `len` (reads past it are
//!   short, as a file's are); the bytes between `len` and the file's end
//!   are zeros (grown with `set_len`; a truncation is exact, then padded).
//!   After a crash the file keeps them: SQLite's WAL recovery, on any VFS,
//!   stops at the first frame whose salt does not match the header's
//!   (zeros never do), as it stops over the stale frames a restarted WAL
//!   leaves behind.

use kxarray::pagecache::CachedFile;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The page size of the cache's folios.
const PAGE: u64 = kxarray::filemap::PAGE_SIZE as u64;

/// How far the file grows at a time (64 frames of 4 KiB pages): one
/// `ftruncate` per step instead of an extending write per frame.
pub(crate) const STEP: u64 = 256 << 10;

/// A WAL's length as SQLite sees it (see the module notes).
#[derive(Debug)]
pub(crate) struct WalSize {
    len: AtomicU64,
}

impl WalSize {
    /// Take `file`, a WAL no handle has open yet: its length is SQLite's,
    /// and the file is padded with zeros to a whole page.
    ///
    /// # Errors
    /// The `ftruncate` that pads it.
    pub(crate) fn new(file: &CachedFile) -> io::Result<WalSize> {
        let len = file.len();
        let padded = len.next_multiple_of(PAGE);
        if padded != len {
            file.set_len(padded)?;
        }
        Ok(WalSize {
            len: AtomicU64::new(len),
        })
    }

    /// The length SQLite sees.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// How many of `n` bytes at `off` lie before the end SQLite sees.
    #[inline]
    pub(crate) fn readable(&self, off: u64, n: usize) -> usize {
        self.len().saturating_sub(off).min(n as u64) as usize
    }

    /// Write `data` at `off` through to the file (`CachedFile::write_through`,
    /// one copy), growing the file first by whole steps when the write
    /// reaches past it; the length SQLite sees grows to the write's end.
    ///
    /// # Errors
    /// The `ftruncate` that grows the file (nothing written), or
    /// `write_through`'s error.
    pub(crate) fn write(&self, file: &CachedFile, data: &[u8], off: u64) -> io::Result<()> {
        let end = off.checked_add(data.len() as u64).ok_or_else(|| {
            io::Error::new(io::ErrorKind::FileTooLarge, "write past the largest offset")
        })?;
        if end > file.len() {
            file.set_len(end.next_multiple_of(STEP))?;
        }
        file.write_through(data, off)?;
        self.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    /// Truncate to `size` (SQLite's `xTruncate`): the file to exactly
    /// `size`, then padded with zeros to a whole page.
    ///
    /// # Errors
    /// The `ftruncate`'s error.
    pub(crate) fn truncate(&self, file: &CachedFile, size: u64) -> io::Result<()> {
        file.set_len(size)?;
        self.len.store(size, Ordering::Release);
        let padded = size.next_multiple_of(PAGE);
        if padded != size {
            file.set_len(padded)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxarray::backend::{Backend, FileBackend};
    use kxarray::pagecache::{CacheConfig, PageCache};

    fn open() -> (CachedFile, std::fs::File, PageCache) {
        let tmp = tempfile::tempfile().unwrap();
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let file = cache
            .open(FileBackend::from_file(tmp.try_clone().unwrap()))
            .unwrap();
        (file, tmp, cache)
    }

    #[test]
    fn appends_are_written_through_inside_a_file_grown_in_steps() {
        let (file, tmp, cache) = open();
        let w = WalSize::new(&file).unwrap();
        assert_eq!((w.len(), file.len()), (0, 0));
        // A WAL header, then frames of 24 + 4096 bytes.
        w.write(&file, &[7; 32], 0).unwrap();
        assert_eq!((w.len(), file.len()), (32, STEP));
        let mut off = 32;
        for i in 0..100u8 {
            w.write(&file, &[i; 24], off).unwrap();
            w.write(&file, &[i; 4096], off + 24).unwrap();
            off += 4120;
        }
        assert_eq!(w.len(), off);
        assert_eq!(file.len(), off.next_multiple_of(STEP));
        // Written through: in the file, nothing cached, nothing dirty (an
        // extending write would have gone through the cache).
        assert_eq!(cache.stats().dirty_bytes, 0);
        assert_eq!(file.cached_pages(), 0);
        let raw = FileBackend::from_file(tmp);
        let mut b = [0u8; 4120];
        raw.read_exact_at(&mut b, 32 + 99 * 4120).unwrap();
        assert!(b.iter().all(|&x| x == 99));
        // Past SQLite's end: zeros, and reads stop at its end.
        raw.read_exact_at(&mut b[..8], off).unwrap();
        assert_eq!(&b[..8], &[0; 8]);
        assert_eq!(w.readable(off - 10, 100), 10);
        assert_eq!(w.readable(off + 1, 100), 0);
    }

    #[test]
    fn a_file_is_padded_to_a_page_and_a_truncation_is_exact_then_padded() {
        let (file, tmp, _cache) = open();
        file.write_at(&[5; 5000], 0).unwrap();
        file.sync().unwrap();
        let w = WalSize::new(&file).unwrap();
        assert_eq!((w.len(), file.len()), (5000, 8192));
        let raw = FileBackend::from_file(tmp);
        let mut b = [1u8; 3996];
        raw.read_exact_at(&mut b[..3192], 5000).unwrap();
        assert!(b[..3192].iter().all(|&x| x == 0), "padded with zeros");
        w.truncate(&file, 100).unwrap();
        assert_eq!((w.len(), file.len()), (100, 4096));
        b.fill(1);
        raw.read_exact_at(&mut b, 100).unwrap();
        assert!(b.iter().all(|&x| x == 0), "the cut bytes are zeros");
        w.truncate(&file, 0).unwrap();
        assert_eq!((w.len(), file.len()), (0, 0));
    }
}
