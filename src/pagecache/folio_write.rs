//! [`FolioWrite`], the guard of a write in place (the kernel's
//! `write_begin`/`write_end` pair): the range's current bytes to edit, made
//! visible all at once when the guard ends, with only the blocks whose
//! bytes changed marked dirty.
//!
//! Owns the staging of one write: the guard holds the folio's lock for its
//! whole life (other writers to the folio wait; lock-free readers and
//! zero-copy references do not, and see the bytes as they were), keeps a
//! copy of the range to edit, and on commit writes it back through the
//! folio's edit protocol (in place, or into a copy when the bytes are
//! pinned), so no reader ever sees a half-edited range.
//!
//! Invariants: every block the range touches is uptodate before the copy is
//! taken (read from the backend if needed), so the copy shows the file's
//! real bytes; the file is at least as long as the range before the lock is
//! taken (growing it takes the size lock, which truncation takes before
//! folio locks).

use super::folio::is_live;
use super::inode::{oom, FileShared};
use crate::filemap::{Folio, MemWrite, PAGE_SIZE};
use std::io;
use std::sync::Arc;

/// A write in place into one cached folio
/// ([`CachedFile::write_begin`](super::CachedFile::write_begin)): derefs to
/// the bytes of its range, as they are in the file, to edit. Dropping it
/// (or [`commit`](FolioWrite::commit)) makes the edit visible and marks the
/// blocks whose bytes changed dirty; [`abort`](FolioWrite::abort) drops the
/// edit.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// file.write_at(b"count=0", 0).unwrap();
/// let mut w = file.write_begin(6, 1).unwrap();
/// assert_eq!(&w[..], b"0"); // the file's bytes
/// w[0] += 1;
/// let mut b = [0u8; 7];
/// file.read_at(&mut b, 0).unwrap(); // a reader does not wait...
/// assert_eq!(&b, b"count=0"); // ...and sees the bytes as they were
/// drop(w); // commit
/// file.read_at(&mut b, 0).unwrap();
/// assert_eq!(&b, b"count=1");
/// ```
pub struct FolioWrite<'f> {
    // Field order: the lock borrows from `folio` and is dropped first.
    lock: Option<MemWrite<'static>>,
    folio: Arc<Folio>,
    file: &'f FileShared,
    /// Byte offset of the range inside the folio.
    at: usize,
    /// The range's bytes, edited by the caller.
    staging: Vec<u8>,
    /// The file offset of the range.
    pos: u64,
}

impl<'f> FolioWrite<'f> {
    /// Begin a write of `pos..end` (clipped at the end of `folio`) into
    /// `folio`: grow the file, lock the folio (waiting if `wait`), fill the
    /// blocks the range touches, copy the range. `Ok(None)`: the folio left
    /// the cache meanwhile (look it up again). Without `wait`, anything
    /// that would wait is [`io::ErrorKind::WouldBlock`].
    pub(crate) fn begin(
        file: &'f Arc<FileShared>,
        folio: Arc<Folio>,
        pos: u64,
        end: u64,
        wait: bool,
    ) -> io::Result<Option<FolioWrite<'f>>> {
        let page = PAGE_SIZE as u64;
        let end = end.min((folio.index() + folio.nr_pages()) * page);
        // As `write_at`: refused while a failing backend holds too much
        // of the cache unwritten (without `wait`, with no writeback first).
        file.cache.check_unwritable(file, wait)?;
        if wait {
            file.extend_to(end)?;
        } else if end > file.len() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // SAFETY: the folio lives in the `Arc`'s heap allocation, which does
        // not move and stays alive while `folio` (stored beside the lock in
        // the returned guard) holds a reference; the lock field is declared
        // first, so it is dropped (unlocked) before that reference.
        let f: &'static Folio = unsafe { &*Arc::as_ptr(&folio) };
        let mut w = if wait {
            f.mem().lock()
        } else {
            f.mem()
                .try_lock()
                .ok_or(io::Error::from(io::ErrorKind::WouldBlock))?
        };
        if !is_live(&folio) {
            return Ok(None);
        }
        let at = (pos - folio.index() * page) as usize;
        let n = (end - pos) as usize;
        let need = file.dirty_span(&w, at, at + n);
        if !file.blocks.is_uptodate(&folio, need.0, need.1) {
            if !wait {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            file.fill_blocks(&folio, &mut w, need.0, need.1)?;
        }
        let staging = w.bytes()[at..at + n].to_vec();
        Ok(Some(FolioWrite {
            lock: Some(w),
            folio,
            file,
            at,
            staging,
            pos,
        }))
    }

    /// The file offset the range starts at.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// let w = file.write_begin(4096 + 10, 100).unwrap();
    /// assert_eq!((w.pos(), w.len()), (4106, 100));
    /// drop(w);
    /// let w = file.write_begin(4094, 100).unwrap(); // clipped at the folio's end
    /// assert_eq!((w.pos(), w.len()), (4094, 2));
    /// ```
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Make the edit visible and mark the blocks whose bytes changed dirty
    /// (`write_end`); dirty throttling may then pause the caller, as after
    /// [`write_at`](super::CachedFile::write_at).
    ///
    /// # Errors
    /// [`io::ErrorKind::OutOfMemory`] when the folio's bytes are pinned and
    /// no copy could be allocated: nothing changed then.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, FileOptions, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let opts = FileOptions::default().block_size(512);
    /// let file = cache.open_with(RamDisk::new(1 << 16), opts).unwrap();
    /// let mut w = file.write_begin(0, 2048).unwrap();
    /// w[..4].copy_from_slice(&[0; 4]); // the bytes it had: no change
    /// w.commit().unwrap();
    /// assert_eq!(cache.stats().dirty_bytes, 0);
    /// let mut w = file.write_begin(0, 2048).unwrap();
    /// w[1000] = 1; // one byte, in the second 512-byte block
    /// w.commit().unwrap();
    /// assert_eq!(cache.stats().dirty_bytes, 512); // only that block is dirty
    /// ```
    pub fn commit(mut self) -> io::Result<()> {
        self.finish(true)
    }

    /// Drop the edit: the folio keeps its bytes.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    /// let mut w = file.write_begin(0, 4).unwrap();
    /// w.copy_from_slice(b"oops");
    /// w.abort();
    /// let mut b = [1u8; 4];
    /// file.read_at(&mut b, 0).unwrap();
    /// assert_eq!(b, [0; 4]);
    /// assert_eq!(cache.stats().dirty_bytes, 0);
    /// ```
    pub fn abort(mut self) {
        let _ = self.finish(false);
    }

    fn finish(&mut self, keep: bool) -> io::Result<()> {
        let Some(mut w) = self.lock.take() else {
            return Ok(());
        };
        if !keep {
            return Ok(());
        }
        let file = self.file;
        let bs = file.blocks.block_size();
        let cur = &w.bytes()[self.at..self.at + self.staging.len()];
        // The blocks whose bytes changed, as one span (a whole-folio file
        // dirties the whole folio).
        let first = self.staging.iter().zip(cur).position(|(a, b)| a != b);
        let Some(first) = first else {
            return Ok(()); // nothing changed
        };
        let last = self
            .staging
            .iter()
            .zip(cur)
            .rposition(|(a, b)| a != b)
            .unwrap_or(first);
        {
            let mut e = w.edit().map_err(oom)?;
            e.write(self.at + first, &self.staging[first..=last]);
        }
        let (from, to) = (self.at + first, self.at + last + 1);
        let from = from / bs * bs;
        let to = to.div_ceil(bs) * bs;
        let need = file.dirty_span(&w, from, to);
        let d = file.blocks.mark_dirty(&self.folio, need.0, need.1);
        let newly = d.bytes;
        file.mark_dirty(&self.folio, d);
        drop(w);
        file.cache.balance_dirty_pages(newly);
        Ok(())
    }
}

impl std::ops::Deref for FolioWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.staging
    }
}

impl std::ops::DerefMut for FolioWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.staging
    }
}

impl Drop for FolioWrite<'_> {
    /// Commit; if the bytes are pinned and no copy can be allocated, the
    /// process aborts as on any failed allocation (call
    /// [`commit`](FolioWrite::commit) to get the error instead).
    fn drop(&mut self) {
        if let Err(e) = self.finish(true) {
            let _ = e;
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; PAGE_SIZE]>());
        }
    }
}

impl std::fmt::Debug for FolioWrite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolioWrite")
            .field("pos", &self.pos)
            .field("len", &self.staging.len())
            .finish()
    }
}
