//! The pressure monitor's thread driven by a fake pressure source: stalls
//! the test sends shrink the target step by step, quiet lets it grow back,
//! a capacity the user sets is the new configured one, and dropping the
//! handle stops the thread promptly. `Psi::for_process` where there is no
//! PSI is a typed error listing what it tried.

#![cfg(target_os = "linux")]

use kxarray::memory::{
    LogSink, MonotonicClock, PressureConfig, PressureMonitor, PressureSource, Psi, Resizable,
    ShrinkPolicy, StopSignal, Trigger, Wait,
};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const M: u64 = 1 << 20;

/// Stalls come from the test through a channel; each wait first tells the
/// test it is waiting (so the previous event has been acted on).
struct Channel {
    stalls: Receiver<()>,
    waiting: Sender<()>,
}

impl PressureSource for Channel {
    fn wait(&mut self, timeout: Option<Duration>, stop: &StopSignal) -> io::Result<Wait> {
        let _ = self.waiting.send(());
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.stalls.try_recv() {
                Ok(()) => return Ok(Wait::Stall),
                Err(TryRecvError::Disconnected) => {}
                Err(TryRecvError::Empty) => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(Wait::Timeout);
            }
            if stop.wait(Some(Duration::from_millis(2)))? {
                return Ok(Wait::Stop);
            }
        }
    }
    fn describe(&self) -> String {
        "a channel".into()
    }
}

struct Cache(AtomicU64);

impl Resizable for Cache {
    type Error = std::convert::Infallible;
    fn capacity(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    fn set_capacity(&self, bytes: u64) -> Result<(), Self::Error> {
        self.0.store(bytes, Ordering::SeqCst);
        Ok(())
    }
}

fn collect() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::clone(&buf);
    (
        LogSink::Callback(Arc::new(move |l: &str| b.lock().unwrap().push(l.into()))),
        buf,
    )
}

/// Wait (at most 20 s, for a loaded machine) until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn stalls_shrink_quiet_grows_back() {
    let (stall, stalls) = channel();
    let (waiting_tx, waiting) = channel();
    let cache = Arc::new(Cache(AtomicU64::new(1024 * M)));
    let (log, lines) = collect();
    let policy = ShrinkPolicy {
        grow_after: Duration::from_secs(1),
        grow_interval: Duration::from_millis(20),
        ..ShrinkPolicy::default()
    };
    let config = PressureConfig {
        policy,
        log,
        ..PressureConfig::default()
    };
    let source = Channel {
        stalls,
        waiting: waiting_tx,
    };
    let monitor =
        PressureMonitor::start_with(Arc::clone(&cache), source, MonotonicClock, config).unwrap();
    assert_eq!(monitor.source(), "a channel");
    waiting.recv().unwrap();
    for want in [896 * M, 784 * M, 686 * M] {
        stall.send(()).unwrap();
        waiting.recv().unwrap(); // the stall was acted on
                                 // No growth step comes in between: the quiet period (1 s) is far
                                 // longer than this loop's steps, unless a loaded machine pauses the
                                 // test that long; then the value is one step higher.
        let now = cache.capacity();
        assert!(now == want || now == want + 128 * M, "{now}");
    }
    eventually("grown back to 1 GiB", || cache.capacity() == 1024 * M);
    // It stays there: nothing pending, the thread blocks.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(cache.capacity(), 1024 * M);
    let lines = lines.lock().unwrap().clone();
    let shrinks = lines
        .iter()
        .filter(|l| l.starts_with("memory pressure on a channel"))
        .count();
    let grows = lines
        .iter()
        .filter(|l| l.starts_with("no memory pressure"))
        .count();
    assert!(shrinks >= 3 && grows >= 3, "{lines:#?}");
    assert!(lines[0].contains("1024.0 MiB -> 896.0 MiB"), "{lines:#?}");
    assert!(lines
        .last()
        .unwrap()
        .ends_with("-> 1024.0 MiB (configured 1024.0 MiB)"));

    // The user lowers the capacity: the monitor grows back to that, not
    // to 1 GiB.
    // Growth steps' waits left messages behind: drop them (the thread is
    // blocked in its wait, with nothing pending, since it reached 1 GiB).
    while waiting.try_recv().is_ok() {}
    cache.set_capacity(512 * M).unwrap();
    stall.send(()).unwrap();
    waiting.recv().unwrap();
    assert_eq!(cache.capacity(), 448 * M);
    eventually("grown back to the user's 512 MiB", || {
        cache.capacity() == 512 * M
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(cache.capacity(), 512 * M);

    let t = Instant::now();
    drop(monitor);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        t.elapsed()
    );
}

/// A source that fails ends the thread; the handle says so and drops
/// without waiting.
#[test]
fn failing_source_ends_the_thread() {
    struct Gone;
    impl PressureSource for Gone {
        fn wait(&mut self, _: Option<Duration>, _: &StopSignal) -> io::Result<Wait> {
            Err(io::Error::other("the cgroup was removed"))
        }
        fn describe(&self) -> String {
            "gone".into()
        }
    }
    let (log, lines) = collect();
    let config = PressureConfig {
        log,
        ..PressureConfig::default()
    };
    let cache = Arc::new(Cache(AtomicU64::new(M)));
    let m = PressureMonitor::start_with(cache, Gone, MonotonicClock, config).unwrap();
    eventually("the thread ended", || m.is_finished());
    assert_eq!(
        *lines.lock().unwrap(),
        ["memory pressure monitor stopped: gone: the cgroup was removed"]
    );
}

/// No PSI in a fake tree: NotFound, naming both places tried.
#[test]
fn no_psi_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (proc_root, cg) = (tmp.path().join("proc"), tmp.path().join("cg"));
    std::fs::create_dir_all(proc_root.join("self")).unwrap();
    std::fs::create_dir_all(cg.join("app")).unwrap();
    std::fs::write(proc_root.join("self/cgroup"), "0::/app\n").unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
    let e = Psi::for_process(&proc_root, &cg, &Trigger::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let msg = e.to_string();
    assert!(
        msg.contains("app/memory.pressure: ") && msg.contains("pressure/memory: "),
        "{msg}"
    );
}
