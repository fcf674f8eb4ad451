//! The region's figures ([`RegionStats`]) and the members' maintenance
//! calls on [`Region`]: capacity, the region's place in the memory budget,
//! the reaper's pass, leaving.
//!
//! The budget: the region is one member of the memory budget however many
//! processes map it, so its frames are counted once. One member at a time
//! holds that place: the one that holds an exclusive OFD lock on byte
//! [`BUDGET_BYTE`] of the region file, through its own open of it (the
//! kernel lets go when that process dies, and the next member to ask takes
//! the place; a child after fork asks through its own open, never its
//! parent's).

use super::frame;
use super::layout::{self, hdr, MEMBERS, PAGE64};
use super::region::Region;
use crate::ipc::{try_lock, LockKind};
use crate::sync::Ordering;
use std::fmt;

/// The byte of the region file whose lock holds the region's place in the
/// memory budget (below the members' liveness bytes).
pub(crate) const BUDGET_BYTE: u64 = 1 << 62;

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
        // (frames above the backed mark have no memory and hold nothing:
        // reading their headers would allocate the metadata's pages)
        for f in 0..backed.min(self.map().geo().max_frames) as u32 {
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
    /// what lies above; the memory goes back to the system. A dirty frame
    /// of a file another member holds the writer mark of is neither written
    /// back nor evicted (its change may not be final): the capacity stays
    /// above the highest such frame.
    ///
    /// # Errors
    /// The allocation's error when growing (a full tmpfs: the capacity
    /// stays), or this process could not take part.
    pub fn set_capacity(&self, bytes: u64) -> std::io::Result<u64> {
        let me = self
            .me()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let map = self.map();
        let mut wb = |f: u32| {
            let theirs = map.frame(f).is_some_and(|h| {
                let slot = h.tag().slot();
                slot < super::layout::FILES && map.file(slot).marked_by_other(me)
            });
            // (written back otherwise; a frame a writer marks meanwhile
            // stays dirty and is looked at again)
            !theirs && self.write_back(me, &[f]).is_ok()
        };
        self.resize(bytes, me, &mut wb)
            .map(|frames| frames * PAGE64)
    }

    /// Take the region's place in the memory budget for this process, if
    /// no live member holds it (see the module notes): whether this
    /// process holds it now. The holder is the one that sizes the region
    /// by its share (`PageCache::join_budget` does this at misses, once a
    /// second, in every member).
    pub fn hold_budget(&self) -> bool {
        if self.holds_budget() {
            return true;
        }
        // A child joins first, so that the lock is asked for through its
        // own open of the file, not the parent's it inherited.
        if self.me().is_err() {
            return false;
        }
        let got = self
            .with_fd(|fd| try_lock(fd, LockKind::Write, BUDGET_BYTE, 1))
            .unwrap_or(false);
        if got {
            self.local
                .budget_gen
                .store(crate::fork::generation(), Ordering::Relaxed);
        }
        got
    }

    /// Whether this process holds the region's place in the memory budget.
    pub fn holds_budget(&self) -> bool {
        self.local.budget_gen.load(Ordering::Relaxed) == crate::fork::generation()
    }

    /// Bytes of frames with memory allocated in the region's file (what
    /// the region costs the machine now).
    pub fn backed_bytes(&self) -> u64 {
        self.hword(hdr::BACKED).load(Ordering::Relaxed) * PAGE64
    }

    /// The most bytes of frames the region can ever hold.
    pub fn max_bytes(&self) -> u64 {
        self.map().geo().max_frames * PAGE64
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

    /// Make this process's fills and syncs drop the kernel's copy of the
    /// pages they read or wrote (`POSIX_FADV_DONTNEED` after a fill's read,
    /// and over the whole file after a sync), so that the machine holds
    /// one copy of a page the region holds, not two (the region's and the
    /// kernel's page cache's). A file's first page is kept in both: the
    /// header a database's lock gap reads from the file itself (a `pread`
    /// that would otherwise wait for the device at every transaction).
    /// The price is paid by a process outside the region reading the same
    /// file: it reads from the device what the kernel would have kept. Off
    /// by default.
    pub fn set_drop_behind(&self, on: bool) {
        self.local
            .drop_behind
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`set_drop_behind`](Region::set_drop_behind) is on.
    pub fn drop_behind(&self) -> bool {
        self.local
            .drop_behind
            .load(std::sync::atomic::Ordering::Relaxed)
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
