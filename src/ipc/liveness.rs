//! Liveness the kernel proves: each member of a table in a shared file
//! holds an exclusive OFD lock on its own byte of the file for as long as
//! it is a member, so a slot whose byte no other open file description
//! holds is free, whatever the slot's recorded pid says (LMDB's reader
//! table and redb's multi-process transactions do the same).
//!
//! Why not pids: a pid means nothing in another PID namespace (two members
//! of one pod's containers see each other's pids as absent or as someone
//! else), it is reused, and it can be forged by whoever writes the table.
//! The kernel drops an OFD lock when its description's last descriptor is
//! closed, so a member killed with SIGKILL, or one whose container is gone,
//! frees its byte at once, and nobody can hold a byte without holding the
//! file open.
//!
//! Owns [`LifeBytes`] (where the bytes are). Invariants: a member's byte is
//! locked before its slot is written and released after its slot is
//! cleared; the bytes of different slots never overlap each other or the
//! caller's other locks (callers choose `base` past them); a check never
//! takes a byte (it asks with `F_OFD_GETLK`), so it cannot be mistaken for
//! a member.

use super::ofd::{held_elsewhere, try_lock, unlock, LockKind};
use std::io;
use std::os::fd::AsFd;

/// The life bytes of a table of slots: slot `i`'s byte is `base + i` of
/// the shared file (it may lie past the file's end: locks do not need the
/// bytes to exist).
///
/// ```
/// use kxarray::ipc::LifeBytes;
/// let path = tempfile::NamedTempFile::new().unwrap();
/// let rw = || std::fs::OpenOptions::new().read(true).write(true).open(path.path()).unwrap();
/// let (member, other) = (rw(), rw()); // two open file descriptions
/// let life = LifeBytes::new(4096);
/// assert!(!life.is_alive(&other, 3).unwrap());
/// assert!(life.claim(&member, 3).unwrap());
/// assert!(life.is_alive(&other, 3).unwrap());
/// assert!(!life.claim(&other, 3).unwrap()); // taken
/// drop(member); // closed (or its process died): the kernel lets go
/// assert!(!life.is_alive(&other, 3).unwrap());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifeBytes {
    base: u64,
}

impl LifeBytes {
    /// Slot `i`'s byte is `base + i`.
    pub const fn new(base: u64) -> LifeBytes {
        LifeBytes { base }
    }

    /// Take slot `i`'s byte through `file`'s open file description:
    /// `Ok(false)` when another description holds it (a live member).
    ///
    /// # Errors
    /// `fcntl`'s error.
    pub fn claim(&self, file: impl AsFd, i: usize) -> io::Result<bool> {
        try_lock(file, LockKind::Write, self.base + i as u64, 1)
    }

    /// Let go of slot `i`'s byte (the member left; closing the file or
    /// dying does the same).
    ///
    /// # Errors
    /// `fcntl`'s error.
    pub fn release(&self, file: impl AsFd, i: usize) -> io::Result<()> {
        unlock(file, self.base + i as u64, 1)
    }

    /// Whether another open file description than `file`'s holds slot
    /// `i`'s byte: its member is alive.
    ///
    /// # Errors
    /// `fcntl`'s error.
    pub fn is_alive(&self, file: impl AsFd, i: usize) -> io::Result<bool> {
        held_elsewhere(file, LockKind::Write, self.base + i as u64, 1)
    }
}
