//! `CachedFile::revalidate`: a file changed behind the cache (another
//! process wrote it) is read again from the backend, its length included;
//! dirty pages refuse it and stay; zero-copy references keep their bytes
//! and are no longer current.

use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, PageCache};
use std::os::unix::fs::FileExt;

fn cache() -> PageCache {
    PageCache::new(CacheConfig::default().capacity(4 << 20).flusher(false))
}

#[test]
fn a_file_changed_behind_the_cache_is_read_again() {
    let c = cache();
    let tmp = tempfile::tempfile().unwrap();
    tmp.write_all_at(&[1u8; 3 * 4096], 0).unwrap();
    let f = c
        .open(FileBackend::from_file(tmp.try_clone().unwrap()))
        .unwrap();
    let mut b = vec![0u8; 3 * 4096];
    f.read_at(&mut b, 0).unwrap();
    let pinned = f.read_folio(0).unwrap();
    assert!(f.cached_pages() > 0);
    // another writer: new bytes, and the file shrinks to two pages and a bit
    tmp.write_all_at(&[2u8; 2 * 4096 + 10], 0).unwrap();
    tmp.set_len(2 * 4096 + 10).unwrap();
    f.read_at(&mut b[..10], 0).unwrap();
    assert_eq!(b[0], 1, "the cache served its own copy before revalidation");
    f.revalidate().unwrap();
    assert_eq!(f.cached_pages(), 0);
    assert_eq!(f.len(), 2 * 4096 + 10);
    let n = f.read_at(&mut b, 0).unwrap();
    assert_eq!(n, 2 * 4096 + 10);
    assert!(b[..n].iter().all(|&x| x == 2));
    // the reference keeps what it pinned, and is no longer the file's
    assert!(pinned.iter().all(|&x| x == 1));
    assert!(!f.is_current(&pinned));
}

#[test]
fn dirty_pages_refuse_revalidation_and_stay() {
    let c = cache();
    let tmp = tempfile::tempfile().unwrap();
    tmp.write_all_at(&[1u8; 2 * 4096], 0).unwrap();
    let f = c
        .open(FileBackend::from_file(tmp.try_clone().unwrap()))
        .unwrap();
    let mut b = [0u8; 4096];
    f.read_at(&mut b, 4096).unwrap(); // page 1 clean
    f.write_at(&[9u8; 100], 0).unwrap(); // page 0 dirty
    tmp.set_len(8 * 4096).unwrap();
    let e = f.revalidate().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy);
    // the size is as it was, the dirty bytes are still there, and the clean
    // page was dropped
    assert_eq!(f.len(), 2 * 4096);
    f.read_at(&mut b[..100], 0).unwrap();
    assert!(b[..100].iter().all(|&x| x == 9));
    f.sync().unwrap();
    f.revalidate().unwrap();
    assert_eq!(f.len(), 8 * 4096);
    f.read_at(&mut b[..100], 0).unwrap();
    assert!(
        b[..100].iter().all(|&x| x == 9),
        "written back, then read again"
    );
}

/// A change to one page of a large folio costs that page, not the folio:
/// the folio is split (the kernel's non-uniform `folio_split`), the other
/// pages stay cached with their bytes in the largest folios clear of the
/// change, and the next pass misses once.
#[test]
fn a_range_revalidation_keeps_the_rest_of_a_large_folio() {
    let c = cache();
    let tmp = tempfile::tempfile().unwrap();
    let pages = 64u64;
    for p in 0..pages {
        tmp.write_all_at(&[p as u8; 4096], p * 4096).unwrap();
    }
    let f = c
        .open(FileBackend::from_file(tmp.try_clone().unwrap()))
        .unwrap();
    let mut b = [0u8; 4096];
    for p in 0..pages {
        f.read_at(&mut b, p * 4096).unwrap(); // sequential: readahead, large folios
    }
    let target = (0..pages)
        .find(|&p| f.read_folio(p).unwrap().order() > 0 && p % 2 == 1)
        .expect("readahead made a large folio");
    let neighbour = f.read_folio(target - 1).unwrap();
    let (base, order) = (neighbour.index(), neighbour.order());
    let before = f.cached_pages();
    // another writer changes one page, and one byte of the next
    tmp.write_all_at(&[0xee; 4096], target * 4096).unwrap();
    let dropped = f
        .revalidate_range(target * 4096..target * 4096 + 4096)
        .unwrap();
    assert_eq!(dropped, 1, "only the changed page leaves the cache");
    assert_eq!(f.cached_pages(), before - 1);
    let misses = c.stats().misses;
    for p in 0..pages {
        f.read_at(&mut b, p * 4096).unwrap();
        let want = if p == target { 0xee } else { p as u8 };
        assert!(b.iter().all(|&x| x == want), "page {p}");
    }
    assert_eq!(c.stats().misses - misses, 1, "one miss: the changed page");
    // the old folio's reference keeps its bytes; the page it names is now
    // held by a piece, so it is no longer the file's
    assert!(neighbour
        .page(target - 1)
        .iter()
        .all(|&x| x == (target - 1) as u8));
    assert!(!f.is_current(&neighbour));
    assert!(f.read_folio(target - 1).unwrap().order() == 0);
    // the pieces are the largest blocks clear of the change: the half of
    // the folio without it is one folio
    let other_half = base + ((target - base) ^ (1 << (order - 1)));
    let piece = f.read_folio(other_half).unwrap();
    assert_eq!(
        piece.order(),
        order - 1,
        "page {other_half} of the other half"
    );
}

/// Two threads each change pages of the same large folios behind the cache
/// and revalidate them, while readers read: once a change's
/// `revalidate_range` returned (and the reader saw that, through an
/// atomic), no read may return the page's older bytes. A split's pieces
/// are published after the folio left the index; without the file's
/// split lock, the other thread's revalidation could find the index
/// empty there, return, and the piece of its page (old bytes) appear
/// after it.
#[test]
fn concurrent_range_revalidations_never_leave_an_old_page_behind() {
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    use std::sync::Arc;
    const PAGES: u64 = 64;
    let c = cache();
    let tmp = Arc::new(tempfile::tempfile().unwrap());
    for p in 0..PAGES {
        tmp.write_all_at(&[0u8; 4096], p * 4096).unwrap();
    }
    let f = Arc::new(
        c.open(FileBackend::from_file(tmp.try_clone().unwrap()))
            .unwrap(),
    );
    // the version each page is known to have reached (its bytes' value)
    let seen: Arc<Vec<AtomicU8>> = Arc::new((0..PAGES).map(|_| AtomicU8::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (f, seen, stop) = (Arc::clone(&f), Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                let mut p = r as u64;
                while !stop.load(Ordering::Acquire) {
                    p = (p * 7 + 3) % PAGES;
                    let floor = seen[p as usize].load(Ordering::Acquire);
                    f.read_at(&mut b, p * 4096).unwrap();
                    assert!(b.iter().all(|&x| x == b[0]), "page {p} torn");
                    assert!(
                        b[0] >= floor,
                        "page {p} read {} after version {floor} was revalidated",
                        b[0]
                    );
                }
            })
        })
        .collect();
    let mut b = [0u8; 4096];
    for round in 1..=120u8 {
        // large folios again: drop everything and read it in order
        f.revalidate().unwrap();
        for p in 0..PAGES {
            f.read_at(&mut b, p * 4096).unwrap();
        }
        // two changers, one on the even pages and one on the odd, each
        // changing and revalidating its pages one at a time
        let changers: Vec<_> = (0..2u64)
            .map(|k| {
                let (f, seen, tmp) = (Arc::clone(&f), Arc::clone(&seen), Arc::clone(&tmp));
                std::thread::spawn(move || {
                    for p in (k..PAGES).step_by(2) {
                        tmp.write_all_at(&[round; 4096], p * 4096).unwrap();
                        f.revalidate_range(p * 4096..p * 4096 + 4096).unwrap();
                        seen[p as usize].store(round, Ordering::Release);
                    }
                })
            })
            .collect();
        for t in changers {
            t.join().unwrap();
        }
        for p in 0..PAGES {
            f.read_at(&mut b, p * 4096).unwrap();
            assert_eq!(b[0], round, "page {p} after round {round}");
        }
    }
    stop.store(true, Ordering::Release);
    for t in readers {
        t.join().unwrap();
    }
}
