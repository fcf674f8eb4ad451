//! A journal or WAL cached in shared locking mode while its database is
//! held EXCLUSIVE under SQLite's `PRAGMA locking_mode=EXCLUSIVE`:
//! [`Hold`], one per inode.
//!
//! In shared mode a journal or WAL is read and written on its descriptor,
//! never cached (`Inode::uncached`): another process may write it between
//! two of this process's transactions. A connection that set
//! `locking_mode=EXCLUSIVE` and holds the database's EXCLUSIVE lock keeps
//! every other connection of every process out of the database, and so out
//! of its journal and WAL (a WAL-mode connection holds SHARED on the
//! database for as long as it has it open; a checkpoint and a WAL's
//! deletion run inside such a connection), until the lock is released.
//! For that long the journal or WAL is read through the process's cache.
//!
//! - **The database's side** ([`Hold::update`], from `xLock`, `xUnlock`,
//!   `SQLITE_FCNTL_PRAGMA` and `xClose` of a database handle in shared
//!   mode): `epoch` names the hold on (an odd number never used before in
//!   the process), 0 when none is. A hold starts
//!   when the handle that set `locking_mode=EXCLUSIVE` reaches EXCLUSIVE
//!   and ends when it leaves EXCLUSIVE (or sets `locking_mode=NORMAL`, or
//!   closes). Only the handle at EXCLUSIVE changes it (at most one handle
//!   of the process is above SHARED).
//! - **The journal's or WAL's side** (`Handle::held` (`heldio`), at each of its
//!   reads, writes and truncations): its `seen` is the hold its cache was
//!   made current for (0: none). At the first operation of a new hold the
//!   cache forgets the file (`CachedFile::revalidate`: every clean page
//!   dropped, the length taken again): another process may have written
//!   it since the last hold. Outside a hold the same drop frees the pages
//!   and the descriptor path is taken.
//!
//! Invariants:
//! - a journal's or WAL's cached page is served only during the hold its
//!   `seen` names, and was read or written during that hold;
//! - every write during a hold reaches the file before `xWrite` returns
//!   (`pwrite`, then the cache's pages of the range dropped), and the cache
//!   never holds a dirty page of the file, so when the lock is released
//!   the file holds all of it, as when the descriptor path writes it, and
//!   nothing is written back later: another process never reads a stale
//!   journal or WAL because of the hold;
//! - anything that could leave the cache and the file apart (a failed
//!   write, a truncation, a failed length refresh, dirty pages at the
//!   start of a hold) makes `seen` 0 or keeps the descriptor path: the
//!   next hold's first operation starts over, and the descriptor path is
//!   always right.

use crate::sqlite::ffi::SQLITE_LOCK_EXCLUSIVE;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

/// The hold state of one inode (see the module notes).
#[derive(Debug, Default)]
pub(crate) struct Hold {
    /// A database: the hold on (odd, unique in the process), or 0.
    epoch: AtomicU64,
    /// A journal or WAL: the database's `epoch` its cache is current for
    /// (0: none).
    seen: AtomicU64,
}

/// What `PRAGMA locking_mode=<value>` asks of a handle: `Some(true)` for
/// EXCLUSIVE, `Some(false)` for NORMAL, `None` for a query or anything
/// else (SQLite keeps its mode then).
pub(crate) fn pragma_value(name: &str, value: Option<&str>) -> Option<bool> {
    if !name.eq_ignore_ascii_case("locking_mode") {
        return None;
    }
    match value?.trim().trim_matches(['\'', '"']) {
        v if v.eq_ignore_ascii_case("exclusive") => Some(true),
        v if v.eq_ignore_ascii_case("normal") => Some(false),
        _ => None,
    }
}

impl Hold {
    /// A database handle's lock level or `locking_mode` changed: start or
    /// end the hold. `holding` is the handle's own record (whether it
    /// started the hold that is on); `level` its lock level, `exclusive`
    /// its `locking_mode=EXCLUSIVE`.
    pub(crate) fn update(&self, holding: &mut bool, level: c_int, exclusive: bool) {
        /// The next hold's number: odd, never used twice in the process
        /// (a journal's or WAL's `seen` never names a later hold, whatever
        /// inode of its database that hold is on).
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let want = exclusive && level == SQLITE_LOCK_EXCLUSIVE;
        if want != *holding {
            *holding = want;
            let e = if want {
                NEXT.fetch_add(2, Ordering::Relaxed)
            } else {
                0
            };
            self.epoch.store(e, Ordering::Release);
        }
    }

    /// Whether a database's hold is on.
    #[inline]
    pub(crate) fn held(&self) -> Option<u64> {
        let e = self.epoch.load(Ordering::Acquire);
        (e % 2 == 1).then_some(e)
    }

    /// The hold a journal's or WAL's cache is current for (0: none).
    #[inline]
    pub(crate) fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// The cache was made current for hold `e` (0: it is not).
    pub(crate) fn set_seen(&self, e: u64) {
        self.seen.store(e, Ordering::Release);
    }

    /// The cache no longer matches the file (a truncation on the
    /// descriptor, a failed write): the next operation starts over.
    pub(crate) fn forget(&self) {
        self.seen.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pragma_values() {
        assert_eq!(pragma_value("locking_mode", Some("EXCLUSIVE")), Some(true));
        assert_eq!(pragma_value("LOCKING_MODE", Some("'normal'")), Some(false));
        assert_eq!(pragma_value("locking_mode", None), None);
        assert_eq!(pragma_value("locking_mode", Some("sideways")), None);
        assert_eq!(pragma_value("journal_mode", Some("exclusive")), None);
    }

    #[test]
    fn a_hold_is_on_while_its_handle_is_exclusive_under_the_pragma() {
        let h = Hold::default();
        let mut holding = false;
        h.update(&mut holding, SQLITE_LOCK_EXCLUSIVE, false);
        assert_eq!(h.held(), None, "no pragma, no hold");
        h.update(&mut holding, SQLITE_LOCK_EXCLUSIVE, true);
        let e = h.held().expect("held");
        h.update(&mut holding, SQLITE_LOCK_EXCLUSIVE, true);
        assert_eq!(h.held(), Some(e), "the same hold");
        h.update(&mut holding, crate::sqlite::ffi::SQLITE_LOCK_SHARED, true);
        assert_eq!(h.held(), None, "released");
        // Another handle, never at EXCLUSIVE, changes nothing.
        let mut other = false;
        h.update(&mut holding, SQLITE_LOCK_EXCLUSIVE, true);
        h.update(&mut other, crate::sqlite::ffi::SQLITE_LOCK_NONE, false);
        assert!(h.held().is_some_and(|n| n > e), "a new hold, kept");
        h.update(&mut holding, SQLITE_LOCK_EXCLUSIVE, false);
        assert_eq!(h.held(), None, "locking_mode=NORMAL ends it");
    }
}
