//! Storage backends: where a page cache reads from and writes back to, and
//! what the NBD server serves.
//!
//! Owns the [`Backend`] trait: positional reads and writes, flush, length,
//! discard. Implementations are `Send + Sync` and take `&self`, so several
//! threads (readers missing in the cache, the flusher, NBD workers) can use
//! one backend at once; each implementation documents what concurrent
//! writes to the same bytes do.
//!
//! Invariants every implementation keeps:
//! - `read_at`/`write_at` never touch bytes outside `offset..offset + buf.len()`;
//! - an error leaves the bytes it did not report as transferred unspecified
//!   but never touches anything outside the request;
//! - after `flush` returns `Ok`, every write that returned before the
//!   `flush` was called is durable (as far as the medium allows).

use std::io;

mod file;
mod ramdisk;

pub use file::{FileBackend, DIRECT_ALIGN};
pub use ramdisk::{RamDisk, RAMDISK_PAGE_SIZE};

/// A byte-addressed store with positional I/O (`pread`/`pwrite`).
///
/// The provided [`read_exact_at`](Backend::read_exact_at) and
/// [`write_all_at`](Backend::write_all_at) loop over short transfers and
/// retry [`io::ErrorKind::Interrupted`], so callers can use those and stay
/// correct over a backend that returns short counts or `EINTR`.
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

    /// Discard (TRIM) `len` bytes at `offset`: later reads of whole discarded
    /// blocks return zeros. The default writes zeros.
    ///
    /// # Errors
    /// As [`write_at`](Backend::write_at).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    /// Write `len` zero bytes at `offset`. The default writes a zeroed
    /// buffer in pieces of at most 64 KiB.
    ///
    /// # Errors
    /// As [`write_at`](Backend::write_at); [`io::ErrorKind::InvalidInput`]
    /// when `offset + len` overflows `u64`.
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

    /// Read exactly `buf.len()` bytes at `offset`, looping over short reads
    /// and retrying `EINTR`.
    ///
    /// # Errors
    /// [`io::ErrorKind::UnexpectedEof`] when the end comes first (the bytes
    /// read so far are in `buf`), or the first other error.
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

/// `offset + len`, or [`io::ErrorKind::InvalidInput`] when it overflows.
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] on overflow.
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
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_zeroes(offset, len)
    }
}
