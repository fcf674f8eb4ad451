//! Threads on demand for the connections that have something to do.
//!
//! Owns the server's worker threads. A job goes to a thread waiting for
//! one, or to a new thread when none waits; a thread that finds no job
//! for [`IDLE_EXIT`] exits, and so does one that would wait beside
//! [`MAX_IDLE`] others, so the thread count follows the number of
//! connections being served, and falls back to none when all are idle.
//! Invariants: every job given to [`Pool::execute`] runs exactly once, or
//! is handed back when no thread can be started; `threads` counts the
//! live pool threads and `idle` those waiting, both under one lock.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long a pool thread waits for a job before it exits.
pub const IDLE_EXIT: Duration = Duration::from_secs(5);

/// Most threads kept waiting for jobs (more exit at once when idle).
pub const MAX_IDLE: usize = 4;

/// A job: serve one connection for a while.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Threads started as jobs need them.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("jobs", &self.jobs.len())
            .field("threads", &self.threads)
            .field("idle", &self.idle)
            .finish()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Jobs run outside the lock; the counters are updated in single
    // statements, so a poisoned lock still holds consistent data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Live pool threads.
    pub fn threads(&self) -> usize {
        lock(&self.inner.state).threads
    }

    /// Run `job` on a waiting thread, or on a new one.
    ///
    /// # Errors
    /// The job back with the error when no thread waits and none can be
    /// started (`EAGAIN`: the process or system thread limit).
    pub fn execute(&self, job: Job) -> Result<(), (Job, io::Error)> {
        let mut state = lock(&self.inner.state);
        if state.idle > state.jobs.len() {
            state.jobs.push_back(job);
            drop(state);
            self.inner.wake.notify_one();
            return Ok(());
        }
        state.threads += 1;
        drop(state);
        // The job travels in a slot the thread empties, so that it can be
        // handed back if the thread does not start.
        let slot = Arc::new(Mutex::new(Some(job)));
        let theirs = slot.clone();
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-worker".into())
            .spawn(move || {
                let first = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                drop(theirs);
                if let Some(job) = first {
                    job();
                }
                inner.run();
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                lock(&self.inner.state).threads -= 1;
                let job = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                match job {
                    Some(job) => Err((job, e)),
                    // Not reached: the slot is emptied only by the thread.
                    None => Ok(()),
                }
            }
        }
    }
}

impl Inner {
    /// Take jobs until none comes for [`IDLE_EXIT`].
    fn run(&self) {
        let mut state = lock(&self.state);
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                job();
                state = lock(&self.state);
                continue;
            }
            if state.idle >= MAX_IDLE {
                state.threads -= 1;
                return;
            }
            state.idle += 1;
            let (s, timeout) = self
                .wake
                .wait_timeout(state, IDLE_EXIT)
                .unwrap_or_else(|e| e.into_inner());
            state = s;
            state.idle -= 1;
            if timeout.timed_out() && state.jobs.is_empty() {
                state.threads -= 1;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn every_job_runs_once_and_threads_are_reused() {
        let pool = Pool::new();
        let (tx, rx) = mpsc::channel();
        for i in 0..50 {
            let tx = tx.clone();
            pool.execute(Box::new(move || tx.send(i).unwrap()))
                .map_err(|(_, e)| e)
                .unwrap();
        }
        let mut got: Vec<i32> = (0..50).map(|_| rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
        // Once the jobs are done the threads wait for more; one job then
        // needs no new thread.
        std::thread::sleep(Duration::from_millis(50));
        let before = pool.threads();
        assert!(before >= 1);
        pool.execute(Box::new(move || tx.send(99).unwrap()))
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(rx.recv().unwrap(), 99);
        assert_eq!(pool.threads(), before);
    }
}
