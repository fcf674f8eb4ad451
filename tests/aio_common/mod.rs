//! Shared helpers of the I/O engine's tests: the engines to run each test
//! on, a patterned temporary file, a minimal `block_on`, and per-thread CPU
//! time from /proc.
#![allow(dead_code)]

use kxarray::aio::{EngineChoice, IoEngine, IoSettings};
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Every engine this machine can run: the thread pool always, io_uring
/// when it can be set up (otherwise the test says SKIPPED for it, unless
/// `KXARRAY_TEST_REQUIRE_URING=1` makes that a failure).
pub(crate) fn engines() -> Vec<(&'static str, IoEngine)> {
    let mut v = vec![(
        "threads",
        IoEngine::new(
            &IoSettings::default()
                .engine(EngineChoice::Threads)
                .threads(4),
        )
        .unwrap(),
    )];
    match IoEngine::new(&IoSettings::default().engine(EngineChoice::Uring).rings(2)) {
        Ok(e) => v.push(("uring", e)),
        Err(e) => {
            assert!(
                std::env::var("KXARRAY_TEST_REQUIRE_URING").is_err(),
                "io_uring required but unavailable: {e}"
            );
            eprintln!("io_uring engine SKIPPED: {e}");
        }
    }
    v
}

/// The byte at `offset` of a patterned file: differs between neighbouring
/// 4 KiB blocks and within one.
pub(crate) fn pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(2654435761) >> 13) as u8 ^ (offset / 4096) as u8
}

/// A temporary file of `len` patterned bytes.
pub(crate) fn patterned_file(len: usize) -> (tempfile::TempPath, Arc<File>) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..len as u64).map(pattern).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    let (file, path) = f.into_parts();
    (path, Arc::new(file))
}

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Run a future to completion on this thread (parks between polls).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// CPU time (ns) of a thread of this process, from
/// /proc/self/task/TID/schedstat (its first field), or from the stat
/// file's utime + stime in clock ticks (10 ms) when schedstat is absent.
pub(crate) fn thread_cpu_ns(tid: &str) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        return s.split_whitespace().next()?.parse().ok();
    }
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// The engine threads of this process (names starting with `kx-aio-`):
/// (tid, name).
pub(crate) fn engine_threads() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let tid = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Ok(name) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) {
            let name = name.trim().to_string();
            if name.starts_with("kx-aio-") {
                v.push((tid, name));
            }
        }
    }
    v
}

/// This thread's id, as /proc names it.
pub(crate) fn my_tid() -> String {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }.to_string()
}
