//! Reads that pass the cache by: a scan of a file larger than the cache is
//! read without filling a frame (large reads straight into the caller's
//! buffer, one copy; small ones through the file's 256 KiB ring, one
//! backend read per ring) while the cache keeps its hot set; dirty and cached pages are still served
//! from the cache; a write racing the scan never shows a torn page; pages
//! passed by and read again soon are admitted; the explicit hints
//! (`ReadFlags::NOREUSE`, `Advice::NoReuse`) and the switch
//! (`CacheConfig::passthrough`).

use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{Advice, CacheConfig, CacheStats, CachedFile, PageCache, ReadFlags};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

const PAGE: u64 = 4096;

/// A RAM disk that tells where each read's bytes went: into the buffer the
/// test is reading into now (one copy: the backend's, straight into the
/// caller's buffer) or anywhere else (a folio's frame: the cache's fill,
/// then a second copy out).
#[derive(Debug)]
struct Probe {
    disk: RamDisk,
    /// The caller's buffer now: `[lo, hi)` addresses.
    lo: AtomicUsize,
    hi: AtomicUsize,
    into_caller: AtomicU64,
    elsewhere: AtomicU64,
    /// Reads made.
    calls: AtomicU64,
    /// What `readahead_max` says (`Some`: the backend reads nothing ahead
    /// by itself, as an `O_DIRECT` file).
    readahead: Option<u64>,
}

impl Probe {
    fn new(pages: u64, byte: impl Fn(u64) -> u8) -> Arc<Probe> {
        let disk = RamDisk::new(pages * PAGE);
        let mut page = vec![0u8; PAGE as usize];
        for i in 0..pages {
            page.fill(byte(i));
            page[..8].copy_from_slice(&i.to_le_bytes());
            disk.write_all_at(&page, i * PAGE).unwrap();
        }
        Arc::new(Probe {
            disk,
            lo: AtomicUsize::new(0),
            hi: AtomicUsize::new(0),
            into_caller: AtomicU64::new(0),
            elsewhere: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            readahead: None,
        })
    }

    /// A probe whose backend reads nothing ahead by itself.
    fn reading_nothing_ahead(pages: u64, byte: impl Fn(u64) -> u8) -> Arc<Probe> {
        let mut p = Arc::try_unwrap(Probe::new(pages, byte)).unwrap();
        p.readahead = Some(256 << 10);
        Arc::new(p)
    }

    /// Read `buf.len()` bytes at `off` through `file`, telling the probe
    /// which buffer is the caller's.
    fn read(&self, file: &CachedFile, buf: &mut [u8], off: u64, flags: ReadFlags) -> usize {
        let p = buf.as_ptr() as usize;
        self.lo.store(p, Ordering::Relaxed);
        self.hi.store(p + buf.len(), Ordering::Relaxed);
        let n = file.read_at_with(buf, off, flags).unwrap();
        self.lo.store(0, Ordering::Relaxed);
        self.hi.store(0, Ordering::Relaxed);
        n
    }

    fn copies(&self) -> (u64, u64) {
        (
            self.into_caller.load(Ordering::Relaxed),
            self.elsewhere.load(Ordering::Relaxed),
        )
    }
}

impl Backend for Probe {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.disk.read_at(buf, offset)?;
        self.calls.fetch_add(1, Ordering::Relaxed);
        let p = buf.as_ptr() as usize;
        let (lo, hi) = (
            self.lo.load(Ordering::Relaxed),
            self.hi.load(Ordering::Relaxed),
        );
        if p >= lo && p + buf.len() <= hi {
            self.into_caller.fetch_add(n as u64, Ordering::Relaxed);
        } else {
            self.elsewhere.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.disk.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.set_len(len)
    }
    fn readahead_max(&self) -> Option<u64> {
        self.readahead
    }
}

/// The byte of the scanned file's page `i` (its first 8 bytes are `i`).
fn scan_byte(i: u64) -> u8 {
    (i.wrapping_mul(31) % 251) as u8 + 1
}

/// The byte of the hot file's page `i`.
fn hot_byte(i: u64) -> u8 {
    (i % 200) as u8 + 20
}

/// Whether `buf`, read at `off`, holds what the file made by [`Probe::new`]
/// with `byte` holds there.
fn check(buf: &[u8], off: u64, byte: impl Fn(u64) -> u8) {
    for (k, &b) in buf.iter().enumerate() {
        let at = off + k as u64;
        let (page, i) = (at / PAGE, (at % PAGE) as usize);
        let want = if i < 8 {
            page.to_le_bytes()[i]
        } else {
            byte(page)
        };
        assert_eq!(b, want, "byte {at} (page {page})");
    }
}

/// Read the whole of `file` (`probe`'s) from its start in reads of `bs`
/// bytes, checking every byte.
fn scan(probe: &Probe, file: &CachedFile, bs: usize, mut at_page: impl FnMut(u64)) {
    let len = file.len();
    let mut buf = vec![0u8; bs];
    let mut off = 0;
    while off < len {
        at_page(off / PAGE);
        let n = probe.read(file, &mut buf, off, ReadFlags::empty());
        assert_eq!(n as u64, (len - off).min(bs as u64));
        check(&buf[..n], off, scan_byte);
        off += n as u64;
    }
}

/// One round of the hot set: every page of `hot`, 4 KiB each, checked.
/// Returns the hits and misses it counted.
fn hot_round(cache: &PageCache, probe: &Probe, hot: &CachedFile) -> (u64, u64) {
    let before = cache.stats();
    let mut buf = vec![0u8; PAGE as usize];
    for i in 0..hot.len() / PAGE {
        probe.read(hot, &mut buf, i * PAGE, ReadFlags::empty());
        check(&buf, i * PAGE, hot_byte);
    }
    let after = cache.stats();
    (after.hits - before.hits, after.misses - before.misses)
}

fn config(capacity: u64) -> CacheConfig {
    CacheConfig::default().capacity(capacity).flusher(false)
}

/// The hot set's hits and misses over three rounds after two of warm-up, in
/// a cache of `capacity` that holds nothing else: what "as without the
/// scans" means.
fn hot_baseline(capacity: u64, hot_pages: u64) -> (u64, u64) {
    let cache = PageCache::new(config(capacity));
    let probe = Probe::new(hot_pages, hot_byte);
    let hot = cache.open(Arc::clone(&probe)).unwrap();
    hot_round(&cache, &probe, &hot);
    hot_round(&cache, &probe, &hot);
    let mut sum = (0, 0);
    for _ in 0..3 {
        let (h, m) = hot_round(&cache, &probe, &hot);
        sum = (sum.0 + h, sum.1 + m);
    }
    sum
}

fn hit_ratio((h, m): (u64, u64)) -> f64 {
    h as f64 / (h + m) as f64
}

/// A scan of a file four times the cache's capacity, twice, with a hot set
/// read before, between and after: the hot set keeps its hit ratio, every
/// byte of the scans is right, and their misses fill no frame: each byte
/// read from the backend once per scan, counted as passed by; reads of
/// 128 KiB or more straight into the caller's buffer (one copy), smaller
/// ones through the ring (one backend read per 256 KiB).
fn scan_twice_with_a_hot_set(bs: usize) {
    const CAP_PAGES: u64 = 256; // 1 MiB
    const HOT_PAGES: u64 = 32;
    let baseline = hot_baseline(CAP_PAGES * PAGE, HOT_PAGES);
    assert_eq!(baseline.1, 0, "the hot set fits: {baseline:?}");

    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let hot_probe = Probe::new(HOT_PAGES, hot_byte);
    let hot = cache.open(Arc::clone(&hot_probe)).unwrap();
    let probe = Probe::new(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    hot_round(&cache, &hot_probe, &hot);
    hot_round(&cache, &hot_probe, &hot);
    let s0 = cache.stats();
    let mut rounds = (0, 0);
    for pass in 0..2 {
        scan(&probe, &file, bs, |_| {});
        let (h, m) = hot_round(&cache, &hot_probe, &hot);
        rounds = (rounds.0 + h, rounds.1 + m);
        if pass == 1 {
            let (h, m) = hot_round(&cache, &hot_probe, &hot);
            rounds = (rounds.0 + h, rounds.1 + m);
        }
    }
    let s = cache.stats();
    assert_eq!(
        hit_ratio(rounds),
        hit_ratio(baseline),
        "the hot set's hits and misses: {rounds:?} with the scans, {baseline:?} without; {s:?}"
    );
    let bytes = 2 * file.len();
    let (into, elsewhere) = probe.copies();
    if bs >= 128 << 10 {
        assert_eq!(
            (into, elsewhere),
            (bytes, 0),
            "straight into the caller's buffer"
        );
    } else {
        assert_eq!(into + elsewhere, bytes, "each byte read once per scan");
        let calls = probe.calls.load(Ordering::Relaxed);
        assert_eq!(calls, bytes / (256 << 10), "one backend read per ring");
    }
    assert_eq!(file.cached_pages(), 0, "nothing of the scanned file kept");
    let d = |f: fn(&CacheStats) -> u64| f(&s) - f(&s0);
    assert_eq!(d(|s| s.passthrough_bytes), bytes);
    // (A page two reads share is counted by each.)
    let pages = d(|s| s.passthrough_pages);
    if (bs as u64).is_multiple_of(PAGE) {
        assert_eq!(pages, 2 * 4 * CAP_PAGES);
    } else {
        assert!(pages > 2 * 4 * CAP_PAGES, "{pages}");
    }
    assert_eq!(
        (
            d(|s| s.misses),
            d(|s| s.readahead_pages),
            d(|s| s.evictions)
        ),
        (0, 0, 0),
        "no frame filled, nothing evicted: {s:?}"
    );
}

#[test]
fn a_scan_four_times_the_cache_passes_it_by_in_4k_reads() {
    scan_twice_with_a_hot_set(PAGE as usize);
}

#[test]
fn a_scan_four_times_the_cache_passes_it_by_in_unaligned_reads() {
    // Reads that straddle pages (and the ring's ends) and start inside them.
    scan_twice_with_a_hot_set(3 * PAGE as usize + 100);
}

#[test]
fn a_scan_four_times_the_cache_passes_it_by_in_256k_reads() {
    scan_twice_with_a_hot_set(256 << 10);
}

/// The same while the capacity shrinks mid-scan (what the shared budget
/// does, through `set_capacity`), to half and then a quarter: still one
/// copy, every byte right, the hot set kept.
#[test]
fn a_scan_passes_the_cache_by_while_the_capacity_shrinks() {
    const CAP_PAGES: u64 = 256;
    const HOT_PAGES: u64 = 24;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let hot_probe = Probe::new(HOT_PAGES, hot_byte);
    let hot = cache.open(Arc::clone(&hot_probe)).unwrap();
    let probe = Probe::new(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    hot_round(&cache, &hot_probe, &hot);
    hot_round(&cache, &hot_probe, &hot);
    let s0 = cache.stats();
    let mut misses = 0;
    for pass in 0..2 {
        scan(&probe, &file, PAGE as usize, |page| {
            if pass == 0 && page == CAP_PAGES {
                cache.set_capacity(CAP_PAGES / 2 * PAGE).unwrap();
            }
            if pass == 0 && page == 3 * CAP_PAGES {
                cache.set_capacity(CAP_PAGES / 4 * PAGE).unwrap();
            }
        });
        misses += hot_round(&cache, &hot_probe, &hot).1;
    }
    let s = cache.stats();
    assert_eq!(misses, 0, "the hot set stayed: {s:?}");
    let (into, elsewhere) = probe.copies();
    assert_eq!(
        into + elsewhere,
        2 * file.len(),
        "each byte once per scan: {s:?}"
    );
    assert_eq!(s.misses - s0.misses, 0, "{s:?}");
    assert_eq!(s.capacity_bytes, CAP_PAGES / 4 * PAGE);
}

/// A scan that starts with the file fitting in the cache is read ahead
/// into it; once the capacity shrinks below the file mid-scan, readahead
/// stops at its next marker and the rest passes the cache by.
#[test]
fn a_scan_that_fitted_passes_the_cache_by_once_the_capacity_shrinks() {
    const CAP_PAGES: u64 = 1024; // 4 MiB
    const HOT_PAGES: u64 = 16;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let hot_probe = Probe::new(HOT_PAGES, hot_byte);
    let hot = cache.open(Arc::clone(&hot_probe)).unwrap();
    let probe = Probe::new(3 * CAP_PAGES / 4, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    hot_round(&cache, &hot_probe, &hot);
    hot_round(&cache, &hot_probe, &hot);
    let filled = |s: &CacheStats| s.misses + s.readahead_pages;
    let start = cache.stats();
    let mut at_shrink = start;
    scan(&probe, &file, PAGE as usize, |page| {
        if page == CAP_PAGES / 8 {
            at_shrink = cache.stats();
            cache.set_capacity(CAP_PAGES / 4 * PAGE).unwrap();
        }
    });
    let s = cache.stats();
    assert!(
        filled(&at_shrink) > filled(&start),
        "read ahead at first: {at_shrink:?}"
    );
    assert_eq!(at_shrink.passthrough_pages, 0);
    // After the shrink: at most the windows already in flight (readahead's
    // window is at most a quarter of the capacity) were filled; the rest
    // passed the cache by.
    let window = CAP_PAGES / 4 / 4;
    let after = filled(&s) - filled(&at_shrink);
    assert!(
        after <= 2 * window,
        "{after} pages filled after the shrink: {s:?}"
    );
    let rest = file.len() / PAGE - CAP_PAGES / 8;
    assert!(s.passthrough_pages + 2 * window >= rest, "{s:?}");
    assert_eq!(
        hot_round(&cache, &hot_probe, &hot).1,
        0,
        "the hot set stayed"
    );
}

/// Over a backend that reads nothing ahead by itself (`O_DIRECT`), a scan
/// four times the cache is read ahead into folios dropped behind the
/// reader: each byte read from the backend once per scan, the scanned
/// file holding at most a few windows at any time, the hot set kept, every
/// byte right.
#[test]
fn a_scan_over_a_backend_that_reads_nothing_ahead_drops_its_folios_behind() {
    const CAP_PAGES: u64 = 512; // 2 MiB
    const HOT_PAGES: u64 = 32;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let hot_probe = Probe::new(HOT_PAGES, hot_byte);
    let hot = cache.open(Arc::clone(&hot_probe)).unwrap();
    let probe = Probe::reading_nothing_ahead(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    hot_round(&cache, &hot_probe, &hot);
    hot_round(&cache, &hot_probe, &hot);
    let s0 = cache.stats();
    let mut most = 0;
    let mut misses = 0;
    for _ in 0..2 {
        scan(&probe, &file, PAGE as usize, |_| {
            most = most.max(file.cached_pages())
        });
        misses += hot_round(&cache, &hot_probe, &hot).1;
    }
    let s = cache.stats();
    assert_eq!(misses, 0, "the hot set stayed: {s:?}");
    let (into, elsewhere) = probe.copies();
    assert_eq!(into, 0);
    // Each byte once per scan, a window or two read again at most (a
    // window's folio evicted before its reader came).
    let bytes = 2 * file.len();
    assert!(
        elsewhere >= bytes && elsewhere <= bytes + 2 * (CAP_PAGES / 16) * PAGE,
        "{elsewhere}"
    );
    assert!(most <= CAP_PAGES / 4, "the scan held {most} pages at once");
    assert!(
        s.passthrough_pages - s0.passthrough_pages >= 2 * 4 * CAP_PAGES - 32,
        "{s:?}"
    );
    assert_eq!(s.evictions - s0.evictions, 0, "nothing else evicted: {s:?}");
}

/// Pages written and not yet written back, pages cached clean, and a page
/// written in part are read from the cache, the rest straight from the
/// backend.
#[test]
fn dirty_and_cached_pages_are_read_from_the_cache() {
    const CAP_PAGES: u64 = 64;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let probe = Probe::new(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    let dirty = [3u64, 4, 100, 255];
    for &p in &dirty {
        file.write_at(&[0xd1; PAGE as usize], p * PAGE).unwrap();
    }
    // A clean cached page holding bytes the backend does not have: the
    // backend changed behind the cache (no revalidation), so only a read
    // from the cache returns them.
    let mut b = [0u8; 1];
    file.read_at(&mut b, 50 * PAGE).unwrap();
    probe
        .disk
        .write_all_at(&[0xee; PAGE as usize], 50 * PAGE)
        .unwrap();
    // A page written in part: its other bytes come from the backend.
    file.write_at(b"partial", 200 * PAGE + 10).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    for i in 0..file.len() / PAGE {
        probe.read(&file, &mut buf, i * PAGE, ReadFlags::empty());
        if dirty.contains(&i) {
            assert!(buf.iter().all(|&x| x == 0xd1), "dirty page {i}");
        } else if i == 50 {
            check(&buf, i * PAGE, scan_byte); // the cached bytes, not 0xee
        } else if i == 200 {
            assert_eq!(&buf[10..17], b"partial");
            check(&buf[..10], i * PAGE, scan_byte);
            check(&buf[17..], i * PAGE + 17, scan_byte);
        } else {
            check(&buf, i * PAGE, scan_byte);
        }
    }
    let s = cache.stats();
    assert!(s.passthrough_pages >= 4 * CAP_PAGES - 8, "{s:?}");
    assert_eq!(s.dirty_bytes, 4 * PAGE + PAGE, "still dirty: {s:?}");
}

/// A writer rewriting whole pages of the scanned file and writing them
/// back while scans pass the cache by: every page a scan reads is one
/// version whole (never torn between two), and never older than the last
/// version whose write returned before the read began.
#[test]
fn a_scan_racing_writes_and_writeback_never_reads_a_torn_or_stale_page() {
    const CAP_PAGES: u64 = 64;
    const PAGES: u64 = 4 * CAP_PAGES;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let disk = Arc::new(RamDisk::new(PAGES * PAGE));
    let file = Arc::new(cache.open(Arc::clone(&disk)).unwrap());
    let written: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (file, written, stop) = (Arc::clone(&file), Arc::clone(&written), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut v = 1u64;
            let mut page = vec![0u8; PAGE as usize];
            while !stop.load(Ordering::Relaxed) {
                let p = v.wrapping_mul(0x9e37_79b9) % PAGES;
                page.fill(v as u8);
                page[..8].copy_from_slice(&v.to_le_bytes());
                file.write_at(&page, p * PAGE).unwrap();
                written[p as usize].fetch_max(v, Ordering::SeqCst);
                if v.is_multiple_of(8) {
                    file.sync().unwrap(); // written back: reclaim may drop them
                }
                v += 1;
            }
            v
        })
    };
    let mut buf = vec![0u8; PAGE as usize];
    let mut passes = 0;
    // the scans race the writer only once it runs (a loaded machine may
    // start its thread after a whole pass)
    while written.iter().all(|w| w.load(Ordering::SeqCst) == 0) {
        std::thread::yield_now();
    }
    while passes < 6 || cache.stats().passthrough_pages < 2 * PAGES {
        for p in 0..PAGES {
            let floor = written[p as usize].load(Ordering::SeqCst);
            file.read_at(&mut buf, p * PAGE).unwrap();
            let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert!(
                buf[8..].iter().all(|&x| x == v as u8),
                "page {p} torn: version {v} with other bytes"
            );
            assert!(
                v >= floor,
                "page {p}: version {v} read after {floor} was written"
            );
        }
        passes += 1;
        assert!(passes < 10_000, "no read passed the cache by");
    }
    stop.store(true, Ordering::Relaxed);
    let versions = writer.join().unwrap();
    let s = cache.stats();
    assert!(
        versions > 1 && s.passthrough_pages > 0,
        "{versions} versions; {s:?}"
    );
}

/// One page rewritten, written back and dropped from the cache over and
/// over while a reader reads it again and again: each read either finds
/// the folio or passes the cache by, and a pass-through read that a
/// writeback's backend write overlapped is read again through the cache,
/// so no read ever returns a page torn between two versions.
#[test]
fn a_page_rewritten_and_dropped_while_read_is_never_torn() {
    const PAGES: u64 = 64;
    let cache = PageCache::new(config(16 * PAGE));
    let disk = Arc::new(RamDisk::new(PAGES * PAGE));
    let file = Arc::new(cache.open(Arc::clone(&disk)).unwrap());
    const P: u64 = 40;
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (file, written, stop) = (Arc::clone(&file), Arc::clone(&written), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut page = vec![0u8; PAGE as usize];
            let mut v = 1u64;
            while !stop.load(Ordering::Relaxed) {
                page.fill(v as u8);
                page[..8].copy_from_slice(&v.to_le_bytes());
                file.write_at(&page, P * PAGE).unwrap();
                written.store(v, Ordering::SeqCst);
                file.sync().unwrap();
                file.invalidate(P * PAGE..(P + 1) * PAGE).unwrap();
                v += 1;
            }
            v
        })
    };
    let mut buf = vec![0u8; PAGE as usize];
    let start = std::time::Instant::now();
    let mut reads = 0u64;
    while reads < 20_000
        || (cache.stats().passthrough_pages < 1000 && start.elapsed().as_secs() < 20)
    {
        let floor = written.load(Ordering::SeqCst);
        file.read_at(&mut buf, P * PAGE).unwrap();
        let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
        assert!(
            buf[8..].iter().all(|&x| x == v as u8),
            "read {reads}: version {v} torn"
        );
        assert!(v >= floor, "read {reads}: version {v} after {floor}");
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let versions = writer.join().unwrap();
    let s = cache.stats();
    assert!(
        s.passthrough_pages > 0 && versions > 100,
        "{versions} versions; {s:?}"
    );
}

/// The backend changed behind the cache (another process wrote the file)
/// and the cache was told (`revalidate_range`, `revalidate`): the bytes the
/// ring read before are not served again.
#[test]
fn a_change_behind_the_cache_is_seen_by_reads_that_pass_it_by() {
    const CAP_PAGES: u64 = 64;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let probe = Probe::new(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    for p in 0..10 {
        probe.read(&file, &mut buf, p * PAGE, ReadFlags::empty());
        check(&buf, p * PAGE, scan_byte);
    }
    // Pages 10 and 12 are in the ring already (it read 64 pages from 0).
    probe
        .disk
        .write_all_at(&[0x77; PAGE as usize], 10 * PAGE)
        .unwrap();
    file.revalidate_range(10 * PAGE..11 * PAGE).unwrap();
    probe.read(&file, &mut buf, 10 * PAGE, ReadFlags::empty());
    assert!(buf.iter().all(|&b| b == 0x77), "revalidate_range");
    probe
        .disk
        .write_all_at(&[0x78; PAGE as usize], 12 * PAGE)
        .unwrap();
    file.revalidate().unwrap();
    probe.read(&file, &mut buf, 11 * PAGE, ReadFlags::empty());
    check(&buf, 11 * PAGE, scan_byte);
    probe.read(&file, &mut buf, 12 * PAGE, ReadFlags::empty());
    assert!(buf.iter().all(|&b| b == 0x78), "revalidate");
    assert!(cache.stats().passthrough_pages >= 12);
}

/// A page passed by and read again within the workingset's distance is
/// admitted: a range of a quarter of the capacity, scanned three times, is
/// read from the backend twice at most and hit the third time.
#[test]
fn a_range_passed_by_and_read_again_soon_is_admitted() {
    const CAP_PAGES: u64 = 256;
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let probe = Probe::new(4 * CAP_PAGES, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    let range = 300..300 + CAP_PAGES / 4;
    let mut buf = vec![0u8; PAGE as usize];
    let mut read_range = || {
        let before = cache.stats();
        for p in range.clone() {
            probe.read(&file, &mut buf, p * PAGE, ReadFlags::empty());
            check(&buf, p * PAGE, scan_byte);
        }
        let after = cache.stats();
        (
            after.passthrough_pages - before.passthrough_pages,
            after.hits - before.hits,
        )
    };
    let (passed, _) = read_range();
    assert!(
        passed >= CAP_PAGES / 4 - 2,
        "the first read passes by: {passed}"
    );
    read_range(); // read again soon: admitted
    let (passed, hits) = read_range();
    assert_eq!((passed, hits), (0, CAP_PAGES / 4), "the third read hits");
}

/// `ReadFlags::NOREUSE` and `Advice::NoReuse` pass a file that fits by;
/// `Advice::Normal` ends the advice; `CacheConfig::passthrough(false)`
/// keeps scans in the cache but not the explicit hints.
#[test]
fn noreuse_hints_pass_a_file_that_fits_by_and_the_switch_turns_scans_off() {
    let cache = PageCache::new(config(4 << 20));
    let probe = Probe::new(64, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    for p in (0..64).rev() {
        probe.read(&file, &mut buf, p * PAGE, ReadFlags::NOREUSE);
        check(&buf, p * PAGE, scan_byte);
    }
    assert_eq!(file.cached_pages(), 0);
    assert_eq!(cache.stats().passthrough_pages, 64);
    // Read again at once: within the workingset's distance, admitted.
    probe.read(&file, &mut buf, 5 * PAGE, ReadFlags::NOREUSE);
    assert!(file.cached_pages() >= 1);

    let probe2 = Probe::new(64, scan_byte);
    let other = cache.open(Arc::clone(&probe2)).unwrap();
    other.advise(0, 0, Advice::NoReuse).unwrap();
    for p in 0..64 {
        probe2.read(&other, &mut buf, p * PAGE, ReadFlags::empty());
        check(&buf, p * PAGE, scan_byte);
    }
    assert_eq!(other.cached_pages(), 0, "advised NoReuse");
    let (into, elsewhere) = probe2.copies();
    assert_eq!(into + elsewhere, 64 * PAGE);
    other.advise(0, 0, Advice::Normal).unwrap();
    probe2.read(&other, &mut buf, 40 * PAGE, ReadFlags::empty());
    assert!(other.cached_pages() > 0, "Normal ends NoReuse");

    let cache = PageCache::new(config(64 * PAGE).passthrough(false));
    let probe = Probe::new(256, scan_byte);
    let file = cache.open(Arc::clone(&probe)).unwrap();
    scan(&probe, &file, PAGE as usize, |_| {});
    assert_eq!(cache.stats().passthrough_pages, 0, "switched off");
    assert!(probe.copies().1 > 0 && file.cached_pages() > 0);
    probe.read(&file, &mut buf, 10 * PAGE, ReadFlags::NOREUSE);
    assert_eq!(cache.stats().passthrough_pages, 1, "asked for");
}

/// The same scan over a real file (`pread` from the kernel's page cache):
/// bytes right, nothing cached, every byte passed by, on either I/O
/// engine (the pass-through reads do not use it; readahead's would).
#[test]
fn a_scan_of_a_file_backend_passes_the_cache_by() {
    const CAP_PAGES: u64 = 128;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scan");
    let pages = 4 * CAP_PAGES;
    {
        let f = FileBackend::create(&path).unwrap();
        let mut page = vec![0u8; PAGE as usize];
        for i in 0..pages {
            page.fill(scan_byte(i));
            page[..8].copy_from_slice(&i.to_le_bytes());
            f.write_all_at(&page, i * PAGE).unwrap();
        }
    }
    let cache = PageCache::new(config(CAP_PAGES * PAGE));
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let file = cache.open(FileBackend::from_file(opened)).unwrap();
    let mut buf = vec![0u8; 16 << 10];
    for _ in 0..2 {
        let mut off = 0;
        while off < file.len() {
            let n = file.read_at(&mut buf, off).unwrap();
            check(&buf[..n], off, scan_byte);
            off += n as u64;
        }
    }
    let s = cache.stats();
    assert_eq!(
        (s.passthrough_bytes, s.misses, file.cached_pages()),
        (2 * pages * PAGE, 0, 0),
        "{s:?}"
    );
}
