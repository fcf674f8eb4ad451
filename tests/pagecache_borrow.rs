//! `CachedFile::read_folio_in`, the zero-copy borrow under a caller's epoch
//! guard: misses fill from the backend, hits count, past-the-end is an
//! error, a borrowed folio is never evicted or changed under the borrow,
//! and concurrent writers never show a reader a torn page.

use kxarray::backend::{Backend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const PAGE: u64 = 4096;

/// A cache of `pages` whose scans fill it (they are the tests' reclaim
/// pressure: a scan larger than the cache would otherwise pass it by).
fn cache(pages: u64) -> PageCache {
    PageCache::new(
        CacheConfig::default()
            .capacity(pages * PAGE)
            .flusher(false)
            .passthrough(false),
    )
}

fn stamped_disk(pages: u64) -> RamDisk {
    let disk = RamDisk::new(pages * PAGE);
    for i in 0..pages {
        disk.write_all_at(&[i as u8; PAGE as usize], i * PAGE)
            .unwrap();
    }
    disk
}

#[test]
fn miss_fills_then_hits() {
    let c = cache(16);
    let f = c.open(stamped_disk(8)).unwrap();
    let guard = kxarray::pin();
    let before = c.stats();
    let p = f.read_folio_in(3, &guard).unwrap();
    assert!(p.page(3).iter().all(|&b| b == 3));
    assert_eq!(p.page(100), &[] as &[u8], "a page outside the folio");
    drop(p);
    let mid = c.stats();
    assert_eq!(mid.misses, before.misses + 1, "the first borrow missed");
    let p = f.read_folio_in(3, &guard).unwrap();
    assert!(p.page(3).iter().all(|&b| b == 3));
    assert_eq!(c.stats().misses, mid.misses, "the second borrow hit");
    assert!(c.stats().hits > mid.hits);
}

#[test]
fn past_the_end_is_an_error() {
    let c = cache(16);
    let f = c.open(stamped_disk(4)).unwrap();
    let guard = kxarray::pin();
    for index in [4, 1000, u64::MAX] {
        let e = f.read_folio_in(index, &guard).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "index {index}");
    }
}

/// A borrowed folio stays cached and unchanged while reclaim runs through
/// a cache a quarter of the file's size.
#[test]
fn a_borrow_survives_reclaim() {
    let c = cache(4);
    let f = c.open(stamped_disk(64)).unwrap();
    let guard = kxarray::pin();
    let held = f.read_folio_in(5, &guard).unwrap();
    for i in (0..64).filter(|&i| i != 5) {
        let mut b = [0u8; 8];
        f.read_at(&mut b, i * PAGE).unwrap();
        assert_eq!(b, [i as u8; 8]);
    }
    assert!(c.stats().evictions > 0, "the scan evicted");
    assert!(held.page(5).iter().all(|&b| b == 5));
    drop(held);
    let misses = c.stats().misses;
    let again = f.read_folio_in(5, &guard).unwrap();
    assert!(again.page(5).iter().all(|&b| b == 5));
    assert_eq!(c.stats().misses, misses, "page 5 was never evicted");
}

/// Writers rewrite whole pages with one byte value while readers borrow
/// them in batches under one guard, through a cache smaller than the file:
/// every borrowed page is uniform (no torn page), whatever was evicted or
/// refaulted in between.
#[test]
fn concurrent_writers_never_tear_a_borrowed_page() {
    const PAGES: u64 = 32;
    let c = cache(8);
    let f = Arc::new(c.open(stamped_disk(PAGES)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let f = Arc::clone(&f);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut gen = 0u8;
            while !stop.load(Ordering::Relaxed) {
                gen = gen.wrapping_add(1);
                for i in 0..PAGES {
                    f.write_at(&[gen; PAGE as usize], i * PAGE).unwrap();
                }
            }
        })
    };
    let mut checked = 0u64;
    for round in 0..300u64 {
        let guard = kxarray::pin();
        for k in 0..8u64 {
            let index = (round * 7 + k * 5) % PAGES;
            let p = f.read_folio_in(index, &guard).unwrap();
            let page = p.page(index);
            assert_eq!(page.len(), PAGE as usize);
            let first = page[0];
            assert!(
                page.iter().all(|&b| b == first),
                "page {index} torn (starts with {first})"
            );
            checked += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(checked, 2400);
}

/// A 512-byte write into a file with 64 KiB write folios allocates a folio
/// with one block uptodate; borrowing any page of it fills the rest from
/// the backend first, so the borrow never shows bytes that were not read.
#[test]
fn a_borrow_of_a_partly_written_folio_fills_it_first() {
    use kxarray::pagecache::FileOptions;
    let c = cache(64);
    let f = c
        .open_with(
            stamped_disk(32),
            FileOptions::default().block_size(512).folio_size(64 << 10),
        )
        .unwrap();
    f.write_at(&[0xee; 512], 3 * PAGE + 1024).unwrap();
    let guard = kxarray::pin();
    for index in [0u64, 3, 15] {
        let p = f.read_folio_in(index, &guard).unwrap();
        let page = p.page(index);
        for (i, &b) in page.iter().enumerate() {
            let want = if index == 3 && (1024..1536).contains(&i) {
                0xee
            } else {
                index as u8
            };
            assert_eq!(b, want, "page {index} byte {i}");
        }
    }
}

/// Run `f` on a thread and fail (instead of hanging the suite) if it does
/// not finish within 20 s: the calls below self-deadlocked before pins
/// stopped holding a lock.
fn completes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} did not complete: it waits for a pin"))
}

/// The same thread holds a reference to a folio and writes, truncates and
/// invalidates it: every call completes, the reference keeps the bytes it
/// pinned, and later reads see the writes.
#[test]
fn a_pin_never_blocks_its_own_thread() {
    use kxarray::backend::FileBackend;
    completes("write/set_len/invalidate under a pin", || {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(64);
        let f = c
            .open(FileBackend::create(&dir.path().join("f")).unwrap())
            .unwrap();
        f.write_at(&[1u8; 4 * PAGE as usize], 0).unwrap();
        let r = f.read_folio(1).unwrap();
        let g = kxarray::pin();
        let b = f.read_folio_in(1, &g).unwrap();
        f.write_at(&[2u8; 100], PAGE + 10).unwrap();
        assert!(
            r.page(1).iter().all(|&x| x == 1),
            "the reference keeps its bytes"
        );
        assert!(b.page(1).iter().all(|&x| x == 1), "so does the borrow");
        let mut now = [0u8; 100];
        f.read_at(&mut now, PAGE + 10).unwrap();
        assert_eq!(now, [2u8; 100], "readers see the write");
        assert_eq!(f.invalidate(0..4 * PAGE).unwrap(), 0, "dirty pages stay");
        f.sync().unwrap();
        assert!(f.invalidate(0..4 * PAGE).unwrap() > 0, "clean pages go");
        f.set_len(PAGE / 2).unwrap();
        assert!(
            r.page(1).iter().all(|&x| x == 1),
            "truncation leaves the pin"
        );
        assert!(b.page(1).iter().all(|&x| x == 1));
        drop(b);
        drop(g);
        let mut tail = [9u8; 8];
        assert_eq!(f.read_at(&mut tail, PAGE / 2 - 4).unwrap(), 4);
        assert_eq!(&tail[..4], &[1u8; 4]);
    });
}

/// A folio whose bytes a reference pinned is not evicted; once a writer
/// has copied them (copy-on-write), the folio may go, and the reference
/// keeps the bytes it pinned either way.
#[test]
fn a_pinned_folio_stays_cached_until_a_writer_copies_it() {
    let c = cache(4);
    let f = c.open(stamped_disk(64)).unwrap();
    let pressure = |skip: u64| {
        for i in (0..64).filter(|&i| i != skip) {
            let mut b = [0u8; 1];
            f.read_at(&mut b, i * PAGE).unwrap();
        }
    };
    let r = f.read_folio(5).unwrap();
    pressure(5);
    assert!(c.stats().evictions > 0);
    let misses = c.stats().misses;
    let mut b = [0u8; 16];
    f.read_at(&mut b, 5 * PAGE).unwrap();
    assert_eq!(b, [5u8; 16]);
    assert_eq!(
        c.stats().misses,
        misses,
        "page 5 stayed cached while pinned"
    );

    f.write_at(&[0xAB; 16], 5 * PAGE).unwrap(); // the folio's bytes move on
    f.sync().unwrap(); // clean again, so reclaim may take it
    let evictions = c.stats().evictions;
    pressure(5);
    pressure(5);
    assert!(c.stats().evictions > evictions);
    assert!(r.page(5).iter().all(|&b| b == 5), "the old bytes, kept");
    f.read_at(&mut b, 5 * PAGE).unwrap();
    assert_eq!(b, [0xAB; 16], "the write, whether page 5 stayed or not");
}

/// `try_read_folio` never reads the backend nor waits.
#[test]
fn try_read_folio_only_hits() {
    let c = cache(16);
    let f = c.open(stamped_disk(8)).unwrap();
    assert!(f.try_read_folio(2).is_none(), "not cached");
    assert!(f.try_read_folio(100).is_none(), "past the end");
    assert_eq!(c.stats().misses, 0);
    f.read_folio(2).unwrap();
    let r = f.try_read_folio(2).expect("cached now");
    assert!(r.page(2).iter().all(|&b| b == 2));
}

/// `write_begin`: the guard shows the file's bytes, readers see the old
/// bytes until it ends and the new ones after, all at once; only the blocks
/// whose bytes changed turn dirty; `abort` changes nothing.
#[test]
fn write_begin_edits_in_place_and_dirties_what_changed() {
    use kxarray::pagecache::FileOptions;
    let c = cache(64);
    let f = c
        .open_with(stamped_disk(8), FileOptions::default().block_size(512))
        .unwrap();
    let mut w = f.write_begin(3 * PAGE + 1000, 2000).unwrap();
    assert_eq!(w.len(), 2000);
    assert_eq!(w.pos(), 3 * PAGE + 1000);
    assert!(w.iter().all(|&b| b == 3), "the file's bytes");
    w[24..40].fill(0xCD); // bytes 1024..1040 of the page: one block
    let mut seen = [0u8; 16];
    f.read_at(&mut seen, 3 * PAGE + 1024).unwrap();
    assert_eq!(seen, [3u8; 16], "not visible before write_end");
    drop(w);
    f.read_at(&mut seen, 3 * PAGE + 1024).unwrap();
    assert_eq!(seen, [0xCD; 16]);
    assert_eq!(c.stats().dirty_bytes, 512, "one block changed");
    f.sync().unwrap();

    let mut w = f.write_begin(2 * PAGE, 100).unwrap();
    w.fill(0xEE);
    w.abort();
    f.read_at(&mut seen, 2 * PAGE).unwrap();
    assert_eq!(seen, [2u8; 16]);
    assert_eq!(c.stats().dirty_bytes, 0);

    // Clipped at the end of the folio.
    let w = f.write_begin(5 * PAGE - 10, 100).unwrap();
    assert_eq!(w.len(), 10);
    w.commit().unwrap();

    // Past the end: the file grows to the end of the range.
    let dir = tempfile::tempdir().unwrap();
    let g = c
        .open(kxarray::backend::FileBackend::create(&dir.path().join("g")).unwrap())
        .unwrap();
    let mut w = g.write_begin(PAGE + 5, 3).unwrap();
    assert_eq!(&w[..], &[0, 0, 0], "a hole reads as zeros");
    w.copy_from_slice(b"abc");
    w.commit().unwrap();
    assert_eq!(g.len(), PAGE + 8);
    let mut b = [0u8; 3];
    g.read_at(&mut b, PAGE + 5).unwrap();
    assert_eq!(&b, b"abc");
}

/// `try_write_begin` refuses whatever would wait: an uncached folio, a
/// growing file, a folio whose lock another guard holds.
#[test]
fn try_write_begin_never_waits() {
    use std::io::ErrorKind::WouldBlock;
    let c = cache(64);
    let f = c.open(stamped_disk(8)).unwrap();
    assert_eq!(f.try_write_begin(PAGE, 10).unwrap_err().kind(), WouldBlock);
    f.read_folio(1).unwrap();
    let held = f.try_write_begin(PAGE, 10).unwrap();
    assert_eq!(
        f.try_write_begin(PAGE + 20, 10).unwrap_err().kind(),
        WouldBlock
    );
    drop(held);
    assert_eq!(
        f.try_write_begin(8 * PAGE - 4, 10).unwrap_err().kind(),
        WouldBlock
    );
    let mut w = f.try_write_begin(PAGE + 20, 10).unwrap();
    w.copy_from_slice(b"0123456789");
    drop(w);
    let mut b = [0u8; 10];
    f.read_at(&mut b, PAGE + 20).unwrap();
    assert_eq!(&b, b"0123456789");
}

/// `is_current` answers whether a reference still holds the file's bytes:
/// true until a write, truncation or invalidation touches its folio, false
/// for another file's reference, and true again for a new reference.
#[test]
fn is_current_follows_writes_truncation_and_invalidation() {
    let c = cache(16);
    let dir = tempfile::tempdir().unwrap();
    let f = c
        .open(kxarray::backend::FileBackend::create(&dir.path().join("a")).unwrap())
        .unwrap();
    let g = c.open(stamped_disk(8)).unwrap();
    f.write_at(&[1u8; 4 * PAGE as usize], 0).unwrap();
    let r = f.read_folio(1).unwrap();
    assert!(f.is_current(&r));
    assert!(f.is_current(&r), "checking changes nothing");
    assert!(!g.is_current(&r), "another file's reference");
    assert!(g.is_current(&g.read_folio(1).unwrap()));
    // a write to another page leaves it current; to its page, not
    f.write_at(&[2u8; 10], 2 * PAGE).unwrap();
    assert!(f.is_current(&r));
    f.write_at(&[3u8; 10], PAGE + 5).unwrap();
    assert!(!f.is_current(&r));
    assert_eq!(r[5], 1, "the reference keeps its bytes");
    let r = f.read_folio(1).unwrap();
    assert!(f.is_current(&r));
    // invalidation (after writeback) and truncation drop the folio
    f.sync().unwrap();
    assert_eq!(f.invalidate(0..4 * PAGE).unwrap(), 4);
    assert!(!f.is_current(&r));
    let r = f.read_folio(1).unwrap();
    assert!(f.is_current(&r));
    f.set_len(PAGE).unwrap();
    assert!(!f.is_current(&r));
}

/// `HeldFolio::is_current` gives `CachedFile::is_current`'s answer without
/// the lookup, through writes, invalidation and truncation; `hold` refuses
/// a stale reference and another file's; a held current folio survives
/// reclaim.
#[test]
fn held_folio_is_current_as_the_file_says() {
    let c = cache(16);
    let dir = tempfile::tempdir().unwrap();
    let f = c
        .open(kxarray::backend::FileBackend::create(&dir.path().join("a")).unwrap())
        .unwrap();
    let g = c.open(stamped_disk(64)).unwrap();
    f.write_at(&[1u8; 4 * PAGE as usize], 0).unwrap();
    let held = |i| f.hold(f.read_folio(i).unwrap()).unwrap();
    let h = held(1);
    assert!(h.is_current() && f.is_current(&h));
    let e = g.hold(f.read_folio(1).unwrap()).unwrap_err();
    assert_eq!(e.index(), 1, "another file's reference comes back");
    // reclaim passes a held current folio over
    for i in 0..64 {
        g.read_folio(i).unwrap();
    }
    assert!(h.is_current(), "evicted while held");
    f.write_at(&[2u8; 10], 2 * PAGE).unwrap();
    assert!(h.is_current() && f.is_current(&h));
    let stale = f.read_folio(1).unwrap();
    f.write_at(&[3u8; 10], PAGE + 5).unwrap();
    assert!(!h.is_current() && !f.is_current(&h));
    assert_eq!(h[5], 1, "the pinned bytes stay");
    assert!(f.hold(stale).is_err(), "a stale reference is refused");
    let h = held(1);
    assert_eq!(h.folio_ref().page(1)[5], 3);
    f.sync().unwrap();
    assert!(f.invalidate(0..4 * PAGE).unwrap() >= 1);
    assert_eq!(f.cached_pages(), 0, "a held folio is invalidated too");
    assert!(!h.is_current());
    let h = held(1);
    f.set_len(PAGE).unwrap();
    assert!(!h.is_current());
    assert_eq!(h.into_ref().index(), 1);
}

/// A held folio never says it is current once a reader has seen newer
/// bytes: a writer stamps page 0 with a rising counter while a reader reads
/// the stamp, then asks its held folio; when it answers current, its stamp
/// is at least the one read before.
#[test]
fn a_held_folio_is_never_current_behind_a_newer_read() {
    let c = cache(64);
    let f = c.open(stamped_disk(8)).unwrap();
    f.write_at(&0u64.to_le_bytes(), 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (f, stop) = (f.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // bursts, and pauses in which the reader finds it current
                for _ in 0..64 {
                    n += 1;
                    f.write_at(&n.to_le_bytes(), 0).unwrap();
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            n
        })
    };
    let stamp = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
    // the reads race the writer only once it runs (a loaded machine may
    // start its thread after every read)
    let mut b = [0u8; 8];
    while {
        f.read_at(&mut b, 0).unwrap();
        stamp(&b) == 0
    } {
        std::thread::yield_now();
    }
    let mut h = f.hold(f.read_folio(0).unwrap()).ok();
    let (mut current, mut renewed) = (0u64, 0u64);
    for _ in 0..200_000 {
        let mut b = [0u8; 8];
        f.read_at(&mut b, 0).unwrap();
        let seen = stamp(&b);
        match &h {
            Some(held) if held.is_current() => {
                assert!(
                    stamp(held) >= seen,
                    "current at {} after reading {seen}",
                    stamp(held)
                );
                current += 1;
            }
            _ => {
                let r = f.read_folio(0).unwrap();
                assert!(
                    stamp(&r) >= seen,
                    "pinned {} after reading {seen}",
                    stamp(&r)
                );
                h = f.hold(r).ok();
                renewed += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(
        written > 0 && renewed > 0,
        "the writer ran ({written}, {renewed})"
    );
    assert!(current > 0, "the held folio was current at times");
}
