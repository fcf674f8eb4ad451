//! The pressure monitor on the kernel's real PSI, where this machine has
//! it: it starts, blocks in `poll` without spinning (its thread's CPU time
//! over a second stays near zero), leaves the capacity alone without
//! pressure, and stops promptly when dropped. Reported ignored, with the
//! reason, where PSI is unavailable. Alone in its file so that no other monitor
//! thread of the same name runs in this process meanwhile.

#![cfg(target_os = "linux")]

mod harness;

use kxarray::memory::{
    LogSink, PressureConfig, PressureMonitor, Psi, Resizable, Trigger, THREAD_NAME,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// The CPU time in nanoseconds of this process's thread named `name`
/// (`/proc/self/task/*/schedstat`, first field), if there is one.
fn thread_cpu_ns(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

fn real_psi_blocks_and_stops() {
    let proc_root = Path::new("/proc");
    let cgroup_root = Path::new("/sys/fs/cgroup");
    if let Err(e) = Psi::for_process(proc_root, cgroup_root, &Trigger::default()) {
        harness::skip_now(format!("PSI unavailable on this machine: {e}"));
    }
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let l = Arc::clone(&lines);
    let config = PressureConfig {
        log: LogSink::Callback(Arc::new(move |line: &str| {
            l.lock().unwrap().push(line.into())
        })),
        ..PressureConfig::default()
    };
    let cache = Arc::new(Cache(AtomicU64::new(1 << 30)));
    let monitor = PressureMonitor::start(Arc::clone(&cache), config).unwrap();
    println!("following {}", monitor.source());
    assert!(
        monitor.source().contains("pressure"),
        "{}",
        monitor.source()
    );

    // The thread exists and is blocked: its CPU time over a second is
    // under 50 ms (a spinning thread would use about 1 s).
    let mut before = None;
    for _ in 0..1000 {
        before = thread_cpu_ns(THREAD_NAME);
        if before.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = before.expect("the monitor thread is running");
    std::thread::sleep(Duration::from_secs(1));
    let after = thread_cpu_ns(THREAD_NAME).expect("still running");
    let used = Duration::from_nanos(after - before);
    println!("monitor thread CPU time over 1 s: {used:?}");
    assert!(
        used < Duration::from_millis(50),
        "the monitor spins: {used:?} of CPU in 1 s"
    );
    assert!(!monitor.is_finished());

    // No pressure from this test; if the shared machine stalled meanwhile,
    // the monitor said so in a line for each change.
    let changed = cache.capacity() != 1 << 30;
    let lines = lines.lock().unwrap().clone();
    assert_eq!(changed, !lines.is_empty(), "{lines:?}");

    let t = Instant::now();
    drop(monitor);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        t.elapsed()
    );
    assert_eq!(thread_cpu_ns(THREAD_NAME), None, "the thread is gone");
}

harness::main!(
    tests: [
        real_psi_blocks_and_stops,
    ],
);
