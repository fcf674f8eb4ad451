//! The WAL index: [`Shm`] (the regions and the eight lock slots of one
//! database, shared by the process's handles, like `os_unix.c`'s
//! `unixShmNode`) and [`ShmHandle`] (one handle's view: the locks it
//! holds).
//!
//! Shared locking mode (the default): the index is the `-shm` file beside
//! the database, in the unix VFS's layout, so a unix-VFS process and a
//! kxarray process read each other's index:
//! - regions are `mmap`ed (`MAP_SHARED`) from the file at `index * size`;
//!   a missing region is created by writing the last byte of each new
//!   4 KiB page, as `unixShmMap` does (no `SIGBUS` on a sparse file);
//! - lock slot `i` is byte `120 + i` of the file and the DMS byte is 128,
//!   locked with OFD locks ([`oslock`]) on the one descriptor of the
//!   process: every opener holds DMS shared; the first one, the one that
//!   can take it exclusive, truncates the file (to 3 bytes, as the unix
//!   VFS) so that SQLite rebuilds the index (`unixLockSharedMemory`);
//! - `readonly_shm=1`, or a `-shm` the process cannot open for writing,
//!   opens it read-only: regions mapped `PROT_READ`, `xShmMap` answers
//!   `SQLITE_READONLY`, and `SQLITE_READONLY_CANTINIT` when no other
//!   process holds DMS (nobody initialized it).
//!
//! Exclusive locking mode (`kx_locking=exclusive`): the index lives in
//! process memory (no other process may open the database), zeroed.
//!
//! Invariants:
//! - a region, once mapped or allocated, keeps its address and size until
//!   the `Shm` is dropped (when the last handle unmaps), so pointers SQLite
//!   holds stay valid while it may use them; all regions have one size;
//!   the first [`FAST_REGIONS`] regions' addresses are also published in
//!   atomics (after the size), so the coherence check's reads of the index
//!   header ([`Shm::words`]) take no lock once a region is mapped;
//! - lock slot `i` is 0 (free in the process), `n > 0` (held shared by `n`
//!   handles) or -1 (held exclusive by one handle), and the process holds
//!   an OFD lock on the slot's byte of exactly that kind (none, read,
//!   write), except for the one slot `Slots::downgraded` may name: free
//!   in the process, its OFD lock a read lock, until the process's next
//!   lock call; a handle's masks say which slots it holds, and an
//!   exclusive lock is granted only on slots free in the process (as
//!   `unixShmLock`);
//! - a lock taken before a check of the index (`ShmHandle::lock_checked`)
//!   is released again when the check fails or unwinds.
//!
//! One system call less per WAL read transaction than the unix VFS: to
//! start one, SQLite moves a reader's mark (`walTryBeginRead`: WAL read
//! lock 1-4 exclusive, the mark stored, the lock released) and at once
//! takes that slot shared. The release of a reader slot held exclusive
//! alone downgrades the OFD lock to a read lock (one `fcntl`) instead,
//! and the shared lock that follows takes it over with none. Any other
//! lock call of the process releases the read lock first, so it is held
//! only between two lock calls of one SQLite operation, as if the shared
//! lock had been taken a moment early: other processes may read-lock the
//! slot meanwhile and cannot take it exclusive, which a reader about to
//! hold it shared would refuse them anyway.

use crate::sqlite::ffi::{
    SHM_DMS, SHM_LOCK_BASE, SQLITE_BUSY, SQLITE_CANTOPEN, SQLITE_IOERR_FSTAT, SQLITE_IOERR_LOCK,
    SQLITE_IOERR_SHMLOCK, SQLITE_IOERR_SHMMAP, SQLITE_IOERR_SHMOPEN, SQLITE_IOERR_SHMSIZE,
    SQLITE_OK, SQLITE_READONLY, SQLITE_READONLY_CANTINIT, SQLITE_SHM_EXCLUSIVE, SQLITE_SHM_LOCK,
    SQLITE_SHM_NLOCK, SQLITE_SHM_SHARED, SQLITE_SHM_UNLOCK,
};
use crate::sys::oslock::{self, Kind};
use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_void};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Alignment of a heap region (SQLite reads 32-bit and 64-bit words in
/// them).
const REGION_ALIGN: usize = 4096;

/// The first lock slot of WAL read locks 1-4 (`WAL_READ_LOCK(1)`), the
/// reader slots whose exclusive release downgrades (see the module notes).
const READ_LOCK1: usize = 4;

/// The process's state of the eight lock slots (see the module notes).
#[derive(Debug, Default)]
struct Slots {
    /// Per slot: 0 free in the process, `n > 0` held shared by `n`
    /// handles, -1 held exclusive.
    held: [i32; SQLITE_SHM_NLOCK as usize],
    /// A reader slot released from exclusive whose OFD lock was downgraded
    /// to a read lock (`held` 0): taken over by a shared lock of it, else
    /// released, at the process's next lock call.
    downgraded: Option<usize>,
}

/// Regions whose address [`Shm::words`] reads without the regions' mutex
/// (the index header is in region 0; 8 regions index 32,000 WAL frames).
const FAST_REGIONS: usize = 8;

struct Regions {
    size: usize,
    list: Vec<NonNull<u8>>,
}

/// The `-shm` file of shared mode.
struct ShmFile {
    fd: File,
    path: PathBuf,
    readonly: bool,
    /// A read-only `-shm` whose DMS no process held: SQLite was told
    /// `SQLITE_READONLY_CANTINIT`; the next map tries again
    /// (`isUnlocked`).
    unlocked: AtomicBool,
}

/// The WAL index of one database.
pub(crate) struct Shm {
    file: Option<ShmFile>,
    regions: Mutex<Regions>,
    /// Region `i`'s address once mapped (null before), for `i <
    /// FAST_REGIONS`: stored (`Release`) under the regions' mutex after
    /// `fast_size`, right after the region is mapped, and never changed
    /// again while `self` lives.
    fast: [AtomicPtr<u8>; FAST_REGIONS],
    /// The regions' size, stored before the first address in `fast`.
    fast_size: AtomicUsize,
    slots: Mutex<Slots>,
    /// The system lock calls made (`fcntl`), for the tests.
    #[cfg(test)]
    sys_locks: std::sync::atomic::AtomicUsize,
}

// SAFETY: the raw region pointers are only mapped or allocated, handed to
// SQLite, read by `words` and released (on drop) by this type, under its
// mutex (or, for `fast`, published once through atomics and never freed
// before the drop); their bytes are shared memory SQLite synchronizes with
// the shm locks and barriers (and `words` reads them with atomic loads).
unsafe impl Send for Shm {}
// SAFETY: as above; every field is behind a mutex or immutable.
unsafe impl Sync for Shm {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An OFD lock error as SQLite's code: `SQLITE_BUSY` for a conflict, else
/// `code`.
fn lock_code(e: &std::io::Error, code: c_int) -> c_int {
    if oslock::is_busy(e) {
        SQLITE_BUSY
    } else {
        code
    }
}

impl Shm {
    /// An index in process memory (exclusive mode).
    pub(crate) fn heap() -> Shm {
        Shm::with_file(None)
    }

    fn with_file(file: Option<ShmFile>) -> Shm {
        Shm {
            file,
            regions: Mutex::new(Regions {
                size: 0,
                list: Vec::new(),
            }),
            fast: Default::default(),
            fast_size: AtomicUsize::new(0),
            slots: Mutex::new(Slots::default()),
            #[cfg(test)]
            sys_locks: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Open the `-shm` file `path` of the database open as `db`
    /// (`unixOpenSharedMemory`): read-write and created with the
    /// database's permissions unless `readonly_shm`, else (or when that
    /// fails) read-only; then DMS (see the module notes). The code is
    /// `SQLITE_OK` or `SQLITE_READONLY_CANTINIT`.
    ///
    /// # Errors
    /// `SQLITE_CANTOPEN` (no such file read-only), `SQLITE_BUSY` (another
    /// process is initializing it), `SQLITE_IOERR_*`, with a message.
    pub(crate) fn open(
        path: PathBuf,
        db: &File,
        readonly_shm: bool,
    ) -> Result<(Shm, c_int), (c_int, String)> {
        // The database's mode, past the umask, and (as root) its owner:
        // every user who may write the database must be able to write its
        // index (`filemode`, as `unixOpenSharedMemory`).
        let meta = db.metadata().map_err(|e| {
            crate::sqlite::lasterror::note_errno(&e);
            (
                SQLITE_IOERR_FSTAT,
                format!("kxarray: fstat of the database of {}: {e}", path.display()),
            )
        })?;
        let how = crate::sys::filemode::Create {
            mode: meta.mode() & 0o777,
            owner: Some((meta.uid(), meta.gid())),
        };
        let mode = how.mode;
        let open = |write: bool| {
            let mut o = OpenOptions::new();
            o.read(true)
                .write(write)
                .create(write)
                .truncate(false)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW);
            o.open(&path)
        };
        let (fd, readonly) = match (!readonly_shm).then(|| open(true)) {
            Some(Ok(f)) => (f, false),
            _ => match open(false) {
                Ok(f) => (f, true),
                Err(e) => {
                    crate::sqlite::lasterror::note_errno(&e);
                    return Err((
                        SQLITE_CANTOPEN,
                        format!("kxarray: open {}: {e}", path.display()),
                    ));
                }
            },
        };
        crate::sys::filemode::settle(&fd, how);
        let shm = Shm::with_file(Some(ShmFile {
            fd,
            path,
            readonly,
            unlocked: AtomicBool::new(false),
        }));
        let rc = shm.lock_dms();
        if rc != SQLITE_OK && rc != SQLITE_READONLY_CANTINIT {
            let f = shm.file.as_ref().map(|f| f.path.display().to_string());
            return Err((
                rc,
                format!("kxarray: locking {}: busy or failed", f.unwrap_or_default()),
            ));
        }
        Ok((shm, rc))
    }

    /// Take DMS shared, first reinitializing the file when no other
    /// process holds it (`unixLockSharedMemory`).
    fn lock_dms(&self) -> c_int {
        let Some(f) = &self.file else {
            return SQLITE_OK;
        };
        match oslock::conflict(&f.fd, Kind::Write, SHM_DMS, 1) {
            Err(_) => return SQLITE_IOERR_LOCK,
            Ok(None) if f.readonly => {
                f.unlocked.store(true, Ordering::Relaxed);
                return SQLITE_READONLY_CANTINIT;
            }
            Ok(None) => {
                if let Err(e) = oslock::set(&f.fd, Kind::Write, SHM_DMS, 1) {
                    return lock_code(&e, SQLITE_IOERR_LOCK);
                }
                if f.fd.set_len(3).is_err() {
                    return SQLITE_IOERR_SHMOPEN;
                }
            }
            Ok(Some(Kind::Write)) => return SQLITE_BUSY,
            Ok(Some(_)) => {}
        }
        match oslock::set(&f.fd, Kind::Read, SHM_DMS, 1) {
            Ok(()) => {
                f.unlocked.store(false, Ordering::Relaxed);
                SQLITE_OK
            }
            Err(e) => lock_code(&e, SQLITE_IOERR_LOCK),
        }
    }

    /// Region `index` of `size` bytes (`xShmMap`): its address (null when
    /// it does not exist and `extend` is false) and `SQLITE_OK`, or
    /// `SQLITE_READONLY` for a read-only `-shm`; or an error code (a size
    /// different from the first region's, a failed map or extension, or
    /// DMS still refused for a read-only `-shm`).
    pub(crate) fn map(&self, index: usize, size: usize, extend: bool) -> (*mut c_void, c_int) {
        let mut r = lock(&self.regions);
        let mut rc = SQLITE_OK;
        if let Some(f) = &self.file {
            if f.unlocked.load(Ordering::Relaxed) {
                rc = self.lock_dms();
            }
        }
        if rc == SQLITE_OK {
            rc = self.map_locked(&mut r, index, size, extend);
        }
        let p = r
            .list
            .get(index)
            .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast());
        if rc == SQLITE_OK && self.file.as_ref().is_some_and(|f| f.readonly) {
            rc = SQLITE_READONLY;
        }
        (p, rc)
    }

    fn map_locked(&self, r: &mut Regions, index: usize, size: usize, extend: bool) -> c_int {
        if r.list.is_empty() {
            r.size = size;
        }
        if size != r.size || size == 0 || !size.is_multiple_of(REGION_ALIGN) {
            return SQLITE_IOERR_SHMMAP;
        }
        if index < r.list.len() {
            return SQLITE_OK;
        }
        let Some(need) = (index + 1).checked_mul(size) else {
            return SQLITE_IOERR_SHMMAP;
        };
        let Some(f) = &self.file else {
            if !extend {
                return SQLITE_OK;
            }
            let Ok(layout) = Layout::from_size_align(size, REGION_ALIGN) else {
                return SQLITE_IOERR_SHMMAP;
            };
            while r.list.len() <= index {
                // SAFETY: `layout` has a non-zero size (checked above).
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                let Some(p) = NonNull::new(p) else {
                    return SQLITE_IOERR_SHMMAP;
                };
                self.push(r, p);
            }
            return SQLITE_OK;
        };
        let Ok(m) = f.fd.metadata() else {
            return SQLITE_IOERR_SHMSIZE;
        };
        if m.len() < need as u64 {
            if !extend {
                return SQLITE_OK;
            }
            // The last byte of each new page, as the unix VFS.
            let pg = REGION_ALIGN as u64;
            for page in m.len() / pg..need as u64 / pg {
                if f.fd.write_all_at(&[0], page * pg + pg - 1).is_err() {
                    return SQLITE_IOERR_SHMSIZE;
                }
            }
        }
        let prot = if f.readonly {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        while r.list.len() <= index {
            let off = (r.list.len() * size) as libc::off_t;
            // SAFETY: a new shared mapping of `size` bytes of the open
            // `-shm` file, at an address the kernel picks: no existing
            // memory is affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    prot,
                    libc::MAP_SHARED,
                    f.fd.as_raw_fd(),
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                return SQLITE_IOERR_SHMMAP;
            }
            let Some(p) = NonNull::new(p.cast::<u8>()) else {
                return SQLITE_IOERR_SHMMAP;
            };
            self.push(r, p);
        }
        SQLITE_OK
    }

    /// Add the region just mapped or allocated at `p` to `r` (the regions,
    /// locked), and publish its address in `fast` (after the size).
    fn push(&self, r: &mut Regions, p: NonNull<u8>) {
        if let Some(slot) = self.fast.get(r.list.len()) {
            self.fast_size.store(r.size, Ordering::Relaxed);
            slot.store(p.as_ptr(), Ordering::Release);
        }
        r.list.push(p);
    }

    /// The 32-bit word `i` of region `region`, read atomically; `None`
    /// when SQLite has not mapped that region (`xShmMap`: this never maps
    /// one, whatever the `-shm` says) or no region was mapped yet (the size
    /// is unknown).
    pub(crate) fn word(&self, region: usize, i: usize) -> Option<u32> {
        self.words(region, [i]).map(|[w]| w)
    }

    /// Words `idx` of region `region`, each read atomically (`Acquire`) in
    /// the order given, as [`Shm::word`] reads one (the coherence check
    /// reads nine words per WAL read transaction): without a lock when the region
    /// is one of the first [`FAST_REGIONS`] and mapped, else under one
    /// lock of the regions; `None` when a word is past the regions' size or
    /// the region is not mapped.
    #[inline]
    pub(crate) fn words<const N: usize>(&self, region: usize, idx: [usize; N]) -> Option<[u32; N]> {
        let base = self.fast.get(region).map(|p| p.load(Ordering::Acquire));
        match base.and_then(NonNull::new) {
            Some(base) => {
                // The size was stored before the address (`push`), which
                // this load acquired.
                let size = self.fast_size.load(Ordering::Relaxed);
                // SAFETY: a published region of `self` (mapped, never
                // unmapped before `self` drops) and its size; regions are
                // 4096-aligned.
                unsafe { Self::read_words(base, size, idx) }
            }
            None => self.words_locked(region, idx),
        }
    }

    /// [`Shm::words`] under the regions' mutex, for a region past the
    /// published ones (never mapping one).
    #[cold]
    #[inline(never)]
    fn words_locked<const N: usize>(&self, region: usize, idx: [usize; N]) -> Option<[u32; N]> {
        let r = lock(&self.regions);
        if r.list.is_empty() || idx.iter().any(|&i| (i + 1) * 4 > r.size) {
            return None;
        }
        let base = *r.list.get(region)?;
        // SAFETY: a region of `self` (valid while `self` lives) and its
        // size; regions are 4096-aligned.
        unsafe { Self::read_words(base, r.size, idx) }
    }

    /// Words `idx` of the region at `base`, of `size` bytes; `None` when
    /// one is past `size`.
    ///
    /// # Safety
    /// `base` is a region of `size` bytes, 4-aligned, that a live `Shm`
    /// mapped or allocated (so it stays valid for the call).
    #[inline]
    unsafe fn read_words<const N: usize>(
        base: NonNull<u8>,
        size: usize,
        idx: [usize; N],
    ) -> Option<[u32; N]> {
        if idx.iter().any(|&i| (i + 1) * 4 > size) {
            return None;
        }
        Some(idx.map(|i| {
            // SAFETY: word `i` lies inside the region (checked above: `(i +
            // 1) * 4 <= size`), valid for the call and 4-aligned (per the
            // caller).
            let p = unsafe { base.as_ptr().add(i * 4) }.cast::<AtomicU32>();
            // SAFETY: `p` is valid and aligned for an `AtomicU32` (above);
            // the memory is shared with SQLite and other processes, which
            // write it with plain stores: an atomic load reads a whole word.
            unsafe { &*p }.load(Ordering::Acquire)
        }))
    }

    /// Whether another process holds a lock on a WAL read-mark slot (3 to
    /// 7: `SQLITE_FCNTL_EXTERNAL_READER`, as `unixFcntlExternalReader`;
    /// its `F_GETLK` and this `F_OFD_GETLK` see the same locks).
    ///
    /// # Errors
    /// `fcntl`'s error.
    pub(crate) fn external_reader(&self) -> std::io::Result<bool> {
        self.held_elsewhere(3, SQLITE_SHM_NLOCK - 3)
    }

    /// Whether another process holds a lock on `n` lock slots from `first`
    /// (`F_OFD_GETLK`); false for an index in process memory.
    ///
    /// # Errors
    /// `fcntl`'s error.
    pub(crate) fn held_elsewhere(&self, first: c_int, n: c_int) -> std::io::Result<bool> {
        let Some(f) = &self.file else {
            return Ok(false);
        };
        let start = SHM_LOCK_BASE + i64::from(first);
        Ok(oslock::conflict(&f.fd, Kind::Write, start, i64::from(n))?.is_some())
    }

    /// Regions mapped now (SQLite's `xShmMap` calls made them).
    pub(crate) fn mapped(&self) -> usize {
        lock(&self.regions).list.len()
    }

    /// Delete the `-shm` file (the last handle unmapped with SQLite's
    /// delete flag).
    pub(crate) fn unlink(&self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(&f.path);
        }
    }

    /// Set or release the process's OFD lock on slots `from..from + n`.
    #[inline]
    fn sys_lock(&self, kind: Kind, from: usize, n: usize) -> Result<(), std::io::Error> {
        match &self.file {
            Some(f) => {
                #[cfg(test)]
                self.sys_locks.fetch_add(1, Ordering::Relaxed);
                oslock::set(&f.fd, kind, SHM_LOCK_BASE + from as i64, n as i64)
            }
            None => Ok(()),
        }
    }

    /// Release the read lock of a downgraded slot (see the module notes)
    /// in `slots`, locked. A failure leaves a read lock no handle holds
    /// (released with the `-shm` descriptor at the latest); the call that
    /// found it goes on.
    fn release_downgraded(&self, slots: &mut Slots) {
        if let Some(d) = slots.downgraded.take() {
            let _ = self.sys_lock(Kind::Unlock, d, 1);
        }
    }

    /// Regions mapped now.
    #[cfg(test)]
    pub(crate) fn regions(&self) -> usize {
        lock(&self.regions).list.len()
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let r = lock(&self.regions);
        match &self.file {
            Some(_) => {
                for p in &r.list {
                    // SAFETY: every region was mapped with `r.size` bytes
                    // and is unmapped once, here; SQLite no longer uses it
                    // (every handle unmapped).
                    unsafe { libc::munmap(p.as_ptr().cast(), r.size) };
                }
            }
            None => {
                if let Ok(layout) = Layout::from_size_align(r.size, REGION_ALIGN) {
                    for p in &r.list {
                        // SAFETY: every region was allocated with this
                        // layout (all regions have `r.size` bytes) and is
                        // freed once, here.
                        unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
                    }
                }
            }
        }
    }
}

/// One handle's attachment to a [`Shm`].
pub(crate) struct ShmHandle {
    pub(crate) shm: Arc<Shm>,
    shared: u8,
    exclusive: u8,
    /// A WAL read lock was taken since the handle's last read of the
    /// database: the next read runs the WAL check first
    /// (`Inode::recheck_wal`).
    pub(crate) recheck: bool,
}

/// A test's hook: the lock slot it waits for, and what it runs.
#[cfg(test)]
type UnlockHook = Option<(c_int, Box<dyn FnOnce()>)>;

#[cfg(test)]
thread_local! {
    /// A test's stand-in for another process acting right after this
    /// thread releases lock slot `.0` (run once).
    pub(crate) static AFTER_UNLOCK: std::cell::RefCell<UnlockHook> =
        std::cell::RefCell::new(None);
}

/// Run what a test put in [`AFTER_UNLOCK`] for slot `offset`.
#[cfg(test)]
fn after_unlock(offset: c_int) {
    let hook = AFTER_UNLOCK.with(|h| {
        let mut h = h.borrow_mut();
        h.as_ref()
            .is_some_and(|(at, _)| *at == offset)
            .then(|| h.take())
            .flatten()
    });
    if let Some((_, f)) = hook {
        f();
    }
}

impl ShmHandle {
    pub(crate) fn new(shm: Arc<Shm>) -> ShmHandle {
        ShmHandle {
            shm,
            shared: 0,
            exclusive: 0,
            recheck: false,
        }
    }

    /// `xShmLock(offset, n, flags)`: `SQLITE_OK`, `SQLITE_BUSY` (held
    /// elsewhere, or any failure to set the system lock, as the unix VFS),
    /// `SQLITE_IOERR_SHMLOCK` when a lock cannot be released, or
    /// `SQLITE_IOERR_SHMMAP` for a range outside the eight slots.
    #[inline]
    pub(crate) fn lock(&mut self, offset: c_int, n: c_int, flags: c_int) -> c_int {
        if offset < 0 || n < 1 || offset + n > SQLITE_SHM_NLOCK {
            return SQLITE_IOERR_SHMMAP;
        }
        let (from, to) = (offset as usize, (offset + n) as usize);
        let mask: u8 = (((1u16 << n) - 1) << offset) as u8;
        let lock_shared = flags == SQLITE_SHM_LOCK | SQLITE_SHM_SHARED;
        if lock_shared && self.shared & mask == mask {
            // held already by this handle (n == 1 for shared locks)
            return SQLITE_OK;
        }
        // The fields apart: `shm` is read while the masks change.
        let ShmHandle {
            shm,
            shared,
            exclusive,
            ..
        } = self;
        let mut guard = lock(&shm.slots);
        let slots = &mut *guard;
        if slots.downgraded.is_some() {
            if lock_shared && slots.downgraded == Some(from) {
                // The shared lock SQLite released the exclusive one for:
                // its read lock is held already.
                slots.downgraded = None;
                slots.held[from] = 1;
                *shared |= mask;
                return SQLITE_OK;
            }
            shm.release_downgraded(slots);
        }
        if flags & SQLITE_SHM_UNLOCK != 0 {
            let mut rc = SQLITE_OK;
            let unlock_shared = flags & SQLITE_SHM_SHARED != 0;
            let mine = if unlock_shared { shared } else { exclusive };
            // the slots of the range this handle holds, one bit each
            let mut held = *mine & mask;
            *mine &= !mask;
            // a reader slot held exclusive, released alone: downgraded
            let downgrade = !unlock_shared && n == 1 && from >= READ_LOCK1 && shm.file.is_some();
            while held != 0 {
                let i = held.trailing_zeros() as usize;
                held &= held - 1;
                let s = &mut slots.held[i];
                *s = if unlock_shared { *s - 1 } else { 0 };
                if *s != 0 {
                    continue;
                }
                if downgrade && shm.sys_lock(Kind::Read, i, 1).is_ok() {
                    slots.downgraded = Some(i);
                } else if shm.sys_lock(Kind::Unlock, i, 1).is_err() {
                    rc = SQLITE_IOERR_SHMLOCK;
                }
            }
            drop(guard);
            #[cfg(test)]
            after_unlock(offset);
            return rc;
        }
        debug_assert!(flags & SQLITE_SHM_LOCK != 0);
        if lock_shared {
            let s = &mut slots.held[from];
            if *s < 0 {
                return SQLITE_BUSY;
            }
            // Any failure of the system lock is SQLITE_BUSY, as in
            // `unixShmSystemLock` (a write lock on a read-only `-shm`).
            if *s == 0 && shm.sys_lock(Kind::Read, from, 1).is_err() {
                return SQLITE_BUSY;
            }
            *s += 1;
            *shared |= mask;
            return SQLITE_OK;
        }
        debug_assert!(flags & SQLITE_SHM_EXCLUSIVE != 0);
        let mine = *exclusive;
        let range = &mut slots.held[from..to];
        if range
            .iter()
            .zip(from..)
            .any(|(&s, i)| s != 0 && mine & (1 << i) == 0)
        {
            return SQLITE_BUSY;
        }
        // A failed F_OFD_SETLK changes nothing; any failure is
        // SQLITE_BUSY, as above.
        if mask & !mine != 0 && shm.sys_lock(Kind::Write, from, to - from).is_err() {
            return SQLITE_BUSY;
        }
        for s in range {
            *s = -1;
        }
        *exclusive |= mask;
        SQLITE_OK
    }

    /// `xShmLock(offset, n, flags)` on this handle with `check` run on its
    /// index: before the call for a release (which never fails: the
    /// check only records), after it for a lock that was granted; a lock
    /// whose check fails, or unwinds, is released again before this returns
    /// (or the unwinding goes on), so no other process meets a lock this one
    /// no longer holds for a reason.
    ///
    /// # Errors
    /// The failed check's message (the lock released): the caller returns
    /// `SQLITE_IOERR_SHMLOCK`.
    pub(crate) fn lock_checked(
        &mut self,
        (offset, n, flags): (c_int, c_int, c_int),
        check: impl FnOnce(&Shm) -> Result<(), String>,
    ) -> Result<c_int, String> {
        let unlock = flags & SQLITE_SHM_UNLOCK != 0;
        if unlock {
            let shm = Arc::clone(&self.shm);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&shm)));
            let rc = self.lock(offset, n, flags);
            return match r {
                Ok(_) => Ok(rc),
                Err(p) => std::panic::resume_unwind(p),
            };
        }
        let rc = self.lock(offset, n, flags);
        if rc != SQLITE_OK {
            return Ok(rc);
        }
        let shm = Arc::clone(&self.shm);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&shm)));
        let kind = flags & (SQLITE_SHM_EXCLUSIVE | SQLITE_SHM_SHARED);
        match r {
            Ok(Ok(())) => Ok(SQLITE_OK),
            Ok(Err(msg)) => {
                self.lock(offset, n, SQLITE_SHM_UNLOCK | kind);
                Err(msg)
            }
            Err(p) => {
                self.lock(offset, n, SQLITE_SHM_UNLOCK | kind);
                std::panic::resume_unwind(p)
            }
        }
    }

    /// Whether the handle holds slot `i` exclusive.
    pub(crate) fn holds_exclusive(&self, i: c_int) -> bool {
        (0..SQLITE_SHM_NLOCK).contains(&i) && self.exclusive & (1 << i) != 0
    }
}

impl Drop for ShmHandle {
    fn drop(&mut self) {
        // Release whatever the handle still holds.
        let shm = Arc::clone(&self.shm);
        let mut slots = lock(&shm.slots);
        shm.release_downgraded(&mut slots);
        for (i, s) in slots.held.iter_mut().enumerate() {
            if self.exclusive & (1 << i) != 0 {
                *s = 0;
                let _ = shm.sys_lock(Kind::Unlock, i, 1);
            } else if self.shared & (1 << i) != 0 {
                *s -= 1;
                if *s == 0 {
                    let _ = shm.sys_lock(Kind::Unlock, i, 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_stable_and_zeroed() {
        let s = Shm::heap();
        assert_eq!(s.map(0, 32768, false), (std::ptr::null_mut(), SQLITE_OK));
        let (a, rc) = s.map(0, 32768, true);
        assert_eq!(rc, SQLITE_OK);
        let (c, _) = s.map(2, 32768, true);
        assert_eq!(s.regions(), 3);
        assert_eq!(s.map(0, 32768, false).0, a);
        assert_eq!(s.map(2, 32768, false).0, c);
        // SAFETY: region 2 has 32768 bytes, zeroed.
        assert!(unsafe { std::slice::from_raw_parts(c.cast::<u8>(), 32768) }
            .iter()
            .all(|&b| b == 0));
        assert_eq!(s.map(1, 4096, true).1, SQLITE_IOERR_SHMMAP);
    }

    /// The coherence check reads the index header at every WAL read
    /// transaction: once a region is mapped its words are read without
    /// the regions' mutex (here held by someone else, on this very thread:
    /// a read that took it would never return); a region past the
    /// published ones is read under it.
    #[test]
    fn mapped_regions_are_read_without_the_lock() {
        let s = Shm::heap();
        // nothing mapped yet: the size is unknown
        assert_eq!(s.words(0, [0]), None);
        let (p0, _) = s.map(0, 32768, true);
        // SAFETY: region 0 has 32768 bytes, page-aligned: word 24 is inside.
        let w = unsafe { p0.cast::<u32>().add(24) };
        // SAFETY: as above (and 4-aligned).
        unsafe { w.write(7) };
        let (last, _) = s.map(FAST_REGIONS, 32768, true);
        // SAFETY: as above, region FAST_REGIONS.
        let w = unsafe { last.cast::<u32>().add(3) };
        // SAFETY: as above.
        unsafe { w.write(9) };
        {
            let _held = lock(&s.regions);
            assert_eq!(s.words(0, [24, 0]), Some([7, 0]));
            assert_eq!(s.word(FAST_REGIONS - 1, 0), Some(0));
            // past the region's size: none, as under the lock
            assert_eq!(s.words(0, [24, 32768 / 4]), None);
        }
        assert_eq!(s.word(FAST_REGIONS, 3), Some(9));
        assert_eq!(s.word(FAST_REGIONS + 1, 0), None);
        assert_eq!(s.mapped(), FAST_REGIONS + 1);
    }

    #[test]
    fn lock_slots() {
        let shm = Arc::new(Shm::heap());
        let mut a = ShmHandle::new(Arc::clone(&shm));
        let mut b = ShmHandle::new(Arc::clone(&shm));
        let l = SQLITE_SHM_LOCK;
        let u = SQLITE_SHM_UNLOCK;
        let (sh, ex) = (SQLITE_SHM_SHARED, SQLITE_SHM_EXCLUSIVE);
        assert_eq!(a.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | ex), SQLITE_BUSY);
        assert_eq!(a.lock(3, 1, u | sh), SQLITE_OK);
        assert_eq!(b.lock(0, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 1, l | sh), SQLITE_BUSY);
        assert_eq!(a.lock(0, 8, l | ex), SQLITE_BUSY);
        drop(b); // releases slot 0 (exclusive) and 3 (shared)
        assert_eq!(a.lock(0, 8, l | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 8, u | ex), SQLITE_OK);
        assert_eq!(lock(&shm.slots).held, [0; 8]);
        assert_eq!(a.lock(7, 2, l | ex), SQLITE_IOERR_SHMMAP);
    }

    /// A WAL read transaction's start (`walTryBeginRead`: a reader slot
    /// exclusive to move its mark, released, then taken shared) makes one
    /// system lock call less than taking and releasing each: the release
    /// downgrades to a read lock, which the shared lock takes over. Another
    /// process sees the slot read-locked meanwhile, and free once the
    /// reader lets go; any other lock call of the process releases a
    /// downgraded slot first.
    #[test]
    fn a_reader_slot_released_from_exclusive_is_taken_shared_without_a_system_call() {
        let dir = tempfile::tempdir().unwrap();
        let db = File::create(dir.path().join("db")).unwrap();
        let path = dir.path().join("db-shm");
        let (s1, _) = Shm::open(path.clone(), &db, false).unwrap();
        let (s2, _) = Shm::open(path, &db, false).unwrap();
        let (s1, s2) = (Arc::new(s1), Arc::new(s2));
        let (mut a, mut b) = (ShmHandle::new(Arc::clone(&s1)), ShmHandle::new(s2));
        let (l, u) = (SQLITE_SHM_LOCK, SQLITE_SHM_UNLOCK);
        let (sh, ex) = (SQLITE_SHM_SHARED, SQLITE_SHM_EXCLUSIVE);
        let calls = || s1.sys_locks.load(Ordering::Relaxed);
        let r1 = READ_LOCK1 as c_int;
        let start = calls();
        assert_eq!(a.lock(r1, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(r1, 1, u | ex), SQLITE_OK);
        // the other process: read-locked (downgraded), not free
        assert_eq!(b.lock(r1, 1, l | ex), SQLITE_BUSY);
        assert_eq!(b.lock(r1, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(r1, 1, u | sh), SQLITE_OK);
        assert_eq!(a.lock(r1, 1, l | sh), SQLITE_OK);
        assert_eq!(calls() - start, 2, "the shared lock made a system call");
        assert_eq!(b.lock(r1, 1, l | ex), SQLITE_BUSY);
        assert_eq!(a.lock(r1, 1, u | sh), SQLITE_OK);
        assert_eq!(calls() - start, 3);
        assert_eq!(b.lock(r1, 1, l | ex), SQLITE_OK);
        assert_eq!(b.lock(r1, 1, u | ex), SQLITE_OK);
        // a downgraded slot, then another lock call of that process: the
        // read lock is released first
        assert_eq!(a.lock(r1 + 1, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(r1 + 1, 1, u | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 1, l | ex), SQLITE_OK);
        assert_eq!(b.lock(r1 + 1, 1, l | ex), SQLITE_OK);
        assert_eq!(b.lock(r1 + 1, 1, u | ex), SQLITE_OK);
        // ... and when a handle closes
        assert_eq!(a.lock(r1 + 2, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(r1 + 2, 1, u | ex), SQLITE_OK);
        drop(a);
        assert_eq!(b.lock(r1 + 2, 1, l | ex), SQLITE_OK);
        // slot 0 (the write lock) and several reader slots at once are
        // released, not downgraded
        assert_eq!(b.lock(r1 + 2, 1, u | ex), SQLITE_OK);
        let mut c = ShmHandle::new(Arc::clone(&s1));
        let mut d = ShmHandle::new(Arc::clone(&s1));
        drop(b);
        assert_eq!(c.lock(r1, 4, l | ex), SQLITE_OK);
        assert_eq!(c.lock(r1, 4, u | ex), SQLITE_OK);
        assert_eq!(lock(&s1.slots).downgraded, None);
        assert_eq!(c.lock(0, 1, l | ex), SQLITE_OK);
        assert_eq!(c.lock(0, 1, u | ex), SQLITE_OK);
        assert_eq!(lock(&s1.slots).downgraded, None);
        // another handle of the process takes the downgraded slot over too
        assert_eq!(c.lock(r1, 1, l | ex), SQLITE_OK);
        assert_eq!(c.lock(r1, 1, u | ex), SQLITE_OK);
        assert_eq!(d.lock(r1, 1, l | sh), SQLITE_OK);
        assert_eq!(c.lock(r1, 1, l | sh), SQLITE_OK);
        assert_eq!(lock(&s1.slots).held[READ_LOCK1], 2);
        assert_eq!(c.lock(r1, 1, l | ex), SQLITE_BUSY);
    }

    /// Two `-shm` opens of one file stand for two processes (OFD locks of
    /// two descriptions exclude each other as two processes' do).
    #[test]
    fn file_backed_index_across_two_openers() {
        let dir = tempfile::tempdir().unwrap();
        let db = File::create(dir.path().join("db")).unwrap();
        let path = dir.path().join("db-shm");
        std::fs::write(&path, b"garbage left by a dead process").unwrap();
        let (s1, rc) = Shm::open(path.clone(), &db, false).unwrap();
        assert_eq!(rc, SQLITE_OK);
        // the first opener truncated the leftover
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3);
        let (p1, rc) = s1.map(0, 32768, true);
        assert_eq!(rc, SQLITE_OK);
        // SAFETY: region 0 is mapped read-write, 32768 bytes: word 5 is
        // inside it.
        let w5 = unsafe { p1.cast::<u32>().add(5) };
        // SAFETY: as above, and 4-aligned (the mapping is page-aligned).
        unsafe { w5.write_volatile(0xfeed) };
        let (s2, rc) = Shm::open(path.clone(), &db, false).unwrap();
        assert_eq!(rc, SQLITE_OK);
        // the second kept what the first wrote
        assert_eq!(s2.word(0, 5), None); // nothing mapped yet: size unknown
        let (p2, _) = s2.map(0, 32768, false);
        assert!(!p2.is_null());
        assert_eq!(s2.word(0, 5), Some(0xfeed));
        // several words under one lock: the same values, in the order asked
        assert_eq!(s2.words(0, [5, 4, 5]), Some([0xfeed, 0, 0xfeed]));
        // one word past the region's size: none of them
        assert_eq!(s2.words(0, [5, 32768 / 4]), None);
        let (s1, s2) = (Arc::new(s1), Arc::new(s2));
        let (mut a, mut b) = (ShmHandle::new(Arc::clone(&s1)), ShmHandle::new(s2));
        let (l, u) = (SQLITE_SHM_LOCK, SQLITE_SHM_UNLOCK);
        let (sh, ex) = (SQLITE_SHM_SHARED, SQLITE_SHM_EXCLUSIVE);
        assert_eq!(a.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | ex), SQLITE_BUSY);
        assert_eq!(b.lock(0, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 1, l | ex), SQLITE_BUSY);
        assert_eq!(b.lock(0, 1, u | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 1, l | ex), SQLITE_OK);
        // a read-only opener while others hold DMS: maps, read-only
        let (s3, rc) = Shm::open(path.clone(), &db, true).unwrap();
        assert_eq!(rc, SQLITE_OK);
        let (p3, rc) = s3.map(0, 32768, false);
        assert_eq!(rc, SQLITE_READONLY);
        assert!(!p3.is_null());
        drop((a, b, s1, s3));
        // a read-only opener when nobody holds DMS: CANTINIT
        let (s4, rc) = Shm::open(path, &db, true).unwrap();
        assert_eq!(rc, SQLITE_READONLY_CANTINIT);
        assert_eq!(s4.map(0, 32768, false).1, SQLITE_READONLY_CANTINIT);
    }
    /// A lock taken before its check is released when the check fails
    /// and when it panics: another process (a second `-shm` open) can take
    /// the checkpoint lock afterwards. Before, a panic in the check (a
    /// debug build's overflow on a forged `-shm`) unwound with the lock
    /// held, and another process's checkpoint got `SQLITE_BUSY` until this
    /// one closed.
    #[test]
    fn a_lock_whose_check_fails_or_unwinds_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let db = File::create(dir.path().join("db")).unwrap();
        let path = dir.path().join("db-shm");
        let (mine, _) = Shm::open(path.clone(), &db, false).unwrap();
        let (theirs, _) = Shm::open(path, &db, false).unwrap();
        let mut s = ShmHandle::new(Arc::new(mine));
        let mut other = ShmHandle::new(Arc::new(theirs));
        const CKPT: c_int = 1; // WAL_CKPT_LOCK
        let ckpt = (CKPT, 1, SQLITE_SHM_LOCK | SQLITE_SHM_EXCLUSIVE);
        let free = |o: &mut ShmHandle| {
            let rc = o.lock(CKPT, 1, SQLITE_SHM_LOCK | SQLITE_SHM_EXCLUSIVE);
            o.lock(CKPT, 1, SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE);
            rc == SQLITE_OK
        };
        assert_eq!(s.lock_checked(ckpt, |_| Ok(())), Ok(SQLITE_OK));
        assert!(!free(&mut other), "held while checked");
        s.lock(CKPT, 1, SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE);
        assert!(s.lock_checked(ckpt, |_| Err("stale".into())).is_err());
        assert!(free(&mut other), "released after a failed check");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.lock_checked(ckpt, |_| panic!("a check that overflows"))
        }));
        assert!(unwound.is_err());
        assert!(free(&mut other), "released after a check that unwound");
    }
}
