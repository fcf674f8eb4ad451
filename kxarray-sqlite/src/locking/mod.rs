//! SQLite's locks on a file, across the process's handles and against
//! other processes, and the per-file state they guard.
//!
//! - [`inode`]: [`Inode`](inode::Inode), one per `(st_dev, st_ino)`,
//!   shared by every open of the file, and the process-wide table that
//!   finds it: SQLite's five lock levels in shared locking mode
//!   (`os_unix.c`'s protocol, on OFD locks on the unix VFS's bytes) or in
//!   exclusive mode (one OFD lock over all of them), the file's one
//!   `CachedFile`, its coherence state and its WAL index (their rules are
//!   `wal`'s); its tests are `inode/tests.rs`;
//! - [`hold`]: a journal or WAL cached in shared locking mode while its
//!   database is held EXCLUSIVE under `locking_mode=EXCLUSIVE` (its I/O is
//!   `io::heldio`).
//!
//! Invariants (each file's notes say how):
//! - at most one `Inode` per `(st_dev, st_ino)`, present while a handle
//!   has it open, and it leaves the table, its locks released, under the
//!   table's lock; a forked child starts with an empty table;
//! - shared mode: the OFD locks held on the inode's descriptor are exactly
//!   those of its level (the highest of its handles'), and at most one
//!   handle is above SHARED; exclusive mode: one whole-range OFD lock from
//!   the first lock until the last handle closes;
//! - a cached page is never trusted across a lock gap (going from no lock
//!   to SHARED asks `wal::coherence`), and a journal's or WAL's cached page
//!   is served only during the hold it was read or written in.
//!
//! Below `io` (a handle's lock calls are its inode's); above `wal` (an
//! inode owns its `Coherence`, `Shm` and `WalSize` and calls the checks
//! from its lock calls), `sys` and `sqlite`. The OFD lock system call
//! itself is `sys::oslock`, below both this room and `wal`: the `-shm`
//! file's lock slots (`wal::shm`) take it too, so here it would make this
//! room and `wal` import each other. Inside: `inode` sits on `hold`.

pub(crate) mod hold;
pub(crate) mod inode;
