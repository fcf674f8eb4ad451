//! Write-through from the caller's buffer
//! ([`CachedFile::write_through`]): the bytes go to the backend straight
//! from the caller (one copy, the kernel's), and the folios the cache
//! already holds for the range take them too, so a later read through the
//! cache sees them; the range's missing folios are not created (a later
//! read fills them from the backend, which has the bytes).
//!
//! What a write-ahead log needs: SQLite's WAL frames must be in the file
//! when `xWrite` returns, and before this path each frame was copied three
//! times (into the cache, into a writeback run, and by the kernel).
//!
//! Invariants:
//! - the write runs under the file's writeback lock, so no writeback pass
//!   runs meanwhile: a pass that copied older bytes of the range finished
//!   its writes before this one starts, and a later pass copies folios
//!   that already hold these bytes (or a later writer's);
//! - only a write inside the file's size goes this way; one that extends
//!   the file goes through the cache (`write_at`, then `write_back` of the
//!   range), because a reader filling the page at the old end reads the
//!   size before it inserts the folio, and a folio inserted after this
//!   write looked for it would hold zeros where the new bytes are (a
//!   write inside the size has no such window: a fill inserts its folio
//!   before it reads the backend, so it is either found here and updated,
//!   or reads the backend after this write);
//! - the backend is written first, then every cached folio of the range
//!   takes the bytes under its lock (so a folio filled from the backend
//!   meanwhile ends with the new bytes); dirty folios stay dirty (their
//!   bytes, these ones included, are written again by the next pass);
//! - on a backend error the bytes go into the cache as a buffered write
//!   does (dirty: the next writeback retries them), and the error is
//!   recorded in the file's error sequence and reported once to this
//!   handle, as `write_at` followed by `write_back` did.

use super::file::CachedFile;
use super::folio::is_live;
use super::inode::{oom, FileShared};
use super::paths::check_size;
use super::stats::bump;
use crate::filemap::{FolioFlags, PAGE_SIZE};
use std::io;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

impl CachedFile {
    /// Write `buf` at `offset` to the backend from `buf` itself, and into
    /// the folios the cache holds for the range, then return: when it
    /// returns `Ok`, the bytes are in the backend (not yet flushed, as
    /// after [`write_back`](CachedFile::write_back)) and every read through
    /// the cache sees them. Folios the cache does not hold are not
    /// created. What [`write_at`](CachedFile::write_at) followed by
    /// `write_back` of the range does, with one copy of the bytes instead
    /// of three, for data written once and seldom read again (a log that
    /// is rewritten from its start, as a SQLite WAL after a checkpoint). A
    /// write that extends the file is exactly `write_at` + `write_back`
    /// (see the module notes for why).
    ///
    /// The cached copy stays coherent with one writer of the file at a
    /// time (SQLite's locks give its VFS that). With concurrent writers, a
    /// `write_through` into the gap an extending `write_at` left while a
    /// reader fills that gap's page may leave the cache holding the zeros
    /// the fill read: serialize writers of one file, or use `write_at`.
    ///
    /// # Errors
    /// [`io::ErrorKind::FileTooLarge`] past
    /// [`MAX_FILE_SIZE`](super::MAX_FILE_SIZE) (nothing written); the
    /// backend's error, recorded in the file's error sequence and reported
    /// once to this handle: the bytes are then in the cache, dirty, and a
    /// later [`sync`](CachedFile::sync) retries them.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let tmp = tempfile::tempfile().unwrap();
    /// let disk = FileBackend::from_file(tmp.try_clone().unwrap());
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let log = cache.open(disk).unwrap();
    /// log.write_at(b"old frame", 0).unwrap(); // cached (dirty)
    /// log.write_through(b"new", 0).unwrap(); // the backend and the cached folio
    /// log.write_through(b"appended", 4096).unwrap(); // extends: through the cache
    /// let mut b = [0u8; 9];
    /// log.read_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"new frame");
    /// log.read_at(&mut b[..8], 4096).unwrap();
    /// assert_eq!(&b[..8], b"appended");
    /// assert_eq!(log.len(), 4104);
    /// assert_eq!(cache.stats().dirty_bytes, 4096); // page 0's "old frame", cached dirty
    /// let raw = FileBackend::from_file(tmp);
    /// raw.read_exact_at(&mut b[..3], 0).unwrap();
    /// assert_eq!(&b[..3], b"new");
    /// ```
    pub fn write_through(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(s) = &self.region {
            // into the frames, then their writeback
            let n = s.write_at(buf, offset)?;
            s.write_back(offset..offset + n as u64)?;
            return Ok(n);
        }
        match self.shared.write_through(buf, offset) {
            Ok(Some(n)) => Ok(n),
            Ok(None) => {
                // It extends the file: through the cache (see the module
                // notes).
                let n = self.write_at(buf, offset)?;
                self.write_back(offset..offset + n as u64)?;
                Ok(n)
            }
            Err(Failed::Refused(e)) => Err(e),
            Err(Failed::Backend(e)) => {
                // As a buffered write whose writeback failed: the bytes in
                // the cache, dirty; the error in the sequence, reported
                // once here.
                self.shared.errseq.set(&e);
                self.write_at(buf, offset)?;
                self.shared
                    .errseq
                    .check_and_advance(&mut self.since.lock())?;
                Err(e)
            }
        }
    }
}

/// Why a write-through did not happen.
enum Failed {
    /// Refused before anything was written.
    Refused(io::Error),
    /// The backend's write failed (perhaps in part).
    Backend(io::Error),
}

impl FileShared {
    /// `Ok(None)`: the write would extend the file (nothing done).
    fn write_through(self: &Arc<Self>, buf: &[u8], offset: u64) -> Result<Option<usize>, Failed> {
        self.writable().map_err(Failed::Refused)?;
        let end = check_size("write", offset, buf.len() as u64).map_err(Failed::Refused)?;
        if buf.is_empty() {
            return Ok(Some(0));
        }
        let _wb = self.wb_lock.lock();
        // The size only shrinks under the writeback lock, held here.
        if end > self.len() {
            return Ok(None);
        }
        {
            let _write = self.backend_writes.begin();
            self.backend
                .write_all_at(buf, offset)
                .map_err(Failed::Backend)?;
        }
        bump(&self.cache.counters.backend_written_bytes, buf.len() as u64);
        let mut index = offset / PAGE;
        let last = (end - 1) / PAGE;
        while index <= last {
            let Some(f) = self.cached(index) else {
                index += 1;
                continue;
            };
            let next = f.index() + f.nr_pages();
            let mut w = f.mem().lock();
            if is_live(&f) {
                let base = f.index() * PAGE;
                let from = offset.max(base);
                let to = end.min(base + w.len() as u64);
                let src = &buf[(from - offset) as usize..(to - offset) as usize];
                // Blocks that are not uptodate take the bytes too: they
                // are read from the backend (which has them) before use.
                let edited = match w.edit() {
                    Ok(mut e) => {
                        e.write((from - base) as usize, src);
                        Ok(())
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = edited {
                    // No frame for a copy of pinned bytes: a clean folio
                    // leaves the cache (a later read fills it from the
                    // backend, which has the bytes).
                    if f.test(FolioFlags::DIRTY) || f.test(FolioFlags::WRITEBACK) {
                        return Err(Failed::Refused(oom(e)));
                    }
                    self.detach(&f, &mut w, None);
                }
            }
            drop(w);
            index = next.max(index + 1);
        }
        Ok(Some(buf.len()))
    }
}
