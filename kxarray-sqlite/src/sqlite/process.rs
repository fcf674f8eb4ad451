//! The process-wide state the VFS and its files share, below both: the
//! SQLite entry points ([`Api`], set by the first registration), the VFS's
//! own counters, the cache's configured capacity and shared memory budget,
//! and the crash test's knob.
//!
//! Invariant: the `Api` is set once and never changes (every registration
//! after the first gets the first's table back).

use crate::sqlite::api::Api;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

static API: OnceLock<Api> = OnceLock::new();

/// The SQLite entry points, set by the first registration.
///
/// # Panics
/// Before any registration (never: SQLite calls the VFS only after one).
pub(crate) fn api() -> &'static Api {
    API.get().expect("kxarray VFS used before registration")
}

/// Whether `KXARRAY_SQLITE_WRITE_BACK=1` turned write-through off (read
/// once). For testing the crash test only: writes then stay dirty in the
/// process's cache until `xSync`, so a SIGKILL loses what the kernel's page
/// cache would have kept, and the crash test must notice
/// (`tests/crash.rs`). Never set it otherwise.
pub(crate) fn write_back_only() -> bool {
    static W: OnceLock<bool> = OnceLock::new();
    *W.get_or_init(|| std::env::var("KXARRAY_SQLITE_WRITE_BACK").is_ok_and(|v| v == "1"))
}

/// The VFS's own counters (beside the cache's).
#[derive(Debug, Default)]
pub(crate) struct VfsStats {
    pub(crate) writes: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) fetches: AtomicU64,
    /// Fetches served from a page the handle held (a hot page).
    pub(crate) fetches_held: AtomicU64,
    pub(crate) fetch_fallbacks: AtomicU64,
    /// First locks refused because another open file description holds a
    /// conflicting OFD or POSIX lock (another process, or the unix VFS).
    pub(crate) lock_conflicts: AtomicU64,
    /// Checkpoint reads of WAL frames served straight from the file
    /// (`file::read_uncached`).
    pub(crate) uncached_reads: AtomicU64,
    /// Reads of a journal or WAL served through the cache in shared mode
    /// while its database is held EXCLUSIVE (`hold`).
    pub(crate) held_reads: AtomicU64,
    /// Coherence checks: a lock gap, or a WAL read transaction
    /// (`coherence`).
    pub(crate) coherence_checks: AtomicU64,
    /// Checks that dropped the pages a checkpoint by another process
    /// copied (and nothing else).
    pub(crate) coherence_partial_drops: AtomicU64,
    /// Checks that dropped every cached page of a database.
    pub(crate) coherence_full_drops: AtomicU64,
    /// Coherence checks that found the file changed and dropped nothing:
    /// the shared cache's frames were current with it (a member made the
    /// change, or dropped them after another process's).
    pub(crate) coherence_member_skips: AtomicU64,

    /// Pages dropped by coherence checks, partial and full.
    pub(crate) coherence_pages_dropped: AtomicU64,
}

pub(crate) fn vfs_stats() -> &'static VfsStats {
    static S: OnceLock<VfsStats> = OnceLock::new();
    S.get_or_init(VfsStats::default)
}

/// Set the SQLite entry points if no registration did yet; the table in
/// force either way.
pub(crate) fn set_api(api: Api) -> &'static Api {
    API.get_or_init(|| api)
}

/// The capacity the first open asked for (with the budget: the most the
/// cache takes).
pub(crate) static CONFIGURED: OnceLock<u64> = OnceLock::new();
/// The cache's membership in the shared memory budget, when on.
pub(crate) static BUDGET: OnceLock<kxarray::memory::SharedBudget> = OnceLock::new();

/// The capacity the first open asked for (`kx_cache` or the default).
pub(crate) fn configured_capacity() -> u64 {
    CONFIGURED.get().copied().unwrap_or(0)
}

/// The shared budget's view, if the cache joined one.
pub(crate) fn budget_stats() -> Option<kxarray::memory::BudgetStats> {
    BUDGET.get().map(|b| b.stats())
}
