//! The VFS object and its `sqlite3_vfs` callbacks, and the one
//! [`PageCache`] of the process (the [`Api`] table and the counters the
//! files share are in `process`).
//!
//! Owns `xOpen` (which files become which [`Inode`]s, with which settings),
//! `xDelete`, `xAccess`, `xFullPathname` and the helpers SQLite asks any
//! VFS for (randomness, sleep, time; `xDl*` go to the default VFS).
//!
//! Invariants:
//! - one `sqlite3_vfs` object per process, allocated once and never freed
//!   or moved (SQLite links it into its list); registering again
//!   re-registers the same object;
//! - one `PageCache` per process, made by the first open with that open's
//!   capacity; a later open asking for another capacity gets a notice in
//!   SQLite's log and the existing cache;
//! - `xOpen` leaves `pMethods` null unless it succeeds (SQLite then never
//!   calls `xClose`).

use crate::boundary::open_error::{report, OpenError};
use crate::io::file::{guard, Handle, KxFile, METHODS};
use crate::locking::inode::{self, Inode, WritePolicy};
use crate::sqlite::api::Api;
use crate::sqlite::config::Settings;
use crate::sqlite::ffi::*;
use crate::sqlite::process::{api, configured_capacity, BUDGET, CONFIGURED};
use crate::wal::walsize::WalSize;
use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, FileOptions, PageCache, SharedConfig};
use std::ffi::{CStr, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The longest path name the VFS accepts (as the unix VFS).
const MAX_PATHNAME: c_int = 512;

static CACHE: OnceLock<PageCache> = OnceLock::new();
/// The process-wide cache, if an open has made it.
pub fn cache() -> Option<&'static PageCache> {
    CACHE.get()
}

/// The name of the shared cache's region in the user's runtime directory
/// (`kxarray::pagecache::SharedConfig`): `sqlite` for the processes whose
/// memory budget is the machine's, `sqlite-<hash>` for those of one
/// cgroup with a limit of its own (the budget's scope,
/// `kxarray::memory::Scope`). So the processes of one budget share one
/// region, whose memory is charged to their cgroup and sized by their
/// budget; a container's processes do not join the host's.
fn shared_region_name() -> String {
    match kxarray::memory::Scope::from_system() {
        Ok(s) if s.key != "machine" => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in s.key.bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            format!("sqlite-{h:016x}")
        }
        _ => "sqlite".to_string(),
    }
}

/// The smallest capacity a cache in the budget starts with (the budget
/// grows it at once while the cgroup has room).
const BUDGET_START: u64 = 16 << 20;

/// The cache, made with `settings.cache_bytes` if it does not exist yet
/// (with `settings.budget`, started small and joined to the shared memory
/// budget, at most `cache_bytes`; with `settings.pressure`, a pressure
/// monitor following it from a later miss for the life of the process).
/// No thread starts here: the budget's, the monitor's, the I/O engine's
/// and the frames' start with the first reads and writes. The flusher
/// thread is off: every write is written through, so nothing is left
/// dirty for it.
fn cache_for(settings: &Settings) -> &'static PageCache {
    let capacity = settings.cache_bytes;
    let c = CACHE.get_or_init(|| {
        let _ = CONFIGURED.set(capacity);
        let start = if settings.budget {
            capacity.min(BUDGET_START)
        } else {
            capacity
        };
        let mut config = CacheConfig::default().capacity(start).flusher(false);
        if settings.shared && !settings.exclusive {
            // The machine's shared cache for databases (`make_inode`),
            // with room for `kx_cache` when this process makes it.
            config = config.shared_with(SharedConfig {
                name: shared_region_name(),
                // (the index and each member's hints are sized for it)
                max_bytes: Some(capacity),
                ..SharedConfig::default()
            });
        }
        let c = PageCache::new(config);
        if let Some(r) = c.region() {
            // One copy of a database's pages on the machine: what the
            // region holds, the kernel's page cache does not (docs/sqlite.md
            // measures what a unix-VFS process beside then pays).
            r.set_drop_behind(true);
        }
        if settings.budget {
            join_budget(&c, capacity);
        }
        if settings.pressure {
            follow_pressure(&c);
        }
        c
    });
    // The configured capacity (the live one moves with the budget and
    // under pressure).
    let configured = configured_capacity();
    if configured != capacity {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            api().log(
                SQLITE_NOTICE,
                &format!(
                    "kxarray: the process's cache already exists with {configured} bytes; an \
                     open asked for {capacity} (kx_cache applies to the first open only)"
                ),
            )
        });
    }
    c
}

/// Join the shared memory budget with `cache`, wanting at most `want`
/// bytes (its thread starts at a later miss, and a forked child joins as
/// its own member: `kxarray::memory::SharedBudget`); where that fails, one
/// line in SQLite's log and the cache keeps its starting capacity raised
/// to `want`.
fn join_budget(cache: &PageCache, want: u64) {
    use kxarray::memory::BudgetConfig;
    match cache.join_budget(BudgetConfig::new(want)) {
        Ok(b) => {
            let _ = BUDGET.set(b);
        }
        Err(e) => {
            let fixed = match cache.set_capacity(want) {
                Ok(()) => format!("a fixed cache of {want} bytes"),
                Err(c) => format!("the cache stays at {} bytes ({c})", cache.capacity()),
            };
            api().log(
                SQLITE_NOTICE,
                &format!("kxarray: no shared memory budget (thread: {e}); {fixed}"),
            );
        }
    }
}

/// How long after the cache is made the pressure monitor arms its PSI
/// trigger. A short-lived process (a CLI, a test, one shell command) never
/// arms one: closing a trigger costs the kernel an RCU grace period
/// (`psi_trigger_destroy`), 11 ms added to the `sqlite3` shell's exit on
/// this project's machine, and such a process has no cache worth
/// shrinking.
const PRESSURE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Follow memory pressure over `cache`: the process's monitor starts at
/// the cache's first miss [`PRESSURE_DELAY`] or more after the cache was
/// made (no thread before: an idle process has none), and again in a
/// child after `fork` (the parent's is the parent's); its lines go to
/// SQLite's log; where PSI is unavailable, one line there and nothing
/// else.
fn follow_pressure(cache: &PageCache) {
    #[cfg(target_os = "linux")]
    {
        use kxarray::memory::{LogSink, PressureConfig, PressureMonitor};
        type Monitor = Option<(u64, Option<PressureMonitor>)>;
        static MONITOR: std::sync::Mutex<Monitor> = std::sync::Mutex::new(None);
        let made = std::time::Instant::now();
        let c = cache.clone();
        cache.on_demand(move || {
            if made.elapsed() < PRESSURE_DELAY {
                return false;
            }
            let gen = kxarray::fork::generation();
            // Held by a thread of the parent at fork time, or by another
            // thread now: the next miss looks again.
            let Ok(mut m) = MONITOR.try_lock() else {
                return false;
            };
            if m.as_ref().is_some_and(|(g, _)| *g == gen) {
                return true;
            }
            // An inherited monitor's drop touches nothing of the parent's.
            drop(m.take());
            let log = LogSink::Callback(Arc::new(|line: &str| {
                api().log(SQLITE_NOTICE, &format!("kxarray: {line}"))
            }));
            let config = PressureConfig {
                log,
                ..PressureConfig::default()
            };
            *m = Some((
                gen,
                PressureMonitor::start(Arc::new(c.clone()), config).ok(),
            ));
            true
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cache;
}

/// The VFS object (leaked once: SQLite keeps a pointer to it for ever).
struct VfsBox(*mut sqlite3_vfs);
// SAFETY: the object is only written by SQLite's registration (under
// SQLite's own mutex) and read by SQLite; this crate only hands out the
// pointer.
unsafe impl Send for VfsBox {}
// SAFETY: as above.
unsafe impl Sync for VfsBox {}

fn vfs_object() -> *mut sqlite3_vfs {
    static VFS: OnceLock<VfsBox> = OnceLock::new();
    VFS.get_or_init(|| {
        VfsBox(Box::into_raw(Box::new(sqlite3_vfs {
            iVersion: 3,
            szOsFile: std::mem::size_of::<KxFile>() as c_int,
            mxPathname: MAX_PATHNAME,
            pNext: std::ptr::null_mut(),
            zName: c"kxarray".as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        })))
    })
    .0
}

/// Why [`register`](crate::register) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// `sqlite3_vfs_register` returned this SQLite result code.
    Sqlite(i32),
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::Sqlite(c) => write!(f, "sqlite3_vfs_register failed with code {c}"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// Register the VFS with the SQLite `api` belongs to.
pub(crate) fn register_with(api: Api, make_default: bool) -> Result<(), RegisterError> {
    let api = *crate::sqlite::process::set_api(api);
    // kxarray's log records (the I/O engine's line...) go to SQLite's log,
    // not to the standard error of the program that loaded the VFS.
    crate::boundary::logger::install();
    // SAFETY: the VFS object is leaked, so it lives for ever and never
    // moves.
    let rc = unsafe { api.vfs_register(vfs_object(), make_default) };
    if rc == SQLITE_OK {
        Ok(())
    } else {
        Err(RegisterError::Sqlite(rc))
    }
}

/// The path of a name SQLite passes.
///
/// # Safety
/// - `name` is a NUL-terminated string.
unsafe fn path_of(name: *const c_char) -> PathBuf {
    debug_assert!(!name.is_null());
    // SAFETY: per the caller.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    PathBuf::from(OsStr::from_bytes(bytes))
}

/// Open (create) the backend and the cached file of a new inode; `kind`
/// is the file's `SQLITE_OPEN_MAIN_DB`, `SQLITE_OPEN_WAL`, ... bit (0 for a
/// temporary file); `exclusive` its locking mode (`kx_locking`).
#[allow(clippy::too_many_arguments)] // one call site per kind of file
fn make_inode(
    cache: &PageCache,
    path: &Path,
    fd: File,
    direct: bool,
    writable: bool,
    kind: c_int,
    policy: WritePolicy,
    exclusive: bool,
    shared: bool,
) -> Result<Inode, OpenError> {
    let is_db = kind & SQLITE_OPEN_MAIN_DB != 0;
    let is_wal = kind & SQLITE_OPEN_WAL != 0;
    // Shared mode: a journal or WAL other processes write too is read and
    // written on its descriptor, never cached (see `coherence`); not with
    // the crash test's knob, whose point is a journal or WAL kept in the
    // process's cache.
    let uncached = !exclusive
        && !is_db
        && policy == WritePolicy::Through
        && !crate::sqlite::process::write_back_only();
    let backend = if direct {
        FileBackend::create_direct(path)
            .map_err(|e| OpenError::cant_open(format!("kx_direct=1 on {}: {e}", path.display())))?
    } else {
        let dup = fd
            .try_clone()
            .map_err(|e| OpenError::cant_open(format!("dup of {}: {e}", path.display())))?;
        FileBackend::from_file(dup)
    };
    // A main database beside other processes: its pages in the machine's
    // shared cache when the process's cache has joined it (see
    // `cache_for`) and the file can be shared; everything else in the
    // process's own memory.
    let share = is_db
        && shared
        && !exclusive
        && !direct
        && policy == WritePolicy::AtSyncPoint
        && !crate::sqlite::process::write_back_only();
    let opts = FileOptions::default()
        .block_size(if is_db { 4096 } else { 512 })
        .share(share)
        // (the coherence checks compare the header at every lock gap)
        .check_at_open(false);
    let file = cache
        .open_with(backend, opts)
        .map_err(|e| OpenError::cant_open(format!("{}: {e}", path.display())))?;
    // A WAL SQLite can write grows ahead of its frames (`walsize`): set up
    // here, before any handle can read it. Not when write-through is off
    // (the crash test's knob): its frames then go through the cache.
    let wal = if is_wal
        && !uncached
        && writable
        && policy == WritePolicy::Through
        && !crate::sqlite::process::write_back_only()
    {
        Some(
            WalSize::new(&file)
                .map_err(|e| OpenError::cant_open(format!("padding {}: {e}", path.display())))?,
        )
    } else {
        None
    };
    Ok(Inode::new(
        path.to_path_buf(),
        file,
        fd,
        direct,
        writable,
        is_db,
        policy,
    )
    .with_wal(wal)
    .with_mode(exclusive, uncached))
}

/// The body of `xOpen`: the handle, and the flags it was opened with.
///
/// # Safety
/// - `name` is null or the name SQLite passes to `xOpen` (NUL-terminated,
///   with URI parameters after it for databases, journals and WALs).
unsafe fn open(name: *const c_char, flags: c_int) -> Result<(Handle, c_int), OpenError> {
    let api = api();
    let kind = flags & 0x000f_ff00;
    let uri_name = !name.is_null()
        && kind & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL) != 0;
    // SAFETY: a non-null name from xOpen is NUL-terminated.
    let named = (!name.is_null()).then(|| unsafe { path_of(name) });
    // A journal or WAL reaches its database (open in this process, by the
    // name SQLite derives it from) to write it back before its own
    // contents may go (see `file::db_barrier`), follows its locking mode,
    // and takes the settings its open resolved (the same URI parameters,
    // and the environment as it was then: no variable read per journal).
    let db = match &named {
        Some(p) if kind & (SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL) != 0 => db_of(p),
        _ => None,
    };
    let settings = match db.as_ref().and_then(|d| d.settings) {
        Some(s) => s,
        None => Settings::from_uri_and_env(|k| {
            if !uri_name {
                return None;
            }
            let k = std::ffi::CString::new(k).ok()?;
            // SAFETY: a main database, journal or WAL name from xOpen (see
            // the caller's contract).
            unsafe { api.uri_parameter(name, &k) }
        })?,
    };
    if kind & SQLITE_OPEN_MAIN_DB != 0 {
        // A misspelt setting (a URI parameter or a variable) fails the
        // open rather than being ignored.
        let keys = if uri_name {
            // SAFETY: a main database name from xOpen.
            unsafe { api.uri_keys(name) }.unwrap_or_default()
        } else {
            Vec::new()
        };
        let uri = keys.into_iter().map(|k| {
            let c = std::ffi::CString::new(k.as_str()).unwrap_or_default();
            // SAFETY: as above (`keys` is empty unless the name is one).
            let v = unsafe { api.uri_parameter(name, &c) }.unwrap_or_default();
            (k, v)
        });
        crate::sqlite::config::check_names(uri, std::env::vars_os())?;
    }
    let psow = if uri_name && kind & SQLITE_OPEN_MAIN_DB != 0 {
        // SAFETY: a main database name from xOpen.
        unsafe { api.uri_parameter(name, c"psow") }
            .and_then(|v| crate::sqlite::config::parse_bool(&v))
            .unwrap_or(true)
    } else {
        true
    };
    let cache = cache_for(&settings).clone();
    let is_db = kind & SQLITE_OPEN_MAIN_DB != 0;
    let mut out_flags = flags;

    let Some(path) = named else {
        // As the unix VFS's temporary name, counted for an injected fault.
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR, "xOpen of a temporary file") {
            return Err(OpenError::new(rc, "injected fault in xOpen"));
        }
        // A temporary file: anonymous, gone when closed.
        let fd = tempfile::tempfile()
            .map_err(|e| OpenError::cant_open(format!("temporary file: {e}")))?;
        let inode = make_inode(
            &cache,
            Path::new("(temporary file)"),
            fd,
            false,
            true,
            0,
            WritePolicy::Cached,
            true,
            false,
        )?;
        let h = Handle::new(Arc::new(inode), None, cache, settings, psow, false);
        return Ok((h, out_flags));
    };
    let create = flags & SQLITE_OPEN_CREATE != 0;
    let want_write = flags & SQLITE_OPEN_READWRITE != 0;
    let nofollow = flags & SQLITE_OPEN_NOFOLLOW != 0;
    // The mode and owner a new file gets, as the unix VFS gives them
    // (`filemode`: a journal or WAL exactly its database's mode).
    let modeof = if is_db && flags & SQLITE_OPEN_URI != 0 {
        // SAFETY: a main database name from xOpen.
        unsafe { api.uri_parameter(name, c"modeof") }.map(PathBuf::from)
    } else {
        None
    };
    let how = crate::sys::filemode::create_mode(&path, flags, modeof.as_deref()).map_err(
        |(code, e)| {
            crate::sqlite::lasterror::note_errno(&e);
            OpenError::new(code, format!("the mode for {}: {e}", path.display()))
        },
    )?;
    let open = |write: bool| {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(write)
            .mode(how.map_or(crate::sys::filemode::DEFAULT_MODE, |c| c.mode));
        if nofollow {
            o.custom_flags(libc::O_NOFOLLOW);
        }
        if write && want_write && create {
            if flags & SQLITE_OPEN_EXCLUSIVE != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
        }
        o.open(&path)
    };
    let cant_open = |e: io::Error| {
        crate::sqlite::lasterror::note_errno(&e);
        let code = if nofollow && e.raw_os_error() == Some(libc::ELOOP) {
            SQLITE_CANTOPEN_SYMLINK
        } else {
            SQLITE_CANTOPEN
        };
        OpenError::new(code, format!("open {}: {e}", path.display()))
    };
    let denied = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
        )
    };
    // The descriptor is read-write whenever the file allows it, for a
    // read-only open too: the inode it makes is shared with the process's
    // later read-write opens of the file, and a database's OFD lock must
    // be a write lock to keep other processes' writers out (see `inode`).
    // The handle itself stays read-only when SQLite asked for that.
    // A directory opens read-only only, as on the unix VFS (its reads then
    // fail with EISDIR: SQLITE_IOERR_READ).
    let is_dir = |e: &io::Error| e.raw_os_error() == Some(libc::EISDIR) && !want_write;
    let (fd, writable) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if (denied(&e) && (!want_write || path.exists())) || is_dir(&e) => {
            (open(false).map_err(cant_open)?, false)
        }
        Err(e) => return Err(cant_open(e)),
    };
    if let Some(how) = how {
        crate::sys::filemode::settle(&fd, how);
    }
    let key = inode::key_of(&fd).map_err(|e| {
        crate::sqlite::lasterror::note_errno(&e);
        OpenError::cant_open(format!("fstat {}: {e}", path.display()))
    })?;
    let delete_on_close = flags & SQLITE_OPEN_DELETEONCLOSE != 0;
    if delete_on_close {
        // As the unix VFS: unlink now, the descriptor keeps the file.
        let _ = std::fs::remove_file(&path);
    }
    // O_DIRECT for the main database only: its pages are what the machine
    // would otherwise cache twice. A journal or WAL is written in frames
    // that straddle 4 KiB blocks, so direct writes of whole blocks would
    // mix with buffered writes of the partial ones, and each direct write
    // then waits for the kernel to write back and drop the buffered pages
    // it overlaps (bulk loads ran at 0.16x of buffered that way). Never a
    // file already unlinked: the direct descriptor is opened by path.
    let direct = settings.direct && writable && !delete_on_close && is_db;
    let policy = if delete_on_close {
        WritePolicy::Cached
    } else if is_db {
        WritePolicy::AtSyncPoint
    } else {
        WritePolicy::Through
    };
    let exclusive = db.as_ref().map_or(settings.exclusive, |d| d.exclusive);
    let inode = inode::open_or_insert(key, || {
        make_inode(
            &cache,
            &path,
            fd,
            direct,
            writable,
            kind,
            policy,
            exclusive,
            settings.shared,
        )
        .map(|i| if is_db { i.with_settings(settings) } else { i })
    })?;
    if is_db && inode.exclusive != settings.exclusive {
        api.log(
            SQLITE_NOTICE,
            &format!(
                "kxarray: {} is already open with kx_locking={}; this open shares it",
                path.display(),
                if inode.exclusive {
                    "exclusive"
                } else {
                    "shared"
                }
            ),
        );
    }
    if inode.direct != direct && is_db && writable {
        api.log(
            SQLITE_NOTICE,
            &format!(
                "kxarray: {} is already open with kx_direct={}; this open shares it",
                path.display(),
                u8::from(inode.direct)
            ),
        );
    }
    // Read-only when SQLite asked for it, or when the file (or the inode
    // an earlier open made) cannot be written: as the unix VFS, a
    // read-write open falls back to read-only and says so in its flags.
    let readonly = !want_write || !inode.writable;
    if want_write && readonly {
        out_flags = (out_flags & !SQLITE_OPEN_READWRITE) | SQLITE_OPEN_READONLY;
    }
    let mut h = Handle::new(inode, Some(key), cache, settings, psow, readonly);
    h.db_hold = db.as_ref().map(|d| Arc::clone(&d.hold));
    h.db = db.map(|d| Arc::downgrade(&d));
    if is_db {
        // SAFETY: a main database name from xOpen.
        h.readonly_shm = unsafe { api.uri_parameter(name, c"readonly_shm") }
            .and_then(|v| crate::sqlite::config::parse_bool(&v))
            .unwrap_or(false);
    }
    // As the unix VFS (DIRSYNC): every open that may create a journal or
    // WAL syncs its directory at its first xSync, whether or not this open
    // created it: the connection that created it may not be the one whose
    // commit relies on its directory entry.
    let dirsync = create
        && want_write
        && kind & (SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_SUPER_JOURNAL | SQLITE_OPEN_WAL) != 0;
    if dirsync {
        h.dirsync = path.parent().map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p.to_path_buf()
            }
        });
    }
    Ok((h, out_flags))
}

unsafe extern "C" fn x_open(
    _vfs: *mut sqlite3_vfs,
    name: *const c_char,
    file: *mut sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite passes `szOsFile` bytes (a `KxFile`) for the file
        // object, uninitialized: written whole, never read first.
        unsafe {
            file.cast::<KxFile>().write(KxFile {
                base: sqlite3_file {
                    pMethods: std::ptr::null(),
                },
                handle: std::ptr::null_mut(),
            })
        };
        // SAFETY: now initialized, and ours until xOpen returns.
        let kf = unsafe { &mut *file.cast::<KxFile>() };
        // A failure answers `xGetLastError` with this open's errno only.
        crate::sqlite::lasterror::clear();
        // SAFETY: `name` is what SQLite passes to xOpen.
        match unsafe { open(name, flags) } {
            Ok((h, got)) => {
                // The handle is reclaimed by xClose.
                kf.handle = Box::into_raw(Box::new(h));
                kf.base.pMethods = &METHODS;
                if !out_flags.is_null() {
                    // SAFETY: SQLite passes a writable int (or null).
                    unsafe { *out_flags = got };
                }
                SQLITE_OK
            }
            Err(e) => report(&e),
        }
    })
}

/// The database a journal or WAL belongs to, if the process has it open:
/// its name is the database's with `-journal` or `-wal` appended. The
/// database open by that very name, without a system call; else (none,
/// or several by the name) the one the name leads to now.
pub(crate) fn db_of(path: &Path) -> Option<Arc<Inode>> {
    let name = path.as_os_str().as_bytes();
    let db = name
        .strip_suffix(b"-wal")
        .or_else(|| name.strip_suffix(b"-journal"))?;
    if let Some(i) = inode::db_named(db) {
        return Some(i);
    }
    let meta = std::fs::metadata(OsStr::from_bytes(db)).ok()?;
    use std::os::unix::fs::MetadataExt;
    inode::find((meta.dev(), meta.ino())).filter(|i| i.is_db)
}

unsafe extern "C" fn x_delete(
    _vfs: *mut sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    guard(|| {
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR_DELETE, "xDelete") {
            return rc;
        }
        // SAFETY: SQLite passes a NUL-terminated name.
        let path = unsafe { path_of(name) };
        // A journal or WAL goes only once its database's pages are in the
        // file: after a checkpoint whose write-back failed, the WAL is the
        // only copy left of what it committed (SQLite ignores the failure
        // it was told at SQLITE_FCNTL_CKPT_DONE when synchronous=OFF, and
        // the return of this call at close; keeping the file is what
        // counts).
        if let Some(db) = db_of(&path) {
            if let Err(e) = crate::io::file::db_barrier(&db) {
                api().log(
                    SQLITE_IOERR_DELETE,
                    &format!(
                        "kxarray: not deleting {}: its database's pages could not be written \
                         back ({e}); it keeps what they would lose",
                        path.display()
                    ),
                );
                return SQLITE_IOERR_DELETE;
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return SQLITE_IOERR_DELETE_NOENT,
            Err(e) => {
                api().log(
                    SQLITE_IOERR_DELETE,
                    &format!("kxarray: delete {}: {e}", path.display()),
                );
                return SQLITE_IOERR_DELETE;
            }
        }
        if sync_dir != 0 {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if let Err(e) = File::open(&dir).and_then(|d| d.sync_all()) {
                api().log(
                    SQLITE_IOERR_DIR_FSYNC,
                    &format!("kxarray: fsync {}: {e}", dir.display()),
                );
                return SQLITE_IOERR_DIR_FSYNC;
            }
        }
        SQLITE_OK
    })
}

unsafe extern "C" fn x_access(
    _vfs: *mut sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        if let Some(rc) = crate::io::fault::inject(SQLITE_IOERR_ACCESS, "xAccess") {
            return rc;
        }
        let yes = match flags {
            // As the unix VFS: an empty regular file does not exist (an
            // empty journal is no journal). One stat(2) of SQLite's own
            // string, as `os_unix.c` does: no copy of the path (this runs
            // twice per read transaction, for the journal and the WAL).
            SQLITE_ACCESS_EXISTS => {
                let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                // SAFETY: `name` is NUL-terminated (SQLite's contract) and
                // `st` is a writable stat buffer; stat(2) only reads the
                // one and writes the other.
                let filled = unsafe { libc::stat(name, st.as_mut_ptr()) } == 0;
                filled && {
                    // SAFETY: stat(2) returned 0, so it filled `st`.
                    let st = unsafe { st.assume_init() };
                    st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size > 0
                }
            }
            _ => {
                let mode = if flags == SQLITE_ACCESS_READWRITE {
                    libc::R_OK | libc::W_OK
                } else {
                    libc::R_OK
                };
                // SAFETY: `name` is NUL-terminated; access(2) only reads it.
                unsafe { libc::access(name, mode) == 0 }
            }
        };
        // SAFETY: SQLite passes a writable int.
        unsafe { *out = c_int::from(yes) };
        SQLITE_OK
    })
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite passes a NUL-terminated name.
        let path = unsafe { path_of(name) };
        // As the unix VFS: absolute, `.` and `..` gone, links resolved
        // (`SQLITE_OK_SYMLINK` tells the pager one was followed, which it
        // refuses under SQLITE_OPEN_NOFOLLOW).
        let (full, followed) = match crate::boundary::pathname::full_pathname(&path) {
            Ok(r) => r,
            Err(e) => {
                return report(&OpenError::new(
                    SQLITE_CANTOPEN_FULLPATH,
                    format!("full path name of {e}"),
                ))
            }
        };
        let bytes = full.as_os_str().as_bytes();
        let n_out = usize::try_from(n_out).unwrap_or(0);
        if bytes.len() + 1 > n_out {
            return report(&OpenError::new(
                SQLITE_CANTOPEN_FULLPATH,
                format!(
                    "the full path name {} is {} bytes, more than the {} SQLite allows",
                    full.display(),
                    bytes.len(),
                    n_out.saturating_sub(1)
                ),
            ));
        }
        // SAFETY: SQLite passes `n_out` writable bytes; the name and its
        // NUL fit (checked above).
        let dst = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), bytes.len() + 1) };
        dst[..bytes.len()].copy_from_slice(bytes);
        dst[bytes.len()] = 0;
        if followed {
            SQLITE_OK_SYMLINK
        } else {
            SQLITE_OK
        }
    })
}

/// The default VFS (normally "unix"), which serves the `xDl*` calls
/// (`load_extension` on a connection opened through this VFS).
fn default_vfs() -> *mut sqlite3_vfs {
    let unix = api().vfs_find(Some(c"unix"));
    if !unix.is_null() {
        return unix;
    }
    let d = api().vfs_find(None);
    if d == vfs_object() {
        std::ptr::null_mut()
    } else {
        d
    }
}

/// The default VFS and its object, if there is one to forward to.
fn forward() -> Option<(*mut sqlite3_vfs, &'static sqlite3_vfs)> {
    let d = default_vfs();
    // SAFETY: null or a registered VFS, which SQLite keeps valid while it
    // is registered (the default VFS is never unregistered in practice).
    unsafe { d.as_ref() }.map(|v| (d, v))
}

unsafe extern "C" fn x_dl_open(_vfs: *mut sqlite3_vfs, name: *const c_char) -> *mut c_void {
    match forward().and_then(|(d, v)| v.xDlOpen.map(|f| (d, f))) {
        // SAFETY: the default VFS's own method, with the arguments SQLite
        // gave this one.
        Some((d, f)) => unsafe { f(d, name) },
        None => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn x_dl_error(_vfs: *mut sqlite3_vfs, n: c_int, out: *mut c_char) {
    match forward().and_then(|(d, v)| v.xDlError.map(|f| (d, f))) {
        // SAFETY: as in x_dl_open.
        Some((d, f)) => unsafe { f(d, n, out) },
        None if n > 0 && !out.is_null() => {
            // SAFETY: SQLite passes `n` > 0 writable bytes.
            unsafe { *out = 0 }
        }
        None => {}
    }
}

unsafe extern "C" fn x_dl_sym(
    _vfs: *mut sqlite3_vfs,
    handle: *mut c_void,
    sym: *const c_char,
) -> Option<unsafe extern "C" fn()> {
    let (d, f) = forward().and_then(|(d, v)| v.xDlSym.map(|f| (d, f)))?;
    // SAFETY: as in x_dl_open.
    unsafe { f(d, handle, sym) }
}

unsafe extern "C" fn x_dl_close(_vfs: *mut sqlite3_vfs, handle: *mut c_void) {
    if let Some((d, f)) = forward().and_then(|(d, v)| v.xDlClose.map(|f| (d, f))) {
        // SAFETY: as in x_dl_open.
        unsafe { f(d, handle) }
    }
}

unsafe extern "C" fn x_randomness(_vfs: *mut sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    let Ok(n) = usize::try_from(n) else { return 0 };
    let mut done = 0;
    while done < n {
        // SAFETY: SQLite passes `n` writable bytes, so `out + done` is
        // inside them.
        let at = unsafe { out.add(done) };
        // SAFETY: getrandom writes at most `n - done` bytes from `at`.
        let r = unsafe { libc::getrandom(at.cast(), n - done, 0) };
        if r <= 0 {
            break;
        }
        done += r as usize;
    }
    done as c_int
}

unsafe extern "C" fn x_sleep(_vfs: *mut sqlite3_vfs, micros: c_int) -> c_int {
    std::thread::sleep(std::time::Duration::from_micros(micros.max(0) as u64));
    micros
}

/// Milliseconds since the Julian epoch (noon, 24 November 4714 BC), from
/// the system clock (when there is no default VFS to ask).
fn julian_ms() -> i64 {
    const UNIX_EPOCH_JULIAN_MS: i64 = 24_405_875 * 8_640_000;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    UNIX_EPOCH_JULIAN_MS + since
}

// The time is the default (unix) VFS's: it honours SQLite's test clock
// (`sqlite3_current_time` in a test build), and one process then has one
// clock whichever VFS a connection uses.

unsafe extern "C" fn x_current_time(_vfs: *mut sqlite3_vfs, out: *mut f64) -> c_int {
    if let Some((d, f)) = forward().and_then(|(d, v)| v.xCurrentTime.map(|f| (d, f))) {
        // SAFETY: the default VFS's own method, with the argument SQLite
        // gave this one.
        return unsafe { f(d, out) };
    }
    // SAFETY: SQLite passes a writable double.
    unsafe { *out = julian_ms() as f64 / 86_400_000.0 };
    SQLITE_OK
}

unsafe extern "C" fn x_current_time_int64(_vfs: *mut sqlite3_vfs, out: *mut i64) -> c_int {
    let fwd = forward().and_then(|(d, v)| {
        let f = if v.iVersion >= 2 {
            v.xCurrentTimeInt64
        } else {
            None
        };
        f.map(|f| (d, f))
    });
    if let Some((d, f)) = fwd {
        // SAFETY: as in x_current_time.
        return unsafe { f(d, out) };
    }
    // SAFETY: SQLite passes a writable i64.
    unsafe { *out = julian_ms() };
    SQLITE_OK
}

/// `xGetLastError`: this thread's last failure (`lasterror`): its
/// `errno`, and its message into `out`.
unsafe extern "C" fn x_get_last_error(_vfs: *mut sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    // SAFETY: SQLite passes null or `n` writable bytes.
    unsafe { crate::sqlite::lasterror::get_last_error(n, out) }
}
