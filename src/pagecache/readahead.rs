//! Readahead's window (`mm/readahead.c`): when a read miss looks
//! sequential, a window of folios past it is read at once, and a marker
//! folio (`READAHEAD`, the kernel's `PG_readahead`) inside it makes the
//! reader that touches it submit the next, larger window while it goes on.
//!
//! Owns one file's readahead state (the kernel's `file_ra_state`: `start`,
//! `size`, `async_size`, plus the last miss) and the hints that steer it
//! ([`Advice`]). It only plans: which pages to read and where the marker
//! goes; `fill` allocates, publishes and submits the folios.
//!
//! Invariants: a window never ends past the file's end nor grows past the
//! maximum; random misses (neither the page after the last miss nor inside
//! the current window) leave the state alone and read one page; the marker
//! lies inside the window it belongs to.

use crate::sync::Lock;

/// The default maximum window: 128 KiB, the kernel's `VM_READAHEAD_PAGES`.
pub const DEFAULT_READAHEAD_BYTES: u64 = 128 * 1024;

/// Access-pattern hints for a range of a file, as `posix_fadvise(2)` takes
/// them ([`CachedFile::advise`](super::CachedFile::advise)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// No particular pattern: readahead as the misses suggest, up to the
    /// file's maximum window (`POSIX_FADV_NORMAL`); ends
    /// [`NoReuse`](Advice::NoReuse).
    Normal,
    /// Sequential reads expected: the maximum window doubles
    /// (`POSIX_FADV_SEQUENTIAL`; the kernel doubles `ra_pages`).
    Sequential,
    /// Random reads expected: no readahead, each miss reads its own pages
    /// (`POSIX_FADV_RANDOM`), and no scan to detect: the file's misses
    /// pass the cache by only when asked ([`NoReuse`](Advice::NoReuse)).
    Random,
    /// The range will be read soon: its reads are submitted now and the
    /// call returns without waiting (`POSIX_FADV_WILLNEED`).
    WillNeed,
    /// The range will not be read again soon: its clean, unused folios are
    /// dropped from the cache (`POSIX_FADV_DONTNEED`; dirty ones stay).
    DontNeed,
    /// The file's data will be read once (`POSIX_FADV_NOREUSE`, which
    /// Linux applies to the whole file): from now on, until
    /// [`Normal`](Advice::Normal), a `read_at` that misses reads the pages
    /// no folio holds from the backend without a frame (into the caller's
    /// buffer, or through the file's ring)
    /// and keeps nothing, as
    /// [`ReadFlags::NOREUSE`](super::ReadFlags::NOREUSE) does for one
    /// read; cached pages are still served from the cache, and a page read
    /// again within the workingset's distance is admitted.
    NoReuse,
}

/// The pages one readahead submits: `start..end`, with the marker on the
/// folio holding page `mark` (`None`: no marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) mark: Option<u64>,
    /// The stream passes the cache by: each folio leaves it once read
    /// (`FolioFlags::DROPBEHIND`).
    pub(crate) drop_behind: bool,
}

struct State {
    /// The current window (`ra->start`, `ra->size`, `ra->async_size`).
    start: u64,
    size: u64,
    async_size: u64,
    /// The page after the last miss that read alone (a random-looking
    /// miss): the next miss there starts a window.
    next_miss: u64,
    /// The maximum window in pages (the backend's, or what the user set).
    max_pages: u64,
    /// The hint in force (`Random` turns readahead off; `Sequential`
    /// doubles the maximum).
    advice: Advice,
    /// The current stream's folios are dropped behind its reader (its
    /// windows are then at most a quarter of `limit`).
    drop_behind: bool,
}

impl State {
    /// The largest window now: the maximum (doubled under `Sequential`)
    /// within `limit` pages (at least 4); `None` under `Random`.
    fn max(&self, limit: u64) -> Option<u64> {
        let max = match self.advice {
            Advice::Random => return None,
            Advice::Sequential => self.max_pages * 2,
            _ => self.max_pages,
        };
        Some(max.min(limit.max(4)))
    }
}

/// One file's readahead state.
pub(crate) struct Readahead(Lock<State>);

/// The first window of a sequential stream (`get_init_ra_size`): the
/// request rounded up to a power of two, x4 when small, x2 when medium,
/// else the maximum.
fn init_size(req: u64, max: u64) -> u64 {
    let n = req.max(1).next_power_of_two();
    if n <= max / 32 {
        n * 4
    } else if n <= max / 4 {
        n * 2
    } else {
        max
    }
    .min(max)
}

/// The window after one of `cur` pages (`get_next_ra_size`): x4 while
/// small, x2 up to half the maximum, then the maximum.
fn next_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        cur * 4
    } else if cur <= max / 2 {
        cur * 2
    } else {
        max
    }
    .clamp(1, max.max(1))
}

impl Readahead {
    /// A file's state, with a maximum window of `max_bytes`.
    pub(crate) fn new(max_bytes: u64) -> Self {
        Readahead(Lock::new(State {
            start: 0,
            size: 0,
            async_size: 0,
            next_miss: 0,
            max_pages: (max_bytes / 4096).max(1),
            advice: Advice::Normal,
            drop_behind: false,
        }))
    }

    /// Set the maximum window (bytes; at least a page).
    pub(crate) fn set_max_bytes(&self, bytes: u64) {
        self.0.lock().max_pages = (bytes / 4096).max(1);
    }

    /// The maximum window in bytes (the hint's doubling not included).
    pub(crate) fn max_bytes(&self) -> u64 {
        self.0.lock().max_pages * 4096
    }

    /// Record a hint (`Normal`, `Sequential` or `Random`; the others act on
    /// a range and change nothing here).
    pub(crate) fn advise(&self, a: Advice) {
        if matches!(a, Advice::Normal | Advice::Sequential | Advice::Random) {
            self.0.lock().advice = a;
        }
    }

    /// A read miss at page `index` of a read of `req` pages, in a file of
    /// `size_pages` pages, windows of at most `limit` pages (a quarter of
    /// the cache's capacity, so a small cache does not evict a window
    /// before it is read) (`page_cache_sync_ra`): the window to submit if
    /// the miss is sequential (the first page of the file, the page after
    /// the last miss, or inside or just past the current window), `None`
    /// for a random one (read the page alone).
    pub(crate) fn on_miss(
        &self,
        index: u64,
        req: u64,
        size_pages: u64,
        limit: u64,
        drop_behind: bool,
    ) -> Option<Window> {
        let mut s = self.0.lock();
        let in_window = s.size > 0 && index >= s.start && index <= s.start + s.size;
        // A miss inside a stream that drops its folios behind goes on doing
        // so (its reader mostly finds folios read ahead: few misses).
        let drop_behind = drop_behind || (in_window && s.drop_behind);
        let limit = if drop_behind { limit / 4 } else { limit };
        let max = s.max(limit)?;
        if index != 0 && index != s.next_miss && !in_window {
            s.next_miss = index + req.max(1);
            return None;
        }
        if index >= size_pages {
            return None;
        }
        // A miss inside (or at the end of) the current window: its reads
        // were lost (evicted before the reader came, or failed): go on with
        // the next size rather than ramp up again from a small window.
        let size = if in_window {
            next_size(s.size, max).max(init_size(req, max))
        } else {
            init_size(req, max)
        };
        s.start = index;
        s.size = size;
        s.async_size = size.saturating_sub(req.max(1));
        s.next_miss = index + size;
        s.drop_behind = drop_behind;
        Some(clip(&s, size_pages))
    }

    /// A reader touched the marker folio at `index`, `nr` pages, windows of
    /// at most `limit` pages (`page_cache_async_ra`): the next window, larger, whose first folio
    /// carries the next marker. `None` when there is nothing left to read.
    pub(crate) fn on_marker(
        &self,
        index: u64,
        nr: u64,
        size_pages: u64,
        limit: u64,
    ) -> Option<Window> {
        let mut s = self.0.lock();
        let limit = if s.drop_behind { limit / 4 } else { limit };
        let max = s.max(limit)?;
        let expected = s.start + s.size - s.async_size;
        let next = s.start + s.size;
        if s.size > 0 && (index == expected || (index <= next && next < index + nr.max(1))) {
            // The stream we planned: the window after the current one.
            s.start = next;
            s.size = next_size(s.size, max);
        } else {
            // A marker of an older window, or another reader's: restart
            // from the page after this folio.
            s.start = index + nr.max(1);
            s.size = next_size(nr.max(1), max);
        }
        s.async_size = s.size;
        s.next_miss = s.start + s.size;
        if s.start >= size_pages {
            return None;
        }
        Some(clip(&s, size_pages))
    }
}

/// The current window, cut at the end of the file; the marker on its page
/// `start + size - async_size` (when it lies inside).
fn clip(s: &State, size_pages: u64) -> Window {
    let end = (s.start + s.size).min(size_pages);
    let mark = s.start + s.size - s.async_size;
    Window {
        start: s.start,
        end,
        mark: (mark < end && s.async_size > 0).then_some(mark),
        drop_behind: s.drop_behind,
    }
}

impl Readahead {
    /// The stream's next windows drop their folios behind the reader (the
    /// stream now passes the cache by), at most a quarter of the size.
    pub(crate) fn drop_behind(&self) {
        self.0.lock().drop_behind = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_grow_as_the_kernels_do() {
        // 4 KiB reads, 128 KiB maximum (32 pages).
        let ra = Readahead::new(DEFAULT_READAHEAD_BYTES);
        let w = ra.on_miss(0, 1, 1 << 20, u64::MAX, false).unwrap();
        assert_eq!(
            w,
            Window {
                start: 0,
                end: 4,
                mark: Some(1),
                drop_behind: false,
            }
        );
        let w = ra.on_marker(1, 1, 1 << 20, u64::MAX).unwrap();
        assert_eq!(
            w,
            Window {
                start: 4,
                end: 12,
                mark: Some(4),
                drop_behind: false,
            }
        );
        let w = ra.on_marker(4, 1, 1 << 20, u64::MAX).unwrap();
        assert_eq!(
            w,
            Window {
                start: 12,
                end: 28,
                mark: Some(12),
                drop_behind: false,
            }
        );
        let w = ra.on_marker(12, 1, 1 << 20, u64::MAX).unwrap();
        assert_eq!((w.start, w.end), (28, 60), "capped at 32 pages");
        let w = ra.on_marker(28, 1, 1 << 20, u64::MAX).unwrap();
        assert_eq!((w.start, w.end), (60, 92));
    }

    #[test]
    fn random_misses_read_alone_and_a_second_sequential_one_starts_a_window() {
        let ra = Readahead::new(DEFAULT_READAHEAD_BYTES);
        assert_eq!(ra.on_miss(1000, 1, 1 << 20, u64::MAX, false), None);
        assert_eq!(ra.on_miss(5, 1, 1 << 20, u64::MAX, false), None);
        let w = ra.on_miss(6, 1, 1 << 20, u64::MAX, false).unwrap();
        assert_eq!(w.start, 6);
        assert_eq!(
            ra.on_miss(7000, 1, 1 << 20, u64::MAX, false),
            None,
            "a jump reads alone"
        );
        // A miss inside the window (its folios were evicted) goes on with
        // a larger window.
        let w = ra.on_miss(8, 1, 1 << 20, u64::MAX, false).unwrap();
        assert_eq!((w.start, w.end), (8, 16), "{w:?}");
    }

    #[test]
    fn windows_stop_at_the_end_of_the_file_and_advice_steers_them() {
        let ra = Readahead::new(DEFAULT_READAHEAD_BYTES);
        let w = ra.on_miss(0, 1, 2, u64::MAX, false).unwrap();
        assert_eq!((w.start, w.end), (0, 2));
        assert_eq!(
            ra.on_marker(1, 1, 2, u64::MAX),
            None,
            "nothing past the end"
        );
        ra.advise(Advice::Random);
        assert_eq!(ra.on_miss(0, 1, 100, u64::MAX, false), None);
        ra.advise(Advice::Sequential);
        let w = ra.on_miss(0, 64, 1 << 20, u64::MAX, false).unwrap();
        assert_eq!(w.end, 64, "the maximum doubled to 64 pages");
        ra.advise(Advice::Normal);
        let w = ra.on_miss(0, 64, 1 << 20, u64::MAX, false).unwrap();
        assert_eq!(w.end, 32);
        let w = ra.on_miss(0, 64, 1 << 20, 16, false).unwrap();
        assert_eq!(w.end, 16, "a small cache's limit");
    }
}
