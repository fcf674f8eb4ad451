//! Batch reads: the `READ`s a worker took from a connection together go to
//! the backend in one call, so a client's queue depth reaches the device
//! (through the page cache: its hits copied, its misses submitted together
//! on the I/O engine) instead of one read at a time per worker.
//!
//! Owns [`ReadMany`], the one call the transmission phase makes for a group
//! of reads, and its implementations: [`CachedFile`] (the page cache's
//! batch read, `CachedFile::read_many`) and [`FileBackend`] (the backend's submission side: the
//! reads in flight together on the I/O engine). An export without one reads
//! its group one request after the other ([`read_each`]).
//!
//! Reads in flight ([`ReadMany::start_reads`]): the same requests started
//! without waiting, one [`ReadInFlight`] future each (the page cache's
//! `CachedFile::read_owned_many`, the I/O engine's completions), so a
//! connection keeps its client's queue in flight and answers each read as
//! it completes.
//!
//! Invariants: one result per request, in order; a request's error touches
//! no other request; a result `Ok(n)` means the first `n` bytes of that
//! request's buffer hold the data (fewer than asked only at the end of the
//! backend; the caller completes or refuses a short read); a future
//! dropped before it is ready leaves nothing writing into its buffer (the
//! buffer is owned by the future, or by the engine until its completion).

use std::future::Future;
use std::io;
use std::pin::Pin;

use kxarray::aio::AlignedBuf;
use kxarray::backend::{Backend, FileBackend, ReadBuf};
use kxarray::pagecache::CachedFile;

/// A read in flight ([`ReadMany::start_reads`]): ready with the read's
/// result (what `read_at` returns) and its buffer back.
pub type ReadInFlight = Pin<Box<dyn Future<Output = (io::Result<usize>, ReadBuf)> + Send>>;

/// Reads served together: `reqs` are `(offset, buffer)` pairs, filled from
/// the backend; one result per request, in order.
pub trait ReadMany: Send + Sync + std::fmt::Debug {
    /// Fill every buffer from its offset.
    ///
    /// # Errors
    /// Per request, in its result: the backend's error for that read only.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>>;

    /// Start reading every `(offset, buffer)` of `reqs` (their misses
    /// submitted together) and return at once with one future per
    /// request, in order, each ready with the request's result and its
    /// buffer back. Dropping a future cancels nothing and leaves nothing
    /// writing into anything the caller can reach.
    ///
    /// The default reads them now ([`read_many`](ReadMany::read_many)) and
    /// returns futures that are ready.
    ///
    /// # Errors
    /// Per request, in its future's output.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use kxarray::aio::AlignedBuf;
    /// use kxarray::backend::{Backend, FileBackend, ReadBuf};
    /// use kxarray_nbd::ReadMany;
    ///
    /// let file = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// file.write_all_at(&[5u8; 8192], 0).unwrap();
    /// let bufs: Vec<(u64, ReadBuf)> = vec![(0, Box::new(AlignedBuf::new(4096)))];
    /// let mut fut = file.start_reads(bufs).pop().unwrap();
    /// let waker = Waker::noop();
    /// let (n, buf) = loop {
    ///     if let Poll::Ready(r) = fut.as_mut().poll(&mut Context::from_waker(waker)) {
    ///         break r;
    ///     }
    ///     std::thread::yield_now();
    /// };
    /// assert_eq!(n.unwrap(), 4096);
    /// assert!(buf.as_slice().iter().all(|&b| b == 5));
    /// ```
    fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        read_now(reqs, |slices| self.read_many(slices))
    }

    /// Whether [`start_reads`](ReadMany::start_reads) returns before the
    /// reads complete (the server then serves a connection's reads in
    /// flight on one thread rather than in batches on several).
    fn reads_in_flight(&self) -> bool {
        false
    }
}

/// Read `reqs` now with `read` (a batch read of their buffers) and return
/// futures that are ready: the synchronous form of
/// [`ReadMany::start_reads`].
pub fn read_now(
    mut reqs: Vec<(u64, ReadBuf)>,
    read: impl FnOnce(&mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>>,
) -> Vec<ReadInFlight> {
    let results = {
        let mut slices: Vec<(u64, &mut [u8])> = reqs
            .iter_mut()
            .map(|(off, buf)| (*off, buf.as_mut_slice()))
            .collect();
        read(&mut slices)
    };
    reqs.into_iter()
        .zip(results)
        .map(|((_, buf), res)| Box::pin(std::future::ready((res, buf))) as ReadInFlight)
        .collect()
}

/// A read's buffer as the page cache's futures take it.
struct Bytes(ReadBuf);

impl AsMut<[u8]> for Bytes {
    fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// One request after the other with [`Backend::read_at`]: what an export
/// without a [`ReadMany`] does.
pub fn read_each(backend: &dyn Backend, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
    reqs.iter_mut()
        .map(|(off, buf)| backend.read_at(buf, *off))
        .collect()
}

/// The page cache's batch read ([`CachedFile::read_many`]): every
/// request's cached pages copied, its misses submitted together through
/// the I/O engine.
///
/// Reads in flight: `CachedFile::read_owned_many` (the misses submitted
/// together; each future copies its bytes out of the cache once the reads
/// it needs are done).
impl ReadMany for CachedFile {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        CachedFile::read_many(self, reqs)
    }

    fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        self.read_owned_many(reqs.into_iter().map(|(off, buf)| (off, Bytes(buf))))
            .into_iter()
            .map(|f| {
                Box::pin(async move {
                    let (res, buf) = f.await;
                    (res, buf.0)
                }) as ReadInFlight
            })
            .collect()
    }

    fn reads_in_flight(&self) -> bool {
        true
    }
}

/// Aligned buffers kept by a worker thread between its batches (4 KiB
/// reads would otherwise cost an allocation and a `memset` each).
const SPARE_BUFFERS: usize = 256;

/// Largest buffer kept for reuse.
const SPARE_MAX_LEN: usize = 128 * 1024;

std::thread_local! {
    static SPARE: std::cell::RefCell<Vec<ReadBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An aligned buffer of `len` bytes: one this thread kept, or a new one.
pub(crate) fn take_buffer(len: usize) -> ReadBuf {
    let kept = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let at = s.iter().rposition(|b| b.bytes_len() == len)?;
        Some(s.swap_remove(at))
    });
    kept.unwrap_or_else(|| Box::new(AlignedBuf::new(len)))
}

/// Keep `buf` for this thread's next batch, if there is room.
pub(crate) fn keep_buffer(buf: ReadBuf) {
    if buf.bytes_len() <= SPARE_MAX_LEN {
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < SPARE_BUFFERS {
                s.push(buf);
            }
        });
    }
}

/// The backend's submission side: the whole group in flight on the I/O
/// engine at once (one `io_uring_enter`), into aligned buffers (what
/// `O_DIRECT` needs, reused from batch to batch by each thread) copied to
/// the callers' on completion.
impl ReadMany for FileBackend {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        let owned: Vec<(u64, ReadBuf)> = reqs
            .iter()
            .map(|(off, buf)| (*off, take_buffer(buf.len())))
            .collect();
        let done = Backend::read_many(self, owned);
        reqs.iter_mut()
            .zip(done)
            .map(|((_, buf), c)| {
                let (res, got) = c.wait();
                let res = res.map(|n| {
                    let n = n.min(buf.len());
                    buf[..n].copy_from_slice(&got.as_slice()[..n]);
                    n
                });
                keep_buffer(got);
                res
            })
            .collect()
    }

    /// The completions of the engine's batch submission (the buffers must
    /// suit the file: aligned for `O_DIRECT`, as [`AlignedBuf`]s are).
    fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        Backend::read_many(self, reqs)
            .into_iter()
            .map(|c| Box::pin(c) as ReadInFlight)
            .collect()
    }

    fn reads_in_flight(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxarray::backend::RamDisk;
    use kxarray::pagecache::{CacheConfig, PageCache};

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// Every implementation reads what `read_at` reads, request by
    /// request, including a request past the end (0 bytes) and one
    /// across it (short).
    #[test]
    fn every_reader_reads_what_read_at_reads() {
        let data = pattern(64 << 10);
        let file = FileBackend::from_file(tempfile::tempfile().unwrap());
        file.write_all_at(&data, 0).unwrap();
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let ram = RamDisk::new(64 << 10);
        ram.write_all_at(&data, 0).unwrap();
        let cached = cache.open(ram).unwrap();
        let readers: [&dyn ReadMany; 2] = [&file, &cached];
        for r in readers {
            let offs = [0u64, 4096, 60 << 10, 8192 + 100, 64 << 10, (64 << 10) - 10];
            let mut bufs: Vec<Vec<u8>> = offs.iter().map(|_| vec![0xee; 4096]).collect();
            let mut reqs: Vec<(u64, &mut [u8])> = offs
                .iter()
                .zip(bufs.iter_mut())
                .map(|(&o, b)| (o, b.as_mut_slice()))
                .collect();
            let got: Vec<usize> = r
                .read_many(&mut reqs)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_eq!(got, vec![4096, 4096, 4096, 4096, 0, 10], "{r:?}");
            for ((o, b), n) in offs.iter().zip(&bufs).zip(got) {
                let o = *o as usize;
                assert_eq!(&b[..n], &data[o..o + n], "{r:?} at {o}");
            }
        }
    }

    /// A request the backend refuses gets its error; the others their
    /// bytes.
    #[test]
    fn an_error_stays_with_its_request() {
        let file = FileBackend::from_file(tempfile::tempfile().unwrap());
        file.write_all_at(&[3; 8192], 0).unwrap();
        let (mut a, mut b, mut c) = (vec![0u8; 4096], vec![0u8; 16], vec![0u8; 4096]);
        let mut reqs: Vec<(u64, &mut [u8])> =
            vec![(0, &mut a), (u64::MAX - 4, &mut b), (4096, &mut c)];
        let r = ReadMany::read_many(&file, &mut reqs);
        assert_eq!(*r[0].as_ref().unwrap(), 4096);
        assert_eq!(
            r[1].as_ref().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(*r[2].as_ref().unwrap(), 4096);
        assert!(a.iter().chain(&c).all(|&x| x == 3));
    }
}
