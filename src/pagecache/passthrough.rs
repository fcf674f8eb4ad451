//! Reads that pass the cache by: a read miss whose data will not be read
//! again before it would be evicted (`reuse`'s rule: a sequential stream
//! of a file larger than the cache, or a read that asked,
//! [`ReadFlags::NOREUSE`](super::ReadFlags::NOREUSE), or a file advised
//! `NoReuse`) is read from the backend without filling a frame, evicting
//! anything or leaving anything behind: a read of 128 KiB or more straight
//! into the caller's buffer (one copy, the kernel's for a file backend), a
//! smaller one from the file's ring (`ring`: one backend read per 256 KiB,
//! then a copy out of a buffer the CPU's cache holds), as PostgreSQL reads
//! a large scan through a 256 KB ring.
//!
//! Owns the read itself ([`FileShared::pass_by`], the first step of
//! `read_at`'s locked path) and its counters (`passthrough_pages`,
//! `passthrough_bytes`).
//!
//! Invariants (what a reader is promised does not change):
//! - only pages no folio covers are read this way: a cached folio (dirty,
//!   under writeback, being filled, or clean) is always the source of its
//!   pages, through the cache's paths;
//! - the bytes read are kept only if no write to the backend was in flight
//!   at any moment of the read ([`BackendWrites`](super::inode::BackendWrites)):
//!   with no folio covering a page and no backend write in flight, the
//!   backend holds the page's current bytes (a clean page leaves the cache
//!   only after its last write finished), so the read returns what a
//!   read through the cache at the moment of its lookup would have, never
//!   a torn page; otherwise the pages are read through the cache as any
//!   miss is;
//! - bytes past what the backend holds (inside the file's size: written
//!   past the backend's end, not yet written back) read as zeros, as a
//!   miss fills them;
//! - a change behind the cache that the cache is told of (`revalidate`,
//!   `revalidate_range`, `refresh_len`) counts as a backend write
//!   ([`FileShared::backend_changed`]): the ring is never served from
//!   bytes read before it;
//! - a backend error is the read's error, and nothing is cached for it,
//!   as on any miss.
//!
//! A backend that reads nothing ahead by itself (one that asks for a
//! readahead window, [`Backend::readahead_max`](crate::backend::Backend::readahead_max):
//! an `O_DIRECT` file) would sit idle under a synchronous read per request:
//! there the stream is read ahead into folios as any (windows of at most a
//! sixteenth of the capacity), flagged `DROPBEHIND` (the kernel's
//! `PG_dropbehind`), and each leaves the cache as soon as its reader has
//! read it to its end, with a shadow as an eviction leaves
//! ([`FileShared::drop_behind`]): a small ring of folios, one copy by the
//! CPU (the device writes the folio), the rest of the cache untouched.

use super::inode::FileShared;
use super::reuse::Clocks;
use super::ring::RING_BYTES;
use super::stats::bump;
use crate::filemap::{Folio, FolioFlags, MemWrite, PAGE_SIZE};
use crate::{pin, EntryRef};
use std::io;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;

/// The most pages one read passes by at once (a larger request loops).
const MAX_PAGES: u64 = 256;

/// Where a read miss's bytes come from ([`FileShared::pass_by`]).
pub(crate) enum Pass {
    /// Through the cache, as any miss.
    Cache,
    /// Read straight into the caller's buffer: this many bytes.
    Read(usize),
    /// Through folios read ahead and dropped behind the reader.
    DropBehind,
}

impl FileShared {
    /// The cache's clocks now, for the rule.
    #[inline]
    pub(crate) fn reuse_clocks(&self) -> Clocks {
        Clocks {
            passed: self
                .cache
                .counters
                .passthrough_pages
                .load(crate::sync::Ordering::Relaxed),
            evicted: self.cache.workingset.clock(),
            capacity: self.cache.capacity_pages(),
        }
    }

    /// The backend changed behind the cache (`revalidate` and friends):
    /// counted as a backend write, so that no read passing the cache by
    /// in flight now keeps its bytes, nor is the ring served again.
    pub(crate) fn backend_changed(&self) {
        drop(self.backend_writes.begin());
    }

    /// Whether this file's misses may pass by (no lock, two loads): the
    /// rule's quick test.
    #[inline]
    pub(crate) fn may_pass(&self, explicit: bool) -> bool {
        self.reuse.may_pass(
            explicit,
            self.cache.config.passthrough,
            self.len().div_ceil(PAGE),
            self.cache.capacity_pages(),
        )
    }

    /// The first step of `read_at`'s locked path for the bytes `pos..end`
    /// (going to `out`): if the rule passes the miss at `pos` by, read the
    /// pages from `pos` on that no folio covers (at most [`MAX_PAGES`],
    /// not past `end`) from the backend into `out` and return how many
    /// bytes that was ([`Pass::Read`]; over a backend that reads nothing
    /// ahead, [`Pass::DropBehind`]); [`Pass::Cache`] to go on through the
    /// cache (a folio there, the rule admits it, or a backend write
    /// overlapped the read). `explicit`: the read asked
    /// ([`ReadFlags::NOREUSE`](super::ReadFlags::NOREUSE)).
    ///
    /// # Errors
    /// The backend's read error (nothing is cached for it).
    #[inline]
    pub(crate) fn pass_by(
        &self,
        pos: u64,
        end: u64,
        out: &mut [u8],
        explicit: bool,
    ) -> io::Result<Pass> {
        if !self.may_pass(explicit) {
            return Ok(Pass::Cache);
        }
        self.pass_by_slow(pos, end, out, explicit)
    }

    #[cold]
    #[inline(never)]
    fn pass_by_slow(&self, pos: u64, end: u64, out: &mut [u8], explicit: bool) -> io::Result<Pass> {
        let size = self.len();
        let end = end.min(size);
        if pos >= end {
            return Ok(Pass::Cache);
        }
        let first = pos / PAGE;
        let size_pages = size.div_ceil(PAGE);
        let auto = self.cache.config.passthrough;
        let step = self.reuse.step(first);
        let cap = self.cache.capacity_pages();
        if !self.reuse.wants(step, explicit, auto, size_pages, cap) {
            return Ok(Pass::Cache);
        }
        // Taken before the lookups: a write that finished after it and
        // before the read began is seen below as one that overlapped.
        let finished = self.backend_writes.finished();
        let last = (end - 1) / PAGE;
        let mut n = 0;
        {
            let guard = pin();
            while first + n <= last && n < MAX_PAGES {
                if let Some(EntryRef::Item(_)) = self.mapping.pages().load(first + n, &guard) {
                    break;
                }
                n += 1;
            }
        }
        if n == 0 {
            return Ok(Pass::Cache);
        }
        if !self.reuse.pass(first, n, step, self.reuse_clocks()) {
            return Ok(Pass::Cache);
        }
        if self.reads_ahead {
            return Ok(Pass::DropBehind);
        }
        let to = end.min((first + n) * PAGE);
        let len = (to - pos) as usize;
        let out = &mut out[..len];
        let got = if len < RING_BYTES / 2 {
            match self.ring_read(out, pos, size, finished)? {
                Some(got) => got,
                None => return Ok(Pass::Cache),
            }
        } else {
            let got = self.read_backend(out, pos, size)?;
            // Past the backend's end inside the file: zeros, as a miss
            // fills.
            out[got..].fill(0);
            if !self.backend_writes.none_since(finished) {
                // A write to the backend overlapped the read: its bytes may
                // be older than a folio written meanwhile, or torn. Read
                // through the cache instead.
                return Ok(Pass::Cache);
            }
            len
        };
        let c = &self.cache.counters;
        bump(
            &c.passthrough_pages,
            (pos + got as u64).div_ceil(PAGE) - first,
        );
        bump(&c.passthrough_bytes, got as u64);
        Ok(Pass::Read(got))
    }

    /// A small read passing the cache by (`out`, at `pos` of a file of
    /// `size` bytes, its pages looked up uncached after `finished` backend
    /// writes had finished), served from the file's ring: from what the
    /// ring holds if no backend write started since it was filled, the
    /// rest after filling it again from the page where its bytes end (one
    /// backend read of [`RING_BYTES`]). Returns the bytes copied (all of
    /// `out`), or `None` when a backend write overlapped a fill.
    ///
    /// Why the ring's bytes are the page's: no folio covers the page now
    /// (looked up) and no backend write began since the ring was filled,
    /// so nothing changed the page since (a folio that was dirty then has
    /// been written back since, or is still cached).
    fn ring_read(
        &self,
        out: &mut [u8],
        pos: u64,
        size: u64,
        finished: u64,
    ) -> io::Result<Option<usize>> {
        let mut ring = self.ring.lock();
        let mut done = 0;
        while done < out.len() {
            let at = pos + done as u64;
            let held = ring.get(at, out.len() - done);
            if !held.is_empty() && self.backend_writes.none_since(ring.writes) {
                out[done..done + held.len()].copy_from_slice(held);
                done += held.len();
                continue;
            }
            let start = at / PAGE * PAGE;
            let len = (size - start).min(RING_BYTES as u64) as usize;
            ring.fill(start, len, finished, |buf| {
                let got = self.read_backend(buf, start, size)?;
                // Past the backend's end inside the file: zeros, as a miss
                // fills.
                buf[got..].fill(0);
                Ok::<(), io::Error>(())
            })?;
            if !self.backend_writes.none_since(finished) {
                // A write to the backend overlapped the fill: its bytes
                // may be older than a folio written meanwhile, or torn.
                ring.clear();
                return Ok(None);
            }
        }
        Ok(Some(done))
    }

    /// A reader copied folio `f` (locked by `w`, `DROPBEHIND`) up to byte
    /// `read_to`: once that is its end, drop it from the cache as an
    /// eviction does (a shadow in its place, the workingset's clock
    /// moved), if it is clean and nothing pins it; else reclaim deals with
    /// it (it rotates such folios, never promotes them).
    pub(crate) fn drop_behind(
        self: &Arc<Self>,
        f: &Arc<Folio>,
        w: &mut MemWrite<'_>,
        read_to: usize,
    ) {
        if read_to < w.len()
            || f.test(FolioFlags::DIRTY)
            || f.test(FolioFlags::WRITEBACK)
            || w.is_pinned()
        {
            return;
        }
        let nr = f.nr_pages();
        let bytes = w.len() as u64;
        let shadow = self.cache.workingset.eviction(nr, false);
        let index = f.index();
        self.detach(f, w, Some(shadow));
        // The shadow-only nodes it leaves are the workingset's to trim.
        self.cache
            .workingset
            .note_shadow(self.id, &Arc::downgrade(self), index);
        let c = &self.cache.counters;
        bump(&c.passthrough_pages, nr);
        bump(&c.passthrough_bytes, bytes);
    }
}
