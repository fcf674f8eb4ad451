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

fn cache(pages: u64) -> PageCache {
    PageCache::new(CacheConfig::default().capacity(pages * PAGE).flusher(false))
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
