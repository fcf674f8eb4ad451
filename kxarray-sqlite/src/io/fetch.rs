//! The pages one handle lent SQLite through `xFetch` ([`Fetches`]): the
//! references behind the pointers handed out, and the hot pages the handle
//! holds between fetches so that fetching them again costs no shared write.
//!
//! A fresh fetch takes a [`FolioRef`] from
//! [`CachedFile::read_folio`]: it raises a count on the page's buffer, a
//! cache line every connection's thread writes, and SQLite fetches a
//! B-tree's root and interior pages on every statement. So a page SQLite
//! fetches again soon after releasing it (its offset is in `seen`, a small
//! table of recently released pages: a second touch) is kept, with its
//! folio ([`HeldFolio`]), in `hot`, a set-associative table; a fetch of a
//! hot page checks [`HeldFolio::is_current`] (two loads of lines only
//! writers write) and counts the loan in the entry, in the handle's own
//! memory.
//!
//! Invariants:
//! - every pointer handed out points into a reference this table owns, in
//!   `out` or in a hot entry whose `lent` count includes it, until the
//!   [`unfetch`](Fetches::unfetch) of that very pointer (or
//!   [`release_all`](Fetches::release_all), `xUnfetch(NULL)`, which SQLite
//!   calls only when it holds no page): an entry with loans is never dropped or replaced, only marked
//!   stale; so the bytes stay valid and unchanged while SQLite reads them;
//! - a hot entry is served only if [`HeldFolio::is_current`] says so at
//!   that fetch, so a page written, truncated or invalidated since (by any
//!   connection, thread or process) is never served from it; a stale entry
//!   is never served again and goes when its last loan does;
//! - nothing here writes shared memory on a hot fetch or its release.

use kxarray::pagecache::{CachedFile, FolioRef, HeldFolio};
use std::os::raw::c_void;

/// The page size of the cache's folios.
const PAGE: i64 = kxarray::filemap::PAGE_SIZE as i64;

/// Sets of the hot table (a power of two) and entries per set: 256 pages
/// (1 MiB of 4 KiB pages) at most per handle, the B-tree pages near the
/// roots of a database of a few GB.
const SETS: usize = 64;
const WAYS: usize = 4;

/// Slots of the second-touch table (a power of two).
const SEEN: usize = 256;

/// A page lent out of a fresh reference: its offset, the pointer, and the
/// reference that keeps the bytes there.
struct Out {
    off: i64,
    ptr: *const c_void,
    page: FolioRef,
}

/// A hot page: SQLite's page at `off` is `ptr`, inside `page`.
struct Hot {
    off: i64,
    ptr: *const c_void,
    /// Bytes from `ptr` to the end of the folio (a fetch of more falls
    /// back).
    room: i64,
    page: HeldFolio,
    /// Pointers handed out from this entry and not yet released.
    lent: u32,
    /// Fetched since the replacement clock last passed (second chance).
    used: bool,
    /// No longer current: never served again, dropped with its last loan.
    stale: bool,
}

/// The fetched and hot pages of one handle (see the module notes).
pub(crate) struct Fetches {
    out: Vec<Out>,
    hot: Box<[Option<Hot>]>,
    /// Entries in `hot`.
    nr_hot: usize,
    /// Offsets of recently released pages, by hash (`-1`: none).
    seen: Box<[i64]>,
}

impl std::fmt::Debug for Fetches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetches")
            .field("out", &self.out.len())
            .field("hot", &self.nr_hot)
            .finish()
    }
}

/// The set of a page's offset (Fibonacci hashing: SQLite's page offsets are
/// multiples of its page size).
#[inline]
fn set_of(off: i64) -> usize {
    ((off as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & (SETS - 1)
}

/// The second-touch slot of a page's offset.
#[inline]
fn seen_of(off: i64) -> usize {
    ((off as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize & (SEEN - 1)
}

/// Where SQLite's page at `off`, `amt` bytes, lies in `page`: its bytes
/// there (and after, to the folio's end), or `None` when it is not wholly
/// inside.
#[inline]
fn locate(page: &FolioRef, off: i64, amt: i64) -> Option<&[u8]> {
    let start = off - page.index() as i64 * PAGE;
    if start < 0 || start + amt > page.len() as i64 {
        return None;
    }
    Some(&page[start as usize..])
}

/// Ask the CPU to bring `bytes` into its cache: SQLite is about to search
/// the page (its header, its cell pointers, then cells here and there), a
/// chain of dependent loads where the copy path (`xRead`) streams the page
/// in order and the hardware prefetcher runs ahead. Issued together, the
/// lines arrive in parallel.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint: it changes no memory and no state
        // of the program, and faults on nothing; SSE is part of x86_64's
        // baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

impl Fetches {
    pub(crate) fn new() -> Fetches {
        // `hot` and `seen` are allocated at their first use: a journal's,
        // a WAL's or a handle that never lends costs nothing at open.
        Fetches {
            out: Vec::new(),
            hot: Box::default(),
            nr_hot: 0,
            seen: Box::default(),
        }
    }

    /// A pointer to `amt` bytes of `file` at `off` that stay valid and
    /// unchanged until [`unfetch`](Fetches::unfetch) of it; `None` when no
    /// one pointer covers them (a read error, a page straddling two folios,
    /// past the end of the file): SQLite then reads with `xRead`. With
    /// the pointer, whether it came from a hot page.
    #[inline]
    pub(crate) fn fetch(
        &mut self,
        file: &CachedFile,
        off: i64,
        amt: i64,
    ) -> Option<(*mut c_void, bool)> {
        if self.nr_hot > 0 {
            if let Some(p) = self.fetch_hot(off, amt) {
                return Some((p, true));
            }
        }
        let page = file.read_folio((off / PAGE) as u64).ok()?;
        let bytes = locate(&page, off, amt)?;
        prefetch(&bytes[..amt as usize]);
        let ptr = bytes.as_ptr().cast::<c_void>();
        self.out.push(Out { off, ptr, page });
        Some((ptr.cast_mut(), false))
    }

    /// A loan from the hot entry of `off`, if it is current.
    #[inline]
    fn fetch_hot(&mut self, off: i64, amt: i64) -> Option<*mut c_void> {
        let set = set_of(off) * WAYS;
        for i in set..set + WAYS {
            let Some(h) = &mut self.hot[i] else { continue };
            if h.off != off || h.stale {
                continue;
            }
            if h.page.is_current() {
                if amt > h.room {
                    return None;
                }
                h.lent += 1;
                h.used = true;
                return Some(h.ptr.cast_mut());
            }
            // Written, truncated or invalidated since: never again.
            h.stale = true;
            if h.lent == 0 {
                self.hot[i] = None;
                self.nr_hot -= 1;
            }
            return None;
        }
        None
    }

    /// Release the pointer `ptr` SQLite fetched at `off` (nothing if it
    /// handed out no such pointer). A page released twice in a short
    /// while becomes hot.
    #[inline]
    pub(crate) fn unfetch(&mut self, file: &CachedFile, off: i64, ptr: *const c_void) {
        if self.nr_hot > 0 {
            let set = set_of(off) * WAYS;
            for i in set..set + WAYS {
                let Some(h) = &mut self.hot[i] else { continue };
                if h.off == off && h.ptr == ptr && h.lent > 0 {
                    h.lent -= 1;
                    if h.stale && h.lent == 0 {
                        self.hot[i] = None;
                        self.nr_hot -= 1;
                    }
                    return;
                }
            }
        }
        // The reference behind this very pointer: another cursor may hold
        // the same page from another buffer.
        let Some(i) = self.out.iter().rposition(|o| o.ptr == ptr && o.off == off) else {
            return;
        };
        let o = self.out.swap_remove(i);
        if self.seen.is_empty() {
            self.seen = vec![-1; SEEN].into_boxed_slice();
        }
        let s = seen_of(off);
        if self.seen[s] == off {
            self.admit(file, o);
        } else {
            self.seen[s] = off;
        }
    }

    /// Make the released page `o` hot, if it is still current and its set
    /// has an entry without loans to give (second chance: one not fetched
    /// since the clock last passed first).
    #[cold]
    fn admit(&mut self, file: &CachedFile, o: Out) {
        if self.hot.is_empty() {
            self.hot = (0..SETS * WAYS).map(|_| None).collect();
        }
        let set = set_of(o.off) * WAYS;
        if self.hot[set..set + WAYS]
            .iter()
            .flatten()
            .any(|h| h.off == o.off && !h.stale)
        {
            return; // hot already (from another buffer that is current)
        }
        let mut victim = None;
        for i in set..set + WAYS {
            match &mut self.hot[i] {
                None => {
                    victim = Some(i);
                    break;
                }
                Some(h) if h.lent == 0 => {
                    if !h.used && victim.is_none() {
                        victim = Some(i);
                    }
                    h.used = false;
                }
                Some(_) => {}
            }
        }
        let victim = victim.or_else(|| {
            (set..set + WAYS).find(|&i| self.hot[i].as_ref().is_none_or(|h| h.lent == 0))
        });
        let Some(i) = victim else { return };
        let Ok(page) = file.hold(o.page) else { return };
        let Some(room) = locate(&page, o.off, 1).map(|b| b.len() as i64) else {
            return;
        };
        if self.hot[i].is_none() {
            self.nr_hot += 1;
        }
        self.hot[i] = Some(Hot {
            off: o.off,
            ptr: o.ptr,
            room,
            page,
            lent: 0,
            used: false,
            stale: false,
        });
    }

    /// Drop the hot pages without loans whose folio overlaps pages
    /// `first..last` of the file, before this handle writes there (a held
    /// reference would make the write copy the folio).
    #[inline]
    pub(crate) fn forget(&mut self, first: u64, last: u64) {
        if self.nr_hot != 0 {
            self.forget_hot(first, last);
        }
    }

    /// [`Fetches::forget`] when some page is hot.
    fn forget_hot(&mut self, first: u64, last: u64) {
        for slot in self.hot.iter_mut() {
            if let Some(h) = slot {
                let (i, n) = (h.page.index(), 1u64 << h.page.order());
                if h.lent == 0 && i < last && i + n > first {
                    *slot = None;
                    self.nr_hot -= 1;
                }
            }
        }
    }

    /// Drop the hot pages without loans (fetching stops, the file is
    /// truncated).
    pub(crate) fn forget_all(&mut self) {
        self.forget(0, u64::MAX);
    }

    /// SQLite holds no fetched page (`xUnfetch(NULL)`: it does so when it
    /// sees another connection's commit, before it reads again): drop the
    /// fresh references and the stale hot pages, and keep the current hot
    /// pages for the next fetches, which check each again.
    pub(crate) fn release_all(&mut self) {
        self.out.clear();
        for slot in self.hot.iter_mut() {
            if let Some(h) = slot {
                h.lent = 0;
                if h.stale || !h.page.is_current() {
                    *slot = None;
                    self.nr_hot -= 1;
                }
            }
        }
    }

    /// Drop everything (close).
    pub(crate) fn clear(&mut self) {
        self.out.clear();
        self.hot.iter_mut().for_each(|s| *s = None);
        self.nr_hot = 0;
        self.seen.fill(-1);
    }

    /// Whether any pointer handed out is not released yet.
    pub(crate) fn any_lent(&self) -> bool {
        !self.out.is_empty() || self.hot.iter().flatten().any(|h| h.lent > 0)
    }

    /// Pointers handed out and not yet released (for tests).
    #[cfg(test)]
    fn lent(&self) -> usize {
        self.out.len()
            + self
                .hot
                .iter()
                .flatten()
                .map(|h| h.lent as usize)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxarray::backend::RamDisk;
    use kxarray::pagecache::{CacheConfig, PageCache};

    const P: i64 = 4096;

    fn file(pages: u64) -> CachedFile {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let f = cache.open(RamDisk::new(pages * P as u64)).unwrap();
        for i in 0..pages {
            f.write_at(&[i as u8; P as usize], i * P as u64).unwrap();
        }
        f
    }

    /// The first byte at a pointer handed out.
    fn first(p: *const c_void) -> u8 {
        // SAFETY: the tests read pointers they have not released yet,
        // which point to at least one byte (a page).
        unsafe { *p.cast::<u8>() }
    }

    /// Fetch and release `off` twice: the page is hot then.
    fn make_hot(t: &mut Fetches, f: &CachedFile, off: i64) {
        for _ in 0..2 {
            let p = t.fetch(f, off, P).unwrap().0;
            t.unfetch(f, off, p);
        }
        assert_eq!(t.nr_hot, 1, "a second touch makes it hot");
    }

    #[test]
    fn a_hot_page_is_served_without_a_new_reference_while_current() {
        let f = file(4);
        let mut t = Fetches::new();
        make_hot(&mut t, &f, P);
        let (p, held) = t.fetch(&f, P, P).unwrap();
        let q = t.fetch(&f, P, P).unwrap().0;
        assert!(held);
        assert_eq!(
            (p, t.out.len(), t.lent()),
            (q, 0, 2),
            "lent from the hot entry"
        );
        t.unfetch(&f, P, p);
        t.unfetch(&f, P, q);
        assert_eq!(t.lent(), 0);
        assert_eq!(t.nr_hot, 1);
    }

    #[test]
    fn a_hot_page_written_by_another_handle_is_never_served() {
        let f = file(4);
        let other = f.clone();
        let mut t = Fetches::new();
        make_hot(&mut t, &f, 2 * P);
        let held = t.fetch(&f, 2 * P, P).unwrap().0;
        other.write_at(&[9; 8], 2 * P as u64).unwrap();
        assert_eq!(first(held), 2, "a loan keeps its bytes");
        let p = t.fetch(&f, 2 * P, P).unwrap().0;
        assert_eq!(first(p), 9, "the write is seen at once");
        assert_ne!(p, held);
        // The stale entry stays for its loan, and is never served.
        assert_eq!((t.nr_hot, t.out.len()), (1, 1));
        t.unfetch(&f, 2 * P, held);
        assert_eq!(t.nr_hot, 0, "dropped with its last loan");
        assert_eq!(first(p), 9);
        t.unfetch(&f, 2 * P, p);
        assert_eq!(t.lent(), 0);
    }

    #[test]
    fn a_hot_page_truncated_or_invalidated_is_never_served() {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let dir = tempfile::tempdir().unwrap();
        let f = cache
            .open(kxarray::backend::FileBackend::create(&dir.path().join("a")).unwrap())
            .unwrap();
        f.write_at(&[1; 4 * P as usize], 0).unwrap();
        f.sync().unwrap();
        let mut t = Fetches::new();
        make_hot(&mut t, &f, P);
        // Another process wrote the file: the cache is invalidated.
        std::fs::write(dir.path().join("a"), vec![7u8; 4 * P as usize]).unwrap();
        f.revalidate().unwrap();
        let p = t.fetch(&f, P, P).unwrap().0;
        assert_eq!((first(p), t.nr_hot), (7, 0), "the stale entry went");
        t.unfetch(&f, P, p);
        let p = t.fetch(&f, P, P).unwrap().0;
        assert_eq!((first(p), t.out.len()), (7, 0), "hot again, new bytes");
        t.unfetch(&f, P, p);
        f.set_len(P as u64).unwrap();
        assert!(t.fetch(&f, P, P).is_none(), "past the end now");
        assert_eq!(t.nr_hot, 0);
    }

    #[test]
    fn unfetch_matches_the_pointer() {
        let f = file(4);
        let other = f.clone();
        let mut t = Fetches::new();
        make_hot(&mut t, &f, 0);
        // Two loans of page 0 from two buffers: one hot, one fresh.
        let a = t.fetch(&f, 0, P).unwrap().0;
        other.write_at(&[5; 1], 0).unwrap();
        let b = t.fetch(&f, 0, P).unwrap().0;
        assert_ne!(a, b);
        // Releasing `b` leaves `a` lent, and the reverse.
        t.unfetch(&f, 0, b);
        assert_eq!((first(a), t.lent()), (0, 1));
        let c = t.fetch(&f, 0, P).unwrap().0;
        t.unfetch(&f, 0, a);
        assert_eq!((first(c), t.lent()), (5, 1));
        t.unfetch(&f, 0, c);
        // An unknown pointer releases nothing.
        let d = t.fetch(&f, P, P).unwrap().0;
        t.unfetch(&f, P, c);
        assert_eq!(t.lent(), 1);
        t.unfetch(&f, P, d);
        assert_eq!(t.lent(), 0);
    }

    #[test]
    fn entries_with_loans_are_never_replaced_or_forgotten() {
        let f = file(2048);
        let mut t = Fetches::new();
        // Lend a hot page, then make many others hot, write its folio, and
        // forget: its bytes stay.
        make_hot(&mut t, &f, 0);
        let p = t.fetch(&f, 0, P).unwrap().0;
        for i in 1..2048 {
            for _ in 0..2 {
                let q = t.fetch(&f, i * P, P).unwrap().0;
                t.unfetch(&f, i * P, q);
            }
        }
        assert!(t.nr_hot <= SETS * WAYS);
        assert!(t.nr_hot > SETS * WAYS / 2);
        t.forget_all();
        assert_eq!(t.nr_hot, 1, "only the lent entry stays");
        assert_eq!(first(p), 0);
        assert_eq!(t.lent(), 1);
        t.unfetch(&f, 0, p);
        t.forget(0, 1);
        assert_eq!(t.nr_hot, 0);
    }

    #[test]
    fn release_all_keeps_the_current_hot_pages_only() {
        let f = file(4);
        let other = f.clone();
        let mut t = Fetches::new();
        make_hot(&mut t, &f, 0);
        for _ in 0..2 {
            let p = t.fetch(&f, P, P).unwrap().0;
            t.unfetch(&f, P, p);
        }
        let _ = t.fetch(&f, 0, P).unwrap();
        let _ = t.fetch(&f, 3 * P, P).unwrap();
        other.write_at(&[4; 1], P as u64).unwrap();
        t.release_all();
        assert_eq!((t.lent(), t.nr_hot), (0, 1), "page 1 was written");
        let (p, held) = t.fetch(&f, 0, P).unwrap();
        assert!(held);
        t.unfetch(&f, 0, p);
        let (p, held) = t.fetch(&f, P, P).unwrap();
        assert_eq!((first(p), held), (4, false));
        t.unfetch(&f, P, p);
    }

    #[test]
    fn a_page_straddling_two_folios_or_past_the_end_falls_back() {
        let f = file(2);
        let mut t = Fetches::new();
        assert!(t.fetch(&f, P / 2, P).is_none(), "across two folios");
        assert!(t.fetch(&f, 2 * P, P).is_none(), "past the end");
        assert_eq!(t.lent(), 0);
    }
}
