//! The I/O of a journal or WAL in shared locking mode while its database
//! is held EXCLUSIVE under `locking_mode=EXCLUSIVE` (see `hold` for the
//! hold and its invariants): whether a handle's operation takes the cache
//! (`Handle::held`, which makes the cache current at a hold's first
//! operation and drops it after one), and its reads and writes through the
//! cache. Owns no state (the hold's is the inodes' [`Hold`]).
//!
//! Invariant: every write reaches the file before it returns and the cache
//! never holds a dirty page of a journal or WAL, so the file always holds
//! what the cache does (a write that fails forgets the cache's hold).

use crate::io::file::Handle;
use crate::locking::hold::pragma_value;
use crate::locking::hold::Hold;
use crate::locking::inode::Inode;
use crate::sqlite::process::vfs_stats;
use crate::sys::fdio::pread_full;
use std::ffi::CStr;
use std::io;
use std::os::raw::c_char;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Weak;

/// Whether journal or WAL `file` (an `uncached` inode) of database
/// `db` is read and written through the cache now: its database is
/// held. At a hold's first operation the cache forgets the file; a
/// cache that cannot (dirty pages) keeps the descriptor path. Outside
/// a hold, a cache left from one is dropped.
fn cached(file: &Inode, db: Option<&Hold>) -> bool {
    let held = db.and_then(Hold::held);
    let seen = file.hold.seen();
    match held {
        Some(e) if e == seen => true,
        Some(e) => {
            let ok = file.file.revalidate().is_ok();
            file.hold.set_seen(if ok { e } else { 0 });
            ok
        }
        None => {
            if seen != 0 && file.file.revalidate().is_ok() {
                file.hold.set_seen(0);
            }
            false
        }
    }
}

/// Read a held journal or WAL through the cache. A checkpoint's read of
/// WAL frames (`checkpointing`: each is read once, then written to the
/// database) goes to the file instead: it holds every byte, all written
/// through.
///
/// # Errors
/// The read's error.
fn read(file: &Inode, buf: &mut [u8], off: u64, checkpointing: bool) -> io::Result<usize> {
    let v = vfs_stats();
    if checkpointing {
        v.uncached_reads.fetch_add(1, Ordering::Relaxed);
        return pread_full(&file.fd, buf, off);
    }
    v.held_reads.fetch_add(1, Ordering::Relaxed);
    if off.saturating_add(buf.len() as u64) > file.file.len() {
        // Appended to since the cache took the length (see `write`).
        if let Err(e) = file.file.refresh_len() {
            file.hold.forget();
            return Err(e);
        }
    }
    file.file.read_at(buf, off)
}

/// Write to a held journal or WAL: with `pwrite` on its descriptor, then
/// the cache's clean pages of the part before the length it knows dropped
/// (`CachedFile::revalidate_range`). An append past that length costs
/// nothing more: the cache holds nothing there but the zeros it made up
/// past the end in the folio holding it, and a read reaching past the
/// length first takes the file's (`CachedFile::refresh_len`, which drops
/// that folio). The cache never holds a dirty page of the file, so nothing
/// it holds can ever be written back over what another process writes
/// after the hold. When the write or the drop fails the cache is forgotten
/// ([`Hold::forget`](crate::locking::hold::Hold::forget)): the next operation
/// starts over from the file.
///
/// # Errors
/// The write's error, or the cache's after the bytes reached the file.
fn write(file: &Inode, data: &[u8], off: u64) -> io::Result<()> {
    let end = off.saturating_add(data.len() as u64).min(file.file.len());
    let w = file.fd.write_all_at(data, off);
    // After the write: a page cached from here on reads the new bytes.
    let c = if off < end && file.file.cached_pages() > 0 {
        file.file.revalidate_range(off..end).map(drop)
    } else {
        Ok(())
    };
    if w.is_err() || c.is_err() {
        file.hold.forget();
    }
    w.and(c)
}

impl Handle {
    /// `SQLITE_FCNTL_PRAGMA` `name` with `args`: `locking_mode` with a
    /// value sets the handle's `locking_exclusive` and updates the hold
    /// (SQLite then runs the pragma itself).
    ///
    /// # Safety
    /// - `args` is the `char*[3]` SQLite passes with the opcode: slot 2 is
    ///   NULL or a NUL-terminated string.
    pub(crate) unsafe fn note_locking_mode(&mut self, name: &str, args: *mut *mut c_char) {
        if !name.eq_ignore_ascii_case("locking_mode") {
            return;
        }
        // SAFETY: per the caller, slot 2 exists ...
        let slot = unsafe { args.add(2) };
        // SAFETY: ... and is readable.
        let zarg = unsafe { *slot };
        if zarg.is_null() {
            return;
        }
        // SAFETY: per the caller, a non-NULL argument is NUL-terminated.
        let arg = unsafe { CStr::from_ptr(zarg) }.to_string_lossy();
        if let Some(x) = pragma_value(name, Some(&arg)) {
            self.locking_exclusive = x;
            self.update_hold();
        }
    }

    /// A database in shared mode: start or end the hold of its journal and
    /// WAL ([`Hold::update`](crate::locking::hold::Hold::update)) after a lock change or `locking_mode`.
    pub(crate) fn update_hold(&mut self) {
        if self.inode.is_db && !self.inode.exclusive {
            let (level, x) = (self.level, self.locking_exclusive);
            self.inode.hold.update(&mut self.holding, level, x);
        }
    }

    /// Whether a journal or WAL in shared mode is read and written through
    /// the cache now (its database held, `cached`; the database's hold read
    /// through `db_hold`: one load, no reference taken).
    pub(crate) fn held(&self) -> bool {
        cached(&self.inode, self.db_hold.as_deref())
    }

    /// Whether this journal's or WAL's database is checkpointing.
    pub(crate) fn db_checkpointing(&self) -> bool {
        self.db
            .as_ref()
            .and_then(Weak::upgrade)
            .is_some_and(|d| d.checkpointing.load(Ordering::Relaxed))
    }

    /// Write to a journal or WAL in shared mode with `pwrite`, the cache
    /// made to match while held ([`write()`]).
    ///
    /// # Errors
    /// The write's error.
    pub(crate) fn write_shared(&self, data: &[u8], off: u64) -> io::Result<()> {
        if self.held() {
            write(&self.inode, data, off)
        } else {
            crate::sys::fdio::pwrite_all(&self.inode.fd, data, off)
        }
    }

    /// Truncate a journal or WAL in shared mode on its descriptor; a held
    /// cache takes the new length at its next operation.
    ///
    /// # Errors
    /// `ftruncate`'s error.
    pub(crate) fn truncate_shared(&self, size: u64) -> io::Result<()> {
        self.inode.hold.forget();
        self.inode.fd.set_len(size)
    }

    /// Read a held journal or WAL ([`read`]).
    ///
    /// # Errors
    /// The read's error.
    pub(crate) fn held_read(
        &self,
        buf: &mut [u8],
        off: u64,
        checkpointing: bool,
    ) -> io::Result<usize> {
        read(&self.inode, buf, off, checkpointing)
    }
}
