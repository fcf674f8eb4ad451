//! A [`PageCache`] in a shared memory budget: [`PageCache::join_budget`],
//! the one call a program makes to share its cgroup's (or machine's)
//! memory with the caches of its other processes.
//!
//! Owns nothing but the call: the budget is `crate::memory`'s
//! [`SharedBudget`], which resizes the cache through its `set_capacity`.

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
        let budget = SharedBudget::join(Arc::new(self.clone()), config)?;
        // Its thread starts at a miss (and a forked child joins at its
        // first open or miss): `SharedBudget::demand`.
        self.on_demand(budget.demand_hook());
        Ok(budget)
    }
}
