//! Changes behind the cache: the backend was written by someone else (a
//! process on the same file, a tool), so what the cache holds of it is
//! dropped or read again. `FileShared::revalidate` (the whole file),
//! `refresh_len` (its length), `revalidate_range` (a range, splitting the
//! folios that straddle it) and `invalidate` (`POSIX_FADV_DONTNEED`'s drop).
//!
//! Invariants: a dirty or under-writeback folio is never dropped (its bytes
//! are newer than the backend's); every drop holds the folio's lock and
//! sets `DETACHED` first ([`FileShared::detach`]), as every removal does
//! (see `paths`); a change behind the cache counts as a backend write, so a
//! read that passes the cache by reads again.

use super::inode::FileShared;
use super::stats::bump;
use crate::filemap::{Folio, FolioFlags, MemWrite, PAGE_SIZE};
use crate::sync::Ordering;
use std::io;
use std::ops::Range;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

impl FileShared {
    /// The backend changed behind the cache: drop every clean, idle folio
    /// and every shadow, then take the backend's length. `Err` with
    /// `ResourceBusy` (the size unchanged) when dirty or under-writeback
    /// folios remain: their bytes are newer than the backend's.
    pub(crate) fn revalidate(&self) -> io::Result<()> {
        // no split's pieces published after this forgot the file
        let _split = self.split_lock.lock();
        let _wb = self.wb_lock.lock();
        let _sz = self.size_lock.lock();
        self.backend_changed();
        let len = self.backend.len()?;
        let (folios, shadows) = self.folios_in(0, u64::MAX);
        let mut busy = 0;
        for f in folios {
            let mut w = f.mem().lock();
            if f.test(FolioFlags::DETACHED) {
                continue;
            }
            if f.test(FolioFlags::DIRTY) || f.test(FolioFlags::WRITEBACK) {
                busy += f.nr_pages();
                continue;
            }
            self.detach(&f, &mut w, None);
        }
        for i in shadows {
            self.mapping.drop_shadow(i);
        }
        if busy > 0 {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{busy} dirty pages are newer than the backend"),
            ));
        }
        self.size.store(len, Ordering::Release);
        Ok(())
    }

    /// The backend's length changed behind the cache: take it again,
    /// dropping only the clean folios from the page holding the lower of
    /// the two ends onward (past a shorter end, or holding zeros read past
    /// the old one). Returns the folios' pages dropped; `Err` with
    /// `ResourceBusy` (the size unchanged) when a folio there is dirty or
    /// under writeback.
    pub(crate) fn refresh_len(&self) -> io::Result<u64> {
        // no split's pieces published past an end after this dropped it
        let _split = self.split_lock.lock();
        let _wb = self.wb_lock.lock();
        let _sz = self.size_lock.lock();
        self.backend_changed();
        let new = self.backend.len()?;
        let old = self.len();
        if new == old {
            return Ok(0);
        }
        let (folios, shadows) = self.folios_in(old.min(new) / PAGE, u64::MAX);
        let mut dropped = 0;
        for f in folios {
            let mut w = f.mem().lock();
            if f.test(FolioFlags::DETACHED) {
                continue;
            }
            if f.test(FolioFlags::DIRTY) || f.test(FolioFlags::WRITEBACK) {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "dirty pages past the file's end are newer than the backend",
                ));
            }
            dropped += f.nr_pages();
            self.detach(&f, &mut w, None);
        }
        for i in shadows {
            self.mapping.drop_shadow(i);
        }
        self.size.store(new, Ordering::Release);
        Ok(dropped)
    }

    /// The backend's bytes in `range` changed behind the cache: drop every
    /// clean page holding a byte of it, waiting for a read in flight into
    /// its folio (the folio lock) first, since that read may have fetched
    /// the bytes from before the change. A large folio is split: its pages
    /// outside the range are published again as smaller folios holding
    /// its bytes ([`split_pieces`](FileShared::split_pieces)); `split_lock`
    /// keeps every other revalidation of the file out until they are.
    /// Returns the pages dropped and the pages of dirty or under-writeback
    /// folios left in place. One lookup per page of the range that holds
    /// no folio: for short ranges.
    pub(crate) fn revalidate_range(self: &Arc<Self>, range: Range<u64>) -> (u64, u64) {
        if range.end <= range.start {
            return (0, 0);
        }
        let (first, end) = (range.start / PAGE, range.end.div_ceil(PAGE));
        let (mut dropped, mut busy) = (0, 0);
        let mut pos = first;
        let _one_at_a_time = self.split_lock.lock();
        self.backend_changed();
        while pos < end {
            let Some(f) = self.cached(pos) else {
                pos += 1;
                continue;
            };
            // A folio published later is read later: after the change.
            let next = (f.index() + f.nr_pages()).max(pos + 1);
            // Waits for the fill that holds the lock (`fill`), so a read
            // of old bytes in flight now is dropped once it lands.
            let mut w = f.mem().lock();
            if f.test(FolioFlags::DETACHED) {
                // gone meanwhile (a failed fill removed): a folio there now
                // is read after this look
            } else if f.test(FolioFlags::DIRTY) || f.test(FolioFlags::WRITEBACK) {
                busy += f.nr_pages();
            } else {
                let pieces = self.split_pieces(&f, &w, first..end);
                self.detach(&f, &mut w, None);
                let kept = self.publish_pieces(&f, pieces);
                dropped += f.nr_pages() - kept;
            }
            pos = next;
        }
        (dropped, busy)
    }

    /// The pages of large folio `f` (locked by `w`, clean, about to be
    /// dropped for the pages `changed`) that lie outside `changed`, copied
    /// into uptodate folios not yet published, each the largest aligned
    /// block that holds no changed page: what the kernel's non-uniform
    /// `folio_split` keeps when a large folio is invalidated in part, so
    /// that a 4 KiB change does not cost its neighbours, and the pieces
    /// stay few (one per order below the folio's). Empty for an
    /// order-0 folio, a folio with blocks not uptodate (a write miss's),
    /// or when a piece cannot be allocated (the whole folio is dropped
    /// then, as before).
    fn split_pieces(&self, f: &Folio, w: &MemWrite<'_>, changed: Range<u64>) -> Vec<Arc<Folio>> {
        let nr = f.nr_pages();
        let bytes = w.bytes();
        if nr == 1
            || !f.test(FolioFlags::UPTODATE)
            || bytes.len() < (nr * PAGE) as usize
            || !self.blocks.is_uptodate(f, 0, bytes.len())
        {
            return Vec::new();
        }
        // The largest aligned blocks of the folio that hold no changed page
        // (the kernel's non-uniform `folio_split`): halves, recursively,
        // down to the changed pages, so a 16-page folio with one page
        // changed leaves pieces of 8, 4, 2 and 1 pages, not 15 of one.
        let mut blocks = Vec::new();
        let mut todo = vec![(f.index(), f.order())];
        while let Some((at, order)) = todo.pop() {
            let end = at + (1u64 << order);
            if end <= changed.start || at >= changed.end {
                blocks.push((at, order));
            } else if order > 0 {
                todo.push((at + (1u64 << (order - 1)), order - 1));
                todo.push((at, order - 1));
            }
        }
        let mut pieces = Vec::with_capacity(blocks.len());
        for (i, order) in blocks {
            let Ok(piece) = Folio::new(i, order) else {
                return Vec::new();
            };
            let at = ((i - f.index()) * PAGE) as usize;
            let src = &bytes[at..at + (PAGE_SIZE << order)];
            let filled = piece.mem().lock().install(|buf, _| {
                buf.copy_from_slice(src);
                Ok::<(), ()>(())
            });
            if filled.is_err() {
                return Vec::new();
            }
            piece.set(FolioFlags::UPTODATE);
            pieces.push(Arc::new(piece));
        }
        pieces
    }

    /// Publish the pieces [`split_pieces`](FileShared::split_pieces) made
    /// of `old` (detached now) in its place, on the reclaim list it was on.
    /// A piece whose index someone filled meanwhile (a miss after the
    /// detach, reading the backend) is left out. Returns the pages
    /// published.
    fn publish_pieces(self: &Arc<Self>, old: &Folio, pieces: Vec<Arc<Folio>>) -> u64 {
        let mut kept = 0;
        for piece in pieces {
            // (a shadow there would be someone else's drop meanwhile: not
            // a refault of ours to count)
            if self.mapping.add_folio(&piece).is_err() {
                continue;
            }
            let nr = piece.nr_pages();
            bump(&self.cache.nr_cached, nr);
            kept += nr;
            if old.test(FolioFlags::REFERENCED) {
                piece.set(FolioFlags::REFERENCED);
            }
            self.cache
                .insert_piece(self, &piece, old.test(FolioFlags::ACTIVE));
        }
        kept
    }

    pub(crate) fn invalidate(&self, range: Range<u64>) -> u64 {
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
