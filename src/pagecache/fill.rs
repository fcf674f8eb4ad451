//! Filling folios with reads in flight: the folios of a readahead window,
//! of a batch of misses (`read_many`) or of an async read are allocated,
//! published locked and not uptodate, and their reads submitted together
//! ([`Backend::read_many`](crate::backend::Backend::read_many)); each
//! read's completion (on the engine's thread, or at once for a backend
//! without one) publishes the bytes, sets `UPTODATE` and unlocks.
//!
//! Owns [`FillBuf`], the I/O buffer of a fill: the folio's new buffer
//! (private until the completion publishes it) with the folio's lock and a
//! reference to the folio, and `FillCtx`, a file's record of failed fills
//! and the wakers of async readers waiting for fills.
//!
//! Invariants:
//! - from submission to completion a folio being filled is locked (its
//!   lock handed to the fill: [`RawFill`]), not uptodate, flagged
//!   `LOCKED`, and referenced by its `FillBuf`, which the engine owns; so
//!   nothing can free, reuse or publish the bytes the kernel writes,
//!   whatever callers do (a reader waits on the folio's lock; reclaim
//!   passes locked folios over; truncation waits for the lock);
//! - a completion that read what the file holds publishes the bytes (zero
//!   past the end of the file), sets `UPTODATE`, clears `LOCKED`, unlocks,
//!   then wakes async waiters; an error leaves the folio not uptodate,
//!   records the error for the folio, clears `LOCKED` and unlocks: the
//!   next reader that needs one of its pages removes the folio and gets
//!   the error ([`FileShared::take_failed`]), a retry reads again, readers
//!   of other pages see nothing;
//! - a `FillBuf` dropped without a completion (a backend that lost it) ends
//!   its fill as failed, with no error recorded: the next reader re-reads.
//!
//! Under loom the fill is synchronous (loom's mutex cannot be handed to
//! another thread); the protocol seen by readers is the same.

#[cfg(not(loom))]
use super::fill_state::FillCtx;
#[cfg(not(loom))]
use super::inode::oom;
use super::inode::FileShared;
use super::readahead::Window;
use super::stats::bump;
#[cfg(not(loom))]
use crate::aio::{IoBuf, IoBufMut};
#[cfg(not(loom))]
use crate::backend::ReadBuf;
use crate::filemap::{AddError, Folio, FolioFlags, PAGE_SIZE};
use std::io;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

/// The I/O buffer of one folio's fill: the folio's private new buffer
/// ([`RawFill`]), the folio's lock (held by the fill), a reference to the
/// folio, and how many of its bytes the file holds.
#[cfg(not(loom))]
pub(crate) struct FillBuf {
    folio: Arc<Folio>,
    raw: Option<crate::filemap::RawFill>,
    /// Bytes of the folio inside the file when the read was submitted.
    want: usize,
    /// Bytes the request asks for (`want` rounded up to a page: what an
    /// `O_DIRECT` backend needs).
    io_len: usize,
    ctx: Arc<FillCtx>,
}

#[cfg(not(loom))]
use crate::filemap::RawFill;

// SAFETY: the bytes are the fill's private buffer (a frame: a separate
// allocation, not inside this value), which `RawFill` owns until `end`,
// called only by `finish`/`drop` of this value; nobody else can reach them
// (never published), so the holder of this value is their only reader and
// writer; the pointer and length never change while the value exists.
#[cfg(not(loom))]
unsafe impl IoBuf for FillBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.raw
            .as_ref()
            .map_or(core::ptr::NonNull::dangling().as_ptr(), |r| r.ptr())
    }
    fn bytes_len(&self) -> usize {
        if self.raw.is_some() {
            self.io_len
        } else {
            0
        }
    }
}

// SAFETY: as above: the bytes are owned by this value alone.
#[cfg(not(loom))]
unsafe impl IoBufMut for FillBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.raw
            .as_ref()
            .map_or(core::ptr::NonNull::dangling().as_ptr(), |r| r.ptr())
    }
}

#[cfg(not(loom))]
impl FillBuf {
    /// The read finished with `res`: publish or fail, unlock, wake.
    fn finish(mut self, res: io::Result<usize>) {
        let Some(raw) = self.raw.take() else {
            return;
        };
        let filled = match res {
            // Everything the file held: the rest reads as zeros.
            Ok(n) if n >= self.want => Some(self.want),
            // Short: leave it to the reader's synchronous path, which
            // loops over short reads (no error to report).
            Ok(_) => None,
            Err(e) => {
                self.ctx.record(&self.folio, e);
                None
            }
        };
        end_fill(&self.folio, raw, filled);
        self.ctx.wake(&self.folio);
    }
}

/// End a fill: publish (`Some`) or discard, flags, unlock.
#[cfg(not(loom))]
fn end_fill(folio: &Folio, raw: RawFill, filled: Option<usize>) {
    // SAFETY: `raw` was made from this folio's lock guard (`submit`), and
    // the I/O is finished: the engine handed the buffer back (or dropped
    // it), which it does only after the kernel or its thread is done.
    let w = unsafe { raw.end(folio.mem(), filled) };
    if filled.is_some() {
        folio.set(FolioFlags::UPTODATE);
    }
    folio.clear(FolioFlags::LOCKED);
    drop(w);
}

#[cfg(not(loom))]
impl Drop for FillBuf {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            // Dropped without a completion (a backend that lost the
            // buffer): failed, nothing recorded; the next reader re-reads.
            end_fill(&self.folio, raw, None);
            self.ctx.wake(&self.folio);
        }
    }
}

/// The completion of a fill's read: hand the outcome to its `FillBuf`.
#[cfg(not(loom))]
fn complete(res: io::Result<usize>, buf: ReadBuf) {
    // Another type back means the backend dropped ours: its `Drop` ended
    // the fill.
    if let Ok(fb) = crate::aio::downcast_buf::<FillBuf>(buf) {
        fb.finish(res);
    }
}

impl FileShared {
    /// Read the folios of the pages of `wins` (each `start..end`) that are
    /// not cached, all submitted in one batch:
    /// each is allocated at the largest order (up to the cache's) that is
    /// aligned and fits, published locked and not uptodate, and their
    /// reads are submitted together; the folio holding page `win.mark`
    /// gets the `READAHEAD` marker. Returns at once (with a backend that
    /// completes as it submits, after the reads), with the folio holding
    /// page `want` if this call made it (the caller locks it: it waits for
    /// the read). A folio that cannot be added (a neighbour in the way)
    /// shrinks to order 0 or is skipped.
    ///
    /// # Errors
    /// [`io::ErrorKind::OutOfMemory`] when a folio or its buffer cannot be
    /// allocated before any read was submitted.
    pub(crate) fn submit_fills(
        self: &Arc<Self>,
        wins: &[Window],
        want: Option<u64>,
    ) -> io::Result<Option<Arc<Folio>>> {
        // Misses: what waits for one runs first, under no lock.
        self.cache.demand();
        let size = self.len();
        #[cfg(not(loom))]
        let mut reqs: Vec<(u64, ReadBuf)> = Vec::new();
        #[cfg(loom)]
        let reqs: Vec<()> = Vec::new();
        let mut added = Vec::new();
        let mut got = None;
        'windows: for win in wins {
            let end = win.end.min(size.div_ceil(PAGE));
            let mut pos = win.start;
            let mut shrink = false;
            while pos < end {
                if let Some(f) = self.cached(pos) {
                    pos = f.index() + f.nr_pages();
                    shrink = false;
                    continue;
                }
                let mut order = if shrink { 0 } else { self.cache.max_order };
                // Aligned, inside the window, and not across the marker
                // (the folio the reader asked for should not carry it).
                let crosses = |o: u32| win.mark.is_some_and(|m| pos < m && m < pos + (1u64 << o));
                while order > 0
                    && (pos.trailing_zeros() < order
                        || pos + (1u64 << order) > end
                        || crosses(order))
                {
                    order -= 1;
                }
                let folio = match Folio::new(pos, order) {
                    Ok(f) => Arc::new(f),
                    Err(e) if reqs.is_empty() => {
                        return Err(io::Error::new(io::ErrorKind::OutOfMemory, e))
                    }
                    Err(_) => break 'windows,
                };
                let w = folio.mem().lock();
                #[cfg(not(loom))]
                let raw = match w.begin_fill() {
                    Ok(r) => r,
                    Err(e) if reqs.is_empty() => return Err(oom(e)),
                    Err(_) => break 'windows,
                };
                let shadow = match self.mapping.add_folio(&folio) {
                    Ok(s) => s,
                    Err(e) => {
                        #[cfg(not(loom))]
                        // SAFETY: made from this folio's guard just above; no
                        // I/O was submitted.
                        drop(unsafe { raw.end(folio.mem(), None) });
                        #[cfg(loom)]
                        drop(w);
                        if e == AddError::Exists && order > 0 {
                            shrink = true;
                            continue;
                        }
                        if e == AddError::Exists {
                            pos += 1;
                            continue;
                        }
                        if reqs.is_empty() && got.is_none() {
                            return Err(io::Error::new(io::ErrorKind::OutOfMemory, e));
                        }
                        break 'windows;
                    }
                };
                shrink = false;
                let nr = folio.nr_pages();
                bump(&self.cache.nr_cached, nr);
                let holds = |p: Option<u64>| p.is_some_and(|p| p >= pos && p < pos + nr);
                if holds(want) {
                    self.cache.counters.misses.add(1);
                    bump(&self.cache.counters.readahead_pages, nr - 1);
                    got = Some(Arc::clone(&folio));
                } else {
                    bump(&self.cache.counters.readahead_pages, nr);
                    // Read ahead, not yet read: enter the reclaim lists
                    // referenced, as the folios the reader has just read
                    // are (reclaim promotes a referenced folio instead of
                    // evicting it), so a scan does not evict the window
                    // ahead of the reader before the pages behind it.
                    folio.set(FolioFlags::REFERENCED);
                }
                if holds(win.mark) {
                    folio.set(FolioFlags::READAHEAD);
                }
                if win.drop_behind {
                    folio.set(FolioFlags::DROPBEHIND);
                }
                let at = pos * PAGE;
                let in_file = (size.saturating_sub(at) as usize).min(folio.max_bytes());
                bump(&self.cache.counters.backend_read_bytes, in_file as u64);
                #[cfg(not(loom))]
                {
                    folio.set(FolioFlags::LOCKED);
                    let io_len = in_file.div_ceil(PAGE_SIZE) * PAGE_SIZE;
                    debug_assert!(io_len <= raw.len());
                    let buf = FillBuf {
                        folio: Arc::clone(&folio),
                        raw: Some(raw),
                        want: in_file,
                        io_len,
                        ctx: Arc::clone(&self.fills),
                    };
                    reqs.push((at, Box::new(buf)));
                }
                #[cfg(loom)]
                {
                    let mut w = w;
                    let filled = w.install(|buf, zeroed| {
                        let done = self.read_backend(buf, at, size)?;
                        if !zeroed {
                            buf[done..].fill(0);
                        }
                        Ok::<(), io::Error>(())
                    });
                    match filled {
                        Ok(()) => {
                            folio.set(FolioFlags::UPTODATE);
                        }
                        Err(crate::filemap::InstallError::Fill(e)) => self.fills.record(&folio, e),
                        Err(crate::filemap::InstallError::Alloc(_)) => {}
                    }
                    drop(w);
                }
                added.push((folio, shadow));
                pos += nr;
            }
        }
        #[cfg(not(loom))]
        if !reqs.is_empty() {
            for c in self.backend.read_many(reqs) {
                c.on_complete(complete);
            }
        }
        for (folio, shadow) in added {
            self.cache.insert_new(self, &folio, shadow);
        }
        Ok(got)
    }

    /// A cached folio that is not uptodate: wait for its fill (its lock),
    /// and if the fill failed remove the folio. Returns `Ok(true)` when
    /// the folio failed and was removed without an error recorded (the
    /// caller reads again, synchronously), `Ok(false)` when it is filled or
    /// gone (look again), `Err` with the recorded error of the failed read
    /// (taken: a retry reads again).
    pub(crate) fn take_failed(&self, f: &Arc<Folio>) -> io::Result<bool> {
        let mut w = f.mem().lock();
        if f.test(FolioFlags::UPTODATE) || f.test(FolioFlags::DETACHED) {
            return Ok(false);
        }
        // Taken before the removal, which forgets a failed folio's error.
        let failed = self.fills.take(f);
        self.detach(f, &mut w, None);
        drop(w);
        match failed {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    /// Submit reads for the pages of `offset..offset + len` (clipped to the
    /// file) that are not cached, in one batch, without waiting; the
    /// readahead window is left alone.
    ///
    /// # Errors
    /// As [`FileShared::submit_fills`].
    pub(crate) fn fetch(self: &Arc<Self>, first: u64, end: u64) -> io::Result<()> {
        let size_pages = self.len().div_ceil(PAGE);
        let end = end.min(size_pages);
        if first < end {
            self.submit_fills(
                &[Window {
                    start: first,
                    end,
                    mark: None,
                    drop_behind: false,
                }],
                None,
            )?;
        }
        Ok(())
    }

    /// The largest readahead window this file's cache allows: a quarter
    /// of its capacity, in pages.
    #[inline]
    pub(crate) fn ra_limit(&self) -> u64 {
        self.cache.capacity_pages() / 4
    }

    /// A reader reached `f`: if it carries readahead's marker, clear it
    /// and submit the next window (`page_cache_async_ra`) without waiting,
    /// unless the stream's misses pass the cache by from there on (the
    /// file no longer fits in the cache, or `noreuse`: the reader's read
    /// asked; `reuse`). A failed submission is dropped: readahead is a
    /// hint, and the reader reads what it needs itself.
    #[inline]
    pub(crate) fn touch_marker(self: &Arc<Self>, f: &Folio, noreuse: bool) {
        if f.test(FolioFlags::READAHEAD) && f.clear(FolioFlags::READAHEAD) {
            let size_pages = self.len().div_ceil(PAGE);
            let limit = self.ra_limit();
            if let Some(win) = self
                .ra
                .on_marker(f.index(), f.nr_pages(), size_pages, limit)
            {
                let mut win = win;
                if !win.drop_behind
                    && self.reuse.stop_readahead(
                        win.start,
                        noreuse,
                        self.cache.config.passthrough,
                        size_pages,
                        self.reuse_clocks(),
                    )
                {
                    if !self.reads_ahead {
                        return; // the misses from here read straight
                    }
                    // A backend that reads nothing ahead: the windows go
                    // on, dropped behind the reader.
                    self.ra.drop_behind();
                    win.drop_behind = true;
                }
                let _ = self.submit_fills(&[win], None);
            }
        }
    }

    /// The hit of `try_read_folio` on a folio carrying readahead's marker
    /// (the lock-free hit passes such folios over): submit the next window
    /// and try the hit again. `None` when the folio at `index` is not a
    /// live marker.
    #[cold]
    pub(crate) fn marker_hit(self: &Arc<Self>, index: u64) -> Option<super::folio::FolioRef> {
        let f = self.cached(index)?;
        if !super::folio::is_live(&f) || !f.test(FolioFlags::READAHEAD) {
            return None;
        }
        self.touch_marker(&f, false);
        self.folio_hit(index)
    }

    /// The first folio of pages `first..end` with a read in flight
    /// (flagged `LOCKED`), if any.
    pub(crate) fn in_flight(&self, first: u64, end: u64) -> Option<Arc<Folio>> {
        let mut pos = first;
        while pos < end {
            match self.cached(pos) {
                Some(f) => {
                    if f.test(FolioFlags::LOCKED) {
                        return Some(f);
                    }
                    pos = f.index() + f.nr_pages();
                }
                None => pos += 1,
            }
        }
        None
    }
}
