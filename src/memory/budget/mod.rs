//! One memory budget for the caches of every process in a cgroup (or on
//! the machine): a registry in shared memory, a fair division among the
//! live members, growth only while the cgroup has room, and shrinking
//! before its limit.
//!
//! Owns [`SharedBudget`] (a member: its thread and its stats),
//! [`BudgetConfig`] and [`BudgetStats`]; the scope and its usage are in
//! `scope`, the shared table in `registry` (with this module's only
//! unsafe code, the `fcntl` lock), the pure decisions in `divide`.
//! Invariants: every decision is made under the registry's lock with the
//! member's new capacity written to its slot before the lock is let go, so
//! two members never grow into the same headroom; a member's capacity
//! never goes above its share; a dead member's slot is freed by the next
//! member that takes the lock (pid and start time checked), without the
//! dead process's help; a member that cannot reach the registry sizes its
//! cache alone with `fallback_fraction` of what it wants and says so once
//! through the `log` crate; dropping a [`SharedBudget`] stops its thread
//! and frees its slot, and leaves the capacity where it was.
//!
//! ```
//! use kxarray::memory::{BudgetConfig, SharedBudget};
//! use kxarray::pagecache::{CacheConfig, PageCache};
//!
//! let cache = PageCache::new(CacheConfig::default().capacity(64 << 20).flusher(false));
//! let dir = tempfile::tempdir().unwrap(); // the registry's directory (default /dev/shm)
//! let config = BudgetConfig { registry_dir: dir.path().into(), ..BudgetConfig::new(256 << 20) };
//! let budget = cache.join_budget(config).unwrap();
//! let s = budget.stats();
//! assert!(s.share <= 256 << 20 && cache.capacity() <= s.share.max(s.capacity));
//! println!("{s}");
//! ```

mod divide;
mod registry;
mod scope;

pub use divide::{
    decide as budget_decide, shares as budget_shares, Marks, Reason as BudgetReason, View,
};
pub use registry::{
    alive, path_for, start_time, Registry, RegistryError, Slot, Table, FILE_BYTES, KEY_BYTES,
    SLOTS, SLOT_WORDS,
};
pub use scope::{Scope, ScopeKind, Usage};

use super::monitor::Resizable;
use super::poll::StopSignal;
use divide::{decide, shares, Reason};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// How a cache takes part in a shared budget.
///
/// ```
/// use kxarray::memory::BudgetConfig;
///
/// let c = BudgetConfig::new(256 << 20);
/// assert_eq!((c.want, c.fraction), (256 << 20, 0.5));
/// assert_eq!(c.registry_dir, std::path::Path::new("/dev/shm"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetConfig {
    /// The most this cache takes: its size without a budget (a
    /// [`CapacityPolicy`](super::CapacityPolicy)'s, or the user's).
    pub want: u64,
    /// The fraction of the scope's limit that all the members' caches
    /// together may hold (default 1/2; the rest is for the processes'
    /// other memory and the kernel's page cache).
    pub fraction: f64,
    /// When to grow and shrink, and the floor (defaults: grow below 75% of
    /// the limit, shrink above 85%, at least 16 MiB).
    pub marks: Marks,
    /// How often the member looks at the registry and the usage (default
    /// 200 ms).
    pub interval: Duration,
    /// After this long without filling its capacity (7/8 of it), a cache
    /// asks only for what it holds plus a quarter (default 5 s), leaving
    /// the rest to the others.
    pub idle_after: Duration,
    /// Without the registry, the cache takes this fraction of `want`
    /// (default 1/2).
    pub fallback_fraction: f64,
    /// Where the registry files are (default `/dev/shm`).
    pub registry_dir: PathBuf,
    /// `/proc` (a test's fake tree elsewhere).
    pub proc_root: PathBuf,
    /// The cgroup mount root (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
}

impl BudgetConfig {
    /// A cache wanting at most `want` bytes, with the defaults.
    pub fn new(want: u64) -> BudgetConfig {
        BudgetConfig {
            want,
            fraction: 0.5,
            marks: Marks {
                grow_below: 0.75,
                shrink_above: 0.85,
                min_bytes: 16 * MIB,
            },
            interval: Duration::from_millis(200),
            idle_after: Duration::from_secs(5),
            fallback_fraction: 0.5,
            registry_dir: PathBuf::from("/dev/shm"),
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// A member's view of its budget now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetStats {
    /// The registry key (`cgroup-v1:/path`, `cgroup-v2:/path`, `machine`).
    pub key: String,
    /// The scope's limit in bytes (0 if unknown).
    pub limit: u64,
    /// The scope's unreclaimable usage at the last look.
    pub usage: u64,
    /// This cache's share of the budget.
    pub share: u64,
    /// Its capacity after the last decision.
    pub capacity: u64,
    /// Live members at the last look.
    pub members: u64,
    /// Why the capacity last changed.
    pub reason: Reason,
    /// Capacity changes made.
    pub changes: u64,
    /// Sized alone: the registry could not be reached.
    pub fallback: bool,
}

impl fmt::Display for BudgetStats {
    /// `budget_key=... budget_limit=... budget_usage=... budget_share=...
    /// budget_members=... budget_reason=... budget_changes=...
    /// budget_fallback=0|1` (the `kx_stats` fields).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget_key={} budget_limit={} budget_usage={} budget_share={} budget_members={} \
             budget_reason={} budget_changes={} budget_fallback={}",
            self.key.replace(' ', "%20"),
            self.limit,
            self.usage,
            self.share,
            self.members,
            self.reason,
            self.changes,
            u8::from(self.fallback)
        )
    }
}

/// A cache's membership in its cgroup's (or machine's) shared budget: a
/// thread that, every [`BudgetConfig::interval`], reads the scope's usage,
/// takes the registry's lock, frees dead members' slots, divides the
/// budget and resizes the cache through [`Resizable::set_capacity`].
/// Dropping it stops the thread and frees the slot (a process that dies
/// instead has its slot freed by the next member that looks).
#[derive(Debug)]
pub struct SharedBudget {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<BudgetStats>>,
}

impl SharedBudget {
    /// Join the budget of this process's scope with `target`, deciding
    /// its capacity once before returning (so a fresh process alone with
    /// ample room starts at its full share), then following it from a
    /// thread. The capacity starts at most at `config.want`.
    ///
    /// Where the registry cannot be used (no `/dev/shm`, a foreign file,
    /// every slot taken) or the cgroup files do not parse, the cache is
    /// sized alone with [`BudgetConfig::fallback_fraction`] of `want`,
    /// with one `log::warn!` line per process.
    ///
    /// # Errors
    /// The thread or its stop signal could not be made.
    pub fn join<T>(target: Arc<T>, config: BudgetConfig) -> io::Result<SharedBudget>
    where
        T: Resizable + ?Sized + 'static,
    {
        let stop = Arc::new(StopSignal::new()?);
        let mut member = Member::new(target, config);
        member.tick();
        let stats = Arc::clone(&member.stats);
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kxarray-budget".into())
            .spawn(move || {
                while let Ok(false) = thread_stop.wait(Some(member.config.interval)) {
                    member.tick();
                }
                member.leave();
            })?;
        Ok(SharedBudget {
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// The budget as this member saw it at its last look.
    pub fn stats(&self) -> BudgetStats {
        lock(&self.stats).clone()
    }
}

impl Drop for SharedBudget {
    fn drop(&mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logged once per process: the registry could not be used.
static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// The thread's state.
struct Member<T: ?Sized> {
    target: Arc<T>,
    config: BudgetConfig,
    scope: Option<Scope>,
    registry: Option<Registry>,
    /// Our slot's index, once we have one.
    slot: Option<usize>,
    pid: u32,
    start_time: u64,
    joined: Instant,
    last_full: Instant,
    /// The capacity we last set: a lower one found later was set by
    /// someone else (the pressure monitor), who is then not undone by
    /// growth for [`HOLD`].
    last_set: Option<u64>,
    hold_until: Option<Instant>,
    stats: Arc<Mutex<BudgetStats>>,
}

/// How long growth waits after someone else lowered the capacity.
const HOLD: Duration = Duration::from_secs(10);

impl<T: Resizable + ?Sized> Member<T> {
    fn new(target: Arc<T>, config: BudgetConfig) -> Member<T> {
        let pid = std::process::id();
        let start_time = start_time(&config.proc_root, pid).map_or(0, |(s, _)| s);
        let (scope, registry) = match Scope::locate(&config.proc_root, &config.cgroup_root) {
            Ok(scope) => {
                let r = Registry::open(&config.registry_dir, &scope.key, &config.proc_root);
                (
                    Some(scope),
                    r.map_err(|e| fallback_log(&e.to_string())).ok(),
                )
            }
            Err(e) => {
                fallback_log(&e.to_string());
                (None, None)
            }
        };
        if let Some(Err(e)) =
            (target.capacity() > config.want).then(|| target.set_capacity(config.want))
        {
            log::warn!(
                "kxarray budget: setting the cache capacity to {} failed: {e}",
                config.want
            );
        }
        let stats = BudgetStats {
            key: scope.as_ref().map_or_else(String::new, |s| s.key.clone()),
            capacity: target.capacity(),
            ..BudgetStats::default()
        };
        let now = Instant::now();
        Member {
            target,
            config,
            scope,
            registry,
            slot: None,
            pid,
            start_time,
            joined: now,
            last_full: now,
            last_set: None,
            hold_until: None,
            stats: Arc::new(Mutex::new(stats)),
        }
    }

    /// What this cache asks for now.
    fn demand(&mut self, capacity: u64, used: u64, now: Instant) -> u64 {
        if used >= capacity - capacity / 8 {
            self.last_full = now;
        }
        let want = self.config.want;
        if now.duration_since(self.last_full) < self.config.idle_after
            || now.duration_since(self.joined) < self.config.idle_after
        {
            return want;
        }
        used.saturating_add(used / 4)
            .max(self.config.marks.min_bytes)
            .min(want)
    }

    /// One look: usage, registry, decision, resize.
    fn tick(&mut self) {
        let now = Instant::now();
        let capacity = self.target.capacity();
        let used = self.target.used().unwrap_or(capacity).min(capacity);
        if self.last_set.is_some_and(|s| capacity < s) {
            self.hold_until = Some(now + HOLD);
        }
        self.last_set = Some(capacity);
        let demand = self.demand(capacity, used, now);
        let usage = self.scope.as_ref().map(|s| s.usage());
        let usage = match usage {
            Some(Ok(u)) => Some(u),
            Some(Err(e)) => {
                fallback_log(&e.to_string());
                None
            }
            None => None,
        };
        let total = usage.map_or(u64::MAX, |u| (u.limit as f64 * self.config.fraction) as u64);
        let me = Slot {
            pid: self.pid,
            start_time: self.start_time,
            want: self.config.want,
            demand,
            capacity,
            used,
        };
        let marks = self.config.marks;
        let hold = self.hold_until.is_some_and(|h| now < h);
        let slot = self.slot;
        let shared = self.registry.as_ref().map(|r| {
            r.update(|t, dead| {
                let Some(i) = own_slot(t, slot, &me) else {
                    return (false, Err(()));
                };
                t.slots[i] = me;
                let live: Vec<usize> = (0..t.slots.len())
                    .filter(|&j| t.slots[j].pid != 0)
                    .collect();
                let demands: Vec<u64> = live
                    .iter()
                    .map(|&j| t.slots[j].demand.min(t.slots[j].want))
                    .collect();
                let share = shares(total, &demands)
                    [live.iter().position(|&j| j == i).expect("own slot is live")]
                    / PAGE
                    * PAGE;
                let view = View {
                    limit: usage.map_or(0, |u| u.limit),
                    used: usage.map_or(0, |u| u.unreclaimable()),
                    share,
                    capacity,
                    capacities: live
                        .iter()
                        .map(|&j| t.slots[j].capacity)
                        .fold(0, u64::saturating_add),
                    unfilled: live
                        .iter()
                        .map(|&j| t.slots[j].capacity.saturating_sub(t.slots[j].used))
                        .fold(0, u64::saturating_add),
                    members: live.len() as u64,
                };
                let decision = decide_now(&marks, &view, usage.is_some(), hold, dead > 0);
                if let Some((to, _)) = decision {
                    t.slots[i].capacity = to;
                }
                (true, Ok((i, view, decision)))
            })
        });
        let (view, decision, fallback) = match shared {
            Some(Ok(Ok((i, view, decision)))) => {
                self.slot = Some(i);
                (view, decision, false)
            }
            other => {
                match other {
                    Some(Err(e)) => fallback_log(&e.to_string()),
                    Some(Ok(Err(()))) => fallback_log(&format!(
                        "budget registry {}: all {SLOTS} slots taken",
                        self.registry
                            .as_ref()
                            .map_or(Path::new(""), |r| r.path())
                            .display()
                    )),
                    _ => {}
                }
                let share = ((self.config.want as f64 * self.config.fallback_fraction) as u64)
                    .min(total)
                    / PAGE
                    * PAGE;
                let view = View {
                    limit: usage.map_or(0, |u| u.limit),
                    used: usage.map_or(0, |u| u.unreclaimable()),
                    share,
                    capacity,
                    capacities: capacity,
                    unfilled: capacity - used,
                    members: 1,
                };
                let d = decide_now(&marks, &view, usage.is_some(), hold, false).map(|(to, r)| {
                    (
                        to,
                        if r == Reason::Grow {
                            Reason::Fallback
                        } else {
                            r
                        },
                    )
                });
                (view, d, true)
            }
        };
        let mut st = lock(&self.stats);
        st.limit = view.limit;
        st.usage = view.used;
        st.share = view.share;
        st.members = view.members;
        st.fallback = fallback;
        st.capacity = capacity;
        if let Some((to, reason)) = decision {
            match self.target.set_capacity(to) {
                Ok(()) => {
                    let now_cap = self.target.capacity();
                    self.last_set = Some(now_cap);
                    st.capacity = now_cap;
                    st.reason = reason;
                    st.changes += 1;
                    log::debug!(
                        "kxarray budget {}: cache capacity {} -> {} MiB ({reason}; share {} MiB of {} members, usage {} of {} MiB)",
                        st.key,
                        capacity / MIB,
                        now_cap / MIB,
                        view.share / MIB,
                        view.members,
                        view.used / MIB,
                        view.limit / MIB
                    );
                }
                Err(e) => {
                    log::warn!("kxarray budget: setting the cache capacity to {to} failed: {e}")
                }
            }
        }
    }

    /// Free our slot (the thread is stopping).
    fn leave(&mut self) {
        let (Some(r), Some(i)) = (&self.registry, self.slot) else {
            return;
        };
        let (pid, start) = (self.pid, self.start_time);
        let left = r.update(|t, _| {
            let s = &mut t.slots[i];
            if s.pid == pid && s.start_time == start {
                *s = Slot::default();
                t.generation = t.generation.wrapping_add(1);
                return (true, ());
            }
            (false, ())
        });
        if let Err(e) = left {
            // The slot stays until this process exits (then the next
            // member's look frees it).
            log::warn!("kxarray budget: leaving: {e}");
        }
    }
}

/// [`decide`] with what the tick knows: without usage only a share below
/// the capacity counts; growth waits while held; a grow right after a
/// dead member was freed says so.
fn decide_now(
    marks: &Marks,
    v: &View,
    known: bool,
    hold: bool,
    reaped: bool,
) -> Option<(u64, Reason)> {
    let d = if known {
        decide(marks, v)
    } else {
        (v.capacity > v.share)
            .then_some((v.share.max(marks.min_bytes.min(v.share)), Reason::Rebalance))
    };
    // Whole pages (as the cache rounds), and a change only if one remains.
    let d = d
        .map(|(to, r)| ((to / PAGE * PAGE).max(PAGE), r))
        .filter(|&(to, _)| to != v.capacity);
    match d {
        Some((_, Reason::Grow)) if hold => None,
        Some((to, Reason::Grow)) if reaped => Some((to, Reason::Reclaimed)),
        d => d,
    }
}

/// Our slot in `t`: the one we had if it is still ours, else a free one
/// (the generation moves on: a member joined).
fn own_slot(t: &mut Table, had: Option<usize>, me: &Slot) -> Option<usize> {
    if let Some(i) = had {
        let s = &t.slots[i];
        if s.pid == me.pid && s.start_time == me.start_time {
            return Some(i);
        }
    }
    let i = t.slots.iter().position(|s| s.pid == 0)?;
    t.generation = t.generation.wrapping_add(1);
    Some(i)
}

/// Say once per process that the budget runs without its registry.
fn fallback_log(why: &str) {
    if !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
        log::warn!(
            "kxarray budget: {why}; sizing the cache alone with a smaller fraction (no shared budget)"
        );
    }
}

// Real files, OFD locks and child processes: not under Miri's isolation.
#[cfg(all(test, not(miri)))]
mod tests;
