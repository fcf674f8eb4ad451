//! One file as the process sees it: [`Inode`], shared by every open of the
//! same file (the same `(st_dev, st_ino)`), like `os_unix.c`'s
//! `unixInodeInfo`; and the process-wide table that finds it.
//!
//! Owns the file's one [`CachedFile`] (every connection of the process
//! reads and writes the same cached pages, so they stay coherent), SQLite's
//! five lock levels across those connections and the OFD locks that say
//! them to other processes, the coherence state of the cache
//! ([`Coherence`]), and the WAL index ([`Shm`]) of a database.
//!
//! Two locking modes, chosen by the first open of the file (`kx_locking`):
//! - **shared** (the default), `os_unix.c`'s protocol: OFD locks
//!   ([`oslock`]) on the inode's descriptor, on exactly the unix VFS's
//!   bytes, taken and released with `unixLock`/`posixUnlock`'s steps
//!   (SHARED: read-lock `PENDING_BYTE`, read-lock the 510-byte shared
//!   range, release `PENDING_BYTE`; RESERVED: write-lock `RESERVED_BYTE`;
//!   EXCLUSIVE: write-lock `PENDING_BYTE`, then the shared range; down to
//!   SHARED: read-lock the shared range, release PENDING and RESERVED; to
//!   NONE: release all). They conflict with the unix VFS's POSIX locks, so
//!   kxarray and unix-VFS processes exclude each other as two unix-VFS
//!   processes do, and get `SQLITE_BUSY` where it would;
//! - **exclusive** (`kx_locking=exclusive`): one OFD lock over all of
//!   SQLite's lock bytes, taken at the first lock and held until the last
//!   handle closes; other processes get `SQLITE_BUSY`; the levels are kept
//!   in the process only.
//!
//! Invariants:
//! - the table holds at most one `Inode` per `(st_dev, st_ino)`, present
//!   while at least one handle has it open (`opens > 0`, counted under the
//!   table's lock); the `Inode` keeps a descriptor of the file open, so the
//!   inode number cannot be reused while the entry exists. A child process
//!   after `fork` starts with an empty table (the parent's inodes, their
//!   descriptors and their OFD locks are the parent's: never used, never
//!   closed by the child);
//! - shared mode: `level` is the highest level of any handle (as
//!   `unixInodeInfo.eFileLock`), `shared` the handles at SHARED or above,
//!   and the OFD locks held on the descriptor are exactly those of `level`;
//!   at most one handle is above SHARED;
//! - exclusive mode: `shared` counts the handles at SHARED or above; at
//!   most one handle owns each of RESERVED, PENDING and EXCLUSIVE;
//!   EXCLUSIVE is granted only when its owner is the only SHARED holder;
//!   no new SHARED is granted while PENDING or EXCLUSIVE is owned; the
//!   whole-range OFD lock (`F_WRLCK` whenever the file could be opened
//!   read-write; `F_RDLCK`, never over a WAL database, otherwise) is held
//!   from the first lock until the last handle closes;
//! - a cached page is never trusted across a lock gap: when the process
//!   goes from no lock to SHARED, [`Coherence::after_gap`] compares the
//!   file (read from the file, not the cache) with what the cache last
//!   knew, and drops the cache if it moved (another process may have
//!   written between); in WAL mode the WAL index decides at every read
//!   transaction (`coherence`);
//! - an inode leaves the table, and its locks are released, under the
//!   table's lock: an open racing the last close finds either the old inode
//!   (and keeps it) or none and no lock of the process's own in its way.

use crate::locking::hold::Hold;
use crate::sqlite::config::Settings;
use crate::sqlite::ffi::{
    LOCK_RANGE_LEN, PENDING_BYTE, RESERVED_BYTE, SHARED_FIRST, SHARED_SIZE, SQLITE_BUSY,
    SQLITE_CANTOPEN, SQLITE_IOERR_CHECKRESERVEDLOCK, SQLITE_IOERR_LOCK, SQLITE_IOERR_RDLOCK,
    SQLITE_IOERR_SHMLOCK, SQLITE_IOERR_UNLOCK, SQLITE_LOCK_EXCLUSIVE, SQLITE_LOCK_NONE,
    SQLITE_LOCK_PENDING, SQLITE_LOCK_RESERVED, SQLITE_LOCK_SHARED, SQLITE_OK,
};
use crate::sys::oslock::{self, Kind};
use crate::wal::coherence::{Coherence, Db, ShmLockAction, WAL_CKPT_LOCK};
use crate::wal::shm::{Shm, ShmHandle};
use crate::wal::walsize::WalSize;
use kxarray::pagecache::CachedFile;
use std::fs::File;
use std::os::raw::c_int;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use table::open_files;
pub(crate) use table::{close, db_named, find, open_or_insert, shared_files};

/// A file's identity: `(st_dev, st_ino)`.
pub(crate) type Key = (u64, u64);

/// The lock state of one file across the process's handles.
#[derive(Debug, Default)]
struct LockState {
    /// Handles at SHARED or above.
    shared: u32,
    /// Shared mode: the highest level of any handle (`eFileLock`).
    level: c_int,
    /// Exclusive mode: the owners of the levels above SHARED.
    reserved: Option<u64>,
    pending: Option<u64>,
    exclusive: Option<u64>,
    /// Exclusive mode: whether this process holds the OFD lock over the
    /// lock bytes.
    ofd: bool,
}

/// When a file's writes reach the backing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WritePolicy {
    /// Before `xWrite` returns (journals and WALs: SQLite's commit points
    /// are their writes).
    Through,
    /// At SQLite's next sync point for the file (`SQLITE_FCNTL_SYNC`, sent
    /// at every rollback-journal commit even with `synchronous=OFF`;
    /// `SQLITE_FCNTL_CKPT_DONE` after a checkpoint's writes; `xSync`;
    /// leaving a write lock; close): a main database, whose pages SQLite
    /// relies on only after those points, while a journal or the WAL still
    /// holds them.
    AtSyncPoint,
    /// Whenever the cache writes back (temporary files: nobody reads them
    /// after a crash).
    Cached,
}

/// How long a SHARED lock waits for the recovery of a dead writer's mark
/// before it fails (a recovery takes milliseconds).
const WRITER_RECOVERY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One file, shared by all of the process's handles of it.
pub(crate) struct Inode {
    /// The path it was first opened by (for messages).
    pub(crate) path: PathBuf,
    /// The cached file every handle reads and writes.
    pub(crate) file: CachedFile,
    /// A descriptor of the file: its identity, the owner of the OFD lock,
    /// and the descriptor `fdatasync` runs on.
    pub(crate) fd: File,
    /// Whether it was opened with `O_DIRECT` below the cache.
    pub(crate) direct: bool,
    /// Whether its descriptors are open read-write (a handle opened
    /// read-only may still share a writable inode; a read-write open of a
    /// file the process cannot write falls back to read-only).
    pub(crate) writable: bool,
    /// Whether it is a main database (locks and the OFD lock apply).
    pub(crate) is_db: bool,
    /// When its writes reach the backing file.
    pub(crate) policy: WritePolicy,
    /// A writable WAL's length as SQLite sees it, the file grown ahead of
    /// it ([`WalSize`]); `None` for other files.
    pub(crate) wal: Option<WalSize>,
    /// A database between `SQLITE_FCNTL_CKPT_START` and `CKPT_DONE`: its
    /// WAL's frames are read once and its pages written once. A hint that
    /// picks the cheaper path, never what a read returns (see `file`).
    pub(crate) checkpointing: AtomicBool,
    /// `kx_locking=exclusive`: the one-lock mode (see the module notes).
    pub(crate) exclusive: bool,
    /// Shared mode, a journal or WAL: read and written with `pread` and
    /// `pwrite` on `fd`, not cached (other processes write it too; the
    /// unix VFS reads it the same way), except while its database is held
    /// under `locking_mode=EXCLUSIVE` (`hold`: then read through `file`).
    pub(crate) uncached: bool,
    /// What the cache of a database last knew of the file and its WAL.
    pub(crate) coherence: Mutex<Coherence>,
    /// A database: this process wrote, truncated or grew the file since
    /// `coherence` last recorded it (set before the change is made; read
    /// at a hold's end, `Coherence::after_write`).
    pub(crate) wrote: AtomicBool,
    /// A database: the settings of the open that made the inode, which
    /// its journal's and WAL's opens take (see `vfs::open`).
    pub(crate) settings: Option<Settings>,
    /// A database in the shared cache: this process holds the file's
    /// writer mark (set at its first change, `note_change`; cleared when
    /// the change is final, `change_final`).
    marked: AtomicBool,
    /// Shared mode: a database's hold under `locking_mode=EXCLUSIVE`, or
    /// the hold a journal's or WAL's cache is current for ([`Hold`]).
    pub(crate) hold: Arc<Hold>,
    locks: Mutex<LockState>,
    shm: Mutex<Weak<Shm>>,
    /// Handles open on it (changed under the table's lock only).
    opens: AtomicU64,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("path", &self.path)
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while these locks are held (no user code runs
    // under them), but a poisoned lock must not take the process down
    // through an FFI boundary either: the state is plain data, still valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh owner id for a handle's locks.
pub(crate) fn next_owner() -> u64 {
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The identity of an open file.
///
/// # Errors
/// `fstat`'s error.
pub(crate) fn key_of(f: &File) -> std::io::Result<Key> {
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

impl Inode {
    /// An inode over `file`, with `fd` its identity descriptor, in shared
    /// locking mode, cached.
    pub(crate) fn new(
        path: PathBuf,
        file: CachedFile,
        fd: File,
        direct: bool,
        writable: bool,
        is_db: bool,
        policy: WritePolicy,
    ) -> Inode {
        Inode {
            path,
            file,
            fd,
            direct,
            writable,
            is_db,
            policy,
            wal: None,
            checkpointing: AtomicBool::new(false),
            exclusive: false,
            uncached: false,
            coherence: Mutex::new(Coherence::default()),
            wrote: AtomicBool::new(false),
            settings: None,
            marked: AtomicBool::new(false),
            hold: Arc::default(),
            locks: Mutex::new(LockState::default()),
            shm: Mutex::new(Weak::new()),
            opens: AtomicU64::new(0),
        }
    }

    /// What the coherence checks need of it.
    pub(crate) fn db(&self) -> Db<'_> {
        Db {
            fd: &self.fd,
            file: &self.file,
            path: &self.path,
        }
    }

    /// `xShmLock(offset, n, flags)` of a handle `s` of this file's WAL
    /// index, with the coherence checks of a database in shared mode
    /// ([`coherence::on_shm_lock`](crate::wal::coherence::on_shm_lock)), for
    /// the calls [`shm_lock_action`](crate::wal::coherence::shm_lock_action)
    /// names (the others take only the slots): a read lock leaves its
    /// check to the handle's first read of the database
    /// ([`recheck_wal`](Inode::recheck_wal)); the checkpoint lock and a WAL
    /// restart's locks check after the lock is granted (a failed check
    /// releases it and fails the call: SQLite must not read under a cache
    /// that may be stale); their release records what this process's
    /// checkpoint or restart did before the unlock, while it still holds
    /// the lock (once released, another process may checkpoint at once; an
    /// unlock's check never fails).
    #[inline]
    pub(crate) fn shm_lock(
        &self,
        s: &mut ShmHandle,
        offset: c_int,
        n: c_int,
        flags: c_int,
    ) -> c_int {
        // Only the calls the check acts on take the coherence state: the
        // checkpoint lock and a WAL restart's locks, and their release
        // (not the write lock, a read lock's release, a reader slot taken
        // exclusive to move its mark; a read lock's check waits for the
        // first read): none of a commit's six calls.
        let action = if self.exclusive || !self.is_db {
            None
        } else {
            let held_ckpt = s.holds_exclusive(WAL_CKPT_LOCK);
            crate::wal::coherence::shm_lock_action((offset, n, flags), held_ckpt)
        };
        match action {
            None => s.lock(offset, n, flags),
            // A read lock: its WAL check runs at the handle's first read
            // of the database (`recheck_wal`), not here.
            Some(ShmLockAction::ReadCheck) => {
                let rc = s.lock(offset, n, flags);
                if rc == SQLITE_OK {
                    s.recheck = true;
                    #[cfg(test)]
                    crate::wal::coherence::after_read_lock();
                }
                rc
            }
            Some(action) => self.shm_lock_checked(s, (offset, n, flags), action),
        }
    }

    /// [`Inode::shm_lock`] for a call the coherence check acts on.
    fn shm_lock_checked(
        &self,
        s: &mut ShmHandle,
        call: (c_int, c_int, c_int),
        action: ShmLockAction,
    ) -> c_int {
        // The checkpoint is over (its pages copied, written back at
        // CKPT_DONE, the file cut and synced, `nBackfill` moved): written
        // back now, its state recorded in the release's check below, and
        // its mark cleared after that (a member that looks in between sees
        // a live member's checkpoint, `Coherence::wal_check`).
        let ckpt_end = action == ShmLockAction::CkptEnd
            && self.file.is_shared()
            && self.file.write_back(0..u64::MAX).is_ok();
        let r = s.lock_checked(call, |shm| {
            let mut coh = lock(&self.coherence);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::wal::coherence::on_shm_lock(&mut coh, &self.db(), shm, action)
            }));
            r.unwrap_or_else(|p| {
                // Whatever the check had half-recorded is unknown now:
                // the next check drops everything.
                coh.forget();
                std::panic::resume_unwind(p)
            })
        });
        if ckpt_end {
            self.change_final();
        }
        match r {
            Ok(rc) => rc,
            Err(msg) => {
                crate::sqlite::process::api().log(SQLITE_IOERR_SHMLOCK, &msg);
                SQLITE_IOERR_SHMLOCK
            }
        }
    }

    /// A handle's first read of this database (`xRead`, `xFetch`,
    /// `xFileSize`) after it took a WAL read lock (`shm.recheck`): the WAL
    /// check of that read transaction
    /// ([`Coherence::wal_check`](crate::wal::coherence::Coherence::wal_check)),
    /// before any cached byte is served. It runs here rather than at the
    /// lock: SQLite loads `nBackfill`, below which it reads pages from the
    /// database file instead of the WAL, after it took the lock, and a
    /// checkpoint by another process may end in between (the lock keeps
    /// only frames past the reader's mark from being copied); a check at
    /// the first read comes after SQLite's load, so it sees at least the
    /// `nBackfill` SQLite uses. A transaction that reads nothing from the
    /// database file (a commit whose pages SQLite's own cache holds) pays
    /// no check.
    ///
    /// # Errors
    /// `code` when the check fails (its message goes to SQLite's log):
    /// SQLite must not read under a cache that may be stale.
    pub(crate) fn recheck_wal(
        &self,
        shm: Option<&mut ShmHandle>,
        code: c_int,
    ) -> Result<(), c_int> {
        let Some(s) = shm else {
            return Ok(());
        };
        if !std::mem::take(&mut s.recheck) {
            return Ok(());
        }
        let r = self
            .check_writer()
            .and_then(|()| lock(&self.coherence).wal_check(&self.db(), &s.shm));
        r.map_err(|msg| {
            // tried again at the next read
            s.recheck = true;
            crate::sqlite::process::api().log(code, &msg);
            code
        })
    }

    /// Whether any handle of the process holds a lock on this file (shared
    /// mode: SHARED or above; exclusive mode: the whole-range lock).
    pub(crate) fn any_lock(&self) -> bool {
        let st = lock(&self.locks);
        st.shared > 0 || st.ofd
    }

    /// A database: this process is about to change the file (a write, a
    /// truncation, a growth), for the hold's end (`wrote`); in the shared
    /// cache, this member marks itself the file's writer first (see
    /// `cache`: cleared when the change is final, [`Inode::change_final`]).
    ///
    /// # Errors
    /// The mark could not be set (this process is no longer a member, or
    /// another live member holds it): the change must not be made.
    #[inline]
    pub(crate) fn note_change(&self) -> std::io::Result<()> {
        if self.is_db && !self.exclusive {
            self.wrote.store(true, Ordering::Relaxed);
            if let Some(f) = self.file.shared_file() {
                if !self.marked.load(Ordering::Relaxed) {
                    f.mark_writer()?;
                    self.marked.store(true, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// A database: this process is about to write `data` at `off`
    /// ([`note_change`](Inode::note_change), and the header bytes when it
    /// writes page 1: `Coherence::wrote_header`).
    ///
    /// # Errors
    /// As [`note_change`](Inode::note_change).
    #[inline]
    pub(crate) fn note_write(&self, data: &[u8], off: u64) -> std::io::Result<()> {
        if self.is_db && !self.exclusive {
            self.note_change()?;
            if off <= 24 {
                if let Some(h) = crate::wal::coherence::Header::written(data, off) {
                    lock(&self.coherence).wrote_header(h);
                }
            }
        }
        Ok(())
    }

    /// A database in the shared cache: this process's changes to the file
    /// are final in it (its transaction ended and was written back, or its
    /// checkpoint's pages were): its writer mark goes.
    pub(crate) fn change_final(&self) {
        if let Some(f) = self.file.shared_file() {
            if self.marked.swap(false, Ordering::Relaxed) {
                f.clear_writer();
            }
        }
    }

    /// A database in the shared cache left with a change not known final
    /// (a close after an I/O error, an exit in the middle of a
    /// transaction, which leave a hot journal): nobody trusts the frames
    /// it changed (every frame of the file retired), and the mark goes.
    fn abandon_change(&self) {
        if let Some(f) = self.file.shared_file() {
            if self.marked.swap(false, Ordering::Relaxed) {
                let _ = f.retire();
                f.clear_writer();
            }
        }
    }

    /// [`check_writer`](Self::check_writer) at a SHARED lock taken from
    /// none. In rollback-journal mode a member marks the file only under
    /// EXCLUSIVE and clears the mark before releasing it, so with this
    /// SHARED lock held a mark still standing is a dead member's whose
    /// recovery is under way, though its owner looks alive: the recoverer
    /// (or a joiner taking over its slot) holds its liveness byte while it
    /// retires the frames, then clears the mark. Such a mark is waited out
    /// before any frame is trusted. In WAL mode (the index mapped, or the
    /// header saying WAL) a live checkpointer holds its mark beside
    /// readers, and the pages it copies are ones every reader reads from
    /// the WAL: nothing to wait for.
    fn check_writer_at_shared(&self) -> Result<(), String> {
        let Some(f) = self.file.shared_file() else {
            return Ok(());
        };
        let err = |what: &str, e: std::io::Error| {
            format!(
                "kxarray: {what} of {} in the shared cache: {e}",
                self.path.display()
            )
        };
        if f.check_writer()
            .map_err(|e| err("checking the writer", e))?
        {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        loop {
            if lock(&self.shm).strong_count() > 0 {
                return Ok(());
            }
            // the file format's write version, byte 18: 2 is WAL (a file
            // too short to say is not)
            let mut v = [0u8; 1];
            if crate::sys::fdio::pread_full(&self.fd, &mut v, 18).is_ok() && v[0] == 2 {
                return Ok(());
            }
            if t0.elapsed() > WRITER_RECOVERY_WAIT {
                return Err(format!(
                    "kxarray: a writer mark on {} in the shared cache stayed held by a \
                     process without the lock to write ({} s)",
                    self.path.display(),
                    WRITER_RECOVERY_WAIT.as_secs()
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
            if f.check_writer()
                .map_err(|e| err("checking the writer", e))?
            {
                return Ok(());
            }
        }
    }

    /// A database in the shared cache: look at the writer mark before
    /// trusting a frame (a dead member's unfinished change retires every
    /// frame of the file first; one load when there is no mark).
    #[inline]
    pub(crate) fn check_writer(&self) -> Result<(), String> {
        match self.file.shared_file() {
            Some(f) => f.check_writer().map(drop).map_err(|e| {
                format!(
                    "kxarray: checking the writer of {} in the shared cache: {e}",
                    self.path.display()
                )
            }),
            None => Ok(()),
        }
    }

    /// The same inode with `wal` as its WAL's length ([`WalSize`]).
    pub(crate) fn with_wal(self, wal: Option<WalSize>) -> Inode {
        Inode { wal, ..self }
    }

    /// The same inode with the settings of the open that made it.
    pub(crate) fn with_settings(self, settings: Settings) -> Inode {
        Inode {
            settings: Some(settings),
            ..self
        }
    }

    /// The same inode in exclusive locking mode (`exclusive`), and, for a
    /// journal or WAL, uncached (`uncached`).
    pub(crate) fn with_mode(self, exclusive: bool, uncached: bool) -> Inode {
        Inode {
            exclusive,
            uncached,
            ..self
        }
    }

    /// The SQLite code and message for a failed OFD lock: `SQLITE_BUSY`
    /// for a conflict (counted), `io_code` otherwise.
    fn lock_error(&self, e: std::io::Error, io_code: c_int) -> (c_int, String) {
        if !oslock::is_busy(&e) {
            crate::sqlite::lasterror::note_errno(&e);
        }
        if oslock::is_busy(&e) {
            crate::sqlite::process::vfs_stats()
                .lock_conflicts
                .fetch_add(1, Ordering::Relaxed);
            let msg = if self.exclusive {
                format!(
                    "kxarray: {} is in use by another process (it holds SQLite locks on it, or \
                     it serves it through its own kxarray cache with kx_locking=exclusive)",
                    self.path.display()
                )
            } else {
                format!(
                    "kxarray: {} is locked by another process",
                    self.path.display()
                )
            };
            return (SQLITE_BUSY, msg);
        }
        (
            io_code,
            format!("kxarray: locking {}: {e}", self.path.display()),
        )
    }

    /// Raise handle `owner` from `*level` to `want` (SQLite's `xLock`).
    /// On `SQLITE_BUSY` the handle may have reached PENDING on its way to
    /// EXCLUSIVE (as with the unix VFS); `*level` says where it is.
    ///
    /// # Errors
    /// `Err((code, message))` for a failure SQLite's log should hear of
    /// (a conflict with another process too: its message names it).
    pub(crate) fn lock(
        &self,
        owner: u64,
        level: &mut c_int,
        want: c_int,
    ) -> Result<c_int, (c_int, String)> {
        if *level >= want {
            return Ok(SQLITE_OK);
        }
        if !self.is_db {
            // Only a main database is locked (SQLite locks nothing else).
            *level = want;
            return Ok(SQLITE_OK);
        }
        if self.exclusive {
            return self.lock_exclusive(owner, level, want);
        }
        let mut st = lock(&self.locks);
        // Another handle of the process is above SHARED (or PENDING keeps
        // new readers out): as `unixLock`.
        if *level != st.level && (st.level >= SQLITE_LOCK_PENDING || want > SQLITE_LOCK_SHARED) {
            return Ok(SQLITE_BUSY);
        }
        if want == SQLITE_LOCK_SHARED
            && (st.level == SQLITE_LOCK_SHARED || st.level == SQLITE_LOCK_RESERVED)
        {
            st.shared += 1;
            *level = SQLITE_LOCK_SHARED;
            return Ok(SQLITE_OK);
        }
        let fd = &self.fd;
        if want == SQLITE_LOCK_SHARED
            || (want == SQLITE_LOCK_EXCLUSIVE && *level < SQLITE_LOCK_PENDING)
        {
            let kind = if want == SQLITE_LOCK_SHARED {
                Kind::Read
            } else {
                Kind::Write
            };
            if let Err(e) = oslock::set(fd, kind, PENDING_BYTE, 1) {
                let (code, msg) = self.lock_error(e, SQLITE_IOERR_LOCK);
                return if code == SQLITE_BUSY {
                    Ok(code)
                } else {
                    Err((code, msg))
                };
            }
        }
        let r = if want == SQLITE_LOCK_SHARED {
            let r = oslock::set(fd, Kind::Read, SHARED_FIRST, SHARED_SIZE)
                .map_err(|e| self.lock_error(e, SQLITE_IOERR_LOCK));
            let u = oslock::set(fd, Kind::Unlock, PENDING_BYTE, 1);
            let r = match (r, u) {
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(self.lock_error(e, SQLITE_IOERR_UNLOCK)),
                (Ok(()), Ok(())) => Ok(()),
            };
            if r.is_ok() {
                // The process had no lock: what did others change since?
                // A dead member's unfinished change first.
                let checked = self
                    .check_writer_at_shared()
                    .and_then(|()| lock(&self.coherence).after_gap(&self.db()));
                if let Err(msg) = checked {
                    let _ = oslock::set(fd, Kind::Unlock, 0, 0);
                    return Err((SQLITE_IOERR_LOCK, msg));
                }
                self.wrote.store(false, Ordering::Relaxed);
                st.shared = 1;
            }
            r
        } else if want == SQLITE_LOCK_EXCLUSIVE && st.shared > 1 {
            Err((SQLITE_BUSY, String::new()))
        } else {
            let (start, len) = if want == SQLITE_LOCK_RESERVED {
                (RESERVED_BYTE, 1)
            } else {
                (SHARED_FIRST, SHARED_SIZE)
            };
            oslock::set(fd, Kind::Write, start, len)
                .map_err(|e| self.lock_error(e, SQLITE_IOERR_LOCK))
        };
        match r {
            Ok(()) => {
                *level = want;
                st.level = want;
                if want == SQLITE_LOCK_EXCLUSIVE {
                    // The file as the hold starts (see `coherence`).
                    let wal_index = lock(&self.shm).strong_count() > 0;
                    if lock(&self.coherence).hold_start(&self.db(), wal_index) {
                        self.wrote.store(false, Ordering::Relaxed);
                    }
                }
                Ok(SQLITE_OK)
            }
            Err((code, msg)) => {
                if want == SQLITE_LOCK_EXCLUSIVE {
                    *level = SQLITE_LOCK_PENDING;
                    st.level = SQLITE_LOCK_PENDING;
                }
                if code == SQLITE_BUSY {
                    Ok(code)
                } else {
                    Err((code, msg))
                }
            }
        }
    }

    /// Lower handle `owner` from `*level` to `want` (SHARED or NONE),
    /// SQLite's `xUnlock`.
    ///
    /// # Errors
    /// `Err((code, message))` when a lock could not be released or
    /// downgraded (`SQLITE_IOERR_UNLOCK`, `SQLITE_IOERR_RDLOCK`).
    pub(crate) fn unlock(
        &self,
        owner: u64,
        level: &mut c_int,
        want: c_int,
    ) -> Result<(), (c_int, String)> {
        if *level <= want {
            return Ok(());
        }
        if !self.is_db {
            *level = want;
            return Ok(());
        }
        if self.exclusive {
            self.unlock_exclusive(owner, level, want);
            return Ok(());
        }
        let mut st = lock(&self.locks);
        let fd = &self.fd;
        let err = |code, e: std::io::Error| {
            crate::sqlite::lasterror::note_errno(&e);
            (
                code,
                format!("kxarray: unlocking {}: {e}", self.path.display()),
            )
        };
        if *level > SQLITE_LOCK_SHARED {
            if *level == SQLITE_LOCK_EXCLUSIVE {
                // The handle may have written: the file as this process
                // leaves it (written back by now: `x_unlock`'s sync point),
                // if every change is its own.
                let wrote = self.wrote.swap(false, Ordering::Relaxed);
                lock(&self.coherence).after_write(&self.db(), wrote);
                // Final in the file (the sync point wrote it back), before
                // another process can take a lock.
                self.change_final();
            }
            if want == SQLITE_LOCK_SHARED {
                oslock::set(fd, Kind::Read, SHARED_FIRST, SHARED_SIZE)
                    .map_err(|e| err(SQLITE_IOERR_RDLOCK, e))?;
            }
            oslock::set(fd, Kind::Unlock, PENDING_BYTE, 2)
                .map_err(|e| err(SQLITE_IOERR_UNLOCK, e))?;
            st.level = SQLITE_LOCK_SHARED;
            *level = SQLITE_LOCK_SHARED;
        }
        if want == SQLITE_LOCK_NONE {
            st.shared = st.shared.saturating_sub(1);
            *level = SQLITE_LOCK_NONE;
            if st.shared == 0 {
                st.level = SQLITE_LOCK_NONE;
                oslock::set(fd, Kind::Unlock, 0, 0).map_err(|e| err(SQLITE_IOERR_UNLOCK, e))?;
            }
        }
        Ok(())
    }

    /// Whether any handle, or another process, holds RESERVED or above
    /// (`xCheckReservedLock`: the process's own level, then `F_OFD_GETLK`
    /// on `RESERVED_BYTE`, as `unixCheckReservedLock`).
    ///
    /// # Errors
    /// `SQLITE_IOERR_CHECKRESERVEDLOCK` and a message when `fcntl` fails.
    pub(crate) fn reserved(&self) -> Result<bool, (c_int, String)> {
        let st = lock(&self.locks);
        if self.exclusive || !self.is_db {
            return Ok(st.reserved.is_some() || st.pending.is_some() || st.exclusive.is_some());
        }
        if st.level > SQLITE_LOCK_SHARED {
            return Ok(true);
        }
        match oslock::conflict(&self.fd, Kind::Write, RESERVED_BYTE, 1) {
            Ok(c) => Ok(c.is_some()),
            Err(e) => {
                crate::sqlite::lasterror::note_errno(&e);
                Err((
                    SQLITE_IOERR_CHECKRESERVEDLOCK,
                    format!("kxarray: checking the lock of {}: {e}", self.path.display()),
                ))
            }
        }
    }

    /// Take the exclusive mode's OFD lock over SQLite's lock bytes, if not
    /// held yet, and make the cache valid under it (see the module notes).
    /// `Err((code, message))`: `SQLITE_BUSY` when another process holds a
    /// conflicting lock, `SQLITE_CANTOPEN` for a WAL database this process
    /// cannot write, `SQLITE_IOERR_LOCK` for any other failure.
    fn take_ofd(&self, st: &mut LockState) -> Result<(), (c_int, String)> {
        if st.ofd {
            return Ok(());
        }
        let kind = if self.writable {
            Kind::Write
        } else {
            Kind::Read
        };
        if let Err(e) = oslock::set(&self.fd, kind, PENDING_BYTE, LOCK_RANGE_LEN) {
            return Err(self.lock_error(e, SQLITE_IOERR_LOCK));
        }
        // Another process may have written the file since this one read
        // anything of it (the header SQLite reads at open, unlocked).
        if let Err(e) = self.file.revalidate() {
            let _ = oslock::set(&self.fd, Kind::Unlock, 0, 0);
            return Err((
                SQLITE_IOERR_LOCK,
                format!(
                    "kxarray: revalidating the cache of {}: {e}",
                    self.path.display()
                ),
            ));
        }
        if !self.writable && self.is_wal_mode() {
            let _ = oslock::set(&self.fd, Kind::Unlock, 0, 0);
            return Err((
                SQLITE_CANTOPEN,
                format!(
                    "kxarray: {} is a WAL database this process cannot open for writing: with \
                     kx_locking=exclusive its read lock would not keep another process's WAL \
                     writer out; open it with kx_locking=shared",
                    self.path.display()
                ),
            ));
        }
        st.ofd = true;
        Ok(())
    }

    /// Whether the database's header says WAL (file format versions, bytes
    /// 18 and 19, are 2).
    fn is_wal_mode(&self) -> bool {
        let mut h = [0u8; 2];
        matches!(self.file.read_at(&mut h, 18), Ok(2)) && (h[0] == 2 || h[1] == 2)
    }

    /// Write back what the file holds dirty and release the OFD locks: the
    /// last handle closed (under the table's lock, see [`close`]).
    fn shut(&self) {
        let _ = self.file.write_back(0..u64::MAX);
        // (SQLite ends its transactions before a close; an I/O error may not)
        self.abandon_change();
        let mut st = lock(&self.locks);
        if self.is_db && (st.ofd || st.level != SQLITE_LOCK_NONE) {
            let _ = oslock::set(&self.fd, Kind::Unlock, 0, 0);
            st.ofd = false;
            st.level = SQLITE_LOCK_NONE;
        }
    }

    /// Exclusive mode's `xLock` (see [`lock`](Inode::lock)).
    fn lock_exclusive(
        &self,
        owner: u64,
        level: &mut c_int,
        want: c_int,
    ) -> Result<c_int, (c_int, String)> {
        let mut st = lock(&self.locks);
        if *level == SQLITE_LOCK_NONE {
            // to SHARED (SQLite always asks for SHARED first)
            if st.pending.is_some() || st.exclusive.is_some() {
                return Ok(SQLITE_BUSY);
            }
            self.take_ofd(&mut st)?;
            st.shared += 1;
            *level = SQLITE_LOCK_SHARED;
            if want == SQLITE_LOCK_SHARED {
                return Ok(SQLITE_OK);
            }
        }
        if want == SQLITE_LOCK_RESERVED {
            if st.reserved.is_some() {
                return Ok(SQLITE_BUSY);
            }
            st.reserved = Some(owner);
            *level = SQLITE_LOCK_RESERVED;
            return Ok(SQLITE_OK);
        }
        // EXCLUSIVE (SQLite never asks for PENDING itself): PENDING first,
        // which keeps new readers out, then wait for the others to leave.
        if *level < SQLITE_LOCK_PENDING {
            if st.pending.is_some() {
                return Ok(SQLITE_BUSY);
            }
            st.pending = Some(owner);
            *level = SQLITE_LOCK_PENDING;
        }
        if st.shared > 1 {
            return Ok(SQLITE_BUSY);
        }
        st.exclusive = Some(owner);
        *level = SQLITE_LOCK_EXCLUSIVE;
        Ok(SQLITE_OK)
    }

    /// Exclusive mode's `xUnlock` (see [`unlock`](Inode::unlock)).
    fn unlock_exclusive(&self, owner: u64, level: &mut c_int, want: c_int) {
        let mut guard = lock(&self.locks);
        let st = &mut *guard;
        if *level > SQLITE_LOCK_SHARED {
            for slot in [&mut st.reserved, &mut st.pending, &mut st.exclusive] {
                if *slot == Some(owner) {
                    *slot = None;
                }
            }
            *level = SQLITE_LOCK_SHARED;
        }
        if want == SQLITE_LOCK_NONE && *level == SQLITE_LOCK_SHARED {
            st.shared -= 1;
            *level = SQLITE_LOCK_NONE;
        }
    }

    /// The WAL index of this file, made on first use and shared by every
    /// handle that maps it while any of them does: in process memory in
    /// exclusive mode, else the `-shm` file beside the database
    /// (`readonly_shm`: opened read-only). The code is `SQLITE_OK` or
    /// `SQLITE_READONLY_CANTINIT` (a read-only `-shm` no other process has
    /// initialized: SQLite then reads the WAL without it).
    ///
    /// # Errors
    /// The code and message of a `-shm` that cannot be opened or locked.
    pub(crate) fn shm(&self, readonly_shm: bool) -> Result<(Arc<Shm>, c_int), (c_int, String)> {
        let mut w = lock(&self.shm);
        if let Some(s) = w.upgrade() {
            return Ok((s, SQLITE_OK));
        }
        let (s, rc) = if self.exclusive {
            (Shm::heap(), SQLITE_OK)
        } else {
            let mut name = self.path.clone().into_os_string();
            name.push("-shm");
            Shm::open(PathBuf::from(name), &self.fd, readonly_shm)?
        };
        let s = Arc::new(s);
        *w = Arc::downgrade(&s);
        Ok((s, rc))
    }

    /// Let go of one handle's attachment to the WAL index; with `delete`
    /// (SQLite holds the database EXCLUSIVE, so no other process uses it)
    /// the last one in the process deletes the `-shm` file, as
    /// `unixShmUnmap` does.
    pub(crate) fn unmap_shm(&self, handle: crate::wal::shm::ShmHandle, delete: bool) {
        let _w = lock(&self.shm);
        let shm = Arc::clone(&handle.shm);
        drop(handle);
        if delete && Arc::strong_count(&shm) == 1 {
            shm.unlink();
        }
    }
}

mod table;
#[cfg(test)]
mod tests;
