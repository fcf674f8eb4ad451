//! [`FileBackend`]: a real file with positional I/O (`pread`/`pwrite`
//! through [`std::os::unix::fs::FileExt`]), optionally opened with
//! `O_DIRECT`, or read-only.
//!
//! Owns the open file descriptors (shared with the I/O engine while a
//! submitted request is in flight, so they stay open until it completes).
//! Invariants: a read-only backend refuses every write, truncation and
//! discard before any system call ([`ReadOnly`]); an open error names the
//! path; in direct mode every request
//! whose offset and length are multiples of [`DIRECT_ALIGN`] goes through the
//! `O_DIRECT` descriptor from a buffer aligned to [`DIRECT_ALIGN`] (the
//! caller's if it already is, a bounce buffer otherwise); any other request
//! goes through a second, buffered descriptor of the same file, so unaligned
//! heads and tails (a file's last partial block) still work. The submission
//! side follows the same rule on the I/O engine ([`crate::aio`]): aligned
//! requests go to the `O_DIRECT` descriptor, through an aligned bounce
//! buffer when the caller's is not aligned. Concurrent writes to the same
//! bytes are whatever the kernel makes of two `pwrite`s.

use super::{checked_end, Backend, ReadBuf, ReadOnly, WriteBuf};
use crate::aio::{Completion, IoBuf, IoEngine};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Offset, length and buffer alignment `O_DIRECT` requests use.
pub const DIRECT_ALIGN: usize = 4096;

/// The readahead window a page cache uses over a direct [`FileBackend`]
/// ([`Backend::readahead_max`]): 4 MiB, measured in `docs/readahead.md`
/// (the kernel reads nothing ahead for `O_DIRECT`, so the cache's window
/// is the device's only queue depth for a sequential reader).
pub const DIRECT_READAHEAD: u64 = 4 << 20;

/// `O_DIRECT` for this target, if known without `libc`.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "x86", target_arch = "riscv64")
))]
const O_DIRECT: Option<i32> = Some(0o40000);
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "powerpc64"
    )
))]
const O_DIRECT: Option<i32> = Some(0o200000);
#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "riscv64",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "powerpc64"
    )
)))]
const O_DIRECT: Option<i32> = None;

/// A file used as a backend.
///
/// Which constructor: [`open`](FileBackend::open) an existing file to read
/// and write it (a mistyped path is an error, not a new empty file),
/// [`open_read_only`](FileBackend::open_read_only) one to read it (writes
/// are refused when made, with [`ReadOnly`]), [`create`](FileBackend::create)
/// one that may not exist yet, [`create_direct`](FileBackend::create_direct)
/// for `O_DIRECT` below the cache, or [`from_file`](FileBackend::from_file)
/// a descriptor you opened. Open errors name the path.
///
/// ```
/// use kxarray::backend::{Backend, FileBackend};
///
/// let path = std::env::temp_dir().join(format!("kx-doc-{}", std::process::id()));
/// let f = FileBackend::create(&path).unwrap();
/// f.write_all_at(b"hello", 10).unwrap();
/// assert_eq!(f.len().unwrap(), 15);
/// let mut b = [0u8; 5];
/// f.read_exact_at(&mut b, 10).unwrap();
/// assert_eq!(&b, b"hello");
/// # std::fs::remove_file(&path).unwrap();
/// ```
#[derive(Debug)]
pub struct FileBackend {
    file: Arc<File>,
    direct: Option<Arc<File>>,
    /// The engine submitted requests go to; `None`: [`IoEngine::global`].
    engine: Option<IoEngine>,
    /// The path it was opened by, if it was (for errors).
    path: Option<PathBuf>,
    /// Opened read-only: every write is refused ([`ReadOnly`]).
    read_only: bool,
}

/// `e` with the operation and the path in its message (its kind kept).
fn at_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl FileBackend {
    /// Wrap an open file (buffered I/O).
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    ///
    /// let tmp = tempfile::tempfile().unwrap(); // deleted when closed
    /// let f = FileBackend::from_file(tmp.try_clone().unwrap());
    /// f.write_all_at(b"abc", 0).unwrap();
    /// assert_eq!(tmp.metadata().unwrap().len(), 3); // the same file
    /// ```
    pub fn from_file(file: File) -> FileBackend {
        FileBackend {
            file: Arc::new(file),
            direct: None,
            engine: None,
            path: None,
            read_only: false,
        }
    }

    /// Open the existing file `path` for reading and writing, buffered.
    ///
    /// # Errors
    /// Any error of `open(2)` (its kind kept, the path in its message):
    /// [`io::ErrorKind::NotFound`] when there is no such file.
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend};
    ///
    /// let tmp = tempfile::NamedTempFile::new().unwrap();
    /// let f = FileBackend::open(tmp.path()).unwrap();
    /// f.write_all_at(b"abc", 0).unwrap();
    /// let e = FileBackend::open("/no/such/file".as_ref()).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    /// assert!(e.to_string().contains("/no/such/file"), "{e}");
    /// ```
    pub fn open(path: &Path) -> io::Result<FileBackend> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| at_path(e, "open", path))?;
        Ok(FileBackend {
            path: Some(path.to_path_buf()),
            ..FileBackend::from_file(file)
        })
    }

    /// Open the existing file `path` for reading only. Every write,
    /// truncation and discard is refused, before any system call, with a
    /// [`ReadOnly`] error (kind [`io::ErrorKind::PermissionDenied`]); so is
    /// a write to a page cache over it, when it is made
    /// ([`Backend::is_read_only`]).
    ///
    /// # Errors
    /// Any error of `open(2)` (its kind kept, the path in its message).
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend, ReadOnly};
    ///
    /// let tmp = tempfile::NamedTempFile::new().unwrap();
    /// std::fs::write(tmp.path(), b"kept").unwrap();
    /// let f = FileBackend::open_read_only(tmp.path()).unwrap();
    /// let mut b = [0u8; 4];
    /// f.read_exact_at(&mut b, 0).unwrap();
    /// assert_eq!(&b, b"kept");
    /// let e = f.write_at(b"lost", 0).unwrap_err();
    /// assert!(ReadOnly::is(&e), "{e}");
    /// ```
    pub fn open_read_only(path: &Path) -> io::Result<FileBackend> {
        let file = File::open(path).map_err(|e| at_path(e, "open", path))?;
        Ok(FileBackend {
            path: Some(path.to_path_buf()),
            read_only: true,
            ..FileBackend::from_file(file)
        })
    }

    /// The refusal of a write, if this backend is read-only.
    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            Err(ReadOnly::error(self.path.as_deref()))
        } else {
            Ok(())
        }
    }

    /// Submit this backend's requests ([`Backend::submit_read`] and the
    /// others) to `engine` rather than the process's
    /// ([`IoEngine::global`]).
    ///
    /// ```
    /// use kxarray::aio::{EngineChoice, EngineKind, IoEngine, IoSettings};
    /// use kxarray::backend::FileBackend;
    ///
    /// let pool = IoEngine::new(&IoSettings::default().engine(EngineChoice::Threads)).unwrap();
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap()).with_engine(pool);
    /// assert_eq!(f.engine().kind(), EngineKind::Threads);
    /// ```
    pub fn with_engine(mut self, engine: IoEngine) -> FileBackend {
        self.engine = Some(engine);
        self
    }

    /// The engine this backend submits to.
    pub fn engine(&self) -> &IoEngine {
        self.engine.as_ref().unwrap_or_else(|| IoEngine::global())
    }

    /// Open (creating if needed) `path` for reading and writing, buffered.
    /// An existing file keeps its bytes. To open a file that must exist,
    /// use [`open`](FileBackend::open): a mistyped path then fails instead
    /// of making an empty file.
    ///
    /// # Errors
    /// Any error of `open(2)` (its kind kept, the path in its message).
    pub fn create(path: &Path) -> io::Result<FileBackend> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| at_path(e, "open", path))?;
        Ok(FileBackend {
            path: Some(path.to_path_buf()),
            ..FileBackend::from_file(file)
        })
    }

    /// Open (creating if needed) `path` for reading and writing with
    /// `O_DIRECT` for aligned requests (see the module notes).
    ///
    /// # Errors
    /// [`io::ErrorKind::Unsupported`] when the target's `O_DIRECT` value is
    /// not known or the filesystem refuses `O_DIRECT` (`EINVAL`: tmpfs
    /// before Linux 6.6, some FUSE and network filesystems), with a message
    /// saying so; any other error of `open(2)` (its kind kept, the path in
    /// its message).
    ///
    /// ```
    /// use kxarray::backend::{Backend, FileBackend, DIRECT_ALIGN};
    ///
    /// let path = std::env::temp_dir().join(format!("kx-doc-direct-{}", std::process::id()));
    /// let opened = FileBackend::create_direct(&path);
    /// let _ = std::fs::remove_file(&path); // open descriptors keep the file
    /// match opened {
    ///     Ok(f) => {
    ///         assert!(f.is_direct());
    ///         f.write_all_at(&vec![7; DIRECT_ALIGN], 0).unwrap(); // aligned: O_DIRECT
    ///         f.write_all_at(b"tail", DIRECT_ALIGN as u64).unwrap(); // buffered
    ///         let mut b = vec![0u8; DIRECT_ALIGN + 4];
    ///         f.read_exact_at(&mut b, 0).unwrap();
    ///         assert_eq!((b[0], &b[DIRECT_ALIGN..]), (7, &b"tail"[..]));
    ///     }
    ///     // a filesystem that refuses O_DIRECT (tmpfs before Linux 6.6)
    ///     Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}"),
    /// }
    /// ```
    pub fn create_direct(path: &Path) -> io::Result<FileBackend> {
        let Some(flag) = O_DIRECT else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "O_DIRECT is not available on this target",
            ));
        };
        let buffered = FileBackend::create(path)?;
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flag)
            .open(path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::InvalidInput {
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "the filesystem of {} refuses O_DIRECT ({e}); use buffered I/O",
                            path.display()
                        ),
                    )
                } else {
                    at_path(e, "open (O_DIRECT)", path)
                }
            })?;
        Ok(FileBackend {
            direct: Some(Arc::new(direct)),
            ..buffered
        })
    }

    /// Whether aligned requests bypass the kernel's page cache: true only
    /// for a backend made by [`create_direct`](FileBackend::create_direct).
    ///
    /// ```
    /// use kxarray::backend::FileBackend;
    ///
    /// let f = FileBackend::from_file(tempfile::tempfile().unwrap());
    /// assert!(!f.is_direct()); // buffered
    /// ```
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The descriptor for a request, or `None` for the buffered one.
    fn direct_for(&self, offset: u64, len: usize) -> Option<&Arc<File>> {
        let a = DIRECT_ALIGN as u64;
        let d = self.direct.as_ref()?;
        (offset.is_multiple_of(a) && len.is_multiple_of(DIRECT_ALIGN) && len > 0).then_some(d)
    }
}

/// A zeroed region of `len` bytes aligned to [`DIRECT_ALIGN`], carved out of
/// a slightly larger vector (no unsafe code needed).
struct Bounce {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Bounce {
    fn new(len: usize) -> Bounce {
        let buf = vec![0u8; len + DIRECT_ALIGN];
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
        Bounce { buf, start, len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// The largest offset a file can have: `off_t`'s maximum.
const MAX_OFFSET: u64 = i64::MAX as u64;

/// Refuse a range past [`MAX_OFFSET`] with an error naming it (`EFBIG` for
/// writes and sizes, `EINVAL` for reads, as the kernel answers), rather than
/// the standard library's "out of range integral type conversion".
fn check_range(what: &str, offset: u64, len: u64) -> io::Result<()> {
    let end = checked_end(offset, len)?;
    if end <= MAX_OFFSET {
        return Ok(());
    }
    let kind = if what == "read" {
        io::ErrorKind::InvalidInput
    } else {
        io::ErrorKind::FileTooLarge
    };
    Err(io::Error::new(
        kind,
        format!("{what} of {len} bytes at offset {offset} ends past the largest file offset, {MAX_OFFSET}"),
    ))
}

fn aligned(p: *const u8) -> bool {
    p.align_offset(DIRECT_ALIGN) == 0
}

impl Backend for FileBackend {
    /// [`DIRECT_READAHEAD`] for a direct backend (the kernel reads nothing
    /// ahead below it); the cache's default otherwise.
    fn readahead_max(&self) -> Option<u64> {
        self.is_direct().then_some(DIRECT_READAHEAD)
    }

    /// A duplicate of the buffered descriptor and the file's path as the
    /// kernel names it (`/proc/self/fd`); `None` for a file with no path
    /// any other process could open (unlinked, or anonymous).
    #[cfg(target_os = "linux")]
    fn file_for_sharing(&self) -> Option<(std::os::fd::OwnedFd, std::path::PathBuf)> {
        use std::os::fd::AsRawFd;
        let fd = self.file.try_clone().ok()?;
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        if !path.is_absolute() || path.to_string_lossy().ends_with(" (deleted)") {
            return None;
        }
        Some((fd.into(), path))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_range("read", offset, buf.len() as u64)?;
        match self.direct_for(offset, buf.len()) {
            Some(d) if aligned(buf.as_ptr()) => d.read_at(buf, offset),
            Some(d) => {
                let mut b = Bounce::new(buf.len());
                let n = d.read_at(b.bytes(), offset)?;
                buf[..n].copy_from_slice(&b.bytes()[..n]);
                Ok(n)
            }
            None => self.file.read_at(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.writable()?;
        check_range("write", offset, buf.len() as u64)?;
        match self.direct_for(offset, buf.len()) {
            Some(d) if aligned(buf.as_ptr()) => d.write_at(buf, offset),
            Some(d) => {
                let mut b = Bounce::new(buf.len());
                b.bytes().copy_from_slice(buf);
                d.write_at(b.bytes(), offset)
            }
            None => self.file.write_at(buf, offset),
        }
    }

    /// On the I/O engine: returns once the read is submitted.
    fn submit_read(&self, buf: ReadBuf, offset: u64) -> Completion<ReadBuf> {
        if let Err(e) = check_range("read", offset, buf.bytes_len() as u64) {
            return Completion::ready(Err(e), buf);
        }
        match self.direct_for(offset, buf.bytes_len()) {
            Some(d) => self.engine().read_aligned(d, offset, buf, DIRECT_ALIGN),
            None => self.engine().read(&self.file, offset, buf),
        }
    }

    /// On the I/O engine, the requests that can go together in one
    /// submission each (direct ones, buffered ones); a direct read into a
    /// misaligned buffer takes a bounce buffer of its own.
    fn read_many(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<Completion<ReadBuf>> {
        let mut out: Vec<Option<Completion<ReadBuf>>> = reqs.iter().map(|_| None).collect();
        let (mut direct, mut buffered) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for (i, (offset, buf)) in reqs.into_iter().enumerate() {
            let len = buf.bytes_len();
            if let Err(e) = check_range("read", offset, len as u64) {
                out[i] = Some(Completion::ready(Err(e), buf));
                continue;
            }
            let group = match self.direct_for(offset, len) {
                Some(d) if !aligned(buf.stable_ptr()) => {
                    out[i] = Some(self.engine().read_aligned(d, offset, buf, DIRECT_ALIGN));
                    continue;
                }
                Some(_) => &mut direct,
                None => &mut buffered,
            };
            group.0.push(i);
            group.1.push((offset, buf));
        }
        let groups = [(self.direct.as_ref(), direct), (Some(&self.file), buffered)];
        for (file, (at, reqs)) in groups {
            if let Some(file) = file.filter(|_| !reqs.is_empty()) {
                for (i, c) in at.into_iter().zip(self.engine().read_many(file, reqs)) {
                    out[i] = Some(c);
                }
            }
        }
        out.into_iter()
            .map(|c| c.expect("every request has its completion"))
            .collect()
    }

    /// On the I/O engine: returns once the write is submitted.
    fn submit_write(&self, buf: WriteBuf, offset: u64) -> Completion<WriteBuf> {
        if let Err(e) = self
            .writable()
            .and_then(|()| check_range("write", offset, buf.bytes_len() as u64))
        {
            return Completion::ready(Err(e), buf);
        }
        match self.direct_for(offset, buf.bytes_len()) {
            Some(d) => self.engine().write_aligned(d, offset, buf, DIRECT_ALIGN),
            None => self.engine().write(&self.file, offset, buf),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn flush_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// `pwrite` past the end extends a file.
    fn extends_on_write(&self) -> bool {
        true
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range("set_len", 0, len)?;
        self.file.set_len(len)
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("kx-fb-{name}-{}", std::process::id()))
    }

    #[test]
    fn buffered_round_trip_len_and_truncate() {
        let p = temp("buf");
        let f = FileBackend::create(&p).unwrap();
        assert!(!f.is_direct());
        f.write_all_at(&[5u8; 10_000], 3).unwrap();
        assert_eq!(f.len().unwrap(), 10_003);
        let mut b = vec![0u8; 20_000];
        assert_eq!(f.read_at(&mut b, 0).unwrap(), 10_003);
        assert_eq!(&b[..3], &[0, 0, 0]);
        assert!(b[3..10_003].iter().all(|&x| x == 5));
        f.set_len(5).unwrap();
        assert_eq!(f.len().unwrap(), 5);
        assert_eq!(
            f.read_exact_at(&mut b, 0).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            f.write_at(b"x", u64::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // Past off_t: a named limit, not a failed integer conversion.
        for e in [
            f.set_len(u64::MAX).unwrap_err(),
            f.write_at(b"xy", i64::MAX as u64).unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
            assert!(e.to_string().contains(&i64::MAX.to_string()), "{e}");
        }
        let e = f.read_at(&mut b[..2], i64::MAX as u64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        f.write_zeroes(0, 5).unwrap();
        f.flush().unwrap();
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn direct_mode_round_trips_or_refuses_clearly() {
        let p = temp("direct");
        match FileBackend::create_direct(&p) {
            Ok(f) => {
                assert!(f.is_direct());
                // Aligned (direct path, bounce buffer: a Vec is not 4 KiB
                // aligned in general) and unaligned (buffered path).
                let data: Vec<u8> = (0..2 * DIRECT_ALIGN).map(|i| i as u8).collect();
                f.write_all_at(&data, DIRECT_ALIGN as u64).unwrap();
                f.write_all_at(b"tail", 3 * DIRECT_ALIGN as u64).unwrap();
                let mut b = vec![0u8; 2 * DIRECT_ALIGN];
                f.read_exact_at(&mut b, DIRECT_ALIGN as u64).unwrap();
                assert_eq!(b, data);
                let mut t = [0u8; 4];
                f.read_exact_at(&mut t, 3 * DIRECT_ALIGN as u64).unwrap();
                assert_eq!(&t, b"tail");
                f.flush().unwrap();
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}"),
        }
        let _ = std::fs::remove_file(&p);
    }
}
