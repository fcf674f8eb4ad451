//! Recycled frames and the run-time capacity: a frame handed
//! out again never shows a reader its former folio's bytes; `set_capacity`
//! under concurrent readers and writers loses nothing and drops nothing
//! dirty; the statistics agree with each other and with the capacity.

mod pagecache_common;

use kxarray::backend::{Backend, RamDisk};
use kxarray::filemap::frame_stats;
use kxarray::pagecache::{CacheConfig, CapacityError, FileOptions, PageCache, MAX_CAPACITY};
use pagecache_common::MemBackend;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Free frames are process-wide: a test running beside the recycling test
/// takes the frames it dirtied off the shared lists, and the test sees
/// none of them again. The tests of this binary run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const PAGE: u64 = 4096;

/// Drive this thread's deferred frees (the evicted buffers come back to
/// its magazines when their grace periods end).
fn drive_frees() {
    for _ in 0..64 {
        kxarray::pin().flush();
        std::thread::yield_now();
    }
}

/// Fill many frames with `byte` through one file, then let them go: the
/// next misses on this thread get them back, stale. Returns the frames'
/// addresses.
fn dirty_the_frames(
    cache: &PageCache,
    pages: u64,
    byte: u8,
    opts: FileOptions,
) -> std::collections::HashSet<usize> {
    let disk = RamDisk::new(pages * PAGE);
    disk.write_all_at(&vec![byte; (pages * PAGE) as usize], 0)
        .unwrap();
    let f = cache.open_with(disk, opts).unwrap();
    // One-page folios (no readahead windows): the size class of the
    // test's one-page misses.
    f.advise(0, 0, kxarray::pagecache::Advice::Random).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    let mut frames = std::collections::HashSet::new();
    for p in 0..pages {
        f.read_at(&mut buf, p * PAGE).unwrap();
        assert!(buf.iter().all(|&b| b == byte));
        frames.insert(f.read_folio(p).unwrap().as_ptr() as usize);
    }
    drop(f); // every folio released
    drive_frees();
    frames
}

/// The part of a folio past the end of the file reads as zeroes through
/// every path (the zero-copy reference shows the whole folio), on frames
/// that held other bytes before: read misses of one page and readahead's
/// large folios, a file whose backend ends before its size, a write into
/// a new folio past the end, and a file truncated and then extended.
#[test]
fn a_recycled_frame_shows_no_stale_bytes() {
    let _serial = serial();
    let cache = PageCache::new(CacheConfig::default().capacity(8 << 20).flusher(false));
    // Folios of this test whose frame had been one of the dirtied ones
    // (a deferred free may still land on another thread, so only the
    // total is checked: the test saw recycled frames).
    let mut recycled = 0u32;
    for (round, opts) in [
        FileOptions::default(),
        FileOptions::default().folio_size(64 << 10),
    ]
    .into_iter()
    .enumerate()
    {
        // This thread's magazines emptied first, so that its next misses
        // refill from the shared lists, where the dirtied frames go.
        kxarray::filemap::trim_frames();
        let dirtied = dirty_the_frames(&cache, 256, 0xAB, opts);
        let mut seen = |r: &kxarray::pagecache::FolioRef| {
            recycled += u32::from(dirtied.contains(&(r.as_ptr() as usize)));
        };

        // A file of 5 pages and 100 bytes, read with one-page misses
        // (random order) and with readahead (in order, larger folios).
        let len = 5 * PAGE + 100;
        let disk = RamDisk::new(len);
        disk.write_all_at(&vec![0x11; len as usize], 0).unwrap();
        let f = cache.open_with(disk, opts).unwrap();
        let mut one = [0u8; 1];
        for p in [5u64, 2, 0, 4, 1, 3] {
            f.read_at(&mut one, p * PAGE).unwrap();
        }
        let tail = f.read_folio(5).unwrap();
        let at = (5 * PAGE - tail.index() * PAGE) as usize;
        assert!(tail[at..at + 100].iter().all(|&b| b == 0x11));
        assert!(
            tail[at + 100..].iter().all(|&b| b == 0),
            "round {round}: stale bytes past the end of the file"
        );
        seen(&tail);
        drop(tail);
        drop(f);
        drive_frees();

        // Sequential reads: readahead makes folios up to 64 KiB, the last
        // one mostly past the end.
        let len = 20 * PAGE + 7;
        let disk = RamDisk::new(len);
        disk.write_all_at(&vec![0x22; len as usize], 0).unwrap();
        let f = cache.open_with(disk, opts).unwrap();
        let mut buf = vec![0u8; PAGE as usize];
        for p in 0..=20 {
            f.read_at(&mut buf, p * PAGE).unwrap();
        }
        let r = f.read_folio(20).unwrap();
        let at = (20 * PAGE - r.index() * PAGE) as usize;
        assert!(r[..at + 7].iter().all(|&b| b == 0x22));
        assert!(
            r[at + 7..].iter().all(|&b| b == 0),
            "round {round}: readahead tail"
        );
        seen(&r);
        drop(r);
        drop(f);
        drive_frees();

        // A backend shorter than the file's size (it shrank behind the
        // cache's back): what it does not return reads as zeroes.
        let mem = Arc::new(MemBackend::new());
        mem.write_all_at(&vec![0x33; (3 * PAGE) as usize], 0)
            .unwrap();
        let f = cache.open_with(Arc::clone(&mem), opts).unwrap();
        mem.set_len(PAGE + 10).unwrap();
        let r = f.read_folio(1).unwrap();
        let at = (PAGE - r.index() * PAGE) as usize;
        assert!(r[at..at + 10].iter().all(|&b| b == 0x33));
        assert!(
            r[at + 10..].iter().all(|&b| b == 0),
            "round {round}: short backend"
        );
        seen(&r);
        drop(r);
        drop(f);
        drive_frees();

        // A write into a new folio past the end, then the file extended
        // over it: only the written bytes are not zero.
        let f = cache.open_with(MemBackend::new(), opts).unwrap();
        f.write_at(b"hello", 3 * PAGE + 50).unwrap();
        f.set_len(8 * PAGE).unwrap();
        let mut all = vec![0xFFu8; (8 * PAGE) as usize];
        assert_eq!(f.read_at(&mut all, 0).unwrap(), all.len());
        let at = (3 * PAGE + 50) as usize;
        assert_eq!(&all[at..at + 5], b"hello");
        all[at..at + 5].fill(0);
        assert!(
            all.iter().all(|&b| b == 0),
            "round {round}: write past the end"
        );
        let r = f.read_folio(3).unwrap();
        let at = (3 * PAGE - r.index() * PAGE) as usize;
        assert_eq!(&r[at + 50..at + 55], b"hello");
        seen(&r);

        // Truncated into the middle of that page, then extended: the cut
        // part reads as zeroes, in the cache and from the backend.
        drop(r);
        f.set_len(3 * PAGE + 52).unwrap();
        f.set_len(6 * PAGE).unwrap();
        let mut all = vec![0xFFu8; (6 * PAGE) as usize];
        f.read_at(&mut all, 0).unwrap();
        let at = (3 * PAGE + 50) as usize;
        assert_eq!(&all[at..at + 2], b"he");
        all[at..at + 2].fill(0);
        assert!(
            all.iter().all(|&b| b == 0),
            "round {round}: truncated, extended"
        );
        f.sync().unwrap();
        f.invalidate(0..u64::MAX).unwrap();
        let mut again = vec![0xFFu8; (6 * PAGE) as usize];
        f.read_at(&mut again, 0).unwrap();
        again[at..at + 2].fill(0);
        assert!(
            again.iter().all(|&b| b == 0),
            "round {round}: after a refill"
        );
    }
    if frame_stats().regions > 0 {
        assert!(recycled > 0, "no folio of the test got a recycled frame");
    }
}

/// Pages of `PAGE` bytes, each stamped with its index and a generation
/// in every 16-byte unit, so a torn, stale or misplaced page is seen.
fn stamp(page: u64, generation: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(PAGE as usize);
    while v.len() < PAGE as usize {
        v.extend_from_slice(&page.to_le_bytes());
        v.extend_from_slice(&generation.to_le_bytes());
    }
    v
}

fn unstamp(b: &[u8]) -> (u64, u64) {
    let page = u64::from_le_bytes(b[..8].try_into().unwrap());
    let generation = u64::from_le_bytes(b[8..16].try_into().unwrap());
    assert!(
        b.chunks(16).all(|c| c == &b[..16]),
        "a torn page (page {page}, generation {generation})"
    );
    (page, generation)
}

/// Writers rewrite their own pages with rising generations and readers
/// check every page they read, while the capacity swings between large
/// and tiny: afterwards every page holds its last generation, in the
/// cache and on the backend (nothing lost, nothing dirty dropped).
#[test]
fn set_capacity_under_concurrent_readers_and_writers() {
    let _serial = serial();
    const PAGES: u64 = 1024; // 4 MiB
    let disk = Arc::new(RamDisk::new(PAGES * PAGE));
    for p in 0..PAGES {
        disk.write_all_at(&stamp(p, 0), p * PAGE).unwrap();
    }
    let cache = PageCache::new(CacheConfig::default().capacity(8 << 20));
    let file = Arc::new(cache.open(Arc::clone(&disk)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (file, stop, done) = (file.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                // Writer `w` owns the pages p with p % 2 == w.
                let mut last = vec![0u64; PAGES as usize];
                let mut x = w + 1;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) || n < 2000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = (x % (PAGES / 2)) * 2 + w;
                    last[p as usize] += 1;
                    file.write_at(&stamp(p, last[p as usize]), p * PAGE)
                        .unwrap();
                    n += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                last
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (file, stop) = (file.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; PAGE as usize];
                let mut p = r * 7;
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) || reads < 2000 {
                    p = (p * 31 + 17) % PAGES;
                    file.read_at(&mut buf, p * PAGE).unwrap();
                    let (page, _) = unstamp(&buf);
                    assert_eq!(page, p, "a page read at the wrong place");
                    reads += 1;
                }
            })
        })
        .collect();
    let caps = [8 << 20, 64 << 10, 2 << 20, 16 << 10, 4 << 20, 256 << 10];
    let mut i = 0;
    while done.load(Ordering::Relaxed) < 20_000 || i < 30 {
        let cap = caps[i % caps.len()];
        cache.set_capacity(cap).unwrap();
        assert_eq!(cache.capacity(), cap);
        i += 1;
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let mut last = vec![0u64; PAGES as usize];
    for w in writers {
        for (p, g) in w.join().unwrap().into_iter().enumerate() {
            last[p] = last[p].max(g);
        }
    }
    let mut buf = vec![0u8; PAGE as usize];
    for p in 0..PAGES {
        file.read_at(&mut buf, p * PAGE).unwrap();
        assert_eq!(unstamp(&buf), (p, last[p as usize]), "cached page {p}");
    }
    file.sync().unwrap();
    assert_eq!(cache.stats().dirty_bytes, 0);
    for p in 0..PAGES {
        disk.read_exact_at(&mut buf, p * PAGE).unwrap();
        assert_eq!(unstamp(&buf), (p, last[p as usize]), "backend page {p}");
    }
}

/// The counters agree: bytes cached are the pages cached, at most the
/// capacity after misses; a shrink brings them under the new capacity and
/// scales the dirty limit (a writer is throttled at 20% of the new
/// capacity, not the old); the metadata estimate grows with the folios
/// cached; refusals change nothing.
#[test]
fn stats_follow_the_capacity() {
    let _serial = serial();
    // The flusher's threshold at the capacity: only the dirty limit (20%)
    // acts on writers here (without a flusher thread, a writer over the
    // background threshold writes back itself and would hide it).
    let config = CacheConfig::default()
        .capacity(16 << 20)
        .dirty_background_bytes(16 << 20)
        .flusher(false)
        .passthrough(false); // the scan below must fill the cache and evict
    let cache = PageCache::new(config);
    let file = cache.open(RamDisk::new(32 << 20)).unwrap();
    let empty = cache.stats();
    assert_eq!((empty.capacity_bytes, empty.cached_bytes), (16 << 20, 0));
    let mut buf = vec![0u8; PAGE as usize];
    for p in (0..(8 << 20) / PAGE).rev() {
        file.read_at(&mut buf, p * PAGE).unwrap(); // backwards: one page per folio
    }
    let s = cache.stats();
    assert_eq!(s.cached_bytes, s.cached_pages * PAGE);
    assert_eq!(s.cached_bytes, 8 << 20);
    assert!(
        s.metadata_bytes >= empty.metadata_bytes + 2048 * 64,
        "2048 folios cost more than 64 bytes each: {} -> {}",
        empty.metadata_bytes,
        s.metadata_bytes
    );
    assert!(
        s.metadata_bytes < s.cached_bytes / 8,
        "metadata {} for {} bytes cached",
        s.metadata_bytes,
        s.cached_bytes
    );
    for p in 0..(32 << 20) / PAGE {
        file.read_at(&mut buf, p * PAGE).unwrap();
    }
    let s = cache.stats();
    assert!(s.cached_bytes <= s.capacity_bytes && s.evictions > 0);

    assert_eq!(cache.set_capacity(100), Err(CapacityError::TooSmall(100)));
    assert_eq!(
        cache.set_capacity(u64::MAX),
        Err(CapacityError::TooLarge(u64::MAX))
    );
    assert!(cache.set_capacity(MAX_CAPACITY).is_ok());
    cache.set_capacity(16 << 20).unwrap();
    assert_eq!(cache.stats().capacity_bytes, 16 << 20);

    // 2 MiB dirty: under 20% of 16 MiB, no throttling.
    file.write_at(&vec![5u8; 2 << 20], 0).unwrap();
    assert_eq!(cache.stats().throttled, 0);
    cache.set_capacity(4 << 20).unwrap();
    let s = cache.stats();
    assert_eq!(s.capacity_bytes, 4 << 20);
    assert!(s.cached_bytes <= 4 << 20, "{} cached", s.cached_bytes);
    assert!(s.dirty_bytes <= s.cached_bytes);
    file.sync().unwrap();
    file.invalidate(0..u64::MAX).unwrap(); // room: no reclaim writes back below
                                           // 2 MiB dirty again: over 20% of the new 4 MiB (and under the
                                           // background threshold, scaled to 4 MiB), so throttled.
    file.write_at(&vec![6u8; 2 << 20], 8 << 20).unwrap();
    let s = cache.stats();
    assert!(s.throttled > 0, "the dirty limit did not follow: {s:?}");
    let mut b = [0u8; 3];
    file.read_at(&mut b, (2 << 20) - 3).unwrap();
    assert_eq!(b, [5; 3], "written back before it was evicted");
}

/// A capacity that cannot be meant is refused the same way when a cache
/// is made as when it is resized: less than a page is `TooSmall`, more
/// than `MAX_CAPACITY` `TooLarge` (never rounded up to one page).
#[test]
fn a_capacity_is_refused_alike_at_configuration_and_at_run_time() {
    for bytes in [0, 1, PAGE - 1, MAX_CAPACITY + 1] {
        let config = CacheConfig::default().capacity(bytes).flusher(false);
        let made = PageCache::try_new(config.clone()).map(|c| c.capacity());
        let resized = PageCache::new(CacheConfig::default().flusher(false)).set_capacity(bytes);
        assert_eq!(made.map(drop), resized, "{bytes}");
        assert_eq!(config.validate(), resized, "{bytes}");
        assert!(resized.is_err(), "{bytes}");
        let panicked = std::panic::catch_unwind(|| PageCache::new(config)).is_err();
        assert!(panicked, "PageCache::new({bytes}) made a cache");
    }
    let c = PageCache::try_new(CacheConfig::default().capacity(PAGE).flusher(false)).unwrap();
    assert_eq!(c.capacity(), PAGE);
}
