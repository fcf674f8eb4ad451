//! The I/O engine across `fork` and under a refused `io_uring_enter`,
//! each through the public API in a forked
//! child whose exit status the parent checks.
//!
//! The tests fork, so they take one lock each: a child is then made while
//! no other test of this file runs.

mod harness;

mod aio_common;

use aio_common::{
    child_by, engines, fork_child, pattern, patterned_file, pipe, refuse_io_uring_enter,
    returns_within, wait_child, wait_within, How,
};
use kxarray::aio::{EngineChoice, EngineKind, IoEngine, IoSettings, CURRENT_POSITION};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// One forking test at a time.
static FORK: Mutex<()> = Mutex::new(());

/// A hang guard (far above what anything here needs).
const LIMIT: Duration = Duration::from_secs(30);

fn is_pattern(buf: &[u8], offset: u64) -> bool {
    buf.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(offset + i as u64))
}

/// Point 1: a child reads through the engine it inherited while the
/// parent has reads pending on empty pipes (one submitted before the fork,
/// one after, in the table slot the child's copy hands out next). The
/// child's reads complete in the child with the right bytes (a callback
/// and a wait); the parent's stay pending until the parent writes its
/// pipes, then return exactly those bytes; no completion reaches the
/// parent's rings for a request it does not have.
fn a_forked_child_reads_through_its_own_engine_and_never_touches_the_parents() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let (_path, file) = patterned_file(1 << 16);
    for (name, engine) in engines() {
        let (r1, mut w1) = pipe();
        let before = engine.read(&r1, CURRENT_POSITION, vec![0u8; 4096]);
        // A request done and reaped: its table slot is free again, the
        // next one the child's copy of the table would hand out.
        let (n, _) = engine.read(&file, 0, vec![0u8; 4096]).wait();
        assert_eq!(n.unwrap(), 4096, "{name}");
        let (go_r, mut go_w) = pipe();
        let child_engine = engine.clone();
        let child_file = file.clone();
        let pid = fork_child(move || {
            let mut b = [0u8; 1];
            if (&*go_r).read_exact_compat(&mut b).is_err() {
                return 10;
            }
            let (tx, rx) = mpsc::channel();
            child_engine
                .read(&child_file, 8192, vec![0u8; 4096])
                .on_complete(move |n, buf| {
                    let _ = tx.send((n.ok(), buf));
                });
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok((Some(4096), buf)) if is_pattern(&buf, 8192) => {}
                Ok(_) => return 2,
                Err(_) => return 3,
            }
            match wait_within(
                child_engine.read(&child_file, 12288, vec![0u8; 4096]),
                Duration::from_secs(10),
            ) {
                Some((Ok(4096), buf)) if is_pattern(&buf, 12288) => {}
                Some(_) => return 4,
                None => return 5,
            }
            0
        });
        // Submitted after the fork: in the parent it takes the free slot.
        let (r2, mut w2) = pipe();
        let after = engine.read(&r2, CURRENT_POSITION, vec![0u8; 4096]);
        go_w.write_all(b"g").unwrap();
        let status = wait_child(pid, LIMIT);
        let early = (before.is_done(), after.is_done());
        w1.write_all(b"parent one").unwrap();
        w2.write_all(b"parent two").unwrap();
        let one = wait_within(before, LIMIT);
        let two = wait_within(after, LIMIT);
        assert_eq!(status, Some(0), "{name}: the child's reads (exit status)");
        assert_eq!(
            early,
            (false, false),
            "{name}: a parent's read completed early"
        );
        for (got, want) in [(one, &b"parent one"[..]), (two, b"parent two")] {
            let (n, buf) = got.unwrap_or_else(|| panic!("{name}: a parent's read hangs"));
            assert_eq!(n.unwrap(), want.len(), "{name}");
            assert_eq!(&buf[..want.len()], want, "{name}");
            assert!(
                buf[want.len()..].iter().all(|&b| b == 0),
                "{name}: bytes overwritten"
            );
        }
        assert_eq!(engine.stray_completions(), 0, "{name}");
        // The parent's engine goes on.
        let (n, buf) = engine.read(&file, 4096, vec![0u8; 4096]).wait();
        assert_eq!(n.unwrap(), 4096, "{name}");
        assert!(is_pattern(&buf, 4096), "{name}");
    }
}

/// A child made without the C library's fork handlers (glibc's `_Fork`,
/// the raw `clone(2)` system call) reads through the engine it inherited
/// while the parent has a read pending: the child's reads complete in the
/// child with the right bytes, and nothing reaches the parent's rings (no
/// stray completion, the parent's read still pending until its pipe is
/// written). Before, only a `pthread_atfork` handler told a child apart:
/// such a child submitted into the parent's ring, whose reaper took its
/// completion.
fn a_child_made_without_fork_handlers_never_touches_the_parents_ring() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let (_path, file) = patterned_file(1 << 16);
    for how in [How::UnderscoreFork, How::RawClone] {
        for (name, engine) in engines() {
            let (r1, mut w1) = pipe();
            let before = engine.read(&r1, CURRENT_POSITION, vec![0u8; 4096]);
            let (n, _) = engine.read(&file, 0, vec![0u8; 4096]).wait();
            assert_eq!(n.unwrap(), 4096, "{name}");
            let child_engine = engine.clone();
            let child_file = file.clone();
            let pid = child_by(how, move || {
                for at in [8192u64, 16384] {
                    match wait_within(
                        child_engine.read(&child_file, at, vec![0u8; 4096]),
                        Duration::from_secs(10),
                    ) {
                        Some((Ok(4096), buf)) if is_pattern(&buf, at) => {}
                        Some(_) => return 2,
                        None => return 3,
                    }
                }
                0
            });
            let status = wait_child(pid, LIMIT);
            assert_eq!(status, Some(0), "{name} {how:?}: the child's reads");
            assert!(
                !before.is_done(),
                "{name} {how:?}: the parent's read completed early"
            );
            assert_eq!(engine.stray_completions(), 0, "{name} {how:?}");
            w1.write_all(b"parent").unwrap();
            let (n, buf) = wait_within(before, LIMIT).expect("the parent's read hangs");
            assert_eq!(
                (n.unwrap(), &buf[..6]),
                (6, &b"parent"[..]),
                "{name} {how:?}"
            );
        }
    }
}

/// Point 1, the child's side of a request the parent submitted before the
/// fork: on io_uring it fails in the child (it completes in the parent
/// only) instead of leaving the child waiting for ever.
fn a_parents_request_fails_in_the_child_instead_of_hanging() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    for (name, engine) in engines() {
        if engine.kind() != EngineKind::Uring {
            continue; // a pool thread runs it: the child has no copy to fail
        }
        let (r, mut w) = pipe();
        let before = engine.read(&r, CURRENT_POSITION, vec![0u8; 16]);
        let pid = fork_child(move || match wait_within(before, Duration::from_secs(10)) {
            Some((Err(_), buf)) if buf.iter().all(|&b| b == 0) => 0,
            Some(_) => 2,
            None => 3,
        });
        let status = wait_child(pid, LIMIT);
        w.write_all(b"x").unwrap();
        assert_eq!(status, Some(0), "{name}");
    }
}

/// Point 2, at setup: under a filter that refuses `io_uring_enter` only,
/// forcing io_uring fails with the error, and `Auto` falls back to the
/// pool saying why, and reads through it.
fn a_refused_io_uring_enter_is_seen_at_setup() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    if engines().len() < 2 {
        return; // no io_uring here at all
    }
    let (_path, file) = patterned_file(1 << 16);
    let pid = fork_child(move || {
        if refuse_io_uring_enter().is_err() {
            return SKIP;
        }
        let uring = IoSettings::default().engine(EngineChoice::Uring).rings(1);
        match IoEngine::new(&uring) {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(_) => return 2,
            Ok(_) => return 3,
        }
        let auto = match IoEngine::new(&uring.engine(EngineChoice::Auto)) {
            Ok(e) => e,
            Err(_) => return 4,
        };
        if auto.kind() != EngineKind::Threads
            || !auto
                .fallback_reason()
                .is_some_and(|r| r.contains("io_uring_enter"))
        {
            return 5;
        }
        match wait_within(
            auto.read(&file, 4096, vec![0u8; 4096]),
            Duration::from_secs(10),
        ) {
            Some((Ok(4096), buf)) if is_pattern(&buf, 4096) => 0,
            _ => 6,
        }
    });
    check_status(wait_child(pid, LIMIT));
}

/// Point 2, later: a filter installed after the rings were set up. The
/// first read submitted then fails with the error instead of hanging, a
/// read the kernel had taken before still completes, the engine moves to
/// its pool for every later request, and dropping it returns.
fn a_refused_io_uring_enter_after_setup_fails_over_to_the_pool() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    if engines().len() < 2 {
        return;
    }
    let (_path, file) = patterned_file(1 << 16);
    let pid = fork_child(move || {
        // Count the records saying io_uring was refused (one, not one
        // per retry: the reaper retried every 10 ms, logging each).
        if log::set_logger(&REFUSALS).is_err() {
            return 15;
        }
        log::set_max_level(log::LevelFilter::Trace);
        let uring = IoSettings::default().engine(EngineChoice::Uring).rings(1);
        let Ok(engine) = IoEngine::new(&uring) else {
            return 10;
        };
        match engine.read(&file, 0, vec![0u8; 4096]).wait() {
            (Ok(4096), buf) if is_pattern(&buf, 0) => {}
            _ => return 11,
        }
        let (r, mut w) = pipe();
        let taken = engine.read(&r, CURRENT_POSITION, vec![0u8; 8]);
        if refuse_io_uring_enter().is_err() {
            return SKIP;
        }
        match wait_within(
            engine.read(&file, 4096, vec![0u8; 4096]),
            Duration::from_secs(10),
        ) {
            Some((Err(e), _)) if e.raw_os_error() == Some(libc::EPERM) => {}
            Some((Ok(_), _)) => return 2,
            Some((Err(_), _)) => return 3,
            None => return 4,
        }
        for i in 2..6u64 {
            match wait_within(
                engine.read(&file, i * 4096, vec![0u8; 4096]),
                Duration::from_secs(10),
            ) {
                Some((Ok(4096), buf)) if is_pattern(&buf, i * 4096) => {}
                Some(_) => return 5,
                None => return 6,
            }
        }
        if engine.kind() != EngineKind::Threads || !engine.describe().contains("refused") {
            return 7;
        }
        if w.write_all(b"in time!").is_err() {
            return 13;
        }
        match wait_within(taken, Duration::from_secs(10)) {
            Some((Ok(8), buf)) if &buf[..] == b"in time!" => {}
            Some(_) => return 8,
            None => return 9,
        }
        if !returns_within(move || drop(engine), Duration::from_secs(10)) {
            return 14;
        }
        match REFUSALS.0.load(Ordering::Relaxed) {
            1 => 0,
            _ => 16,
        }
    });
    check_status(wait_child(pid, LIMIT));
}

/// The exit status of a child that could not install its seccomp filter.
const SKIP: i32 = 77;

/// A child's status: 0, or [`SKIP`] (said, not failed: seccomp is
/// unavailable here), else a failure.
fn check_status(status: Option<i32>) {
    if status == Some(SKIP) {
        harness::skip_now("seccomp(2) filters cannot be installed here");
    }
    assert_eq!(status, Some(0), "exit status");
}

/// A logger counting the records that say `io_uring_enter` failed.
struct Refusals(AtomicUsize);

static REFUSALS: Refusals = Refusals(AtomicUsize::new(0));

impl log::Log for Refusals {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.args().to_string().contains("io_uring_enter failed") {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn flush(&self) {}
}

/// `Read::read_exact` on a shared `&File`, without importing `Read` at
/// the top (the engine tests use positional reads).
trait ReadExactCompat {
    fn read_exact_compat(self, buf: &mut [u8]) -> std::io::Result<()>;
}

impl ReadExactCompat for &std::fs::File {
    fn read_exact_compat(mut self, buf: &mut [u8]) -> std::io::Result<()> {
        std::io::Read::read_exact(&mut self, buf)
    }
}

/// Reported as ignored, with the reason, when io_uring cannot be set up
/// here: the tests above then ran on the thread pool alone.
fn io_uring_ran_here() -> harness::Outcome {
    aio_common::uring_here().map_err(harness::Skip)
}

harness::main!(
    tests: [
        a_forked_child_reads_through_its_own_engine_and_never_touches_the_parents,
        a_child_made_without_fork_handlers_never_touches_the_parents_ring,
        a_parents_request_fails_in_the_child_instead_of_hanging,
        a_refused_io_uring_enter_is_seen_at_setup,
        a_refused_io_uring_enter_after_setup_fails_over_to_the_pool,
        io_uring_ran_here,
    ],
);
