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

use crate::sqlite::ffi::{sqlite3_api_routines, sqlite3_vfs};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

type VfsRegister = unsafe extern "C" fn(*mut sqlite3_vfs, c_int) -> c_int;
type VfsFind = unsafe extern "C" fn(*const c_char) -> *mut sqlite3_vfs;
type UriParameter = unsafe extern "C" fn(*const c_char, *const c_char) -> *const c_char;
type UriKey = unsafe extern "C" fn(*const c_char, c_int) -> *const c_char;
type Malloc = unsafe extern "C" fn(c_int) -> *mut c_void;
type Log = unsafe extern "C" fn(c_int, *const c_char, ...);
type LibversionNumber = unsafe extern "C" fn() -> c_int;

/// The SQLite functions the VFS calls: registration, URI parameters (and
/// their names, from SQLite 3.31), SQLite's allocator (for strings SQLite
/// frees) and its error log.
///
/// Build one with [`Api::linked`] in a Rust program that links SQLite
/// (rusqlite with the `bundled` feature does) and pass it to
/// [`register`](crate::register).
#[derive(Clone, Copy, Debug)]
pub struct Api {
    vfs_register: VfsRegister,
    vfs_find: VfsFind,
    uri_parameter: UriParameter,
    /// `sqlite3_uri_key`, from SQLite 3.31 (`None` before: the names of an
    /// open's parameters are then not checked).
    uri_key: Option<UriKey>,
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
    pub(super) const URI_KEY: usize = 245;
}

/// SQLite 3.7.16, the first release whose routines table reaches
/// [`slot::URI_PARAMETER`].
const MIN_VERSION: c_int = 3_007_016;

/// SQLite 3.31.0, the first with `sqlite3_uri_key` (and a routines table
/// reaching [`slot::URI_KEY`]).
const URI_KEY_VERSION: c_int = 3_031_000;

/// The SQLite functions an [`Api`] holds.
#[derive(Clone, Copy, Debug)]
enum Func {
    VfsRegister,
    VfsFind,
    UriParameter,
    UriKey,
    Malloc,
    Log,
    LibversionNumber,
}

impl Func {
    /// Its position in `sqlite3_api_routines`.
    fn slot(self) -> usize {
        match self {
            Func::VfsRegister => slot::VFS_REGISTER,
            Func::VfsFind => slot::VFS_FIND,
            Func::UriParameter => slot::URI_PARAMETER,
            Func::UriKey => slot::URI_KEY,
            Func::Malloc => slot::MALLOC,
            Func::Log => slot::LOG,
            Func::LibversionNumber => slot::LIBVERSION_NUMBER,
        }
    }

    /// Its exported symbol.
    fn symbol(self) -> &'static CStr {
        match self {
            Func::VfsRegister => c"sqlite3_vfs_register",
            Func::VfsFind => c"sqlite3_vfs_find",
            Func::UriParameter => c"sqlite3_uri_parameter",
            Func::UriKey => c"sqlite3_uri_key",
            Func::Malloc => c"sqlite3_malloc",
            Func::Log => c"sqlite3_log",
            Func::LibversionNumber => c"sqlite3_libversion_number",
        }
    }
}

/// A function pointer of erased type as the function pointer type `T`.
///
/// # Safety
/// - `T` is a function pointer type, and `f` is a function whose C
///   signature is `T`'s.
unsafe fn cast<T: Copy>(f: unsafe extern "C" fn()) -> T {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of_val(&f));
    // SAFETY: per the caller, `T` is a function pointer (same size and
    // representation as `f`), and calling it as `T` is calling `f` with its
    // own signature.
    unsafe { std::mem::transmute_copy::<unsafe extern "C" fn(), T>(&f) }
}

extern "C" {
    fn sqlite3_vfs_register(vfs: *mut sqlite3_vfs, make_default: c_int) -> c_int;
    fn sqlite3_vfs_find(name: *const c_char) -> *mut sqlite3_vfs;
    fn sqlite3_uri_parameter(name: *const c_char, param: *const c_char) -> *const c_char;
    fn sqlite3_uri_key(name: *const c_char, n: c_int) -> *const c_char;
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
    ///   entry point (a table of at least 190
    ///   function pointers, each null or of the signature `sqlite3ext.h`
    ///   gives it), valid for the rest of the process.
    pub unsafe fn from_routines(routines: *const sqlite3_api_routines) -> Option<Api> {
        if routines.is_null() {
            return None;
        }
        let table = routines.cast::<Option<unsafe extern "C" fn()>>();
        let at = |i: usize| {
            // SAFETY: the caller guarantees a table at least this long, so
            // slot `i` is inside it.
            let slot = unsafe { table.add(i) };
            // SAFETY: each slot is a function pointer or null, which is
            // the layout of `Option<fn>`.
            unsafe { *slot }
        };
        // SAFETY: the caller's table holds, at each position of `slot`,
        // the SQLite function of that name (or null, giving `None`).
        unsafe { Api::build(|f| at(f.slot())) }
    }

    /// An `Api` from a lookup of each function by [`Func`].
    ///
    /// # Safety
    /// - `get(f)` is `None` or the address of the SQLite function `f` names
    ///   (whose C signature is the one its field in `Api` declares), valid
    ///   for the rest of the process.
    unsafe fn build(get: impl Fn(Func) -> Option<unsafe extern "C" fn()>) -> Option<Api> {
        let version = get(Func::LibversionNumber)?;
        // SAFETY: per the caller, `version` is `sqlite3_libversion_number`.
        let libversion_number: LibversionNumber = unsafe { cast(version) };
        // SAFETY: that function takes no arguments and has no
        // precondition.
        let version = unsafe { libversion_number() };
        if version < MIN_VERSION {
            return None;
        }
        let uri_key = if version >= URI_KEY_VERSION {
            // SAFETY: as below; the table of a 3.31 or later SQLite has
            // this slot.
            get(Func::UriKey).map(|f| unsafe { cast::<UriKey>(f) })
        } else {
            None
        };
        Some(Api {
            // SAFETY: per the caller, the address is the named SQLite
            // function, of the field's type (and so for the casts below).
            vfs_register: unsafe { cast(get(Func::VfsRegister)?) },
            // SAFETY: as above.
            vfs_find: unsafe { cast(get(Func::VfsFind)?) },
            // SAFETY: as above.
            uri_parameter: unsafe { cast(get(Func::UriParameter)?) },
            uri_key,
            // SAFETY: as above.
            malloc: unsafe { cast(get(Func::Malloc)?) },
            // SAFETY: as above.
            log: unsafe { cast(get(Func::Log)?) },
            libversion_number,
        })
    }

    /// The SQLite the process exports dynamically (a program linked with a
    /// shared `libsqlite3`, as Debian's `sqlite3` shell and a speedtest1
    /// built with `-lsqlite3` are), found with `dlsym(RTLD_DEFAULT, ...)`.
    /// `None` when any symbol is missing or the SQLite is older than 3.7.16.
    pub fn from_dlsym() -> Option<Api> {
        fn sym(name: &CStr) -> Option<unsafe extern "C" fn()> {
            // SAFETY: `name` is NUL-terminated; dlsym only reads it.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            // SAFETY: a symbol's address is a function's address (the
            // names looked up are all SQLite functions); null is `None`.
            unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn()>>(p) }
        }
        // SAFETY: the process's exported symbol of each name is that
        // SQLite function (a program does not export a different function
        // under SQLite's names), loaded for the life of the process.
        unsafe { Api::build(|f| sym(f.symbol())) }
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
            uri_key: Some(sqlite3_uri_key),
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

    /// `sqlite3_uri_key`: the names of the URI parameters of a main
    /// database's name, in order; `None` on a SQLite before 3.31, which
    /// cannot list them.
    ///
    /// # Safety
    /// - `filename` is a name SQLite passed to `xOpen` of a main database
    ///   file, and that file is still open.
    pub(crate) unsafe fn uri_keys(&self, filename: *const c_char) -> Option<Vec<String>> {
        debug_assert!(!filename.is_null());
        let key = self.uri_key?;
        let mut keys = Vec::new();
        for n in 0.. {
            // SAFETY: per the caller, a main database name SQLite made; a
            // position past the last parameter returns null.
            let k = unsafe { key(filename, n) };
            if k.is_null() {
                break;
            }
            // SAFETY: a non-null result is a NUL-terminated string inside
            // the name's allocation, alive while the file is open.
            keys.push(unsafe { CStr::from_ptr(k) }.to_string_lossy().into_owned());
        }
        Some(keys)
    }

    /// `sqlite3_uri_parameter`: the value of URI parameter `param` of a
    /// file name SQLite passed to `xOpen`, if present.
    ///
    /// # Safety
    /// - `filename` is a name SQLite passed to `xOpen` of a main database,
    ///   journal or WAL file (it carries the URI parameters after it), and
    ///   that file is still open.
    pub(crate) unsafe fn uri_parameter(
        &self,
        filename: *const c_char,
        param: &CStr,
    ) -> Option<String> {
        debug_assert!(!filename.is_null());
        // SAFETY: per the caller, a name SQLite made; `param` is
        // NUL-terminated.
        let v = unsafe { (self.uri_parameter)(filename, param.as_ptr()) };
        // SAFETY: the result is null or a NUL-terminated string inside the
        // name's allocation, alive while the file is open.
        (!v.is_null()).then(|| unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
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
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
            // SAFETY: the last of those bytes.
            let end = unsafe { p.add(bytes.len()) };
            // SAFETY: inside the allocation (above).
            unsafe { *end = 0 };
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
