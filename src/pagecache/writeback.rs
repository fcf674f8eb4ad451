//! Tag-driven writeback (`write_cache_pages` / `writeback_iter`): tag the
//! range's `DIRTY` folios `TOWRITE`, then write every `TOWRITE` folio under
//! `WRITEBACK`, merging runs of adjacent dirty bytes into one backend write.
//!
//! Owns the writeback pass of one file. The unit of dirty state is the
//! span list a folio reports ([`dirty_spans`]): today one span, the whole
//! folio (clamped to the file's size). Per-block dirty tracking (the next
//! issue) changes only that function and the clearing step
//! ([`Folio::clear`] of `DIRTY` becomes "clear these blocks"): runs are
//! already built from byte spans, so adjacent dirty blocks inside a folio
//! and across neighbouring folios merge the same way, and a clean block
//! between two dirty ones already splits a run.
//!
//! Invariants:
//! - one pass per file at a time (the file's writeback lock), so two passes
//!   never write the same folio out of order and truncation never races a
//!   write past the new end;
//! - a folio's bytes are copied into the run and its `DIRTY` cleared under
//!   its data lock held shared, so a write either lands before the copy or
//!   re-dirties the folio after it, never lost;
//! - on a backend error every folio of the failed run is dirty again before
//!   its `WRITEBACK` clears (reclaim never sees it clean), and the error is
//!   recorded in the file's error sequence (`mapping_set_error`).

use super::file::FileShared;
use super::stats::{bump, drop_gauge};
use crate::filemap::{Folio, FolioFlags, Tag, PAGE_SIZE};
use crate::sync::Ordering;
use std::io;
use std::sync::Arc;

const PAGE: u64 = PAGE_SIZE as u64;
/// Largest merged backend write.
pub(crate) const MAX_RUN: usize = 1 << 20;

/// Whether to wait for the file's writeback lock.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `WB_SYNC_ALL`: wait.
    Wait,
    /// Background: skip a file whose writeback is already running.
    Background,
}

/// The byte spans of `folio` (relative to the folio) that need writing, for
/// a file of `size` bytes. Whole-folio dirty state: one span.
pub(crate) fn dirty_spans(folio: &Folio, size: u64) -> Option<(usize, usize)> {
    let start = folio.index() * PAGE;
    if start >= size {
        return None;
    }
    let len = (size - start).min(folio.nr_pages() * PAGE) as usize;
    Some((0, len))
}

struct Run {
    offset: u64,
    buf: Vec<u8>,
    folios: Vec<Arc<Folio>>,
}

/// Write back the dirty folios of pages `start..=end`.
///
/// # Errors
/// The first backend error (also recorded in the file's error sequence).
pub(crate) fn writeback(file: &FileShared, start: u64, end: u64, mode: Mode) -> io::Result<()> {
    let _wb = match mode {
        Mode::Wait => file.wb_lock.lock(),
        Mode::Background => match file.wb_lock.try_lock() {
            Some(g) => g,
            None => return Ok(()),
        },
    };
    if !file.mapping.tagged(Tag::Dirty) {
        return Ok(());
    }
    // Writers after this point set the age again.
    file.dirtied_at.store(0, Ordering::Relaxed);
    file.mapping.tag_for_writeback(start, end);
    let mut result = Ok(());
    let mut run = Run {
        offset: 0,
        buf: Vec::new(),
        folios: Vec::new(),
    };
    for folio in file.mapping.folios_tagged(start, end, Tag::Towrite) {
        let data = folio.data().read();
        let bytes = folio.nr_pages() * PAGE;
        if folio.test(FolioFlags::DETACHED) || !folio.test(FolioFlags::DIRTY) {
            continue;
        }
        file.mapping.start_writeback(folio.index());
        folio.clear(FolioFlags::DIRTY);
        let c = &file.cache.counters;
        drop_gauge(&c.dirty_bytes, bytes);
        bump(&c.writeback_bytes, bytes);
        // Read the size under the folio's lock: a write that extended the
        // file stored the new size before it took the lock, so its bytes
        // are inside the span.
        match dirty_spans(&folio, file.len()) {
            Some((from, to)) => {
                let pos = folio.index() * PAGE + from as u64;
                let adjacent = !run.folios.is_empty()
                    && run.offset + run.buf.len() as u64 == pos
                    && run.buf.len() + (to - from) <= MAX_RUN;
                if !adjacent {
                    finish(file, &mut run, &mut result);
                    run.offset = pos;
                }
                run.buf.extend_from_slice(&data[from..to]);
                drop(data);
                run.folios.push(folio);
            }
            None => {
                // Wholly past the end of the file: nothing to write.
                drop(data);
                end_one(file, &folio);
            }
        }
    }
    finish(file, &mut run, &mut result);
    if result.is_err() {
        let _ = file.dirtied_at.compare_exchange(
            0,
            file.cache.now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    result
}

fn end_one(file: &FileShared, folio: &Folio) {
    file.mapping.end_writeback(folio.index());
    drop_gauge(
        &file.cache.counters.writeback_bytes,
        folio.nr_pages() * PAGE,
    );
}

/// Issue the run's one backend write and end writeback of its folios.
fn finish(file: &FileShared, run: &mut Run, result: &mut io::Result<()>) {
    if run.folios.is_empty() {
        return;
    }
    let res = file.backend.write_all_at(&run.buf, run.offset);
    match &res {
        Ok(()) => bump(
            &file.cache.counters.backend_written_bytes,
            run.buf.len() as u64,
        ),
        Err(e) => file.errseq.set(e),
    }
    for folio in run.folios.drain(..) {
        if res.is_err() {
            // Dirty again before writeback ends: nothing is lost.
            if !folio.set(FolioFlags::DIRTY) {
                bump(&file.cache.counters.dirty_bytes, folio.nr_pages() * PAGE);
            }
            file.mapping.mark_dirty(folio.index());
        }
        end_one(file, &folio);
    }
    run.buf.clear();
    if let Err(e) = res {
        if result.is_ok() {
            *result = Err(e);
        }
    }
}
