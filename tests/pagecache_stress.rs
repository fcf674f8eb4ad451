//! Concurrency: writers stamp whole 4 KiB blocks with self-identifying
//! words (block, writer, sequence) on disjoint and shared blocks while
//! readers check every block they read is one whole stamp (no torn block),
//! and a tiny cache forces eviction while the flusher writes back. At the
//! end each disjoint block holds its owner's last stamp, and after `sync`
//! the backend equals what the cache returns.

mod pagecache_common;

use kxarray::pagecache::{CacheConfig, PageCache};
use pagecache_common::MemBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 64;
const WRITERS: u64 = 3;
const SHARED: u64 = 8; // blocks 0..SHARED are written by everyone

fn stamp(block: u64, writer: u64, seq: u64) -> Vec<u8> {
    let word = (block << 48) | (writer << 40) | seq;
    word.to_le_bytes().repeat(BLOCK / 8)
}

/// The stamp a block holds, or `None` for a torn or foreign block.
fn check(block: u64, buf: &[u8]) -> Option<(u64, u64)> {
    let w0 = u64::from_le_bytes(buf[..8].try_into().unwrap());
    if buf
        .chunks(8)
        .any(|c| u64::from_le_bytes(c.try_into().unwrap()) != w0)
    {
        return None;
    }
    if w0 == 0 {
        return Some((u64::MAX, 0)); // never written
    }
    if w0 >> 48 != block {
        return None;
    }
    Some(((w0 >> 40) & 0xff, w0 & ((1 << 40) - 1)))
}

#[test]
fn stamps_never_tear_under_eviction_and_flusher() {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(12 * BLOCK as u64)
            .dirty_expire(Duration::from_millis(1))
            .dirty_background_bytes(4 * BLOCK as u64),
    );
    let backend = Arc::new(MemBackend::new());
    backend
        .data
        .lock()
        .unwrap()
        .resize(BLOCKS as usize * BLOCK, 0);
    let file = cache.open(Arc::clone(&backend)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let iters = if cfg!(debug_assertions) { 1500 } else { 6000 };

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let file = file.clone();
            std::thread::spawn(move || {
                let mut last = vec![0u64; BLOCKS as usize];
                let mut x = w * 7 + 1;
                for seq in 1..=iters {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let block = if seq % 4 == 0 {
                        (x >> 33) % SHARED
                    } else {
                        // an owned block: SHARED + w + k*WRITERS
                        let k = (x >> 33) % ((BLOCKS - SHARED) / WRITERS);
                        SHARED + w + k * WRITERS
                    };
                    file.write_at(&stamp(block, w, seq), block * BLOCK as u64)
                        .unwrap();
                    last[block as usize] = seq;
                    if seq % 200 == 0 {
                        file.sync().unwrap();
                    }
                }
                last
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let file = file.clone();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; BLOCK];
                let mut x = r + 99;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let block = (x >> 33) % BLOCKS;
                    if r == 0 {
                        assert_eq!(file.read_at(&mut buf, block * BLOCK as u64).unwrap(), BLOCK);
                        assert!(check(block, &buf).is_some(), "torn block {block}");
                    } else {
                        let page = file.read_folio(block).unwrap();
                        assert!(
                            check(block, page.page(block)).is_some(),
                            "torn folio {block}"
                        );
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let lasts: Vec<Vec<u64>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let mut buf = vec![0u8; BLOCK];
    for block in SHARED..BLOCKS {
        let owner = (block - SHARED) % WRITERS;
        file.read_at(&mut buf, block * BLOCK as u64).unwrap();
        let want = lasts[owner as usize][block as usize];
        let got = check(block, &buf).expect("torn at the end");
        if want == 0 {
            assert_eq!(got.0, u64::MAX, "block {block} never written");
        } else {
            assert_eq!(got, (owner, want), "block {block}");
        }
    }
    file.sync().unwrap();
    let mut all = vec![0u8; BLOCKS as usize * BLOCK];
    file.read_at(&mut all, 0).unwrap();
    assert!(
        backend.contents() == all,
        "backend differs from the cache after sync"
    );
    let s = cache.stats();
    assert!(s.evictions > 0, "the test must evict: {s:?}");
    assert_eq!(s.dirty_bytes, 0);
}

/// Dropping a file's last handle while another file's misses reclaim its
/// folios writes its dirty data back and releases it. (Reclaim upgrades a
/// file's weak reference under the LRU lock; it now releases the files it
/// upgraded only after unlocking, since a file's teardown takes that lock.
/// This loop exercises the interleaving but does not hit that window
/// reliably.)
#[test]
fn dropping_files_while_reclaim_scans_them() {
    for round in 0..200u64 {
        let cache = PageCache::new(
            CacheConfig::default()
                .capacity(4 * BLOCK as u64)
                .flusher(false),
        );
        let backend = Arc::new(MemBackend::new());
        let victim = cache.open(Arc::clone(&backend)).unwrap();
        victim.write_at(&vec![1u8; 8 * BLOCK], 0).unwrap();
        let other = cache.open(kxarray::backend::RamDisk::new(1 << 20)).unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            for i in 0..16u64 {
                other
                    .read_at(&mut buf, ((i * 5 + round) % 64) * BLOCK as u64)
                    .unwrap();
            }
        });
        drop(victim);
        t.join().unwrap();
        assert_eq!(cache.stats().dirty_bytes, 0);
        assert!(
            backend.contents() == vec![1u8; 8 * BLOCK],
            "teardown wrote back"
        );
    }
}

/// Lock-free readers (`read_at` hits, under light pins) race a thread that
/// truncates, extends, rewrites and invalidates the file, so folios and
/// their buffers are freed (through crossbeam and the light limbo) while
/// readers copy from them: every byte a reader gets is its page's pattern
/// or zero (an extension), never freed memory or another page's bytes.
/// Under AddressSanitizer (`.ci/asan.sh`, every buffer its own
/// allocation) a premature free is reported.
#[test]
fn readers_race_truncation_invalidation_and_rewrites() {
    const PAGES: u64 = 32;
    let dir = tempfile::tempdir().unwrap();
    let cache = PageCache::new(CacheConfig::default().capacity(16 * 4096));
    let file = Arc::new(
        cache
            .open(kxarray::backend::FileBackend::create(&dir.path().join("f")).unwrap())
            .unwrap(),
    );
    let page = |p: u64| vec![(p as u8).wrapping_add(1); 4096];
    for p in 0..PAGES {
        file.write_at(&page(p), p * 4096).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (file, stop, count) = (Arc::clone(&file), Arc::clone(&stop), Arc::clone(&reads));
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ r;
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = x % PAGES;
                    let n = file.read_at(&mut buf, p * 4096).unwrap();
                    let want = (p as u8).wrapping_add(1);
                    assert!(
                        buf[..n].iter().all(|&b| b == want || b == 0),
                        "page {p}: foreign bytes"
                    );
                    reads += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                reads
            })
        })
        .collect();
    // Rounds go on until the readers have run beside them (on a loaded
    // machine they may start late).
    let rounds = if cfg!(debug_assertions) { 60 } else { 300 };
    let mut round = 0;
    while round < rounds || reads.load(Ordering::Relaxed) < 1000 {
        round += 1;
        let keep = (round % PAGES) * 4096;
        file.set_len(keep).unwrap();
        file.set_len(PAGES * 4096).unwrap();
        for p in keep / 4096..PAGES {
            file.write_at(&page(p), p * 4096).unwrap();
        }
        file.sync().unwrap();
        file.invalidate(0..PAGES * 4096).unwrap();
        kxarray::pin().flush();
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(reads >= 1000);
}
