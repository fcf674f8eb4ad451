//! What drives a pressure monitor: a source of stall events
//! ([`PressureSource`]: the kernel's PSI, or a fake a test drives) and a
//! clock ([`Clock`]: the monotonic one, or a fake).
//!
//! Owns the two traits and [`Wait`]. Invariant: a source's `wait` blocks
//! (it never returns [`Wait::Timeout`] before the timeout without
//! reason), and returns [`Wait::Stop`] promptly once the stop signal is
//! set: the monitor's thread neither spins nor outlives its handle.

use super::poll::StopSignal;
use std::io;
use std::time::{Duration, Instant};

/// What ended a [`PressureSource::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// The kernel reported a stall (the trigger fired).
    Stall,
    /// The timeout passed (or a signal interrupted the wait).
    Timeout,
    /// The stop signal is set: the monitor ends.
    Stop,
}

/// A source of memory stall events: [`Psi`](super::Psi) on a real system,
/// or a fake that a test drives.
///
/// ```
/// use kxarray::memory::{PressureSource, StopSignal, Wait};
/// use std::io;
/// use std::time::Duration;
///
/// /// Replays a script of events, then waits for the stop signal.
/// struct Script(Vec<Wait>);
///
/// impl PressureSource for Script {
///     fn wait(&mut self, timeout: Option<Duration>, stop: &StopSignal) -> io::Result<Wait> {
///         if stop.is_set() {
///             return Ok(Wait::Stop);
///         }
///         match self.0.pop() {
///             Some(w) => Ok(w),
///             None => Ok(if stop.wait(timeout)? { Wait::Stop } else { Wait::Timeout }),
///         }
///     }
///     fn describe(&self) -> String {
///         "a script".into()
///     }
/// }
///
/// let stop = StopSignal::new().unwrap();
/// let mut s = Script(vec![Wait::Stall]);
/// assert_eq!(s.wait(None, &stop).unwrap(), Wait::Stall);
/// assert_eq!(s.wait(Some(Duration::from_millis(1)), &stop).unwrap(), Wait::Timeout);
/// stop.set();
/// assert_eq!(s.wait(None, &stop).unwrap(), Wait::Stop);
/// ```
pub trait PressureSource: Send {
    /// Block until the kernel reports a stall, `timeout` passes (`None`:
    /// no timeout) or `stop` is set.
    ///
    /// # Errors
    /// A failure of the source (the pressure file reports an error: its
    /// cgroup was removed); the monitor logs it and ends.
    fn wait(&mut self, timeout: Option<Duration>, stop: &StopSignal) -> io::Result<Wait>;

    /// What it watches, for log lines (`"/proc/pressure/memory (some
    /// 300000 2000000)"`).
    fn describe(&self) -> String;
}

/// A clock for a pressure monitor's decisions.
pub trait Clock: Send {
    /// The current time.
    fn now(&self) -> Instant;
}

/// The monotonic clock ([`Instant::now`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}
