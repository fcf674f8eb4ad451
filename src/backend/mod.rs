//! Storage backends: where a page cache reads from and writes back to, and
//! what the NBD server serves.
//!
//! Owns the [`Backend`] trait: positional reads and writes, flush, length,
//! discard. Implementations are `Send + Sync` and take `&self`, so several
//! threads (readers missing in the cache, the flusher, NBD workers) can use
//! one backend at once; each implementation documents what concurrent
//! writes to the same bytes do.
//!
//! The submission side ([`Backend::submit_read`], [`Backend::read_many`],
//! [`Backend::submit_write`]) takes owned buffers and returns a
//! [`Completion`] per request; its defaults run the synchronous methods and
//! return finished completions, so every backend has it, and
//! [`FileBackend`] keeps many requests in flight on the I/O engine
//! ([`crate::aio`]), the layer below this one.
//!
//! Invariants every implementation keeps:
//! - `read_at`/`write_at` never touch bytes outside `offset..offset + buf.len()`;
//! - an error leaves the bytes it did not report as transferred unspecified
//!   but never touches anything outside the request;
//! - after `flush` returns `Ok`, every write that returned before the
//!   `flush` was called is durable (as far as the medium allows).

use crate::aio::{Completion, IoBuf, IoBufMut};
use std::io;
use std::path::{Path, PathBuf};

mod file;
mod ramdisk;

pub use file::{FileBackend, DIRECT_ALIGN, DIRECT_READAHEAD};
pub use ramdisk::{RamDisk, RAMDISK_PAGE_SIZE};

/// Why a write was refused: the backend is read-only (a file opened with
/// [`FileBackend::open_read_only`], or a cache over one). The error inside
/// the [`io::Error`], of kind [`io::ErrorKind::PermissionDenied`], that
/// every write to it returns before anything changes.
///
/// ```
/// use kxarray::backend::{Backend, FileBackend, ReadOnly};
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let tmp = tempfile::NamedTempFile::new().unwrap();
/// let cache = PageCache::new(CacheConfig::default());
/// let file = cache.open(FileBackend::open_read_only(tmp.path()).unwrap()).unwrap();
/// let e = file.write_at(b"no", 0).unwrap_err();
/// assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
/// assert!(ReadOnly::is(&e), "{e}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOnly {
    /// The file, when the backend knows its path.
    pub path: Option<PathBuf>,
}

impl ReadOnly {
    /// The [`io::Error`] a write to a read-only backend returns.
    pub fn error(path: Option<&Path>) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            ReadOnly {
                path: path.map(Path::to_path_buf),
            },
        )
    }

    /// Whether `e` is a write refused by a read-only backend.
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<ReadOnly>())
    }
}

impl std::fmt::Display for ReadOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{} is open read-only: writes are refused", p.display()),
            None => f.write_str("the backend is read-only: writes are refused"),
        }
    }
}

impl std::error::Error for ReadOnly {}

/// A byte-addressed store with positional I/O (`pread`/`pwrite`).
///
/// The provided [`read_exact_at`](Backend::read_exact_at) and
/// [`write_all_at`](Backend::write_all_at) loop over short transfers and
/// retry [`io::ErrorKind::Interrupted`], so callers can use those and stay
/// correct over a backend that returns short counts or `EINTR`.
///
/// A backend of your own, cached in a `PageCache` (`kxarray::pagecache`):
///
/// ```
/// use kxarray::backend::{checked_end, Backend};
/// use kxarray::pagecache::{CacheConfig, PageCache};
/// use std::io;
/// use std::sync::{Arc, Mutex};
///
/// /// A growable file in a vector.
/// #[derive(Debug, Default)]
/// struct VecFile(Mutex<Vec<u8>>);
///
/// fn to_usize(n: u64) -> io::Result<usize> {
///     usize::try_from(n).map_err(|_| io::ErrorKind::FileTooLarge.into())
/// }
///
/// impl Backend for VecFile {
///     fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
///         let v = self.0.lock().unwrap();
///         let from = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
///         let n = buf.len().min(v.len() - from);
///         buf[..n].copy_from_slice(&v[from..from + n]);
///         Ok(n)
///     }
///     fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
///         let end = to_usize(checked_end(offset, buf.len() as u64)?)?;
///         let mut v = self.0.lock().unwrap();
///         if v.len() < end {
///             v.resize(end, 0);
///         }
///         v[end - buf.len()..end].copy_from_slice(buf);
///         Ok(buf.len())
///     }
///     fn flush(&self) -> io::Result<()> {
///         Ok(())
///     }
///     fn len(&self) -> io::Result<u64> {
///         Ok(self.0.lock().unwrap().len() as u64)
///     }
///     fn set_len(&self, len: u64) -> io::Result<()> {
///         self.0.lock().unwrap().resize(to_usize(len)?, 0);
///         Ok(())
///     }
/// }
///
/// let mem = Arc::new(VecFile::default());
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(Arc::clone(&mem)).unwrap();
/// file.write_at(b"cached", 100).unwrap();
/// assert_eq!(mem.len().unwrap(), 106); // the cache grew the backend first
/// assert_eq!(mem.0.lock().unwrap()[100], 0); // the bytes are still only cached
/// file.sync().unwrap();
/// assert_eq!(&mem.0.lock().unwrap()[100..], b"cached");
/// ```
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Read up to `buf.len()` bytes at `offset`; returns how many were read
    /// (0 at or past the end).
    ///
    /// # Errors
    /// Any I/O error of the medium; [`io::ErrorKind::Interrupted`] may be
    /// retried.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Write up to `buf.len()` bytes at `offset`; returns how many were
    /// written.
    ///
    /// # Errors
    /// Any I/O error of the medium; a fixed-size device refuses writes past
    /// its end.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;

    /// Make every completed write durable (`fsync`).
    ///
    /// # Errors
    /// Any I/O error of the medium.
    fn flush(&self) -> io::Result<()>;

    /// The current length in bytes.
    ///
    /// # Errors
    /// Any I/O error of the medium.
    fn len(&self) -> io::Result<u64>;

    /// Whether the backend is empty (length 0).
    ///
    /// # Errors
    /// As [`len`](Backend::len).
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Set the length: truncate or extend with zeros.
    ///
    /// # Errors
    /// [`io::ErrorKind::Unsupported`] for a fixed-size device, or any I/O
    /// error of the medium.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Make every completed write's data durable, and the metadata needed
    /// to read it back (`fdatasync`): what a database's commit needs,
    /// without the timestamps `fsync` also writes. The default is
    /// [`flush`](Backend::flush).
    ///
    /// # Errors
    /// Any I/O error of the medium.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// f.write_all_at(b"commit", 0).unwrap();
    /// f.flush_data().unwrap();
    /// ```
    fn flush_data(&self) -> io::Result<()> {
        self.flush()
    }

    /// Whether a write past the end grows the backend by itself (a file:
    /// `pwrite` extends it; `true`), so a cache may grow the file in memory
    /// and let writeback extend the backend, as the kernel grows `i_size`
    /// and writes the blocks later, instead of calling
    /// [`set_len`](Backend::set_len) on every extending write. `false` (the
    /// default) makes the cache grow the backend first, so a fixed-size
    /// device refuses an extending write before anything is cached.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend, RamDisk};
    /// assert!(FileBackend::from_file(tempfile::tempfile().unwrap()).extends_on_write());
    /// assert!(!RamDisk::new(4096).extends_on_write());
    /// ```
    fn extends_on_write(&self) -> bool {
        false
    }

    /// Whether every operation completes in memory, never waiting on a
    /// device (a RAM disk: `true`; a file, or a cache over one: `false`,
    /// the default).
    ///
    /// A server may use it to choose how many threads run one client's
    /// requests: an in-memory request takes about a microsecond, less than
    /// handing it to another thread costs, while a request that may wait
    /// on a device is worth running beside others.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    /// assert!(RamDisk::new(1 << 20).in_memory());
    /// ```
    fn in_memory(&self) -> bool {
        false
    }

    /// Whether the backend refuses every write (a file opened with
    /// [`FileBackend::open_read_only`]): `false` by default. A page cache
    /// over a read-only backend refuses writes when they are made
    /// (`CachedFile::write_at`, `write_begin`, `set_len`...: a
    /// [`ReadOnly`] error of kind [`io::ErrorKind::PermissionDenied`]), not
    /// at writeback.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend, RamDisk};
    /// assert!(!RamDisk::new(4096).is_read_only());
    /// let tmp = tempfile::NamedTempFile::new().unwrap();
    /// assert!(FileBackend::open_read_only(tmp.path()).unwrap().is_read_only());
    /// ```
    fn is_read_only(&self) -> bool {
        false
    }

    /// Discard (TRIM) `len` bytes at `offset`: later reads of whole discarded
    /// blocks return zeros. The default writes zeros.
    ///
    /// # Errors
    /// As [`write_at`](Backend::write_at).
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    ///
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// f.write_all_at(&[9; 100], 0).unwrap();
    /// f.discard(10, 80).unwrap(); // a file backend keeps the default: zeros written
    /// let mut b = [1u8; 100];
    /// f.read_exact_at(&mut b, 0).unwrap();
    /// assert!(b[..10].iter().chain(&b[90..]).all(|&x| x == 9));
    /// assert!(b[10..90].iter().all(|&x| x == 0));
    /// ```
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    /// Write `len` zero bytes at `offset`. The default writes a zeroed
    /// buffer in pieces of at most 64 KiB.
    ///
    /// # Errors
    /// As [`write_at`](Backend::write_at); [`io::ErrorKind::InvalidInput`]
    /// when `offset + len` overflows `u64`.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    ///
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// f.write_zeroes(4096, 100_000).unwrap(); // extends the file as any write does
    /// assert_eq!(f.len().unwrap(), 104_096);
    /// let e = f.write_zeroes(u64::MAX, 2).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// ```
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = checked_end(offset, len)?;
        let zeros = [0u8; 64 * 1024];
        let mut at = offset;
        while at < end {
            // Bounded by the buffer's 64 KiB, so the cast is lossless.
            let n = (end - at).min(zeros.len() as u64) as usize;
            self.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// This backend's file for a cache shared by processes
    /// (the page cache's `CacheConfig::shared`):
    /// a descriptor of its own (a duplicate: the shared cache reads, writes
    /// back and syncs through it) and the file's path (for a process that
    /// must write back a dead one's pages). `None` (the default): the
    /// backend is not a file any other process can open, and is cached
    /// privately.
    #[cfg(unix)]
    fn file_for_sharing(&self) -> Option<(std::os::fd::OwnedFd, std::path::PathBuf)> {
        None
    }

    /// The largest readahead window a page cache should read ahead of a
    /// sequential reader of this backend, in bytes; `None` (the default)
    /// leaves the cache's default (128 KiB, the kernel's). A backend that
    /// bypasses the kernel's page cache (`O_DIRECT`: [`FileBackend`] made
    /// by `create_direct`) asks for more, since the kernel reads nothing
    /// ahead for it.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    /// assert_eq!(RamDisk::new(4096).readahead_max(), None);
    /// ```
    fn readahead_max(&self) -> Option<u64> {
        None
    }

    /// Submit a read of up to `buf.len()` bytes at `offset` and return at
    /// once; the completion gives what [`read_at`](Backend::read_at) would
    /// have returned, and the buffer back. The backend owns the buffer
    /// until then: dropping the completion does not free it early.
    ///
    /// The default reads synchronously with `read_at` and returns a
    /// finished completion, so every backend has a submission side;
    /// [`FileBackend`] submits to the I/O engine and returns at once.
    ///
    /// # Errors
    /// In the completion, as `read_at`.
    ///
    /// ```
    /// use kxarray::aio::AlignedBuf;
    /// use kxarray::backend::{Backend, FileBackend, RamDisk};
    ///
    /// let disk = RamDisk::new(8192);
    /// disk.write_all_at(b"ram", 4096).unwrap();
    /// let (n, buf) = disk.submit_read(Box::new(vec![0u8; 3]), 4096).wait();
    /// assert_eq!((n.unwrap(), buf.as_slice()), (3, &b"ram"[..]));
    ///
    /// let file = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// file.write_all_at(&[5; 8192], 0).unwrap();
    /// let c = file.submit_read(Box::new(AlignedBuf::new(4096)), 4096); // in flight
    /// let (n, buf) = c.wait();
    /// assert_eq!(n.unwrap(), 4096);
    /// assert!(buf.as_slice().iter().all(|&b| b == 5));
    /// ```
    fn submit_read(&self, mut buf: ReadBuf, offset: u64) -> Completion<ReadBuf> {
        let res = self.read_at(buf.as_mut_slice(), offset);
        Completion::ready(res, buf)
    }

    /// Submit many reads together (misses a reader can issue at once); one
    /// completion per request, in order. The default submits them one by
    /// one with [`submit_read`](Backend::submit_read); [`FileBackend`]
    /// submits them in one batch.
    ///
    /// # Errors
    /// In each completion, as `read_at`; one request's error does not
    /// touch the others.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend, ReadBuf};
    ///
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// f.write_all_at(b"abcdefgh", 0).unwrap();
    /// let reqs: Vec<(u64, ReadBuf)> = (0..4).map(|i| (2 * i, Box::new(vec![0u8; 2]) as ReadBuf)).collect();
    /// let got: Vec<Vec<u8>> = f.read_many(reqs).into_iter().map(|c| c.wait().1.as_slice().to_vec()).collect();
    /// assert_eq!(got.concat(), b"abcdefgh");
    /// ```
    fn read_many(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<Completion<ReadBuf>> {
        reqs.into_iter()
            .map(|(offset, buf)| self.submit_read(buf, offset))
            .collect()
    }

    /// Submit a write of up to `buf.len()` bytes at `offset`; the
    /// completion gives what [`write_at`](Backend::write_at) would have
    /// returned, and the buffer back. The default writes synchronously.
    ///
    /// # Errors
    /// In the completion, as `write_at`.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    ///
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// let (n, _) = f.submit_write(Box::new(b"queued".to_vec()), 10).wait();
    /// assert_eq!(n.unwrap(), 6);
    /// assert_eq!(f.len().unwrap(), 16);
    /// ```
    fn submit_write(&self, buf: WriteBuf, offset: u64) -> Completion<WriteBuf> {
        let res = self.write_at(buf.as_slice(), offset);
        Completion::ready(res, buf)
    }

    /// Read exactly `buf.len()` bytes at `offset`, looping over short reads
    /// and retrying `EINTR`.
    ///
    /// # Errors
    /// [`io::ErrorKind::UnexpectedEof`] when the end comes first (the bytes
    /// read so far are in `buf`), or the first other error.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(8192);
    /// disk.write_all_at(b"tail", 8188).unwrap();
    /// let mut buf = [0u8; 8];
    /// let e = disk.read_exact_at(&mut buf, 8188).unwrap_err(); // 4 bytes short
    /// assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    /// assert_eq!(&buf[..4], b"tail"); // the bytes read so far
    /// ```
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Write all of `buf` at `offset`, looping over short writes and
    /// retrying `EINTR`.
    ///
    /// # Errors
    /// [`io::ErrorKind::WriteZero`] when the backend accepts nothing, or the
    /// first other error.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(8192);
    /// disk.write_all_at(&[1; 5000], 3000).unwrap(); // across a page boundary
    /// let mut b = [0u8; 5000];
    /// disk.read_exact_at(&mut b, 3000).unwrap();
    /// assert!(b.iter().all(|&x| x == 1));
    /// let e = disk.write_all_at(b"xy", 8191).unwrap_err(); // past the end
    /// assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
    /// ```
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The buffer a read submitted to a backend fills: owned and boxed, so the
/// backend (and the engine below it) holds it until the read is finished,
/// whatever the caller does meanwhile. [`downcast_buf`](crate::aio::downcast_buf)
/// gives back the caller's own type.
pub type ReadBuf = Box<dyn IoBufMut>;

/// The buffer a write submitted to a backend takes its bytes from.
pub type WriteBuf = Box<dyn IoBuf>;

/// `offset + len`, or [`io::ErrorKind::InvalidInput`] when it overflows.
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] on overflow.
///
/// ```
/// use kxarray::backend::checked_end;
///
/// assert_eq!(checked_end(4096, 512).unwrap(), 4608);
/// let e = checked_end(u64::MAX, 1).unwrap_err();
/// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
/// ```
pub fn checked_end(offset: u64, len: u64) -> io::Result<u64> {
    offset.checked_add(len).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset {offset} + length {len} overflows u64"),
        )
    })
}

impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn len(&self) -> io::Result<u64> {
        (**self).len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
    fn in_memory(&self) -> bool {
        (**self).in_memory()
    }
    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }
    fn flush_data(&self) -> io::Result<()> {
        (**self).flush_data()
    }
    fn extends_on_write(&self) -> bool {
        (**self).extends_on_write()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_zeroes(offset, len)
    }
    fn readahead_max(&self) -> Option<u64> {
        (**self).readahead_max()
    }
    #[cfg(unix)]
    fn file_for_sharing(&self) -> Option<(std::os::fd::OwnedFd, std::path::PathBuf)> {
        (**self).file_for_sharing()
    }
    fn submit_read(&self, buf: ReadBuf, offset: u64) -> Completion<ReadBuf> {
        (**self).submit_read(buf, offset)
    }
    fn read_many(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<Completion<ReadBuf>> {
        (**self).read_many(reqs)
    }
    fn submit_write(&self, buf: WriteBuf, offset: u64) -> Completion<WriteBuf> {
        (**self).submit_write(buf, offset)
    }
}
