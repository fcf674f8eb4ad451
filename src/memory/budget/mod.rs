//! One memory budget for the caches of every process in a cgroup (or on
//! the machine): a registry in the user's private runtime directory, a
//! fair division among the live members, growth only while the cgroup has
//! room, and shrinking before its limit.
//!
//! Owns [`SharedBudget`] (a member: its per-process state, its thread and
//! its stats), [`BudgetConfig`] and [`BudgetStats`]; the scope and its
//! usage are in `scope`, the shared table in `registry` (on
//! [`crate::ipc`]: the runtime directory, the table's lock, the life
//! bytes), the pure decisions in `divide`.
//! Invariants: every decision is made under the registry's lock with the
//! member's new capacity written to its slot before the lock is let go, so
//! two members never grow into the same headroom; a member's capacity
//! never goes above its share; a member is alive exactly while its
//! registry description holds its life byte, and a dead member's slot is
//! freed by the next member that takes the lock, without the dead
//! process's help; a member that cannot reach the registry sizes its cache
//! alone with `fallback_fraction` of what it wants and says so once per
//! process through the `log` crate; dropping a [`SharedBudget`] stops its
//! thread and frees its slot, and leaves the capacity where it was.
//!
//! **Per process.** A `SharedBudget` is a member in each process that uses
//! it: in a child after `fork` (or `_Fork`, or a raw `clone`) its first
//! call joins as a member of the child's own, with its own registry
//! descriptor, slot and thread; the parent's (its description, life byte,
//! slot and thread) are never touched by the child, and the descriptor is
//! closed in the child ([`crate::fork::close_in_child`]) so that a parent
//! that dies leaves no lock held.
//!
//! **No thread until needed.** Joining decides the capacity once, in the
//! caller; the thread that follows the budget starts at the first
//! [`SharedBudget::demand`] (for a `PageCache`, its first miss) when the member joined beside others (their joins and
//! deaths change its share), at the first demand
//! [`BudgetConfig::thread_after`] (1 s) or more after the join when it
//! joined alone (a short-lived process, a one-shot bulk load, never starts
//! one), and as soon as the process forks (a process that forks lives on:
//! a pre-fork server's master, whose share must come down as its workers
//! join). A process that opened a cache and reads nothing has no thread.
//! The cost of putting it off: a member alone at its join that stops
//! missing within its first second keeps the share it was given until its
//! next miss, even after others join (what it holds is what it read in
//! that second; the cgroup's usage, which the others' shrinking follows,
//! counts it).
//!
//! ```
//! use kxarray::memory::{BudgetConfig, RegistryDir, SharedBudget};
//! use kxarray::pagecache::{CacheConfig, PageCache};
//! use std::os::unix::fs::PermissionsExt;
//!
//! let cache = PageCache::new(CacheConfig::default().capacity(64 << 20).flusher(false));
//! let dir = tempfile::tempdir().unwrap(); // a private directory (default: the user's runtime directory)
//! std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
//! let registry_dir = RegistryDir::Private(dir.path().into());
//! let config = BudgetConfig { registry_dir, ..BudgetConfig::new(256 << 20) };
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
    file_name, start_time, Look, Registry, RegistryDir, RegistryError, Slot, Table, FILE_BYTES,
    KEY_BYTES, LIFE, LOCK_PATIENCE, SLOTS, SLOT_WORDS, TABLE_LOCK,
};
pub use scope::{Scope, ScopeKind, Usage};

use super::monitor::Resizable;
use super::poll::StopSignal;
use divide::{decide, shares, Reason};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// How a cache takes part in a shared budget.
///
/// ```
/// use kxarray::memory::{BudgetConfig, RegistryDir};
///
/// let c = BudgetConfig::new(256 << 20);
/// assert_eq!((c.want, c.fraction), (256 << 20, 0.5));
/// assert_eq!(c.registry_dir, RegistryDir::User);
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
    /// Where the registry is (default the user's runtime directory:
    /// `$XDG_RUNTIME_DIR/kxarray` when that is the user's, else
    /// `/dev/shm/kxarray-<euid>`).
    pub registry_dir: RegistryDir,
    /// A member alone in the registry at its join starts its thread at its
    /// first demand at least this long after the join (default 1 s); one
    /// that joined beside others, at its first demand (see the module
    /// notes).
    pub thread_after: Duration,
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
            registry_dir: RegistryDir::User,
            thread_after: Duration::from_secs(1),
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

/// A cache's membership in its cgroup's (or machine's) shared budget: in
/// each process that uses it, a member that reads the scope's usage,
/// takes the registry's lock, frees dead members' slots, divides the
/// budget and resizes the cache through [`Resizable::set_capacity`], once
/// at the join and then every [`BudgetConfig::interval`] from a thread
/// started on demand (see the module notes). Dropping it stops the thread
/// and frees the slot (a process that dies instead has its slot freed by
/// the next member that looks); in a forked child it joins afresh at its
/// first call.
pub struct SharedBudget {
    shared: Arc<dyn Membership>,
}

impl fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBudget")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A [`Shared`] of any target.
trait Membership: Send + Sync {
    fn demand(&self) -> bool;
    /// Start this process's thread now (the process forked: it lives on).
    fn start_now(&self);
    fn stats(&self) -> BudgetStats;
    fn stop_here(&self);
}

/// What a `SharedBudget` holds: the target, the configuration, and this
/// process's member.
struct Shared<T: ?Sized> {
    target: Arc<T>,
    config: BudgetConfig,
    /// This process's member (`Arc::into_raw`), or an ancestor's inherited
    /// across `fork` (never freed in the child: it is the parent's memory),
    /// or null before the first join and after the last stop.
    local: AtomicPtr<Local<T>>,
}

/// One process's member.
struct Local<T: ?Sized> {
    generation: u64,
    joined: Instant,
    /// The member was alone in the registry at its join (or without one):
    /// nobody waits for its share to come down yet.
    alone: bool,
    member: Mutex<Member<T>>,
    stats: Arc<Mutex<BudgetStats>>,
    thread: Mutex<Option<Running>>,
    running: AtomicBool,
}

struct Running {
    stop: Arc<StopSignal>,
    handle: JoinHandle<()>,
}

impl<T: Resizable + ?Sized + 'static> Shared<T> {
    /// This process's member, joining first if there is none (a fresh
    /// budget, or a forked child's first call).
    fn here(&self) -> Arc<Local<T>> {
        let gen = crate::fork::generation();
        let p = self.local.load(Ordering::Acquire);
        // SAFETY: a non-null `local` came from `Arc::into_raw` and is freed
        // only by `stop_here` in its own process after swapping it out (a
        // pointer of another generation is never freed here).
        if !p.is_null() && unsafe { (*p).generation } == gen {
            // SAFETY: as above: the pointer's reference is alive; one more
            // for the caller.
            unsafe { Arc::increment_strong_count(p) };
            // SAFETY: the reference just counted is the caller's.
            return unsafe { Arc::from_raw(p) };
        }
        let mut member = Member::new(Arc::clone(&self.target), self.config.clone());
        member.tick();
        let alone = lock(&member.stats).members <= 1;
        let fresh = Arc::new(Local {
            generation: gen,
            joined: Instant::now(),
            alone,
            stats: Arc::clone(&member.stats),
            member: Mutex::new(member),
            thread: Mutex::new(None),
            running: AtomicBool::new(false),
        });
        let raw = Arc::into_raw(Arc::clone(&fresh)).cast_mut();
        match self
            .local
            .compare_exchange(p, raw, Ordering::AcqRel, Ordering::Acquire)
        {
            // An inherited one (`p`, another generation) is leaked on
            // purpose: it is the parent's.
            Ok(_) => fresh,
            Err(_) => {
                // Another thread of this process joined first: leave ours.
                // SAFETY: `raw` was never published; its reference is ours.
                drop(unsafe { Arc::from_raw(raw) });
                lock(&fresh.member).leave();
                self.here()
            }
        }
    }

    fn start_thread(&self, local: &Arc<Local<T>>) {
        let mut t = lock(&local.thread);
        if t.is_some() || fork_moved(local) {
            return;
        }
        let stop = match StopSignal::new() {
            Ok(s) => Arc::new(s),
            Err(e) => {
                log::warn!(
                    "kxarray budget: no thread (its stop signal: {e}); the join's capacity stands"
                );
                local.running.store(true, Ordering::Release);
                return;
            }
        };
        let (theirs, l) = (Arc::clone(&stop), Arc::clone(local));
        let interval = self.config.interval;
        let spawned = std::thread::Builder::new()
            .name("kxarray-budget".into())
            .spawn(move || {
                while let Ok(false) = theirs.wait(Some(interval)) {
                    lock(&l.member).tick();
                }
            });
        match spawned {
            Ok(handle) => *t = Some(Running { stop, handle }),
            Err(e) => log::warn!("kxarray budget: no thread ({e}); the join's capacity stands"),
        }
        local.running.store(true, Ordering::Release);
    }
}

fn fork_moved<T: ?Sized>(local: &Local<T>) -> bool {
    crate::fork::inherited(local.generation)
}

impl<T: Resizable + ?Sized + 'static> Membership for Shared<T> {
    fn demand(&self) -> bool {
        let local = self.here();
        if local.running.load(Ordering::Acquire) {
            return true;
        }
        if local.alone && local.joined.elapsed() < self.config.thread_after {
            return false;
        }
        self.start_thread(&local);
        true
    }

    fn start_now(&self) {
        let local = self.here();
        if !local.running.load(Ordering::Acquire) {
            self.start_thread(&local);
        }
    }

    fn stats(&self) -> BudgetStats {
        lock(&self.here().stats).clone()
    }

    fn stop_here(&self) {
        let p = self.local.load(Ordering::Acquire);
        // SAFETY: as in `here`.
        if p.is_null() || unsafe { (*p).generation } != crate::fork::generation() {
            return; // nothing of this process's (an inherited one is leaked)
        }
        if self
            .local
            .compare_exchange(p, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // SAFETY: swapped out: the published reference is ours now.
        let local = unsafe { Arc::from_raw(p) };
        if let Some(r) = lock(&local.thread).take() {
            r.stop.set();
            let _ = r.handle.join();
        }
        lock(&local.member).leave();
    }
}

impl SharedBudget {
    /// Join the budget of this process's scope with `target`, deciding
    /// its capacity once before returning (so a fresh process alone with
    /// ample room starts at its full share). The capacity starts at most
    /// at `config.want`. The thread that follows the budget starts later,
    /// on [`demand`](SharedBudget::demand).
    ///
    /// Where the registry cannot be used (no runtime directory, a
    /// directory or file another user could reach, a foreign file, every
    /// slot taken) or the cgroup files do not parse, the cache is sized
    /// alone with [`BudgetConfig::fallback_fraction`] of `want`, with one
    /// `log::warn!` line per process.
    ///
    /// # Errors
    /// None at present (a thread that cannot be started later is logged
    /// then); kept for a join that may fail.
    pub fn join<T>(target: Arc<T>, config: BudgetConfig) -> io::Result<SharedBudget>
    where
        T: Resizable + ?Sized + 'static,
    {
        let shared = Arc::new(Shared {
            target,
            config,
            local: AtomicPtr::new(std::ptr::null_mut()),
        });
        shared.here();
        let shared: Arc<dyn Membership> = shared;
        // (A lock a thread held at a fork stays held in the child: not
        // waited for there.)
        if let Ok(mut f) = FORKERS.try_lock() {
            f.push(Arc::downgrade(&shared));
        }
        crate::fork::in_parent_after_fork(start_after_fork);
        Ok(SharedBudget { shared })
    }

    /// The cache is in use in this process (a miss): in a forked child,
    /// join as its own member first; start this process's thread once
    /// [`BudgetConfig::thread_after`] has passed since it joined. Returns
    /// `true` once nothing is left to start in this process.
    pub fn demand(&self) -> bool {
        self.shared.demand()
    }

    /// A hook for `PageCache::on_demand` that does what
    /// [`demand`](SharedBudget::demand) does while this budget lives (and
    /// nothing after).
    pub fn demand_hook(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let weak: Weak<dyn Membership> = Arc::downgrade(&self.shared);
        move || weak.upgrade().is_none_or(|s| s.demand())
    }

    /// The budget as this process's member saw it at its last look (in a
    /// forked child, after joining as its own member).
    pub fn stats(&self) -> BudgetStats {
        self.shared.stats()
    }
}

impl Drop for SharedBudget {
    fn drop(&mut self) {
        self.shared.stop_here();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The budgets of this process, for [`start_after_fork`].
static FORKERS: Mutex<Vec<Weak<dyn Membership>>> = Mutex::new(Vec::new());

/// After this process forked (in the parent): a process that forks lives
/// on (a pre-fork server's master), so its members' threads start now
/// rather than at a miss it may never have again; its share comes down
/// once its children join.
fn start_after_fork() {
    let live: Vec<Arc<dyn Membership>> = {
        let mut v = lock(&FORKERS);
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    };
    for m in live {
        m.start_now();
    }
}

/// The process (fork generation plus one) that logged that the registry
/// could not be used: once per process.
static FALLBACK_LOGGED: AtomicU64 = AtomicU64::new(0);

/// One process's member: what a look needs.
struct Member<T: ?Sized> {
    target: Arc<T>,
    config: BudgetConfig,
    scope: Option<Scope>,
    registry: Option<Registry>,
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
                let r = config
                    .registry_dir
                    .open()
                    .map_err(RegistryError::Refused)
                    .and_then(|dir| Registry::open(&dir, &scope.key));
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
        let shared = self.registry.as_mut().map(|r| {
            r.update(true, |t, look| {
                let dead = look.dead;
                let Some(i) = look.mine else {
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
                (true, Ok((view, decision)))
            })
        });
        let (view, decision, fallback) = match shared {
            Some(Ok(Ok((view, decision)))) => (view, decision, false),
            // Held by a member that makes no progress: this round is
            // skipped (the capacity stays), once a slot is ours.
            Some(Err(RegistryError::Busy(_)))
                if self.registry.as_ref().is_some_and(|r| r.slot().is_some()) =>
            {
                return;
            }
            other => {
                match other {
                    Some(Err(e)) => fallback_log(&e.to_string()),
                    Some(Ok(Err(()))) => fallback_log(&format!(
                        "budget registry {}: all {SLOTS} slots taken",
                        self.registry
                            .as_ref()
                            .map_or(std::path::Path::new(""), |r| r.path())
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

    /// Free our slot (the member is leaving).
    fn leave(&mut self) {
        let Some(r) = self.registry.as_mut() else {
            return;
        };
        if let Err(e) = r.leave(self.pid) {
            // The slot stays until this process exits or the file is
            // closed (then the next member's look frees it).
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

/// Say once per process that the budget runs without its registry.
fn fallback_log(why: &str) {
    let me = crate::fork::generation() + 1;
    if FALLBACK_LOGGED.swap(me, Ordering::Relaxed) != me {
        log::warn!(
            "kxarray budget: {why}; sizing the cache alone with a smaller fraction (no shared budget)"
        );
    }
}

// Real files, OFD locks and child processes: not under Miri's isolation.
#[cfg(all(test, not(miri)))]
mod tests;
