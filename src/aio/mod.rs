//! The I/O engine: many reads and writes in flight below the page cache,
//! without a runtime imposed on the caller.
//!
//! [`IoEngine`] submits positional reads and writes on a file and returns a
//! [`Completion`] for each, which the caller waits for
//! ([`Completion::wait`]) or awaits (it is a [`Future`](std::future::Future)
//! any executor can poll; a plain `block_on` will do). Two engines stand
//! behind it, chosen at startup:
//! - **io_uring** (`uring`, Linux 5.6+): a few rings, each with a reaper
//!   thread asleep in `io_uring_enter` until completions arrive;
//! - **threads** (`pool`): a small pool of `pread`/`pwrite` threads, for when
//!   io_uring is unavailable (seccomp, `kernel.io_uring_disabled`, old
//!   kernels) or forced.
//!
//! [`IoEngine::global`] picks io_uring when it can be set up and the pool
//! otherwise, and says which on one line of standard error; the
//! [`ENGINE_ENV`] variable (`KXARRAY_IO_ENGINE=uring|threads|auto`) or
//! [`IoSettings::engine`] forces either.
//!
//! **Buffers are owned by the engine while in flight.** A request takes its
//! buffer by value (an [`IoBufMut`] for reads, an [`IoBuf`] for writes: an
//! owned, `'static` type whose bytes have a stable address, such as
//! `Vec<u8>` or [`AlignedBuf`]) and gives it back with the result. Whatever
//! the caller does meanwhile (drops the `Completion`, leaks it with
//! `mem::forget`, panics, submits from inside a waker), the bytes the
//! kernel writes stay allocated and unmoved until the completion is
//! reaped, and so does the file descriptor (the engine holds the
//! `Arc<File>`). Safe code cannot break this: the traits are `unsafe` to
//! implement, and nothing else hands the engine a pointer.
//!
//! Module structure (one concept each, no cycles): `buf` (the buffer
//! traits), `completion` (the handle and its slot), `op` (an in-flight
//! record), `uring` and `pool` (the two engines); this file is the facade
//! and the choice between them.
//!
//! Invariants (see each file's notes for its own):
//! - every submitted request completes exactly once, through its slot, and
//!   its buffer is dropped or handed back only after the kernel or the
//!   pool thread is finished with it;
//! - no thread spins: an idle reaper blocks in the kernel, an idle worker
//!   parks, a waiting caller parks;
//! - dropping the last handle on an engine waits for everything in flight,
//!   then stops its threads.
//!
//! ```
//! use kxarray::aio::{AlignedBuf, IoEngine};
//! use std::io::Write;
//! use std::sync::Arc;
//!
//! let mut f = tempfile::tempfile().unwrap();
//! f.write_all(&[7u8; 16384]).unwrap();
//! let f = Arc::new(f);
//! let engine = IoEngine::global(); // io_uring, or the thread pool
//! // Four reads in flight at once, then their buffers back.
//! let reads = engine.read_many(&f, (0..4u64).map(|i| (i * 4096, AlignedBuf::new(4096))));
//! for c in reads {
//!     let (n, buf) = c.wait();
//!     assert_eq!(n.unwrap(), 4096);
//!     assert!(buf.iter().all(|&b| b == 7));
//! }
//! ```

mod buf;
mod completion;
mod op;
mod pool;
#[cfg(target_os = "linux")]
mod uring;

pub use buf::{downcast_buf, AlignedBuf, IoBuf, IoBufMut};
pub use completion::{BufResult, Completer, Completion};
pub use op::{CURRENT_POSITION, MAX_RW};

use completion::{Progress, Slot};
use op::{check_offset, BounceReadOp, BounceWriteOp, Op, ReadOp, WriteOp};
use std::fs::File;
use std::io;
use std::sync::{Arc, OnceLock};

/// The environment variable [`IoEngine::global`] reads: `uring` (or
/// `io_uring`), `threads` (or `pool`), or `auto` (the default).
pub const ENGINE_ENV: &str = "KXARRAY_IO_ENGINE";

/// Where [`IoEngine::global`] writes its line (standard error when unset).
type LogFn = Box<dyn Fn(&str) + Send + Sync>;
static ENGINE_LOG: OnceLock<LogFn> = OnceLock::new();

/// Send the line [`IoEngine::global`] writes when it makes the process's
/// engine ("kxarray: I/O engine: io_uring, ...") to `f` instead of standard
/// error: a library embedding kxarray in a program whose standard error is
/// not its own (the SQLite VFS in the `sqlite3` shell sends it to SQLite's
/// log) calls it once, before the engine's first use.
///
/// Returns `false`, changing nothing, when a function was already set.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// let seen = Arc::new(Mutex::new(String::new()));
/// let s = Arc::clone(&seen);
/// assert!(kxarray::aio::set_engine_log(move |line| *s.lock().unwrap() = line.to_string()));
/// assert!(!kxarray::aio::set_engine_log(|_| {}), "set once");
/// kxarray::aio::IoEngine::global();
/// assert!(seen.lock().unwrap().starts_with("kxarray: I/O engine: "));
/// ```
pub fn set_engine_log(f: impl Fn(&str) + Send + Sync + 'static) -> bool {
    ENGINE_LOG.set(Box::new(f)).is_ok()
}

/// An aligned bounce buffer of `len` bytes, or the error a request with a
/// bad `align` completes with.
fn bounce_buf(len: usize, align: usize) -> io::Result<AlignedBuf> {
    AlignedBuf::with_alignment(len, align).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("alignment {align} is not a power of two"),
        )
    })
}

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// io_uring if it can be set up, the thread pool otherwise.
    #[default]
    Auto,
    /// io_uring only ([`IoEngine::new`] fails without it).
    Uring,
    /// The thread pool.
    Threads,
}

impl EngineChoice {
    /// Parse a value of [`ENGINE_ENV`].
    ///
    /// # Errors
    /// A message naming the accepted values.
    ///
    /// ```
    /// use kxarray::aio::EngineChoice;
    /// assert_eq!(EngineChoice::parse("threads"), Ok(EngineChoice::Threads));
    /// assert!(EngineChoice::parse("fast").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<EngineChoice, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(EngineChoice::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(EngineChoice::Uring),
            "threads" | "pool" | "psync" => Ok(EngineChoice::Threads),
            other => Err(format!(
                "{ENGINE_ENV}={other:?} is not one of uring, threads, auto"
            )),
        }
    }
}

/// Which engine an [`IoEngine`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring rings.
    Uring,
    /// The `pread`/`pwrite` thread pool.
    Threads,
}

/// An engine's settings.
///
/// ```
/// use kxarray::aio::{EngineChoice, EngineKind, IoEngine, IoSettings};
///
/// let e = IoEngine::new(&IoSettings::default().engine(EngineChoice::Threads).threads(2)).unwrap();
/// assert_eq!(e.kind(), EngineKind::Threads);
/// ```
#[derive(Debug, Clone)]
pub struct IoSettings {
    engine: EngineChoice,
    rings: usize,
    ring_entries: u32,
    threads: usize,
}

impl Default for IoSettings {
    /// Auto; one ring per CPU (at most 8) of 256 entries; a pool of four
    /// threads per CPU (4 to 32).
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        IoSettings {
            engine: EngineChoice::Auto,
            rings: cpus.min(8),
            ring_entries: 256,
            threads: (4 * cpus).clamp(4, 32),
        }
    }
}

impl IoSettings {
    /// The default settings with the engine [`ENGINE_ENV`] names; an
    /// unknown value is reported as the error (and the caller may fall back
    /// to the defaults).
    ///
    /// # Errors
    /// The variable holds an unknown value.
    pub fn from_env() -> Result<IoSettings, String> {
        let s = IoSettings::default();
        match std::env::var(ENGINE_ENV) {
            Ok(v) => Ok(s.engine(EngineChoice::parse(&v)?)),
            Err(_) => Ok(s),
        }
    }

    /// Choose the engine.
    pub fn engine(mut self, e: EngineChoice) -> Self {
        self.engine = e;
        self
    }

    /// How many io_uring rings (shards; each has a reaper thread; 1 to 8).
    pub fn rings(mut self, n: usize) -> Self {
        self.rings = n;
        self
    }

    /// Submission entries per ring (a power of two is used; the completion
    /// queue is four times as large, and above half of it a submitter
    /// performs its request itself).
    pub fn ring_entries(mut self, n: u32) -> Self {
        self.ring_entries = n.max(1);
        self
    }

    /// How many threads the pool runs (0: requests run on the caller's
    /// thread, synchronously).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }
}

enum Imp {
    #[cfg(target_os = "linux")]
    Uring(uring::Rings),
    Threads(pool::Pool),
}

struct Inner {
    imp: Imp,
    /// Why io_uring is not the engine, when `Auto` fell back.
    fallback: Option<String>,
}

/// Reads and writes in flight: the facade over the io_uring rings or the
/// thread pool. Cloning is cheap (a reference count); the engine stops
/// when the last clone is dropped, after everything in flight completes.
///
/// ```
/// use kxarray::aio::IoEngine;
/// use std::sync::Arc;
///
/// let f = Arc::new(tempfile::tempfile().unwrap());
/// let engine = IoEngine::global();
/// let (n, _) = engine.write(&f, 4096, b"at 4 KiB".to_vec()).wait();
/// assert_eq!(n.unwrap(), 8);
/// assert_eq!(f.metadata().unwrap().len(), 4104);
/// ```
#[derive(Clone)]
pub struct IoEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl IoEngine {
    /// An engine with these settings.
    ///
    /// # Errors
    /// With [`EngineChoice::Uring`], why io_uring cannot be set up (`EPERM`
    /// under seccomp or `kernel.io_uring_disabled`, `ENOSYS` before Linux
    /// 5.1, [`io::ErrorKind::Unsupported`] elsewhere or without the read
    /// and write operations). Never with `Auto` or `Threads`: a pool whose
    /// threads cannot be started runs requests on the caller's thread.
    pub fn new(settings: &IoSettings) -> io::Result<IoEngine> {
        let threads = || Imp::Threads(pool::Pool::new(settings.threads));
        let (imp, fallback) = match settings.engine {
            EngineChoice::Threads => (threads(), None),
            EngineChoice::Uring => (Self::uring(settings)?, None),
            EngineChoice::Auto => match Self::uring(settings) {
                Ok(imp) => (imp, None),
                Err(e) => (threads(), Some(format!("io_uring unavailable: {e}"))),
            },
        };
        Ok(IoEngine {
            inner: Arc::new(Inner { imp, fallback }),
        })
    }

    #[cfg(target_os = "linux")]
    fn uring(s: &IoSettings) -> io::Result<Imp> {
        Ok(Imp::Uring(uring::Rings::new(s.rings, s.ring_entries)?))
    }

    #[cfg(not(target_os = "linux"))]
    fn uring(_: &IoSettings) -> io::Result<Imp> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring is Linux-only",
        ))
    }

    /// The process's engine, made on first use from [`ENGINE_ENV`] and the
    /// default settings, with one line saying which engine runs and why
    /// (on standard error, or to the function given to
    /// [`set_engine_log`]). Forcing `uring` where io_uring cannot be set
    /// up falls back to the pool, and the line says so.
    pub fn global() -> &'static IoEngine {
        static GLOBAL: OnceLock<IoEngine> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let (settings, note) = match IoSettings::from_env() {
                Ok(s) => (s, None),
                Err(e) => (IoSettings::default(), Some(format!("{e}; using auto"))),
            };
            let forced = std::env::var(ENGINE_ENV).ok().filter(|_| note.is_none());
            let (engine, note) = match IoEngine::new(&settings) {
                Ok(e) => (e, note),
                Err(e) => {
                    let s = settings.clone().engine(EngineChoice::Threads);
                    let engine = IoEngine::new(&s).expect("the pool cannot fail");
                    (engine, Some(format!("io_uring unavailable: {e}")))
                }
            };
            let mut line = format!("kxarray: I/O engine: {}", engine.describe());
            if let Some(v) = forced {
                line += &format!(" (forced by {ENGINE_ENV}={v})");
            }
            if let Some(n) = note {
                line += &format!("; {n}");
            }
            match ENGINE_LOG.get() {
                Some(f) => f(&line),
                None => eprintln!("{line}"),
            }
            engine
        })
    }

    /// Which engine runs.
    pub fn kind(&self) -> EngineKind {
        match &self.inner.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(_) => EngineKind::Uring,
            Imp::Threads(_) => EngineKind::Threads,
        }
    }

    /// Why io_uring is not the engine, when it was tried and failed.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback.as_deref()
    }

    /// One line saying which engine runs, with its size.
    ///
    /// ```
    /// let line = kxarray::aio::IoEngine::global().describe();
    /// assert!(line.starts_with("io_uring") || line.starts_with("threads"), "{line}");
    /// ```
    pub fn describe(&self) -> String {
        let mut s = match &self.inner.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(r) => format!(
                "io_uring, {} ring(s) of {} entries, one reaper thread each",
                r.count(),
                r.entries()
            ),
            Imp::Threads(p) => format!("threads, a pool of {} pread/pwrite threads", p.threads()),
        };
        if let Some(f) = &self.inner.fallback {
            s += &format!(" ({f})");
        }
        s
    }

    /// Submit ops together; the progress handle their completions use.
    fn submit(&self, ops: Vec<Box<dyn Op>>) -> Option<Arc<dyn Progress>> {
        match &self.inner.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(r) => {
                let ring = Arc::clone(r.ring());
                ring.submit(ops);
                Some(ring)
            }
            Imp::Threads(p) => {
                p.submit(ops);
                Some(p.progress())
            }
        }
    }

    /// Read up to `buf.len()` bytes of `file` at `offset` into `buf`
    /// ([`CURRENT_POSITION`]: at the file's position, for pipes and
    /// sockets). The completion gives the count (0 at the end) and `buf`
    /// back.
    ///
    /// An error reaches this request's completion only: an offset past
    /// `i64::MAX` is refused before submission
    /// ([`io::ErrorKind::InvalidInput`]), and the medium's errors
    /// (`EINVAL` for a misaligned `O_DIRECT` request, `EISDIR`, `EBADF` for
    /// a descriptor not open for reading, ...) come back as `pread` would
    /// return them.
    pub fn read<B: IoBufMut>(&self, file: &Arc<File>, offset: u64, buf: B) -> Completion<B> {
        self.read_many(file, std::iter::once((offset, buf)))
            .pop()
            .expect("one request, one completion")
    }

    /// Submit many reads at once (one system call on io_uring); their
    /// completions, in order.
    pub fn read_many<B: IoBufMut>(
        &self,
        file: &Arc<File>,
        reqs: impl IntoIterator<Item = (u64, B)>,
    ) -> Vec<Completion<B>> {
        let mut ops: Vec<Box<dyn Op>> = Vec::new();
        let mut out = Vec::new();
        let mut slots = Vec::new();
        for (offset, buf) in reqs {
            if let Err(e) = check_offset(offset) {
                out.push(Some(Completion::ready(Err(e), buf)));
                continue;
            }
            let slot = Slot::new();
            slots.push((out.len(), Arc::clone(&slot)));
            out.push(None);
            ops.push(Box::new(ReadOp {
                file: Arc::clone(file),
                offset,
                buf,
                slot,
            }));
        }
        self.finish_submit(ops, out, slots)
    }

    /// Read as [`read`](IoEngine::read) does, through an aligned bounce
    /// buffer when `buf` does not start on an `align` boundary (what an
    /// `O_DIRECT` descriptor needs; the bytes are copied on completion).
    /// `align` must be a power of two; the request's offset and length
    /// must suit the descriptor as they would for `read`.
    ///
    /// # Errors
    /// In the completion: [`io::ErrorKind::InvalidInput`] when `align` is
    /// not a power of two, or as [`read`](IoEngine::read).
    pub fn read_aligned<B: IoBufMut>(
        &self,
        file: &Arc<File>,
        offset: u64,
        mut buf: B,
        align: usize,
    ) -> Completion<B> {
        if buf.stable_mut_ptr().align_offset(align.max(1)) == 0 && align.is_power_of_two() {
            return self.read(file, offset, buf);
        }
        if let Err(e) = check_offset(offset) {
            return Completion::ready(Err(e), buf);
        }
        let bounce = match bounce_buf(buf.bytes_len(), align) {
            Ok(b) => b,
            Err(e) => return Completion::ready(Err(e), buf),
        };
        let slot = Slot::new();
        let op = BounceReadOp {
            file: Arc::clone(file),
            offset,
            bounce,
            buf,
            slot: Arc::clone(&slot),
        };
        let progress = self.submit(vec![Box::new(op)]);
        Completion::pending(slot, progress)
    }

    /// Write up to `buf.len()` bytes of `buf` to `file` at `offset`
    /// ([`CURRENT_POSITION`]: at the file's position). The completion gives
    /// the count written and `buf` back.
    ///
    /// Errors reach this request's completion only, as for
    /// [`read`](IoEngine::read).
    pub fn write<B: IoBuf>(&self, file: &Arc<File>, offset: u64, buf: B) -> Completion<B> {
        if let Err(e) = check_offset(offset) {
            return Completion::ready(Err(e), buf);
        }
        let slot = Slot::new();
        let op = WriteOp {
            file: Arc::clone(file),
            offset,
            buf,
            slot: Arc::clone(&slot),
        };
        let progress = self.submit(vec![Box::new(op)]);
        Completion::pending(slot, progress)
    }

    /// Write as [`write`](IoEngine::write) does, through an aligned bounce
    /// buffer (a copy made now) when `buf` does not start on an `align`
    /// boundary; `buf` comes back untouched.
    ///
    /// # Errors
    /// In the completion: [`io::ErrorKind::InvalidInput`] when `align` is
    /// not a power of two, or as [`write`](IoEngine::write).
    pub fn write_aligned<B: IoBuf>(
        &self,
        file: &Arc<File>,
        offset: u64,
        buf: B,
        align: usize,
    ) -> Completion<B> {
        if buf.stable_ptr().align_offset(align.max(1)) == 0 && align.is_power_of_two() {
            return self.write(file, offset, buf);
        }
        if let Err(e) = check_offset(offset) {
            return Completion::ready(Err(e), buf);
        }
        let mut bounce = match bounce_buf(buf.bytes_len(), align) {
            Ok(b) => b,
            Err(e) => return Completion::ready(Err(e), buf),
        };
        bounce.copy_from_slice(buf.as_slice());
        let slot = Slot::new();
        let op = BounceWriteOp {
            file: Arc::clone(file),
            offset,
            bounce,
            buf,
            slot: Arc::clone(&slot),
        };
        let progress = self.submit(vec![Box::new(op)]);
        Completion::pending(slot, progress)
    }

    fn finish_submit<B: Send + 'static>(
        &self,
        ops: Vec<Box<dyn Op>>,
        mut out: Vec<Option<Completion<B>>>,
        slots: Vec<(usize, Arc<Slot<B>>)>,
    ) -> Vec<Completion<B>> {
        if !ops.is_empty() {
            let progress = self.submit(ops);
            for (i, slot) in slots {
                out[i] = Some(Completion::pending(slot, progress.clone()));
            }
        }
        out.into_iter()
            .map(|c| c.expect("every request has its completion"))
            .collect()
    }
}
