//! A page cache shared by the processes of a machine: frames in one file of
//! shared memory that every member maps, found by any member without a
//! system call, filled once, written back by any live member, and
//! surviving the death of any member at any instruction.
//!
//! This module owns the shared region and everything in it; the page
//! cache's handles run on it through [`SharedFile`]. Its parts, bottom up:
//!
//! - `layout`: the region file's format ([`Geometry`](layout::Geometry));
//! - `map`: the mapping and every view into it, the unsafe engine (atomics
//!   and byte-wise atomic copies only: no `&[u8]` over shared bytes);
//! - `wait`: sleeping on a word with the kernel's shared futex;
//! - `frame`: a frame's header and its state machine (lock, version, tag,
//!   flags, reference bit);
//! - `index`: the set-associative lookup table (page to frame, shadows);
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
//!   frame or doing I/O.
//!
//! ```no_run
//! use kxarray::shared::{default_dir, Region, SharedFile};
//! use std::os::unix::ffi::OsStrExt;
//!
//! let region = Region::join(&default_dir(), "cache-example", 1 << 16).unwrap();
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

mod access;
mod clock;
mod file;
mod files;
mod frame;
mod index;
mod layout;
mod map;
mod member;
mod recover;
mod region;
mod wait;
mod writeback;

pub use file::{NotShared, SharedFile};
pub use region::{default_dir, Region, RegionError};

use crate::sync::Ordering;
use layout::{hdr, MEMBERS, PAGE64};
use std::fmt;

/// What a region holds and has done, for every member together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Bytes of frames the clock may use now.
    pub capacity: u64,
    /// Bytes of frames with memory allocated in the region's file.
    pub backed: u64,
    /// The most bytes of frames the region can ever hold.
    pub max: u64,
    /// Live members (processes).
    pub members: u64,
    /// Pages read from files into frames.
    pub fills: u64,
    /// Frames the clock evicted.
    pub evictions: u64,
    /// Dead members recovered.
    pub recovered: u64,
    /// Frames recoveries freed (fills the dead left half done).
    pub recovered_frames: u64,
    /// Locks recoveries took back.
    pub recovered_locks: u64,
    /// Frames holding a page now.
    pub cached_frames: u64,
    /// Frames dirty now.
    pub dirty_frames: u64,
    /// Frames locked now (by a fill, write, eviction or writeback start).
    pub locked_frames: u64,
}

impl fmt::Display for RegionStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        write!(
            f,
            "capacity {:.1} MiB (backed {:.1}, most {:.1}), {} members, {} cached, {} dirty, {} locked, \
             fills {}, evictions {}, recovered {} members ({} frames, {} locks)",
            self.capacity as f64 / MIB,
            self.backed as f64 / MIB,
            self.max as f64 / MIB,
            self.members,
            self.cached_frames,
            self.dirty_frames,
            self.locked_frames,
            self.fills,
            self.evictions,
            self.recovered,
            self.recovered_frames,
            self.recovered_locks
        )
    }
}

impl Region {
    /// The region's figures now (counts frames: O(capacity)).
    pub fn stats(&self) -> RegionStats {
        let h = |i| self.hword(i).load(Ordering::Relaxed);
        let cap = h(hdr::CAPACITY);
        let backed = h(hdr::BACKED);
        let mut s = RegionStats {
            capacity: cap * PAGE64,
            backed: backed * PAGE64,
            max: self.map().geo().max_frames * PAGE64,
            members: (0..MEMBERS)
                .filter(|&m| self.map().member(m).state() != 0)
                .count() as u64,
            fills: h(hdr::FILLS),
            evictions: h(hdr::CLOCK_EVICTIONS),
            recovered: h(hdr::RECOVERED),
            recovered_frames: h(hdr::RECOVERED_FRAMES),
            recovered_locks: h(hdr::RECOVERED_LOCKS),
            ..RegionStats::default()
        };
        for f in 0..cap.max(backed).min(self.map().geo().max_frames) as u32 {
            let Some(fh) = self.map().frame(f) else { break };
            let st = fh.state();
            if st & frame::VALID != 0 {
                s.cached_frames += 1;
            }
            if st & frame::DIRTY != 0 {
                s.dirty_frames += 1;
            }
            if st & frame::OWNER != 0 {
                s.locked_frames += 1;
            }
        }
        s
    }

    /// Set the region's capacity (for every member): rounded down to
    /// frames, at most the region's most. Shrinking writes back and evicts
    /// what lies above; the memory goes back to the system.
    ///
    /// # Errors
    /// The allocation's error when growing (a full tmpfs: the capacity
    /// stays), or this process could not take part.
    pub fn set_capacity(&self, bytes: u64) -> std::io::Result<u64> {
        let me = self
            .me()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut wb = |f: u32| self.write_back(me, &[f]).is_ok();
        self.resize(bytes, me, &mut wb)
            .map(|frames| frames * PAGE64)
    }

    /// Recover every member whose process is gone (the reaper's pass; a
    /// member finds a dead one by itself only when it waits on one of its
    /// locks, or takes its slot). How many were recovered.
    pub fn reap(&self) -> usize {
        let Some(mine) = self.member_slot() else {
            return 0;
        };
        let mut n = 0;
        for m in 0..MEMBERS {
            let o = frame::Owner::of_slot(m);
            if m != mine && self.map().member(m).state() != 0 && !self.alive(o) {
                self.stuck(o);
                n += usize::from(self.map().member(m).state() == 0);
            }
        }
        n
    }

    /// Publish this member's counters in its slot (for other members'
    /// statistics).
    pub(crate) fn publish_counters(&self) {
        if let Some(m) = self.member_slot() {
            let ms = self.map().member(m);
            ms.set_counter(0, self.map().member(m).dirty_len() as u64);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Only the process that joined leaves (a child that inherited the
        // mapping and never used it has no slot of its own).
        if let Some(m) = self.member_slot() {
            self.flush_own(frame::Owner::of_slot(m), 0, layout::DIRTY_MAX);
            self.leave();
        }
    }
}

#[cfg(test)]
mod tests;
