//! A page cache shared by the processes of a machine: frames in one file of
//! shared memory that every member maps, found by any member without a
//! system call, filled once, written back by any live member, and
//! surviving the death of any member at any instruction.
//!
//! This module owns the shared region and everything in it; the page
//! cache's handles run on it through [`SharedFile`]. Its parts, bottom up:
//!
//! - `layout`: the region file's format (`Geometry`);
//! - `map`: the mapping and every view into it, the unsafe engine (atomics
//!   and byte-wise atomic copies only: no `&[u8]` over shared bytes);
//! - `wait`: sleeping on a word with the kernel's shared futex;
//! - `frame`: a frame's header and its state machine (lock, version, tag,
//!   flags, reference bit);
//! - `index`: the set-associative lookup table (page to frame, shadows);
//! - `hint`: a process's own hints in front of the index (the frame a
//!   page's hash found last);
//! - `member`: member slots, liveness by open-file-description locks, the
//!   dirty lists;
//! - `files`: the file table (identity that survives inode reuse, epochs,
//!   size, the file lock, openers);
//! - `region`: [`Region`], finding, checking, making and joining a region,
//!   membership across fork;
//! - `clock`: allocation and eviction (a batched clock, the workingset's
//!   refault test), capacity;
//! - `recover`: undoing what a dead member left;
//! - `access`: the page paths (hit, miss, write, drop);
//! - `writeback`: dirty data, writeback by any member, sync, the flusher;
//! - `file`: [`SharedFile`], byte ranges over the page paths.
//!
//! Invariants every part keeps (each module's notes say how):
//! - nothing read from the region is trusted as an index or a length
//!   before it is bounded by the geometry this process computed itself;
//! - every lock in the region names its owner, and a member's death leaves
//!   nothing that its recoverer cannot finish or undo: locks are taken over,
//!   half-done fills freed, cut-short writes kept dirty, writebacks in
//!   flight made dirty again, dirty lists adopted;
//! - a hit writes nothing shared except a clear reference bit, and makes no
//!   system call;
//! - the lock order is: the file table's lock, a file's lock, a frame's
//!   lock, a bucket's lock; a bucket lock is never held while waiting for a
//!   frame, nor across I/O but the write of a page no frame could take
//!   (`access`: so that no fill of the page reads the file before it).
//!
//! ```no_run
//! use kxarray::ipc::RuntimeDir;
//! use kxarray::shared::{Region, SharedFile};
//! use std::os::unix::ffi::OsStrExt;
//!
//! // The user's runtime directory: $XDG_RUNTIME_DIR/kxarray or /dev/shm/kxarray-<euid>.
//! let region = Region::join_dir(RuntimeDir::for_user().unwrap(), "cache-example", 1 << 16).unwrap();
//! region.set_capacity(64 << 20).unwrap();
//! let path = std::path::Path::new("/tmp/example.dat");
//! std::fs::write(path, vec![7u8; 1 << 20]).unwrap();
//! let fd = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
//! let file = SharedFile::open(region.clone(), fd.into(), path.as_os_str().as_bytes()).unwrap();
//! let mut buf = [0u8; 16];
//! file.read_at(&mut buf, 4096).unwrap(); // a miss: the file is read once
//! file.read_at(&mut buf, 4096).unwrap(); // a hit, in this or any other process
//! assert_eq!(buf, [7u8; 16]);
//! ```

// The protocol modules (frame, index) run under loom too, on loom's
// atomics; everything that maps memory or calls the kernel does not.
#[cfg(not(loom))]
mod access;
#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod file;
#[cfg(not(loom))]
mod files;
mod frame;
mod hand;
#[cfg(not(loom))]
mod hint;
mod index;
mod layout;
/// The loom models of the frame and index protocols (run by
/// `tests/loom_shared.rs`).
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;
#[cfg(not(loom))]
mod map;
#[cfg(not(loom))]
mod member;
#[cfg(not(loom))]
mod recover;
#[cfg(not(loom))]
mod region;
#[cfg(not(loom))]
mod stats;
mod wait;
#[cfg(not(loom))]
mod writeback;

#[cfg(not(loom))]
pub use file::{NotShared, SharedFile};
#[cfg(not(loom))]
pub use region::{Region, RegionError};
#[cfg(not(loom))]
pub use stats::RegionStats;

#[cfg(all(test, not(loom), not(miri)))]
mod tests;

#[cfg(not(loom))]
static HOOKS: region::Hooks = region::Hooks {
    recover: recover::recover,
    leave_files: recover::leave_files,
};

#[cfg(not(loom))]
impl Region {
    /// Join the region `name` in the user's own directory `dir` (made if
    /// missing with mode 0700, refused if it is not the user's alone),
    /// making the region if there is none, with room for at most
    /// `max_frames` frames when it is made (an existing region keeps its
    /// own). A dead member's slot this process takes is recovered first.
    ///
    /// # Errors
    /// [`RegionError`]: the directory or file refused (not the user's own,
    /// a symbolic link, not a region this code made), a system call
    /// failed, or all 64 member slots are taken by live processes.
    pub fn join(
        dir: &std::path::Path,
        name: &str,
        max_frames: u64,
    ) -> Result<std::sync::Arc<Region>, RegionError> {
        let dir =
            crate::ipc::RuntimeDir::create(dir).map_err(|e| RegionError::Refused(e.to_string()))?;
        Region::join_dir(dir, name, max_frames)
    }

    /// [`join`](Region::join) in a directory already opened and checked
    /// (such as the user's runtime directory,
    /// [`RuntimeDir::for_user`](crate::ipc::RuntimeDir::for_user)).
    ///
    /// # Errors
    /// As [`join`](Region::join).
    pub fn join_dir(
        dir: crate::ipc::RuntimeDir,
        name: &str,
        max_frames: u64,
    ) -> Result<std::sync::Arc<Region>, RegionError> {
        Region::join_with(dir, name, max_frames, &HOOKS)
    }
}
