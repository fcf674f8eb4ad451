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
//! otherwise, and says which in one `info` record of the [`log`] facade
//! (the library never prints: an application sees the line once it
//! installs a logger); the [`ENGINE_ENV`] variable
//! (`KXARRAY_IO_ENGINE=uring|threads|auto`) or [`IoSettings::engine`]
//! forces either.
//!
//! **Hostile conditions** (docs/readahead.md has the details):
//! - *`fork`*: an engine belongs to the process that made it. A forked
//!   child never touches the parent's rings or pool (their queues are the
//!   parent's pages, their threads do not exist in the child): its first
//!   request through an inherited engine makes the child an engine of its
//!   own (same kind, same settings), lazily. A request the parent
//!   submitted before the fork completes in the parent only; the child's
//!   copy fails with an error if the child waits for it. A completion the
//!   parent's reaper does not know is counted and logged, never applied.
//! - *io_uring refused*: setup probes `io_uring_enter` too, so `Auto`
//!   falls back to the pool (logging why) when a filter allows setting a
//!   ring up but not entering it. A ring refused later (a filter
//!   installed after setup) fails the requests the kernel had not taken
//!   with the error, lets those it had complete, and the engine runs
//!   everything after on its thread pool; no caller hangs.
//! - *bounds*: a ring holds at most half its completion queue in flight,
//!   the pool at most [`IoSettings::pool_depth`] requests queued or
//!   running; above either, the submitter performs its request itself.
//! - *drop*: dropping the last handle waits up to a second for what is in
//!   flight, cancels what is left (io_uring) and waits a second more; a
//!   request that still has not finished (an uncancellable read, a pool
//!   thread blocked on a pipe) is left to its thread, which owns its
//!   buffer until the kernel is done. Dropping never waits longer.
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
//! record), `uring` and `pool` (the two engines); this file is the
//! facade and the choice between them. Which process an engine belongs to
//! is [`crate::fork`]'s generation (a child made by `fork`, `_Fork` or a
//! raw `clone` sees a new one).
//!
//! Invariants (see each file's notes for its own):
//! - every submitted request completes exactly once, through its slot, and
//!   its buffer is dropped or handed back only after the kernel or the
//!   pool thread is finished with it;
//! - no thread spins: an idle reaper blocks in the kernel, an idle worker
//!   parks, a waiting caller parks;
//! - dropping the last handle on an engine waits for everything in flight
//!   (for a bounded time, see above), then stops its threads;
//! - completions run on the engine's threads, never on the thread of a
//!   caller waiting for another request (a request run on its
//!   submitter's thread, over a bound or among the first
//!   [`IoSettings::inline_first`], completes there, inside the submitting
//!   call);
//! - the engine's threads (reapers, pool workers) start with its first
//!   request that is not run inline: an engine made and not used has
//!   none.
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

use crate::fork;
use crate::sync::Lock;
use completion::{Progress, Slot};
use op::{check_offset, BounceReadOp, BounceWriteOp, Op, ReadOp, WriteOp};
use std::fs::File;
use std::io;
use std::sync::{Arc, OnceLock};

/// The environment variable [`IoEngine::global`] reads: `uring` (or
/// `io_uring`), `threads` (or `pool`), or `auto` (the default).
pub const ENGINE_ENV: &str = "KXARRAY_IO_ENGINE";

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
    pool_depth: usize,
    inline_first: usize,
}

impl Default for IoSettings {
    /// Auto; one ring per CPU (at most 8) of 256 entries; a pool of four
    /// threads per CPU (4 to 32) holding at most 512 requests (what a
    /// ring of 256 entries holds in flight).
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        IoSettings {
            engine: EngineChoice::Auto,
            rings: cpus.min(8),
            ring_entries: 256,
            threads: (4 * cpus).clamp(4, 32),
            pool_depth: 512,
            inline_first: 0,
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

    /// Submission entries per ring: rounded up to a power of two, at most
    /// 32,768 (the kernel's limit). The completion queue is four times as
    /// large, at most 65,536 (the kernel's limit, so from 16,385 entries
    /// on it is twice as large); above half of it a submitter performs its
    /// request itself. [`IoEngine::describe`] reports the sizes made.
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

    /// The pool's bound: at most `n` requests (at least 1) queued or
    /// running on its threads; above it a submitter performs its request
    /// on its own thread, as it does above a ring's in-flight cap, so
    /// stalled threads cannot make the queue (and the buffers it holds)
    /// grow without limit.
    pub fn pool_depth(mut self, n: usize) -> Self {
        self.pool_depth = n.max(1);
        self
    }

    /// Run the engine's first `n` requests on regular files on the
    /// submitter's thread (synchronously: their completions run there,
    /// before the call returns), so that a process that reads a file's
    /// header and nothing more (SQLite at open) starts no thread: the
    /// engine's threads start with the first request after those (or the
    /// first on a pipe, a socket or anything else that may block).
    /// Default 0; [`IoEngine::global`] uses 8.
    pub fn inline_first(mut self, n: usize) -> Self {
        self.inline_first = n;
        self
    }
}

/// Whether `f` is a regular file (a read of it does not wait for another
/// party), by `fstat`.
fn is_regular(f: &File) -> bool {
    f.metadata().is_ok_and(|m| m.file_type().is_file())
}

enum Imp {
    #[cfg(target_os = "linux")]
    Uring(uring::Rings),
    Threads(pool::Pool),
}

/// One process's engine (see [`IoEngine`]).
struct Inner {
    imp: Imp,
    settings: IoSettings,
    /// Why io_uring is not the engine, when `Auto` fell back.
    fallback: Option<String>,
    /// The fork generation of the process that made it.
    generation: u64,
    /// The pool that runs everything once io_uring is refused after setup.
    after_refusal: OnceLock<pool::Pool>,
    /// In a forked child: the child's own engine, made on first use.
    child: Lock<Option<Arc<Inner>>>,
    /// Requests still to run on their submitter's thread
    /// ([`IoSettings::inline_first`]).
    inline_left: crate::sync::AtomicUsize,
}

impl Inner {
    fn new(settings: &IoSettings) -> io::Result<Inner> {
        let threads = || Imp::Threads(pool::Pool::new(settings.threads, settings.pool_depth));
        let (imp, fallback) = match settings.engine {
            EngineChoice::Threads => (threads(), None),
            EngineChoice::Uring => (Self::uring(settings)?, None),
            EngineChoice::Auto => match Self::uring(settings) {
                Ok(imp) => (imp, None),
                Err(e) => {
                    log::warn!("kxarray: io_uring unavailable ({e}); using the thread pool");
                    (threads(), Some(format!("io_uring unavailable: {e}")))
                }
            },
        };
        Ok(Inner {
            imp,
            settings: settings.clone(),
            fallback,
            generation: fork::generation(),
            after_refusal: OnceLock::new(),
            child: Lock::new(None),
            inline_left: crate::sync::AtomicUsize::new(settings.inline_first),
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

    /// Whether `ops` run on the submitter's thread: all on regular files,
    /// and as many inline requests left (taken now).
    #[cold]
    fn take_inline(&self, ops: &[Box<dyn Op>]) -> bool {
        use crate::sync::Ordering;
        if !ops.iter().all(|op| is_regular(op.file())) {
            self.inline_left.store(0, Ordering::Relaxed);
            return false;
        }
        let n = ops.len();
        self.inline_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .map_err(|_| self.inline_left.store(0, Ordering::Relaxed))
            .is_ok()
    }

    /// The pool that replaces refused rings.
    fn after_refusal(&self) -> &pool::Pool {
        self.after_refusal
            .get_or_init(|| pool::Pool::new(self.settings.threads, self.settings.pool_depth))
    }

    /// Submit ops together; the progress handle their completions use.
    fn submit(&self, mut ops: Vec<Box<dyn Op>>) -> Option<Arc<dyn Progress>> {
        if self.inline_left.load(crate::sync::Ordering::Relaxed) > 0 && self.take_inline(&ops) {
            for mut op in ops.drain(..) {
                let res = op.run_sync();
                op::finish_guarded(op, res);
            }
            return None;
        }
        match &self.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(r) if r.refused().is_none() => {
                let ring = Arc::clone(r.ring());
                ring.submit(ops);
                Some(ring)
            }
            #[cfg(target_os = "linux")]
            Imp::Uring(_) => {
                let p = self.after_refusal();
                p.submit(ops);
                Some(p.progress())
            }
            Imp::Threads(p) => {
                p.submit(ops);
                Some(p.progress())
            }
        }
    }
}

/// The engine of the calling process: the engine itself, or in a forked
/// child the child's own.
enum Here<'a> {
    Own(&'a Inner),
    Child(Arc<Inner>),
}

impl std::ops::Deref for Here<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        match self {
            Here::Own(i) => i,
            Here::Child(i) => i,
        }
    }
}

/// Reads and writes in flight: the facade over the io_uring rings or the
/// thread pool. Cloning is cheap (a reference count); the engine stops
/// when the last clone is dropped, after everything in flight completes
/// (or, for a request that does not, after a bounded wait: see the module
/// notes).
///
/// An engine belongs to the process that made it: used in a forked child,
/// it makes the child an engine of its own on the first request (see the
/// module notes).
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
    /// An engine with these settings. When `Auto` falls back to the pool,
    /// a `warn` record of the [`log`] facade says why.
    ///
    /// # Errors
    /// With [`EngineChoice::Uring`], why io_uring cannot be set up (`EPERM`
    /// under seccomp or `kernel.io_uring_disabled`, or when a filter
    /// refuses `io_uring_enter`; `ENOSYS` before Linux 5.1,
    /// [`io::ErrorKind::Unsupported`] elsewhere or without the read and
    /// write operations). Never with `Auto` or `Threads`: a pool whose
    /// threads cannot be started runs requests on the caller's thread.
    pub fn new(settings: &IoSettings) -> io::Result<IoEngine> {
        Ok(IoEngine {
            inner: Arc::new(Inner::new(settings)?),
        })
    }

    /// This process's engine: `self`'s, or in a forked child the child's
    /// own (made now, with the same settings and the same kind where it
    /// can be set up, on the first call in that child).
    fn here(&self) -> Here<'_> {
        let now = fork::generation();
        if self.inner.generation == now {
            return Here::Own(&self.inner);
        }
        let mut child = self.inner.child.lock();
        if let Some(c) = child.as_ref().filter(|c| c.generation == now) {
            return Here::Child(Arc::clone(c));
        }
        let mut s = self.inner.settings.clone();
        if s.engine == EngineChoice::Uring {
            s.engine = EngineChoice::Auto;
        }
        let fresh = Inner::new(&s).or_else(|_| Inner::new(&s.engine(EngineChoice::Threads)));
        let fresh = Arc::new(fresh.expect("the pool cannot fail"));
        log::info!(
            "kxarray: I/O engine: a forked child gets its own: {}",
            describe(&fresh)
        );
        // An older one is a grandparent's child engine, inherited: its drop
        // touches nothing of that process's (the engines check the fork
        // generation).
        *child = Some(Arc::clone(&fresh));
        Here::Child(fresh)
    }

    /// The process's engine, made on first use from [`ENGINE_ENV`] and the
    /// default settings, with one `info` record of the [`log`] facade
    /// saying which engine runs and why. Forcing `uring` where io_uring
    /// cannot be set up falls back to the pool, and the line says so.
    pub fn global() -> &'static IoEngine {
        static GLOBAL: OnceLock<IoEngine> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let (settings, note) = match IoSettings::from_env() {
                Ok(s) => (s, None),
                Err(e) => (IoSettings::default(), Some(format!("{e}; using auto"))),
            };
            // A process that reads a header and nothing more starts no
            // thread for it.
            let settings = settings.inline_first(8);
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
            log::info!("{line}");
            engine
        })
    }

    /// Which engine runs (in this process; [`EngineKind::Threads`] once
    /// io_uring was refused after setup).
    pub fn kind(&self) -> EngineKind {
        let here = self.here();
        match &here.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(r) if r.refused().is_none() => EngineKind::Uring,
            #[cfg(target_os = "linux")]
            Imp::Uring(_) => EngineKind::Threads,
            Imp::Threads(_) => EngineKind::Threads,
        }
    }

    /// How many completions reached this engine's rings for no request it
    /// had in flight (say, a forked child's that submitted to an inherited
    /// ring behind the engine's back): counted, logged once, never applied
    /// to another request. 0 with the thread pool.
    pub fn stray_completions(&self) -> usize {
        match &self.inner.imp {
            #[cfg(target_os = "linux")]
            Imp::Uring(r) => r.strays(),
            Imp::Threads(_) => 0,
        }
    }

    /// Why io_uring is not the engine, when it was tried and failed.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback.as_deref()
    }

    /// One line saying which engine runs (in this process), with its size
    /// as made (the ring sizes the kernel rounded, the pool's bound).
    ///
    /// ```
    /// let line = kxarray::aio::IoEngine::global().describe();
    /// assert!(line.starts_with("io_uring") || line.starts_with("threads"), "{line}");
    /// ```
    pub fn describe(&self) -> String {
        describe(&self.here())
    }

    /// Submit ops together; the progress handle their completions use.
    fn submit(&self, ops: Vec<Box<dyn Op>>) -> Option<Arc<dyn Progress>> {
        self.here().submit(ops)
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

fn describe_pool(p: &pool::Pool) -> String {
    format!(
        "threads, a pool of {} pread/pwrite threads, at most {} requests queued",
        p.threads(),
        p.depth()
    )
}

/// [`IoEngine::describe`] of one process's engine.
fn describe(inner: &Inner) -> String {
    let mut s = match &inner.imp {
        #[cfg(target_os = "linux")]
        Imp::Uring(r) => match r.refused() {
            None => format!(
                "io_uring, {} ring(s) of {} entries ({} completions), one reaper thread each",
                r.count(),
                r.entries(),
                r.cq_entries()
            ),
            Some(e) => format!(
                "{} (io_uring_enter refused after setup: {e})",
                describe_pool(inner.after_refusal())
            ),
        },
        Imp::Threads(p) => describe_pool(p),
    };
    if let Some(f) = &inner.fallback {
        s += &format!(" ({f})");
    }
    s
}
