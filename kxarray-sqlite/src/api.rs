//! [`Api`]: the SQLite entry points the VFS calls, as one table of function
//! pointers, so the shared library never references a SQLite symbol
//! directly and loads into any process that has SQLite in some form.
//!
//! Owns the three ways of finding those entry points:
//! - [`Api::from_routines`]: the `sqlite3_api_routines` table SQLite hands a
//!   loadable extension (field positions from `sqlite3ext.h`, an
//!   append-only ABI);
//! - [`Api::from_dlsym`]: `dlsym(RTLD_DEFAULT, ...)`, for the `LD_PRELOAD`
//!   constructor in a program linked with a shared `libsqlite3`;
//! - [`Api::linked`]: the `extern "C"` symbols of a SQLite linked into a
//!   Rust program (rusqlite's `bundled` feature, or `-lsqlite3`).
//!
//! Invariant: every pointer in an `Api` is a live SQLite function of the
//! signature its field declares, for as long as the process runs (SQLite
//! is never unloaded while a VFS it knows is registered).

use crate::ffi::{sqlite3_api_routines, sqlite3_vfs};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

type VfsRegister = unsafe extern "C" fn(*mut sqlite3_vfs, c_int) -> c_int;
type VfsFind = unsafe extern "C" fn(*const c_char) -> *mut sqlite3_vfs;
type UriParameter = unsafe extern "C" fn(*const c_char, *const c_char) -> *const c_char;
type Malloc = unsafe extern "C" fn(c_int) -> *mut c_void;
type Log = unsafe extern "C" fn(c_int, *const c_char, ...);
type LibversionNumber = unsafe extern "C" fn() -> c_int;

/// The SQLite functions the VFS calls: registration, URI parameters,
/// SQLite's allocator (for strings SQLite frees) and its error log.
///
/// Build one with [`Api::linked`] in a Rust program that links SQLite
/// (rusqlite with the `bundled` feature does) and pass it to
/// [`register`](crate::register).
#[derive(Clone, Copy, Debug)]
pub struct Api {
    vfs_register: VfsRegister,
    vfs_find: VfsFind,
    uri_parameter: UriParameter,
    malloc: Malloc,
    log: Log,
    libversion_number: LibversionNumber,
}

/// Positions of the fields used, counted from 0 in `struct
/// sqlite3_api_routines` of `sqlite3ext.h` (3.40.1; the table only grows at
/// its end, so the positions hold for every later release).
mod slot {
    pub(super) const LIBVERSION_NUMBER: usize = 67;
    pub(super) const MALLOC: usize = 68;
    pub(super) const VFS_FIND: usize = 141;
    pub(super) const VFS_REGISTER: usize = 142;
    pub(super) const LOG: usize = 167;
    pub(super) const URI_PARAMETER: usize = 189;
}

/// SQLite 3.7.16, the first release whose routines table reaches
/// [`slot::URI_PARAMETER`].
const MIN_VERSION: c_int = 3_007_016;

extern "C" {
    fn sqlite3_vfs_register(vfs: *mut sqlite3_vfs, make_default: c_int) -> c_int;
    fn sqlite3_vfs_find(name: *const c_char) -> *mut sqlite3_vfs;
    fn sqlite3_uri_parameter(name: *const c_char, param: *const c_char) -> *const c_char;
    fn sqlite3_malloc(n: c_int) -> *mut c_void;
    fn sqlite3_log(code: c_int, fmt: *const c_char, ...);
    fn sqlite3_libversion_number() -> c_int;
}

impl Api {
    /// The table of a loadable extension: the `sqlite3_api_routines`
    /// pointer SQLite passes to the extension's init function. `None` for
    /// a null pointer, a SQLite older than 3.7.16, or a missing entry.
    ///
    /// # Safety
    /// - `routines` is null or the pointer SQLite passed to an extension
    ///   entry point (a table of at least [`slot::URI_PARAMETER`]` + 1`
    ///   function pointers, each null or of the signature `sqlite3ext.h`
    ///   gives it), valid for the rest of the process.
    pub unsafe fn from_routines(routines: *const sqlite3_api_routines) -> Option<Api> {
        if routines.is_null() {
            return None;
        }
        let table = routines.cast::<Option<unsafe extern "C" fn()>>();
        // SAFETY: the caller guarantees a table of function pointers (or
        // nulls) at least this long; `Option<fn>` has the layout of a
        // nullable pointer.
        let at = |i: usize| unsafe { *table.add(i) };
        let version = at(slot::LIBVERSION_NUMBER)?;
        // SAFETY: the slot holds `sqlite3_libversion_number`, whose
        // signature is `LibversionNumber`; it takes no arguments.
        let number = unsafe { std::mem::transmute::<unsafe extern "C" fn(), LibversionNumber>(version)() };
        if number < MIN_VERSION {
            return None;
        }
        // SAFETY (each transmute below): the slot's declared signature in
        // `sqlite3ext.h` is the target type; only the pointer's type
        // changes.
        unsafe {
            Some(Api {
                vfs_register: std::mem::transmute::<unsafe extern "C" fn(), VfsRegister>(at(slot::VFS_REGISTER)?),
                vfs_find: std::mem::transmute::<unsafe extern "C" fn(), VfsFind>(at(slot::VFS_FIND)?),
                uri_parameter: std::mem::transmute::<unsafe extern "C" fn(), UriParameter>(at(slot::URI_PARAMETER)?),
                malloc: std::mem::transmute::<unsafe extern "C" fn(), Malloc>(at(slot::MALLOC)?),
                log: std::mem::transmute::<unsafe extern "C" fn(), Log>(at(slot::LOG)?),
                libversion_number: std::mem::transmute::<unsafe extern "C" fn(), LibversionNumber>(version),
            })
        }
    }

    /// The SQLite the process exports dynamically (a program linked with a
    /// shared `libsqlite3`, as Debian's `sqlite3` shell and a speedtest1
    /// built with `-lsqlite3` are), found with `dlsym(RTLD_DEFAULT, ...)`.
    /// `None` when any symbol is missing or the SQLite is older than 3.7.16.
    pub fn from_dlsym() -> Option<Api> {
        fn sym(name: &CStr) -> Option<unsafe extern "C" fn()> {
            // SAFETY: `name` is NUL-terminated; dlsym only reads it.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            // SAFETY: a non-null symbol address is a function's address
            // (the names below are all SQLite functions); null stays None.
            unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn()>>(p) }
        }
        let version = sym(c"sqlite3_libversion_number")?;
        // SAFETY (each transmute below): the exported symbol of that name
        // is the SQLite function whose C signature the target type is.
        unsafe {
            let libversion_number = std::mem::transmute::<unsafe extern "C" fn(), LibversionNumber>(version);
            if libversion_number() < MIN_VERSION {
                return None;
            }
            Some(Api {
                vfs_register: std::mem::transmute::<unsafe extern "C" fn(), VfsRegister>(sym(c"sqlite3_vfs_register")?),
                vfs_find: std::mem::transmute::<unsafe extern "C" fn(), VfsFind>(sym(c"sqlite3_vfs_find")?),
                uri_parameter: std::mem::transmute::<unsafe extern "C" fn(), UriParameter>(sym(c"sqlite3_uri_parameter")?),
                malloc: std::mem::transmute::<unsafe extern "C" fn(), Malloc>(sym(c"sqlite3_malloc")?),
                log: std::mem::transmute::<unsafe extern "C" fn(), Log>(sym(c"sqlite3_log")?),
                libversion_number,
            })
        }
    }

    /// The SQLite linked into this program (its `sqlite3_*` symbols
    /// resolved at link time). A Rust program gets them from rusqlite with
    /// the `bundled` feature, or from `libsqlite3-sys` linking the system
    /// library.
    ///
    /// Generic only so that it is compiled into the program that calls it,
    /// never into this crate's shared library (which must load into
    /// processes whose SQLite exports no symbols): call it as
    /// `Api::linked::<()>()`.
    ///
    /// ```no_run
    /// // (rusqlite must be linked for the symbols to resolve)
    /// let api = kxarray_sqlite::Api::linked::<()>();
    /// kxarray_sqlite::register(api, false).unwrap();
    /// ```
    pub fn linked<T>() -> Api {
        Api {
            vfs_register: sqlite3_vfs_register,
            vfs_find: sqlite3_vfs_find,
            uri_parameter: sqlite3_uri_parameter,
            malloc: sqlite3_malloc,
            log: sqlite3_log,
            libversion_number: sqlite3_libversion_number,
        }
    }

    /// SQLite's version number (3040001 for 3.40.1).
    pub fn libversion_number(&self) -> i32 {
        // SAFETY: a live `sqlite3_libversion_number` (type invariant).
        unsafe { (self.libversion_number)() }
    }

    /// `sqlite3_vfs_register`.
    ///
    /// # Safety
    /// - `vfs` points to a valid `sqlite3_vfs` that lives (and does not
    ///   move) for the rest of the process.
    pub(crate) unsafe fn vfs_register(&self, vfs: *mut sqlite3_vfs, make_default: bool) -> c_int {
        debug_assert!(!vfs.is_null());
        // SAFETY: the caller keeps `vfs` valid for ever; the pointer is a
        // live `sqlite3_vfs_register` (type invariant).
        unsafe { (self.vfs_register)(vfs, c_int::from(make_default)) }
    }

    /// `sqlite3_vfs_find` (a null name finds the default VFS).
    pub(crate) fn vfs_find(&self, name: Option<&CStr>) -> *mut sqlite3_vfs {
        let p = name.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: null or a NUL-terminated name, only read.
        unsafe { (self.vfs_find)(p) }
    }

    /// `sqlite3_uri_parameter`: the value of URI parameter `param` of a
    /// file name SQLite passed to `xOpen`, if present.
    ///
    /// # Safety
    /// - `filename` is a name SQLite passed to `xOpen` of a main database,
    ///   journal or WAL file (it carries the URI parameters after it), and
    ///   that file is still open.
    pub(crate) unsafe fn uri_parameter(&self, filename: *const c_char, param: &CStr) -> Option<String> {
        debug_assert!(!filename.is_null());
        // SAFETY: per the caller, a name SQLite made; the result is null or
        // a NUL-terminated string inside that name's allocation.
        unsafe {
            let v = (self.uri_parameter)(filename, param.as_ptr());
            (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
        }
    }

    /// A copy of `s` in memory from `sqlite3_malloc` (for strings SQLite
    /// frees with `sqlite3_free`); null when out of memory.
    pub(crate) fn malloc_str(&self, s: &str) -> *mut c_char {
        let bytes = s.as_bytes();
        let Ok(n) = c_int::try_from(bytes.len() + 1) else {
            return std::ptr::null_mut();
        };
        // SAFETY: a live `sqlite3_malloc`; it returns null or `n` bytes.
        let p = unsafe { (self.malloc)(n) }.cast::<u8>();
        if !p.is_null() {
            // SAFETY: `p` has room for `bytes.len() + 1` bytes and does not
            // overlap `bytes` (fresh allocation).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
                *p.add(bytes.len()) = 0;
            }
        }
        p.cast()
    }

    /// `sqlite3_log(code, "%s", msg)`: SQLite's error log (the shell
    /// prints nothing by default; a program sees it through
    /// `SQLITE_CONFIG_LOG`). Interior NULs are cut.
    pub(crate) fn log(&self, code: c_int, msg: &str) {
        let msg = msg.split('\0').next().unwrap_or_default();
        let Ok(c) = std::ffi::CString::new(msg) else {
            return;
        };
        // SAFETY: a live `sqlite3_log`; "%s" consumes exactly the one
        // NUL-terminated string passed.
        unsafe { (self.log)(code, c"%s".as_ptr(), c.as_ptr()) }
    }
}
