//! What the processes of one user share, made so that no other user can
//! steer or read it: a private runtime directory and checked files in it
//! ([`RuntimeDir`]), open-file-description byte locks ([`try_lock`],
//! [`lock_within`], [`held_elsewhere`]) and the liveness they prove
//! ([`LifeBytes`]).
//!
//! The shared memory budget's registry is built on these (a table in a
//! file of the runtime directory, locked with a byte lock, each member
//! alive while it holds its slot's byte); so is anything else processes
//! of a machine share. Each file's notes have its invariants:
//! `runtime_dir` (where the directory is and what an open checks), `ofd`
//! (the locks), `liveness` (a member's byte). Imports no other module of
//! the crate (its users pair it with [`crate::fork`] for what a child
//! inherits).
//!
//! ```
//! use kxarray::ipc::{LifeBytes, LockKind, RuntimeDir, lock_within};
//! use std::time::Duration;
//!
//! # use std::os::unix::fs::PermissionsExt;
//! # let tmp = tempfile::tempdir().unwrap();
//! # std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
//! # let dir = RuntimeDir::open(tmp.path()).unwrap();
//! // let dir = RuntimeDir::for_user()?;     // $XDG_RUNTIME_DIR/kxarray or /dev/shm/kxarray-<euid>
//! let table = dir.open_file("my-table", 4096).unwrap().file;
//! // The table's lock: byte 0, waited for at most 5 ms.
//! assert!(lock_within(&table, LockKind::Write, 0, 1, Duration::from_millis(5)).unwrap());
//! // This member's proof of life: slot 2's byte.
//! assert!(LifeBytes::new(4096).claim(&table, 2).unwrap());
//! ```

mod liveness;
mod ofd;
mod runtime_dir;

pub use liveness::LifeBytes;
pub use ofd::{held_elsewhere, lock_within, try_lock, unlock, LockKind};
pub use runtime_dir::{
    check_private_file, PrivateFile, Refused, RuntimeDir, RuntimeError, SHARED_DIR,
};
