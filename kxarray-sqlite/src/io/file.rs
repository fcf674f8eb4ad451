//! One open file of the VFS: [`Handle`] (what a `sqlite3_file` points to)
//! and the `sqlite3_io_methods` callbacks over it.
//!
//! Owns the per-handle state (lock level, fetched folios, WAL-index
//! attachment, chunk size, mmap limit) and the translation of SQLite's file
//! operations into [`CachedFile`](kxarray::pagecache::CachedFile) calls.
//!
//! Invariants:
//! - write-through for journals and WALs: when `xWrite` returns
//!   `SQLITE_OK` the bytes are in the backing file (written from SQLite's
//!   buffer, not yet synced: `CachedFile::write_through`) and every read
//!   through the cache sees them (the folios it holds took them too); a main database's writes reach the
//!   file by SQLite's next sync point for it ([`WritePolicy::AtSyncPoint`]:
//!   `SQLITE_FCNTL_SYNC`, which SQLite sends at every rollback-journal
//!   commit before it finalizes the journal, even with `synchronous=OFF`;
//!   `SQLITE_FCNTL_CKPT_DONE` after a checkpoint's writes, before the WAL
//!   may be reset; `xSync`; leaving a write lock; close). So at every point
//!   where SQLite relies on bytes being in the file (a journal or WAL that
//!   commits, a database page whose journal or WAL copy may go), they are,
//!   as with the unix VFS, and a process killed at any moment recovers to
//!   the same transactions; `xSync` adds the `fdatasync`;
//! - a WAL's frames land inside its file, grown ahead of them
//!   ([`WalSize`](crate::wal::walsize::WalSize)), so each is written through
//!   from SQLite's buffer with one copy; SQLite sees the length it wrote;
//! - a checkpoint (between `SQLITE_FCNTL_CKPT_START` and `CKPT_DONE`)
//!   reads WAL frames the cache does not hold straight from the file
//!   ([`read_uncached`]: the file has every WAL byte, all written through)
//!   and, over a buffered database file, writes its pages through too
//!   (grown first to the final size SQLite hints): each frame is read once
//!   and each page written once, as the unix VFS does, instead of filling
//!   fresh folios twice. Which path is a hint's choice; both return the
//!   same bytes and leave the same file;
//! - every pointer `xFetch` handed out stays valid and unchanged until the
//!   `xUnfetch` of that very pointer (or `xUnfetch(p = NULL)`, or close),
//!   and a page is served from a held reference only while it is current:
//!   [`Fetches`] owns both;
//! - a journal or WAL never lets go of its contents (deleted, truncated,
//!   its header rewritten) while its database, open in this process, holds
//!   pages it could not write back ([`db_barrier`]): SQLite ignores a
//!   failed write-back after a checkpoint under `synchronous=OFF`, and the
//!   WAL is then the only copy of what it committed;
//! - in shared mode a journal or WAL is read through the cache only while
//!   its database is held EXCLUSIVE under `locking_mode=EXCLUSIVE`
//!   (`hold`, `heldio`), else with `pread`/`pwrite` on its descriptor;
//! - a callback never unwinds into C: the bodies catch panics
//!   ([`guard`]) and report `SQLITE_IOERR`.

use crate::io::children::Children;
use crate::io::fetch::Fetches;
use crate::io::pattern::{self, Pattern};
use crate::locking::inode::{self, Inode, Key, WritePolicy};
use crate::sqlite::config::Settings;
use crate::sqlite::ffi::*;
use crate::sqlite::process::{api, vfs_stats};
use crate::wal::shm::ShmHandle;
use kxarray::pagecache::{PageCache, ReadFlags};
use std::io;
use std::os::raw::{c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

mod fcntl;

/// The page size of the cache's folios.
const PAGE: i64 = kxarray::filemap::PAGE_SIZE as i64;
/// The sector size reported to SQLite (as the unix VFS does).
const SECTOR_SIZE: c_int = 4096;

/// The `sqlite3_file` this VFS fills in: the base, then a pointer to the
/// handle (SQLite allocates `szOsFile` bytes and never looks past `base`).
#[repr(C)]
pub(crate) struct KxFile {
    pub(crate) base: sqlite3_file,
    pub(crate) handle: *mut Handle,
}

/// The state of one open file.
pub(crate) struct Handle {
    pub(crate) inode: Arc<Inode>,
    /// The inode's key in the process table (`None` for a temporary file,
    /// which no other handle can open).
    pub(crate) key: Option<Key>,
    pub(crate) cache: PageCache,
    owner: u64,
    pub(crate) level: c_int,
    pub(crate) settings: Settings,
    /// `PRAGMA mmap_size` as SQLite last set it (0: no fetch).
    mmap_limit: i64,
    /// The pages `xFetch` lent SQLite, and the hot pages held for it.
    fetches: Fetches,
    /// The reads' pattern (sequential or not), for the readahead hint.
    pattern: Pattern,
    /// Bytes this handle still reads as a bulk read SQLite announced
    /// (`PRAGMA integrity_check` or `quick_check` of a database larger than
    /// a quarter of the cache): read without being kept (0: none).
    bulk: u64,
    /// A database over `O_DIRECT` with `kx_prefetch` on: the interior
    /// pages' children a scan will read.
    children: Option<Children>,
    /// Fetches, fallbacks and fetches of held pages not yet added to the process's counters: a
    /// shared counter bumped on every fetch cost a cache-line transfer per
    /// page between two connections' threads. Added every
    /// [`COUNT_BATCH`] fetches, at `PRAGMA kx_stats` and at close.
    unbooked: (u64, u64, u64),
    shm: Option<ShmHandle>,
    chunk: i64,
    psow: bool,
    persist_wal: bool,
    /// The directory to `fsync` at the first `xSync` (a journal or WAL
    /// opened with `SQLITE_OPEN_CREATE`, as the unix VFS does).
    pub(crate) dirsync: Option<PathBuf>,
    /// Whether SQLite opened it read-only (or the file could not be opened
    /// for writing): its writes fail with `SQLITE_READONLY`.
    pub(crate) readonly: bool,
    /// The database this journal or WAL belongs to, when the process has
    /// it open ([`db_barrier`]).
    pub(crate) db: Option<Weak<Inode>>,
    /// Its database's hold (`hold`), read at every operation.
    pub(crate) db_hold: Option<Arc<crate::locking::hold::Hold>>,
    /// A main database opened with `readonly_shm=1`: its `-shm` is opened
    /// read-only.
    pub(crate) readonly_shm: bool,
    /// A database: `PRAGMA locking_mode=EXCLUSIVE` set, and whether this
    /// handle started the hold that is on (`hold`).
    pub(crate) locking_exclusive: bool,
    pub(crate) holding: bool,
    /// The `errno` of the handle's last failed operation
    /// (`SQLITE_FCNTL_LAST_ERRNO`).
    pub(crate) last_errno: std::cell::Cell<c_int>,
}

/// How many fetches a handle counts before adding them to the process's
/// counters (another connection's `PRAGMA kx_stats` may lag by fewer).
const COUNT_BATCH: u64 = 1024;

impl Handle {
    /// Count a fetch: served (`held`: from a held hot page), or fallen
    /// back to `xRead` (`None`).
    #[inline]
    fn count_fetch(&mut self, served: Option<bool>) {
        let u = &mut self.unbooked;
        match served {
            Some(held) => {
                u.0 += 1;
                u.2 += u64::from(held);
            }
            None => u.1 += 1,
        }
        if u.0 + u.1 >= COUNT_BATCH {
            self.book_fetches();
        }
    }

    /// Note a read (`xRead`, or a page `xFetch` serves) in the handle's
    /// pattern: a scan starting hints the cache to read ahead
    /// sequentially, its end hands readahead back to the cache's own
    /// detection. A hint is advice: its error is not the read's.
    /// The common case (no hint: a point lookup, or a scan under way) is
    /// two inlined checks; giving hints is out of line.
    #[inline]
    fn note_read(&mut self, off: u64, len: u64) {
        let mode = self.pattern.on_read(off, len);
        let ahead = self.pattern.ahead();
        if mode.is_some() || ahead.is_some() {
            pattern::give(&self.inode.file, &self.inode.path, [mode, ahead]);
        }
    }

    /// Whether this handle's reads should pass the cache by now
    /// ([`ReadFlags::NOREUSE`]): a bulk read SQLite announced, or a scan
    /// (the handle's reads run forward) of a file larger than the cache,
    /// which a second scan would not find cached either. Over `O_DIRECT`
    /// the cache reads ahead into folios instead (no read passes by).
    /// Pages the cache holds are read from it either way, and a page
    /// passed by that is read again soon is admitted (the cache's rule).
    #[inline]
    fn noreuse(&self) -> bool {
        (self.bulk > 0 || self.pattern.is_sequential())
            && !self.inode.direct
            && (self.bulk > 0 || self.inode.file.len() > self.cache.capacity())
    }

    /// The flags of this handle's next read of `len` bytes (`noreuse`),
    /// counting it against a bulk read's bytes.
    #[inline]
    fn read_flags(&mut self, len: u64) -> ReadFlags {
        if !self.noreuse() {
            return ReadFlags::empty();
        }
        self.bulk = self.bulk.saturating_sub(len);
        ReadFlags::NOREUSE
    }

    /// `SQLITE_FCNTL_PRAGMA` `name`: `integrity_check` and `quick_check`
    /// read every page of the database once, so a database larger than a
    /// quarter of the cache (PostgreSQL's threshold for a bulk read's ring)
    /// is read without being kept, for as many bytes as the file holds:
    /// SQLite tells a VFS when such a pragma is parsed, not when it ends.
    fn note_bulk(&mut self, name: &str) {
        let bulk = name.eq_ignore_ascii_case("integrity_check")
            || name.eq_ignore_ascii_case("quick_check");
        let len = self.inode.file.len();
        if bulk && self.inode.is_db && len > self.cache.capacity() / 4 {
            self.bulk = len;
        }
    }

    /// Whether a read is a checkpoint's read of WAL frames while the cache
    /// holds none of the WAL: read once (the frame's page is written to the
    /// database next), so read straight from the file ([`read_uncached`])
    /// rather than filled into the cache and copied out again.
    #[inline]
    fn read_once(&self) -> bool {
        self.inode.wal.is_some()
            && self.inode.file.cached_pages() == 0
            && self
                .db
                .as_ref()
                .and_then(Weak::upgrade)
                .is_some_and(|d| d.checkpointing.load(Ordering::Relaxed))
    }

    /// Add this handle's uncounted fetches to the process's counters.
    fn book_fetches(&mut self) {
        let (f, b, h) = std::mem::take(&mut self.unbooked);
        let v = vfs_stats();
        for (n, c) in [
            (f, &v.fetches),
            (b, &v.fetch_fallbacks),
            (h, &v.fetches_held),
        ] {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn new(
        inode: Arc<Inode>,
        key: Option<Key>,
        cache: PageCache,
        settings: Settings,
        psow: bool,
        readonly: bool,
    ) -> Handle {
        // Over O_DIRECT the handle runs ahead of a scan (the kernel reads
        // nothing ahead below the cache), by at most an eighth of the cache.
        let ahead = if inode.direct {
            pattern::AHEAD.min(cache.capacity() / 8)
        } else {
            0
        };
        let pattern = Pattern::new(ahead);
        let children = (inode.direct && inode.is_db && settings.prefetch).then(Children::default);
        Handle {
            inode,
            key,
            cache,
            owner: inode::next_owner(),
            level: SQLITE_LOCK_NONE,
            settings,
            mmap_limit: 0,
            fetches: Fetches::new(),
            pattern,
            bulk: 0,
            children,
            unbooked: (0, 0, 0),

            shm: None,
            chunk: 0,
            psow,
            persist_wal: false,
            dirsync: None,
            readonly,
            db: None,
            db_hold: None,
            readonly_shm: false,
            locking_exclusive: false,
            holding: false,
            last_errno: std::cell::Cell::new(0),
        }
    }
}

/// The methods of every file this VFS opens.
pub(crate) static METHODS: sqlite3_io_methods = sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(fcntl::x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// Run a callback body, turning a panic into `SQLITE_IOERR` (a panic must
/// not unwind into SQLite's C frames).
pub(crate) fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(SQLITE_IOERR)
}

/// The handle behind a file SQLite passes to a method.
///
/// # Safety
/// - `file` is a `KxFile` this VFS's `xOpen` filled in successfully and
///   that is not closed yet; SQLite calls a file's methods from one thread
///   at a time, so no other `&mut` to the handle exists during the call.
unsafe fn handle<'a>(file: *mut sqlite3_file) -> &'a mut Handle {
    debug_assert!(!file.is_null());
    // SAFETY: per the caller, `file` is a live `KxFile`.
    let boxed = unsafe { (*file.cast::<KxFile>()).handle };
    // SAFETY: its `handle` is the `Box<Handle>` xOpen leaked, used by this
    // call alone.
    unsafe { &mut *boxed }
}

/// Write back what this file holds dirty in `range` to the backing file,
/// without an fsync (`CachedFile::write_back`, the kernel's
/// `sync_file_range`): the bytes then survive this process.
fn write_back(h: &Handle, range: std::ops::Range<u64>) -> io::Result<()> {
    h.inode.file.write_back(range)
}

/// Write back the database `db` before one of its journal's or WAL's
/// contents may go (see the module notes). Does nothing for a database
/// whose writes stay in the cache by design (the crash test's knob).
///
/// # Errors
/// The write-back error: pages of the database are still only in the
/// cache, and the journal or WAL may hold their only other copy.
pub(crate) fn db_barrier(db: &Inode) -> io::Result<()> {
    if db.policy != WritePolicy::AtSyncPoint || crate::sqlite::process::write_back_only() {
        return Ok(());
    }
    db.file.write_back(0..u64::MAX)
}

/// [`db_barrier`] for the database of journal or WAL handle `h`, as
/// SQLite's code for `op`.
fn barrier(h: &Handle, code: c_int) -> c_int {
    let Some(db) = h.db.as_ref().and_then(Weak::upgrade) else {
        return SQLITE_OK;
    };
    match db_barrier(&db) {
        Ok(()) => SQLITE_OK,
        Err(e) => io_code(
            h,
            "keeping the journal or WAL: its database's pages could not be written back; at",
            &e,
            code,
        ),
    }
}

/// A sync point of a database (`SQLITE_FCNTL_SYNC`, `CKPT_DONE`, leaving a
/// write lock): its deferred writes reach the backing file.
fn sync_point(h: &Handle) -> c_int {
    if h.inode.policy != WritePolicy::AtSyncPoint || crate::sqlite::process::write_back_only() {
        return SQLITE_OK;
    }
    match write_back(h, 0..u64::MAX) {
        Ok(()) => SQLITE_OK,
        Err(e) => io_code(h, "write back", &e, SQLITE_IOERR_WRITE),
    }
}

/// Map an I/O error to SQLite's code for the operation (`ENOSPC` is
/// `SQLITE_FULL`), logging it with the file's path.
fn io_code(h: &Handle, op: &str, e: &io::Error, code: c_int) -> c_int {
    let errno = crate::sqlite::lasterror::errno_of(e);
    let code = if errno == libc::ENOSPC {
        SQLITE_FULL
    } else {
        code
    };
    let msg = format!("kxarray: {op} {}: {e}", h.inode.path.display());
    failed(h, errno, &msg);
    api().log(code, &msg);
    code
}

/// Record a failure of handle `h` (`errno`, 0 when no system call failed)
/// as its last errno and the thread's last error (`lasterror`).
fn failed(h: &Handle, errno: c_int, msg: &str) {
    h.last_errno.set(errno);
    crate::sqlite::lasterror::set_last_error(errno, msg);
}

/// A lock method's failure (its errno noted by `inode`): recorded, logged.
fn lock_failed(h: &Handle, code: c_int, msg: &str) -> c_int {
    failed(h, crate::sqlite::lasterror::last_errno(), msg);
    api().log(code, msg);
    code
}

unsafe extern "C" fn x_close(file: *mut sqlite3_file) -> c_int {
    guard(|| {
        // SAFETY: SQLite closes a file it opened through this VFS, once;
        // the Box was leaked by xOpen and is reclaimed here only.
        let kf = unsafe { &mut *file.cast::<KxFile>() };
        // SAFETY: as above: the pointer came from Box::into_raw.
        let mut h = unsafe { Box::from_raw(kf.handle) };
        kf.handle = std::ptr::null_mut();
        kf.base.pMethods = std::ptr::null();
        let rc = sync_point(&h);
        let mut level = h.level;
        if let Err((code, msg)) = h.inode.unlock(h.owner, &mut level, SQLITE_LOCK_NONE) {
            api().log(code, &msg);
        }
        h.level = level;
        h.update_hold();
        h.fetches.clear();
        h.book_fetches();
        if let Some(s) = h.shm.take() {
            h.inode.unmap_shm(s, false);
        }
        let Handle { inode, key, .. } = *h;
        inode::close(key, inode);
        rc
    })
}

unsafe extern "C" fn x_read(
    file: *mut sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let (Ok(n), Ok(off)) = (usize::try_from(amt), u64::try_from(off)) else {
            return SQLITE_IOERR_READ;
        };
        // SAFETY: SQLite passes a buffer of `amt` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
        if let Err(rc) = h.inode.recheck_wal(h.shm.as_mut(), SQLITE_IOERR_READ) {
            return rc;
        }
        // A WAL reads as far as SQLite wrote (its file is grown ahead).
        let want = h.inode.wal.as_ref().map_or(n, |w| w.readable(off, n));
        if want < n {
            out[want..].fill(0);
        }
        let read = if h.inode.uncached {
            if h.held() {
                h.held_read(out, off, h.db_checkpointing())
            } else {
                read_fd(h, out, off)
            }
        } else if h.lockless() {
            h.lockless_read(&mut out[..want], off)
        } else if h.read_once() {
            read_uncached(h, &mut out[..want], off)
        } else {
            h.note_read(off, n as u64);
            let flags = h.read_flags(n as u64);
            h.inode.file.read_at_with(&mut out[..want], off, flags)
        };
        if let (Ok(got), Some(c)) = (&read, h.children.as_mut()) {
            if *got == n && n >= 512 && n.is_power_of_two() && off % n as u64 == 0 {
                let pages = h.inode.file.len() / n as u64;
                let pgno = u32::try_from(off / n as u64 + 1).unwrap_or(0);
                for (at, len) in c.on_read(pgno, out, pages) {
                    if pattern::advise(&h.inode.file, pattern::Hint::WillNeed(at, len)).is_err() {
                        break;
                    }
                }
            }
        }
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR_READ, "xRead") {
            return rc;
        }
        match read {
            Ok(got) if got == n => SQLITE_OK,
            Ok(got) => {
                // SQLite requires the rest zeroed on a short read.
                out[got..].fill(0);
                SQLITE_IOERR_SHORT_READ
            }
            Err(e) => io_code(h, "read", &e, SQLITE_IOERR_READ),
        }
    })
}

/// Read `buf.len()` bytes at `off` of a file's descriptor (fewer at its
/// end): a journal or WAL in shared mode (`Inode::uncached`).
fn read_fd(h: &Handle, buf: &mut [u8], off: u64) -> io::Result<usize> {
    crate::sys::fdio::pread_full(&h.inode.fd, buf, off)
}

/// Read a WAL's bytes straight from its file with `pread`, as the unix VFS
/// does ([`Handle::read_once`]). The file holds what the cache would
/// return: every WAL write is written through before `xWrite` returns, and
/// the only bytes the cache can hold newer than the file are a failed
/// write-through's, kept in cached (dirty) folios, and this read is taken
/// only while the cache holds none of the WAL; a folio cached after that
/// check holds a later frame's write, never the committed frames a
/// checkpoint reads.
fn read_uncached(h: &Handle, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let got = read_fd(h, buf, off)?;
    vfs_stats().uncached_reads.fetch_add(1, Ordering::Relaxed);
    Ok(got)
}

unsafe extern "C" fn x_write(
    file: *mut sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let (Ok(n), Ok(off)) = (usize::try_from(amt), u64::try_from(off)) else {
            return SQLITE_IOERR_WRITE;
        };
        if h.readonly {
            return SQLITE_READONLY;
        }
        if off == 0 && h.db.is_some() {
            // A journal's or WAL's header is rewritten: a new journal, or a
            // WAL restarting over frames a checkpoint copied.
            let rc = barrier(h, SQLITE_IOERR_WRITE);
            if rc != SQLITE_OK {
                return rc;
            }
        }
        // SAFETY: SQLite passes `amt` readable bytes.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
        if let Err(e) = h.inode.note_write(data, off) {
            return io_code(h, "write", &e, SQLITE_IOERR_WRITE);
        }
        // A held reference to a folio written here would make the write
        // copy the folio: let go of them first (by the folio each holds,
        // which may be larger than SQLite's page).
        h.fetches
            .forget(off / PAGE as u64, (off + n as u64).div_ceil(PAGE as u64));
        // Write-through for journals and WALs: the bytes reach the backing
        // file before xWrite returns (see the module notes), written from
        // SQLite's buffer (`write_through`: one copy, the kernel's; the
        // folios the cache holds for the range take the bytes too). A
        // main database waits for SQLite's next sync point, a temporary
        // file for the cache's own writeback.
        // A WAL's frames land inside its file, grown ahead (`walsize`). A
        // checkpoint's database pages, over a buffered file, are written
        // through as well: written once, and the kernel caches them.
        if h.inode.uncached {
            if let Err(e) = h.write_shared(data, off) {
                return io_code(h, "write", &e, SQLITE_IOERR_WRITE);
            }
            vfs_stats().writes.fetch_add(1, Ordering::Relaxed);
            return crate::io::fault::write_fault().unwrap_or(SQLITE_OK);
        }
        // A database written by a handle that never locks is written
        // through: it has no sync point of its own (`lockless`).
        if h.lockless() && h.inode.policy == WritePolicy::AtSyncPoint {
            if let Err(e) = h.lockless_write(data, off) {
                return io_code(h, "write", &e, SQLITE_IOERR_WRITE);
            }
            vfs_stats().writes.fetch_add(1, Ordering::Relaxed);
            return crate::io::fault::write_fault().unwrap_or(SQLITE_OK);
        }
        let through = h.inode.policy == WritePolicy::Through
            || (h.inode.checkpointing.load(Ordering::Relaxed) && !h.inode.direct);
        if through && !crate::sqlite::process::write_back_only() {
            let r = match &h.inode.wal {
                Some(w) => w.write(&h.inode.file, data, off),
                None => h.inode.file.write_through(data, off).map(drop),
            };
            if let Err(e) = r {
                return io_code(h, "write through", &e, SQLITE_IOERR_WRITE);
            }
        } else if let Err(e) = h.inode.file.write_at(data, off) {
            return io_code(h, "write", &e, SQLITE_IOERR_WRITE);
        }
        vfs_stats().writes.fetch_add(1, Ordering::Relaxed);
        crate::io::fault::write_fault().unwrap_or(SQLITE_OK)
    })
}

unsafe extern "C" fn x_truncate(file: *mut sqlite3_file, size: i64) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR_TRUNCATE, "xTruncate") {
            return rc;
        }
        if let Err(e) = h.inode.note_change() {
            return io_code(h, "truncate", &e, SQLITE_IOERR_TRUNCATE);
        }
        let mut size = size;
        if h.chunk > 0 {
            // As the unix VFS: round up to the chunk size.
            size = (size + h.chunk - 1) / h.chunk * h.chunk;
        }
        let Ok(size) = u64::try_from(size) else {
            return SQLITE_IOERR_TRUNCATE;
        };
        h.fetches.forget_all();
        if h.db.is_some() {
            let rc = barrier(h, SQLITE_IOERR_TRUNCATE);
            if rc != SQLITE_OK {
                return rc;
            }
        }
        let r = match &h.inode.wal {
            _ if h.inode.uncached => h.truncate_shared(size),
            Some(w) => w.truncate(&h.inode.file, size),
            None => h.inode.file.set_len(size),
        };
        match r {
            Ok(()) => SQLITE_OK,
            Err(e) => io_code(h, "truncate", &e, SQLITE_IOERR_TRUNCATE),
        }
    })
}

/// `fsync` a directory (after creating a journal or WAL in it).
fn sync_dir(dir: &std::path::Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

unsafe extern "C" fn x_sync(file: *mut sqlite3_file, _flags: c_int) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        // Write back what this file holds dirty (a database's writes since
        // its last sync point, another thread's write in flight), then
        // make it durable with fdatasync, as the unix VFS does on Linux
        // (`sync_data`: `sync` would run fsync, which also commits the
        // inode's timestamps, a journal commit per transaction the unix
        // VFS does not pay). An injected fault fails it before anything is
        // written back (`fault`).
        if let Some(rc) = crate::io::fault::sync_fault() {
            return rc;
        }
        let r = if h.inode.uncached {
            h.inode.fd.sync_data()
        } else {
            h.inode.file.sync_data()
        };
        if let Err(e) = r {
            return io_code(h, "write back and fdatasync", &e, SQLITE_IOERR_FSYNC);
        }
        if let Some(dir) = h.dirsync.take() {
            if let Err(e) = sync_dir(&dir) {
                return io_code(h, "fsync of the directory of", &e, SQLITE_IOERR_DIR_FSYNC);
            }
        }
        vfs_stats().syncs.fetch_add(1, Ordering::Relaxed);
        SQLITE_OK
    })
}

unsafe extern "C" fn x_file_size(file: *mut sqlite3_file, size: *mut i64) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        if let Err(rc) = h.inode.recheck_wal(h.shm.as_mut(), SQLITE_IOERR_FSTAT) {
            return rc;
        }
        let len = if h.inode.uncached || h.lockless_sized() {
            match h.inode.fd.metadata() {
                Ok(m) => m.len(),
                Err(e) => return io_code(h, "fstat", &e, SQLITE_IOERR_FSTAT),
            }
        } else {
            h.inode.wal.as_ref().map_or(h.inode.file.len(), |w| w.len())
        };
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR_FSTAT, "xFileSize") {
            return rc;
        }
        // SAFETY: SQLite passes a writable i64.
        unsafe { *size = len as i64 };
        SQLITE_OK
    })
}

unsafe extern "C" fn x_lock(file: *mut sqlite3_file, level: c_int) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let (owner, mut cur) = (h.owner, h.level);
        let r = h.inode.lock(owner, &mut cur, level);
        h.level = cur;
        h.update_hold();
        match r {
            Ok(code) => code,
            Err((code, msg)) => lock_failed(h, code, &msg),
        }
    })
}

unsafe extern "C" fn x_unlock(file: *mut sqlite3_file, level: c_int) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let (owner, mut cur) = (h.owner, h.level);
        // Leaving a write lock: a transaction ended (SQLite passed its
        // sync point already; this is the safety net).
        let rc = if cur > SQLITE_LOCK_SHARED {
            sync_point(h)
        } else {
            SQLITE_OK
        };
        let r = h.inode.unlock(owner, &mut cur, level);
        h.level = cur;
        h.update_hold();
        match r {
            Ok(()) => rc,
            Err((code, msg)) => lock_failed(h, code, &msg),
        }
    })
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut sqlite3_file, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        if let Some(rc) =
            crate::io::fault::inject(SQLITE_IOERR_CHECKRESERVEDLOCK, "xCheckReservedLock")
        {
            return rc;
        }
        let (yes, rc) = match h.inode.reserved() {
            Ok(r) => (r, SQLITE_OK),
            Err((code, msg)) => (false, lock_failed(h, code, &msg)),
        };
        // SAFETY: SQLite passes a writable int.
        unsafe { *out = c_int::from(yes) };
        rc
    })
}

unsafe extern "C" fn x_sector_size(_file: *mut sqlite3_file) -> c_int {
    SECTOR_SIZE
}

unsafe extern "C" fn x_device_characteristics(file: *mut sqlite3_file) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        // No ATOMIC, SAFE_APPEND or SEQUENTIAL: a write-back cache over a
        // file keeps none of them. POWERSAFE_OVERWRITE (unless psow=0):
        // writeback writes whole 4 KiB (database) or 512-byte blocks whose
        // bytes outside the written range are the file's own (the cache is
        // the file's only writer and is coherent with it), so a power loss
        // can damage no more than the kernel's page cache, which writes
        // whole pages too and for which the unix VFS claims the same.
        if h.psow {
            SQLITE_IOCAP_POWERSAFE_OVERWRITE
        } else {
            0
        }
    })
}

unsafe extern "C" fn x_shm_map(
    file: *mut sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let (Ok(region), Ok(size)) = (usize::try_from(region), usize::try_from(size)) else {
            return SQLITE_IOERR_SHMMAP;
        };
        // SAFETY: SQLite passes a writable pointer slot.
        unsafe { *out = std::ptr::null_mut() };
        if h.shm.is_none() {
            match h.inode.shm(h.readonly_shm) {
                Ok((s, rc)) => {
                    h.shm = Some(ShmHandle::new(s));
                    if rc != SQLITE_OK {
                        // SQLITE_READONLY_CANTINIT: no region yet.
                        return rc;
                    }
                }
                Err((code, msg)) => {
                    api().log(code, &msg);
                    return code;
                }
            }
        }
        let Some(shm) = h.shm.as_ref() else {
            return SQLITE_IOERR_SHMMAP;
        };
        let (p, rc) = shm.shm.map(region, size, extend != 0);
        // SAFETY: SQLite passes a writable pointer slot.
        unsafe { *out = p };
        rc
    })
}

unsafe extern "C" fn x_shm_lock(
    file: *mut sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let Some(s) = h.shm.as_mut() else {
            return SQLITE_IOERR_SHMMAP;
        };
        h.inode.shm_lock(s, offset, n, flags)
    })
}

unsafe extern "C" fn x_shm_barrier(_file: *mut sqlite3_file) {
    std::sync::atomic::fence(Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(file: *mut sqlite3_file, delete: c_int) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        // The regions go when the last handle of the process lets go; with
        // `delete`, the `-shm` file too (shared mode).
        if let Some(s) = h.shm.take() {
            h.inode.unmap_shm(s, delete != 0);
        }
        SQLITE_OK
    })
}

unsafe extern "C" fn x_fetch(
    file: *mut sqlite3_file,
    off: i64,
    amt: c_int,
    out: *mut *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite passes a writable pointer slot.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        let amt = i64::from(amt);
        if !h.settings.fetch || h.mmap_limit <= 0 || off < 0 || amt <= 0 || h.lockless() {
            return SQLITE_OK;
        }
        if let Err(rc) = h.inode.recheck_wal(h.shm.as_mut(), SQLITE_IOERR_READ) {
            return rc;
        }
        let end = off + amt;
        if end > h.mmap_limit || end as u64 > h.inode.file.len() {
            h.count_fetch(None);
            return SQLITE_OK;
        }
        h.note_read(off as u64, amt as u64);
        if h.noreuse() {
            // A scan or bulk read passing the cache by: SQLite reads the
            // page with xRead (a fetched page would be kept).
            h.count_fetch(None);
            return SQLITE_OK;
        }
        // A database in the shared cache lends nothing (its frames are
        // copied from, never lent): SQLite reads the page with xRead.
        if h.inode.file.is_shared() {
            h.count_fetch(None);
            return SQLITE_OK;
        }
        let file = &h.inode.file;
        match h.fetches.fetch(file, off, amt) {
            Some((p, held)) => {
                h.count_fetch(Some(held));
                // SAFETY: SQLite passes a writable pointer slot; the bytes
                // live in a reference `fetches` keeps until the xUnfetch of
                // this pointer.
                unsafe { *out = p };
            }
            None => h.count_fetch(None),
        }
        SQLITE_OK
    })
}

unsafe extern "C" fn x_unfetch(file: *mut sqlite3_file, off: i64, p: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        if p.is_null() {
            // "Unmap the whole file" (the unix VFS's meaning): SQLite
            // holds no fetched page then (it sent this because another
            // connection committed): the hot pages still current stay.
            h.fetches.release_all();
        } else {
            h.fetches.unfetch(&h.inode.file, off, p.cast_const());
        }
        SQLITE_OK
    })
}
