//! The SQLite boundary: the VFS object SQLite registers and calls, and what
//! only it uses. The top room: it may import every room below, and none
//! imports it (the crate's face, `lib.rs`, calls it to register).
//!
//! - [`vfs`]: the `sqlite3_vfs` object and its callbacks (`xOpen`, which
//!   files become which inodes with which settings, `xDelete`, `xAccess`,
//!   `xFullPathname`, randomness, sleep, time), registration, and the
//!   process's one [`PageCache`](kxarray::pagecache::PageCache);
//! - [`open_error`]: why an open failed, and [`open_error::report`], the
//!   one place a failed open leaves the VFS;
//! - [`pathname`]: the canonical name `xFullPathname` gives, resolved as
//!   the unix VFS resolves it;
//! - [`logger`]: the `log` facade's records forwarded to `sqlite3_log`.
//!
//! Invariants (each file's notes say how):
//! - one `sqlite3_vfs` object per process, never freed or moved (SQLite
//!   links it into its list), and one `PageCache`, made by the first open;
//! - no failed open returns its code without passing through
//!   [`open_error::report`];
//! - a callback never unwinds into C (its body runs in
//!   [`guard`](crate::io::file::guard)), and `xOpen` leaves `pMethods`
//!   null unless it succeeds.
//!
//! Where the rest of the boundary is, and why: a handle's callbacks
//! (`sqlite3_io_methods`) are the top of `io` ([`crate::io::file`]): the
//! I/O paths they choose between are methods of the same `Handle`
//! (`io::heldio`, `io::lockless`), and `file` uses the readahead and fetch
//! state of `io`, so apart they would import each other. SQLite's C
//! declarations, its entry points, the settings and the process-wide state
//! are the bottom room, `sqlite`: every room speaks them (result codes,
//! lock levels, logging through the `Api`), so here they would make every
//! room and this one import each other.

pub(crate) mod logger;
pub(crate) mod open_error;
pub(crate) mod pathname;
pub(crate) mod vfs;
