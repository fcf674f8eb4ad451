//! The file operations: [`CachedFile`], the handle, and the read, write,
//! truncate and invalidate paths over a file's shared state
//! (`FileShared`, in `inode`), with the miss path that fills a folio from
//! the backend.
//!
//! Sits above everything else in the page cache: it uses the file's state,
//! writeback, dirty throttling, reclaim and the counters; none of them use
//! it.
//!
//! Invariants:
//! - a folio is filled while its lock is held, from before it is published
//!   with `add_folio` until `UPTODATE` is set, so a reader that finds it
//!   not yet uptodate takes the lock and so waits for the fill; a failed
//!   fill removes the folio again (restoring the shadow) and caches
//!   nothing; a write miss publishes a folio whose blocks are all not
//!   uptodate (`UPTODATE` then means "published", the blocks say what holds
//!   data);
//! - the hit path of a read takes no lock and writes nothing shared but the
//!   counters: it copies optimistically and keeps the copy only if the
//!   folio's version did not move ([`FolioMem`](crate::filemap) protocol),
//!   and only from blocks that are uptodate ([`BlockMap::is_uptodate`](super::blocks));
//!   anything else (a miss, a folio being filled or written, missing
//!   blocks) goes to the locked path;
//! - bytes are copied out only from uptodate blocks; a write reads the
//!   blocks it overwrites in part (all it does not overwrite, in whole-folio
//!   mode) before marking them uptodate and dirty;
//! - every path that removes a folio holds its lock and sets `DETACHED`
//!   first ([`FileShared::detach`]), and every locked reader or writer
//!   re-checks `DETACHED` and `UPTODATE` after taking the lock and looks the
//!   index up again if either says so, so no write lands in a folio that is
//!   no longer cached;
//! - bytes of cached folios at or past the file's size are zero (the miss
//!   path zero-fills, truncation zeroes the cut folio's tail), so extending
//!   the file exposes zeros;
//! - offsets and lengths are checked against [`MAX_FILE_SIZE`] before
//!   anything changes, so an out-of-range request is refused whole.

use super::borrow::FolioBorrow;
use super::folio::{self, FolioRef};
use super::folio_write::FolioWrite;
use super::inode::{oom, FileShared};
use super::stats::{bump, drop_gauge};
use super::writeback::{self, Mode};
use crate::backend::{checked_end, Backend};
use crate::filemap::{AddError, Folio, FolioFlags, InstallError, MemWrite, PAGE_SIZE};
use crate::pin;
use crate::sync::Ordering;
use crate::{EntryRef, Guard};
use std::io;
use std::ops::Range;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

/// Whether `read_at` hits under a light pin. Not under loom: its models
/// of the page cache check the folio protocol on the guarded path, and the
/// light limbo is modelled on its own (`tests/loom_lightpin.rs`).
const LIGHT_HITS: bool = !cfg!(loom);

/// What a hit may read under: a crossbeam [`Guard`], or a light pin (no
/// locked instruction, no lock may be taken inside).
pub(crate) trait LightOrGuard: crate::guard::ProtectsBuffers {
    /// Whether this is a light pin.
    const LIGHT: bool;
}

impl LightOrGuard for Guard {
    const LIGHT: bool = false;
}

impl LightOrGuard for crate::lightpin::LightPin {
    const LIGHT: bool = true;
}

/// The largest size a cached file may have, and so the end of the largest
/// offset range it accepts: `i64::MAX`, the kernel's `MAX_LFS_FILESIZE` on
/// 64-bit machines (and the largest `off_t` a file backend can be given).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// How a miss fills a new folio: wholly from the backend (readahead may
/// make it large), or not at all (a write: a folio of the file's write
/// folio size whose blocks are all not uptodate; the write then reads only
/// the blocks it overwrites in part, and readers fill the others).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    Read,
    Write,
}

fn io_add_error(e: AddError) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, e)
}

/// `offset + len`, checked against [`MAX_FILE_SIZE`] (the kernel's
/// `EFBIG` for writes and truncation).
pub(crate) fn check_size(what: &str, offset: u64, len: u64) -> io::Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(end),
        _ => Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "{what} of {len} bytes at offset {offset} ends past the largest file size, {MAX_FILE_SIZE} bytes"
            ),
        )),
    }
}

impl FileShared {
    /// The folio covering `index`, from the cache or (a miss) filled from
    /// the backend or, for [`Fill::Write`], empty. The caller must lock it,
    /// re-check `DETACHED`/`UPTODATE`, and check the blocks it uses are
    /// uptodate ([`BlockMap::is_uptodate`](super::blocks)).
    pub(crate) fn get_folio(self: &Arc<Self>, index: u64, fill: Fill) -> io::Result<Arc<Folio>> {
        let mut allow_large = true;
        loop {
            if let Some(f) = self.cached(index) {
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
            let mut w = folio.mem().lock();
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
            let filled = match fill {
                Fill::Read => w.install(|buf| self.read_backend(buf, base * PAGE, size)),
                Fill::Write => w.install(|_| Ok(())),
            };
            if let Err(e) = filled {
                folio.set(FolioFlags::DETACHED);
                self.mapping.remove_folio(&folio, shadow);
                drop_gauge(&self.cache.nr_cached, nr);
                return Err(match e {
                    InstallError::Alloc(a) => oom(a),
                    InstallError::Fill(e) => e,
                });
            }
            if fill == Fill::Write {
                self.blocks.new_empty(&folio);
            }
            folio.set(FolioFlags::UPTODATE);
            drop(w);
            self.cache.insert_new(self, &folio, shadow);
            return Ok(folio);
        }
    }

    /// The folio at `index`, if one is cached: one lock-free load and a
    /// reference (no second load to check it is still there: every caller
    /// locks it and re-checks `DETACHED`, as the kernel's callers of
    /// `filemap_get_entry` re-check `folio->mapping`).
    #[inline]
    fn cached(&self, index: u64) -> Option<Arc<Folio>> {
        let guard = pin();
        match self.mapping.pages().load(index, &guard)? {
            EntryRef::Item(r) => Some(r.to_owned()),
            EntryRef::Value(_) => None,
        }
    }

    fn read_at(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let end = checked_end(offset, buf.len() as u64)?;
        if offset > MAX_FILE_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "read at offset {offset} past the largest file size, {MAX_FILE_SIZE} bytes"
                ),
            ));
        }
        let size = self.len();
        if buf.is_empty() || offset >= size {
            return Ok(0);
        }
        let end = end.min(size);
        let mut pos = offset;
        while pos < end {
            // The hit path: a light section (no locked instruction) for
            // every page it can copy; then, for what it could not (blocks
            // to check under the block map's lock, or this thread's light
            // reader torn down at exit), a crossbeam guard; then the locked
            // path for one page.
            let light = LIGHT_HITS.then(|| {
                crate::lightpin::read(|lp| {
                    self.hits(pos, end, offset, buf, lp, |i| {
                        self.mapping.folio_light(i, lp)
                    })
                })
            });
            if let Some(Some(p)) = light {
                pos = p;
            }
            if pos < end {
                let guard = pin();
                pos = self.hits(pos, end, offset, buf, &guard, |i| {
                    match self.mapping.pages().load(i, &guard)? {
                        EntryRef::Item(r) => Some(r.get()),
                        EntryRef::Value(_) => None,
                    }
                });
            }
            if pos < end {
                pos += self.read_locked(pos, end, &mut buf[(pos - offset) as usize..])? as u64;
            }
        }
        Ok((end - offset) as usize)
    }

    /// Copy hits from `pos` on (the file's bytes `offset..` go to `buf`)
    /// until the first page that is not a plain hit, under `pin`, finding
    /// folios with `folio_at`. Returns the position reached.
    #[inline(always)]
    fn hits<'p, P: LightOrGuard>(
        &'p self,
        mut pos: u64,
        end: u64,
        offset: u64,
        buf: &mut [u8],
        pin: &'p P,
        folio_at: impl Fn(u64) -> Option<&'p Folio>,
    ) -> u64 {
        while pos < end {
            let Some(f) = folio_at(pos / PAGE) else {
                break;
            };
            match self.read_hit(f, pos, end, &mut buf[(pos - offset) as usize..], pin) {
                Some(n) => pos += n as u64,
                None => break,
            }
        }
        pos
    }

    /// One hit of `read_at` on folio `f`: copy optimistically and count the
    /// hit; no lock, no reference count. `None` sends the caller on (not
    /// uptodate, being filled or written, blocks to check, or detached).
    #[inline(always)]
    fn read_hit<P: LightOrGuard>(
        &self,
        f: &Folio,
        pos: u64,
        end: u64,
        out: &mut [u8],
        pin: &P,
    ) -> Option<usize> {
        if !folio::is_live(f) {
            return None;
        }
        let at = (pos - f.index() * PAGE) as usize;
        let n = ((end - pos) as usize).min(f.max_bytes().saturating_sub(at));
        // A light section takes no lock: with partial folios in the file it
        // leaves the block check to the guarded path.
        let uptodate = if P::LIGHT {
            self.blocks.none_partial()
        } else {
            self.blocks.is_uptodate(f, at, at + n)
        };
        if n == 0 || !uptodate || !f.mem().read(at, &mut out[..n], pin) {
            return None;
        }
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(n)
    }

    /// The locked path of `read_at` for the page at `pos`: find or fill the
    /// folio, lock it, fill missing blocks, copy. Returns the bytes copied.
    #[cold]
    fn read_locked(self: &Arc<Self>, pos: u64, end: u64, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let f = self.get_folio(pos / PAGE, Fill::Read)?;
            let mut w = f.mem().lock();
            if !folio::is_live(&f) {
                continue;
            }
            let at = (pos - f.index() * PAGE) as usize;
            let n = ((end - pos) as usize).min(w.len() - at);
            if !self.blocks.is_uptodate(&f, at, at + n) {
                self.fill_blocks(&f, &mut w, at, at + n)?;
            }
            out[..n].copy_from_slice(&w.bytes()[at..at + n]);
            return Ok(n);
        }
    }

    /// The hit path of `read_folio`: a pin of the folio's bytes, taken in a
    /// light section (or, with partial folios in the file or no light
    /// reader, under a guard); no reference count on the folio. `None`
    /// sends the caller to the miss path.
    #[inline]
    fn folio_hit(&self, index: u64) -> Option<FolioRef> {
        if LIGHT_HITS {
            let hit = crate::lightpin::read(|lp| {
                self.folio_hit_with(lp, || self.mapping.folio_light(index, lp))
            });
            if let Some(Some(r)) = hit {
                return Some(r);
            }
        }
        let guard = pin();
        self.folio_hit_with(&guard, || {
            match self.mapping.pages().load(index, &guard)? {
                EntryRef::Item(r) => Some(r.get()),
                EntryRef::Value(_) => None,
            }
        })
    }

    /// `folio_hit` under `pin`, finding the folio with `folio`.
    #[inline(always)]
    fn folio_hit_with<'p, P: LightOrGuard>(
        &'p self,
        pin: &'p P,
        folio: impl FnOnce() -> Option<&'p Folio>,
    ) -> Option<FolioRef> {
        let f = folio()?;
        if !folio::is_live(f) {
            return None;
        }
        // Every block read (a folio a write allocated may have blocks never
        // read): checked without a lock in a light section.
        let uptodate = if P::LIGHT {
            self.blocks.none_partial()
        } else {
            self.blocks.is_uptodate(f, 0, f.max_bytes())
        };
        if !uptodate {
            return None;
        }
        let r = FolioRef::new(f, f.mem().pin(pin)?);
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(r)
    }

    /// The hit path of `read_folio_in`: load under the caller's guard and
    /// pin the folio's bytes; no reference count on the folio.
    #[inline]
    fn folio_hit_in<'g>(&'g self, index: u64, guard: &'g Guard) -> Option<FolioBorrow<'g>> {
        let EntryRef::Item(r) = self.mapping.pages().load(index, guard)? else {
            return None;
        };
        let f = r.get();
        if !folio::is_live(f) {
            return None;
        }
        // A folio a write allocated may have blocks never read: the miss
        // path fills them first (one relaxed load when no folio is partial).
        if !self.blocks.is_uptodate(f, 0, f.max_bytes()) {
            return None;
        }
        let b = FolioBorrow::new(f, f.mem().pin(guard)?);
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(b)
    }

    /// The locked path of `read_folio`: the folio (read in on a miss) with
    /// every block filled, pinned. `None`: it was detached meanwhile.
    fn folio_locked(self: &Arc<Self>, index: u64) -> io::Result<Option<FolioRef>> {
        let f = self.get_folio(index, Fill::Read)?;
        let mut w = f.mem().lock();
        if !folio::is_live(&f) {
            return Ok(None);
        }
        let len = w.len();
        if !self.blocks.is_uptodate(&f, 0, len) {
            self.fill_blocks(&f, &mut w, 0, len)?;
        }
        let Some(pin) = w.pin() else {
            return Ok(None);
        };
        drop(w);
        Ok(Some(FolioRef::new(&f, pin)))
    }

    fn write_at(self: &Arc<Self>, buf: &[u8], offset: u64) -> io::Result<usize> {
        let end = check_size("write", offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(0);
        }
        self.extend_to(end)?;
        let mut pos = offset;
        while pos < end {
            let f = self.get_folio(pos / PAGE, Fill::Write)?;
            let mut w = f.mem().lock();
            if !folio::is_live(&f) {
                continue;
            }
            let at = (pos - f.index() * PAGE) as usize;
            let n = ((end - pos) as usize).min(w.len() - at);
            let src = (pos - offset) as usize;
            let newly = self.write_locked(&f, &mut w, at, &buf[src..src + n])?;
            drop(w);
            pos += n as u64;
            self.cache.balance_dirty_pages(newly);
        }
        Ok(buf.len())
    }

    /// Grow the file to `end` bytes if it is shorter (the backend first).
    pub(crate) fn extend_to(&self, end: u64) -> io::Result<()> {
        if end > self.len() {
            let _g = self.size_lock.lock();
            if end > self.len() {
                self.backend.set_len(end)?;
                self.size.store(end, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Write `src` at byte `at` of a live folio whose lock the caller
    /// holds: read the blocks the write overwrites in part (or, whole-folio,
    /// every block it does not overwrite) that are not uptodate, copy,
    /// mark the blocks uptodate and dirty. Returns the bytes newly dirty.
    pub(crate) fn write_locked(
        &self,
        f: &Folio,
        w: &mut MemWrite<'_>,
        at: usize,
        src: &[u8],
    ) -> io::Result<u64> {
        let to = at + src.len();
        let need = self.dirty_span(w, at, to);
        let base = f.index() * PAGE;
        let mut reads = Vec::new();
        for (a, b) in self.blocks.missing(f, need.0, need.1, (at, to)) {
            let mut tmp = vec![0u8; b - a];
            self.read_backend(&mut tmp, base + a as u64, self.len())?;
            reads.push((a, tmp));
        }
        {
            let mut e = w.edit().map_err(oom)?;
            for (a, tmp) in &reads {
                e.write(*a, tmp);
            }
            e.write(at, src);
        }
        let newly = self.blocks.wrote(f, need.0, need.1);
        self.mark_dirty(f, newly);
        Ok(newly)
    }

    /// Fill the blocks touching bytes `from..to` of a live folio whose lock
    /// the caller holds that are not uptodate, from the backend (one read
    /// per run of such blocks).
    pub(crate) fn fill_blocks(
        &self,
        f: &Folio,
        w: &mut MemWrite<'_>,
        from: usize,
        to: usize,
    ) -> io::Result<()> {
        let base = f.index() * PAGE;
        for (a, b) in self.blocks.missing(f, from, to, (0, 0)) {
            let mut tmp = vec![0u8; b - a];
            self.read_backend(&mut tmp, base + a as u64, self.len())?;
            w.edit().map_err(oom)?.write(a, &tmp);
        }
        self.blocks.set_uptodate(f, from, to);
        Ok(())
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
        check_size("truncate", 0, new)?;
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
                let mut w = f.mem().lock();
                if f.test(FolioFlags::DETACHED) {
                    continue;
                }
                if f.index() >= first_gone {
                    self.detach(&f, &mut w, None);
                } else {
                    // The cut folio: zero its tail past the new end.
                    let at = (new - f.index() * PAGE) as usize;
                    if at < w.len() {
                        let n = w.len() - at;
                        w.edit().map_err(oom)?.fill(at, n, 0);
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
            let mut w = f.mem().lock();
            if f.test(FolioFlags::DETACHED)
                || f.test(FolioFlags::DIRTY)
                || f.test(FolioFlags::WRITEBACK)
            {
                continue;
            }
            self.detach(&f, &mut w, None);
            dropped += f.nr_pages();
        }
        dropped
    }
}

/// The last handle of a file is gone: write back what is dirty (errors have
/// no one to go to) and release every folio. Here rather than in `inode`,
/// which sits below writeback.
impl Drop for FileShared {
    fn drop(&mut self) {
        let _ = writeback::writeback(self, 0, u64::MAX, Mode::Wait);
        let _ = self.backend.flush();
        let (folios, _) = self.folios_in(0, u64::MAX);
        for f in folios {
            let mut w = f.mem().lock();
            if !f.test(FolioFlags::DETACHED) {
                self.detach(&f, &mut w, None);
            }
        }
    }
}

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
    shared: Arc<FileShared>,
    since: crate::sync::Lock<u64>,
}

impl Clone for CachedFile {
    fn clone(&self) -> Self {
        CachedFile {
            shared: Arc::clone(&self.shared),
            since: crate::sync::Lock::new(*self.since.lock()),
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
            since: crate::sync::Lock::new(since),
        }
    }

    /// Read up to `buf.len()` bytes at `offset`. Returns fewer at the end
    /// of the file and 0 at or past it (or for an empty `buf`).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when `offset` is past
    /// [`MAX_FILE_SIZE`] or `offset + buf.len()` overflows `u64` (the
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
        self.shared.read_at(buf, offset)
    }

    /// Write all of `buf` at `offset`, extending the file if it ends past
    /// the end. Returns `buf.len()`. The data is dirty in the cache until
    /// written back ([`sync`](CachedFile::sync) or the flusher).
    ///
    /// # Errors
    /// [`io::ErrorKind::FileTooLarge`] when `offset + buf.len()` is past
    /// [`MAX_FILE_SIZE`] (the kernel's `EFBIG`; nothing is written); the
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
    /// [`io::ErrorKind::FileTooLarge`] when `len` is past [`MAX_FILE_SIZE`];
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
        self.sync_range(0..u64::MAX)
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
        Ok(self.shared.invalidate(range))
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
        let s = &self.shared;
        if index.checked_mul(PAGE).is_none_or(|p| p >= s.len()) {
            return None;
        }
        s.folio_hit(index)
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
    /// [`io::ErrorKind::FileTooLarge`] past [`MAX_FILE_SIZE`]; the
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
    /// past [`MAX_FILE_SIZE`]; [`io::ErrorKind::OutOfMemory`].
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
