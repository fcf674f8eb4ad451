//! The fallback engine: a small pool of threads running `pread`/`pwrite`,
//! for when io_uring is unavailable (seccomp, `kernel.io_uring_disabled`,
//! old kernels, other systems) or not wanted.
//!
//! Owns the job queue and the worker threads. Invariants:
//! - a queued or running op owns its buffer and file; a worker performs it
//!   through the op's own safe methods and hands the buffer back through
//!   its slot, so no raw pointer to a buffer is used at all;
//! - an idle worker parks (no spinning) after putting itself on the idle
//!   list, under the queue lock; a submitter that queues a job takes one
//!   idle worker off the list and unparks it, so no job waits while a
//!   worker sleeps;
//! - workers run every queued job before they exit; the pool's `Drop`
//!   joins them (except the calling thread, when a waker run by a worker
//!   dropped the last engine handle);
//! - no op is finished under the queue lock.

use super::completion::{mark_engine_thread, Progress};
use super::op::{finish_guarded, Op};
use crate::sync::Lock;
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};

struct Queue {
    jobs: VecDeque<Box<dyn Op>>,
    idle: Vec<Thread>,
    stop: bool,
}

/// The state the workers and the submitters share.
pub(crate) struct Shared {
    queue: Lock<Queue>,
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

    fn run_one(&self) -> bool {
        let op = self.queue.lock().jobs.pop_front();
        match op {
            Some(mut op) => {
                let res = op.run_sync();
                finish_guarded(op, res);
                true
            }
            None => false,
        }
    }
}

impl Progress for Shared {
    /// A caller's thread does not run other callers' requests: nothing.
    fn poll_once(&self) {}

    /// On a worker waiting inside a waker: run a queued job, or park until
    /// another worker finishes one.
    fn block(&self) {
        if !self.run_one() {
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
}

/// The pool.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `n` workers. Should a thread fail to start, the pool
    /// runs with those that did; with none, requests run on the
    /// submitter's thread.
    pub(crate) fn new(n: usize) -> Pool {
        let shared = Arc::new(Shared {
            queue: Lock::new(Queue {
                jobs: VecDeque::new(),
                idle: Vec::new(),
                stop: false,
            }),
        });
        let mut workers = Vec::new();
        for i in 0..n {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("kx-aio-pool-{i}"))
                .spawn(move || {
                    mark_engine_thread();
                    while let Some(mut op) = s.next() {
                        let res = op.run_sync();
                        finish_guarded(op, res);
                    }
                });
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    eprintln!("kxarray: I/O pool: thread {i} of {n} failed to start: {e}");
                    break;
                }
            }
        }
        Pool { shared, workers }
    }

    pub(crate) fn threads(&self) -> usize {
        self.workers.len()
    }

    pub(crate) fn progress(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Queue ops and wake as many idle workers.
    pub(crate) fn submit(&self, ops: impl IntoIterator<Item = Box<dyn Op>>) {
        if self.workers.is_empty() {
            for mut op in ops {
                let res = op.run_sync();
                finish_guarded(op, res);
            }
            return;
        }
        let mut wake = Vec::new();
        {
            let mut q = self.shared.queue.lock();
            for op in ops {
                q.jobs.push_back(op);
                if let Some(t) = q.idle.pop() {
                    wake.push(t);
                }
            }
        }
        for t in wake {
            t.unpark();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let idle = {
            let mut q = self.shared.queue.lock();
            q.stop = true;
            std::mem::take(&mut q.idle)
        };
        for t in idle {
            t.unpark();
        }
        for h in &self.workers {
            h.thread().unpark();
        }
        let me = std::thread::current().id();
        for h in self.workers.drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}
