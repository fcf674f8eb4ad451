//! The read side's access pattern: whether a handle's reads run forward
//! through the file (a full scan, an index range: SQLite reads the B-tree's
//! leaves in order, with the odd interior or overflow page between them)
//! or jump about (point lookups), and the readahead hint that goes with it.
//!
//! Owns [`Pattern`] (one per open handle, no locks: a handle is used by one
//! connection at a time) and [`advise`], the one place the VFS hands a hint
//! to the page cache. Invariants: a hint is given only when the pattern
//! changes (a scan costs one call, not one per page), and a hint never
//! changes what a read returns, only what the cache reads ahead.

use kxarray::pagecache::{Advice, CachedFile};
use std::io;
use std::path::Path;

/// How far past the previous read's end a read still continues a forward
/// run (SQLite's leaves of one table are in order, but interior and
/// overflow pages, and other tables' pages, sit between them).
const GAP: u64 = 16 * 4096;

/// Forward reads in a row after which the handle reads sequentially.
const SEQ_AFTER: u32 = 4;

/// Reads in a row off the run after which a sequential handle is random
/// again.
const RANDOM_AFTER: u32 = 8;

/// How far ahead of a sequential reader the handle keeps reads submitted
/// (`WillNeed`), on top of the cache's own readahead window, at most
/// (see [`Pattern::new`]).
pub(crate) const AHEAD: u64 = 8 << 20;

/// The least a `WillNeed` asks for (one call per this many bytes read).
const AHEAD_STEP: u64 = 2 << 20;

/// A hint for the cache's readahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Reads run forward: read ahead early and far.
    Sequential,
    /// Back to the cache's own detection.
    Normal,
    /// Bytes `offset..offset + len` will be read soon: submit their reads.
    WillNeed(u64, u64),
}

/// One handle's recent reads.
#[derive(Debug, Default)]
pub(crate) struct Pattern {
    /// Where the previous read ended.
    next: u64,
    /// Forward reads in a row.
    run: u32,
    /// Reads in a row off the run.
    off_run: u32,
    /// The hint in force.
    sequential: bool,
    /// Where the reads submitted ahead end (sequential only).
    ahead: u64,
    /// Bytes kept submitted ahead of a sequential reader (0: none).
    run_ahead: u64,
}

impl Pattern {
    /// A pattern that, while sequential, also keeps `run_ahead` bytes of
    /// reads submitted ahead of the reader ([`Pattern::ahead`]; 0: none).
    /// The VFS passes [`AHEAD`] or an eighth of the cache's capacity,
    /// whichever is less, over `O_DIRECT`, so that what is read ahead is
    /// not evicted before the reader gets there.
    pub(crate) fn new(run_ahead: u64) -> Pattern {
        Pattern {
            run_ahead,
            ..Pattern::default()
        }
    }

    /// While sequential (and running ahead): the range to submit now so
    /// that reads stay `run_ahead` bytes ahead of the last read, in steps
    /// of at least [`AHEAD_STEP`] (or a quarter of `run_ahead`).
    #[inline]
    pub(crate) fn ahead(&mut self) -> Option<Hint> {
        if !self.sequential || self.run_ahead == 0 {
            return None;
        }
        let step = AHEAD_STEP.min(self.run_ahead / 4).max(1);
        let from = self.ahead.max(self.next);
        let to = self.next.saturating_add(self.run_ahead);
        if to < from.saturating_add(step) {
            return None;
        }
        self.ahead = to;
        Some(Hint::WillNeed(from, to - from))
    }

    /// Whether the handle's reads run forward now (a scan).
    #[inline]
    pub(crate) fn is_sequential(&self) -> bool {
        self.sequential
    }

    /// Note a read of `len` bytes at `off`; the hint to give now, if the
    /// pattern changed.
    #[inline]
    pub(crate) fn on_read(&mut self, off: u64, len: u64) -> Option<Hint> {
        let forward = off >= self.next && off - self.next <= GAP && self.next > 0;
        self.next = off.saturating_add(len);
        if forward {
            self.run = self.run.saturating_add(1);
            self.off_run = 0;
            if !self.sequential && self.run >= SEQ_AFTER {
                self.sequential = true;
                return Some(Hint::Sequential);
            }
        } else {
            self.run = 0;
            self.off_run = self.off_run.saturating_add(1);
            if self.sequential && self.off_run >= RANDOM_AFTER {
                self.sequential = false;
                self.ahead = 0;
                return Some(Hint::Normal);
            }
        }
        None
    }
}

/// Hand `hint` to the page cache's readahead
/// ([`CachedFile::advise`]: `Sequential` doubles the file's largest
/// readahead window; `Normal` gives it back; `WillNeed` submits the
/// range's reads and returns). The hint is the file's, for
/// every handle on it, as `posix_fadvise` on a shared open file is.
///
/// # Errors
/// The cache's error for the advice.
pub(crate) fn advise(file: &CachedFile, hint: Hint) -> io::Result<()> {
    match hint {
        Hint::Sequential => file.advise(0, 0, Advice::Sequential),
        Hint::Normal => file.advise(0, 0, Advice::Normal),
        Hint::WillNeed(off, len) => file.advise(off, len, Advice::WillNeed),
    }
}

/// [`advise`] each hint a handle's read found, logging (at
/// `SQLITE_NOTICE`) the ones the cache refused: out of line, so that a read
/// that gives none pays two checks.
#[cold]
#[inline(never)]
pub(crate) fn give(file: &CachedFile, path: &Path, hints: [Option<Hint>; 2]) {
    for hint in hints.into_iter().flatten() {
        if let Err(e) = advise(file, hint) {
            crate::sqlite::process::api().log(
                crate::sqlite::ffi::SQLITE_NOTICE,
                &format!("kxarray: readahead hint for {}: {e}", path.display()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    fn hints(p: &mut Pattern, pages: &[u64]) -> Vec<(u64, Hint)> {
        pages
            .iter()
            .filter_map(|&i| p.on_read(i * P, P).map(|h| (i, h)))
            .collect()
    }

    #[test]
    fn a_scan_is_sequential_once_with_interior_pages_between_leaves() {
        let mut p = Pattern::default();
        // Root, interior, then leaves in order with interior pages between.
        let scan = [1, 2, 3, 4, 5, 6, 9, 10, 11, 30, 12, 13, 14];
        let h = hints(&mut p, &scan);
        assert_eq!(h, vec![(5, Hint::Sequential)], "one hint per scan");
        // Leaves continue forward with small gaps: no new hint.
        assert!(hints(&mut p, &[16, 17, 20, 21, 22]).is_empty());
    }

    #[test]
    fn point_lookups_stay_normal_and_a_scan_ending_goes_back() {
        let mut p = Pattern::default();
        assert!(hints(&mut p, &[900, 3, 5000, 17, 100, 2, 7000, 40]).is_empty());
        let h = hints(&mut p, &[500, 501, 502, 503, 504]);
        assert_eq!(h, vec![(504, Hint::Sequential)]);
        // Random again: Normal after RANDOM_AFTER reads off the run.
        let h = hints(&mut p, &[9000, 3, 7000, 1, 5000, 200, 8000, 30, 6000]);
        assert_eq!(h, vec![(30, Hint::Normal)]);
    }

    #[test]
    fn a_sequential_reader_keeps_reads_submitted_ahead_in_steps() {
        let mut p = Pattern::new(AHEAD);
        assert_eq!(p.ahead(), None, "not sequential yet");
        hints(&mut p, &[0, 1, 2, 3, 4]);
        let first = p.ahead();
        assert_eq!(first, Some(Hint::WillNeed(5 * P, AHEAD)));
        assert_eq!(p.ahead(), None, "nothing new to submit");
        // A step later, the next range starts where the last one ended.
        let pages = AHEAD_STEP / P;
        let upto: Vec<u64> = (5..5 + pages).collect();
        hints(&mut p, &upto);
        assert_eq!(p.ahead(), Some(Hint::WillNeed(5 * P + AHEAD, AHEAD_STEP)));
        // Off the pattern: no more submissions.
        hints(&mut p, &[90_000, 3, 70_000, 1, 50_000, 200, 80_000, 30]);
        assert_eq!(p.ahead(), None);
        let mut q = Pattern::new(0);
        hints(&mut q, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(q.ahead(), None, "running ahead is off");
        // A small budget: small steps, never more than the budget ahead.
        let mut r = Pattern::new(64 * P);
        hints(&mut r, &[0, 1, 2, 3, 4]);
        assert_eq!(r.ahead(), Some(Hint::WillNeed(5 * P, 64 * P)));
        hints(&mut r, &(5..21).collect::<Vec<_>>());
        assert_eq!(r.ahead(), Some(Hint::WillNeed(69 * P, 16 * P)));
    }

    #[test]
    fn a_backward_read_breaks_a_run() {
        let mut p = Pattern::default();
        assert!(hints(&mut p, &[10, 11, 12, 5, 13, 14, 15]).is_empty());
    }
}
