//! Members: the processes that share a region, one slot of the member
//! table each, and the proof of each one's life.
//!
//! Owns the member slot's words, the liveness locks and the dirty list.
//!
//! - **Liveness the kernel proves.** A member holds, for as long as it
//!   lives, an exclusive open-file-description lock (`F_OFD_SETLK`) on one
//!   byte of the region file ([`live_byte`] of its slot), taken through its
//!   own open of the file. The kernel drops the lock when the last
//!   descriptor of that open file description closes, which a process's
//!   death does. So a slot whose byte can be locked has no live owner,
//!   whatever pid it names: this works across PID namespaces and after pid
//!   reuse (LMDB's and redb's way). A child after `fork` shares its
//!   parent's open file description, so it must not use the parent's
//!   slot: it closes its copy (which releases nothing while the parent
//!   lives) and joins on a new open of its own.
//! - **Joining** takes the first slot whose byte it can lock. A slot left
//!   by a dead member (its state word not free) is recovered before it is
//!   reused (`recover`), by the joiner, who holds the byte and so is the
//!   only one doing it.
//! - **The dirty list** ([`DIRTY_MAX`] words): frames this member made
//!   dirty and has not seen clean since, each with the coarse time it did
//!   (milliseconds of `CLOCK_MONOTONIC`, one clock for every process of
//!   the machine). Only the owner appends and compacts (under its own
//!   process's lock); anyone may read it inside its sequence lock, as
//!   `sync` does to find every dirty frame of a file, and a recoverer
//!   adopts a dead member's list. The list is a set of hints: the frame's
//!   own `DIRTY` flag is the truth, and a frame made dirty is on the list
//!   of whoever made it so (or on none only while its lock is held by the
//!   member about to append it, which recovery covers).

use super::layout::{DIRTY_MAX, MEMBERS};
use super::map::MemberSlot;
use crate::sync::{fence, Ordering};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Member slot words.
pub(crate) mod w {
    /// 0 when free; `generation << 8 | LIVE` while a member has it.
    pub(crate) const STATE: usize = 0;
    /// The member's pid (in its own PID namespace: for people, not for
    /// liveness).
    pub(crate) const PID: usize = 1;
    /// When it joined (Unix time, nanoseconds).
    pub(crate) const JOINED: usize = 2;
    /// The dirty list's sequence lock (odd while the owner compacts).
    pub(crate) const DIRTY_SEQ: usize = 8;
    /// Entries in the dirty list.
    pub(crate) const DIRTY_COUNT: usize = 16;
    /// The member's counters, published for the region's statistics:
    /// first of [`super::COUNTERS`].
    pub(crate) const COUNTERS: usize = 24;
}

/// Counters each member publishes in its slot.
pub(crate) const COUNTERS: usize = 16;

/// The state word's "in use" bit.
pub(crate) const LIVE: u64 = 1;

/// The first byte of the region file's liveness locks (far past any data,
/// as redb's lock bytes).
pub(crate) const LOCK_BASE: i64 = 1 << 62;

/// The byte member slot `m`'s owner keeps locked.
pub(crate) fn live_byte(m: usize) -> i64 {
    debug_assert!(m < MEMBERS);
    LOCK_BASE + 1 + m as i64
}

fn flock(kind: libc::c_int, start: i64) -> libc::flock {
    // SAFETY: `flock` is plain data; all zero is a valid value.
    let mut fl: libc::flock = unsafe { core::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    fl
}

/// Try to lock byte `start` exclusively through `fd`'s open file
/// description: whether it was got (`false`: another open file
/// description holds it).
///
/// # Errors
/// Any `fcntl` error but `EAGAIN`/`EACCES` (a lock held elsewhere).
pub(crate) fn try_lock_byte(fd: BorrowedFd<'_>, start: i64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start);
    // SAFETY: `fl` is a valid `flock` for the call; `fd` is open.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Release byte `start` locked through `fd`.
pub(crate) fn unlock_byte(fd: BorrowedFd<'_>, start: i64) {
    let mut fl = flock(libc::F_UNLCK, start);
    // SAFETY: as in `try_lock_byte`; unlocking cannot fail in a way that
    // matters (a byte not held is a no-op).
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
}

/// Whether an open file description other than `fd`'s holds a lock on
/// byte `start`: the owner of that byte is alive.
///
/// # Errors
/// The `fcntl` error.
pub(crate) fn held_elsewhere(fd: BorrowedFd<'_>, start: i64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start);
    // SAFETY: as in `try_lock_byte`; F_OFD_GETLK writes `fl`.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Milliseconds of `CLOCK_MONOTONIC` (truncated: ages are computed
/// wrapping).
pub(crate) fn now_ms() -> u32 {
    // SAFETY: `ts` is a valid out-pointer.
    let mut ts: libc::timespec = unsafe { core::mem::zeroed() };
    // SAFETY: as above; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000) as u32
}

/// One dirty-list entry: a frame and when it was made dirty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirtyEntry {
    /// The frame.
    pub(crate) frame: u32,
    /// [`now_ms`] when it was made dirty.
    pub(crate) at: u32,
}

impl DirtyEntry {
    fn encode(self) -> u64 {
        u64::from(self.at) << 32 | (u64::from(self.frame) + 1)
    }
    fn decode(w: u64) -> Option<DirtyEntry> {
        let frame = (w as u32).checked_sub(1)?;
        Some(DirtyEntry {
            frame,
            at: (w >> 32) as u32,
        })
    }
}

impl MemberSlot {
    /// The state word.
    pub(crate) fn state(&self) -> u64 {
        self.words[w::STATE].load(Ordering::Acquire)
    }

    /// Entries in the dirty list now (at most [`DIRTY_MAX`]).
    pub(crate) fn dirty_len(&self) -> usize {
        (self.words[w::DIRTY_COUNT].load(Ordering::Acquire) as usize).min(DIRTY_MAX)
    }

    /// Append `e` (the owner, under its lock). Whether there was room.
    pub(crate) fn dirty_push(&self, e: DirtyEntry) -> bool {
        let n = self.dirty_len();
        if n >= DIRTY_MAX {
            return false;
        }
        self.dirty[n].store(e.encode(), Ordering::Relaxed);
        self.words[w::DIRTY_COUNT].store(n as u64 + 1, Ordering::Release);
        true
    }

    /// The entries now, read inside the list's sequence lock (retried while
    /// the owner compacts; after a few tries, the entries as read, which
    /// may repeat or miss one being moved: only used by callers for whom a
    /// list is a hint).
    pub(crate) fn dirty_snapshot(&self, out: &mut Vec<DirtyEntry>) {
        for _ in 0..64 {
            out.clear();
            let s = self.words[w::DIRTY_SEQ].load(Ordering::Acquire);
            if s & 1 == 0 {
                let n = self.dirty_len();
                out.extend(
                    self.dirty[..n]
                        .iter()
                        .filter_map(|d| DirtyEntry::decode(d.load(Ordering::Relaxed))),
                );
                fence(Ordering::Acquire);
                if self.words[w::DIRTY_SEQ].load(Ordering::Relaxed) == s {
                    return;
                }
            }
            std::thread::yield_now();
        }
    }

    /// Keep only the entries `keep` says to (the owner under its lock, or
    /// the recoverer of a dead owner, who holds its liveness byte): entries
    /// stay in order. How many are left.
    pub(crate) fn dirty_retain(&self, mut keep: impl FnMut(DirtyEntry) -> bool) -> usize {
        let seq = &self.words[w::DIRTY_SEQ];
        let s = seq.load(Ordering::Relaxed) & !1;
        seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let n = self.dirty_len();
        let mut kept = 0;
        for i in 0..n {
            let word = self.dirty[i].load(Ordering::Relaxed);
            if DirtyEntry::decode(word).is_some_and(&mut keep) {
                self.dirty[kept].store(word, Ordering::Relaxed);
                kept += 1;
            }
        }
        self.words[w::DIRTY_COUNT].store(kept as u64, Ordering::Release);
        seq.store(s + 2, Ordering::Release);
        kept
    }

    /// Publish counter `i`.
    pub(crate) fn set_counter(&self, i: usize, v: u64) {
        if i < COUNTERS {
            self.words[w::COUNTERS + i].store(v, Ordering::Relaxed);
        }
    }

    /// Counter `i` as published.
    pub(crate) fn counter(&self, i: usize) -> u64 {
        if i < COUNTERS {
            self.words[w::COUNTERS + i].load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_skipped() {
        let e = DirtyEntry { frame: 77, at: 123 };
        assert_eq!(DirtyEntry::decode(e.encode()), Some(e));
        assert_eq!(DirtyEntry::decode(0), None);
        assert_eq!(DirtyEntry::decode(7 << 32), None);
    }

    #[test]
    fn a_liveness_byte_is_held_by_one_open_file_description() {
        let f = tempfile::tempfile().unwrap();
        let g = std::fs::File::open("/proc/self/exe").ok();
        drop(g);
        let a = f.try_clone().unwrap(); // the same open file description
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap(); // a new one
        use std::os::fd::AsFd;
        let byte = live_byte(3);
        assert!(try_lock_byte(f.as_fd(), byte).unwrap());
        assert!(
            try_lock_byte(a.as_fd(), byte).unwrap(),
            "a dup shares the lock"
        );
        assert!(
            !held_elsewhere(f.as_fd(), byte).unwrap(),
            "its own lock is no conflict"
        );
        assert!(held_elsewhere(other.as_fd(), byte).unwrap());
        assert!(!try_lock_byte(other.as_fd(), byte).unwrap());
        drop(f);
        assert!(
            held_elsewhere(other.as_fd(), byte).unwrap(),
            "the dup still holds it"
        );
        drop(a);
        assert!(
            !held_elsewhere(other.as_fd(), byte).unwrap(),
            "closed: the owner is gone"
        );
        assert!(try_lock_byte(other.as_fd(), byte).unwrap());
    }
}
