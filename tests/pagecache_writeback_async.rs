//! Writeback with many writes in flight: a backend whose submitted writes
//! complete later, on a thread of their own and out of order, records the
//! order of submissions, completions and flushes. Checks that `sync`
//! flushes only after every write it started completed, that an error in
//! the middle of a batch leaves exactly the failed run dirty and reaches
//! the error sequence once, that adjacent dirty folios go out as large
//! requests, and that [`CachedFile::write_through`] keeps the cache
//! coherent. The same over a real file on both I/O engines.

use kxarray::aio::{Completer, Completion, EngineChoice, IoEngine, IoSettings};
use kxarray::backend::{Backend, FileBackend, WriteBuf};
use kxarray::pagecache::{CacheConfig, CachedFile, PageCache};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    /// A write submitted (offset, length).
    Submitted(u64, usize),
    /// A submitted write completed (offset, length, success).
    Completed(u64, usize, bool),
    /// A synchronous write (offset, length).
    Wrote(u64, usize),
    /// A flush, with how many submitted writes were still pending.
    Flush(usize),
}

#[derive(Debug, Default)]
struct Shared {
    data: Mutex<Vec<u8>>,
    events: Mutex<Vec<Ev>>,
    pending: AtomicUsize,
    max_pending: AtomicUsize,
    fail: Mutex<Option<Range<u64>>>,
}

impl Shared {
    fn fails(&self, offset: u64, len: usize) -> bool {
        let f = self.fail.lock().unwrap();
        f.as_ref()
            .is_some_and(|r| r.start < offset + len as u64 && offset < r.end)
    }
    fn store(&self, buf: &[u8], offset: u64) {
        let mut d = self.data.lock().unwrap();
        let end = offset as usize + buf.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(buf);
    }
    fn events(&self) -> Vec<Ev> {
        self.events.lock().unwrap().clone()
    }
}

/// Submitted writes complete on another thread a few milliseconds later,
/// a batch at a time in reverse order of submission.
#[derive(Debug)]
struct Delayed {
    s: Arc<Shared>,
    tx: Mutex<Sender<(Completer<WriteBuf>, u64)>>,
}

impl Delayed {
    fn new() -> Arc<Delayed> {
        let s = Arc::new(Shared::default());
        let (tx, rx) = channel::<(Completer<WriteBuf>, u64)>();
        let sh = Arc::clone(&s);
        std::thread::spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                std::thread::sleep(Duration::from_millis(3));
                batch.extend(rx.try_iter());
                for (c, offset) in batch.into_iter().rev() {
                    let len = c.buf().bytes_len();
                    let ok = !sh.fails(offset, len);
                    if ok {
                        sh.store(c.buf().as_slice(), offset);
                    }
                    sh.events
                        .lock()
                        .unwrap()
                        .push(Ev::Completed(offset, len, ok));
                    sh.pending.fetch_sub(1, Ordering::SeqCst);
                    if ok {
                        c.complete(Ok(len));
                    } else {
                        c.complete(Err(io::Error::other("injected write error")));
                    }
                }
            }
        });
        Arc::new(Delayed {
            s,
            tx: Mutex::new(tx),
        })
    }
}

use kxarray::aio::IoBuf;

impl Backend for Delayed {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let d = self.s.data.lock().unwrap();
        let from = (offset as usize).min(d.len());
        let n = buf.len().min(d.len() - from);
        buf[..n].copy_from_slice(&d[from..from + n]);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if self.s.fails(offset, buf.len()) {
            return Err(io::Error::other("injected write error"));
        }
        self.s.store(buf, offset);
        self.s
            .events
            .lock()
            .unwrap()
            .push(Ev::Wrote(offset, buf.len()));
        Ok(buf.len())
    }
    fn submit_write(&self, buf: WriteBuf, offset: u64) -> Completion<WriteBuf> {
        let len = buf.bytes_len();
        self.s
            .events
            .lock()
            .unwrap()
            .push(Ev::Submitted(offset, len));
        let now = self.s.pending.fetch_add(1, Ordering::SeqCst) + 1;
        self.s.max_pending.fetch_max(now, Ordering::SeqCst);
        let (c, done) = Completion::pair(buf);
        self.tx.lock().unwrap().send((done, offset)).unwrap();
        c
    }
    fn flush(&self) -> io::Result<()> {
        let p = self.s.pending.load(Ordering::SeqCst);
        self.s.events.lock().unwrap().push(Ev::Flush(p));
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.s.data.lock().unwrap().len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.s.data.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
}

fn open(b: &Arc<Delayed>) -> (PageCache, CachedFile) {
    let cache = PageCache::new(CacheConfig::default().capacity(64 << 20).flusher(false));
    let f = cache.open(Arc::clone(b)).unwrap();
    (cache, f)
}

fn page(p: u64) -> Vec<u8> {
    (0..4096u64).map(|i| (p * 7 + i / 512) as u8 | 1).collect()
}

/// Every submitted write completed before the first flush after it.
fn completed_before_each_flush(ev: &[Ev]) {
    let mut open: Vec<(u64, usize)> = Vec::new();
    for e in ev {
        match e {
            Ev::Submitted(o, n) => open.push((*o, *n)),
            Ev::Completed(o, n, _) => {
                let i = open
                    .iter()
                    .position(|x| *x == (*o, *n))
                    .expect("completed once");
                open.swap_remove(i);
            }
            Ev::Flush(pending) => {
                assert!(open.is_empty(), "flushed with {open:?} in flight: {ev:?}");
                assert_eq!(*pending, 0);
            }
            Ev::Wrote(..) => {}
        }
    }
}

#[test]
fn writes_in_flight_complete_before_sync_flushes() {
    let b = Delayed::new();
    let (_cache, f) = open(&b);
    // Every other page: 16 separate runs.
    for p in (0..32u64).step_by(2) {
        f.write_at(&page(p), p * 4096).unwrap();
    }
    f.sync().unwrap();
    let ev = b.s.events();
    let submitted = ev.iter().filter(|e| matches!(e, Ev::Submitted(..))).count();
    assert!(submitted >= 8, "the runs went to submit_write: {ev:?}");
    assert!(
        b.s.max_pending.load(Ordering::SeqCst) >= 2,
        "several writes were in flight at once"
    );
    assert!(matches!(ev.last(), Some(Ev::Flush(0))), "{ev:?}");
    completed_before_each_flush(&ev);
    let d = b.s.data.lock().unwrap().clone();
    for p in (0..32u64).step_by(2) {
        assert_eq!(&d[p as usize * 4096..][..4096], &page(p)[..], "page {p}");
    }
    // sync_data and sync_range too.
    for p in (1..32u64).step_by(2) {
        f.write_at(&page(p), p * 4096).unwrap();
    }
    f.sync_range(0..16 * 4096).unwrap();
    f.sync_data().unwrap();
    completed_before_each_flush(&b.s.events());
    let d = b.s.data.lock().unwrap().clone();
    for p in 0..32u64 {
        assert_eq!(&d[p as usize * 4096..][..4096], &page(p)[..], "page {p}");
    }
}

#[test]
fn an_error_in_the_middle_of_a_batch_leaves_that_run_dirty_and_is_reported_once() {
    let b = Delayed::new();
    let (cache, f) = open(&b);
    let other = f.clone();
    // Runs of two pages with a clean page between: pages 3k and 3k + 1.
    let runs = 10u64;
    for k in 0..runs {
        for p in [3 * k, 3 * k + 1] {
            f.write_at(&page(p), p * 4096).unwrap();
        }
    }
    // The fifth run fails.
    let bad = 3 * 4 * 4096..3 * 4 * 4096 + 8192;
    *b.s.fail.lock().unwrap() = Some(bad.clone());
    let e = f.sync().unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(b.s.max_pending.load(Ordering::SeqCst) >= 2);
    assert_eq!(cache.stats().dirty_bytes, 8192, "the failed run only");
    assert_eq!(cache.stats().writeback_bytes, 0);
    completed_before_each_flush(&b.s.events());
    {
        let d = b.s.data.lock().unwrap();
        for k in 0..runs {
            for p in [3 * k, 3 * k + 1] {
                let got = &d[p as usize * 4096..][..4096];
                if k == 4 {
                    assert!(got.iter().all(|&x| x == 0), "failed page {p} written");
                } else {
                    assert_eq!(got, &page(p)[..], "page {p}");
                }
            }
        }
    }
    // Reported once per handle; the failed run is retried once the fault
    // clears.
    *b.s.fail.lock().unwrap() = None;
    f.sync().unwrap();
    assert!(other.sync().is_err(), "another handle sees the error once");
    other.sync().unwrap();
    assert_eq!(cache.stats().dirty_bytes, 0);
    let d = b.s.data.lock().unwrap();
    for p in [12u64, 13] {
        assert_eq!(&d[p as usize * 4096..][..4096], &page(p)[..]);
    }
}

#[test]
fn adjacent_dirty_folios_go_out_as_large_requests() {
    let b = Delayed::new();
    let (_cache, f) = open(&b);
    let len = 3 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
    f.write_at(&data, 0).unwrap();
    f.sync().unwrap();
    let sizes: Vec<usize> =
        b.s.events()
            .iter()
            .filter_map(|e| match e {
                Ev::Submitted(_, n) | Ev::Wrote(_, n) => Some(*n),
                _ => None,
            })
            .collect();
    assert_eq!(sizes.iter().sum::<usize>(), len);
    assert!(
        sizes.len() <= 4,
        "3 MiB in at most four requests: {sizes:?}"
    );
    assert!(sizes.iter().all(|&n| n <= 1 << 20), "{sizes:?}");
    assert_eq!(&b.s.data.lock().unwrap()[..], &data[..]);
}

#[test]
fn write_through_updates_cached_folios_and_creates_none() {
    let b = Delayed::new();
    let (cache, f) = open(&b);
    f.write_at(&page(0), 0).unwrap();
    f.sync().unwrap();
    // Past the end: through the cache (written back, clean).
    f.write_through(&page(9), 4 * 4096).unwrap();
    assert_eq!(f.len(), 5 * 4096);
    assert_eq!(cache.stats().dirty_bytes, 0);
    f.invalidate(0..5 * 4096).unwrap();
    f.write_at(&page(0), 0).unwrap();
    f.sync().unwrap();
    let cached = f.cached_pages();
    assert_eq!(cached, 1);
    // Over a cached page, and over pages not cached inside the size.
    f.write_through(b"through", 100).unwrap();
    f.write_through(&page(5), 4096 + 50).unwrap();
    assert_eq!(f.cached_pages(), cached, "no folio created");
    assert_eq!(cache.stats().dirty_bytes, 0);
    assert_eq!(f.len(), 5 * 4096);
    assert_eq!(&b.s.data.lock().unwrap()[4 * 4096..][..4096], &page(9)[..]);
    let mut b1 = [0u8; 7];
    f.read_at(&mut b1, 100).unwrap();
    assert_eq!(&b1, b"through");
    let mut b2 = vec![0u8; 4096];
    f.read_at(&mut b2, 4096 + 50).unwrap();
    assert_eq!(b2, page(5));
    {
        let d = b.s.data.lock().unwrap();
        assert_eq!(&d[100..107], b"through");
        assert_eq!(&d[..100], &page(0)[..100]);
    }
    // A failed write-through: the error once, the bytes in the cache,
    // dirty, written by the next sync.
    *b.s.fail.lock().unwrap() = Some(3 * 4096..3 * 4096 + 1);
    let e = f.write_through(b"retry me", 3 * 4096).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(cache.stats().dirty_bytes > 0);
    let mut b3 = [0u8; 8];
    f.read_at(&mut b3, 3 * 4096).unwrap();
    assert_eq!(&b3, b"retry me");
    *b.s.fail.lock().unwrap() = None;
    f.sync().unwrap();
    assert_eq!(&b.s.data.lock().unwrap()[3 * 4096..][..8], b"retry me");
}

#[test]
fn many_runs_round_trip_through_a_real_file_on_both_engines() {
    for choice in [EngineChoice::Threads, EngineChoice::Auto] {
        let engine = IoEngine::new(&IoSettings::default().engine(choice)).unwrap();
        let tmp = tempfile::tempfile().unwrap();
        let backend = FileBackend::from_file(tmp.try_clone().unwrap()).with_engine(engine);
        let cache = PageCache::new(CacheConfig::default().capacity(64 << 20).flusher(false));
        let f = cache.open(backend).unwrap();
        let mut want = vec![0u8; 6 << 20];
        // Scattered runs of 1 to 300 pages, some overwritten twice.
        let mut x = 12345u64;
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let p = (x >> 33) % 1400;
            let n = 1 + (x >> 20) % 300;
            let n = n.min(1536 - p);
            let fill = (x >> 8) as u8;
            let at = (p * 4096) as usize;
            let len = (n * 4096) as usize;
            want[at..at + len].fill(fill);
            f.write_at(&want[at..at + len], at as u64).unwrap();
        }
        f.sync().unwrap();
        assert_eq!(cache.stats().dirty_bytes, 0);
        let raw = FileBackend::from_file(tmp);
        let mut got = vec![0u8; want.len()];
        let n = raw.read_at(&mut got, 0).unwrap();
        got.truncate(n);
        want.truncate(n);
        assert!(
            got == want,
            "{choice:?}: the file differs from what was written"
        );
    }
}
