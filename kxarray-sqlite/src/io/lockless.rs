//! A main database file that a VFS shim opened through this VFS and never
//! locks: [`Handle::lockless`] and its I/O.
//!
//! SQLite's multiplex shim (`test_multiplex.c`) splits a database into
//! chunk files, each opened through the VFS below as a main database, and
//! sends `xLock`/`xUnlock` and every file control (`SQLITE_FCNTL_SYNC`
//! included) to chunk 0 only; only `xSync` reaches every chunk. Other
//! shims that open files through the VFS (compression and encryption
//! wrappers) can do the same. A chunk then has neither of the two moments
//! the VFS relies on for a database: no lock gap of its own revalidates
//! its cached pages (another process may have rewritten them between two
//! of this process's transactions), and no sync point of its own writes
//! its deferred pages back (with `synchronous=OFF`, SQLite deletes the
//! journal while they would still be only in this process's cache).
//!
//! So a database handle that holds no lock while no handle of the process
//! holds one on the file is served as the unix VFS serves it: in shared
//! locking mode read with `pread`, sized with `fstat` and written with
//! `pwrite` on the file's descriptor (any cached page of the range is
//! dropped after the write); with `kx_locking=exclusive` (no other process
//! may open the file) read through the cache and written through it.
//! SQLite's own database handles always hold SHARED when they read and
//! RESERVED or above when they write, so they never take these paths
//! except for the header SQLite reads at open, before its first lock.
//!
//! Invariants: a lockless write is in the file when `xWrite` returns; a
//! lockless read in shared mode returns the file's bytes; neither leaves a
//! page in the cache that could be served stale to a handle with a lock
//! (a handle with a lock makes the file not lockless, and its first lock
//! from no lock revalidates the cache, `coherence`).

use crate::io::file::Handle;
use crate::sqlite::ffi::SQLITE_LOCK_NONE;
use std::io;

impl Handle {
    /// Whether this is a main database handle that holds no lock while no
    /// handle of the process holds one on the file (see the module notes).
    #[inline]
    pub(crate) fn lockless(&self) -> bool {
        self.inode.is_db && self.level == SQLITE_LOCK_NONE && !self.inode.any_lock()
    }

    /// Whether its size is the file's (`fstat`), not the cache's: a
    /// lockless handle in shared mode.
    #[inline]
    pub(crate) fn lockless_sized(&self) -> bool {
        !self.inode.exclusive && self.lockless()
    }

    /// A lockless handle's read of `buf.len()` bytes at `off` (fewer at the
    /// end of the file).
    ///
    /// # Errors
    /// The read's error.
    pub(crate) fn lockless_read(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        if self.inode.exclusive {
            return self.inode.file.read_at(buf, off);
        }
        crate::sys::fdio::pread_full(&self.inode.fd, buf, off)
    }

    /// A lockless handle's write: in the file before it returns.
    ///
    /// # Errors
    /// The write's error (the range then holds what the file holds: a
    /// cached page of it is dropped either way).
    pub(crate) fn lockless_write(&self, data: &[u8], off: u64) -> io::Result<()> {
        let file = &self.inode.file;
        if self.inode.exclusive {
            return file.write_through(data, off).map(drop);
        }
        let r = crate::sys::fdio::pwrite_all(&self.inode.fd, data, off);
        if file.cached_pages() > 0 {
            let end = off.saturating_add(data.len() as u64);
            file.revalidate_range(off..end)?;
        }
        r
    }
}
