//! The page cache's paths over one file's state (`FileShared`, in
//! `inode`): the miss path that fills a folio from the backend, the
//! lock-free read hits, the locked reads, writes and truncation, and the
//! release of a file's folios when its last handle goes (what changed
//! behind the cache is `behind`). [`CachedFile`](super::CachedFile), in `file`, is the public handle
//! over them.
//!
//! Sits above the file's state, writeback, throttling, reclaim and the
//! counters; below the handles (`file`, `folio_write`).
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
use super::inode::{oom, FileShared};
use super::passthrough::Pass;
use super::stats::{bump, drop_gauge};
use super::writeback::{self, Mode};
use crate::backend::checked_end;
use crate::filemap::{AddError, Folio, FolioFlags, InstallError, MemWrite, PAGE_SIZE};
use crate::pin;
use crate::sync::Ordering;
use crate::{EntryRef, Guard};
use std::io;
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
        self.get_folio_for(index, fill, 1, false)
    }

    /// [`get_folio`](FileShared::get_folio) for a read of `req` pages from
    /// `index` on: a sequential read miss submits a readahead window
    /// (`fill`) and returns the folio holding `index` with its read in
    /// flight (locking it waits for the read); a random one reads its page
    /// alone, synchronously. A folio whose read failed is removed and its
    /// error returned to a reader (a writer just goes on). `drop_behind`:
    /// the miss passes the cache by, its folios dropped once read.
    pub(crate) fn get_folio_for(
        self: &Arc<Self>,
        index: u64,
        fill: Fill,
        req: u64,
        drop_behind: bool,
    ) -> io::Result<Arc<Folio>> {
        let mut allow_large = true;
        loop {
            if let Some(f) = self.cached(index) {
                if !f.test(FolioFlags::UPTODATE) {
                    // Being filled (wait), or its read failed.
                    match self.take_failed(&f) {
                        Ok(false) => continue,
                        Ok(true) => {
                            allow_large = false;
                            continue;
                        }
                        Err(e) if fill == Fill::Read => return Err(e),
                        Err(_) => continue,
                    }
                }
                self.cache.counters.hits.add(1);
                folio::mark_accessed(&f);
                return Ok(f);
            }
            // A miss: what waits for one runs first, under no lock.
            self.cache.demand();
            let size = self.len();
            if fill == Fill::Read && allow_large {
                let limit = self.ra_limit();
                let pages = size.div_ceil(PAGE);
                if let Some(win) = self.ra.on_miss(index, req, pages, limit, drop_behind) {
                    match self.submit_fills(&[win], Some(index))? {
                        Some(f) => return Ok(f),
                        // Someone else's folio is in the way: look again.
                        None => {
                            allow_large = false;
                            continue;
                        }
                    }
                }
            }
            let order = match fill {
                _ if !allow_large => 0,
                Fill::Read => 0,
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
                // A recycled frame holds a former folio's bytes: what the
                // backend did not fill (past the end of the file) is zeroed.
                Fill::Read => w.install(|buf, zeroed| {
                    let done = self.read_backend(buf, base * PAGE, size)?;
                    if !zeroed {
                        buf[done..].fill(0);
                    }
                    Ok(())
                }),
                // No block is uptodate yet, but zeroed all the same: a
                // write marks blocks uptodate that it covers only in part
                // past the end of the file.
                Fill::Write => w.install_zeroed(|_| Ok(())),
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
            if drop_behind {
                folio.set(FolioFlags::DROPBEHIND);
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
    pub(crate) fn cached(&self, index: u64) -> Option<Arc<Folio>> {
        let guard = pin();
        match self.mapping.pages().load(index, &guard)? {
            EntryRef::Item(r) => Some(r.to_owned()),
            EntryRef::Value(_) => None,
        }
    }

    pub(crate) fn read_at(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at_as::<false>(buf, offset)
    }

    /// `read_at`; with `NOREUSE`, its misses pass the cache by unless the
    /// rule admits them (`passthrough`). The hits are the same code.
    #[inline(always)]
    pub(crate) fn read_at_as<const NOREUSE: bool>(
        self: &Arc<Self>,
        buf: &mut [u8],
        offset: u64,
    ) -> io::Result<usize> {
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
                let out = &mut buf[(pos - offset) as usize..];
                pos += self.read_locked::<NOREUSE>(pos, end, out)? as u64;
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
        if !folio::is_plain_hit(f) {
            return None;
        }
        // The folio holding page `pos / PAGE` starts at that index rounded
        // down to its size (folios are aligned to their size): derived from
        // the order, so the hit does not load `index`, off the folio's hot
        // bytes (see `Folio`'s layout).
        let size = f.max_bytes();
        let at = (pos & (size as u64 - 1)) as usize;
        debug_assert_eq!(at as u64, pos - f.index() * PAGE);
        let n = ((end - pos) as usize).min(size - at);
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

    /// The locked path of `read_at` for the page at `pos`: a miss the rule
    /// passes by is read straight into `out` (`passthrough`); else find or
    /// fill the folio, lock it, fill missing blocks, copy. Returns the
    /// bytes copied.
    #[cold]
    fn read_locked<const NOREUSE: bool>(
        self: &Arc<Self>,
        pos: u64,
        end: u64,
        out: &mut [u8],
    ) -> io::Result<usize> {
        let drop_behind = match self.pass_by(pos, end, out, NOREUSE)? {
            Pass::Read(n) => return Ok(n),
            Pass::DropBehind => true,
            Pass::Cache => false,
        };
        loop {
            let req = (end.div_ceil(PAGE) - pos / PAGE).max(1);
            let f = self.get_folio_for(pos / PAGE, Fill::Read, req, drop_behind)?;
            self.touch_marker(&f, NOREUSE);
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
            if f.test(FolioFlags::DROPBEHIND) {
                self.drop_behind(&f, &mut w, at + n);
            }
            return Ok(n);
        }
    }

    /// The hit path of `read_folio`: a pin of the folio's bytes, taken in a
    /// light section (or, with partial folios in the file or no light
    /// reader, under a guard); no reference count on the folio. `None`
    /// sends the caller to the miss path.
    #[inline]
    pub(crate) fn folio_hit(&self, index: u64) -> Option<FolioRef> {
        if LIGHT_HITS {
            let hit = crate::lightpin::read(|lp| {
                self.folio_hit_with(lp, index, || self.mapping.folio_light(index, lp))
            });
            if let Some(Some(r)) = hit {
                return Some(r);
            }
        }
        let guard = pin();
        self.folio_hit_with(&guard, index, || {
            match self.mapping.pages().load(index, &guard)? {
                EntryRef::Item(r) => Some(r.get()),
                EntryRef::Value(_) => None,
            }
        })
    }

    /// Whether `r` pins the bytes the file holds now at its index: the
    /// folio there is live and its current buffer is the pinned one. No
    /// write to shared memory (a light section, or a guard without one).
    #[inline]
    pub(crate) fn is_current(&self, r: &FolioRef) -> bool {
        if LIGHT_HITS {
            let now = crate::lightpin::read(|lp| {
                self.mapping
                    .folio_light(r.index(), lp)
                    .is_some_and(|f| r.is_current_in(f))
            });
            if let Some(now) = now {
                return now;
            }
        }
        let guard = pin();
        match self.mapping.pages().load(r.index(), &guard) {
            Some(EntryRef::Item(f)) => r.is_current_in(f.get()),
            _ => false,
        }
    }

    /// `folio_hit` under `pin`, finding the folio holding `index` with
    /// `folio`.
    #[inline(always)]
    fn folio_hit_with<'p, P: LightOrGuard>(
        &'p self,
        pin: &'p P,
        index: u64,
        folio: impl FnOnce() -> Option<&'p Folio>,
    ) -> Option<FolioRef> {
        let f = folio()?;
        if !folio::is_plain_hit(f) {
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
        let r = FolioRef::new(f, index, f.mem().pin(pin)?);
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(r)
    }

    /// The hit path of `read_folio_in`: load under the caller's guard and
    /// pin the folio's bytes; no reference count on the folio.
    #[inline]
    pub(crate) fn folio_hit_in<'g>(
        &'g self,
        index: u64,
        guard: &'g Guard,
    ) -> Option<FolioBorrow<'g>> {
        let EntryRef::Item(r) = self.mapping.pages().load(index, guard)? else {
            return None;
        };
        let f = r.get();
        if !folio::is_plain_hit(f) {
            return None;
        }
        // A folio a write allocated may have blocks never read: the miss
        // path fills them first (one relaxed load when no folio is partial).
        if !self.blocks.is_uptodate(f, 0, f.max_bytes()) {
            return None;
        }
        let b = FolioBorrow::new(f, f.mem().borrow(guard)?);
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Some(b)
    }

    /// The locked path of `read_folio`: the folio (read in on a miss) with
    /// every block filled, pinned. `None`: it was detached meanwhile.
    pub(crate) fn folio_locked(self: &Arc<Self>, index: u64) -> io::Result<Option<FolioRef>> {
        let f = self.get_folio(index, Fill::Read)?;
        self.touch_marker(&f, false);
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
        Ok(Some(FolioRef::new(&f, index, pin)))
    }

    pub(crate) fn write_at(self: &Arc<Self>, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.writable()?;
        let end = check_size("write", offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(0);
        }
        // Refused before anything changes while a failing backend holds
        // too much of the cache unwritten (`throttle`).
        self.cache.check_unwritable(self, true)?;
        self.extend_to(end)?;
        let mut pos = offset;
        while pos < end {
            if let Some((n, newly)) = self.write_hit(buf, offset, pos, end)? {
                pos += n as u64;
                self.cache.balance_dirty_pages(newly);
                continue;
            }
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

    /// The hit path of `write_at` for the page at `pos` (the file's bytes
    /// `offset..` come from `buf`): the cached folio found under a guard
    /// (no reference count), locked if no one holds its lock, and written
    /// when that needs no read from the backend. Nothing under the guard
    /// waits: a fill, writeback or another writer holding the lock, or
    /// blocks to read first, send the caller to the miss path, which waits
    /// without a guard. Returns the bytes written and the bytes newly
    /// dirty.
    #[inline]
    fn write_hit(
        &self,
        buf: &[u8],
        offset: u64,
        pos: u64,
        end: u64,
    ) -> io::Result<Option<(usize, u64)>> {
        let guard = pin();
        let Some(EntryRef::Item(r)) = self.mapping.pages().load(pos / PAGE, &guard) else {
            return Ok(None);
        };
        let f = r.get();
        let Some(mut w) = f.mem().try_lock() else {
            return Ok(None);
        };
        if !folio::is_live(f) {
            return Ok(None);
        }
        let at = (pos - f.index() * PAGE) as usize;
        let n = ((end - pos) as usize).min(w.len() - at);
        let need = self.dirty_span(&w, at, at + n);
        let src = &buf[(pos - offset) as usize..][..n];
        let newly = if f.test(FolioFlags::OWNER_PRIV) {
            // Every block is dirty and uptodate already (the flag changes
            // only under the lock held here: see `blocks`): only the bytes
            // change.
            w.edit().map_err(oom)?.write(at, src);
            0
        } else if self.blocks.is_uptodate(f, need.0, need.1) {
            self.write_locked(f, &mut w, at, src)?
        } else {
            return Ok(None);
        };
        self.cache.counters.hits.add(1);
        folio::mark_accessed(f);
        Ok(Some((n, newly)))
    }

    /// Grow the file to `end` bytes if it is shorter (the backend first).
    ///
    /// A backend that grows by itself when written past its end (a file:
    /// [`Backend::extends_on_write`](crate::backend::Backend::extends_on_write)) is not told: the cache's size grows
    /// now, the backend's when writeback writes the new blocks (the
    /// kernel's `i_size` and the blocks it writes later), which spares an
    /// `ftruncate` per appending write (a SQLite WAL frame).
    pub(crate) fn extend_to(&self, end: u64) -> io::Result<()> {
        if end > self.len() {
            let _g = self.size_lock.lock();
            if end > self.len() {
                if !self.backend.extends_on_write() {
                    let _write = self.backend_writes.begin();
                    self.backend.set_len(end)?;
                }
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
        let size = self.len();
        let mut reads = Vec::new();
        for (a, b) in self.blocks.missing(f, need.0, need.1, (at, to)) {
            // One read per run: of a run the write starts or ends inside,
            // only the part it does not cover, and only what lies before
            // the end of the file (an append reads nothing past it).
            let (x, y) = if at <= a {
                (to.clamp(a, b), b)
            } else if to >= b {
                (a, at.clamp(a, b))
            } else {
                (a, b)
            };
            let in_file = (size.saturating_sub(base + x as u64) as usize).min(y - x);
            if in_file > 0 {
                let mut tmp = vec![0u8; in_file];
                let _ = self.read_backend(&mut tmp, base + x as u64, size)?;
                reads.push((x, tmp));
            }
        }
        {
            let mut e = w.edit().map_err(oom)?;
            for (a, tmp) in &reads {
                e.write(*a, tmp);
            }
            e.write(at, src);
        }
        let d = self.blocks.wrote(f, need.0, need.1);
        let newly = d.bytes;
        self.mark_dirty(f, d);
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
            let _ = self.read_backend(&mut tmp, base + a as u64, self.len())?;
            w.edit().map_err(oom)?.write(a, &tmp);
        }
        self.blocks.set_uptodate(f, from, to);
        Ok(())
    }

    /// Every folio in pages `start..=end`, found lock-free.
    pub(crate) fn folios_in(&self, start: u64, end: u64) -> (Vec<Arc<Folio>>, Vec<u64>) {
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

    pub(crate) fn set_len(&self, new: u64) -> io::Result<()> {
        self.writable()?;
        check_size("truncate", 0, new)?;
        let _wb = self.wb_lock.lock();
        let _sz = self.size_lock.lock();
        let old = self.len();
        if new == old {
            return Ok(());
        }
        {
            let _write = self.backend_writes.begin();
            self.backend.set_len(new)?;
        }
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
}

/// The last handle of a file is gone: write back what is dirty (errors have
/// no one to go to), flush the backend if that wrote anything, and release
/// every folio. A file with nothing dirty is not flushed: as the kernel's
/// `close` does not `fsync`, and a SQLite journal closed and deleted at
/// every commit paid a fifth sync per commit for it. Here rather than in
/// `inode`, which sits below writeback.
impl Drop for FileShared {
    fn drop(&mut self) {
        let dirty = self.mapping.tagged(crate::filemap::Tag::Dirty);
        let _ = writeback::writeback(self, 0, u64::MAX, Mode::Wait);
        if dirty {
            let _ = self.backend.flush();
        }
        let (folios, _) = self.folios_in(0, u64::MAX);
        // One light grace period for the whole file, not one per 256
        // buffers (crossbeam's are already batched).
        let _bulk = crate::lightpin::bulk();
        for f in folios {
            let mut w = f.mem().lock();
            if !f.test(FolioFlags::DETACHED) {
                self.detach(&f, &mut w, None);
            }
        }
        // What this file could not write leaves the cache's gauge.
        self.backoff.clear(&self.cache);
    }
}
