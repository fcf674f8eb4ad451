//! The C declarations of SQLite's VFS interface this crate uses, written by
//! hand (no bindgen, so no libclang at build time).
//!
//! Owns the `repr(C)` layouts of `sqlite3_vfs` (version 3),
//! `sqlite3_io_methods` (version 3) and `sqlite3_file`, and the constants
//! the VFS reads or returns. Every layout and value is the one in
//! `sqlite3.h` (SQLite 3.40.1 as Debian ships it; these parts of the
//! interface have not changed since 3.7.17 and are append-only): the
//! structures are `struct sqlite3_vfs`, `struct sqlite3_io_methods` and
//! `struct sqlite3_file` there, field for field, in the same order.
//!
//! Invariant: nothing here is called; it only describes memory shared with
//! SQLite. Names keep SQLite's spelling so they can be checked against the
//! header line by line.

#![allow(non_camel_case_types, non_snake_case)]
// A faithful excerpt of sqlite3.h: some constants are kept for the
// reader's cross-check though no code path uses them yet.
#![allow(dead_code)]

use std::os::raw::{c_char, c_int, c_void};

/// `sqlite3_int64`.
pub(crate) type sqlite3_int64 = i64;

/// `struct sqlite3_file`: the base every VFS's file object starts with.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct sqlite3_file {
    /// The methods of an open file; NULL when `xOpen` failed.
    pub(crate) pMethods: *const sqlite3_io_methods,
}

/// `struct sqlite3_io_methods`, version 3 (with `xFetch`/`xUnfetch`).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct sqlite3_io_methods {
    pub(crate) iVersion: c_int,
    pub(crate) xClose: Option<unsafe extern "C" fn(*mut sqlite3_file) -> c_int>,
    pub(crate) xRead:
        Option<unsafe extern "C" fn(*mut sqlite3_file, *mut c_void, c_int, i64) -> c_int>,
    pub(crate) xWrite:
        Option<unsafe extern "C" fn(*mut sqlite3_file, *const c_void, c_int, i64) -> c_int>,
    pub(crate) xTruncate: Option<unsafe extern "C" fn(*mut sqlite3_file, i64) -> c_int>,
    pub(crate) xSync: Option<unsafe extern "C" fn(*mut sqlite3_file, c_int) -> c_int>,
    pub(crate) xFileSize: Option<unsafe extern "C" fn(*mut sqlite3_file, *mut i64) -> c_int>,
    pub(crate) xLock: Option<unsafe extern "C" fn(*mut sqlite3_file, c_int) -> c_int>,
    pub(crate) xUnlock: Option<unsafe extern "C" fn(*mut sqlite3_file, c_int) -> c_int>,
    pub(crate) xCheckReservedLock:
        Option<unsafe extern "C" fn(*mut sqlite3_file, *mut c_int) -> c_int>,
    pub(crate) xFileControl:
        Option<unsafe extern "C" fn(*mut sqlite3_file, c_int, *mut c_void) -> c_int>,
    pub(crate) xSectorSize: Option<unsafe extern "C" fn(*mut sqlite3_file) -> c_int>,
    pub(crate) xDeviceCharacteristics: Option<unsafe extern "C" fn(*mut sqlite3_file) -> c_int>,
    pub(crate) xShmMap: Option<
        unsafe extern "C" fn(*mut sqlite3_file, c_int, c_int, c_int, *mut *mut c_void) -> c_int,
    >,
    pub(crate) xShmLock:
        Option<unsafe extern "C" fn(*mut sqlite3_file, c_int, c_int, c_int) -> c_int>,
    pub(crate) xShmBarrier: Option<unsafe extern "C" fn(*mut sqlite3_file)>,
    pub(crate) xShmUnmap: Option<unsafe extern "C" fn(*mut sqlite3_file, c_int) -> c_int>,
    pub(crate) xFetch:
        Option<unsafe extern "C" fn(*mut sqlite3_file, i64, c_int, *mut *mut c_void) -> c_int>,
    pub(crate) xUnfetch: Option<unsafe extern "C" fn(*mut sqlite3_file, i64, *mut c_void) -> c_int>,
}

/// `sqlite3_syscall_ptr`.
pub(crate) type sqlite3_syscall_ptr = Option<unsafe extern "C" fn()>;

/// `struct sqlite3_vfs`, version 3.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct sqlite3_vfs {
    pub(crate) iVersion: c_int,
    pub(crate) szOsFile: c_int,
    pub(crate) mxPathname: c_int,
    pub(crate) pNext: *mut sqlite3_vfs,
    pub(crate) zName: *const c_char,
    pub(crate) pAppData: *mut c_void,
    pub(crate) xOpen: Option<
        unsafe extern "C" fn(
            *mut sqlite3_vfs,
            *const c_char,
            *mut sqlite3_file,
            c_int,
            *mut c_int,
        ) -> c_int,
    >,
    pub(crate) xDelete:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char, c_int) -> c_int>,
    pub(crate) xAccess:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char, c_int, *mut c_int) -> c_int>,
    pub(crate) xFullPathname:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char, c_int, *mut c_char) -> c_int>,
    pub(crate) xDlOpen:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char) -> *mut c_void>,
    pub(crate) xDlError: Option<unsafe extern "C" fn(*mut sqlite3_vfs, c_int, *mut c_char)>,
    pub(crate) xDlSym: Option<
        unsafe extern "C" fn(
            *mut sqlite3_vfs,
            *mut c_void,
            *const c_char,
        ) -> Option<unsafe extern "C" fn()>,
    >,
    pub(crate) xDlClose: Option<unsafe extern "C" fn(*mut sqlite3_vfs, *mut c_void)>,
    pub(crate) xRandomness:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, c_int, *mut c_char) -> c_int>,
    pub(crate) xSleep: Option<unsafe extern "C" fn(*mut sqlite3_vfs, c_int) -> c_int>,
    pub(crate) xCurrentTime: Option<unsafe extern "C" fn(*mut sqlite3_vfs, *mut f64) -> c_int>,
    pub(crate) xGetLastError:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, c_int, *mut c_char) -> c_int>,
    pub(crate) xCurrentTimeInt64: Option<unsafe extern "C" fn(*mut sqlite3_vfs, *mut i64) -> c_int>,
    pub(crate) xSetSystemCall:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char, sqlite3_syscall_ptr) -> c_int>,
    pub(crate) xGetSystemCall:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char) -> sqlite3_syscall_ptr>,
    pub(crate) xNextSystemCall:
        Option<unsafe extern "C" fn(*mut sqlite3_vfs, *const c_char) -> *const c_char>,
}

// Result codes.
pub(crate) const SQLITE_OK: c_int = 0;
pub(crate) const SQLITE_ERROR: c_int = 1;
pub(crate) const SQLITE_BUSY: c_int = 5;
pub(crate) const SQLITE_NOMEM: c_int = 7;
pub(crate) const SQLITE_READONLY: c_int = 8;
pub(crate) const SQLITE_IOERR: c_int = 10;
pub(crate) const SQLITE_NOTFOUND: c_int = 12;
pub(crate) const SQLITE_FULL: c_int = 13;
pub(crate) const SQLITE_CANTOPEN: c_int = 14;
pub(crate) const SQLITE_MISUSE: c_int = 21;
pub(crate) const SQLITE_WARNING: c_int = 28;
pub(crate) const SQLITE_NOTICE: c_int = 27;
pub(crate) const SQLITE_OK_LOAD_PERMANENTLY: c_int = SQLITE_OK | (1 << 8);
pub(crate) const SQLITE_IOERR_READ: c_int = SQLITE_IOERR | (1 << 8);
pub(crate) const SQLITE_IOERR_SHORT_READ: c_int = SQLITE_IOERR | (2 << 8);
pub(crate) const SQLITE_IOERR_WRITE: c_int = SQLITE_IOERR | (3 << 8);
pub(crate) const SQLITE_IOERR_FSYNC: c_int = SQLITE_IOERR | (4 << 8);
pub(crate) const SQLITE_IOERR_DIR_FSYNC: c_int = SQLITE_IOERR | (5 << 8);
pub(crate) const SQLITE_IOERR_TRUNCATE: c_int = SQLITE_IOERR | (6 << 8);
pub(crate) const SQLITE_IOERR_FSTAT: c_int = SQLITE_IOERR | (7 << 8);
pub(crate) const SQLITE_IOERR_DELETE: c_int = SQLITE_IOERR | (10 << 8);
pub(crate) const SQLITE_IOERR_NOMEM: c_int = SQLITE_IOERR | (12 << 8);
pub(crate) const SQLITE_IOERR_ACCESS: c_int = SQLITE_IOERR | (13 << 8);
pub(crate) const SQLITE_IOERR_LOCK: c_int = SQLITE_IOERR | (15 << 8);
pub(crate) const SQLITE_IOERR_SHMMAP: c_int = SQLITE_IOERR | (21 << 8);
pub(crate) const SQLITE_IOERR_UNLOCK: c_int = SQLITE_IOERR | (8 << 8);
pub(crate) const SQLITE_IOERR_RDLOCK: c_int = SQLITE_IOERR | (9 << 8);
pub(crate) const SQLITE_IOERR_CHECKRESERVEDLOCK: c_int = SQLITE_IOERR | (14 << 8);
pub(crate) const SQLITE_IOERR_SHMOPEN: c_int = SQLITE_IOERR | (18 << 8);
pub(crate) const SQLITE_IOERR_SHMSIZE: c_int = SQLITE_IOERR | (19 << 8);
pub(crate) const SQLITE_IOERR_SHMLOCK: c_int = SQLITE_IOERR | (20 << 8);
pub(crate) const SQLITE_READONLY_CANTINIT: c_int = SQLITE_READONLY | (5 << 8);
pub(crate) const SQLITE_IOERR_DELETE_NOENT: c_int = SQLITE_IOERR | (23 << 8);
pub(crate) const SQLITE_CANTOPEN_FULLPATH: c_int = SQLITE_CANTOPEN | (3 << 8);
pub(crate) const SQLITE_CANTOPEN_SYMLINK: c_int = SQLITE_CANTOPEN | (6 << 8);
/// `xFullPathname`'s success when it followed a symbolic link (the pager
/// turns it into `SQLITE_CANTOPEN_SYMLINK` under `SQLITE_OPEN_NOFOLLOW`).
pub(crate) const SQLITE_OK_SYMLINK: c_int = SQLITE_OK | (2 << 8);

// Open flags (xOpen).
pub(crate) const SQLITE_OPEN_READONLY: c_int = 0x0000_0001;
pub(crate) const SQLITE_OPEN_READWRITE: c_int = 0x0000_0002;
pub(crate) const SQLITE_OPEN_CREATE: c_int = 0x0000_0004;
pub(crate) const SQLITE_OPEN_DELETEONCLOSE: c_int = 0x0000_0008;
pub(crate) const SQLITE_OPEN_EXCLUSIVE: c_int = 0x0000_0010;
pub(crate) const SQLITE_OPEN_URI: c_int = 0x0000_0040;
pub(crate) const SQLITE_OPEN_MAIN_DB: c_int = 0x0000_0100;
pub(crate) const SQLITE_OPEN_TEMP_DB: c_int = 0x0000_0200;
pub(crate) const SQLITE_OPEN_TRANSIENT_DB: c_int = 0x0000_0400;
pub(crate) const SQLITE_OPEN_MAIN_JOURNAL: c_int = 0x0000_0800;
pub(crate) const SQLITE_OPEN_TEMP_JOURNAL: c_int = 0x0000_1000;
pub(crate) const SQLITE_OPEN_SUBJOURNAL: c_int = 0x0000_2000;
pub(crate) const SQLITE_OPEN_SUPER_JOURNAL: c_int = 0x0000_4000;
pub(crate) const SQLITE_OPEN_WAL: c_int = 0x0008_0000;
pub(crate) const SQLITE_OPEN_NOFOLLOW: c_int = 0x0100_0000;

// xAccess flags.
pub(crate) const SQLITE_ACCESS_EXISTS: c_int = 0;
pub(crate) const SQLITE_ACCESS_READWRITE: c_int = 1;
pub(crate) const SQLITE_ACCESS_READ: c_int = 2;

// Lock levels (xLock / xUnlock).
pub(crate) const SQLITE_LOCK_NONE: c_int = 0;
pub(crate) const SQLITE_LOCK_SHARED: c_int = 1;
pub(crate) const SQLITE_LOCK_RESERVED: c_int = 2;
pub(crate) const SQLITE_LOCK_PENDING: c_int = 3;
pub(crate) const SQLITE_LOCK_EXCLUSIVE: c_int = 4;

// xSync flags.
pub(crate) const SQLITE_SYNC_NORMAL: c_int = 0x0000_0002;
pub(crate) const SQLITE_SYNC_FULL: c_int = 0x0000_0003;
pub(crate) const SQLITE_SYNC_DATAONLY: c_int = 0x0000_0010;

// File control opcodes (xFileControl).
pub(crate) const SQLITE_FCNTL_LOCKSTATE: c_int = 1;
pub(crate) const SQLITE_FCNTL_LAST_ERRNO: c_int = 4;
pub(crate) const SQLITE_FCNTL_SIZE_HINT: c_int = 5;
pub(crate) const SQLITE_FCNTL_CHUNK_SIZE: c_int = 6;
pub(crate) const SQLITE_FCNTL_PERSIST_WAL: c_int = 10;
pub(crate) const SQLITE_FCNTL_VFSNAME: c_int = 12;
pub(crate) const SQLITE_FCNTL_POWERSAFE_OVERWRITE: c_int = 13;
pub(crate) const SQLITE_FCNTL_PRAGMA: c_int = 14;
pub(crate) const SQLITE_FCNTL_TEMPFILENAME: c_int = 16;
pub(crate) const SQLITE_FCNTL_MMAP_SIZE: c_int = 18;
pub(crate) const SQLITE_FCNTL_HAS_MOVED: c_int = 20;
pub(crate) const SQLITE_FCNTL_SYNC: c_int = 21;
pub(crate) const SQLITE_FCNTL_CKPT_DONE: c_int = 37;
pub(crate) const SQLITE_FCNTL_CKPT_START: c_int = 39;
pub(crate) const SQLITE_FCNTL_EXTERNAL_READER: c_int = 40;

// Device characteristics (xDeviceCharacteristics).
pub(crate) const SQLITE_IOCAP_ATOMIC: c_int = 0x0000_0001;
pub(crate) const SQLITE_IOCAP_SAFE_APPEND: c_int = 0x0000_0200;
pub(crate) const SQLITE_IOCAP_SEQUENTIAL: c_int = 0x0000_0400;
pub(crate) const SQLITE_IOCAP_UNDELETABLE_WHEN_OPEN: c_int = 0x0000_0800;
pub(crate) const SQLITE_IOCAP_POWERSAFE_OVERWRITE: c_int = 0x0000_1000;

// Shared-memory lock flags (xShmLock) and the number of lock slots.
pub(crate) const SQLITE_SHM_UNLOCK: c_int = 1;
pub(crate) const SQLITE_SHM_LOCK: c_int = 2;
pub(crate) const SQLITE_SHM_SHARED: c_int = 4;
pub(crate) const SQLITE_SHM_EXCLUSIVE: c_int = 8;
pub(crate) const SQLITE_SHM_NLOCK: c_int = 8;

/// The first byte of SQLite's lock range in a database file
/// (`PENDING_BYTE`, `os.h`); the reserved byte follows, then the 510
/// shared bytes (`SHARED_FIRST`, `SHARED_SIZE`).
pub(crate) const PENDING_BYTE: i64 = 0x4000_0000;
/// Bytes from [`PENDING_BYTE`] to the end of the shared range.
pub(crate) const LOCK_RANGE_LEN: i64 = 2 + 510;
/// `RESERVED_BYTE`.
pub(crate) const RESERVED_BYTE: i64 = PENDING_BYTE + 1;
/// `SHARED_FIRST`, the first of the shared range.
pub(crate) const SHARED_FIRST: i64 = PENDING_BYTE + 2;
/// `SHARED_SIZE`.
pub(crate) const SHARED_SIZE: i64 = 510;
/// The first lock byte of a `-shm` file (`UNIX_SHM_BASE`: the eight WAL
/// lock slots, `WALINDEX_LOCK_OFFSET`), then the DMS byte
/// (`UNIX_SHM_DMS`).
pub(crate) const SHM_LOCK_BASE: i64 = 120;
/// `UNIX_SHM_DMS`: every process mapping the `-shm` holds it shared; the
/// first to take it exclusive reinitializes the file.
pub(crate) const SHM_DMS: i64 = SHM_LOCK_BASE + SQLITE_SHM_NLOCK as i64;

/// SQLite's `sqlite3_api_routines`, the table of function pointers a
/// loadable extension receives (opaque here; read by [`crate::Api::from_routines`]).
#[repr(C)]
#[derive(Debug)]
pub struct sqlite3_api_routines {
    _private: [u8; 0],
}

/// SQLite's connection handle, `sqlite3` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct sqlite3 {
    _private: [u8; 0],
}
