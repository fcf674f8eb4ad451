//! The pressure monitor's decisions, as the kernel's shrinkers make them:
//! give memory back step by step while the system stalls on memory, take
//! it again step by step once the stalls have stopped.
//!
//! Owns [`ShrinkPolicy`] (the steps, the floor, the delays), [`Shrinker`]
//! (a pure state machine: it is told of stalls and of the time, and
//! answers with a [`Decision`]; it does no I/O, reads no clock and starts
//! no thread) and [`Decision`]. Invariants: a decision never goes below
//! the floor nor above the configured capacity; the configured capacity
//! is the target's capacity when the shrinker was made, or the one someone
//! else set since (a capacity the shrinker did not choose); it grows only
//! after `grow_after` without a stall, and then at most one step per
//! `grow_interval`.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// How a [`Shrinker`] shrinks and grows.
///
/// With the defaults, a cache configured at 1 GiB loses an eighth of its
/// current capacity per stall event (1 GiB → 896 MiB → 784 MiB → ...,
/// with the default trigger at most one event per 2 s), never goes below
/// 128 MiB (an eighth of 1 GiB), and once 10 s pass without a stall gets
/// 128 MiB back every 2 s until it is at 1 GiB again.
///
/// ```
/// use kxarray::memory::ShrinkPolicy;
/// use std::time::Duration;
///
/// let p = ShrinkPolicy::default();
/// assert_eq!(p.floor(1 << 30), 128 << 20); // configured / floor_divisor
/// assert_eq!(p.floor(64 << 20), 16 << 20); // min_bytes
/// assert_eq!(p.floor(8 << 20), 8 << 20); // never above the configured capacity
/// assert_eq!(p.grow_after, Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShrinkPolicy {
    /// Each stall event takes `current / shrink_divisor` away (default 8).
    pub shrink_divisor: NonZeroU32,
    /// The floor is at least `configured / floor_divisor` (default 8)...
    pub floor_divisor: NonZeroU32,
    /// ... and at least `min_bytes` (default 16 MiB), but never above the
    /// configured capacity.
    pub min_bytes: u64,
    /// Time without a stall event before the first growth step (default
    /// 10 s).
    pub grow_after: Duration,
    /// Time between growth steps (default 2 s).
    pub grow_interval: Duration,
    /// Each growth step adds `configured / grow_divisor` (default 8).
    pub grow_divisor: NonZeroU32,
}

impl Default for ShrinkPolicy {
    fn default() -> Self {
        let eight = NonZeroU32::new(8).expect("8 is not zero");
        ShrinkPolicy {
            shrink_divisor: eight,
            floor_divisor: eight,
            min_bytes: 16 << 20,
            grow_after: Duration::from_secs(10),
            grow_interval: Duration::from_secs(2),
            grow_divisor: eight,
        }
    }
}

impl ShrinkPolicy {
    /// The lowest capacity it shrinks a `configured` capacity to:
    /// `max(configured / floor_divisor, min(min_bytes, configured))`.
    pub fn floor(&self, configured: u64) -> u64 {
        (configured / self.floor_divisor.get() as u64).max(self.min_bytes.min(configured))
    }
}

/// What to do with the target's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave it.
    Keep,
    /// Lower it from `from` to `to`.
    Shrink {
        /// The capacity seen.
        from: u64,
        /// The capacity to set.
        to: u64,
    },
    /// Raise it from `from` to `to`.
    Grow {
        /// The capacity seen.
        from: u64,
        /// The capacity to set.
        to: u64,
    },
}

impl Decision {
    /// The capacity to set, if any.
    pub fn target(&self) -> Option<u64> {
        match *self {
            Decision::Keep => None,
            Decision::Shrink { to, .. } | Decision::Grow { to, .. } => Some(to),
        }
    }
}

/// The decisions of a pressure monitor, as a state machine: tell it of
/// each stall event ([`on_stall`](Self::on_stall)) and wake it at its
/// [`deadline`](Self::deadline) ([`on_tick`](Self::on_tick)), each time
/// with the target's capacity and the time; set the capacity it decides,
/// then tell it what the target holds ([`applied`](Self::applied)).
///
/// ```
/// use kxarray::memory::{Decision, ShrinkPolicy, Shrinker};
/// use std::time::{Duration, Instant};
///
/// const M: u64 = 1 << 20;
/// let policy = ShrinkPolicy::default();
/// let mut s = Shrinker::new(policy, 1024 * M);
/// let t0 = Instant::now();
/// assert_eq!(s.on_stall(1024 * M, t0), Decision::Shrink { from: 1024 * M, to: 896 * M });
/// s.applied(896 * M); // the target's capacity after setting it
/// let t1 = t0 + Duration::from_secs(2);
/// assert_eq!(s.on_stall(896 * M, t1), Decision::Shrink { from: 896 * M, to: 784 * M });
/// s.applied(784 * M);
/// // No growth before 10 s without a stall...
/// let quiet = t1 + policy.grow_after;
/// assert_eq!(s.deadline(), Some(quiet));
/// assert_eq!(s.on_tick(784 * M, quiet - Duration::from_millis(1)), Decision::Keep);
/// // ... then an eighth of the configured capacity per step.
/// assert_eq!(s.on_tick(784 * M, quiet), Decision::Grow { from: 784 * M, to: 912 * M });
/// s.applied(912 * M);
/// let t2 = quiet + policy.grow_interval;
/// assert_eq!(s.on_tick(912 * M, t2), Decision::Grow { from: 912 * M, to: 1024 * M });
/// s.applied(1024 * M);
/// assert_eq!(s.deadline(), None); // back at the configured capacity: nothing pending
/// ```
#[derive(Clone, Debug)]
pub struct Shrinker {
    policy: ShrinkPolicy,
    configured: u64,
    /// The capacity the target should hold: the last one decided or
    /// applied. Any other capacity seen was set by someone else.
    expected: u64,
    next_grow: Option<Instant>,
}

impl Shrinker {
    /// A shrinker for a target whose capacity is `capacity` (the
    /// configured capacity it grows back to).
    pub fn new(policy: ShrinkPolicy, capacity: u64) -> Shrinker {
        Shrinker {
            policy,
            configured: capacity,
            expected: capacity,
            next_grow: None,
        }
    }

    /// The capacity it grows back to.
    pub fn configured(&self) -> u64 {
        self.configured
    }

    /// The lowest capacity it shrinks to ([`ShrinkPolicy::floor`] of the
    /// configured capacity).
    pub fn floor(&self) -> u64 {
        self.policy.floor(self.configured)
    }

    /// When [`on_tick`](Self::on_tick) may next decide something; `None`
    /// when nothing is pending (only a stall can change anything).
    pub fn deadline(&self) -> Option<Instant> {
        self.next_grow
    }

    /// A capacity it did not choose was set by someone else: it becomes
    /// the configured capacity.
    fn adopt(&mut self, capacity: u64) {
        if capacity != self.expected {
            self.configured = capacity;
            self.expected = capacity;
            self.next_grow = None;
        }
    }

    /// The kernel reported a stall at `now`; the target holds `capacity`.
    /// Shrinks by `capacity / shrink_divisor`, not below the floor, and
    /// puts growth off until `grow_after` from now.
    pub fn on_stall(&mut self, capacity: u64, now: Instant) -> Decision {
        self.adopt(capacity);
        self.next_grow = Some(now + self.policy.grow_after);
        let step = capacity / self.policy.shrink_divisor.get() as u64;
        let to = capacity.saturating_sub(step).max(self.floor());
        if to < capacity {
            self.expected = to;
            Decision::Shrink { from: capacity, to }
        } else {
            Decision::Keep
        }
    }

    /// Time passed without a stall; it is `now` and the target holds
    /// `capacity`. Grows by `configured / grow_divisor` (at most to the
    /// configured capacity) once the [`deadline`](Self::deadline) is
    /// reached.
    pub fn on_tick(&mut self, capacity: u64, now: Instant) -> Decision {
        self.adopt(capacity);
        match self.next_grow {
            Some(at) if now >= at => {}
            _ => return Decision::Keep,
        }
        if capacity >= self.configured {
            self.next_grow = None;
            return Decision::Keep;
        }
        let step = (self.configured / self.policy.grow_divisor.get() as u64).max(1);
        let to = capacity.saturating_add(step).min(self.configured);
        self.expected = to;
        self.next_grow = (to < self.configured).then(|| now + self.policy.grow_interval);
        Decision::Grow { from: capacity, to }
    }

    /// After acting on a decision (whether or not setting the capacity
    /// succeeded), the capacity the target now holds (it may round what
    /// it was given).
    pub fn applied(&mut self, capacity: u64) {
        self.expected = capacity;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Sustained stalls walk down to the floor and stop there.
    #[test]
    fn shrinks_to_the_floor_and_stays() {
        let mut s = Shrinker::new(ShrinkPolicy::default(), 1024 * M);
        let t0 = Instant::now();
        let mut cap = 1024 * M;
        let mut steps = 0;
        for i in 0..100 {
            match s.on_stall(cap, t0 + secs(2 * i)) {
                Decision::Shrink { from, to } => {
                    assert_eq!(from, cap);
                    assert!(to < cap && to >= 128 * M);
                    assert!(cap - to <= cap / 8);
                    cap = to;
                    steps += 1;
                }
                Decision::Keep => assert_eq!(cap, 128 * M),
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(cap, 128 * M);
        // (7/8)^n = 1/8 at n = 15.6: 16 steps, the last one clamped.
        assert_eq!(steps, 16);
        assert_eq!(s.configured(), 1024 * M);
    }

    /// A stall during growth stops it and starts the quiet period again.
    #[test]
    fn stall_during_growth_restarts_the_wait() {
        let p = ShrinkPolicy {
            min_bytes: 0,
            ..ShrinkPolicy::default()
        };
        let mut s = Shrinker::new(p, 800);
        let t0 = Instant::now();
        assert_eq!(s.on_stall(800, t0), Decision::Shrink { from: 800, to: 700 });
        let t1 = t0 + p.grow_after;
        assert_eq!(s.on_tick(700, t1), Decision::Grow { from: 700, to: 800 });
        // Configured is 800 and the step 100: one step back to it.
        assert_eq!(s.deadline(), None);
        assert_eq!(
            s.on_stall(800, t1 + secs(1)),
            Decision::Shrink { from: 800, to: 700 }
        );
        assert_eq!(
            s.on_stall(700, t1 + secs(3)),
            Decision::Shrink { from: 700, to: 613 }
        );
        assert_eq!(
            s.on_tick(613, t1 + secs(3) + p.grow_after - secs(1)),
            Decision::Keep
        );
        assert_eq!(s.deadline(), Some(t1 + secs(3) + p.grow_after));
        assert_eq!(
            s.on_tick(613, t1 + secs(3) + p.grow_after),
            Decision::Grow { from: 613, to: 713 }
        );
        // The next step waits grow_interval.
        let next = s.deadline().unwrap();
        assert_eq!(next, t1 + secs(3) + p.grow_after + p.grow_interval);
        assert_eq!(
            s.on_tick(713, next - Duration::from_millis(1)),
            Decision::Keep
        );
        assert_eq!(s.on_tick(713, next), Decision::Grow { from: 713, to: 800 });
    }

    /// A capacity set by someone else becomes the configured capacity:
    /// the shrinker grows back to it, not to the old one.
    #[test]
    fn user_change_is_adopted() {
        let p = ShrinkPolicy::default();
        let mut s = Shrinker::new(p, 1024 * M);
        let t0 = Instant::now();
        assert!(matches!(s.on_stall(1024 * M, t0), Decision::Shrink { .. }));
        s.applied(896 * M);
        // The user sets 512 MiB meanwhile.
        assert_eq!(s.on_tick(512 * M, t0 + p.grow_after), Decision::Keep);
        assert_eq!((s.configured(), s.deadline()), (512 * M, None));
        assert_eq!(s.floor(), 64 * M);
        assert_eq!(
            s.on_stall(512 * M, t0 + secs(20)),
            Decision::Shrink {
                from: 512 * M,
                to: 448 * M
            }
        );
    }

    /// A target that rounds what it is given, or refuses it: what it holds
    /// afterwards is not mistaken for someone else's choice.
    #[test]
    fn rounding_and_refusal_are_not_user_changes() {
        let p = ShrinkPolicy {
            min_bytes: 0,
            ..ShrinkPolicy::default()
        };
        let mut s = Shrinker::new(p, 1000 * 4096);
        let t0 = Instant::now();
        let Decision::Shrink { to, .. } = s.on_stall(1000 * 4096, t0) else {
            panic!()
        };
        assert_eq!(to, 875 * 4096);
        s.applied(to - 100); // rounded down
        assert_eq!(s.configured(), 1000 * 4096);
        // Refused: the target still holds the old capacity.
        let d = s.on_stall(to - 100, t0 + secs(2));
        assert!(matches!(d, Decision::Shrink { .. }));
        s.applied(to - 100);
        assert_eq!(s.configured(), 1000 * 4096);
        assert_eq!(
            s.on_tick(to - 100, t0 + secs(2) + p.grow_after),
            Decision::Grow {
                from: to - 100,
                to: to - 100 + 125 * 4096
            }
        );
    }

    /// Degenerate settings stay in range: divisor 1 shrinks to the floor
    /// at once, a floor divisor of 1 never shrinks, zero capacity is kept.
    #[test]
    fn degenerate_policies() {
        let one = NonZeroU32::new(1).unwrap();
        let t0 = Instant::now();
        let p = ShrinkPolicy {
            shrink_divisor: one,
            grow_divisor: one,
            ..ShrinkPolicy::default()
        };
        let mut s = Shrinker::new(p, 1024 * M);
        assert_eq!(
            s.on_stall(1024 * M, t0),
            Decision::Shrink {
                from: 1024 * M,
                to: 128 * M
            }
        );
        assert_eq!(
            s.on_tick(128 * M, t0 + p.grow_after),
            Decision::Grow {
                from: 128 * M,
                to: 1024 * M
            }
        );
        let p = ShrinkPolicy {
            floor_divisor: one,
            ..ShrinkPolicy::default()
        };
        assert_eq!(
            Shrinker::new(p, 1024 * M).on_stall(1024 * M, t0),
            Decision::Keep
        );
        let mut s = Shrinker::new(ShrinkPolicy::default(), 0);
        assert_eq!(s.on_stall(0, t0), Decision::Keep);
        assert_eq!(s.on_tick(0, t0 + secs(60)), Decision::Keep);
        let mut s = Shrinker::new(ShrinkPolicy::default(), u64::MAX);
        assert!(matches!(s.on_stall(u64::MAX, t0), Decision::Shrink { .. }));
    }
}
