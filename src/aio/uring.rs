//! The io_uring engine: a few rings (shards), each with a reaper thread
//! that sleeps in `io_uring_enter` until completions arrive.
//!
//! Why shards and a reaper: a [`Completion`](super::Completion) may be
//! awaited from any executor, or waited from another thread than the one
//! that submitted, so someone other than the submitter must reap; a ring
//! per thread would need a reaper per thread and a way to drain a ring
//! when its thread exits. A fixed number of rings (at most one per CPU,
//! at most [`MAX_RINGS`]) bounds the threads and descriptors, and each
//! submitting thread keeps to one ring (chosen round-robin on its first
//! request), so submitters rarely share a ring's submission lock.
//!
//! Owns each ring, its in-flight table and its reaper. Invariants:
//! - an op enters the ring's in-flight table before its entry is pushed,
//!   and leaves it only when its completion is reaped (or, for an entry
//!   the kernel never took, when the ring is refused), so the buffer and
//!   the descriptor the kernel uses stay owned (by the table) until then;
//! - a completion is matched to its op by index *and* tag (the user data
//!   holds both), and one that matches nothing is counted and logged,
//!   never applied to another op and never a panic;
//! - completions are reaped, and so wakers and `on_complete` callbacks
//!   run, on the engine's own threads only (a reaper, or a callback of
//!   one waiting in turn): a caller waiting for its request parks until
//!   the reaper wakes it, and never finishes another caller's request;
//! - the submission queue is touched only under `sq`, the completion queue
//!   only under `cq`; no code holds two of a ring's locks at once, and no
//!   op is finished (no waker called, no buffer dropped) under any lock;
//! - a ring belongs to the process that made it ([`super::fork`]): in a
//!   forked child nothing is pushed to it, reaped from it or entered on it
//!   (its queues are the parent's pages); the child's copies of the
//!   parent's requests fail there, and the engine makes the child rings
//!   of its own;
//! - once `io_uring_enter` fails with a permanent error (a seccomp filter
//!   added after setup, ...) the ring is *refused*: it is never entered
//!   again, so the entries the kernel had not taken are never taken, and
//!   their ops fail with that error; those the kernel had still complete
//!   (the reaper polls the completion queue for them); the engine runs
//!   every later request on its thread pool;
//! - an idle ring costs nothing: its reaper blocks in `io_uring_enter`
//!   (`GETEVENTS`, one completion), woken by a completion or the stop NOP;
//! - dropping the rings returns in bounded time: the reapers get
//!   [`DROP_GRACE`] to finish what is in flight, then what is left is
//!   cancelled (`IORING_OP_ASYNC_CANCEL`) and they get as long again; a
//!   reaper still waiting then is left to finish alone (it owns its ring,
//!   so the buffers stay valid until the kernel is done with them).

use super::completion::{mark_engine_thread, on_engine_thread, Progress};
use super::op::{finish_guarded, Op, Sqe};
use crate::fork;
use crate::sync::{AtomicBool, AtomicUsize, Lock, Ordering};
use io_uring::{opcode, squeue, types, IoUring, Probe};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most rings an engine makes, whatever the CPU count.
pub(crate) const MAX_RINGS: usize = 8;

/// The most submission entries a ring has (the kernel's
/// `IORING_MAX_ENTRIES`); its completion queue has at most twice as many
/// (`IORING_MAX_CQ_ENTRIES`).
pub(crate) const MAX_ENTRIES: u32 = 32768;

/// How long dropping an engine waits for its requests before it cancels
/// them, and again after.
pub(crate) const DROP_GRACE: Duration = Duration::from_secs(1);

/// The user data of the NOP that wakes a reaper to stop.
const WAKE: u64 = u64::MAX;
/// The user data of a cancellation.
const CANCEL: u64 = u64::MAX - 1;
/// The user data of the NOP that tests `io_uring_enter` at setup.
const PROBE: u64 = u64::MAX - 2;
/// Tags stay below this, so no op's user data is one of the above.
const MAX_TAG: u32 = 0xFFFF_FFF0;

/// The in-flight ops of one ring, indexed by the low half of their user
/// data, tagged by the high half.
struct Table {
    ops: Vec<Option<(u32, Box<dyn Op>)>>,
    free: Vec<usize>,
    next_tag: u32,
}

impl Table {
    fn new() -> Table {
        Table {
            ops: Vec::new(),
            free: Vec::new(),
            next_tag: 1,
        }
    }

    /// Hold `op`; its user data.
    fn insert(&mut self, op: Box<dyn Op>) -> u64 {
        let tag = self.next_tag;
        self.next_tag = if tag >= MAX_TAG { 1 } else { tag + 1 };
        let i = match self.free.pop() {
            Some(i) => {
                debug_assert!(self.ops[i].is_none());
                self.ops[i] = Some((tag, op));
                i
            }
            None => {
                self.ops.push(Some((tag, op)));
                self.ops.len() - 1
            }
        };
        (u64::from(tag) << 32) | i as u64
    }

    /// The op with this user data, if it is in flight.
    fn take(&mut self, ud: u64) -> Option<Box<dyn Op>> {
        let (tag, i) = ((ud >> 32) as u32, (ud & 0xFFFF_FFFF) as usize);
        match self.ops.get(i) {
            Some(Some((t, _))) if *t == tag => {}
            _ => return None,
        }
        let (_, op) = self.ops[i].take()?;
        self.free.push(i);
        Some(op)
    }

    /// The user data of every op in flight.
    fn user_data(&self) -> Vec<u64> {
        (self.ops.iter().enumerate())
            .filter_map(|(i, o)| o.as_ref().map(|(t, _)| (u64::from(*t) << 32) | i as u64))
            .collect()
    }

    /// Every op in flight, out of the table.
    fn take_all(&mut self) -> Vec<Box<dyn Op>> {
        let ops = std::mem::take(&mut self.ops);
        self.free.clear();
        ops.into_iter().flatten().map(|(_, op)| op).collect()
    }
}

/// Set once a reaper has returned (or unwound), for a bounded drop.
struct Exited {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Exited {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Whether it was set before `deadline`.
    fn wait_until(&self, deadline: Instant) -> bool {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            done = match self.cv.wait_timeout(done, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

/// Sets [`Exited`] when the reaper returns or unwinds.
struct ExitGuard<'a>(&'a Exited);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// One ring and its bookkeeping.
pub(crate) struct Ring {
    uring: IoUring,
    /// The user data of the entries pushed that the kernel may not have
    /// taken yet, oldest first (at most the submission queue's size).
    sq: Lock<VecDeque<u64>>,
    cq: Lock<()>,
    table: Lock<Table>,
    in_flight: AtomicUsize,
    /// Above this many ops in flight a submitter runs its op itself, so
    /// the completion queue (at least twice as large) cannot overflow.
    cap: usize,
    stop: AtomicBool,
    /// The error `io_uring_enter` failed with for good (0: none yet).
    refused: AtomicI32,
    /// Completions that matched no op in flight.
    strays: AtomicUsize,
    /// The fork generation of the process that made the ring.
    generation: u64,
    exited: Exited,
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// Submit one NOP and reap it: whether `io_uring_enter` works, which
/// setting up a ring does not tell (a seccomp filter may allow
/// `io_uring_setup` and refuse `io_uring_enter`).
fn probe_enter(uring: &mut IoUring) -> io::Result<()> {
    {
        let mut sq = uring.submission();
        // SAFETY: a NOP carries no buffer or descriptor.
        let r = unsafe { sq.push(&opcode::Nop::new().build().user_data(PROBE)) };
        r.map_err(|_| io::Error::other("a new ring's submission queue is full"))?;
    }
    loop {
        match uring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    uring.completion().for_each(drop);
    Ok(())
}

impl Ring {
    /// A ring of `entries` submission entries, rounded up to a power of
    /// two and at most [`MAX_ENTRIES`]; its completion queue is four times
    /// as large, at most the kernel's limit of twice `MAX_ENTRIES`.
    fn new(entries: u32) -> io::Result<Ring> {
        let generation = fork::generation();
        let entries = entries.clamp(1, MAX_ENTRIES).next_power_of_two();
        let cq = entries.saturating_mul(4).min(2 * MAX_ENTRIES);
        // SUBMIT_ALL (Linux 5.18) keeps submitting past an entry that fails
        // inline; older kernels refuse the flag, so try without it.
        let mut uring = match IoUring::builder()
            .setup_cqsize(cq)
            .setup_submit_all()
            .build(entries)
        {
            Ok(u) => u,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                IoUring::builder().setup_cqsize(cq).build(entries)?
            }
            Err(e) => return Err(e),
        };
        let mut probe = Probe::new();
        uring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Read::CODE, "IORING_OP_READ"),
            (opcode::Write::CODE, "IORING_OP_WRITE"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the kernel's io_uring lacks {name} (Linux 5.6)"),
                ));
            }
        }
        probe_enter(&mut uring).map_err(|e| {
            io::Error::new(e.kind(), format!("io_uring_enter refused at setup: {e}"))
        })?;
        let cap = uring.params().cq_entries() as usize / 2;
        Ok(Ring {
            uring,
            sq: Lock::new(VecDeque::new()),
            cq: Lock::new(()),
            table: Lock::new(Table::new()),
            in_flight: AtomicUsize::new(0),
            cap,
            stop: AtomicBool::new(false),
            refused: AtomicI32::new(0),
            strays: AtomicUsize::new(0),
            generation,
            exited: Exited {
                done: Mutex::new(false),
                cv: Condvar::new(),
            },
        })
    }

    /// Whether this process is a fork of the one that made the ring.
    fn foreign(&self) -> bool {
        fork::generation() != self.generation
    }

    /// The error `io_uring_enter` failed with for good, if it did.
    pub(crate) fn refused(&self) -> Option<io::Error> {
        match self.refused.load(Ordering::Acquire) {
            0 => None,
            e => Some(io::Error::from_raw_os_error(e)),
        }
    }

    /// Mark the ring refused (once; logged once).
    fn refuse(&self, e: &io::Error) {
        let code = e.raw_os_error().unwrap_or(libc::EIO);
        if self
            .refused
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            log::warn!(
                "kxarray: io_uring_enter failed ({e}): the requests the kernel had not taken \
                 fail with this error, and the engine runs every later one on its thread pool"
            );
        }
    }

    /// Push one entry, submitting first when the queue is full; `false`
    /// (nothing pushed) when the ring is refused or not this process's.
    fn push(&self, entry: &squeue::Entry) -> bool {
        loop {
            if self.refused.load(Ordering::Acquire) != 0 || self.foreign() {
                return false;
            }
            let pushed = {
                let mut q = self.sq.lock();
                // SAFETY: `sq` is held, so this is the only
                // `SubmissionQueue` of the ring (its tail is synced when it
                // drops, before the lock is released).
                let mut sq = unsafe { self.uring.submission_shared() };
                // SAFETY: the entry's buffer and descriptor belong to an op
                // already in the in-flight table, which keeps them valid and
                // unmoved until the entry's completion is reaped (module
                // invariants); a NOP or a cancellation carries no buffer.
                let r = unsafe { sq.push(entry) };
                if r.is_ok() {
                    q.push_back(entry.get_user_data());
                    let waiting = sq.len();
                    while q.len() > waiting {
                        q.pop_front();
                    }
                }
                r.is_ok()
            };
            if pushed {
                return true;
            }
            self.enter_submit();
        }
    }

    /// Tell the kernel about pushed entries. On a permanent error the ring
    /// is refused and the entries the kernel did not take fail.
    fn enter_submit(&self) {
        loop {
            if self.foreign() {
                return;
            }
            if self.refused.load(Ordering::Acquire) != 0 {
                self.fail_untaken();
                return;
            }
            match self.uring.submitter().submit() {
                Ok(_) => return,
                // The completion queue is backed up: the reaper reaps (or
                // this thread, when it is one of the engine's), then retry.
                Err(e) if transient(&e) => {
                    if on_engine_thread() {
                        self.drain(true);
                    } else {
                        std::thread::park_timeout(Duration::from_micros(100));
                    }
                }
                Err(e) => self.refuse(&e),
            }
        }
    }

    /// On a refused ring: fail the ops whose entries the kernel never took
    /// (it never will: the ring is not entered again).
    fn fail_untaken(&self) {
        let uds: Vec<u64> = {
            let mut q = self.sq.lock();
            // SAFETY: `sq` is held (as in `push`); nothing is pushed.
            let waiting = unsafe { self.uring.submission_shared() }.len();
            let first = q.len().saturating_sub(waiting);
            let uds = q.drain(first..).collect();
            q.clear();
            uds
        };
        let ops: Vec<Box<dyn Op>> = {
            let mut t = self.table.lock();
            uds.into_iter()
                .filter(|&ud| ud < PROBE)
                .filter_map(|ud| t.take(ud))
                .collect()
        };
        let code = self.refused.load(Ordering::Acquire);
        for op in ops {
            self.in_flight.fetch_sub(1, Ordering::Release);
            finish_guarded(op, Err(io::Error::from_raw_os_error(code)));
        }
    }

    /// Submit ops (one `io_uring_enter` for all of them). An op over the
    /// in-flight cap, or met when the ring is refused, runs on the
    /// calling thread.
    pub(crate) fn submit(&self, ops: impl IntoIterator<Item = Box<dyn Op>>) {
        let mut pushed = 0;
        for mut op in ops {
            if self.in_flight.load(Ordering::Relaxed) >= self.cap
                || self.refused.load(Ordering::Acquire) != 0
                || self.foreign()
            {
                let res = op.run_sync();
                finish_guarded(op, res);
                continue;
            }
            let Sqe {
                fd,
                write,
                ptr,
                len,
                offset,
            } = op.sqe();
            let ud = self.table.lock().insert(op);
            self.in_flight.fetch_add(1, Ordering::Relaxed);
            let entry = if write {
                opcode::Write::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build()
            } else {
                opcode::Read::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build()
            };
            if self.push(&entry.user_data(ud)) {
                pushed += 1;
            } else if let Some(mut op) = self.table.lock().take(ud) {
                // Refused meanwhile: never pushed, so ours to run.
                self.in_flight.fetch_sub(1, Ordering::Release);
                let res = op.run_sync();
                finish_guarded(op, res);
            }
        }
        if pushed > 0 {
            self.enter_submit();
        }
    }

    /// A completion that matches no op in flight (a forked child's entry,
    /// a stale tag): counted and logged, never applied.
    fn stray(&self, ud: u64) {
        let n = self.strays.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            log::warn!(
                "kxarray: io_uring reaper: a completion for no request in flight \
                 (user data {ud:#x}); ignored"
            );
        } else {
            log::debug!(
                "kxarray: io_uring reaper: stray completion {} ({ud:#x})",
                n + 1
            );
        }
    }

    /// Reap what has completed; `wait_lock` says whether to wait for the
    /// completion lock or give up when another thread holds it. Returns
    /// how many completions were reaped.
    fn drain(&self, wait_lock: bool) -> usize {
        if self.foreign() {
            self.orphan();
            return 0;
        }
        let mut total = 0;
        loop {
            let mut got = [(0u64, 0i32); 32];
            let mut n = 0;
            {
                let _g = if wait_lock {
                    self.cq.lock()
                } else {
                    match self.cq.try_lock() {
                        Some(g) => g,
                        None => return total,
                    }
                };
                // SAFETY: `cq` is held, so this is the only
                // `CompletionQueue` of the ring (its head is synced when it
                // drops, before the lock is released).
                let cq = unsafe { self.uring.completion_shared() };
                for cqe in cq {
                    got[n] = (cqe.user_data(), cqe.result());
                    n += 1;
                    if n == got.len() {
                        break;
                    }
                }
            }
            if n == 0 {
                return total;
            }
            total += n;
            let mut ops = Vec::with_capacity(n);
            let mut strays = Vec::new();
            {
                let mut t = self.table.lock();
                for &(ud, res) in &got[..n] {
                    if ud >= PROBE {
                        continue;
                    }
                    match t.take(ud) {
                        Some(op) => ops.push((op, res)),
                        None => strays.push(ud),
                    }
                }
            }
            for ud in strays {
                self.stray(ud);
            }
            for (op, res) in ops {
                self.in_flight.fetch_sub(1, Ordering::Release);
                let res = if res >= 0 {
                    Ok(res as usize)
                } else {
                    Err(io::Error::from_raw_os_error(-res))
                };
                finish_guarded(op, res);
            }
        }
    }

    /// In a forked child: the child's copies of the parent's requests
    /// (their buffers are the child's copies; the kernel writes the
    /// parent's) fail, so a child waiting for one does not wait forever.
    fn orphan(&self) {
        let ops = match self.table.try_lock() {
            Some(mut t) => t.take_all(),
            None => return, // held by a thread of the parent at fork time
        };
        for op in ops {
            let e = io::Error::other(
                "the request was submitted by the parent process before fork(); \
                 it completes in the parent only",
            );
            finish_guarded(op, Err(e));
        }
    }

    /// Ask the kernel to cancel every op in flight (each completes with
    /// `ECANCELED`, or normally if it was too late).
    fn cancel_all(&self) {
        let uds = self.table.lock().user_data();
        let mut any = false;
        for ud in uds {
            if !self.push(&opcode::AsyncCancel::new(ud).build().user_data(CANCEL)) {
                return;
            }
            any = true;
        }
        if any {
            self.enter_submit();
        }
    }

    fn reaper(self: Arc<Ring>) {
        mark_engine_thread();
        let _exit = ExitGuard(&self.exited);
        let mut nap = Duration::from_millis(1);
        loop {
            if self.in_flight.load(Ordering::Acquire) == 0
                && (self.stop.load(Ordering::Acquire) || self.refused.load(Ordering::Acquire) != 0)
            {
                // Reap the stop NOP if it is there; nothing else can be.
                self.drain(true);
                return;
            }
            if self.refused.load(Ordering::Acquire) != 0 {
                // The kernel still completes the entries it took, into the
                // completion queue, which needs no system call to read.
                self.fail_untaken();
                self.drain(true);
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_secs(1));
                continue;
            }
            match self.uring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if transient(&e) => {}
                Err(e) => self.refuse(&e),
            }
            self.drain(true);
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if self.push(&opcode::Nop::new().build().user_data(WAKE)) {
            self.enter_submit();
        }
    }
}

impl Progress for Ring {
    /// In a forked child: fail the child's copies of the parent's
    /// requests. On an engine thread: reap what is there. On any other
    /// thread: nothing (the reaper completes the request and wakes the
    /// waiter; a caller never runs another request's waker or callback).
    fn poll_once(&self) {
        if self.foreign() {
            self.orphan();
        } else if on_engine_thread() {
            self.drain(false);
        }
    }
    /// On an engine thread waiting inside a waker: reap what this ring has
    /// completed, else sleep a millisecond. Never wait in the kernel for a
    /// completion: this ring's reaper (another thread, unless it is this
    /// one) may take the entry first, and an `io_uring_enter` waiting for
    /// one more would then sleep until some unrelated request completes
    /// (seen as a 10 s hang of a nested wait under load). The request's
    /// own completion unparks this thread through its waker.
    fn block(&self) {
        self.enter_submit();
        if self.drain(true) == 0 {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Reached with ops in flight only when the reaper could not run to
        // the end (it failed to start, or the ring is the parent's copy in
        // a forked child): the kernel may still write into their buffers,
        // so leak them.
        if self.in_flight.load(Ordering::Acquire) > 0 || self.foreign() {
            std::mem::forget(std::mem::replace(&mut *self.table.lock(), Table::new()));
        }
    }
}

std::thread_local! {
    /// This thread's shard: a ring index, chosen on its first request.
    static SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The rings of one engine and their reapers, started on the first
/// request (an engine made and never used, or used only to describe
/// itself, has no thread).
pub(crate) struct Rings {
    rings: Vec<Arc<Ring>>,
    /// Ring `i`'s reaper at index `i` (`None`: it could not be started).
    reapers: Lock<Vec<Option<JoinHandle<()>>>>,
    /// Whether the reapers were started (set once, under `reapers`).
    started: AtomicBool,
    next_shard: AtomicUsize,
    generation: u64,
}

impl Rings {
    /// `n` rings of `entries` submission entries each (see [`Ring::new`]
    /// for the rounding); their reapers start with the first request
    /// ([`Rings::ring`]).
    ///
    /// # Errors
    /// The first ring's setup error (`EPERM` under seccomp or
    /// `kernel.io_uring_disabled`, `ENOSYS` on kernels without io_uring,
    /// `Unsupported` without the read and write opcodes, the error of an
    /// `io_uring_enter` refused).
    pub(crate) fn new(n: usize, entries: u32) -> io::Result<Rings> {
        let n = n.clamp(1, MAX_RINGS);
        let mut rings = Vec::with_capacity(n);
        for _ in 0..n {
            rings.push(Arc::new(Ring::new(entries)?));
        }
        Ok(Rings {
            rings,
            reapers: Lock::new(Vec::new()),
            started: AtomicBool::new(false),
            next_shard: AtomicUsize::new(0),
            generation: fork::generation(),
        })
    }

    /// Start the reapers (the first request's submitter, once). A ring
    /// whose reaper cannot be started is refused (`EAGAIN`): its requests
    /// then run on the engine's pool, and nothing waits for a reaper that
    /// does not exist.
    #[cold]
    fn start_reapers(&self) {
        let mut reapers = self.reapers.lock();
        if self.started.load(Ordering::Acquire) {
            return;
        }
        for (i, r) in self.rings.iter().enumerate() {
            let r2 = Arc::clone(r);
            let h = std::thread::Builder::new()
                .name(format!("kx-aio-reap-{i}"))
                .spawn(move || r2.reaper());
            match h {
                Ok(h) => reapers.push(Some(h)),
                Err(e) => {
                    reapers.push(None);
                    log::warn!("kxarray: io_uring reaper {i}: {e}; its ring is not used");
                    r.refuse(&io::Error::from_raw_os_error(libc::EAGAIN));
                    r.exited.set();
                }
            }
        }
        self.started.store(true, Ordering::Release);
    }

    pub(crate) fn count(&self) -> usize {
        self.rings.len()
    }

    /// Submission entries per ring, as the kernel made them.
    pub(crate) fn entries(&self) -> u32 {
        self.rings[0].uring.params().sq_entries()
    }

    /// Completion entries per ring, as the kernel made them.
    pub(crate) fn cq_entries(&self) -> u32 {
        self.rings[0].uring.params().cq_entries()
    }

    /// Whether this process is a fork of the one that made the rings.
    pub(crate) fn foreign(&self) -> bool {
        fork::generation() != self.generation
    }

    /// The error a ring's `io_uring_enter` failed with for good, if any:
    /// the engine then runs everything on its pool.
    pub(crate) fn refused(&self) -> Option<io::Error> {
        self.rings.iter().find_map(|r| r.refused())
    }

    /// Completions that matched no request, over all rings.
    pub(crate) fn strays(&self) -> usize {
        self.rings
            .iter()
            .map(|r| r.strays.load(Ordering::Relaxed))
            .sum()
    }

    /// The calling thread's ring, its reapers started first if they were
    /// not.
    #[inline]
    pub(crate) fn ring(&self) -> &Arc<Ring> {
        if !self.started.load(Ordering::Acquire) {
            self.start_reapers();
        }
        let s = SHARD.with(|s| match s.get() {
            Some(i) => i,
            None => {
                let i = self.next_shard.fetch_add(1, Ordering::Relaxed);
                s.set(Some(i));
                i
            }
        });
        &self.rings[s % self.rings.len()]
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        if self.foreign() {
            // The parent's: its reapers do not exist here and its queues
            // are the parent's pages. Touch nothing.
            std::mem::forget(std::mem::take(&mut *self.reapers.lock()));
            return;
        }
        if !self.started.load(Ordering::Acquire) {
            // Never used: nothing in flight, no reaper to stop.
            return;
        }
        let mut reapers = std::mem::take(&mut *self.reapers.lock());
        for r in &self.rings {
            r.stop();
        }
        // A waker run by a reaper may drop the last engine handle: that
        // reaper stops by itself, it cannot wait for itself.
        let me = std::thread::current().id();
        let mine = |i: usize| {
            reapers
                .get(i)
                .is_some_and(|h| h.as_ref().is_some_and(|h| h.thread().id() == me))
        };
        let deadline = Instant::now() + DROP_GRACE;
        let mut late = Vec::new();
        for (i, r) in self.rings.iter().enumerate() {
            if mine(i) || !r.exited.wait_until(deadline) {
                late.push(i);
            }
        }
        for &i in &late {
            self.rings[i].cancel_all();
        }
        let deadline = Instant::now() + DROP_GRACE;
        for &i in &late {
            if !mine(i) && !self.rings[i].exited.wait_until(deadline) {
                log::warn!(
                    "kxarray: io_uring ring {i}: {} request(s) still in flight after \
                     cancellation; its reaper finishes them alone",
                    self.rings[i].in_flight.load(Ordering::Acquire)
                );
            }
        }
        for (i, h) in reapers.drain(..).enumerate() {
            let Some(h) = h else { continue };
            // A reaper that has not returned is detached: it owns its ring
            // and the buffers in flight, and frees them when it is done.
            if h.thread().id() != me && self.rings[i].exited.wait_until(Instant::now()) {
                let _ = h.join();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::aio::completion::{Completion, Slot};
    use crate::aio::op::ReadOp;
    use std::io::Write;

    /// A completion for no request in flight (what a forked child's entry
    /// made in the parent's ring): the reaper counts it, applies it to
    /// nothing, and goes on reaping (it panicked in a debug build, and the
    /// ring lost its reaper).
    #[test]
    #[cfg_attr(miri, ignore = "a real ring: io_uring_setup is not emulated")]
    fn a_completion_for_no_request_is_counted_and_the_reaper_goes_on() {
        let rings = match Rings::new(1, 8) {
            Ok(r) => r,
            Err(e) => {
                assert!(
                    std::env::var("KXARRAY_TEST_REQUIRE_URING").is_err(),
                    "io_uring required but unavailable: {e}"
                );
                return; // no io_uring here
            }
        };
        let ring = Arc::clone(rings.ring());
        // Index 3, tag 5: no such op.
        let stray = opcode::Nop::new().build().user_data((5 << 32) | 3);
        assert!(ring.push(&stray));
        ring.enter_submit();
        let start = Instant::now();
        while rings.strays() == 0 && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rings.strays(), 1);
        // The reaper still completes requests.
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"still reaping").unwrap();
        let slot = Slot::new();
        let op = ReadOp {
            file: Arc::new(f),
            offset: 6,
            buf: vec![0u8; 7],
            slot: Arc::clone(&slot),
        };
        ring.submit([Box::new(op) as Box<dyn Op>]);
        let progress: Arc<dyn Progress> = ring;
        let (n, buf) = Completion::pending(slot, Some(progress)).wait();
        assert_eq!((n.unwrap(), &buf[..]), (7, &b"reaping"[..]));
    }
}
