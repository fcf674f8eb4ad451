//! Reads with many misses in flight for callers: [`CachedFile::read_many`]
//! (a batch: its misses submitted together, then waited), [`ReadFuture`]
//! (one read as a runtime-agnostic `Future`, [`CachedFile::read_owned`]),
//! and the hints: [`CachedFile::advise`] (`posix_fadvise`) and the
//! readahead window's maximum.
//!
//! Owns nothing but the handles' entry points: the folios, their fills and
//! their waits are `fill`'s. Invariants: a caller's buffer is written only
//! by the caller's own thread, in the copy out of the cache (never by an
//! I/O: reads go into folios), so dropping a [`ReadFuture`] at any point
//! leaves nothing writing into anything it owned; every result is what
//! [`CachedFile::read_at`] would return for the same request.

use super::file::CachedFile;
use super::inode::FileShared;
use super::paths::MAX_FILE_SIZE;
use super::readahead::{Advice, Window};
use crate::backend::checked_end;
use crate::filemap::PAGE_SIZE;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

const PAGE: u64 = PAGE_SIZE as u64;

/// The pages `offset..offset + len` touch inside a file of `size` bytes,
/// as `first..end` (empty when the range is empty or past the end).
fn pages(offset: u64, len: usize, size: u64) -> (u64, u64) {
    let end = offset.saturating_add(len as u64).min(size);
    if offset >= end {
        return (0, 0);
    }
    (offset / PAGE, end.div_ceil(PAGE))
}

/// The window a batch submits for a request of `len` bytes at `offset` in
/// a file of `size` bytes: its pages, or `None` when it reads nothing or
/// is invalid (its own read reports why).
fn window(offset: u64, len: usize, size: u64) -> Option<Window> {
    if offset > MAX_FILE_SIZE || checked_end(offset, len as u64).is_err() {
        return None;
    }
    let (start, end) = pages(offset, len, size);
    (start < end).then_some(Window {
        start,
        end,
        mark: None,
        drop_behind: false,
    })
}

impl CachedFile {
    /// Read many independent ranges: `reqs[i].1` is filled from the file
    /// at `reqs[i].0`, and result `i` is what [`read_at`](CachedFile::read_at)
    /// would return for it (bytes read, fewer at the end of the file, or
    /// the error). The pages none of the requests find cached are read
    /// from the backend all at once (one submission on an I/O engine, so
    /// the device sees them together), then each request copies its bytes,
    /// waiting only for the reads it needs. Readahead's window is left
    /// alone.
    ///
    /// # Errors
    /// Per request, as [`read_at`](CachedFile::read_at): a read error of a
    /// page goes to the requests that need that page only.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.write_at(b"far apart", 900_000).unwrap();
    /// let (mut a, mut b) = ([0u8; 3], [0u8; 5]);
    /// let mut reqs: Vec<(u64, &mut [u8])> = vec![(900_000, &mut a[..]), (900_004, &mut b[..])];
    /// let got = file.read_many(&mut reqs);
    /// assert_eq!(got.iter().map(|r| *r.as_ref().unwrap()).collect::<Vec<_>>(), vec![3, 5]);
    /// assert_eq!((&a, &b), (b"far", b"apart"));
    /// ```
    pub fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(r) = &self.region {
            return reqs
                .iter_mut()
                .map(|(off, buf)| r.read_at(buf, *off))
                .collect();
        }
        let s = self.shared();
        let size = s.len();
        let wins: Vec<Window> = reqs
            .iter()
            .filter_map(|(off, buf)| window(*off, buf.len(), size))
            .collect();
        // Submission errors (no memory for a folio) are left to each
        // request: its own read meets the same condition and reports it.
        if !wins.is_empty() {
            let _ = s.submit_fills(&wins, None);
        }
        reqs.iter_mut()
            .map(|(off, buf)| s.read_at(buf, *off))
            .collect()
    }

    /// Read up to `buf.as_mut().len()` bytes at `offset` as a [`Future`]:
    /// the pages that are not cached are submitted now, and the future is
    /// ready once their reads are done and the bytes are copied into
    /// `buf`, which it gives back with the result (what
    /// [`read_at`](CachedFile::read_at) would return). It needs no
    /// particular runtime: any executor, or a plain `block_on`, polls it;
    /// it is woken by the completion of the reads it waits for.
    ///
    /// The reads go into the cache's folios, never into `buf`: dropping
    /// the future before it is ready cancels nothing and leaves nothing
    /// writing into `buf` (the folios stay locked and referenced by their
    /// reads until those complete, and are cached afterwards).
    ///
    /// # Errors
    /// In the output, as [`read_at`](CachedFile::read_at).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::sync::Arc;
    /// use std::task::{Context, Poll, Wake, Waker};
    ///
    /// // A tiny executor: poll, park until woken.
    /// struct Unpark(std::thread::Thread);
    /// impl Wake for Unpark {
    ///     fn wake(self: Arc<Self>) { self.0.unpark() }
    /// }
    /// fn block_on<F: Future>(f: F) -> F::Output {
    ///     let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    ///     let mut f = pin!(f);
    ///     loop {
    ///         if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
    ///             return v;
    ///         }
    ///         std::thread::park();
    ///     }
    /// }
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.write_at(b"owned", 4096).unwrap();
    /// let (n, buf) = block_on(file.read_owned(4096, vec![0u8; 5]));
    /// assert_eq!((n.unwrap(), &buf[..]), (5, &b"owned"[..]));
    /// ```
    pub fn read_owned<B: AsMut<[u8]> + Send + 'static>(
        &self,
        offset: u64,
        mut buf: B,
    ) -> ReadFuture<B> {
        let s = Arc::clone(self.shared());
        let len = buf.as_mut().len();
        let mut failed = None;
        if offset <= MAX_FILE_SIZE && checked_end(offset, len as u64).is_ok() {
            let (first, end) = pages(offset, len, s.len());
            if let Err(e) = s.fetch(first, end) {
                failed = Some(e);
            }
        }
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(r) = &self.region {
            let n = r.read_at(buf.as_mut(), offset);
            return ReadFuture {
                file: s,
                offset,
                buf: Some(buf),
                failed: None,
                done: Some(n),
            };
        }
        ReadFuture {
            file: s,
            offset,
            buf: Some(buf),
            failed,
            done: None,
        }
    }

    /// Many [`read_owned`](CachedFile::read_owned) reads at once: the pages
    /// none of the requests find cached are submitted together (one
    /// submission, as [`read_many`](CachedFile::read_many) does), and one
    /// [`ReadFuture`] per `(offset, buffer)` request, in order, is ready
    /// with what [`read_at`](CachedFile::read_at) would return and the
    /// buffer back. Nothing waits: a server keeps the futures in flight and
    /// answers each as it completes.
    ///
    /// # Errors
    /// In each future's output, as [`read_at`](CachedFile::read_at).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.write_at(b"one two", 8192).unwrap();
    /// let futs = file.read_owned_many([(8192, vec![0u8; 3]), (8196, vec![0u8; 3])]);
    /// // A RAM disk completes as it submits: each future is ready at once.
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let got: Vec<Vec<u8>> = futs
    ///     .into_iter()
    ///     .map(|f| match pin!(f).poll(&mut cx) {
    ///         Poll::Ready((n, buf)) => { assert_eq!(n.unwrap(), 3); buf }
    ///         Poll::Pending => unreachable!(),
    ///     })
    ///     .collect();
    /// assert_eq!(got, [b"one".to_vec(), b"two".to_vec()]);
    /// ```
    pub fn read_owned_many<B, I>(&self, reqs: I) -> Vec<ReadFuture<B>>
    where
        B: AsMut<[u8]> + Send + 'static,
        I: IntoIterator<Item = (u64, B)>,
    {
        #[cfg(all(target_os = "linux", not(loom)))]
        if self.region.is_some() {
            return reqs
                .into_iter()
                .map(|(o, b)| self.read_owned(o, b))
                .collect();
        }
        let s = self.shared();
        let size = s.len();
        let mut futs = Vec::new();
        let mut wins = Vec::new();
        for (offset, mut buf) in reqs {
            wins.extend(window(offset, buf.as_mut().len(), size));
            futs.push(ReadFuture {
                file: Arc::clone(s),
                offset,
                buf: Some(buf),
                failed: None,
                done: None,
            });
        }
        // A submission error (no memory for a folio) is left to each
        // future: its own read meets the same condition and reports it.
        if !wins.is_empty() {
            let _ = s.submit_fills(&wins, None);
        }
        futs
    }

    /// Advise the cache how `len` bytes at `offset` (0: to the end of the
    /// file) will be read, as `posix_fadvise(2)`:
    /// [`Normal`](Advice::Normal), [`Sequential`](Advice::Sequential) and
    /// [`Random`](Advice::Random) steer the file's readahead (the whole
    /// file, as in Linux); [`WillNeed`](Advice::WillNeed) submits the
    /// range's reads (at most the cache's capacity) and returns without
    /// waiting; [`DontNeed`](Advice::DontNeed) drops the range's clean,
    /// unused folios that lie wholly inside it (dirty ones stay: write them
    /// back first); [`NoReuse`](Advice::NoReuse) makes the file's read
    /// misses pass the cache by until `Normal` (the whole file, as in
    /// Linux).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when `offset + len` overflows or
    /// ends past [`MAX_FILE_SIZE`]; [`io::ErrorKind::OutOfMemory`] when a
    /// `WillNeed` read cannot get a folio.
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{Advice, CacheConfig, PageCache};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// file.advise(0, 64 * 1024, Advice::WillNeed).unwrap(); // reads submitted
    /// let mut b = [0u8; 4096];
    /// file.read_at(&mut b, 8192).unwrap();
    /// assert_eq!(file.cached_pages(), 16); // all 64 KiB were read ahead
    /// file.advise(0, 0, Advice::DontNeed).unwrap();
    /// assert_eq!(file.cached_pages(), 0);
    /// file.advise(0, 0, Advice::Random).unwrap(); // no readahead from now on
    /// ```
    pub fn advise(&self, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
        let s = self.shared();
        let end = match len {
            0 => MAX_FILE_SIZE,
            _ => match checked_end(offset, len) {
                Ok(e) if e <= MAX_FILE_SIZE => e,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                        "advice for {len} bytes at offset {offset} ends past the largest file size"
                    ),
                    ))
                }
            },
        };
        if offset > MAX_FILE_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("advice at offset {offset} past the largest file size"),
            ));
        }
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(r) = &self.region {
            // The region has no readahead of its own yet: `WillNeed` reads
            // the range in now, `DontNeed` drops its clean pages.
            match advice {
                Advice::WillNeed => {
                    let mut buf = vec![0u8; PAGE as usize];
                    let end = end
                        .min(r.len())
                        .min(offset.saturating_add(r.region().capacity()));
                    let mut at = offset / PAGE * PAGE;
                    while at < end {
                        r.read_at(&mut buf, at)?;
                        at += PAGE;
                    }
                }
                Advice::DontNeed => {
                    r.invalidate(offset..end);
                }
                _ => {}
            }
            return Ok(());
        }
        match advice {
            Advice::Normal | Advice::Sequential | Advice::Random => {
                s.ra.advise(advice);
                s.reuse.set_random(advice == Advice::Random);
                if advice == Advice::Normal {
                    s.reuse.set_noreuse(false);
                }
            }
            Advice::NoReuse => s.reuse.set_noreuse(true),
            Advice::WillNeed => {
                let first = offset / PAGE;
                let cap = s.cache.capacity_pages().max(1);
                let last = end.div_ceil(PAGE).min(first.saturating_add(cap));
                s.fetch(first, last)?;
            }
            Advice::DontNeed => {
                s.invalidate(offset..end);
            }
        }
        Ok(())
    }

    /// Set the largest readahead window of this file, in bytes (at least a
    /// page; a window never exceeds a quarter of the cache's capacity). The default is the backend's
    /// ([`Backend::readahead_max`](crate::backend::Backend::readahead_max)):
    /// 128 KiB ([`DEFAULT_READAHEAD_BYTES`](super::DEFAULT_READAHEAD_BYTES)),
    /// 4 MiB over an `O_DIRECT` [`FileBackend`](crate::backend::FileBackend).
    ///
    /// ```
    /// use kxarray::backend::RamDisk;
    /// use kxarray::pagecache::{CacheConfig, PageCache, DEFAULT_READAHEAD_BYTES};
    ///
    /// let cache = PageCache::new(CacheConfig::default().flusher(false));
    /// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
    /// assert_eq!(file.readahead_max(), DEFAULT_READAHEAD_BYTES);
    /// file.set_readahead_max(512 * 1024);
    /// assert_eq!(file.readahead_max(), 512 * 1024);
    /// ```
    pub fn set_readahead_max(&self, bytes: u64) {
        self.shared().ra.set_max_bytes(bytes);
    }

    /// The largest readahead window of this file, in bytes.
    pub fn readahead_max(&self) -> u64 {
        self.shared().ra.max_bytes()
    }
}

/// One read of a [`CachedFile`] in flight ([`CachedFile::read_owned`]): a
/// [`Future`] whose output is the result and the buffer back.
///
/// Polled by any executor; woken when the reads of the pages it needs
/// complete. Dropping it cancels nothing: the reads it submitted complete
/// into the cache.
#[must_use = "a future does nothing unless polled; its reads are submitted already"]
pub struct ReadFuture<B> {
    file: Arc<FileShared>,
    offset: u64,
    buf: Option<B>,
    /// A submission error, reported when polled.
    failed: Option<io::Error>,
    /// The read done already (a file in the shared cache reads at once).
    done: Option<io::Result<usize>>,
}

impl<B> std::fmt::Debug for ReadFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFuture")
            .field("offset", &self.offset)
            .field("done", &self.buf.is_none())
            .finish()
    }
}

// No field is structurally pinned: the buffer is moved out when ready.
impl<B> Unpin for ReadFuture<B> {}

impl<B: AsMut<[u8]> + Send + 'static> Future for ReadFuture<B> {
    type Output = (io::Result<usize>, B);

    /// Ready once the pages are read and copied.
    ///
    /// # Panics
    /// When polled again after it returned `Ready`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(mut buf) = this.buf.take() else {
            panic!("kxarray::pagecache::ReadFuture polled after it returned Ready");
        };
        if let Some(e) = this.failed.take() {
            return Poll::Ready((Err(e), buf));
        }
        if let Some(r) = this.done.take() {
            return Poll::Ready((r, buf));
        }
        let len = buf.as_mut().len();
        let (first, end) = if this.offset <= MAX_FILE_SIZE {
            pages(this.offset, len, this.file.len())
        } else {
            (0, 0)
        };
        let mut from = first;
        while let Some(f) = this.file.in_flight(from, end) {
            if this.file.fills.wait_for(&f, cx.waker()) {
                this.buf = Some(buf);
                return Poll::Pending;
            }
            from = f.index() + f.nr_pages();
        }
        // Every read it needs is done: copy (a page evicted since, or one
        // whose read failed, is read again or reports its error here).
        let n = this.file.read_at(buf.as_mut(), this.offset);
        Poll::Ready((n, buf))
    }
}
