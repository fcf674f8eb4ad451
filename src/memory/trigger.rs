//! A PSI trigger: what stall, how long, in what window — the line written
//! to a `memory.pressure` file to be woken by the kernel.
//!
//! Owns [`Trigger`] and its validation against the kernel's rules
//! (`kernel/sched/psi.c`: a window of 500 ms to 10 s, a threshold of at
//! least 1 us and at most the window). Invariant: a `Trigger` value always
//! satisfies them, so the kernel refuses one only for a reason of its
//! own (privileges, PSI disabled).

use std::fmt;
use std::time::Duration;

/// Which stall a trigger counts (the two lines of a pressure file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stall {
    /// Time during which at least one task stalled on memory ("some").
    Some,
    /// Time during which every non-idle task stalled at once ("full").
    Full,
}

/// A PSI trigger: wake when `stall` time reaches `threshold` within a
/// moving `window`. The kernel reports at most one event per window.
///
/// The default is `some 300000 2000000` (300 ms of stall in 2 s): the
/// kernel accepts it from an unprivileged process too, which needs a
/// window that is a multiple of 2 s (Linux 6.5 and later; a 1 s window
/// needs `CAP_SYS_RESOURCE`; when the kernel refuses a window that is not
/// a multiple of 2 s, the monitor retries it rounded up, with the
/// threshold scaled alike).
///
/// ```
/// use kxarray::memory::{Stall, Trigger, TriggerError};
/// use std::time::Duration;
///
/// assert_eq!(Trigger::default().to_string(), "some 300000 2000000");
/// let t = Trigger::new(Stall::Full, Duration::from_millis(100), Duration::from_secs(4)).unwrap();
/// assert_eq!(t.to_string(), "full 100000 4000000");
/// let e = Trigger::new(Stall::Some, Duration::from_secs(3), Duration::from_secs(2));
/// assert_eq!(e, Err(TriggerError::Threshold(Duration::from_secs(3))));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Trigger {
    stall: Stall,
    threshold: Duration,
    window: Duration,
}

/// A trigger the kernel would refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TriggerError {
    /// The window is not within [`Trigger::MIN_WINDOW`] and
    /// [`Trigger::MAX_WINDOW`].
    Window(Duration),
    /// The threshold is under a microsecond or longer than the window.
    Threshold(Duration),
}

impl fmt::Display for TriggerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TriggerError::Window(w) => write!(f, "a PSI window must be 500 ms to 10 s, not {w:?}"),
            TriggerError::Threshold(t) => write!(
                f,
                "a PSI threshold must be at least 1 us and at most the window, not {t:?}"
            ),
        }
    }
}

impl std::error::Error for TriggerError {}

impl From<TriggerError> for std::io::Error {
    /// [`std::io::ErrorKind::InvalidInput`].
    fn from(e: TriggerError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// The window an unprivileged trigger's must be a multiple of.
const UNPRIVILEGED_STEP: Duration = Duration::from_secs(2);

impl Trigger {
    /// The shortest window the kernel accepts.
    pub const MIN_WINDOW: Duration = Duration::from_millis(500);
    /// The longest window the kernel accepts.
    pub const MAX_WINDOW: Duration = Duration::from_secs(10);

    /// A trigger on `stall` time of `threshold` within `window`
    /// (microsecond precision, as the kernel's).
    ///
    /// # Errors
    /// [`TriggerError::Window`] for a window outside 500 ms..=10 s,
    /// [`TriggerError::Threshold`] for a threshold under 1 us or over the
    /// window.
    pub fn new(
        stall: Stall,
        threshold: Duration,
        window: Duration,
    ) -> Result<Trigger, TriggerError> {
        if !(Self::MIN_WINDOW..=Self::MAX_WINDOW).contains(&window) {
            return Err(TriggerError::Window(window));
        }
        if threshold < Duration::from_micros(1) || threshold > window {
            return Err(TriggerError::Threshold(threshold));
        }
        Ok(Trigger {
            stall,
            threshold,
            window,
        })
    }

    /// The stall counted.
    pub fn stall(&self) -> Stall {
        self.stall
    }

    /// The stall time that fires the trigger.
    pub fn threshold(&self) -> Duration {
        self.threshold
    }

    /// The window the stall time is measured over.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The same trigger with its window rounded up to a multiple of 2 s
    /// (what the kernel accepts without `CAP_SYS_RESOURCE`) and its
    /// threshold scaled alike; `None` if the window already is one.
    pub(crate) fn unprivileged(&self) -> Option<Trigger> {
        let step = UNPRIVILEGED_STEP.as_micros();
        let w = self.window.as_micros();
        if w.is_multiple_of(step) {
            return None;
        }
        let window = w.div_ceil(step) * step;
        let threshold = self.threshold.as_micros() * window / w;
        Trigger::new(
            self.stall,
            Duration::from_micros(threshold as u64),
            Duration::from_micros(window as u64),
        )
        .ok()
    }
}

impl Default for Trigger {
    /// `some 300000 2000000`.
    fn default() -> Self {
        Trigger {
            stall: Stall::Some,
            threshold: Duration::from_millis(300),
            window: Duration::from_secs(2),
        }
    }
}

impl fmt::Display for Trigger {
    /// The line the kernel reads: `some 300000 2000000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stall = match self.stall {
            Stall::Some => "some",
            Stall::Full => "full",
        };
        write!(
            f,
            "{stall} {} {}",
            self.threshold.as_micros(),
            self.window.as_micros()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_rules() {
        let ms = Duration::from_millis;
        assert!(Trigger::new(Stall::Some, ms(1), ms(500)).is_ok());
        assert!(Trigger::new(Stall::Some, ms(10_000), ms(10_000)).is_ok());
        assert_eq!(
            Trigger::new(Stall::Some, ms(1), ms(499)),
            Err(TriggerError::Window(ms(499)))
        );
        assert!(Trigger::new(Stall::Some, ms(1), ms(10_001)).is_err());
        assert!(Trigger::new(Stall::Some, Duration::from_nanos(999), ms(1000)).is_err());
    }

    #[test]
    fn unprivileged_rounding() {
        let ms = Duration::from_millis;
        let t = Trigger::new(Stall::Some, ms(150), ms(1000)).unwrap();
        assert_eq!(t.unprivileged().unwrap().to_string(), "some 300000 2000000");
        let t = Trigger::new(Stall::Full, ms(500), ms(2500)).unwrap();
        assert_eq!(t.unprivileged().unwrap().to_string(), "full 800000 4000000");
        assert_eq!(Trigger::default().unprivileged(), None);
        let t = Trigger::new(Stall::Some, ms(9000), ms(9000)).unwrap();
        assert_eq!(
            t.unprivileged().unwrap().to_string(),
            "some 10000000 10000000"
        );
    }
}
