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
//! request), so submitters rarely share a ring's submission lock. Waiters
//! also drain the completion queue without a system call before they park,
//! which saves the reaper's wake-up when the completion is already there.
//!
//! Owns each ring, its in-flight table and its reaper. Invariants:
//! - an op enters the ring's in-flight table before its entry is pushed,
//!   and leaves it only when its completion is reaped, so the buffer and
//!   the descriptor the kernel uses stay owned (by the table) until then;
//! - the table is never dropped with an op in it: the reaper runs until
//!   the ring is stopped *and* nothing is in flight, and a ring's `Drop`
//!   waits for anything left (should it fail to, it leaks the ops rather
//!   than free what the kernel may still write);
//! - the submission queue is touched only under `sq`, the completion queue
//!   only under `cq`; no code holds two of a ring's locks at once, and no
//!   op is finished (no waker called, no buffer dropped) under any lock;
//! - an idle ring costs nothing: its reaper blocks in `io_uring_enter`
//!   (`GETEVENTS`, one completion), woken by a completion or the stop NOP.

use super::completion::{mark_engine_thread, Progress};
use super::op::{finish_guarded, Op, Sqe};
use crate::sync::{AtomicBool, AtomicUsize, Lock, Ordering};
use io_uring::{opcode, squeue, types, IoUring, Probe};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The most rings an engine makes, whatever the CPU count.
pub(crate) const MAX_RINGS: usize = 8;

/// The user data of the NOP that wakes a reaper to stop.
const WAKE: u64 = u64::MAX;

/// The in-flight ops of one ring, indexed by their user data.
struct Table {
    ops: Vec<Option<Box<dyn Op>>>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, op: Box<dyn Op>) -> usize {
        match self.free.pop() {
            Some(i) => {
                debug_assert!(self.ops[i].is_none());
                self.ops[i] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                self.ops.len() - 1
            }
        }
    }
    fn take(&mut self, i: usize) -> Option<Box<dyn Op>> {
        let op = self.ops.get_mut(i)?.take()?;
        self.free.push(i);
        Some(op)
    }
}

/// One ring and its bookkeeping.
pub(crate) struct Ring {
    uring: IoUring,
    sq: Lock<()>,
    cq: Lock<()>,
    table: Lock<Table>,
    in_flight: AtomicUsize,
    /// Above this many ops in flight a submitter runs its op itself, so
    /// the completion queue (four times as large) cannot overflow.
    cap: usize,
    stop: AtomicBool,
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

impl Ring {
    fn new(entries: u32) -> io::Result<Ring> {
        let cq = entries.saturating_mul(4);
        // SUBMIT_ALL (Linux 5.18) keeps submitting past an entry that fails
        // inline; older kernels refuse the flag, so try without it.
        let uring = match IoUring::builder()
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
        Ok(Ring {
            uring,
            sq: Lock::new(()),
            cq: Lock::new(()),
            table: Lock::new(Table {
                ops: Vec::new(),
                free: Vec::new(),
            }),
            in_flight: AtomicUsize::new(0),
            cap: cq as usize / 2,
            stop: AtomicBool::new(false),
        })
    }

    /// Push one entry, submitting first when the queue is full.
    fn push(&self, entry: &squeue::Entry) {
        loop {
            let pushed = {
                let _g = self.sq.lock();
                // SAFETY: `sq` is held, so this is the only
                // `SubmissionQueue` of the ring (its tail is synced when it
                // drops, before the lock is released).
                let mut sq = unsafe { self.uring.submission_shared() };
                // SAFETY: the entry's buffer and descriptor belong to an op
                // already in the in-flight table, which keeps them valid and
                // unmoved until the entry's completion is reaped (module
                // invariants); a NOP carries no buffer.
                let r = unsafe { sq.push(entry) };
                r.is_ok()
            };
            if pushed {
                return;
            }
            self.enter_submit();
        }
    }

    /// Tell the kernel about pushed entries.
    fn enter_submit(&self) {
        loop {
            match self.uring.submitter().submit() {
                Ok(_) => return,
                // The completion queue is backed up: reap, then retry (the
                // caller may be this ring's reaper, inside a waker).
                Err(e) if transient(&e) => {
                    self.drain(true);
                    std::thread::yield_now();
                }
                Err(e) => {
                    // Only a bad ring descriptor gets here; the entries stay
                    // queued for the reaper's next enter.
                    debug_assert!(false, "io_uring_enter: {e}");
                    return;
                }
            }
        }
    }

    /// Submit ops (one `io_uring_enter` for all of them).
    pub(crate) fn submit(&self, ops: impl IntoIterator<Item = Box<dyn Op>>) {
        let mut pushed = 0;
        for mut op in ops {
            if self.in_flight.load(Ordering::Relaxed) >= self.cap {
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
            let i = self.table.lock().insert(op);
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
            self.push(&entry.user_data(i as u64));
            pushed += 1;
        }
        if pushed > 0 {
            self.enter_submit();
        }
    }

    /// Reap what has completed; `wait_lock` says whether to wait for the
    /// completion lock or give up when another thread holds it. Returns
    /// how many completions were reaped.
    fn drain(&self, wait_lock: bool) -> usize {
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
            {
                let mut t = self.table.lock();
                for &(ud, res) in &got[..n] {
                    if ud == WAKE {
                        continue;
                    }
                    match t.take(ud as usize) {
                        Some(op) => ops.push((op, res)),
                        None => debug_assert!(false, "a completion for no op: {ud}"),
                    }
                }
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

    /// Sleep in the kernel until at least one completion is there, then
    /// reap. Errors other than interruptions are returned.
    fn wait_and_drain(&self) -> io::Result<()> {
        match self.uring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e),
        }
        self.drain(true);
        Ok(())
    }

    fn reaper(self: Arc<Ring>) {
        mark_engine_thread();
        loop {
            if self.stop.load(Ordering::Acquire) && self.in_flight.load(Ordering::Acquire) == 0 {
                // Reap the stop NOP if it is there; nothing else can be.
                self.drain(true);
                return;
            }
            if let Err(e) = self.wait_and_drain() {
                eprintln!("kxarray: io_uring reaper: {e}; retrying in 10 ms");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.push(&opcode::Nop::new().build().user_data(WAKE));
        self.enter_submit();
    }
}

impl Progress for Ring {
    fn poll_once(&self) {
        self.drain(false);
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
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        while self.in_flight.load(Ordering::Acquire) > 0 {
            if self.wait_and_drain().is_err() {
                // The kernel may still write into these buffers: leak them.
                let t = std::mem::replace(
                    &mut *self.table.lock(),
                    Table {
                        ops: Vec::new(),
                        free: Vec::new(),
                    },
                );
                std::mem::forget(t);
                return;
            }
        }
    }
}

std::thread_local! {
    /// This thread's shard: a ring index, chosen on its first request.
    static SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The rings of one engine and their reapers.
pub(crate) struct Rings {
    rings: Vec<Arc<Ring>>,
    reapers: Vec<JoinHandle<()>>,
    next_shard: AtomicUsize,
    entries: u32,
}

impl Rings {
    /// `n` rings of `entries` submission entries each, with their reapers.
    ///
    /// # Errors
    /// The first ring's setup error (`EPERM` under seccomp or
    /// `kernel.io_uring_disabled`, `ENOSYS` on kernels without io_uring,
    /// `Unsupported` without the read and write opcodes), or a thread
    /// spawn error.
    pub(crate) fn new(n: usize, entries: u32) -> io::Result<Rings> {
        let n = n.clamp(1, MAX_RINGS);
        let mut rings = Vec::with_capacity(n);
        for _ in 0..n {
            rings.push(Arc::new(Ring::new(entries)?));
        }
        let mut me = Rings {
            rings: Vec::new(),
            reapers: Vec::new(),
            next_shard: AtomicUsize::new(0),
            entries,
        };
        for (i, r) in rings.iter().enumerate() {
            let r2 = Arc::clone(r);
            let h = std::thread::Builder::new()
                .name(format!("kx-aio-reap-{i}"))
                .spawn(move || r2.reaper());
            match h {
                Ok(h) => {
                    me.rings.push(Arc::clone(r));
                    me.reapers.push(h);
                }
                // `me` stops the reapers already started when it drops.
                Err(e) => return Err(e),
            }
        }
        Ok(me)
    }

    pub(crate) fn count(&self) -> usize {
        self.rings.len()
    }

    pub(crate) fn entries(&self) -> u32 {
        self.entries
    }

    /// The calling thread's ring.
    pub(crate) fn ring(&self) -> &Arc<Ring> {
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
        for r in &self.rings {
            r.stop();
        }
        let me = std::thread::current().id();
        for h in self.reapers.drain(..) {
            // A waker run by a reaper may drop the last engine handle: that
            // reaper stops by itself, it cannot join itself.
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}
