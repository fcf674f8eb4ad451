//! A cached file's shared state, `FileShared` (the kernel's
//! `struct address_space` with the parts of its inode a page cache uses):
//! the address space, the backend, the size, the writeback lock, the error
//! sequence, the readahead window and the per-block state, and the one
//! operation every other part needs: taking a folio out of the file.
//!
//! Sits below the file operations (`file`), writeback (`writeback`),
//! reclaim and the LRU, which all work on it; it imports none of them.
//!
//! Invariants:
//! - `size` changes only under `size_lock` (and, when shrinking, under
//!   `wb_lock` too, so writeback never writes past a size truncation
//!   removed);
//! - a folio leaves the address space only through [`FileShared::detach`],
//!   under its lock, after `DETACHED` is set; its block state and its dirty
//!   bytes go with it;
//! - every write to the backend (a writeback pass, a write-through, a
//!   length change) is counted in [`BackendWrites`] before it starts and
//!   after it ends, so a read that passed the cache by (`passthrough`)
//!   can tell whether one overlapped it;
//! - the pieces of a large folio split by a revalidation are
//!   published under `split_lock`, which every path that drops pages
//!   because the backend changed (`revalidate`, `revalidate_range`,
//!   `refresh_len`) holds, so none of them can finish between a split's
//!   detach and its pieces' publication. Lock order: `split_lock`, then
//!   `wb_lock`, then `size_lock`, then folio locks.

use super::blocks::{BlockMap, Dirtied};
use super::errseq::ErrSeq;
use super::fill_state::FillCtx;
use super::options::{FileOptions, OpenError};
use super::readahead::Readahead;
use super::retry::Backoff;
use super::reuse::Reuse;
use super::ring::Ring;
use super::stats::{bump, drop_gauge};
use super::CacheInner;
use crate::backend::Backend;
use crate::filemap::{AddressSpace, Folio, FolioFlags, MemWrite, Shadow};
use crate::sync::{AtomicU64, Lock, Ordering};
use std::io;
use std::sync::Arc;

/// A folio buffer that could not be allocated, as an I/O error (`ENOMEM`).
pub(crate) fn oom(e: crate::filemap::AllocError) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, e)
}

/// The writes to a file's backend, counted as a sequence: `started` before
/// one begins, `finished` after it ends (both only grow). A reader that
/// took `finished` before it read the backend and finds `started` equal to
/// it afterwards knows that no write was in flight at any moment of its
/// read (every write that had started by its end had finished by its
/// start): the bytes it read are the backend's, whole.
#[derive(Default)]
pub(crate) struct BackendWrites {
    started: AtomicU64,
    finished: AtomicU64,
}

/// One backend write in progress ([`BackendWrites::begin`]); counted as
/// finished when dropped.
pub(crate) struct BackendWrite<'a>(&'a BackendWrites);

impl BackendWrites {
    /// A write to the backend begins; it ends when the guard is dropped.
    pub(crate) fn begin(&self) -> BackendWrite<'_> {
        self.started.fetch_add(1, Ordering::SeqCst);
        BackendWrite(self)
    }

    /// The writes finished so far: taken before a read of the backend.
    #[inline]
    pub(crate) fn finished(&self) -> u64 {
        self.finished.load(Ordering::SeqCst)
    }

    /// Whether no write started since `finished` was taken (and none was
    /// in flight then): checked after a read of the backend.
    #[inline]
    pub(crate) fn none_since(&self, finished: u64) -> bool {
        crate::sync::fence(Ordering::SeqCst);
        self.started.load(Ordering::SeqCst) == finished
    }
}

impl Drop for BackendWrite<'_> {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// The state shared by every handle of one file.
pub(crate) struct FileShared {
    pub(crate) id: u64,
    /// The fork generation of the process that opened it: in a child,
    /// its pages are the parent's (`demand`).
    pub(crate) generation: u64,
    pub(crate) cache: Arc<CacheInner>,
    pub(crate) mapping: AddressSpace,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) size: AtomicU64,
    pub(crate) size_lock: Lock<()>,
    /// Writeback of this file, one pass at a time, and the buffer its runs
    /// are copied into (kept from pass to pass).
    pub(crate) wb_lock: Lock<Vec<u8>>,
    /// `revalidate_range`, one call at a time: a large folio's pieces are
    /// published after it left the index, and a second call finding the
    /// index empty there must not return before they are (it would leave
    /// a piece of a page it was told changed). Taken before any folio lock.
    pub(crate) split_lock: Lock<()>,
    pub(crate) errseq: ErrSeq,
    /// Folios whose last backend write failed, and when to retry them.
    pub(crate) backoff: Backoff,
    /// When the file first became dirty since its last writeback
    /// ([`CacheInner::now_ms`]), 0 when clean.
    pub(crate) dirtied_at: AtomicU64,
    pub(crate) ra: Readahead,
    /// Failed fills and async readers waiting for fills (`fill`).
    pub(crate) fills: Arc<FillCtx>,
    /// Per-block uptodate and dirty state.
    pub(crate) blocks: BlockMap,
    /// Dirty and read-modify-write whole folios (the baseline mode).
    pub(crate) whole_folio: bool,
    /// Order of the folios a write allocates on a miss.
    pub(crate) write_order: u32,
    /// The backend refuses writes ([`Backend::is_read_only`]): so does
    /// every write to the file, when it is made.
    pub(crate) read_only: bool,
    /// Whether the backend asks for a readahead window (it reads nothing
    /// ahead by itself: `O_DIRECT`); its reads do not pass the cache by.
    pub(crate) reads_ahead: bool,
    /// The writes to the backend in progress and done (`passthrough`).
    pub(crate) backend_writes: BackendWrites,
    /// Reads that pass the cache by: the hint, the stream, the pages
    /// passed by recently (`passthrough`).
    pub(crate) reuse: Reuse,
    /// Small reads that pass the cache by are served from here.
    pub(crate) ring: Ring,
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
        let reads_ahead = backend.readahead_max().is_some();
        let ra_max = backend
            .readahead_max()
            .unwrap_or(super::readahead::DEFAULT_READAHEAD_BYTES);
        let read_only = backend.is_read_only();
        Ok(FileShared {
            id,
            generation: crate::fork::generation(),
            cache,
            mapping: AddressSpace::new(),
            backend,
            size: AtomicU64::new(len),
            size_lock: Lock::new(()),
            wb_lock: Lock::new(Vec::new()),
            split_lock: Lock::new(()),
            errseq: ErrSeq::new(),
            backoff: Backoff::new(),
            dirtied_at: AtomicU64::new(0),
            ra: Readahead::new(ra_max),
            fills: FillCtx::new(),
            blocks: BlockMap::new(shift),
            whole_folio: opts.whole_folio,
            write_order,
            read_only,
            reads_ahead,
            backend_writes: BackendWrites::default(),
            reuse: Reuse::new(),
            ring: Ring::new(),
        })
    }

    /// The refusal of a write to a file whose backend is read-only.
    #[inline]
    pub(crate) fn writable(&self) -> io::Result<()> {
        if self.read_only {
            Err(crate::backend::ReadOnly::error(None))
        } else {
            Ok(())
        }
    }

    /// The file's size in bytes.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Fill `buf` from the backend at `pos`, reading no further than
    /// `size`; the rest stays as it is. Returns the bytes read (fewer than
    /// asked for when the backend ends early). Short reads and `EINTR` are
    /// retried.
    pub(crate) fn read_backend(&self, buf: &mut [u8], pos: u64, size: u64) -> io::Result<usize> {
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
        Ok(done)
    }

    /// Book what marking blocks of a folio dirty did (flag, tag, gauge,
    /// file age, and `OWNER_PRIV` when every block is dirty). The caller
    /// holds its lock.
    pub(crate) fn mark_dirty(&self, f: &Folio, d: Dirtied) {
        if d.all {
            f.set(FolioFlags::OWNER_PRIV);
        }
        if d.bytes == 0 && f.test(FolioFlags::DIRTY) {
            return;
        }
        self.cache.counters.dirty_bytes.add(d.bytes);
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

    /// The bytes of a locked folio a change of `from..to` dirties: those,
    /// or in whole-folio mode the whole folio.
    #[inline]
    pub(crate) fn dirty_span(&self, w: &MemWrite<'_>, from: usize, to: usize) -> (usize, usize) {
        if self.whole_folio {
            (0, w.len())
        } else {
            (from, to)
        }
    }

    /// Remove a folio whose lock the caller holds (`w`), leaving `shadow`,
    /// and drop its bytes (pins keep theirs).
    pub(crate) fn detach(&self, f: &Arc<Folio>, w: &mut MemWrite<'_>, shadow: Option<Shadow>) {
        f.set(FolioFlags::DETACHED);
        self.cache.lru.lock().forget(f);
        if self.mapping.remove_folio(f, shadow) {
            drop_gauge(&self.cache.nr_cached, f.nr_pages());
        }
        f.clear(FolioFlags::DIRTY);
        self.cache.counters.dirty_bytes.sub(self.blocks.forget(f));
        self.backoff.forget(&self.cache, f.index());
        self.fills.forget(f);
        w.release();
    }
}
