//! The text of `PRAGMA kx_stats` ([`stats_text`]) and `PRAGMA
//! kx_settings` ([`settings_text`]): one line per counter or setting,
//! `name=value` (a program splits each line at its first `=`, or the whole
//! text at white space), sizes followed by the same in MiB for a person.
//!
//! `kx_stats` has the process cache's counters (`passthrough_pages` and
//! `passthrough_bytes`: reads that passed the cache by, without a frame), then the VFS's own
//! ([`VfsStats`](crate::sqlite::process::VfsStats): writes, syncs, fetches, lock
//! conflicts, uncached reads, held reads (`hold`), the coherence checks
//! with other processes' writes), the files open, and the shared memory
//! budget's `budget_*` fields when the cache joined one. Owns nothing
//! else; every counter is read with relaxed loads (a snapshot, not a
//! transaction).

use crate::locking::inode;
use crate::sqlite::process::vfs_stats;
use kxarray::pagecache::PageCache;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// Lines of `name=value`, the value of a size followed by its MiB.
#[derive(Default)]
pub(crate) struct Rows(String);

/// The column the MiB of a size starts at.
const HUMAN_COLUMN: usize = 36;

impl Rows {
    /// A count, or a value of no unit.
    pub(crate) fn count(&mut self, name: &str, v: impl std::fmt::Display) -> &mut Self {
        let _ = writeln!(self.0, "{name}={v}");
        self
    }

    /// A size in bytes, and in MiB.
    pub(crate) fn bytes(&mut self, name: &str, v: u64) -> &mut Self {
        let kv = format!("{name}={v}");
        let _ = writeln!(self.0, "{kv:<HUMAN_COLUMN$} {:.1} MiB", mib(v));
        self
    }

    /// A count of 4 KiB pages, and their size in MiB.
    pub(crate) fn pages(&mut self, name: &str, v: u64) -> &mut Self {
        let kv = format!("{name}={v}");
        let _ = writeln!(
            self.0,
            "{kv:<HUMAN_COLUMN$} {:.1} MiB",
            mib(v.saturating_mul(4096))
        );
        self
    }

    /// A value and a note for a person after it.
    pub(crate) fn noted(&mut self, name: &str, v: impl std::fmt::Display, note: &str) -> &mut Self {
        let kv = format!("{name}={v}");
        let _ = writeln!(self.0, "{kv:<HUMAN_COLUMN$} {note}");
        self
    }

    /// The text, without its last newline.
    pub(crate) fn text(&self) -> String {
        self.0.trim_end_matches('\n').to_string()
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The text of `PRAGMA kx_stats`: the cache's counters and the VFS's, a
/// line each.
pub(crate) fn stats_text(cache: &PageCache) -> String {
    let s = cache.stats();
    let v = vfs_stats();
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut rows = Rows::default();
    rows.bytes("capacity", cache.capacity())
        .pages("cached_pages", s.cached_pages)
        .count("hits", s.hits)
        .count("misses", s.misses)
        .pages("readahead_pages", s.readahead_pages)
        .pages("passthrough_pages", s.passthrough_pages)
        .bytes("passthrough_bytes", s.passthrough_bytes)
        .count("evictions", s.evictions)
        .count("refaults", s.refaults)
        .bytes("backend_read_bytes", s.backend_read_bytes)
        .bytes("backend_written_bytes", s.backend_written_bytes)
        .bytes("dirty_bytes", s.dirty_bytes)
        .count("writes", r(&v.writes))
        .count("syncs", r(&v.syncs))
        .count("fetches", r(&v.fetches))
        .count("fetches_held", r(&v.fetches_held))
        .count("fetch_fallbacks", r(&v.fetch_fallbacks))
        .count("lock_conflicts", r(&v.lock_conflicts))
        .count("uncached_reads", r(&v.uncached_reads))
        .count("held_reads", r(&v.held_reads))
        .count("coherence_checks", r(&v.coherence_checks))
        .count("coherence_partial_drops", r(&v.coherence_partial_drops))
        .count("coherence_full_drops", r(&v.coherence_full_drops))
        .count("coherence_member_skips", r(&v.coherence_member_skips))
        .pages("coherence_pages_dropped", r(&v.coherence_pages_dropped))
        .count("open_files", inode::open_files());
    // The shared cache's figures, every member's together (this member's
    // reads are in `hits` and `misses` above).
    if let Some(region) = cache.region() {
        let g = region.stats();
        rows.count("shared_files", inode::shared_files())
            .count("region_members", g.members)
            .bytes("region_capacity", g.capacity)
            .bytes("region_backed", g.backed)
            .pages("region_cached_pages", g.cached_frames)
            .pages("region_dirty_pages", g.dirty_frames)
            .count("region_fills", g.fills)
            .count("region_evictions", g.evictions)
            .count("region_recovered", g.recovered);
    }
    // The shared budget's fields, when the cache is in one.
    if let Some(b) = crate::sqlite::process::budget_stats() {
        rows.count("budget_key", b.key.replace(' ', "%20"))
            .bytes("budget_limit", b.limit)
            .bytes("budget_usage", b.usage)
            .bytes("budget_share", b.share)
            .count("budget_members", b.members)
            .count("budget_reason", b.reason)
            .count("budget_changes", b.changes)
            .count("budget_fallback", u8::from(b.fallback));
    }
    rows.text()
}

/// The settings one handle has in force, for `PRAGMA kx_settings`.
pub(crate) struct InForce {
    pub(crate) direct: bool,
    pub(crate) fetch: bool,
    pub(crate) pressure: bool,
    pub(crate) prefetch: bool,
    pub(crate) mmap_size: i64,
    pub(crate) block_size: u32,
    pub(crate) exclusive: bool,
}

/// The text of `PRAGMA kx_settings`: the cache's capacity now and the
/// most it may take (`kx_cache`), then the handle's settings, a line each.
pub(crate) fn settings_text(cache: &PageCache, s: &InForce) -> String {
    let budget = crate::sqlite::process::budget_stats().is_some();
    let configured = crate::sqlite::process::configured_capacity();
    let mut rows = Rows::default();
    rows.noted(
        "capacity",
        cache.capacity(),
        &format!(
            "{:.1} MiB in force now{}",
            mib(cache.capacity()),
            if budget {
                " (the shared budget's share, at most kx_cache)"
            } else {
                ""
            }
        ),
    )
    .noted(
        "cache",
        configured,
        &format!(
            "{:.1} MiB: kx_cache, {}",
            mib(configured),
            if budget {
                "the most the budget may grow the cache to"
            } else {
                "the fixed capacity (kx_budget=0)"
            }
        ),
    )
    .count("budget", u8::from(budget))
    .count("pressure", u8::from(s.pressure))
    .count("direct", u8::from(s.direct))
    .count("fetch", u8::from(s.fetch))
    .count("prefetch", u8::from(s.prefetch))
    .count("mmap_size", s.mmap_size)
    .count("block_size", s.block_size)
    .count("locking", if s.exclusive { "exclusive" } else { "shared" });
    rows.text()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_name_value_lines_with_mib_for_sizes() {
        let mut r = Rows::default();
        r.count("hits", 7)
            .bytes("capacity", 256 << 20)
            .pages("cached_pages", 512);
        let t = r.text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "hits=7");
        assert!(lines[1].starts_with("capacity=268435456 "), "{t}");
        assert!(lines[1].ends_with(" 256.0 MiB"), "{t}");
        assert!(lines[2].ends_with(" 2.0 MiB"), "{t}");
        // a program reads it word by word too
        let kv: Vec<&str> = t.split_whitespace().filter(|w| w.contains('=')).collect();
        assert_eq!(kv, ["hits=7", "capacity=268435456", "cached_pages=512"]);
    }
}
