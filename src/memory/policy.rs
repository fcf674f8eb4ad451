//! How big a cache the machine's limits allow: [`CapacityPolicy`] turns
//! [`MemoryLimits`] into a capacity in bytes.
//!
//! Owns the sizing formula. Invariants: the capacity is a whole number of
//! 4 KiB pages, at least one page, never above `max_bytes`, and never
//! above half the budget unless `fraction` or `max_bytes` says so
//! (the floor `min_bytes` is capped at half the budget, so a small
//! container is not handed a cache its limit cannot hold).

use super::error::LimitsError;
use super::limits::{Bound, MemoryLimits};
use std::fmt;

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

/// How much of the memory this process may use goes to the cache.
///
/// The formula, with `budget` the smallest of physical memory and the
/// cgroup's `memory.max` and `memory.high` ([`MemoryLimits::budget`];
/// `unknown_budget`, 4 GiB by default, when none is known):
///
/// ```text
/// capacity = min(max_bytes, max(min(min_bytes, budget / 2), (budget - headroom) * fraction))
/// ```
///
/// rounded down to whole 4 KiB pages. The headroom is what the rest of the
/// process needs besides the cache (its heap, the cache's own metadata,
/// other caches); the fraction leaves the rest of the budget to other
/// programs (page cache of the kernel included). With the defaults
/// (fraction 1/4, headroom 64 MiB, min 64 MiB, no max):
///
/// | where | budget | capacity |
/// |---|---|---|
/// | 24 GiB machine, no cgroup limit | 24 GiB (physical) | (24576 − 64) / 4 = 6128 MiB |
/// | container with `memory.max` = 2 GiB | 2 GiB | (2048 − 64) / 4 = 496 MiB |
/// | `memory.high` = 1 GiB below a parent's `memory.max` = 2 GiB | 1 GiB | (1024 − 64) / 4 = 240 MiB |
/// | `memory.max` = 256 MiB | 256 MiB | 48 MiB, raised to the floor: 64 MiB |
/// | `memory.max` = 64 MiB | 64 MiB | 0, raised to the floor min(64, 64 / 2): 32 MiB |
///
/// ```
/// use kxarray::memory::{Bound, CapacityPolicy, CgroupLimit, MemoryLimits};
///
/// let machine = MemoryLimits { physical: Some(24 << 30), ..MemoryLimits::default() };
/// let policy = CapacityPolicy::default();
/// assert_eq!(policy.capacity(&machine).bytes, 6128 << 20);
///
/// let container = MemoryLimits {
///     max: Some(CgroupLimit { bytes: 2 << 30, file: "/sys/fs/cgroup/memory.max".into() }),
///     ..machine.clone()
/// };
/// let c = policy.capacity(&container);
/// assert_eq!((c.bytes, c.budget, c.bound), (496 << 20, 2 << 30, Bound::CgroupMax));
///
/// // Half of what the process may use, keeping 512 MiB for the rest, at most 4 GiB:
/// let policy = CapacityPolicy::new(0.5, 512 << 20).unwrap().max_bytes(4 << 30);
/// assert_eq!(policy.capacity(&container).bytes, 768 << 20);
/// assert_eq!(policy.capacity(&machine).bytes, 4 << 30);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CapacityPolicy {
    fraction: f64,
    headroom: u64,
    min_bytes: u64,
    max_bytes: u64,
    unknown_budget: u64,
}

impl Default for CapacityPolicy {
    /// A quarter of the budget less 64 MiB of headroom, at least 64 MiB
    /// (at most half the budget), no maximum, a 4 GiB budget when nothing
    /// is known.
    fn default() -> Self {
        CapacityPolicy {
            fraction: 0.25,
            headroom: 64 * MIB,
            min_bytes: 64 * MIB,
            max_bytes: u64::MAX,
            unknown_budget: 4 << 30,
        }
    }
}

/// A [`CapacityPolicy`] setting out of range.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The fraction is not a number in `(0, 1]`.
    Fraction(f64),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Fraction(x) => {
                write!(
                    f,
                    "the cache's fraction of memory must be in (0, 1], not {x}"
                )
            }
        }
    }
}

impl std::error::Error for PolicyError {}

impl From<PolicyError> for std::io::Error {
    /// [`std::io::ErrorKind::InvalidInput`].
    fn from(e: PolicyError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// A capacity chosen by a [`CapacityPolicy`], with what it was derived
/// from (for a log line or a user's question "why this size?").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// The capacity in bytes (whole 4 KiB pages).
    pub bytes: u64,
    /// The memory the process may use, from which it was derived.
    pub budget: u64,
    /// Which limit set the budget.
    pub bound: Bound,
}

impl fmt::Display for Capacity {
    /// `"496 MiB (budget 2048 MiB: cgroup memory.max)"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bound = match self.bound {
            Bound::Physical => "physical memory",
            Bound::CgroupMax => "cgroup memory.max",
            Bound::CgroupHigh => "cgroup memory.high",
            Bound::Unknown => "unknown, assumed",
        };
        write!(
            f,
            "{} MiB (budget {} MiB: {bound})",
            self.bytes / MIB,
            self.budget / MIB
        )
    }
}

impl CapacityPolicy {
    /// `fraction` of the budget less `headroom` bytes, with the default
    /// floor (64 MiB, at most half the budget) and no maximum.
    ///
    /// # Errors
    /// [`PolicyError::Fraction`] unless `0 < fraction <= 1`.
    ///
    /// ```
    /// use kxarray::memory::{CapacityPolicy, PolicyError};
    ///
    /// assert!(CapacityPolicy::new(0.5, 0).is_ok());
    /// assert_eq!(CapacityPolicy::new(1.5, 0), Err(PolicyError::Fraction(1.5)));
    /// assert!(CapacityPolicy::new(f64::NAN, 0).is_err());
    /// ```
    pub fn new(fraction: f64, headroom: u64) -> Result<CapacityPolicy, PolicyError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(PolicyError::Fraction(fraction));
        }
        Ok(CapacityPolicy {
            fraction,
            headroom,
            ..CapacityPolicy::default()
        })
    }

    /// Set the floor: the capacity is at least `bytes`, or half the
    /// budget if that is less.
    pub fn min_bytes(mut self, bytes: u64) -> Self {
        self.min_bytes = bytes;
        self
    }

    /// Set the ceiling: the capacity is at most `bytes` (this wins over
    /// the floor).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Set the budget assumed when no limit and no physical memory size
    /// is known (default 4 GiB).
    pub fn unknown_budget(mut self, bytes: u64) -> Self {
        self.unknown_budget = bytes;
        self
    }

    /// The fraction of the budget (less the headroom) the cache takes.
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// The bytes of the budget kept for the rest of the process.
    pub fn headroom(&self) -> u64 {
        self.headroom
    }

    /// The capacity for `limits` (the formula is in the type's docs).
    pub fn capacity(&self, limits: &MemoryLimits) -> Capacity {
        let (budget, bound) = limits
            .budget()
            .unwrap_or((self.unknown_budget, Bound::Unknown));
        let share = (budget.saturating_sub(self.headroom) as f64 * self.fraction) as u64;
        let floor = self.min_bytes.min(budget / 2);
        let bytes = share.max(floor).min(self.max_bytes);
        Capacity {
            bytes: (bytes / PAGE * PAGE).max(PAGE),
            budget,
            bound,
        }
    }

    /// The capacity for this process on this machine:
    /// [`capacity`](Self::capacity) of [`MemoryLimits::from_system`].
    ///
    /// # Errors
    /// As [`MemoryLimits::read`]: a limit file that cannot be read or does
    /// not parse.
    ///
    /// ```
    /// use kxarray::memory::CapacityPolicy;
    ///
    /// let c = CapacityPolicy::default().capacity_from_system().unwrap();
    /// assert!(c.bytes >= 4096 && c.bytes <= c.budget);
    /// println!("cache capacity {c}");
    /// ```
    pub fn capacity_from_system(&self) -> Result<Capacity, LimitsError> {
        Ok(self.capacity(&MemoryLimits::from_system()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::CgroupLimit;

    fn limits(physical: u64, max: Option<u64>, high: Option<u64>) -> MemoryLimits {
        let l = |b| CgroupLimit {
            bytes: b,
            file: "f".into(),
        };
        MemoryLimits {
            physical: Some(physical),
            max: max.map(l),
            high: high.map(l),
            cgroup: None,
        }
    }

    /// The rows of the table in `CapacityPolicy`'s docs.
    #[test]
    fn documented_rows() {
        let p = CapacityPolicy::default();
        let g = 1u64 << 30;
        let cap = |l: &MemoryLimits| p.capacity(l).bytes / MIB;
        assert_eq!(cap(&limits(24 * g, None, None)), 6128);
        assert_eq!(cap(&limits(24 * g, Some(2 * g), None)), 496);
        assert_eq!(cap(&limits(24 * g, Some(2 * g), Some(g))), 240);
        assert_eq!(
            p.capacity(&limits(24 * g, Some(2 * g), Some(g))).bound,
            Bound::CgroupHigh
        );
        assert_eq!(cap(&limits(24 * g, Some(256 * MIB), None)), 64);
        assert_eq!(cap(&limits(24 * g, Some(64 * MIB), None)), 32);
    }

    /// The SQLite VFS's formula today (a quarter of physical memory, at
    /// least 256 MiB but at most half, at most 64 GiB) is this policy with
    /// no headroom.
    #[test]
    fn reproduces_sqlite_default() {
        let p = CapacityPolicy::new(0.25, 0)
            .unwrap()
            .min_bytes(256 * MIB)
            .max_bytes(64 << 30);
        for ram in [300 * MIB, 1 << 30, 3 << 30, 24 << 30, 1 << 40] {
            let old = (ram / 4).max((256 * MIB).min(ram / 2)).min(64 << 30);
            assert_eq!(
                p.capacity(&limits(ram, None, None)).bytes,
                old / PAGE * PAGE
            );
        }
    }

    #[test]
    fn extremes_stay_in_range() {
        let p = CapacityPolicy::new(1.0, u64::MAX).unwrap();
        for (phys, max) in [
            (0, None),
            (1, Some(0)),
            (u64::MAX, None),
            (u64::MAX, Some(u64::MAX)),
        ] {
            let c = p.capacity(&limits(phys, max, None));
            assert!(c.bytes >= PAGE && c.bytes.is_multiple_of(PAGE));
        }
        let c = CapacityPolicy::new(1.0, 0)
            .unwrap()
            .capacity(&limits(u64::MAX, None, None));
        assert_eq!(c.bytes, u64::MAX / PAGE * PAGE);
        let unknown = CapacityPolicy::default().capacity(&MemoryLimits::default());
        assert_eq!((unknown.bound, unknown.bytes), (Bound::Unknown, 1008 * MIB));
    }
}
