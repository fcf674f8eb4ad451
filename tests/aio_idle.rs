//! No thread of the I/O engine spins: over one second with a request in
//! flight that the kernel does not complete (a read of an empty pipe), and
//! over one second with nothing in flight, the engine's threads (named
//! `kx-aio-*`) and the caller parked in `Completion::wait` use almost no
//! CPU. Its own test binary, so no other test's I/O runs meanwhile.

mod harness;

mod aio_common;

use aio_common::{engine_threads, engines, my_tid, thread_cpu_ns};
use kxarray::aio::CURRENT_POSITION;
use std::fs::File;
use std::io::Write;
use std::os::unix::io::FromRawFd;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// CPU used by the engine threads (and `extra`) over `d`, in ns.
fn cpu_over(d: Duration, extra: &[String]) -> (u64, Vec<(String, u64)>) {
    let mut tids: Vec<(String, String)> = engine_threads();
    tids.extend(extra.iter().map(|t| (t.clone(), "waiter".to_string())));
    assert!(!tids.is_empty());
    let before: Vec<Option<u64>> = tids.iter().map(|(t, _)| thread_cpu_ns(t)).collect();
    std::thread::sleep(d);
    let mut total = 0;
    let mut each = Vec::new();
    for ((t, name), b) in tids.iter().zip(before) {
        if let (Some(b), Some(a)) = (b, thread_cpu_ns(t)) {
            total += a - b;
            each.push((name.clone(), a - b));
        }
    }
    (total, each)
}

fn engine_threads_and_waiters_use_no_cpu_when_idle() {
    for (name, engine) in engines() {
        // Warm up: some I/O, so every thread has run.
        let f = Arc::new(tempfile::tempfile().unwrap());
        for i in 0..64u64 {
            engine
                .write(&f, i * 4096, vec![1u8; 4096])
                .wait()
                .0
                .unwrap();
        }
        // Nothing in flight.
        let (idle, each) = cpu_over(Duration::from_secs(1), &[]);
        // A read in flight for a second, its caller parked in wait().
        let mut fds = [0; 2];
        // SAFETY: room for pipe(2)'s two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: a fresh descriptor owned by nothing else.
        let r = unsafe { File::from_raw_fd(fds[0]) };
        // SAFETY: as above.
        let mut w = unsafe { File::from_raw_fd(fds[1]) };
        let r = Arc::new(r);
        let (tid_tx, tid_rx) = mpsc::channel();
        let e2 = engine.clone();
        let waiter = std::thread::spawn(move || {
            tid_tx.send(my_tid()).unwrap();
            e2.read(&r, CURRENT_POSITION, vec![0u8; 4]).wait()
        });
        let tid = tid_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (pending, each_pending) = cpu_over(Duration::from_secs(1), &[tid]);
        w.write_all(b"done").unwrap();
        let (n, buf) = waiter.join().unwrap();
        assert_eq!((n.unwrap(), &buf[..]), (4, &b"done"[..]));
        eprintln!(
            "{name}: CPU over 1 s: idle {} us {each:?}; one read pending {} us {each_pending:?}",
            idle / 1000,
            pending / 1000
        );
        // A spinning thread would use ~1 s; a few wake-ups cost microseconds.
        // 20 ms allows for the clock-tick fallback's 10 ms granularity.
        assert!(
            idle < 20_000_000,
            "{name}: engine threads used {idle} ns idle: {each:?}"
        );
        assert!(
            pending < 20_000_000,
            "{name}: {pending} ns with a read pending: {each_pending:?}"
        );
    }
}

/// Reported as ignored, with the reason, when io_uring cannot be set up
/// here: the tests above then ran on the thread pool alone.
fn io_uring_ran_here() -> harness::Outcome {
    aio_common::uring_here().map_err(harness::Skip)
}

harness::main!(
    tests: [
        engine_threads_and_waiters_use_no_cpu_when_idle,
        io_uring_ran_here,
    ],
);
