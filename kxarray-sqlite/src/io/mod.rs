//! A handle's operations: SQLite's `sqlite3_io_methods` on an open file,
//! and the paths they take to the bytes (through the cache, on the
//! descriptor, under a hold, without a lock), with the hints and the fetch
//! table a handle keeps on the way.
//!
//! - [`file`](mod@file): the [`Handle`](file::Handle) (what a
//!   `sqlite3_file` points to) and its callbacks, where each operation
//!   picks its path; `file::fcntl`: the file controls SQLite sends a
//!   handle;
//! - [`heldio`]: a journal's or WAL's reads and writes through the cache
//!   while its database is held EXCLUSIVE under `locking_mode=EXCLUSIVE`
//!   (the hold itself is [`crate::locking::hold`]);
//! - [`lockless`]: a database file a VFS shim opened and never locks,
//!   served as the unix VFS serves it;
//! - [`fetch`]: the pages a handle lent SQLite through `xFetch`, and the
//!   hot pages it holds between fetches;
//! - [`pattern`] and [`children`]: the read side's hints to the cache (the
//!   access pattern and its readahead advice; a scan's B-tree children
//!   prefetched);
//! - [`fault`]: the I/O errors a test injects, at the points of the same
//!   calls where `os_unix.c` injects them (public:
//!   `kxarray_sqlite::fault`);
//! - [`stats`]: the text of `PRAGMA kx_stats` and `kx_settings`, which
//!   `file::fcntl` answers.
//!
//! Invariants (each file's notes say how):
//! - what SQLite relies on is in the file when it relies on it: a
//!   journal's or WAL's write when `xWrite` returns, a database's by its
//!   next sync point, a lockless handle's at once; a journal or WAL lets
//!   go of nothing while its database holds pages it could not write back
//!   ([`file::db_barrier`]);
//! - every path returns the file's bytes: a journal or WAL in shared
//!   locking mode is read through the cache only during a hold, and a hint
//!   (readahead advice, a prefetch) changes what the cache holds, never
//!   what a read returns;
//! - every pointer `xFetch` handed out stays valid and unchanged until the
//!   `xUnfetch` of that pointer, and a held page is served only while it
//!   is current;
//! - a callback never unwinds into C ([`file::guard`]).
//!
//! Below `boundary` (whose `xOpen` makes the handles); above `locking` (a
//! handle's lock level is its inode's), `wal` (a handle's view of the WAL
//! index), `sys` (`pread`/`pwrite` on the descriptor) and `sqlite`. Inside:
//! `heldio` and `lockless` (methods of `Handle`) and `file::fcntl` sit on
//! `file`, which sits on `fetch`, `pattern`, `children` and `fault`.

pub(crate) mod children;
pub mod fault;
pub(crate) mod fetch;
pub(crate) mod file;
pub(crate) mod heldio;
pub(crate) mod lockless;
pub(crate) mod pattern;
pub(crate) mod stats;
