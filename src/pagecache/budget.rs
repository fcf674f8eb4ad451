//! A [`PageCache`] in a shared memory budget: [`PageCache::join_budget`],
//! the one call a program makes to share its cgroup's (or machine's)
//! memory with the caches of its other processes.
//!
//! Owns the call and, for a cache shared by processes, the region's
//! member: the budget is `crate::memory`'s [`SharedBudget`], which resizes
//! the cache through its `set_capacity`. A cache that joined a shared
//! region also puts the region in the budget, as one member for all the
//! processes that map it (counted once): the process that holds the
//! region's place (`Region::hold_budget`) sizes the region by that
//! member's share; the others ask for the place at their misses, once a
//! second, and the first to ask after the holder died takes it.

use super::PageCache;
use crate::memory::{BudgetConfig, SharedBudget};
use std::sync::Arc;

impl PageCache {
    /// Join this process's shared memory budget (see
    /// [`SharedBudget`]): the cache's capacity follows its share of the
    /// cgroup's (or machine's) budget, grows only while the cgroup has
    /// room and shrinks before its limit, up to `config.want`. Keep the
    /// handle while the cache should follow the budget; dropping it
    /// leaves the budget (its share goes back to the others) and leaves
    /// the capacity as it is. The budget's thread starts at the cache's
    /// first miss a second or more after the join (a process that reads
    /// nothing has none), and in a child after `fork` the cache joins as a
    /// member of the child's own at its first open or miss
    /// ([`SharedBudget::demand`]). For a fixed size, do not call this: the
    /// capacity stays [`CacheConfig::capacity`](super::CacheConfig::capacity).
    ///
    /// # Errors
    /// As [`SharedBudget::join`]: the thread could not be started. A
    /// registry that cannot be reached is not an error (the cache is sized
    /// alone, and one line says so through the `log` crate).
    ///
    /// ```
    /// use kxarray::memory::{BudgetConfig, CapacityPolicy};
    /// use kxarray::pagecache::{CacheConfig, PageCache};
    ///
    /// let want = CapacityPolicy::default().capacity_from_system().unwrap().bytes;
    /// // Start small: the budget grows it at once while there is room.
    /// let cache = PageCache::new(CacheConfig::default().capacity(16 << 20).flusher(false));
    /// # use std::os::unix::fs::PermissionsExt;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    /// # let registry_dir = kxarray::memory::RegistryDir::Private(dir.path().into());
    /// # let want = BudgetConfig { registry_dir, ..BudgetConfig::new(want) };
    /// let budget = cache.join_budget(want).unwrap();
    /// assert_eq!(cache.capacity(), budget.stats().capacity);
    /// ```
    pub fn join_budget(&self, config: BudgetConfig) -> std::io::Result<SharedBudget> {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(r) = self.region() {
            self.on_demand(region::member(Arc::clone(r), config.clone()));
        }
        let budget = SharedBudget::join(Arc::new(self.clone()), config)?;
        // Its thread starts at a miss (and a forked child joins at its
        // first open or miss): `SharedBudget::demand`.
        self.on_demand(budget.demand_hook());
        Ok(budget)
    }
}

/// The shared region as a member of the budget.
#[cfg(all(target_os = "linux", not(loom)))]
mod region {
    use crate::memory::{BudgetConfig, Resizable, SharedBudget};
    use crate::shared::Region;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// How often a member that does not hold the region's place asks for
    /// it (at a miss).
    const ASK_EVERY: Duration = Duration::from_secs(1);

    /// The region resized by its share.
    struct Target(Arc<Region>);

    impl Resizable for Target {
        type Error = std::io::Error;

        fn capacity(&self) -> u64 {
            self.0.capacity()
        }

        fn set_capacity(&self, bytes: u64) -> Result<(), std::io::Error> {
            self.0.set_capacity(bytes).map(|_| ())
        }

        fn used(&self) -> Option<u64> {
            Some(self.0.backed_bytes())
        }
    }

    /// What the hook keeps: the region's member while this process holds
    /// the place, and when it last asked.
    struct Place {
        budget: Option<SharedBudget>,
        asked: Option<Instant>,
    }

    /// The `on_demand` hook that puts `region` in the budget `config`
    /// names while this process holds its place: never done (`false`)
    /// unless this process holds it and the member's thread runs.
    pub(super) fn member(
        region: Arc<Region>,
        config: BudgetConfig,
    ) -> impl Fn() -> bool + Send + Sync + 'static {
        let want = config.want.min(region.max_bytes());
        let config = BudgetConfig { want, ..config };
        let place = Mutex::new(Place {
            budget: None,
            asked: None,
        });
        move || {
            let Ok(mut p) = place.try_lock() else {
                return false;
            };
            if region.holds_budget() {
                return p.budget.as_ref().is_none_or(|b| b.demand());
            }
            // Not the holder (a child's copy of its parent's member is
            // the parent's: dropped here, which frees nothing of the
            // parent's).
            p.budget = None;
            if p.asked.is_some_and(|t| t.elapsed() < ASK_EVERY) {
                return false;
            }
            p.asked = Some(Instant::now());
            if !region.hold_budget() {
                return false;
            }
            match SharedBudget::join(Arc::new(Target(Arc::clone(&region))), config.clone()) {
                Ok(b) => {
                    let done = b.demand();
                    p.budget = Some(b);
                    done
                }
                Err(e) => {
                    log::warn!(
                        "kxarray: shared cache {}: not in the memory budget ({e})",
                        region.path().display()
                    );
                    true
                }
            }
        }
    }
}
