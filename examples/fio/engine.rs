//! The engines the fio example drives: the one place where the engines
//! differ. The job loop (in `main.rs`) calls [`Engine::read`] and
//! [`Engine::write`] and nothing else, the same way for every engine, with
//! the same buffers, offsets and bookkeeping; each engine is monomorphized
//! into its own copy of that loop, so none pays a dynamic dispatch the
//! others do not.
//!
//! Owns the rule every engine keeps: `read` shows the harness every byte of
//! the block, in file order, as one or more pieces that start at multiples
//! of 8 bytes into the block, and returns only after the last piece was
//! shown (a zero-copy engine holds its borrow while the harness looks).
//! [`Mapping`] owns a `MAP_SHARED` mapping of the file: the mapping lives
//! until it is dropped, and the slice it lends is the only reference to its
//! memory in the process while it lives (`&mut self`).

use kxarray::pagecache::CachedFile;
use kxarray::Guard;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

/// One job's handle on the bytes under test.
pub(crate) trait Engine {
    /// Read the `buf.len()` bytes at file offset `off` and show them to
    /// `see` in file order: a copying engine copies them into `buf` and
    /// shows `buf`; the zero-copy engine shows the cache's own bytes, one
    /// piece per folio, while it holds them.
    ///
    /// # Errors
    /// The engine's I/O error, or a short read.
    fn read(&mut self, off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()>;

    /// Write all of `buf` at file offset `off`.
    ///
    /// # Errors
    /// The engine's I/O error, or a short write.
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()>;

    /// Make the job's writes durable (`--fsync N`): the cache's `sync`,
    /// `fsync(2)`, or `msync(2)` of the job's slice of a mapping.
    ///
    /// # Errors
    /// The engine's sync error.
    fn sync(&mut self) -> io::Result<()>;

    /// Read several blocks at once (`--iodepth N`): each `(offset, buf)`
    /// filled, one result per request, in order. The default reads them
    /// one after the other (a synchronous engine: fio's psync ignores its
    /// iodepth too); the kxarray engine hands the whole batch to the page
    /// cache ([`read_many`]).
    fn read_many(&mut self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        reqs.iter_mut()
            .map(|(off, buf)| {
                let n = buf.len();
                self.read(*off, buf, &mut |_| {}).map(|()| n)
            })
            .collect()
    }

    /// The page cache under the engine, for `--iodepth-api future` (a
    /// window of `CachedFile::read_owned` futures); `None` for the others.
    fn cached_file(&self) -> Option<&CachedFile> {
        None
    }
}

/// The page cache's batch read (`CachedFile::read_many`): every
/// request's hits copied, its misses submitted together through the I/O
/// engine, so `reqs.len()` reads are in flight at once.
pub(crate) fn read_many(
    file: &CachedFile,
    reqs: &mut [(u64, &mut [u8])],
) -> Vec<io::Result<usize>> {
    file.read_many(reqs)
}

fn short(what: &str, off: u64, got: usize, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("short {what} at {off}: {got} of {want} bytes"),
    )
}

/// `--engine kxarray`: `CachedFile::read_at` (a copy out of the cache) and
/// `write_at`.
pub(crate) struct ReadAt<'a> {
    pub(crate) file: &'a CachedFile,
}

impl Engine for ReadAt<'_> {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()> {
        let got = self.file.read_at(buf, off)?;
        if got != buf.len() {
            return Err(short("read", off, got, buf.len()));
        }
        see(buf);
        Ok(())
    }

    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        let put = self.file.write_at(buf, off)?;
        if put != buf.len() {
            return Err(short("write", off, put, buf.len()));
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync()
    }

    fn read_many(&mut self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        read_many(self.file, reqs)
    }

    fn cached_file(&self) -> Option<&CachedFile> {
        Some(self.file)
    }
}

/// When the zero-copy engine pins its epoch guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PinMode {
    /// A guard pinned and dropped around every read (what a caller doing
    /// one read at a time pays: the like-for-like comparison).
    Io,
    /// One guard for a batch of reads, re-pinned every `PIN_BATCH` reads
    /// (and dropped before a write), as an engine parsing many pages would.
    Batch,
}

/// Reads per guard with `--pin batch` (the hit-path benchmark's batch).
pub(crate) const PIN_BATCH: u32 = 64;

const PAGE: u64 = 4096;

/// `--engine kxarray --zero-copy`: `CachedFile::read_folio_in` under an
/// epoch guard (pinned per `PinMode`), showing the folio's bytes in place;
/// writes are `write_at`.
pub(crate) struct ZeroCopy<'a> {
    pub(crate) file: &'a CachedFile,
    pub(crate) pin: PinMode,
    /// The batch's guard (`PinMode::Batch`) and the reads it has served.
    guard: Option<Guard>,
    served: u32,
}

impl<'a> ZeroCopy<'a> {
    pub(crate) fn new(file: &'a CachedFile, pin: PinMode) -> Self {
        ZeroCopy {
            file,
            pin,
            guard: None,
            served: 0,
        }
    }
}

/// Show the `len` bytes at `off` from the folios borrowed under `guard`.
#[inline]
fn show_in_place(
    file: &CachedFile,
    guard: &Guard,
    off: u64,
    len: usize,
    see: &mut impl FnMut(&[u8]),
) -> io::Result<()> {
    let end = off + len as u64;
    let mut pos = off;
    while pos < end {
        let folio = file.read_folio_in(pos / PAGE, guard)?;
        let start = folio.index() * PAGE;
        let from = pos.checked_sub(start).map(|d| d as usize);
        let to = (end - start).min(folio.len() as u64) as usize;
        match from {
            Some(from) if from < to => {
                see(&folio[from..to]);
                pos = start + to as u64;
            }
            _ => {
                return Err(io::Error::other(format!(
                    "the folio lent for byte {pos} (index {}, {} bytes) does not hold it",
                    folio.index(),
                    folio.len()
                )))
            }
        }
    }
    Ok(())
}

impl Engine for ZeroCopy<'_> {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()> {
        match self.pin {
            PinMode::Io => show_in_place(self.file, &kxarray::pin(), off, buf.len(), see),
            PinMode::Batch => {
                if self.served == PIN_BATCH {
                    self.served = 0;
                    if let Some(g) = &mut self.guard {
                        g.repin();
                    }
                }
                self.served += 1;
                let guard = self.guard.get_or_insert_with(kxarray::pin);
                show_in_place(self.file, guard, off, buf.len(), see)
            }
        }
    }

    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        // No guard held across a write (it may wait for this thread's
        // readers otherwise); the next read pins afresh.
        self.guard = None;
        self.served = 0;
        ReadAt { file: self.file }.write(off, buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.guard = None;
        self.served = 0;
        self.file.sync()
    }
}

/// `--engine psync`: `pread(2)`/`pwrite(2)` on a descriptor of its own (as
/// each fio job opens the file itself).
pub(crate) struct Psync {
    pub(crate) file: File,
}

impl Engine for Psync {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()> {
        let got = self.file.read_at(buf, off)?;
        if got != buf.len() {
            return Err(short("pread", off, got, buf.len()));
        }
        see(buf);
        Ok(())
    }

    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        let put = self.file.write_at(buf, off)?;
        if put != buf.len() {
            return Err(short("pwrite", off, put, buf.len()));
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// `--engine mmap` and `--engine memcpy`: `memcpy` out of and into memory
/// holding the job's slice of the file: a `MAP_SHARED` mapping of the file
/// (mmap) or a plain heap buffer (memcpy, the floor). `base` is the file
/// offset of `mem[0]`; `mapped` says `mem` lies in a [`Mapping`].
pub(crate) struct Slice<'a> {
    pub(crate) mem: &'a mut [u8],
    pub(crate) base: u64,
    pub(crate) mapped: bool,
}

impl Slice<'_> {
    fn range(&self, off: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        off.checked_sub(self.base)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| Some(at..at.checked_add(len)?))
            .filter(|r| r.end <= self.mem.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{len} bytes at {off}: outside this job's slice"),
                )
            })
    }
}

impl Engine for Slice<'_> {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()> {
        let r = self.range(off, buf.len())?;
        buf.copy_from_slice(&self.mem[r]);
        see(buf);
        Ok(())
    }

    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        let r = self.range(off, buf.len())?;
        self.mem[r].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        if !self.mapped || self.mem.is_empty() {
            return Ok(());
        }
        // msync takes a page-aligned start: from the page holding mem[0].
        let lead = self.mem.as_ptr() as usize % page_size();
        let start = self.mem.as_mut_ptr().wrapping_sub(lead);
        // SAFETY: `start..mem.end` lies in the mapping holding `mem` (a
        // mapping starts on a page boundary, so the page of mem[0] is in
        // it); msync reads and writes no memory of this process.
        if unsafe { libc::msync(start.cast(), self.mem.len() + lead, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096)
}

/// `--engine null`: moves no bytes (shows the buffer as it is): the
/// harness's own cost per I/O, to subtract from the others'.
pub(crate) struct Null;

impl Engine for Null {
    #[inline]
    fn read(&mut self, _off: u64, buf: &mut [u8], see: &mut impl FnMut(&[u8])) -> io::Result<()> {
        see(buf);
        Ok(())
    }

    #[inline]
    fn write(&mut self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A `MAP_SHARED`, read-write mapping of the first `len` bytes of a file,
/// advised `MADV_RANDOM` or `MADV_SEQUENTIAL` as fio's mmap engine does.
///
/// The file must keep at least `len` bytes while mapped: another process
/// truncating it would make an access fault (`SIGBUS`), and one writing it
/// would race with the harness, as with any user of `mmap`. The harness
/// owns its file for the run.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Map the first `len` bytes (at least 1) of `file`, opened read-write.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when `len` is 0 or past the file's
    /// end; the error of `mmap(2)` or `madvise(2)`.
    pub(crate) fn new(file: &File, len: usize, random: bool) -> io::Result<Mapping> {
        let file_len = file.metadata()?.len();
        if len == 0 || len as u64 > file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot map {len} bytes of a {file_len}-byte file"),
            ));
        }
        // SAFETY: a new mapping at an address the kernel chooses: no memory
        // this process uses is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        let m = Mapping { ptr, len };
        let advice = if random {
            libc::MADV_RANDOM
        } else {
            libc::MADV_SEQUENTIAL
        };
        // SAFETY: advice on the mapping just made (owned by `m`); neither
        // advice changes its contents.
        if unsafe { libc::madvise(m.ptr.as_ptr().cast(), m.len, advice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(m)
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` is a live read-write mapping owned by
        // `self` (unmapped only on drop), and `&mut self` makes the slice
        // the only reference to it in this process while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// `msync(MS_SYNC)`: write the mapping's dirty pages to the file.
    ///
    /// # Errors
    /// The error of `msync(2)`.
    pub(crate) fn sync(&self) -> io::Result<()> {
        // SAFETY: the range is the mapping `self` owns; msync reads no
        // memory on this process's behalf.
        if unsafe { libc::msync(self.ptr.as_ptr().cast(), self.len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `self` owns; no slice of it outlives `self`
        // (`bytes` borrows `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::{Engine, Mapping, Slice};
    use std::io::Write;

    #[test]
    fn slice_engine_refuses_offsets_outside_its_slice() {
        let mut mem = vec![0u8; 8192];
        let mut e = Slice {
            mem: &mut mem[4096..],
            base: 4096,
            mapped: false,
        };
        let mut buf = [0u8; 4096];
        assert!(e.read(4096, &mut buf, &mut |_| {}).is_ok());
        assert!(
            e.read(0, &mut buf, &mut |_| {}).is_err(),
            "before the slice"
        );
        assert!(
            e.read(4104, &mut buf, &mut |_| {}).is_err(),
            "past the slice"
        );
        assert!(e.write(u64::MAX, &buf).is_err(), "overflow");
    }

    #[test]
    fn mapping_reads_and_writes_the_file() {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        t.write_all(&[7u8; 8192]).unwrap();
        let f = t.reopen().unwrap();
        assert!(Mapping::new(&f, 8193, true).is_err(), "past the end");
        assert!(Mapping::new(&f, 0, true).is_err(), "empty");
        let mut m = Mapping::new(&f, 8192, false).unwrap();
        assert!(m.bytes().iter().all(|&b| b == 7));
        m.bytes()[4096] = 9;
        m.sync().unwrap();
        drop(m);
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 4096).unwrap();
        assert_eq!(b[0], 9);
    }
}
