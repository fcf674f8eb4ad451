//! The budget's decisions, as pure functions: how a total is divided among
//! the members ([`shares`]), and what one member's capacity should be now
//! given its share and its scope's usage ([`decide`]).
//!
//! Owns the division (max-min fair: a member that asks for less than an
//! equal part gets what it asks for and leaves the rest to the others) and
//! the growth and shrink rule. Invariants: the shares never sum above the
//! total and no share is above its member's demand; a decision never goes
//! above the member's share, never below the floor unless the share is,
//! grows only into headroom left after every member's unfilled capacity,
//! and shrinks whenever usage is past the shrink mark, by the member's part
//! of the excess. No I/O, no clock: the tests drive them with numbers.

/// Why a member's capacity is what it is (the last change's cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Reason {
    /// The capacity it joined with, before its first decision.
    #[default]
    Start,
    /// Grown into headroom toward its share.
    Grow,
    /// Lowered to its share: another member joined or asks for more.
    Rebalance,
    /// Its share grew because a dead member's slot was reclaimed.
    Reclaimed,
    /// Lowered because the scope's usage passed the shrink mark.
    NearLimit,
    /// No registry: sized alone with the fallback fraction.
    Fallback,
}

impl Reason {
    /// One lowercase word (`kx_stats`' `budget_reason=`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Grow => "grow",
            Reason::Rebalance => "rebalance",
            Reason::Reclaimed => "reclaimed",
            Reason::NearLimit => "near_limit",
            Reason::Fallback => "fallback",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `total` divided among members asking for `demands`, max-min fair: each
/// gets the least of its demand and an equal part of what the members
/// asking for less left over. The result is in the order of `demands`.
///
/// ```
/// use kxarray::memory::budget_shares;
///
/// assert_eq!(budget_shares(300, &[1000, 1000, 1000]), [100, 100, 100]);
/// // One wants little: the others share the rest.
/// assert_eq!(budget_shares(300, &[20, 1000, 1000]), [20, 140, 140]);
/// assert_eq!(budget_shares(300, &[20, 30]), [20, 30]);
/// ```
pub fn shares(total: u64, demands: &[u64]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| demands[i]);
    let mut out = vec![0; demands.len()];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (demands.len() - k) as u64;
        let give = demands[i].min(fair);
        out[i] = give;
        left -= give;
    }
    out
}

/// What a member sees when it decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The scope's limit in bytes.
    pub limit: u64,
    /// The scope's unreclaimable usage now.
    pub used: u64,
    /// This member's share.
    pub share: u64,
    /// This member's capacity now.
    pub capacity: u64,
    /// The sum of every member's capacity (this one's included).
    pub capacities: u64,
    /// The sum over every member of capacity not yet filled
    /// (`capacity - used`): memory already promised, not yet charged.
    pub unfilled: u64,
    /// Live members (at least 1).
    pub members: u64,
}

/// The thresholds of [`decide`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Marks {
    /// Grow only while usage (plus every member's unfilled capacity) stays
    /// under this fraction of the limit.
    pub grow_below: f64,
    /// Shrink once usage passes this fraction of the limit.
    pub shrink_above: f64,
    /// No capacity below this (unless the share is lower).
    pub min_bytes: u64,
}

/// The capacity this member should have now, and why; `None` to keep it.
///
/// - Past the shrink mark (`used > limit * shrink_above`), every member
///   gives back its part of the excess, in proportion to its capacity: the
///   closer usage is to the limit, the more.
/// - Above its share (another member joined), it comes down to its share.
/// - Below its share, it grows by an equal part of the headroom left
///   under the grow mark after every member's unfilled capacity, at once
///   if that headroom is ample.
///
/// ```
/// use kxarray::memory::{budget_decide, BudgetReason, View, Marks};
///
/// let marks = Marks { grow_below: 0.75, shrink_above: 0.85, min_bytes: 8 };
/// let v = View { limit: 1000, used: 100, share: 300, capacity: 10, capacities: 10, unfilled: 0, members: 1 };
/// assert_eq!(budget_decide(&marks, &v), Some((300, BudgetReason::Grow))); // ample room: at once
/// let v = View { used: 950, capacity: 300, capacities: 600, ..v };
/// // 100 over the mark of 850; this member holds half the capacities: gives back 50.
/// assert_eq!(budget_decide(&marks, &v), Some((250, BudgetReason::NearLimit)));
/// ```
pub fn decide(marks: &Marks, v: &View) -> Option<(u64, Reason)> {
    let floor = marks.min_bytes.min(v.share);
    let shrink_mark = (v.limit as f64 * marks.shrink_above) as u64;
    if v.used > shrink_mark && v.capacity > floor {
        let excess = (v.used - shrink_mark) as u128;
        let part = excess * v.capacity as u128 / (v.capacities.max(v.capacity).max(1)) as u128;
        let to = v
            .capacity
            .saturating_sub(part.max(1) as u64)
            .min(v.share)
            .max(floor);
        return (to < v.capacity).then_some((to, Reason::NearLimit));
    }
    if v.capacity > v.share {
        return Some((v.share.max(floor), Reason::Rebalance)).filter(|&(to, _)| to < v.capacity);
    }
    if v.capacity < v.share {
        let grow_mark = (v.limit as f64 * marks.grow_below) as u64;
        let room = grow_mark.saturating_sub(v.used).saturating_sub(v.unfilled);
        let step = room / v.members.max(1);
        let to = v.capacity.saturating_add(step).min(v.share).max(floor);
        return (to > v.capacity).then_some((to, Reason::Grow));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn shares_are_fair_and_bounded() {
        let five = shares(256 * M, &[256 * M; 5]);
        assert_eq!(five.iter().sum::<u64>(), 256 * M);
        assert!(five
            .iter()
            .all(|&s| s == 256 * M / 5 || s == 256 * M / 5 + 1));
        assert_eq!(shares(0, &[5, 6]), [0, 0]);
        assert_eq!(shares(10, &[]), Vec::<u64>::new());
        assert_eq!(shares(u64::MAX, &[u64::MAX, 3]), [u64::MAX - 3, 3]);
        for (total, d) in [
            (100, vec![1, 50, 70, 2]),
            (7, vec![3, 3, 3]),
            (1000, vec![0, 0, 900]),
        ] {
            let s = shares(total, &d);
            assert!(s.iter().sum::<u64>() <= total);
            assert!(s.iter().zip(&d).all(|(s, d)| s <= d));
        }
    }

    fn marks() -> Marks {
        Marks {
            grow_below: 0.75,
            shrink_above: 0.85,
            min_bytes: 8 * M,
        }
    }

    /// Five members in a 512 MiB scope, each wanting 256 MiB of a 256 MiB
    /// total: the first alone takes the whole total, then comes down to a
    /// fifth once the others join; a newcomer grows only into headroom that
    /// unfilled capacity has not already promised.
    #[test]
    fn five_members_rebalance() {
        let limit = 512 * M;
        let alone = View {
            limit,
            used: 20 * M,
            share: 256 * M,
            capacity: 8 * M,
            capacities: 8 * M,
            unfilled: 8 * M,
            members: 1,
        };
        assert_eq!(decide(&marks(), &alone), Some((256 * M, Reason::Grow)));
        let share = shares(256 * M, &[256 * M; 5])[0];
        let crowded = View {
            share,
            capacity: 256 * M,
            capacities: 256 * M + 32 * M,
            unfilled: 200 * M,
            members: 5,
            ..alone
        };
        assert_eq!(decide(&marks(), &crowded), Some((share, Reason::Rebalance)));
        // A newcomer while the first still has 200 MiB unfilled: 384 - 20 - 200 = 164 MiB of room, a fifth each.
        let newcomer = View {
            share,
            capacity: 8 * M,
            ..crowded
        };
        let (to, why) = decide(&marks(), &newcomer).unwrap();
        assert_eq!((to, why), (8 * M + 164 * M / 5, Reason::Grow));
        // No room at all: it keeps its capacity.
        let full = View {
            used: 380 * M,
            ..newcomer
        };
        assert_eq!(decide(&marks(), &full), None);
    }

    /// Past the shrink mark each gives back its part of the excess, more
    /// the closer usage is to the limit, never below the floor.
    #[test]
    fn shrink_in_proportion() {
        let base = View {
            limit: 1000 * M,
            share: 400 * M,
            capacity: 200 * M,
            capacities: 800 * M,
            unfilled: 0,
            members: 4,
            used: 0,
        };
        let give = |used| 200 * M - decide(&marks(), &View { used, ..base }).unwrap().0;
        assert_eq!(give(900 * M), 50 * M / 4);
        assert_eq!(give(990 * M), 140 * M / 4);
        assert!(give(990 * M) > give(900 * M));
        let tiny = View {
            capacity: 9 * M,
            used: 2000 * M,
            ..base
        };
        assert_eq!(decide(&marks(), &tiny), Some((8 * M, Reason::NearLimit)));
        assert_eq!(
            decide(
                &marks(),
                &View {
                    capacity: 8 * M,
                    ..tiny
                }
            ),
            None
        );
        // between the marks, at its share: nothing to do
        assert_eq!(
            decide(
                &marks(),
                &View {
                    used: 800 * M,
                    capacity: 400 * M,
                    ..base
                }
            ),
            None
        );
    }

    /// Degenerate inputs give a decision in range, never a panic.
    #[test]
    fn extremes() {
        for v in [
            View::default(),
            View {
                limit: u64::MAX,
                used: u64::MAX,
                share: u64::MAX,
                capacity: u64::MAX,
                capacities: 0,
                unfilled: u64::MAX,
                members: 0,
            },
            View {
                limit: 0,
                used: 0,
                share: 5,
                capacity: 0,
                capacities: 0,
                unfilled: 0,
                members: 0,
            },
        ] {
            if let Some((to, _)) = decide(&marks(), &v) {
                assert!(to <= v.share.max(v.capacity));
            }
        }
    }
}
