//! The system calls the VFS makes itself, each as `os_unix.c` makes it:
//! byte-range locks, positional reads and writes on a descriptor, and a
//! created file's mode and owner.
//!
//! - [`oslock`]: open-file-description locks (`F_OFD_SETLK`), behind every
//!   lock on a database file (`locking::inode`) and on its `-shm`
//!   (`wal::shm`);
//! - [`fdio`]: `pread` and `pwrite` on a descriptor, below the cache (a
//!   journal or WAL in shared locking mode, a checkpoint's read-once, the
//!   header a coherence check compares);
//! - [`filemode`]: the permissions and owner of a file the VFS creates
//!   (`findCreateFileMode`, `robust_open`'s `fchmod`, `robustFchown`).
//!
//! Invariants (each file's notes say how):
//! - nothing here waits on another process: a lock conflict is an error
//!   the caller turns into `SQLITE_BUSY`;
//! - a short read means the file ended, and a write writes every byte or
//!   fails;
//! - a mode is forced only on a file empty when opened, an owner only by
//!   root.
//!
//! Why a room of their own, below every room but `sqlite` (`filemode`
//! reads SQLite's open flags and returns its result codes): by subject
//! `oslock` is locking's, `fdio` the I/O paths' and `filemode` the
//! boundary's (`xOpen`'s), but `wal` uses all three (the `-shm`'s lock
//! slots, mode and owner; a database header's `pread`) and sits below
//! `locking`, `io` and `boundary`, so they were moved down below it. No
//! file here imports another.

pub(crate) mod fdio;
pub(crate) mod filemode;
pub(crate) mod oslock;
