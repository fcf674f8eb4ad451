//! The fallback engine: a small pool of threads running `pread`/`pwrite`,
//! for when io_uring is unavailable (seccomp, `kernel.io_uring_disabled`,
//! old kernels, other systems), refused after setup, or not wanted.
//!
//! Owns the job queue and the worker threads. Invariants:
//! - a queued or running op owns its buffer and file; a worker performs it
//!   through the op's own safe methods and hands the buffer back through
//!   its slot, so no raw pointer to a buffer is used at all;
//! - at most `depth` ops are queued or running (the pool's bound, as a
//!   ring caps what it has in flight): above it a submitter performs its
//!   own op on its thread, so memory held by queued buffers stays bounded
//!   even with every worker stalled;
//! - an idle worker parks (no spinning) after putting itself on the idle
//!   list, under the queue lock; a submitter that queues a job takes one
//!   idle worker off the list and unparks it, so no job waits while a
//!   worker sleeps;
//! - workers run every queued job before they exit; the pool's `Drop`
//!   waits for them up to [`DROP_GRACE`] and joins those that returned;
//!   one still blocked (a read of an empty pipe) is left to finish alone,
//!   owning its op, so the drop returns in bounded time;
//! - a pool belongs to the process that made it ([`super::fork`]): a
//!   forked child has none of its threads, so the engine makes the child
//!   a pool of its own, and the child's copies of queued jobs fail there;
//! - no op is finished under the queue lock.

use super::completion::{mark_engine_thread, on_engine_thread, Progress};
use super::op::{finish_guarded, Op};
use crate::fork;
use crate::sync::{AtomicBool, AtomicUsize, Lock, Ordering};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long dropping a pool waits for its workers.
pub(crate) const DROP_GRACE: Duration = Duration::from_secs(1);

struct Queue {
    jobs: VecDeque<Box<dyn Op>>,
    idle: Vec<Thread>,
    stop: bool,
}

/// The state the workers and the submitters share.
pub(crate) struct Shared {
    queue: Lock<Queue>,
    /// Ops queued or running.
    in_flight: AtomicUsize,
    /// How many workers have returned, for a bounded drop.
    exited: Mutex<usize>,
    exited_cv: Condvar,
    /// The fork generation of the process that made the pool.
    generation: u64,
}

impl Shared {
    /// The next job, or `None` when stopping with nothing queued; parks
    /// while there is nothing to do.
    fn next(&self) -> Option<Box<dyn Op>> {
        let me = std::thread::current();
        loop {
            {
                let mut q = self.queue.lock();
                if let Some(op) = q.jobs.pop_front() {
                    // Off the idle list (a spurious wake-up may have left it
                    // there), so a submitter wakes a worker that is idle.
                    q.idle.retain(|t| t.id() != me.id());
                    return Some(op);
                }
                if q.stop {
                    return None;
                }
                if !q.idle.iter().any(|t| t.id() == me.id()) {
                    q.idle.push(me.clone());
                }
            }
            // An unpark between the unlock and here makes this return at
            // once (the park token), so no wake-up is lost.
            std::thread::park();
        }
    }

    fn run(&self, mut op: Box<dyn Op>) {
        let res = op.run_sync();
        finish_guarded(op, res);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    fn run_one(&self) -> bool {
        let op = self.queue.lock().jobs.pop_front();
        match op {
            Some(op) => {
                self.run(op);
                true
            }
            None => false,
        }
    }

    fn worker_exited(&self) {
        *self.exited.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.exited_cv.notify_all();
    }

    /// Wait until `n` workers have returned (`true`) or `deadline`
    /// passed (`false`).
    fn wait_exited(&self, n: usize, deadline: Instant) -> bool {
        let mut done = self.exited.lock().unwrap_or_else(|e| e.into_inner());
        while *done < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            done = match self.exited_cv.wait_timeout(done, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }

    fn foreign(&self) -> bool {
        fork::generation() != self.generation
    }
}

impl Progress for Shared {
    /// A caller's thread does not run other callers' requests: nothing,
    /// except in a forked child, where the child's copies of the parent's
    /// queued jobs fail (no worker of this pool exists there).
    fn poll_once(&self) {
        if !self.foreign() {
            return;
        }
        let jobs = match self.queue.try_lock() {
            Some(mut q) => std::mem::take(&mut q.jobs),
            None => return,
        };
        for op in jobs {
            let e = std::io::Error::other(
                "the request was submitted by the parent process before fork(); \
                 it completes in the parent only",
            );
            finish_guarded(op, Err(e));
        }
    }

    /// On a worker waiting inside a waker: run a queued job, or park until
    /// another worker finishes one.
    fn block(&self) {
        if !(on_engine_thread() && self.run_one()) {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

/// The pool: its workers start with the first request.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Lock<Vec<JoinHandle<()>>>,
    /// Workers asked for.
    wanted: usize,
    /// Workers running (set once they were started).
    running: AtomicUsize,
    started: AtomicBool,
    depth: usize,
}

impl Pool {
    /// A pool of `n` workers holding at most `depth` ops (at least 1)
    /// queued or running; the workers start with the first request.
    /// Should a thread fail to start, the pool runs with those that did;
    /// with none, requests run on the submitter's thread.
    pub(crate) fn new(n: usize, depth: usize) -> Pool {
        let shared = Arc::new(Shared {
            queue: Lock::new(Queue {
                jobs: VecDeque::new(),
                idle: Vec::new(),
                stop: false,
            }),
            in_flight: AtomicUsize::new(0),
            exited: Mutex::new(0),
            exited_cv: Condvar::new(),
            generation: fork::generation(),
        });
        Pool {
            shared,
            workers: Lock::new(Vec::new()),
            wanted: n,
            running: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            depth: depth.max(1),
        }
    }

    /// Start the workers (the first request's submitter, once).
    #[cold]
    fn start(&self) {
        let mut workers = self.workers.lock();
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let n = self.wanted;
        for i in 0..n {
            let s = Arc::clone(&self.shared);
            let h = std::thread::Builder::new()
                .name(format!("kx-aio-pool-{i}"))
                .spawn(move || {
                    mark_engine_thread();
                    struct Exit<'a>(&'a Shared);
                    impl Drop for Exit<'_> {
                        fn drop(&mut self) {
                            self.0.worker_exited();
                        }
                    }
                    let _exit = Exit(&s);
                    while let Some(op) = s.next() {
                        s.run(op);
                    }
                });
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    log::warn!(
                        "kxarray: I/O pool: thread {i} of {n} failed to start: {e}; \
                         running with {i}"
                    );
                    break;
                }
            }
        }
        self.running.store(workers.len(), Ordering::Relaxed);
        self.started.store(true, Ordering::Release);
    }

    /// The workers it runs (or will run, before the first request).
    pub(crate) fn threads(&self) -> usize {
        if self.started.load(Ordering::Acquire) {
            self.running.load(Ordering::Relaxed)
        } else {
            self.wanted
        }
    }

    /// The most ops queued or running.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    pub(crate) fn progress(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Queue ops and wake as many idle workers; an op over the bound (or
    /// every op, without workers) runs on the calling thread.
    pub(crate) fn submit(&self, ops: impl IntoIterator<Item = Box<dyn Op>>) {
        if !self.started.load(Ordering::Acquire) {
            self.start();
        }
        let no_workers = self.running.load(Ordering::Relaxed) == 0;
        let mut wake = Vec::new();
        let mut inline = Vec::new();
        {
            let mut q = self.shared.queue.lock();
            for op in ops {
                if no_workers || self.shared.in_flight.load(Ordering::Relaxed) >= self.depth {
                    inline.push(op);
                    continue;
                }
                self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
                q.jobs.push_back(op);
                if let Some(t) = q.idle.pop() {
                    wake.push(t);
                }
            }
        }
        for t in wake {
            t.unpark();
        }
        for mut op in inline {
            let res = op.run_sync();
            finish_guarded(op, res);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.shared.foreign() {
            // The parent's workers do not exist here.
            std::mem::forget(std::mem::take(&mut *self.workers.lock()));
            return;
        }
        let mut workers = std::mem::take(&mut *self.workers.lock());
        let idle = {
            let mut q = self.shared.queue.lock();
            q.stop = true;
            std::mem::take(&mut q.idle)
        };
        for t in idle {
            t.unpark();
        }
        for h in &workers {
            h.thread().unpark();
        }
        // A waker run by a worker may drop the last engine handle: that
        // worker returns by itself, it cannot wait for itself.
        let me = std::thread::current().id();
        let others = workers.iter().filter(|h| h.thread().id() != me).count();
        let all = self.shared.wait_exited(others, Instant::now() + DROP_GRACE);
        let mut stuck = 0;
        for h in workers.drain(..) {
            if h.thread().id() == me {
                continue;
            }
            if all || h.is_finished() {
                let _ = h.join();
            } else {
                // Blocked in a read that has not returned: it owns its op
                // and returns when the read does.
                stuck += 1;
            }
        }
        if stuck > 0 {
            log::warn!(
                "kxarray: I/O pool: {stuck} thread(s) still blocked in a request; \
                 left to finish alone"
            );
        }
    }
}
