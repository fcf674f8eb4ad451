//! Tag-driven writeback (`write_cache_pages` / `writeback_iter`): tag the
//! range's `DIRTY` folios `TOWRITE`, then write the dirty blocks of every
//! `TOWRITE` folio under `WRITEBACK`, merging adjacent dirty blocks (inside
//! a folio and across neighbouring folios) into one backend write.
//!
//! Owns the writeback pass of one file. The unit of dirty state is the
//! block ([`BlockMap`](super::blocks::BlockMap)); a run is a byte range of
//! consecutive dirty blocks, clamped to the file's size; a clean block
//! between two dirty ones ends a run, and so does [`MAX_RUN`].
//!
//! Invariants:
//! - one pass per file at a time (the file's writeback lock), so two passes
//!   never write the same folio out of order and truncation never races a
//!   write past the new end;
//! - a folio's dirty blocks are copied into the run and their bits cleared
//!   under the folio's lock (writers of the folio wait, lock-free readers
//!   and pins do not), so a write either lands before the copy or dirties
//!   its blocks again after it (the kernel's `set_page_writeback_keepwrite`
//!   case): never lost; the bytes move from the dirty gauge to the
//!   writeback gauge, the new count booked first;
//! - on a backend error exactly the blocks of the failed run are dirty
//!   again before their folios' `WRITEBACK` clears (reclaim never sees them
//!   clean), and the error is recorded in the file's error sequence
//!   (`mapping_set_error`);
//! - a folio whose last write failed is left alone until its retry time
//!   by every pass but an asked-for one ([`Mode::Wait`]): the backoff
//!   (`retry`) is kept by the settling of the runs;
//! - the runs go to the backend's submission side, many in flight
//!   ([`WriteQueue`](super::write_queue)), and the pass returns (and lets
//!   go of the writeback lock) only once every one of them completed and
//!   was settled, in order: a `sync` that follows a pass, or waits for the
//!   lock behind one, flushes after every write the pass started.

use super::inode::FileShared;
use super::stats::bump;
use super::write_queue::{Part, Run, WriteQueue};
use crate::filemap::{FolioFlags, Tag, PAGE_SIZE};
use crate::sync::Ordering;
use std::io;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;
/// Largest merged backend write.
pub(crate) const MAX_RUN: usize = 1 << 20;

/// Whether to wait for the file's writeback lock, and whether to leave
/// alone the folios whose last write failed until their retry time
/// ([`Backoff`](super::retry)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `WB_SYNC_ALL`, asked for (`sync`, `writeback_all`): wait, and try
    /// every dirty folio.
    Wait,
    /// Reclaim's `pageout` and a shrink: wait, but leave backed-off
    /// folios alone.
    Pageout,
    /// Background (the flusher, a throttled writer): skip a file whose
    /// writeback is already running, and backed-off folios.
    Background,
}

/// Write back the dirty blocks of pages `start..=end`.
///
/// # Errors
/// The first backend error (also recorded in the file's error sequence).
pub(crate) fn writeback(file: &FileShared, start: u64, end: u64, mode: Mode) -> io::Result<()> {
    let mut wb = match mode {
        Mode::Wait | Mode::Pageout => file.wb_lock.lock(),
        Mode::Background => match file.wb_lock.try_lock() {
            Some(g) => g,
            None => return Ok(()),
        },
    };
    if !file.mapping.tagged(Tag::Dirty) {
        return Ok(());
    }
    // The pass's writes to the backend, for reads that pass the cache by
    // (ended after the queue, which waits for every write it submitted).
    let _writes = file.backend_writes.begin();
    // Writers after this point set the age again.
    file.dirtied_at.store(0, Ordering::Relaxed);
    file.mapping.tag_for_writeback(start, end);
    // The runs' first buffer is the file's, kept from one pass to the
    // next under its writeback lock (a write-through SQLite journal writes
    // back after every write: no allocation per pass).
    let scratch: &mut Vec<u8> = &mut wb;
    let mut queue = WriteQueue::new(file, core::mem::take(scratch));
    let mut run = Run {
        offset: 0,
        buf: queue.buffer(),
        parts: Vec::new(),
    };
    let bs = file.blocks.block_size();
    let now = file.cache.now_ms();
    let mut skipped = false;
    for folio in file.mapping.folios_tagged(start, end, Tag::Towrite) {
        let w = folio.mem().lock();
        let data = w.bytes();
        if folio.test(FolioFlags::DETACHED) || !folio.test(FolioFlags::DIRTY) {
            continue;
        }
        if mode != Mode::Wait && !file.backoff.ready(folio.index(), now) {
            // Its last write failed: not before its retry time (a
            // failing backend is not stormed); `sync` still tries it.
            skipped = true;
            continue;
        }
        file.mapping.start_writeback(folio.index());
        let taken = file.blocks.take_dirty(&folio);
        let c = &file.cache.counters;
        let taken_bytes: usize = taken.iter().map(|(_, n)| n * bs).sum();
        // Read the size under the folio's lock: a write that extended the
        // file stored the new size before it took the lock, so its bytes
        // are inside the span.
        let base = folio.index() * PAGE;
        let in_file = file.len().saturating_sub(base).min(data.len() as u64) as usize;
        let spans: Vec<(usize, usize)> = taken
            .into_iter()
            .filter(|&(b, _)| b * bs < in_file)
            .collect();
        let nspans = spans.len();
        // The bytes move from dirty to under writeback, the new count
        // booked before the old one is lowered, so dirty plus writeback
        // (what throttling counts) never dips below what is not on disk.
        let span_bytes =
            |&(first, count): &(usize, usize)| ((first + count) * bs).min(in_file) - first * bs;
        bump(
            &c.writeback_bytes,
            spans.iter().map(span_bytes).sum::<usize>() as u64,
        );
        c.dirty_bytes.sub(taken_bytes as u64);
        if nspans == 0 {
            // Wholly past the end of the file: nothing to write.
            drop(w);
            file.mapping.end_writeback(folio.index());
            continue;
        }
        for (k, (first, count)) in spans.into_iter().enumerate() {
            let from = first * bs;
            let to = ((first + count) * bs).min(in_file);
            let pos = base + from as u64;
            let adjacent = !run.parts.is_empty()
                && run.offset + run.buf.len() as u64 == pos
                && run.buf.len() + (to - from) <= MAX_RUN;
            if run.parts.is_empty() {
                run.offset = pos;
            } else if !adjacent {
                // The run so far goes in flight; this span starts the next.
                let next = Run {
                    offset: pos,
                    buf: queue.buffer(),
                    parts: Vec::new(),
                };
                queue.push(core::mem::replace(&mut run, next));
            }
            run.buf.extend_from_slice(&data[from..to]);
            run.parts.push(Part {
                folio: Arc::clone(&folio),
                first,
                count,
                bytes: (to - from) as u64,
                last: k + 1 == nspans,
            });
        }
    }
    queue.push(run);
    // Every write of the pass completed and settled.
    let (result, buf) = queue.finish();
    *scratch = buf;
    if result.is_err() || skipped {
        // Still dirty: the flusher comes back to the file.
        let _ = file.dirtied_at.compare_exchange(
            0,
            file.cache.now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use crate::backend::Backend;
    use crate::pagecache::{CacheConfig, FileOptions, PageCache};
    use std::io;
    use std::sync::{Arc, Mutex};

    /// Records every write's (offset, length).
    #[derive(Debug, Default)]
    struct Log(Arc<Mutex<Vec<(u64, usize)>>>);

    impl Backend for Log {
        fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
            self.0.lock().unwrap().push((offset, buf.len()));
            Ok(buf.len())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(1 << 20)
        }
        fn set_len(&self, _len: u64) -> io::Result<()> {
            Ok(())
        }
    }

    fn writes_after(ranges: &[(u64, usize)], opts: FileOptions) -> Vec<(u64, usize)> {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let file = cache.open_with(Log(Arc::clone(&log)), opts).unwrap();
        for &(off, len) in ranges {
            file.write_at(&vec![1u8; len], off).unwrap();
        }
        file.sync().unwrap();
        let v = log.lock().unwrap().clone();
        v
    }

    #[test]
    fn merge_rules() {
        let o = FileOptions::default().block_size(512).folio_size(16 << 10);
        // Adjacent dirty blocks, within a folio: one write.
        assert_eq!(writes_after(&[(0, 512), (512, 512)], o), vec![(0, 1024)]);
        // A clean block between two dirty ones splits the write.
        assert_eq!(
            writes_after(&[(0, 512), (1024, 512)], o),
            vec![(0, 512), (1024, 512)]
        );
        // A partial block is written whole; its neighbour merges in.
        assert_eq!(writes_after(&[(100, 10), (600, 10)], o), vec![(0, 1024)]);
        // Adjacent dirty blocks across two neighbouring folios: one write.
        assert_eq!(
            writes_after(&[((16 << 10) - 512, 1024)], o),
            vec![((16 << 10) - 512, 1024)]
        );
        // Whole-folio mode writes the whole folio.
        assert_eq!(
            writes_after(&[(4096, 512)], o.whole_folio(true)),
            vec![(0, 16 << 10)]
        );
    }
}
