//! Members: the processes that share a region, one slot of the member
//! table each, and the proof of each one's life.
//!
//! Owns the member slot's words, the liveness locks and the dirty list.
//!
//! - **Liveness the kernel proves.** A member holds, for as long as it
//!   lives, an exclusive open-file-description lock (`F_OFD_SETLK`) on one
//!   byte of the region file ([`LIFE`], by its slot), taken through its
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

use super::layout::DIRTY_MAX;
use super::map::MemberSlot;
use crate::ipc::LifeBytes;
use crate::sync::{fence, Ordering};

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

/// The liveness bytes of the member slots: slot `m`'s owner keeps byte
/// `2^62 + 1 + m` of the region file locked (far past any data, as redb's
/// lock bytes).
pub(crate) const LIFE: LifeBytes = LifeBytes::new((1 << 62) + 1);

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
    /// the owner compacts). Whether they are exact: after a few tries, the
    /// entries as read, which may repeat or miss one being moved (a caller
    /// that must see every entry tries again, or holds the list's lock).
    pub(crate) fn dirty_snapshot(&self, out: &mut Vec<DirtyEntry>) -> bool {
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
                    return true;
                }
            }
            std::thread::yield_now();
        }
        false
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

#[cfg(all(test, not(loom), not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_skipped() {
        let e = DirtyEntry { frame: 77, at: 123 };
        assert_eq!(DirtyEntry::decode(e.encode()), Some(e));
        assert_eq!(DirtyEntry::decode(0), None);
        assert_eq!(DirtyEntry::decode(7 << 32), None);
    }

    /// What a child after fork relies on: a dup of the descriptor (a
    /// child's inherited copy) shares the parent's lock, so closing it
    /// releases nothing while the parent's copy is open.
    #[test]
    fn a_liveness_byte_is_held_by_one_open_file_description() {
        use std::os::fd::AsRawFd;
        let f = tempfile::tempfile().unwrap();
        let a = f.try_clone().unwrap(); // the same open file description
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap(); // a new one
        assert!(LIFE.claim(&f, 3).unwrap());
        assert!(LIFE.claim(&a, 3).unwrap(), "a dup shares the lock");
        assert!(
            !LIFE.is_alive(&f, 3).unwrap(),
            "its own lock is no conflict"
        );
        assert!(LIFE.is_alive(&other, 3).unwrap());
        assert!(!LIFE.claim(&other, 3).unwrap());
        drop(f);
        assert!(LIFE.is_alive(&other, 3).unwrap(), "the dup still holds it");
        drop(a);
        assert!(
            !LIFE.is_alive(&other, 3).unwrap(),
            "closed: the owner is gone"
        );
        assert!(LIFE.claim(&other, 3).unwrap());
    }
}
