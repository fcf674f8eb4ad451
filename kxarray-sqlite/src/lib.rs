//! SQLite on kxarray's page cache: a VFS named `kxarray` whose database,
//! journal and WAL files are [`CachedFile`](kxarray::pagecache::CachedFile)s
//! of one process-wide [`PageCache`](kxarray::pagecache::PageCache), the
//! databases' pages in the region it shares with the machine's other
//! processes on the VFS ([`kxarray::shared`]) by default.
//!
//! How to run SQLite on kxarray, in the stock shell and in Rust:
//!
//! ```text
//! sqlite3 -cmd '.load target/release/libkxarray_sqlite' -cmd ".open 'file:test.db?vfs=kxarray'"
//! kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false)?; Connection::open_with_flags_and_vfs(path, flags, "kxarray")?
//! ```
//!
//! Three ways in, one VFS object per process:
//! - **loadable extension**: `cargo build --release -p kxarray-sqlite`, then
//!   `.load target/release/libkxarray_sqlite` in the `sqlite3` shell (entry
//!   points `sqlite3_kxarraysqlite_init` and `sqlite3_extension_init`) and
//!   `.open 'file:test.db?vfs=kxarray'`; `.vfsname` prints `kxarray`;
//! - **Rust**: [`register`] with [`Api::linked`] (the SQLite linked into
//!   the program, e.g. rusqlite's `bundled`), then
//!   `Connection::open_with_flags_and_vfs(path, flags, "kxarray")`;
//! - **`LD_PRELOAD`** into an unmodified C program linked with a shared
//!   `libsqlite3`: a constructor registers the VFS through `dlsym`, so
//!   `LD_PRELOAD=target/release/libkxarray_sqlite.so speedtest1 --vfs kxarray`
//!   works. (Registration initializes SQLite, so speedtest1's `--heap`,
//!   `--pcache` and `--lookaside` options, which must come before, fail.)
//!
//! Settings, from URI parameters, else environment variables, else the
//! defaults ([`Settings`]):
//!
//! | URI | environment | meaning | default |
//! |---|---|---|---|
//! | `kx_cache=<size>` | `KXARRAY_SQLITE_CACHE` | the process-wide cache's capacity (`k`/`m`/`g` suffixes); the first open makes the cache, later values are ignored with a notice in SQLite's log | a quarter of the memory budget (physical memory, or the cgroup's `memory.max`/`memory.high` when lower), at least 256 MiB (at most half the budget), at most 64 GiB ([`default_capacity`]) |
//! | `kx_direct=0\|1` | `KXARRAY_SQLITE_DIRECT` | `O_DIRECT` below the cache for the database file (its journal or WAL stay buffered) | 0 |
//! | `kx_fetch=0\|1` | `KXARRAY_SQLITE_FETCH` | zero-copy `xFetch` into the cache's folios when `PRAGMA mmap_size` > 0 | 1 |
//! | `kx_pressure=0\|1` | `KXARRAY_SQLITE_PRESSURE` | follow memory pressure: the kernel's PSI shrinks the cache by an eighth per stall event (down to an eighth of `kx_cache`) and it grows back after 10 s without one, each change a line in SQLite's log (`kxarray::memory::PressureMonitor`; where PSI is unavailable, one line and nothing else); the first open decides | 1 |
//! | `kx_locking=shared\|exclusive` | `KXARRAY_SQLITE_LOCKING` | `shared`: SQLite's own locks, a `-shm` file, the cache kept coherent with other processes; `exclusive`: one process owns the database while it has it open; the first open of a file decides | shared |
//! | `kx_prefetch=0\|1` | `KXARRAY_SQLITE_PREFETCH` | with `kx_direct=1`: when a scan reads an interior B-tree page and then its first two children in order, submit the reads of its other children at once, wherever they lie in the file (a table filled in random key order); a point lookup reads one child per interior page and prefetches nothing | 1 |
//! | `kx_shared=0\|1` | `KXARRAY_SQLITE_SHARED` | with `kx_locking=shared`: keep the database's pages in the cache shared by the machine's processes on this VFS (one region per memory budget, one copy of each page for all of them; see docs/sqlite.md, "The shared cache"); 0: in the process's own cache, as `kx_locking=exclusive`, `kx_direct=1` and a process that cannot join always do; the process's first open decides whether it joins | 1 |
//! | `kx_budget=0\|1` | `KXARRAY_SQLITE_BUDGET` | share one memory budget with the other processes of the cgroup (or machine): the cache starts at 16 MiB, grows toward its share of half the cgroup's limit (at most `kx_cache`) while the cgroup has room, shrinks past 85% of the limit, and a dead process's share comes back to the others (`kxarray::memory::SharedBudget`; docs/memory.md); 0: a fixed `kx_cache`; the first open decides | 1 |
//!
//! A setting that does not parse, and a `kx_` parameter or
//! `KXARRAY_SQLITE_` variable the VFS does not know (`kx_cahce=64m`), make
//! the open fail (`SQLITE_CANTOPEN`) with the reason in SQLite's log: the
//! shell prints it after `.log stderr`, a program receives it through its
//! `SQLITE_CONFIG_LOG` callback.
//!
//! `PRAGMA kx_stats` returns the cache's and the VFS's counters and
//! `PRAGMA kx_settings` the settings in force (the cache's capacity now,
//! which the shared budget moves, and `kx_cache`, the most it may take),
//! one `name=value` line each, sizes followed by their MiB.
//!
//! What the VFS guarantees:
//! - **what SQLite relies on is in the file**: journal and WAL writes are
//!   written through (in the file when `xWrite` returns); a database's
//!   writes reach the file at SQLite's next sync point for it
//!   (`SQLITE_FCNTL_SYNC` at every rollback-journal commit, even with
//!   `synchronous=OFF`; `SQLITE_FCNTL_CKPT_DONE` after a checkpoint;
//!   `xSync`; leaving a write lock), while a journal or the WAL still holds
//!   them; `xSync` is `fdatasync`. So a transaction whose COMMIT returned
//!   survives SIGKILL whenever it would on the unix VFS (WAL at
//!   `synchronous=NORMAL` included). The cache serves reads.
//! - **beside other processes** (default, `kx_locking=shared`): SQLite's
//!   own locks on the unix VFS's bytes (OFD locks, which conflict with the
//!   unix VFS's POSIX locks), a `-shm` file in the unix VFS's layout, and a
//!   cache kept coherent with other processes' writes (a lock gap rereads
//!   the header, size and time from the file; a WAL reader drops the pages
//!   another process's checkpoint copied, read from the WAL index); with
//!   `kx_locking=exclusive`, one process owns the database while it has it
//!   open (other processes get `SQLITE_BUSY`), the fast path of one
//!   process;
//! - **one name per file**: `xFullPathname` resolves `.`, `..` and
//!   symbolic links as the unix VFS does, so journals and WALs are named
//!   after the real file;
//! - **a journal or WAL outlives a failed write-back of its database**: it
//!   is not deleted, truncated or restarted while the database holds pages
//!   the VFS could not write back.
//! - **WAL**: the index is the `-shm` file (in process memory with
//!   `kx_locking=exclusive`, in SQLite's heap under `PRAGMA
//!   locking_mode=EXCLUSIVE`); after a crash any VFS rebuilds it from the
//!   WAL.
//! - a database written through kxarray is an ordinary SQLite file: the
//!   stock shell opens it on its default VFS.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

// The sources by concern, one room a folder, top down (each room's `mod.rs`
// says what it owns and may import): `boundary` (the VFS object SQLite
// registers and calls) above `io` (a handle's operations and the paths
// under them) above `locking` (SQLite's lock levels, per file) above `wal`
// (the WAL index and the cache's coherence with other processes) above
// `sys` (the system calls made directly) above `sqlite` (SQLite's interface
// and the process-wide state every room speaks).
mod boundary;
mod io;
mod locking;
mod sqlite;
mod sys;
mod wal;

pub use io::fault;
pub use sqlite::{api, config};

// Shown as re-exports of the public modules above (`api::Api`), as when
// those modules were the crate's own, not as items of the crate root.
#[doc(no_inline)]
pub use api::Api;
pub use boundary::vfs::{cache, RegisterError};
#[doc(no_inline)]
pub use config::{default_capacity, parse_size, SettingError, Settings};
pub use locking::inode::open_files;
pub use sqlite::ffi::{sqlite3, sqlite3_api_routines};

use std::os::raw::{c_char, c_int};

/// The name the VFS registers under.
pub const VFS_NAME: &str = "kxarray";

/// Register the `kxarray` VFS with the SQLite `api` belongs to (and make it
/// the default VFS if `make_default`). Idempotent: the process has one VFS
/// object, registered again by each call (the first `api` is the one the
/// VFS uses for URI parameters, logging and allocation).
///
/// # Errors
/// [`RegisterError::Sqlite`] with `sqlite3_vfs_register`'s code.
///
/// ```
/// use rusqlite::{Connection, OpenFlags};
///
/// kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).unwrap();
/// let dir = tempfile::tempdir().unwrap();
/// let db = Connection::open_with_flags_and_vfs(
///     dir.path().join("doc.db"),
///     OpenFlags::default(),
///     "kxarray",
/// )
/// .unwrap();
/// db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (42);").unwrap();
/// let x: i64 = db.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
/// assert_eq!(x, 42);
/// ```
pub fn register(api: Api, make_default: bool) -> Result<(), RegisterError> {
    boundary::vfs::register_with(api, make_default)
}

/// The text of `PRAGMA kx_stats` (`None` before the first open made the
/// cache): a `name=value` line per counter, sizes followed by their MiB.
pub fn stats() -> Option<String> {
    cache().map(io::stats::stats_text)
}

/// The loadable extension's entry point, by the name SQLite derives from
/// the file name `libkxarray_sqlite.so` (`sqlite3_kxarraysqlite_init`).
/// Registers the VFS and asks SQLite to keep the library loaded after the
/// connection that loaded it closes.
///
/// # Safety
/// - called by SQLite's extension loader: `api` is its
///   `sqlite3_api_routines` table, `err` null or a writable pointer slot.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_kxarraysqlite_init(
    _db: *mut sqlite3,
    err: *mut *mut c_char,
    api: *const sqlite3_api_routines,
) -> c_int {
    // SAFETY: per the caller, `api` is SQLite's routines table.
    let Some(a) = (unsafe { Api::from_routines(api) }) else {
        return sqlite::ffi::SQLITE_ERROR;
    };
    match register(a, false) {
        Ok(()) => sqlite::ffi::SQLITE_OK_LOAD_PERMANENTLY,
        Err(e) => {
            if !err.is_null() {
                // SAFETY: `err` is a writable slot SQLite frees with
                // sqlite3_free; the string comes from sqlite3_malloc.
                unsafe { *err = a.malloc_str(&format!("kxarray: {e}")) };
            }
            sqlite::ffi::SQLITE_ERROR
        }
    }
}

/// The generic entry point name SQLite also tries.
///
/// # Safety
/// As [`sqlite3_kxarraysqlite_init`].
#[no_mangle]
pub unsafe extern "C" fn sqlite3_extension_init(
    db: *mut sqlite3,
    err: *mut *mut c_char,
    api: *const sqlite3_api_routines,
) -> c_int {
    // SAFETY: same contract.
    unsafe { sqlite3_kxarraysqlite_init(db, err, api) }
}

/// The `LD_PRELOAD` constructor: when the process exports SQLite's
/// functions (it links a shared `libsqlite3`), register the VFS. A process
/// without them (a Rust program with a bundled SQLite) is left alone; it
/// registers with [`register`]. Setting `KXARRAY_SQLITE_DEFAULT=1` makes
/// `kxarray` the default VFS.
extern "C" fn preload_constructor() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(api) = Api::from_dlsym() {
            let default = std::env::var("KXARRAY_SQLITE_DEFAULT").is_ok_and(|v| v == "1");
            let _ = register(api, default);
        }
    });
}

#[used]
#[link_section = ".init_array"]
static PRELOAD_CONSTRUCTOR: extern "C" fn() = preload_constructor;
