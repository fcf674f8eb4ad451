//! One cached file: [`CachedFile`], the handle, and `FileShared`, the state
//! its clones share (address space, backend, size, writeback lock, error
//! sequence, readahead state, per-block state).
//!
//! Owns the per-file read, write, truncate and invalidate paths and the
//! miss path that fills a folio from the backend.
//!
//! Invariants:
//! - a folio is filled while its data lock is held for writing, from
//!   before it is published with `add_folio` until `UPTODATE` is set, so a
//!   reader that finds it waits on the lock (`folio_wait_locked`); a failed
//!   fill removes the folio again (restoring the shadow) and caches nothing;
//!   a write miss publishes a folio whose blocks are all not uptodate
//!   (`UPTODATE` then means "published", the blocks say what holds data);
//! - bytes are copied out only from uptodate blocks: readers check the
//!   blocks they read ([`BlockMap::is_uptodate`]) and fill the missing ones
//!   under the data lock held for writing first, `read_folio` fills the
//!   whole folio, and a write reads the blocks it overwrites in part (all
//!   it does not overwrite, in whole-folio mode) before marking them
//!   uptodate and dirty;
//! - every path that removes a folio from the address space holds its data
//!   lock for writing and sets `DETACHED` first, and every reader or writer
//!   re-checks `DETACHED` and `UPTODATE` after taking the lock and looks
//!   the index up again if either says so, so no write lands in a folio
//!   that is no longer cached;
//! - bytes of cached folios at or past the file's size are zero (the miss
//!   path zero-fills, truncation zeroes the cut folio's tail), so extending
//!   the file exposes zeros;
//! - `set_len` and writeback of one file are serialized by its writeback
//!   lock, so writeback never writes past a size that truncation removed.

use super::blocks::BlockMap;
use super::borrow::FolioBorrow;
use super::errseq::ErrSeq;
use super::folio::{self, FolioRef};
use super::options::{FileOptions, OpenError};
use super::readahead::Readahead;
use super::stats::{bump, drop_gauge};
use super::writeback::{self, Mode};
use super::CacheInner;
use crate::backend::{checked_end, Backend};
use crate::filemap::{AddError, AddressSpace, Folio, FolioFlags, Shadow, PAGE_SIZE};
use crate::pin;
use crate::sync::{AtomicU64, Lock, Ordering};
use crate::{EntryRef, Guard};
use std::io;
use std::ops::Range;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

/// The state shared by every handle of one file.
pub(crate) struct FileShared {
    pub(crate) id: u64,
    pub(crate) cache: Arc<CacheInner>,
    pub(crate) mapping: AddressSpace,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) size: AtomicU64,
    size_lock: Lock<()>,
    pub(crate) wb_lock: Lock<()>,
    pub(crate) errseq: ErrSeq,
    /// When the file first became dirty since its last writeback
    /// ([`CacheInner::now_ms`]), 0 when clean.
    pub(crate) dirtied_at: AtomicU64,
    ra: Readahead,
    /// Per-block uptodate and dirty state.
    pub(crate) blocks: BlockMap,
    /// Dirty and read-modify-write whole folios (the baseline mode).
    pub(crate) whole_folio: bool,
    /// Order of the folios a write allocates on a miss.
    write_order: u32,
}

/// How a miss fills a new folio: wholly from the backend (readahead may
/// make it large), or not at all (a write: a folio of the file's write
/// folio size whose blocks are all not uptodate; the write then reads only
/// the blocks it overwrites in part, and readers fill the others).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    Read,
    Write,
}

fn io_add_error(e: AddError) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, e)
}

impl FileShared {
    pub(crate) fn new(
        id: u64,
        cache: Arc<CacheInner>,
        backend: Box<dyn Backend>,
        len: u64,
        opts: FileOptions,
    ) -> Result<Self, OpenError> {
        let (shift, write_order) = opts.validate()?;
        Ok(FileShared {
            id,
            cache,
            mapping: AddressSpace::new(),
            backend,
            size: AtomicU64::new(len),
            size_lock: Lock::new(()),
            wb_lock: Lock::new(()),
            errseq: ErrSeq::new(),
            dirtied_at: AtomicU64::new(0),
            ra: Readahead::new(),
            blocks: BlockMap::new(shift),
            whole_folio: opts.whole_folio,
            write_order,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// The folio covering `index`, from the cache or (a miss) filled from
    /// the backend or, for [`Fill::Write`], empty. The caller must lock it,
    /// re-check `DETACHED`/`UPTODATE`, and check the blocks it uses are
    /// uptodate ([`BlockMap::is_uptodate`]).
    fn get_folio(self: &Arc<Self>, index: u64, fill: Fill) -> io::Result<Arc<Folio>> {
        let mut allow_large = true;
        loop {
            if let Some(f) = self.mapping.lookup(index) {
                self.cache.counters.hits.add(1);
                folio::mark_accessed(&f);
                return Ok(f);
            }
            let size = self.len();
            let order = match fill {
                _ if !allow_large => 0,
                Fill::Read => self
                    .ra
                    .on_miss(index, self.cache.max_order, size.div_ceil(PAGE)),
                Fill::Write => self.write_order,
            };
            let base = index & !((1u64 << order) - 1);
            let folio = Arc::new(Folio::new(base, order).map_err(io_add_error)?);
            let mut data = folio.data().write();
            let shadow = match self.mapping.add_folio(&folio) {
                Ok(s) => s,
                Err(AddError::Exists) => {
                    // Lost the race (or a neighbour is in the way of a large
                    // folio): use what is there.
                    allow_large = false;
                    continue;
                }
                Err(e) => return Err(io_add_error(e)),
            };
            let nr = folio.nr_pages();
            bump(&self.cache.nr_cached, nr);
            self.cache.counters.misses.add(1);
            if order > 0 {
                bump(&self.cache.counters.readahead_pages, nr - 1);
            }
            let mut buf = vec![0u8; nr as usize * PAGE_SIZE];
            match fill {
                Fill::Read => {
                    if let Err(e) = self.read_backend(&mut buf, base * PAGE, size) {
                        folio.set(FolioFlags::DETACHED);
                        self.mapping.remove_folio(&folio, shadow);
                        drop_gauge(&self.cache.nr_cached, nr);
                        return Err(e);
                    }
                }
                Fill::Write => self.blocks.new_empty(&folio),
            }
            *data = buf;
            folio.set(FolioFlags::UPTODATE);
            drop(data);
            self.cache.insert_new(self, &folio, shadow);
            return Ok(folio);
        }
    }

    /// Fill `buf` from the backend at `pos`, reading no further than
    /// `size`; the rest stays zero. Short reads and `EINTR` are retried.
    fn read_backend(&self, buf: &mut [u8], pos: u64, size: u64) -> io::Result<()> {
        let want = size.saturating_sub(pos).min(buf.len() as u64) as usize;
        let mut done = 0;
        while done < want {
            match self
                .backend
                .read_at(&mut buf[done..want], pos + done as u64)
            {
                Ok(0) => break,
                Ok(n) => done += n.min(want - done),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        bump(&self.cache.counters.backend_read_bytes, done as u64);
        Ok(())
    }

    fn read_at(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let size = self.len();
        if offset >= size {
            return Ok(0);
        }
        let end = checked_end(offset, buf.len() as u64)?.min(size);
        let mut pos = offset;
        while pos < end {
            if let Some(n) = self.read_hit(pos, end, &mut buf[(pos - offset) as usize..]) {
                pos += n as u64;
                continue;
            }
            let f = self.get_folio(pos / PAGE, Fill::Read)?;
            let data = f.data().read();
            if !folio::is_live(&f) {
                continue;
            }
            let at = (pos - f.index() * PAGE) as usize;
            let n = ((end - pos) as usize).min(data.len() - at);
            if !self.blocks.is_uptodate(&f, at, at + n) {
                drop(data);
                self.fill_blocks(&f, at, at + n)?;
                continue;
            }
            let out = (pos - offset) as usize;
            buf[out..out + n].copy_from_slice(&data[at..at + n]);
            pos += n as u64;
        }
        Ok((end - offset) as usize)
    }

    /// The hit path of `read_at`: under one epoch guard, load the folio,
    /// try its data lock shared, copy, and count the hit; no reference
    /// count is taken (the guard keeps the folio alive, and a folio removed
    /// meanwhile is `DETACHED` once its lock is ours). `None` sends the
    /// caller to the miss path (not cached, being filled, or detached).
    #[inline]
    fn read_hit(&self, pos: u64, end: u64, out: &mut [u8]) -> Option<usize> {
        let guard = pin();
        let Some(EntryRef::Item(r)) = self.mapping.pages().load(pos / PAGE, &guard) else {
            return None;
        };
        let f: &Folio = r.get();
        let data = f.data().try_read()?;
        if !folio::is_live(f) {
            return None;
        }
        let at = (pos - f.index() * PAGE) as usize;
        let n = ((end - pos) as usize).min(data.len() - at);
        if !self.blocks.is_uptodate(f, at, at + n) {
            return None;
        }
        out[..n].copy_from_slice(&data[at..at + n]);
        drop(data);
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(n)
    }

    /// The hit path of `read_folio`: a reference taken under the epoch
    /// guard (no re-check of the slot: `FolioRef::new` refuses a folio that
    /// was detached meanwhile).
    #[inline]
    fn folio_hit(&self, index: u64) -> Option<FolioRef> {
        let f = {
            let guard = pin();
            match self.mapping.pages().load(index, &guard)? {
                EntryRef::Item(r) => r.to_owned(),
                EntryRef::Value(_) => return None,
            }
        };
        let r = FolioRef::new(f, index)?;
        self.cache.counters.hits.add(1);
        folio::mark_accessed(r.folio());
        Some(r)
    }

    /// The hit path of `read_folio_in`: load under the caller's guard and
    /// lock the folio's data shared; no reference count, no pin.
    #[inline]
    fn folio_hit_in<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<FolioBorrow<'g>> {
        let EntryRef::Item(r) = self.mapping.pages().load(index, guard)? else {
            return None;
        };
        let b = FolioBorrow::new(r.get())?;
        // A folio a write allocated may have blocks never read: the miss
        // path fills them first (one relaxed load when no folio is partial).
        if !self.blocks.is_uptodate(b.folio(), 0, b.len()) {
            return None;
        }
        self.cache.counters.hits.add(1);
        folio::mark_accessed(b.folio());
        Some(b)
    }

    fn write_at(self: &Arc<Self>, buf: &[u8], offset: u64) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let end = checked_end(offset, buf.len() as u64)?;
        if end > self.len() {
            let _g = self.size_lock.lock();
            if end > self.len() {
                self.backend.set_len(end)?;
                self.size.store(end, Ordering::Release);
            }
        }
        let mut pos = offset;
        while pos < end {
            let f = self.get_folio(pos / PAGE, Fill::Write)?;
            let mut data = f.data().write();
            if !folio::is_live(&f) {
                continue;
            }
            let base = f.index() * PAGE;
            let at = (pos - base) as usize;
            let n = ((end - pos) as usize).min(data.len() - at);
            // Read-modify-write: the blocks this write overwrites in part
            // (or, whole-folio, every block it does not overwrite) that
            // are not uptodate are read first.
            let need = if self.whole_folio {
                (0, data.len())
            } else {
                (at, at + n)
            };
            for (a, b) in self.blocks.missing(&f, need.0, need.1, (at, at + n)) {
                self.read_backend(&mut data[a..b], base + a as u64, self.len())?;
            }
            self.blocks.set_uptodate(&f, need.0, need.1);
            let src = (pos - offset) as usize;
            data[at..at + n].copy_from_slice(&buf[src..src + n]);
            let newly = self.blocks.mark_dirty(&f, need.0, need.1);
            self.mark_dirty(&f, newly);
            drop(data);
            pos += n as u64;
            self.cache.balance_dirty_pages(newly);
        }
        Ok(buf.len())
    }

    /// Fill the blocks touching bytes `from..to` of `f` that are not
    /// uptodate from the backend (one read per run of such blocks).
    fn fill_blocks(&self, f: &Folio, from: usize, to: usize) -> io::Result<()> {
        let mut data = f.data().write();
        if !folio::is_live(f) {
            return Ok(()); // the caller looks it up again
        }
        let base = f.index() * PAGE;
        for (a, b) in self.blocks.missing(f, from, to, (0, 0)) {
            self.read_backend(&mut data[a..b], base + a as u64, self.len())?;
        }
        self.blocks.set_uptodate(f, from, to);
        Ok(())
    }

    /// Book `newly` dirty bytes of a folio (flag, tag, gauge, file age).
    /// The caller holds its data lock for writing.
    fn mark_dirty(&self, f: &Folio, newly: u64) {
        self.cache.counters.dirty_bytes.add(newly);
        if !f.set(FolioFlags::DIRTY) {
            self.mapping.mark_dirty(f.index());
            let _ = self.dirtied_at.compare_exchange(
                0,
                self.cache.now_ms(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// Remove a folio whose data lock the caller holds for writing,
    /// leaving `shadow`, and free its data.
    pub(crate) fn detach(&self, f: &Arc<Folio>, data: &mut Vec<u8>, shadow: Option<Shadow>) {
        f.set(FolioFlags::DETACHED);
        self.cache.lru.lock().forget(f);
        if self.mapping.remove_folio(f, shadow) {
            drop_gauge(&self.cache.nr_cached, f.nr_pages());
        }
        f.clear(FolioFlags::DIRTY);
        self.cache.counters.dirty_bytes.sub(self.blocks.forget(f));
        *data = Vec::new();
    }

    /// Every folio in pages `start..=end`, found lock-free.
    fn folios_in(&self, start: u64, end: u64) -> (Vec<Arc<Folio>>, Vec<u64>) {
        let guard = pin();
        let mut folios = Vec::new();
        let mut shadows = Vec::new();
        for (i, e) in self.mapping.pages().range(start..=end, &guard) {
            match e {
                EntryRef::Item(r) => folios.push(r.to_owned()),
                EntryRef::Value(_) => shadows.push(i),
            }
        }
        (folios, shadows)
    }

    fn set_len(&self, new: u64) -> io::Result<()> {
        let _wb = self.wb_lock.lock();
        let _sz = self.size_lock.lock();
        let old = self.len();
        if new == old {
            return Ok(());
        }
        self.backend.set_len(new)?;
        if new < old {
            let first_gone = new.div_ceil(PAGE);
            let (folios, shadows) = self.folios_in(new / PAGE, u64::MAX);
            for f in folios {
                let mut data = f.data().write();
                if f.test(FolioFlags::DETACHED) {
                    continue;
                }
                if f.index() >= first_gone {
                    self.detach(&f, &mut data, None);
                } else {
                    // The cut folio: zero its tail past the new end.
                    let at = (new - f.index() * PAGE) as usize;
                    if at < data.len() {
                        data[at..].fill(0);
                    }
                }
            }
            for i in shadows {
                if i >= first_gone {
                    self.mapping.drop_shadow(i);
                }
            }
        }
        self.size.store(new, Ordering::Release);
        Ok(())
    }

    fn invalidate(&self, range: Range<u64>) -> u64 {
        if range.end <= range.start {
            return 0;
        }
        let first = range.start.div_ceil(PAGE);
        let last_excl = range.end / PAGE;
        if last_excl <= first {
            return 0;
        }
        let (folios, _) = self.folios_in(first, last_excl - 1);
        let mut dropped = 0;
        for f in folios {
            if f.index() < first || f.index() + f.nr_pages() > last_excl {
                continue; // only partly inside the range
            }
            let mut data = f.data().write();
            if f.test(FolioFlags::DETACHED)
                || f.test(FolioFlags::DIRTY)
                || f.test(FolioFlags::WRITEBACK)
            {
                continue;
            }
            self.detach(&f, &mut data, None);
            dropped += f.nr_pages();
        }
        dropped
    }
}

impl Drop for FileShared {
    fn drop(&mut self) {
        // Best effort: write back what is dirty (errors have no one to go
        // to), then release every folio.
        let _ = writeback::writeback(self, 0, u64::MAX, Mode::Wait);
        let _ = self.backend.flush();
        let (folios, _) = self.folios_in(0, u64::MAX);
        for f in folios {
            let mut data = f.data().write();
            if !f.test(FolioFlags::DETACHED) {
                self.detach(&f, &mut data, None);
            }
        }
    }
}

/// A file in a [`PageCache`](super::PageCache): buffered positional I/O
/// over its backend. Clones share the file; each clone reports a writeback
/// error once from its own `sync` (the kernel's per-`struct file`
/// `errseq_t` cursor).
///
/// Dropping the last handle writes back dirty data (errors are lost then:
/// call [`sync`](CachedFile::sync) first to see them) and releases the
/// file's folios.
pub struct CachedFile {
    shared: Arc<FileShared>,
    since: Lock<u64>,
}

impl Clone for CachedFile {
    fn clone(&self) -> Self {
        CachedFile {
            shared: Arc::clone(&self.shared),
            since: Lock::new(*self.since.lock()),
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
    pub(crate) fn new(shared: Arc<FileShared>) -> Self {
        let since = shared.errseq.sample();
        CachedFile {
            shared,
            since: Lock::new(since),
        }
    }

    /// Read up to `buf.len()` bytes at `offset`. Returns fewer at the end
    /// of the file and 0 at or past it (or for an empty `buf`).
    ///
    /// # Errors
    /// The backend's read error for a page not cached (nothing is cached
    /// for it); [`io::ErrorKind::InvalidInput`] when `offset + buf.len()`
    /// overflows `u64`; [`io::ErrorKind::OutOfMemory`] if the index could
    /// not grow.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.shared.read_at(buf, offset)
    }

    /// Write all of `buf` at `offset`, extending the file if it ends past
    /// the end. Returns `buf.len()`. The data is dirty in the cache until
    /// written back ([`sync`](CachedFile::sync) or the flusher).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when `offset + buf.len()` overflows;
    /// the backend's error when the file must grow and cannot (a
    /// [`RamDisk`](crate::backend::RamDisk) has a fixed size), in which case
    /// nothing was written; a read error of a partly overwritten page not
    /// cached (the bytes before it were written).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.shared.write_at(buf, offset)
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.shared.len()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Truncate or extend. Cached pages past the new end and their shadows
    /// are dropped (dirty ones too: their bytes are gone), the cut page's
    /// tail is zeroed, and an extension reads as zeros.
    ///
    /// # Errors
    /// The backend's error (e.g. [`io::ErrorKind::Unsupported`] for a RAM
    /// disk); the file is unchanged then.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.shared.set_len(len)
    }

    /// Write back every dirty page and flush the backend (`fsync`).
    ///
    /// # Errors
    /// A writeback error recorded since this handle last reported one (by
    /// this call or by the flusher), once; the pages stay dirty and a later
    /// `sync` retries them. Or the backend's flush error.
    pub fn sync(&self) -> io::Result<()> {
        self.sync_range(0..u64::MAX)
    }

    /// [`sync`](CachedFile::sync) limited to the pages overlapping `range`
    /// (`sync_file_range` + `fsync` of the backend).
    ///
    /// # Errors
    /// As [`sync`](CachedFile::sync).
    pub fn sync_range(&self, range: Range<u64>) -> io::Result<()> {
        if range.end > range.start {
            let _ = writeback::writeback(
                &self.shared,
                range.start / PAGE,
                (range.end - 1) / PAGE,
                Mode::Wait,
            );
        }
        let flushed = self.shared.backend.flush();
        self.shared
            .errseq
            .check_and_advance(&mut self.since.lock())?;
        flushed
    }

    /// Drop the clean, idle cached folios lying wholly inside `range`
    /// (`invalidate_mapping_pages`); dirty ones and ones under writeback
    /// stay. Returns the pages dropped.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for backends that must be told.
    pub fn invalidate(&self, range: Range<u64>) -> io::Result<u64> {
        Ok(self.shared.invalidate(range))
    }

    /// A zero-copy reference to the folio holding page `index` (reading it
    /// from the backend on a miss). See [`FolioRef`] for what it pins.
    ///
    /// # Errors
    /// [`io::ErrorKind::UnexpectedEof`] when the page starts at or past the
    /// end of the file; the backend's read error on a miss.
    pub fn read_folio(&self, index: u64) -> io::Result<FolioRef> {
        let s = &self.shared;
        if index.checked_mul(PAGE).is_none_or(|p| p >= s.len()) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("page {index} is past the end of the file"),
            ));
        }
        loop {
            let r = match s.folio_hit(index) {
                Some(r) => r,
                None => match FolioRef::new(s.get_folio(index, Fill::Read)?, index) {
                    Some(r) => r,
                    None => continue,
                },
            };
            if s.blocks.is_uptodate(r.folio(), 0, r.len()) {
                return Ok(r);
            }
            // Part of the folio was never read (a write allocated it):
            // fill the rest before handing out all its bytes.
            let f = r.folio_arc();
            let len = r.len();
            drop(r);
            s.fill_blocks(&f, 0, len)?;
        }
    }

    /// [`read_folio`](CachedFile::read_folio) borrowing under an epoch
    /// guard the caller pinned: the cheapest zero-copy read, with no
    /// reference count taken and no pin per call, for engines that parse
    /// many pages in place (pin once per batch with [`crate::pin`]).
    ///
    /// The reference lives as long as the guard; while it lives the folio
    /// cannot change (writers wait) and reclaim skips it, and while the
    /// guard lives nothing unlinked meanwhile is freed, so keep both short.
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
            // left unread, checking the end of the file); then borrow it
            // from the tree under the caller's guard (the reference it
            // returns cannot lend for `'g`). Evicted or partly invalidated
            // in between: again. (The fill counted a miss; the borrow counts
            // a hit as well.)
            drop(self.read_folio(index)?);
            if let Some(b) = self.shared.folio_hit_in(index, guard) {
                return Ok(b);
            }
        }
    }

    /// Pages of this file in the cache now.
    pub fn cached_pages(&self) -> u64 {
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

    fn len(&self) -> io::Result<u64> {
        Ok(CachedFile::len(self))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        CachedFile::set_len(self, len)
    }
}
