//! The pressure monitor: a thread that follows memory pressure and
//! resizes a cache as a kernel shrinker would.
//!
//! Owns [`PressureMonitor`] (the thread and its stop signal),
//! [`Resizable`] (what it resizes), [`PressureConfig`] and [`LogSink`].
//! Invariants: the thread blocks in its source's `wait` between
//! decisions (with no timeout when no growth is pending, otherwise until
//! the next growth step), so it uses no CPU while nothing happens;
//! dropping the handle sets the stop signal and joins the thread, which
//! returns at once from `poll` (in a forked child, dropping the parent's
//! monitor touches nothing: its thread and its eventfd are the parent's);
//! every change of capacity it makes, and every failure, is one log line.

use super::poll::StopSignal;
use super::psi::Psi;
use super::shrinker::{Decision, ShrinkPolicy, Shrinker};
use super::source::{Clock, MonotonicClock, PressureSource, Wait};
use super::trigger::Trigger;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Something with a capacity in bytes that can be changed at run time: a
/// cache the pressure monitor shrinks and grows.
///
/// ```
/// use kxarray::memory::Resizable;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// struct Budget(AtomicU64);
///
/// impl Resizable for Budget {
///     type Error = std::convert::Infallible;
///     fn capacity(&self) -> u64 {
///         self.0.load(Ordering::Relaxed)
///     }
///     fn set_capacity(&self, bytes: u64) -> Result<(), Self::Error> {
///         self.0.store(bytes, Ordering::Relaxed);
///         Ok(())
///     }
/// }
///
/// let b = Budget(AtomicU64::new(1 << 30));
/// b.set_capacity(512 << 20).unwrap();
/// assert_eq!(b.capacity(), 512 << 20);
/// ```
pub trait Resizable: Send + Sync {
    /// Why a capacity could not be set (logged by the monitor).
    type Error: fmt::Display;

    /// The capacity in bytes now.
    fn capacity(&self) -> u64;

    /// Set the capacity in bytes (lowering it may evict and write back
    /// before it returns).
    ///
    /// # Errors
    /// The target's reason for refusing.
    fn set_capacity(&self, bytes: u64) -> Result<(), Self::Error>;

    /// The bytes it holds now, if it knows (a shared budget counts the
    /// capacity it has not filled yet as promised, and lowers the demand
    /// of a cache that does not fill its capacity). `None` by default:
    /// taken as full.
    fn used(&self) -> Option<u64> {
        None
    }
}

/// Where a pressure monitor's log lines go.
#[derive(Clone, Default)]
pub enum LogSink {
    /// An `info` record of the [`log`] facade, prefixed with `kxarray: `
    /// (the default): silent until the application installs a logger
    /// (the SQLite VFS forwards it to `sqlite3_log`, the NBD server to its
    /// `tracing` subscriber).
    #[default]
    Log,
    /// Nowhere.
    Off,
    /// A function of the line (without a prefix or a newline): to a
    /// logging crate, SQLite's log, a test's buffer.
    Callback(Arc<dyn Fn(&str) + Send + Sync>),
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogSink::Log => "Log",
            LogSink::Off => "Off",
            LogSink::Callback(_) => "Callback(..)",
        })
    }
}

impl LogSink {
    /// Log `line`.
    pub fn log(&self, line: &str) {
        match self {
            LogSink::Log => log::info!("kxarray: {line}"),
            LogSink::Off => {}
            LogSink::Callback(f) => f(line),
        }
    }
}

/// A pressure monitor's settings: the PSI trigger, the shrink and growth
/// policy, and where log lines go.
///
/// ```
/// use kxarray::memory::{LogSink, PressureConfig, ShrinkPolicy, Stall, Trigger};
/// use std::time::Duration;
///
/// let config = PressureConfig {
///     trigger: Trigger::new(Stall::Full, Duration::from_millis(200), Duration::from_secs(2)).unwrap(),
///     policy: ShrinkPolicy { min_bytes: 64 << 20, ..ShrinkPolicy::default() },
///     log: LogSink::Off,
/// };
/// assert_eq!(config.trigger.to_string(), "full 200000 2000000");
/// ```
#[derive(Clone, Debug, Default)]
pub struct PressureConfig {
    /// The stall that wakes the monitor (default `some 300000 2000000`).
    pub trigger: Trigger,
    /// How it shrinks and grows.
    pub policy: ShrinkPolicy,
    /// Where its log lines go (default the [`log`] facade).
    pub log: LogSink,
}

/// A running pressure monitor: a thread shrinking a [`Resizable`] while
/// the system stalls on memory and growing it back once the stalls have
/// stopped (see [`Shrinker`] for the decisions). Dropping it stops the
/// thread and waits for it (promptly: the thread is woken from `poll`).
/// The monitor keeps the target alive until then.
///
/// ```
/// use kxarray::memory::{LogSink, PressureConfig, PressureMonitor, Resizable};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// struct Budget(AtomicU64);
/// impl Resizable for Budget {
///     type Error = std::convert::Infallible;
///     fn capacity(&self) -> u64 { self.0.load(Ordering::Relaxed) }
///     fn set_capacity(&self, b: u64) -> Result<(), Self::Error> { Ok(self.0.store(b, Ordering::Relaxed)) }
/// }
///
/// let cache = Arc::new(Budget(AtomicU64::new(1 << 30)));
/// let config = PressureConfig { log: LogSink::Off, ..PressureConfig::default() };
/// // Where the kernel has no PSI (or refuses the trigger) this is an error
/// // the caller may ignore: the cache then keeps its capacity.
/// let monitor = PressureMonitor::start(Arc::clone(&cache), config).ok();
/// if let Some(m) = &monitor {
///     println!("following {}", m.source());
/// }
/// drop(monitor); // stops the thread
/// assert_eq!(cache.capacity(), 1 << 30); // no pressure meanwhile, presumably
/// # let _ = ();
/// ```
#[derive(Debug)]
pub struct PressureMonitor {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
    source: String,
    /// The fork generation of the process that started it.
    generation: u64,
}

impl PressureMonitor {
    /// Follow this process's memory pressure ([`Psi::for_process`] on
    /// `/proc` and `/sys/fs/cgroup`, with `config.trigger`) and resize
    /// `target`, starting from its capacity now as the configured one.
    ///
    /// The trigger costs the kernel an RCU grace period when it is closed
    /// (`psi_trigger_destroy`: about 11 ms at exit on this project's
    /// machine), so a short-lived tool may prefer to start the monitor
    /// only once it has run a while (the SQLite VFS waits one second).
    ///
    /// # Errors
    /// Where PSI is unavailable (no `memory.pressure` file, PSI disabled,
    /// the trigger refused), one line `PSI unavailable: <reason>; running
    /// without it` goes to `config.log` and the error is returned; the
    /// caller may ignore it (nothing was started). Also an error when the
    /// thread cannot be started.
    pub fn start<T>(target: Arc<T>, config: PressureConfig) -> io::Result<PressureMonitor>
    where
        T: Resizable + ?Sized + 'static,
    {
        PressureMonitor::start_at(
            target,
            config,
            Path::new("/proc"),
            Path::new("/sys/fs/cgroup"),
        )
    }

    /// [`start`](Self::start) with `/proc` at `proc_root` and the cgroup
    /// hierarchies at `cgroup_root` (a container's odd mount, or a test).
    ///
    /// # Errors
    /// As [`start`](Self::start), with the same log line.
    ///
    /// ```
    /// use kxarray::memory::{LogSink, PressureConfig, PressureMonitor, Resizable};
    /// use std::sync::{Arc, Mutex};
    ///
    /// struct Fixed;
    /// impl Resizable for Fixed {
    ///     type Error = String;
    ///     fn capacity(&self) -> u64 { 1 << 30 }
    ///     fn set_capacity(&self, _: u64) -> Result<(), String> { Err("fixed".into()) }
    /// }
    ///
    /// let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    /// let l = Arc::clone(&lines);
    /// let config = PressureConfig {
    ///     log: LogSink::Callback(Arc::new(move |line: &str| l.lock().unwrap().push(line.into()))),
    ///     ..PressureConfig::default()
    /// };
    /// let empty = tempfile::tempdir().unwrap(); // no PSI there
    /// let e = PressureMonitor::start_at(Arc::new(Fixed), config, empty.path(), empty.path());
    /// assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    /// let lines = lines.lock().unwrap();
    /// assert!(lines[0].starts_with("PSI unavailable: ") && lines[0].ends_with("; running without it"));
    /// ```
    pub fn start_at<T>(
        target: Arc<T>,
        config: PressureConfig,
        proc_root: &Path,
        cgroup_root: &Path,
    ) -> io::Result<PressureMonitor>
    where
        T: Resizable + ?Sized + 'static,
    {
        match Psi::for_process(proc_root, cgroup_root, &config.trigger) {
            Ok(psi) => PressureMonitor::start_with(target, psi, MonotonicClock, config),
            Err(e) => {
                config
                    .log
                    .log(&format!("PSI unavailable: {e}; running without it"));
                Err(e)
            }
        }
    }

    /// Resize `target` following any [`PressureSource`] (a [`Psi`] on
    /// other paths, or a fake) with any [`Clock`]; `config.trigger` is
    /// not used (the source has its own).
    ///
    /// # Errors
    /// The thread could not be started, or the stop signal not made.
    pub fn start_with<T, S, C>(
        target: Arc<T>,
        mut source: S,
        clock: C,
        config: PressureConfig,
    ) -> io::Result<PressureMonitor>
    where
        T: Resizable + ?Sized + 'static,
        S: PressureSource + 'static,
        C: Clock + 'static,
    {
        let stop = Arc::new(StopSignal::new()?);
        let describe = source.describe();
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                run(
                    &*target,
                    &mut source,
                    &clock,
                    config.policy,
                    &config.log,
                    &thread_stop,
                )
            })?;
        Ok(PressureMonitor {
            stop,
            thread: Some(thread),
            source: describe,
            generation: crate::fork::generation(),
        })
    }

    /// What it follows (`"/sys/fs/cgroup/app/memory.pressure (some 300000
    /// 2000000)"`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the thread has ended (its source failed, which it logged).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for PressureMonitor {
    fn drop(&mut self) {
        if crate::fork::inherited(self.generation) {
            // A forked child's copy: the thread is the parent's (it does
            // not exist here) and the stop signal's eventfd is shared with
            // the parent, whose thread a write would stop. Touch nothing.
            std::mem::forget(self.thread.take());
            return;
        }
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The monitor thread's name (as `/proc/self/task/*/comm` shows it: at
/// most 15 bytes).
pub const THREAD_NAME: &str = "kxarray-psi";

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The monitor's loop: wait for a stall or the next deadline, decide,
/// act, until stopped or the source fails.
pub(crate) fn run<T: Resizable + ?Sized>(
    target: &T,
    source: &mut dyn PressureSource,
    clock: &dyn Clock,
    policy: ShrinkPolicy,
    log: &LogSink,
    stop: &StopSignal,
) {
    let mut shrinker = Shrinker::new(policy, target.capacity());
    loop {
        let timeout = shrinker
            .deadline()
            .map(|at| at.saturating_duration_since(clock.now()));
        let event = match source.wait(timeout, stop) {
            Ok(e) => e,
            Err(e) => {
                log.log(&format!(
                    "memory pressure monitor stopped: {}: {e}",
                    source.describe()
                ));
                return;
            }
        };
        let decision = match event {
            Wait::Stop => return,
            Wait::Stall => shrinker.on_stall(target.capacity(), clock.now()),
            Wait::Timeout => shrinker.on_tick(target.capacity(), clock.now()),
        };
        let Some(to) = decision.target() else {
            continue;
        };
        let line = match (decision, target.set_capacity(to)) {
            (_, Err(e)) => format!(
                "memory pressure: setting the cache capacity to {} failed: {e}",
                mib(to)
            ),
            (Decision::Shrink { from, .. }, Ok(())) => format!(
                "memory pressure on {}: cache capacity {} -> {} (floor {})",
                source.describe(),
                mib(from),
                mib(to),
                mib(shrinker.floor())
            ),
            (_, Ok(())) => format!(
                "no memory pressure for {:?}: cache capacity {} -> {} (configured {})",
                policy.grow_after,
                mib(decision_from(decision)),
                mib(to),
                mib(shrinker.configured())
            ),
        };
        log.log(&line);
        shrinker.applied(target.capacity());
    }
}

fn decision_from(d: Decision) -> u64 {
    match d {
        Decision::Shrink { from, .. } | Decision::Grow { from, .. } => from,
        Decision::Keep => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    const M: u64 = 1 << 20;

    /// A clock the fake source moves.
    #[derive(Clone)]
    struct FakeClock(Arc<Mutex<Instant>>);

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
    }

    /// Stalls at the given delays from the previous event, simulating the
    /// passage of time: a wait whose timeout comes first moves the clock
    /// to it and times out. When the script is over, a wait with no
    /// timeout stops (the test is done) and one with a timeout times out.
    struct Scripted {
        clock: FakeClock,
        stalls: VecDeque<Duration>,
        timeouts: Vec<Option<Duration>>,
    }

    impl PressureSource for Scripted {
        fn wait(&mut self, timeout: Option<Duration>, _stop: &StopSignal) -> io::Result<Wait> {
            self.timeouts.push(timeout);
            let mut now = self.clock.0.lock().unwrap();
            match (self.stalls.front_mut(), timeout) {
                (Some(d), Some(t)) if t < *d => {
                    *d -= t;
                    *now += t;
                    Ok(Wait::Timeout)
                }
                (Some(_), _) => {
                    *now += self.stalls.pop_front().unwrap();
                    Ok(Wait::Stall)
                }
                (None, Some(t)) => {
                    *now += t;
                    Ok(Wait::Timeout)
                }
                (None, None) => Ok(Wait::Stop),
            }
        }
        fn describe(&self) -> String {
            "script".into()
        }
    }

    struct Target {
        cap: AtomicU64,
        refuse_below: u64,
    }

    impl Resizable for Target {
        type Error = String;
        fn capacity(&self) -> u64 {
            self.cap.load(Ordering::Relaxed)
        }
        fn set_capacity(&self, bytes: u64) -> Result<(), String> {
            if bytes < self.refuse_below {
                return Err(format!("{bytes} is too small"));
            }
            self.cap.store(bytes, Ordering::Relaxed);
            Ok(())
        }
    }

    fn lines() -> (LogSink, Arc<Mutex<Vec<String>>>) {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::clone(&buf);
        let sink = LogSink::Callback(Arc::new(move |l: &str| b.lock().unwrap().push(l.into())));
        (sink, buf)
    }

    /// Three stalls two seconds apart, then quiet: three shrinks, then
    /// after 10 s three growth steps 2 s apart back to 1 GiB, one log line
    /// each, and one wait per event (no busy loop).
    #[test]
    fn shrink_then_grow_back() {
        let clock = FakeClock(Arc::new(Mutex::new(Instant::now())));
        let t0 = clock.now();
        let secs = Duration::from_secs;
        let mut src = Scripted {
            clock: clock.clone(),
            stalls: [secs(1), secs(2), secs(2)].into(),
            timeouts: Vec::new(),
        };
        let target = Target {
            cap: AtomicU64::new(1024 * M),
            refuse_below: 0,
        };
        let (log, buf) = lines();
        let stop = StopSignal::new().unwrap();
        run(
            &target,
            &mut src,
            &clock,
            ShrinkPolicy::default(),
            &log,
            &stop,
        );
        assert_eq!(target.capacity(), 1024 * M);
        let lines = buf.lock().unwrap().clone();
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(lines[0].ends_with("cache capacity 1024.0 MiB -> 896.0 MiB (floor 128.0 MiB)"));
        assert!(lines[2].contains("784.0 MiB -> 686.0 MiB"));
        assert!(lines[3].contains("686.0 MiB -> 814.0 MiB (configured 1024.0 MiB)"));
        assert!(lines[5].contains("-> 1024.0 MiB"));
        // Last stall at 5 s, growth at 15, 17, 19 s.
        assert_eq!(clock.now() - t0, secs(19));
        assert_eq!(
            src.timeouts,
            [
                None,
                Some(secs(10)),
                Some(secs(10)),
                Some(secs(10)),
                Some(secs(2)),
                Some(secs(2)),
                None
            ]
        );
    }

    /// A refused capacity is logged and retried at the next stall; the
    /// shrinker does not take the unchanged capacity for a user's choice.
    #[test]
    fn refusal_is_logged() {
        let clock = FakeClock(Arc::new(Mutex::new(Instant::now())));
        let mut src = Scripted {
            clock: clock.clone(),
            stalls: [Duration::from_secs(1), Duration::from_secs(2)].into(),
            timeouts: Vec::new(),
        };
        let target = Target {
            cap: AtomicU64::new(1024 * M),
            refuse_below: 2048 * M,
        };
        let (log, buf) = lines();
        run(
            &target,
            &mut src,
            &clock,
            ShrinkPolicy::default(),
            &log,
            &StopSignal::new().unwrap(),
        );
        let lines = buf.lock().unwrap().clone();
        assert_eq!(target.capacity(), 1024 * M);
        assert_eq!(lines.len(), 2);
        for l in lines {
            assert!(
                l.contains(
                    "setting the cache capacity to 896.0 MiB failed: 939524096 is too small"
                ),
                "{l}"
            );
        }
    }

    /// A source error ends the loop with one line.
    #[test]
    fn source_error_ends_the_loop() {
        struct Broken;
        impl PressureSource for Broken {
            fn wait(&mut self, _: Option<Duration>, _: &StopSignal) -> io::Result<Wait> {
                Err(io::Error::other("gone"))
            }
            fn describe(&self) -> String {
                "broken".into()
            }
        }
        let target = Target {
            cap: AtomicU64::new(M),
            refuse_below: 0,
        };
        let (log, buf) = lines();
        run(
            &target,
            &mut Broken,
            &MonotonicClock,
            ShrinkPolicy::default(),
            &log,
            &StopSignal::new().unwrap(),
        );
        assert_eq!(
            *buf.lock().unwrap(),
            ["memory pressure monitor stopped: broken: gone"]
        );
    }
}
