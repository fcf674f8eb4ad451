//! SQLite's interface as every room speaks it, and the process-wide state
//! the registration sets up: the bottom room, importing no other.
//!
//! - [`ffi`]: the C declarations of SQLite's VFS interface, written by
//!   hand: the `repr(C)` layouts and the constants (result codes, lock
//!   levels, open flags);
//! - [`api`]: [`Api`](api::Api), SQLite's entry points as one table of
//!   function pointers, from an extension's routines, `dlsym` or linked
//!   symbols (public: `kxarray_sqlite::api`);
//! - [`process`]: the process-wide state every room shares: the `Api`
//!   (set by the first registration), the VFS's counters, the cache's
//!   configured capacity and shared budget, the crash test's knob;
//! - [`lasterror`]: this thread's last error, what `xGetLastError`
//!   answers;
//! - [`config`]: [`Settings`](config::Settings), what an open asks for,
//!   from URI parameters, the environment and the defaults (public:
//!   `kxarray_sqlite::config`).
//!
//! Invariants (each file's notes say how):
//! - every layout and constant is `sqlite3.h`'s, and every pointer in an
//!   `Api` is a live SQLite function of its field's signature;
//! - the process's `Api` is set once and never changes;
//! - the last error is per thread and a success leaves it alone;
//! - a setting that does not parse, or a `kx_` parameter or
//!   `KXARRAY_SQLITE_` variable of no setting, is an error the open
//!   reports, never a silent default.
//!
//! Why at the bottom: by subject these belong to the SQLite boundary
//! (`boundary`), but every room uses them (`ffi`'s codes everywhere, the
//! `Api` to log through, `lasterror` on every failed system call, the
//! `Settings` a handle keeps in `io`), so there they would make the
//! boundary and every room import each other. Inside: `process` sits on
//! `api`, which sits on `ffi`.

pub mod api;
pub mod config;
pub(crate) mod ffi;
pub(crate) mod lasterror;
pub(crate) mod process;
