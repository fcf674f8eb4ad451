//! Readahead that runs ahead, async reads for callers and their failure
//! modes, on both I/O engines (the thread pool and io_uring, through
//! `FileBackend::with_engine`; CI also runs this file with
//! `KXARRAY_IO_ENGINE=threads`):
//! - a sequential reader's misses submit windows that run ahead of it, and
//!   random reads are left alone;
//! - many threads reading a window while its reads are in flight always
//!   see the right bytes;
//! - futures dropped while their reads are in flight, with the file and
//!   the cache dropped too (run under ASan by `.ci/asan.sh`);
//! - an I/O error in a readahead window goes to the reader of the failed
//!   page only, and a retry reads again;
//! - `read_many` and `advise`.

mod aio_common;

use aio_common::{block_on, engines, pattern};
use kxarray::aio::{Completion, IoEngine};
use kxarray::backend::{Backend, FileBackend, ReadBuf, WriteBuf};
use kxarray::pagecache::{Advice, CacheConfig, CachedFile, PageCache};
use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

const PAGE: u64 = 4096;

/// A patterned temporary file of `len` bytes, as a backend on `engine`.
fn backend(len: usize, engine: &IoEngine) -> (tempfile::TempPath, FileBackend) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..len as u64).map(pattern).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    let path = f.into_temp_path();
    let b = FileBackend::create(&path)
        .unwrap()
        .with_engine(engine.clone());
    (path, b)
}

fn check(buf: &[u8], offset: u64) {
    for (i, &b) in buf.iter().enumerate() {
        let want = pattern(offset + i as u64);
        assert_eq!(b, want, "byte {} of a read at {offset}", offset + i as u64);
    }
}

fn cache(bytes: u64) -> PageCache {
    PageCache::new(CacheConfig::default().capacity(bytes).flusher(false))
}

#[test]
fn a_sequential_reader_runs_ahead_and_random_reads_are_left_alone() {
    for (name, engine) in engines() {
        let (_p, b) = backend(4 << 20, &engine);
        let c = cache(64 << 20);
        let f = c.open(b).unwrap();
        let mut buf = vec![0u8; PAGE as usize];
        for p in 0..256u64 {
            assert_eq!(f.read_at(&mut buf, p * PAGE).unwrap(), buf.len());
            check(&buf, p * PAGE);
        }
        let s = c.stats();
        // One miss started the stream; every later page was read ahead.
        assert!(
            s.misses <= 2,
            "{name}: {} misses for 256 sequential pages",
            s.misses
        );
        assert!(s.readahead_pages >= 250, "{name}: {s:?}");
        // The window ran ahead of the reader: pages past the last one read
        // are cached (or in flight) already.
        assert!(
            f.cached_pages() > 256,
            "{name}: {} cached",
            f.cached_pages()
        );

        // Random reads of another file: one page each, nothing ahead.
        let (_p2, b2) = backend(4 << 20, &engine);
        let c2 = cache(64 << 20);
        let g = c2.open(b2).unwrap();
        let mut x = 12345u64;
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let p = 1 + (x >> 33) % 1000;
            g.read_at(&mut buf, p * PAGE).unwrap();
            check(&buf, p * PAGE);
        }
        let s = c2.stats();
        assert!(
            s.readahead_pages < 40,
            "{name}: random reads read ahead: {s:?}"
        );
        assert_eq!(g.cached_pages(), s.misses + s.readahead_pages, "{name}");
    }
}

#[test]
fn readers_racing_their_own_readahead_see_the_right_bytes() {
    for (name, engine) in engines() {
        let len = 8usize << 20;
        let (_p, b) = backend(len, &engine);
        // A cache smaller than the file: windows, eviction and refills.
        let c = cache(4 << 20);
        let f = c.open(b).unwrap();
        f.set_readahead_max(512 << 10);
        for round in 0..3u64 {
            f.invalidate(0..u64::MAX).unwrap();
            let threads = 6;
            let go = Barrier::new(threads);
            std::thread::scope(|s| {
                for t in 0..threads as u64 {
                    let (f, go) = (&f, &go);
                    s.spawn(move || {
                        let mut buf = vec![0u8; 4096 + 100 * t as usize];
                        go.wait();
                        // Even threads read sequentially from the start
                        // (all in the same windows as they are read); odd
                        // ones jump around inside the first 2 MiB.
                        let mut x = t + round * 7 + 1;
                        for i in 0..512u64 {
                            let off = if t % 2 == 0 {
                                i * 4096 + t * 13
                            } else {
                                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                                (x >> 35) % (2 << 20)
                            };
                            let n = f.read_at(&mut buf, off).unwrap();
                            assert_eq!(n, buf.len().min(len - off as usize));
                            check(&buf[..n], off);
                        }
                    });
                }
            });
        }
        assert!(
            c.stats().readahead_pages > 0,
            "{name}: no readahead happened"
        );
    }
}

#[test]
fn a_future_dropped_while_its_read_is_in_flight_leaves_everything_valid() {
    for (name, engine) in engines() {
        let (_p, b) = backend(4 << 20, &engine);
        let b = Arc::new(b);
        for round in 0..20u64 {
            let c = cache(1 << 20);
            let f = c.open(Arc::clone(&b)).unwrap();
            let mut futs = Vec::new();
            for i in 0..64u64 {
                let off = ((i * 37 + round * 11) % 1000) * PAGE + i;
                futs.push(f.read_owned(off, vec![0xEEu8; 8192]));
            }
            // Drop half now (reads in flight), poll none of them; drop the
            // file and the cache while the rest are in flight too.
            futs.truncate(32);
            drop(f);
            drop(c);
            drop(futs);
        }
        // Reads of the same file through a new cache are right.
        let c = cache(1 << 20);
        let f = c.open(Arc::clone(&b)).unwrap();
        for i in 0..64u64 {
            let off = ((i * 37) % 1000) * PAGE + i;
            let (n, buf) = block_on(f.read_owned(off, vec![0u8; 8192]));
            assert_eq!(n.unwrap(), 8192, "{name}");
            check(&buf, off);
        }
        // A future polled until it waits, then dropped, while another
        // reads the same page to the end.
        for i in 0..16u64 {
            let off = 900 * PAGE + i * PAGE * 3;
            let mut fut = Box::pin(f.read_owned(off, vec![0u8; 4096]));
            let waker = std::task::Waker::noop();
            let _ = fut
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker));
            drop(fut);
            let mut b2 = vec![0u8; 4096];
            f.read_at(&mut b2, off).unwrap();
            check(&b2, off);
        }
    }
}

/// A backend over a `FileBackend` whose reads touching an armed page fail
/// once (the page is disarmed by the failure), and which counts the reads
/// of each page.
#[derive(Debug)]
struct Faulty {
    inner: FileBackend,
    armed: Mutex<Vec<u64>>,
    reads: Mutex<HashMap<u64, u32>>,
    failures: AtomicU64,
}

impl Faulty {
    /// Whether a read of `len` bytes at `offset` fails (and disarm).
    fn fails(&self, offset: u64, len: usize) -> bool {
        let (first, end) = (offset / PAGE, (offset + len as u64).div_ceil(PAGE));
        let mut r = self.reads.lock().unwrap();
        for p in first..end {
            *r.entry(p).or_default() += 1;
        }
        let mut a = self.armed.lock().unwrap();
        if let Some(i) = a.iter().position(|p| (first..end).contains(p)) {
            a.remove(i);
            self.failures.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    }
    fn injected() -> io::Error {
        io::Error::other("injected read fault")
    }
}

impl Backend for Faulty {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.fails(offset, buf.len()) {
            return Err(Self::injected());
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_many(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<Completion<ReadBuf>> {
        // The good ones go to the engine together; the failing ones
        // complete at once with the error.
        let mut out: Vec<Option<Completion<ReadBuf>>> = Vec::new();
        let mut pass = Vec::new();
        let mut at = Vec::new();
        for (off, buf) in reqs {
            if self.fails(off, buf.bytes_len()) {
                out.push(Some(Completion::ready(Err(Self::injected()), buf)));
            } else {
                at.push(out.len());
                out.push(None);
                pass.push((off, buf));
            }
        }
        for (i, c) in at.into_iter().zip(self.inner.read_many(pass)) {
            out[i] = Some(c);
        }
        out.into_iter().map(Option::unwrap).collect()
    }
    fn submit_read(&self, buf: ReadBuf, offset: u64) -> Completion<ReadBuf> {
        self.read_many(vec![(offset, buf)]).pop().unwrap()
    }
    fn submit_write(&self, buf: WriteBuf, offset: u64) -> Completion<WriteBuf> {
        self.inner.submit_write(buf, offset)
    }
}

#[test]
fn an_io_error_in_a_readahead_window_goes_to_the_reader_of_that_page_only() {
    for (name, engine) in engines() {
        let (_p, inner) = backend(1 << 20, &engine);
        let b = Arc::new(Faulty {
            inner,
            armed: Mutex::new(vec![9]),
            reads: Mutex::new(HashMap::new()),
            failures: AtomicU64::new(0),
        });
        let c = cache(16 << 20);
        let f = c.open(Arc::clone(&b)).unwrap();
        // A 16 KiB first read starts a window of 8 pages (one folio, 0..8,
        // its marker on page 4); touching page 4 submits the next window,
        // 8..24, as two folios of 8 pages: the read of 8..16 (page 9)
        // fails. The unit that fails is the folio, as in the kernel.
        let mut buf = vec![0u8; 4 * PAGE as usize];
        f.read_at(&mut buf, 0).unwrap();
        check(&buf, 0);
        let mut one = vec![0u8; PAGE as usize];
        f.read_at(&mut one, 4 * PAGE).unwrap();
        check(&one, 4 * PAGE);
        // Readers of the other pages get their bytes (several threads,
        // before and after the failed folio).
        std::thread::scope(|s| {
            for p in [5u64, 6, 7, 16, 17, 20, 23] {
                let f = &f;
                s.spawn(move || {
                    let mut one = vec![0u8; PAGE as usize];
                    if let Err(e) = f.read_at(&mut one, p * PAGE) {
                        panic!("page {p}: {e}");
                    }
                    check(&one, p * PAGE);
                });
            }
        });
        assert_eq!(
            b.failures.load(Ordering::SeqCst),
            1,
            "{name}: page 9 was read ahead and failed"
        );
        assert_eq!(b.reads.lock().unwrap()[&9], 1, "{name}");
        // The reader of page 9 gets the readahead's error (the fault fired
        // once: a synchronous re-read would have succeeded).
        let e = f.read_at(&mut one, 9 * PAGE + 100).unwrap_err();
        assert!(e.to_string().contains("injected"), "{name}: {e}");
        // A retry reads again, and succeeds.
        f.read_at(&mut one, 9 * PAGE).unwrap();
        check(&one, 9 * PAGE);
        assert_eq!(b.reads.lock().unwrap()[&9], 2, "{name}");

        // The same through the async API: the future needing the failed
        // page gets the error; the others their bytes.
        b.armed.lock().unwrap().push(200);
        let mut reqs_a = vec![0u8; 4096];
        let mut reqs_b = vec![0u8; 4096];
        let mut reqs_c = vec![0u8; 100];
        let mut reqs: Vec<(u64, &mut [u8])> = vec![
            (199 * PAGE, &mut reqs_a[..]),
            (200 * PAGE + 8, &mut reqs_b[..]),
            (201 * PAGE + 50, &mut reqs_c[..]),
        ];
        let got = f.read_many(&mut reqs);
        assert_eq!(*got[0].as_ref().unwrap(), 4096, "{name}");
        assert!(
            got[1]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("injected"),
            "{name}"
        );
        assert_eq!(*got[2].as_ref().unwrap(), 100, "{name}");
        check(&reqs_a, 199 * PAGE);
        check(&reqs_c, 201 * PAGE + 50);
        b.armed.lock().unwrap().push(210);
        let (r, _) = block_on(f.read_owned(210 * PAGE, vec![0u8; 10]));
        assert!(r.unwrap_err().to_string().contains("injected"), "{name}");
        let (r, buf) = block_on(f.read_owned(210 * PAGE, vec![0u8; 10]));
        assert_eq!(r.unwrap(), 10, "{name}: a retry reads again");
        check(&buf, 210 * PAGE);

        // One-page reads from the start of another file: windows 0..4
        // (marker 1), 4..12 (marker 4: folios 4..8 and 8..12), 12..28.
        // The read of folio 8..12 (page 9) fails; readers of the pages
        // around it get their bytes, the first reader of 8..12 the error.
        let c = cache(16 << 20);
        let g = c.open(Arc::clone(&b)).unwrap();
        b.armed.lock().unwrap().push(9);
        let before = b.failures.load(Ordering::SeqCst);
        for p in (0..8u64).chain(12..28) {
            g.read_at(&mut one, p * PAGE).unwrap();
            check(&one, p * PAGE);
        }
        assert_eq!(b.failures.load(Ordering::SeqCst), before + 1, "{name}");
        let e = g.read_at(&mut one, 10 * PAGE).unwrap_err();
        assert!(e.to_string().contains("injected"), "{name}: {e}");
        for p in 8..12u64 {
            g.read_at(&mut one, p * PAGE).unwrap();
            check(&one, p * PAGE);
        }
    }
}

#[test]
fn read_many_reads_hits_and_misses_and_reports_per_request() {
    for (name, engine) in engines() {
        let len = (1 << 20) + 123;
        let (_p, b) = backend(len, &engine);
        let c = cache(16 << 20);
        let f = c.open(b).unwrap();
        let mut warm = vec![0u8; 4096];
        f.read_at(&mut warm, 40960).unwrap(); // a hit below
        let offs = [
            40960u64,
            7,
            300_000,
            1 << 20,
            (1 << 20) + 100,
            5 << 20,
            40970,
        ];
        let mut bufs: Vec<Vec<u8>> = offs.iter().map(|_| vec![0u8; 5000]).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = offs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(o, b)| (*o, &mut b[..]))
            .collect();
        let got = f.read_many(&mut reqs);
        for (i, o) in offs.iter().enumerate() {
            let want = (len as u64).saturating_sub(*o).min(5000) as usize;
            assert_eq!(*got[i].as_ref().unwrap(), want, "{name}: request {i}");
            check(&bufs[i][..want], *o);
        }
        let mut bad: Vec<(u64, &mut [u8])> = vec![(u64::MAX - 1, &mut warm[..])];
        assert_eq!(
            f.read_many(&mut bad)[0].as_ref().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(f.read_many(&mut []).is_empty());
    }
}

#[test]
fn advice_steers_readahead_and_willneed_dontneed_act_on_the_range() {
    for (name, engine) in engines() {
        let (_p, b) = backend(2 << 20, &engine);
        let c = cache(16 << 20);
        let f = c.open(b).unwrap();
        // WillNeed: submitted, returns; then the pages are cached without
        // a miss.
        f.advise(PAGE * 100, 64 * PAGE, Advice::WillNeed).unwrap();
        let mut one = vec![0u8; 4096];
        for p in 100..164 {
            f.read_at(&mut one, p * PAGE).unwrap();
            check(&one, p * PAGE);
        }
        assert_eq!(c.stats().misses, 0, "{name}: WillNeed read the range");
        assert_eq!(f.cached_pages(), 64, "{name}");
        // DontNeed drops them.
        f.advise(PAGE * 100, 64 * PAGE, Advice::DontNeed).unwrap();
        assert_eq!(f.cached_pages(), 0, "{name}");
        // Random: sequential reads read one page each.
        f.advise(0, 0, Advice::Random).unwrap();
        for p in 0..64 {
            f.read_at(&mut one, p * PAGE).unwrap();
        }
        assert_eq!(
            f.cached_pages(),
            64,
            "{name}: nothing read ahead under Random"
        );
        // Sequential: a window of twice the maximum.
        f.advise(0, 0, Advice::Sequential).unwrap();
        f.read_at(&mut one, 300 * PAGE).unwrap();
        f.read_at(&mut one, 301 * PAGE).unwrap(); // the second sequential miss... or the marker
        assert!(f.cached_pages() > 64 + 2, "{name}");
        f.advise(0, 0, Advice::Normal).unwrap();
        let e = f.advise(u64::MAX - 5, 10, Advice::WillNeed).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

#[test]
fn futures_run_on_a_plain_executor_many_at_once() {
    for (name, engine) in engines() {
        let (_p, b) = backend(4 << 20, &engine);
        let c = cache(64 << 20);
        let f: CachedFile = c.open(b).unwrap();
        // 32 reads in flight, driven by one tiny executor.
        let futs: Vec<_> = (0..32u64)
            .map(|i| f.read_owned((i * 97 % 1000) * PAGE + i, vec![0u8; 3000]))
            .collect();
        let outs = block_on(async move {
            let mut v = Vec::new();
            for fut in futs {
                v.push(fut.await);
            }
            v
        });
        for (i, (n, buf)) in outs.into_iter().enumerate() {
            let off = (i as u64 * 97 % 1000) * PAGE + i as u64;
            assert_eq!(n.unwrap(), 3000, "{name}");
            check(&buf, off);
        }
    }
}

#[test]
fn a_zero_copy_probe_of_the_marker_is_a_hit_and_runs_ahead() {
    use kxarray::backend::RamDisk;
    let c = cache(16 << 20);
    let f = c.open(RamDisk::new(1 << 20)).unwrap();
    let mut one = [0u8; 16];
    f.read_at(&mut one, 0).unwrap(); // window 0..4, the marker on page 1
    assert_eq!(f.cached_pages(), 4);
    // `try_read_folio` never blocks or reads itself: the marked folio is
    // cached and read, so it is a hit, and touching it submits 4..12.
    let r = f.try_read_folio(1).expect("a cached, uptodate folio");
    assert_eq!(r.index(), 1);
    assert_eq!(f.cached_pages(), 12);
}
