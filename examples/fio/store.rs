//! Where the bytes under test live for one run of the fio example, and
//! everything done to them outside the timed part: the layout, the
//! warm-up, the handing out of per-job engines, the final sync and the
//! read-back of the verify pass.
//!
//! Owns the invariants the engines rely on: the file (or buffer) holds at
//! least the run's `size` bytes before any job starts (laid out, or
//! `--reuse-file` checked its length); job `j`'s heap or mapping slice is
//! bytes `j * job_bytes ..` of it, lent to that job alone; the kernel's
//! cache is never dropped.

use crate::engine::{Mapping, Null, PinMode, Psync, ReadAt, Slice, ZeroCopy};
use crate::job::{Job, JobResult};
use crate::stamp::stamp;
use clap::ValueEnum;
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{Advice, CacheConfig, CachedFile, FileOptions, PageCache};
use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// How the jobs reach the file's bytes (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum EngineKind {
    /// The kxarray page cache: `read_at` (or `read_folio_in` with
    /// --zero-copy) and `write_at`.
    Kxarray,
    /// `pread(2)`/`pwrite(2)` on the file (the kernel's page cache).
    Psync,
    /// `memcpy` from and to a `MAP_SHARED` mapping of the file.
    Mmap,
    /// `memcpy` from and to a heap buffer holding the file's bytes (the
    /// floor).
    Memcpy,
    /// No data moved: the harness's own cost (needs --no-verify).
    Null,
}

/// Where a kxarray file lives (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// A file (`pread`/`pwrite`).
    File,
    /// The crate's RAM disk.
    Ram,
}

/// What to lay out and open.
pub(crate) struct Setup<'a> {
    pub(crate) engine: EngineKind,
    pub(crate) backend: BackendKind,
    pub(crate) filename: Option<&'a Path>,
    /// Keep a `filename` that already holds `size` bytes as it is.
    pub(crate) reuse_file: bool,
    /// Whole blocks of `bs` bytes; `size = blocks * bs`.
    pub(crate) blocks: u64,
    pub(crate) bs: u64,
    /// Madvise a mapping for random access.
    pub(crate) random: bool,
    /// The kxarray cache and file (unused by the other engines).
    pub(crate) cache: CacheConfig,
    pub(crate) file_options: FileOptions,
    /// kxarray over an `O_DIRECT` [`FileBackend`] (`--direct`).
    pub(crate) direct: bool,
    /// Drop the file from the kernel's cache before the run (`--cold`).
    pub(crate) cold: bool,
    /// Advise the kxarray file `Random` or `Sequential` (fio's
    /// `fadvise_hint`).
    pub(crate) fadvise_hint: bool,
}

impl Setup<'_> {
    fn size(&self) -> u64 {
        self.blocks * self.bs
    }
}

/// The bytes under test.
pub(crate) enum Store {
    /// A kxarray page cache over the file or a RAM disk.
    Cache {
        cache: PageCache,
        file: CachedFile,
        /// The job's advice (fadvise_hint), applied again after the
        /// warm-up, which reads with `Sequential`.
        hint: Option<Advice>,
    },
    /// The file, read and written with `pread`/`pwrite` (psync).
    File { file: File, path: PathBuf },
    /// A mapping of the file (mmap).
    Map { map: Mapping, file: File },
    /// A heap buffer holding the file's bytes (memcpy).
    Heap(Vec<u8>),
    /// Nothing (null).
    Null,
}

/// What one job builds its engine from.
pub(crate) enum Seed<'a> {
    ReadAt(&'a CachedFile),
    ZeroCopy(&'a CachedFile, PinMode),
    /// Each psync job opens the file itself.
    Psync(&'a Path),
    /// The job's slice of a mapping (`true`) or of a heap buffer.
    Slice(&'a mut [u8], bool),
    Null,
}

impl Seed<'_> {
    /// Build the engine, wait for every job to be ready, run the job.
    pub(crate) fn run(self, job: &Job<'_>, ready: &Barrier) -> JobResult {
        let base = job.first_block * job.spec.bs;
        match self {
            Seed::ReadAt(file) => {
                ready.wait();
                job.run(ReadAt { file })
            }
            Seed::ZeroCopy(file, pin) => {
                let e = ZeroCopy::new(file, pin);
                ready.wait();
                job.run(e)
            }
            Seed::Psync(path) => {
                let opened = OpenOptions::new().read(true).write(true).open(path);
                ready.wait();
                match opened {
                    Ok(file) => job.run(Psync { file }),
                    Err(e) => JobResult {
                        error: Some(e),
                        ..job.result()
                    },
                }
            }
            Seed::Slice(mem, mapped) => {
                ready.wait();
                job.run(Slice { mem, base, mapped })
            }
            Seed::Null => {
                ready.wait();
                job.run(Null)
            }
        }
    }
}

/// Lay the file out (every block stamped with generation 0) through
/// `write(chunk, offset)`, a megabyte at a time.
fn lay_out(
    write: &mut dyn FnMut(&[u8], u64) -> io::Result<()>,
    blocks: u64,
    bs: u64,
) -> io::Result<()> {
    let per = (1 << 20) / bs.min(1 << 20);
    let mut chunk = vec![0u8; (per * bs) as usize];
    let mut blk = 0;
    while blk < blocks {
        let n = per.min(blocks - blk);
        for (i, c) in chunk[..(n * bs) as usize]
            .chunks_exact_mut(bs as usize)
            .enumerate()
        {
            stamp(c, blk + i as u64, 0);
        }
        write(&chunk[..(n * bs) as usize], blk * bs)?;
        blk += n;
    }
    Ok(())
}

/// Open (or make) `--filename` or a temporary file (kept alive by the
/// returned path guard), read-write.
fn open_file(name: Option<&Path>) -> io::Result<(File, PathBuf, Option<tempfile::TempPath>)> {
    match name {
        Some(p) => Ok((
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)?,
            p.to_path_buf(),
            None,
        )),
        None => {
            let t = tempfile::NamedTempFile::new()?;
            let f = t.reopen()?;
            let p = t.path().to_path_buf();
            Ok((f, p, Some(t.into_temp_path())))
        }
    }
}

/// Drop `f`'s pages from the kernel's cache (`posix_fadvise(DONTNEED)`:
/// clean pages go; the layout was synced, so all of them).
///
/// # Errors
/// The error of `posix_fadvise(2)`.
pub(crate) fn drop_kernel_cache(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a descriptor this process owns; no memory of the
    // process is read or written.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Read `len` bytes of `f` in megabyte requests, to have them in the
/// kernel's cache.
fn warm_kernel_cache(f: &File, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

impl Store {
    /// Lay the bytes out and open them for `s.engine`. Returns the store,
    /// a line saying where the bytes are, and the guard of a temporary
    /// file (deleted when dropped).
    pub(crate) fn open(s: &Setup<'_>) -> io::Result<(Store, String, Option<tempfile::TempPath>)> {
        let size = s.size();
        let size_usize = usize::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "--size too large"))?;
        let t0 = Instant::now();
        let on_file = match s.engine {
            EngineKind::Psync | EngineKind::Mmap => true,
            EngineKind::Kxarray => s.backend == BackendKind::File,
            EngineKind::Memcpy | EngineKind::Null => false,
        };
        let (mut file, mut path, mut temp) = (None, None, None);
        let mut laid_out = true;
        if on_file {
            let (f, p, t) = open_file(s.filename)?;
            if s.reuse_file && f.metadata()?.len() >= size {
                laid_out = false;
            } else {
                f.set_len(size)?;
                lay_out(&mut |c, off| f.write_all_at(c, off), s.blocks, s.bs)?;
                f.sync_all()?;
            }
            if s.cold {
                drop_kernel_cache(&f)?;
            }
            (file, path, temp) = (Some(f), Some(p), t);
        }
        let store = match s.engine {
            EngineKind::Kxarray => {
                let backend: Arc<dyn Backend> = match (&file, &path) {
                    (Some(_), Some(p)) if s.direct => Arc::new(FileBackend::create_direct(p)?),
                    (Some(f), _) => Arc::new(FileBackend::from_file(f.try_clone()?)),
                    (None, _) => {
                        let r = RamDisk::new(size);
                        lay_out(&mut |c, off| r.write_all_at(c, off), s.blocks, s.bs)?;
                        Arc::new(r)
                    }
                };
                let cache = PageCache::new(s.cache.clone());
                let file = cache.open_with(backend, s.file_options)?;
                // As fio's fadvise_hint=1 (its default) tells the kernel:
                // random jobs read nothing ahead, sequential ones read
                // ahead far.
                let hint = s.fadvise_hint.then_some(if s.random {
                    Advice::Random
                } else {
                    Advice::Sequential
                });
                if let Some(advice) = hint {
                    file.advise(0, 0, advice)?;
                }
                Store::Cache { cache, file, hint }
            }
            EngineKind::Psync => Store::File {
                file: file.expect("psync runs on a file"),
                path: path.clone().expect("a file has a path"),
            },
            EngineKind::Mmap => {
                let file = file.expect("mmap runs on a file");
                Store::Map {
                    map: Mapping::new(&file, size_usize, s.random)?,
                    file,
                }
            }
            EngineKind::Memcpy => {
                let mut v = vec![0u8; size_usize];
                lay_out(
                    &mut |c, off| {
                        v[off as usize..off as usize + c.len()].copy_from_slice(c);
                        Ok(())
                    },
                    s.blocks,
                    s.bs,
                )?;
                Store::Heap(v)
            }
            EngineKind::Null => {
                laid_out = false;
                Store::Null
            }
        };
        let where_ = match (&store, &path) {
            (Store::Heap(_), _) => "a heap buffer".to_string(),
            (Store::Null, _) => "nothing (null engine)".to_string(),
            (_, Some(p)) => p.display().to_string(),
            (_, None) => "a ram disk".to_string(),
        };
        let how = if laid_out {
            format!(
                "laid out {} blocks in {:.2}s",
                s.blocks,
                t0.elapsed().as_secs_f64()
            )
        } else if on_file {
            "reused as it is (--reuse-file)".to_string()
        } else {
            "nothing laid out".to_string()
        };
        let cold = if s.cold && on_file {
            "; dropped from the kernel's cache (posix_fadvise DONTNEED)"
        } else {
            ""
        };
        Ok((store, format!("{where_}: {how}{cold}"), temp))
    }

    /// The warm-up pass: read the whole file once through the engine's
    /// path, so the timed part starts warm. Returns what it did.
    pub(crate) fn warm(&mut self, size: u64, bs: u64) -> io::Result<String> {
        let t0 = Instant::now();
        let secs = || t0.elapsed().as_secs_f64();
        Ok(match self {
            Store::Cache { file, hint, .. } => {
                // A sequential pass, read ahead as such (large folios, as
                // the kernel's cache holds a file read in order before a
                // random job starts), then the job's own advice.
                file.advise(0, 0, Advice::Sequential)?;
                let mut buf = vec![0u8; bs as usize];
                let mut off = 0;
                while off < size {
                    file.read_at(&mut buf, off)?;
                    off += bs;
                }
                file.advise(0, 0, hint.unwrap_or(Advice::Normal))?;
                let pages = file.cached_pages();
                let want = size.div_ceil(4096);
                format!(
                    "warm-up: read the file through the cache in {:.2}s: {pages} of {want} pages cached{}",
                    secs(),
                    if pages < want {
                        " (the cache is smaller than the file: the run will miss)"
                    } else {
                        ""
                    }
                )
            }
            Store::File { file, .. } => {
                warm_kernel_cache(file, size)?;
                format!(
                    "warm-up: read the file with pread in {:.2}s (the kernel's cache)",
                    secs()
                )
            }
            Store::Map { map, .. } => {
                // Every page once: the kernel's cache and the page tables.
                let mem = map.bytes();
                let mut x = 0u8;
                for p in (0..mem.len()).step_by(4096) {
                    x ^= mem[p];
                }
                black_box(x);
                format!(
                    "warm-up: touched every page of the mapping in {:.2}s",
                    secs()
                )
            }
            Store::Heap(_) => "warm-up: none (the buffer was just written)".to_string(),
            Store::Null => "warm-up: none".to_string(),
        })
    }

    /// One seed per job: job `j` gets bytes `j * job_bytes ..` of a heap or
    /// mapping, or a handle on the shared cache or file.
    pub(crate) fn seeds(
        &mut self,
        numjobs: u64,
        job_bytes: usize,
        zero_copy: Option<PinMode>,
    ) -> Vec<Seed<'_>> {
        let n = numjobs as usize;
        match self {
            Store::Cache { file, .. } => {
                let file = &*file;
                (0..n)
                    .map(|_| match zero_copy {
                        Some(pin) => Seed::ZeroCopy(file, pin),
                        None => Seed::ReadAt(file),
                    })
                    .collect()
            }
            Store::File { path, .. } => (0..n).map(|_| Seed::Psync(path)).collect(),
            Store::Map { map, .. } => map.bytes()[..n * job_bytes]
                .chunks_mut(job_bytes)
                .map(|s| Seed::Slice(s, true))
                .collect(),
            Store::Heap(v) => v[..n * job_bytes]
                .chunks_mut(job_bytes)
                .map(|s| Seed::Slice(s, false))
                .collect(),
            Store::Null => (0..n).map(|_| Seed::Null).collect(),
        }
    }

    /// Make every write durable (untimed, after the run, so that no
    /// engine leaves dirty pages to the next run): the cache's `sync`,
    /// `fsync`, or `msync` + `fsync`.
    ///
    /// # Errors
    /// The sync's error.
    pub(crate) fn sync(&self) -> io::Result<()> {
        match self {
            Store::Cache { file, .. } => file.sync(),
            Store::File { file, .. } => file.sync_all(),
            Store::Map { map, file } => map.sync().and_then(|()| file.sync_all()),
            Store::Heap(_) | Store::Null => Ok(()),
        }
    }

    /// Before the read-back: drop the cache's folios so that it reads the
    /// backend. Returns where the read-back reads from.
    pub(crate) fn before_read_back(&self, size: u64) -> io::Result<String> {
        Ok(match self {
            Store::Cache { file, .. } => format!(
                "the backend after sync + invalidate ({} pages dropped)",
                file.invalidate(0..size)?
            ),
            Store::File { .. } | Store::Map { .. } => {
                "the file with pread after fsync/msync".to_string()
            }
            Store::Heap(_) => "the heap buffer".to_string(),
            Store::Null => "nowhere".to_string(),
        })
    }

    /// Read `buf.len()` bytes at `off` for the verify pass (through the
    /// cache, `pread`, or the heap).
    pub(crate) fn read_back(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        match self {
            Store::Cache { file, .. } => file.read_at(buf, off),
            Store::File { file, .. } | Store::Map { file, .. } => file.read_at(buf, off),
            Store::Heap(v) => {
                let at = usize::try_from(off).ok().filter(|&at| at <= v.len());
                let Some(at) = at else { return Ok(0) };
                let n = buf.len().min(v.len() - at);
                buf[..n].copy_from_slice(&v[at..at + n]);
                Ok(n)
            }
            Store::Null => Ok(0),
        }
    }

    /// The cache's counters (kxarray only).
    pub(crate) fn cache(&self) -> Option<&PageCache> {
        match self {
            Store::Cache { cache, .. } => Some(cache),
            _ => None,
        }
    }
}
