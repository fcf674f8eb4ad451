//! One file as the process sees it: [`Inode`], shared by every open of the
//! same file (the same `(st_dev, st_ino)`), like `os_unix.c`'s
//! `unixInodeInfo`; and the process-wide table that finds it.
//!
//! Owns the file's one [`CachedFile`] (every connection of the process
//! reads and writes the same cached pages, so they stay coherent), SQLite's
//! five lock levels across those connections, the OFD lock that keeps
//! other processes out, and the WAL index ([`Shm`]) of a database.
//!
//! Invariants:
//! - the table holds at most one `Inode` per `(st_dev, st_ino)`, present
//!   while at least one handle has it open (`opens > 0`, counted under the
//!   table's lock); the `Inode` keeps a descriptor of the file open, so the
//!   inode number cannot be reused while the entry exists;
//! - lock state: `shared` counts the handles at SHARED or above; at most
//!   one handle owns each of RESERVED, PENDING and EXCLUSIVE; EXCLUSIVE is
//!   granted only when its owner is the only SHARED holder; no new SHARED
//!   is granted while PENDING or EXCLUSIVE is owned;
//! - a database file (`is_db`) is read or written only under SHARED or
//!   above, which is granted only once this process holds the OFD lock
//!   over SQLite's lock bytes: `F_WRLCK` whenever the file could be opened
//!   read-write (a read-only open too: its lock must keep other processes'
//!   writers out, WAL writers included, which hold only a read lock on the
//!   database file), `F_RDLCK` only for a file this process cannot write,
//!   and then never over a WAL database (nothing would keep another
//!   process's WAL writer out). The lock is released only when the last
//!   handle closes ([`close`]), after the file was written back. So no
//!   other process holds a SQLite lock on the file, or changes it, while
//!   this one has it locked;
//! - the cache of a database is valid before SQLite trusts it: SQLite reads
//!   the header at open without a lock (`sqlite3PagerReadFileheader`), so
//!   taking the OFD lock drops whatever the process cached of the file and
//!   takes its length again ([`CachedFile::revalidate`]), since another
//!   process may have written it in between;
//! - an inode leaves the table, and its OFD lock is released, under the
//!   table's lock: an open racing the last close finds either the old inode
//!   (and keeps it) or none and no lock of the process's own in its way.

use crate::ffi::{
    LOCK_RANGE_LEN, PENDING_BYTE, SQLITE_BUSY, SQLITE_CANTOPEN, SQLITE_IOERR_LOCK,
    SQLITE_LOCK_EXCLUSIVE, SQLITE_LOCK_NONE, SQLITE_LOCK_PENDING, SQLITE_LOCK_RESERVED,
    SQLITE_LOCK_SHARED, SQLITE_OK,
};
use crate::shm::Shm;
use crate::walsize::WalSize;
use kxarray::pagecache::CachedFile;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// A file's identity: `(st_dev, st_ino)`.
pub(crate) type Key = (u64, u64);

/// The lock state of one file across the process's handles.
#[derive(Debug, Default)]
struct LockState {
    /// Handles at SHARED or above.
    shared: u32,
    reserved: Option<u64>,
    pending: Option<u64>,
    exclusive: Option<u64>,
    /// Whether this process holds the OFD lock over the lock bytes.
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

fn table() -> &'static Mutex<HashMap<Key, Arc<Inode>>> {
    static T: OnceLock<Mutex<HashMap<Key, Arc<Inode>>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
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

/// The inode of `key` if the process has it open (one more open counted),
/// else the one `make` builds (inserted with one open). `make` runs under
/// the table's lock, so two opens of one new file build one inode.
///
/// # Errors
/// `make`'s error.
pub(crate) fn open_or_insert<E>(
    key: Key,
    make: impl FnOnce() -> Result<Inode, E>,
) -> Result<Arc<Inode>, E> {
    let mut t = lock(table());
    if let Some(i) = t.get(&key) {
        i.opens.fetch_add(1, Ordering::Relaxed);
        return Ok(Arc::clone(i));
    }
    let inode = Arc::new(make()?);
    inode.opens.store(1, Ordering::Relaxed);
    t.insert(key, Arc::clone(&inode));
    Ok(inode)
}

/// Count one handle of `inode` closed; the last one writes the file back,
/// releases the OFD lock and takes the inode out of the table, all under
/// the table's lock, so an open of the same file in the meantime either
/// shares this inode or finds no lock of the process's own in its way.
pub(crate) fn close(key: Option<Key>, inode: Arc<Inode>) {
    let Some(key) = key else { return };
    let mut t = lock(table());
    if inode.opens.fetch_sub(1, Ordering::Relaxed) == 1 {
        inode.shut();
        if t.get(&key).is_some_and(|i| Arc::ptr_eq(i, &inode)) {
            t.remove(&key);
        }
        // The last reference, normally: its descriptors close here, under
        // the lock, too.
        drop(inode);
    }
}

/// The inode of `key` if the process has it open (no open counted: for a
/// journal or WAL to reach its database).
pub(crate) fn find(key: Key) -> Option<Arc<Inode>> {
    lock(table()).get(&key).cloned()
}

/// Files the process has open through the VFS (for tests and stats).
pub fn open_files() -> usize {
    lock(table()).len()
}

impl Inode {
    /// An inode over `file`, with `fd` its identity descriptor.
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
            locks: Mutex::new(LockState::default()),
            shm: Mutex::new(Weak::new()),
            opens: AtomicU64::new(0),
        }
    }

    /// The same inode with `wal` as its WAL's length ([`WalSize`]).
    pub(crate) fn with_wal(self, wal: Option<WalSize>) -> Inode {
        Inode { wal, ..self }
    }

    /// Set (`F_WRLCK`, `F_RDLCK`) or release (`F_UNLCK`) the OFD lock over
    /// SQLite's lock bytes, without waiting.
    fn set_ofd(&self, kind: c_int) -> std::io::Result<()> {
        // SAFETY: an all-zero `flock` is a valid value (plain integers).
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = PENDING_BYTE as _;
        fl.l_len = LOCK_RANGE_LEN as _;
        fl.l_pid = 0; // required by F_OFD_SETLK
                      // SAFETY: `fd` is open for the life of `self`; `fl` is a valid
                      // `flock` the call only reads.
        let r = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Take the OFD lock over SQLite's lock bytes, if not held yet, and
    /// make the cache valid under it (see the module notes).
    /// `Err((code, message))`: `SQLITE_BUSY` when another process holds a
    /// conflicting lock, `SQLITE_CANTOPEN` for a WAL database this process
    /// cannot write, `SQLITE_IOERR_LOCK` for any other failure.
    fn take_ofd(&self, st: &mut LockState) -> Result<(), (c_int, String)> {
        if st.ofd || !self.is_db {
            return Ok(());
        }
        let kind = if self.writable {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        if let Err(e) = self.set_ofd(kind) {
            let (code, msg) = self.lock_error(e);
            if code == SQLITE_BUSY {
                crate::process::vfs_stats()
                    .lock_conflicts
                    .fetch_add(1, Ordering::Relaxed);
            }
            return Err((code, msg));
        }
        // Another process may have written the file since this one read
        // anything of it (the header SQLite reads at open, unlocked).
        if let Err(e) = self.file.revalidate() {
            let _ = self.set_ofd(libc::F_UNLCK);
            return Err((
                SQLITE_IOERR_LOCK,
                format!(
                    "kxarray: revalidating the cache of {}: {e}",
                    self.path.display()
                ),
            ));
        }
        if !self.writable && self.is_wal_mode() {
            let _ = self.set_ofd(libc::F_UNLCK);
            return Err((
                SQLITE_CANTOPEN,
                format!(
                    "kxarray: {} is a WAL database this process cannot open for writing: its \
                     read lock would not keep another process's WAL writer out, and this \
                     process would read a stale snapshot; open it with the unix VFS",
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

    /// Write back what the file holds dirty and release the OFD lock: the
    /// last handle closed (under the table's lock, see [`close`]).
    fn shut(&self) {
        let _ = self.file.write_back(0..u64::MAX);
        let mut st = lock(&self.locks);
        if st.ofd {
            let _ = self.set_ofd(libc::F_UNLCK);
            st.ofd = false;
        }
    }

    /// The SQLite code and message for a failed OFD lock.
    fn lock_error(&self, e: std::io::Error) -> (c_int, String) {
        let code = match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => SQLITE_BUSY,
            _ => SQLITE_IOERR_LOCK,
        };
        let msg = if code == SQLITE_BUSY {
            format!(
                "kxarray: {} is in use by another process (it holds SQLite locks on it, or it \
                 serves it through its own kxarray cache); a database is cached by one process \
                 at a time",
                self.path.display()
            )
        } else {
            format!("kxarray: locking {}: {e}", self.path.display())
        };
        (code, msg)
    }

    /// Raise handle `owner` from `*level` to `want` (SQLite's `xLock`).
    /// On `SQLITE_BUSY` the handle may have reached PENDING on its way to
    /// EXCLUSIVE (as with the unix VFS); `*level` says where it is.
    ///
    /// # Errors
    /// `Err((code, message))` for a failure SQLite's log should hear of.
    pub(crate) fn lock(
        &self,
        owner: u64,
        level: &mut c_int,
        want: c_int,
    ) -> Result<c_int, (c_int, String)> {
        if *level >= want {
            return Ok(SQLITE_OK);
        }
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

    /// Lower handle `owner` from `*level` to `want` (SHARED or NONE).
    pub(crate) fn unlock(&self, owner: u64, level: &mut c_int, want: c_int) {
        if *level <= want {
            return;
        }
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

    /// Whether any handle holds RESERVED or above (`xCheckReservedLock`).
    pub(crate) fn reserved(&self) -> bool {
        let st = lock(&self.locks);
        st.reserved.is_some() || st.pending.is_some() || st.exclusive.is_some()
    }

    /// The WAL index of this file, made on first use and shared by every
    /// handle that maps it while any of them does.
    pub(crate) fn shm(&self) -> Arc<Shm> {
        let mut w = lock(&self.shm);
        if let Some(s) = w.upgrade() {
            return s;
        }
        let s = Arc::new(Shm::new());
        *w = Arc::downgrade(&s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxarray::backend::RamDisk;
    use kxarray::pagecache::{CacheConfig, PageCache};

    fn inode() -> Inode {
        let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
        let file = cache.open(RamDisk::new(1 << 16)).unwrap();
        let fd = tempfile_fd();
        Inode::new(
            "t".into(),
            file,
            fd,
            false,
            true,
            false,
            WritePolicy::Cached,
        )
    }

    fn tempfile_fd() -> File {
        tempfile::tempfile().unwrap()
    }

    #[test]
    fn five_levels() {
        let i = inode();
        let (a, b) = (next_owner(), next_owner());
        let (mut la, mut lb) = (SQLITE_LOCK_NONE, SQLITE_LOCK_NONE);
        assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
        assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
        assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_RESERVED), Ok(SQLITE_OK));
        assert!(i.reserved());
        // a second writer waits
        assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_RESERVED), Ok(SQLITE_BUSY));
        assert_eq!(lb, SQLITE_LOCK_SHARED);
        // a reader is still there: PENDING, busy
        assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_BUSY));
        assert_eq!(la, SQLITE_LOCK_PENDING);
        // PENDING keeps new readers out
        let c = next_owner();
        let mut lc = SQLITE_LOCK_NONE;
        assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_BUSY));
        assert_eq!(lc, SQLITE_LOCK_NONE);
        i.unlock(b, &mut lb, SQLITE_LOCK_NONE);
        assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_OK));
        assert_eq!(la, SQLITE_LOCK_EXCLUSIVE);
        assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_BUSY));
        i.unlock(a, &mut la, SQLITE_LOCK_SHARED);
        assert!(!i.reserved());
        assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
        // b's failed RESERVED did not take a's: unlock of a non-owner is a no-op
        assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
        assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_RESERVED), Ok(SQLITE_OK));
        i.unlock(c, &mut lc, SQLITE_LOCK_NONE);
        assert!(i.reserved());
        for (o, l) in [(a, &mut la), (b, &mut lb)] {
            i.unlock(o, l, SQLITE_LOCK_NONE);
        }
        assert!(!i.reserved());
        assert_eq!(lock(&i.locks).shared, 0);
    }
}
