//! Writeback of shared frames: by any live member, of any member's dirty
//! frames, with the file's own descriptor of the member doing it.
//!
//! Owns the protocol of dirty data over this process's `Local` (its dirty list's lock
//! and reservations, the files it has open, its flusher thread) and the
//! writeback protocol:
//!
//! - **Reservation.** A writer reserves room on its dirty list before it
//!   locks a frame, so the append under the frame's lock never fails: a
//!   dirty frame is always on someone's list (or locked by the member about
//!   to append it, which recovery covers). A full list is written back (its
//!   oldest entries) first; a list that cannot be emptied makes the write
//!   go through to the file uncached.
//! - **A writeback** locks the frame, checks it is still the page it was
//!   dirtied as, still dirty and not under another writeback (one in
//!   flight per frame: its end clears the flag, after which the frame may
//!   hold another page), clears `DIRTY` and sets `WRITEBACK` with
//!   its owner, unlocks, writes (`pwritev` of up to 256 neighbouring
//!   frames), then ends the writeback without the lock: writers never wait
//!   for I/O, and a write during the writeback makes the frame dirty again
//!   (the kernel's way without stable pages). On an error the frame is
//!   dirty again with `ERROR`, and the file's error sequence moves on.
//!   The file's dirty count is lowered only at the end, so it never
//!   undercounts.
//! - **Sync** of a file reads every member's dirty list (live or dead: a
//!   dead one's is adopted by its recoverer, but a sync may run first),
//!   writes back each frame of the file that is dirty, waits for those
//!   being written back by others (a dead writer's is made dirty again by
//!   recovery, and then written here), then syncs the file's descriptor:
//!   every byte any member wrote before the sync began is then durable.
//! - **A writer's frames are its own.** While a member holds a file's
//!   writer mark, no other member writes back a frame of the file: the
//!   mark's frames may hold a change that is not final, which a process
//!   outside the region may roll back in the file at any moment after the
//!   writer's death, and a writeback landing after that rollback would put
//!   the change back. A writeback looks at the mark after flagging its run
//!   and before writing it (calling the run off if the mark is another's);
//!   a new writer marks, then writes back or waits out every writeback of
//!   the file in flight (`settle_file`): one of the two sees the other.
//!   A shrink keeps such a frame (the capacity stays above it).
//! - **The flusher**, one thread per member process started by its first
//!   dirty frame, writes back this member's frames older than a second.
//!
//! A member writing back frames of a file it does not have open (adopted
//! from a dead member) opens it again by the path the file's slot records
//! and uses it only if its identity is the slot's.

use super::files::{identify, read_path, w as fw};
use super::frame::{FrameHeader, Owner, Tag, DIRTY, ERROR, VALID, WRITEBACK};
use super::layout::{hdr, DIRTY_MAX, FILES, MEMBERS, PAGE64};
use super::member::{self, DirtyEntry};
use super::region::FileIo;
use super::region::Region;
use crate::sync::{fence, Ordering};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Frames written in one `pwritev`.
const MAX_RUN: usize = 256;
/// How old a dirty frame gets before the flusher writes it back.
pub(crate) const DIRTY_EXPIRE_MS: u32 = 1000;

impl Drop for FileIo {
    fn drop(&mut self) {
        let Some(region) = self.opener.take().and_then(|w| w.upgrade()) else {
            return;
        };
        let Some(m) = region.member_slot() else {
            return;
        };
        let me = Owner::of_slot(m);
        let map = region.map();
        let mut list = Vec::new();
        {
            // exact under the list's lock (no thread of ours compacts it)
            let _g = region.local.dirty.lock();
            map.member(m).dirty_snapshot(&mut list);
        }
        let mut pages: Vec<(u64, u32)> = list
            .iter()
            .filter_map(|e| {
                let h = map.frame(e.frame)?;
                let t = h.tag();
                (t.slot() == self.slot && h.state() & DIRTY != 0).then_some((t.index, e.frame))
            })
            .collect();
        pages.sort_unstable();
        pages.dedup();
        if !pages.is_empty() {
            let _ = region.write_back_file(me, self, &pages);
        }
        region.compact_own(me);
        let slot = map.file(self.slot);
        let bit = super::files::member_bit(me);
        let before = slot.words[fw::OPENERS].fetch_and(!bit, Ordering::AcqRel);
        if before & !bit == 0 && unlinked(self.fd.as_fd()) {
            // The region's last open of a file no name leads to any more:
            // its pages go, as the kernel frees a deleted file's at its
            // last close. Under the file table's lock, which an open takes
            // to set its bit, so no member has it open or dirty meanwhile.
            let table = map.header_u32(hdr::FILES_LOCK);
            region.lock_word(table, me);
            if slot.get(fw::OPENERS) == 0 && slot.get(fw::DIRTY) == 0 && slot.writer().is_none() {
                slot.bump_epoch();
            }
            Region::unlock_word(table);
        }
    }
}

/// Whether the file open at `fd` has no name left (`st_nlink` 0); false
/// when `fstat` fails.
fn unlinked(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    // SAFETY: `libc::stat` is plain integers: all zeros is a value of it.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open and `st` a writable `stat` for the call.
    unsafe { libc::fstat(fd.as_raw_fd(), &mut st) == 0 && st.st_nlink == 0 }
}

impl Region {
    /// Reserve room for one entry on this member's dirty list, writing
    /// back its oldest entries if the list is full. Whether room was got
    /// (if not, the caller writes through).
    pub(crate) fn reserve_dirty(&self, me: Owner) -> bool {
        for attempt in 0..3 {
            let len = self.map().member(me.slot()).dirty_len();
            let r = self.local.reserved.load(Ordering::Relaxed);
            if len + r < DIRTY_MAX {
                if self
                    .local
                    .reserved
                    .compare_exchange(r, r + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if attempt < 2 {
                self.flush_own(me, 0, DIRTY_MAX / 4);
            }
        }
        false
    }

    /// Give back a reservation not used.
    pub(crate) fn unreserve_dirty(&self) {
        let _ = self
            .local
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| r.checked_sub(1));
    }

    /// Append frame `f` to this member's dirty list with a reservation.
    pub(crate) fn push_dirty(&self, f: u32) {
        let Some(me) = self.member_slot() else { return };
        {
            let _g = self.local.dirty.lock();
            self.mark_dirty_member(me);
            let ok = self.map().member(me).dirty_push(DirtyEntry {
                frame: f,
                at: member::now_ms(),
            });
            debug_assert!(ok, "a reservation keeps room");
        }
        self.unreserve_dirty();
        self.start_flusher();
    }

    /// Put a dead member's dirty frames on member `me`'s list (its
    /// recoverer's, or its own when a joiner took the dead member's slot);
    /// those that find no room are written back now.
    pub(crate) fn adopt_dirty(&self, me: Owner, entries: &[DirtyEntry]) {
        let mut left = Vec::new();
        {
            let _g = self.local.dirty.lock();
            let ms = self.map().member(me.slot());
            if !entries.is_empty() {
                self.mark_dirty_member(me.slot());
            }
            for &e in entries {
                let r = self.local.reserved.load(Ordering::Relaxed);
                if ms.dirty_len() + r >= DIRTY_MAX || !ms.dirty_push(e) {
                    left.push(e.frame);
                }
            }
        }
        if !left.is_empty() {
            let _ = self.write_back(me, &left);
        }
        if !entries.is_empty() || self.map().member(me.slot()).dirty_len() > 0 {
            self.start_flusher();
        }
    }

    /// The descriptor to write file slot `slot`'s frames with: this
    /// process's open, or a new open by the slot's path whose identity is
    /// the slot's.
    fn io_for(&self, slot: usize) -> Option<Arc<FileIo>> {
        if let Some(io) = self.local.file(slot) {
            return Some(io);
        }
        let s = self.map().file(slot);
        let want = s.id();
        let path = read_path(self.map(), slot);
        let c = std::ffi::CString::new(path).ok()?;
        // SAFETY: a valid C string; a new descriptor or -1.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return None;
        }
        use std::os::fd::FromRawFd;
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if identify(fd.as_fd())?.0 != want {
            return None;
        }
        let io = Arc::new(FileIo {
            slot,
            fd: fd.into(),
            opener: None,
        });
        self.local.register(&io);
        Some(io)
    }

    /// Write back frames `frames` (any member's, any file's) if they are
    /// still dirty. The first error (also recorded in the file's error
    /// sequence).
    pub(crate) fn write_back(&self, me: Owner, frames: &[u32]) -> io::Result<()> {
        let map = self.map();
        let mut by_file: HashMap<usize, Vec<(u64, u32)>> = HashMap::new();
        for &f in frames {
            if let Some(h) = map.frame(f) {
                let st = h.state();
                let tag = h.tag();
                if st & DIRTY != 0 && st & VALID != 0 && tag.slot() < FILES && !self.stale(tag) {
                    by_file.entry(tag.slot()).or_default().push((tag.index, f));
                }
            }
        }
        let mut first = Ok(());
        for (slot, mut pages) in by_file {
            pages.sort_unstable();
            pages.dedup();
            let Some(io) = self.io_for(slot) else {
                if first.is_ok() {
                    first = Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "a shared cache's dirty pages belong to a file no longer reachable",
                    ));
                }
                continue;
            };
            let r = self.write_back_file(me, &io, &pages);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Write back `pages` (sorted `(index, frame)`) of `io`'s file.
    pub(crate) fn write_back_file(
        &self,
        me: Owner,
        io: &FileIo,
        pages: &[(u64, u32)],
    ) -> io::Result<()> {
        let map = self.map();
        let slot = map.file(io.slot);
        if slot.marked_by_other(me) {
            // another member's change under way (see the module notes)
            return Ok(());
        }
        let mut first = Ok(());
        let mut run: Vec<(u64, u32, Tag)> = Vec::with_capacity(MAX_RUN);
        let flush = |run: &mut Vec<(u64, u32, Tag)>| {
            if run.is_empty() {
                return Ok(());
            }
            // The mark is looked at after every frame of the run is under
            // writeback (a new writer marks, then waits for the
            // writebacks of the file: `settle_file`), so either this sees
            // its mark or it sees this run's flags.
            fence(Ordering::SeqCst);
            if slot.marked_by_other(me) {
                for &(_, f, tag) in run.iter() {
                    if let Some(h) = map.frame(f) {
                        abort_writeback(h, tag, slot);
                    }
                }
                run.clear();
                return Ok(());
            }
            let r = self.write_run(io, run);
            for &(_, f, tag) in run.iter() {
                if let Some(h) = map.frame(f) {
                    end_writeback(
                        h,
                        tag,
                        r.as_ref().err().and_then(io::Error::raw_os_error),
                        slot,
                    );
                }
            }
            if let Err(e) = &r {
                slot.set_error(e.raw_os_error().unwrap_or(libc::EIO));
            }
            run.clear();
            r
        };
        for &(index, f) in pages {
            let Some(h) = map.frame(f) else { continue };
            let st = h.lock(me, &mut |o| self.stuck(o));
            let tag = h.tag();
            // One writeback per frame: a frame dirty again while one is in
            // flight waits for its end (a sync waits, then writes it
            // again). A second would share the first's flag, which the
            // first's end clears: the frame could then be evicted and
            // refilled with another page before the second's `pwritev`,
            // which would write that page's bytes at this one's offset.
            if tag.slot() != io.slot
                || tag.index != index
                || st & (VALID | DIRTY | WRITEBACK) != VALID | DIRTY
                || self.stale(tag)
            {
                h.unlock(me, 0, 0);
                continue;
            }
            h.unlock(me, WRITEBACK | FrameHeader::wb_bits(me), DIRTY | ERROR);
            if run.last().is_some_and(|&(i, _, _)| i + 1 != index) || run.len() == MAX_RUN {
                let r = flush(&mut run);
                if first.is_ok() {
                    first = r;
                }
            }
            run.push((index, f, tag));
        }
        let r = flush(&mut run);
        if first.is_ok() {
            first = r;
        }
        let _ = slot; // the size read below, per run
        first
    }

    /// `pwritev` one run of neighbouring frames (each under writeback),
    /// trimmed at the file's size.
    fn write_run(&self, io: &FileIo, run: &[(u64, u32, Tag)]) -> io::Result<()> {
        let map = self.map();
        let size = map.file(io.slot).size();
        let start = run[0].0 * PAGE64;
        if start >= size {
            return Ok(());
        }
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(run.len());
        let mut total = 0usize;
        for &(index, f, _) in run {
            let page_start = index * PAGE64;
            if page_start >= size {
                break;
            }
            let len = (size - page_start).min(PAGE64) as usize;
            let Some(ptr) = map.frame_addr(f) else { break };
            iov.push(libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            });
            total += len;
        }
        let mut done = 0usize;
        let mut first = 0usize;
        while done < total {
            // SAFETY: every iovec is inside a frame of the mapping, which
            // lives while `self` does; the kernel only reads them.
            let r = unsafe {
                libc::pwritev(
                    io.fd.as_raw_fd(),
                    iov[first..].as_ptr(),
                    (iov.len() - first) as libc::c_int,
                    (start + done as u64) as libc::off_t,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            let mut r = r as usize;
            done += r;
            while r > 0 && first < iov.len() {
                if r >= iov[first].iov_len {
                    r -= iov[first].iov_len;
                    first += 1;
                } else {
                    // SAFETY: still inside the same frame.
                    iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(r) }.cast();
                    iov[first].iov_len -= r;
                    r = 0;
                }
            }
        }
        Ok(())
    }

    /// Write back this member's dirty frames made dirty at least `age_ms`
    /// ago, at most `max` of them (the oldest first), and drop the entries
    /// of frames that are clean.
    pub(crate) fn flush_own(&self, me: Owner, age_ms: u32, max: usize) {
        let ms = self.map().member(me.slot());
        let mut list = Vec::new();
        // (a hint: what a compaction moved meanwhile waits for the next pass)
        let _ = ms.dirty_snapshot(&mut list);
        let now = member::now_ms();
        let old: Vec<u32> = list
            .iter()
            .filter(|e| now.wrapping_sub(e.at) >= age_ms)
            .take(max)
            .map(|e| e.frame)
            .collect();
        if !old.is_empty() {
            let _ = self.write_back(me, &old);
        }
        self.compact_own(me);
    }

    /// Drop this member's list entries whose frames are neither dirty nor
    /// being written back (nothing to do, and no lock taken, when the list
    /// is empty). Called after each writeback of a file too, so that the
    /// next one reads only what was dirtied since, not every commit's since
    /// the flusher's last pass.
    pub(crate) fn compact_own(&self, me: Owner) {
        if self.map().member(me.slot()).dirty_len() == 0 {
            return;
        }
        let _g = self.local.dirty.lock();
        let map = self.map();
        let left = map.member(me.slot()).dirty_retain(|e| {
            map.frame(e.frame)
                .is_some_and(|h| h.state() & (DIRTY | WRITEBACK) != 0)
        });
        if left == 0 {
            // under the list's lock: no entry can come in between
            self.clear_dirty_member(me.slot());
        }
    }

    /// Say in the header that member slot `m`'s list may hold entries
    /// (before its first entry goes in; under the list's lock).
    pub(crate) fn mark_dirty_member(&self, m: usize) {
        let bit = 1u64 << m;
        let w = self.hword(hdr::DIRTY_MEMBERS);
        if w.load(Ordering::Relaxed) & bit == 0 {
            w.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// Say that member slot `m`'s list is empty (by whoever holds it: its
    /// owner under the list's lock, a joiner or recoverer of the slot).
    pub(crate) fn clear_dirty_member(&self, m: usize) {
        let bit = 1u64 << m;
        let w = self.hword(hdr::DIRTY_MEMBERS);
        if w.load(Ordering::Relaxed) & bit != 0 {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Every dirty frame of file slot `slot` (its epoch now), from every
    /// member's list, and those being written back.
    pub(crate) fn dirty_of(&self, slot: usize) -> (Vec<u32>, Vec<u32>) {
        let map = self.map();
        let epoch = map.file(slot).epoch();
        let mut dirty = Vec::new();
        let mut under = Vec::new();
        let mut list = Vec::new();
        let mut members = self.hword(hdr::DIRTY_MEMBERS).load(Ordering::Acquire);
        while members != 0 {
            let m = members.trailing_zeros() as usize;
            members &= members - 1;
            if m >= MEMBERS {
                break;
            }
            let ms = map.member(m);
            if ms.dirty_len() == 0 {
                continue;
            }
            self.exact_dirty_list(m, &mut list);
            for e in &list {
                let Some(h) = map.frame(e.frame) else {
                    continue;
                };
                let tag = h.tag();
                if tag.slot() != slot || tag.epoch() != epoch {
                    continue;
                }
                let st = h.state();
                if st & DIRTY != 0 {
                    dirty.push(e.frame);
                } else if st & WRITEBACK != 0 {
                    under.push(e.frame);
                }
            }
        }
        dirty.sort_unstable();
        dirty.dedup();
        under.sort_unstable();
        under.dedup();
        (dirty, under)
    }

    /// Every entry of member slot `m`'s dirty list: this member's own read
    /// under the list's lock (its threads compact it under that lock, and
    /// a snapshot beside a compaction in a loop could miss entries);
    /// another's read again until the read is exact, recovering the owner
    /// if it died in the middle of a compaction (then its recoverer has
    /// the entries), or after about two seconds of a live owner
    /// compacting without a pause, as read.
    fn exact_dirty_list(&self, m: usize, out: &mut Vec<DirtyEntry>) {
        let ms = self.map().member(m);
        if self.member_slot() == Some(m) {
            let _g = self.local.dirty.lock();
            // (not exact only when a dead member whose slot this one
            // took died in the middle of a compaction: as read)
            let _ = ms.dirty_snapshot(out);
            return;
        }
        for _ in 0..10_000 {
            if ms.dirty_snapshot(out) {
                return;
            }
            let o = Owner::of_slot(m);
            if !self.alive(o) {
                self.stuck(o);
                let _ = ms.dirty_snapshot(out);
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Write back every frame of `io`'s file dirty now, wait for the
    /// writebacks of others, and sync the descriptor (`data`: only the
    /// data, as `fdatasync`).
    ///
    /// # Errors
    /// A write's error, or the sync's.
    pub(crate) fn sync_file(&self, me: Owner, io: &FileIo, data: bool) -> io::Result<()> {
        let mut first = self.settle_file(me, io);
        let fd = io.fd.as_raw_fd();
        let r = if data {
            // SAFETY: a descriptor of ours.
            unsafe { libc::fdatasync(fd) }
        } else {
            // SAFETY: a descriptor of ours.
            unsafe { libc::fsync(fd) }
        };
        if r != 0 && first.is_ok() {
            first = Err(io::Error::last_os_error());
        }
        first
    }

    /// Write back every frame of `io`'s file dirty now and wait for the
    /// writebacks of others: afterwards none of the file's frames is dirty
    /// or under writeback, unless another member's writer mark kept it.
    ///
    /// # Errors
    /// A write's error.
    pub(crate) fn settle_file(&self, me: Owner, io: &FileIo) -> io::Result<()> {
        let (dirty, under) = self.dirty_of(io.slot);
        let mut first = Ok(());
        if !dirty.is_empty() {
            let mut pages: Vec<(u64, u32)> = dirty
                .iter()
                .filter_map(|&f| self.map().frame(f).map(|h| (h.tag().index, f)))
                .collect();
            pages.sort_unstable();
            first = self.write_back_file(me, io, &pages);
        }
        for f in under.into_iter().chain(dirty.iter().copied()) {
            self.wait_writeback(me, io, f);
        }
        self.compact_own(me);
        first
    }

    /// Wait until frame `f` is not under writeback (a dead writer's is made
    /// dirty again by its recovery; then it is written here).
    fn wait_writeback(&self, me: Owner, io: &FileIo, f: u32) {
        let Some(h) = self.map().frame(f) else { return };
        let slot = self.map().file(io.slot);
        for _ in 0..10_000 {
            if slot.marked_by_other(me) {
                // another member's change: its frames are its own to write
                return;
            }
            let st = h.state();
            if st & WRITEBACK == 0 {
                let tag = h.tag();
                if st & DIRTY != 0 && tag.slot() == io.slot && !self.stale(tag) {
                    let _ = self.write_back_file(me, io, &[(tag.index, f)]);
                    continue;
                }
                return;
            }
            self.wait_writeback_end(h, st, me);
        }
    }

    /// Wait (one tick at most) for the writeback in flight on frame `h`
    /// (state `st`) to end; if its owner is dead, recover it instead (its
    /// recovery makes the frame dirty again). The caller looks again.
    pub(crate) fn wait_writeback_end(&self, h: &FrameHeader, st: u32, me: Owner) {
        if let Some(o) = FrameHeader::writeback_owner(st) {
            if o != me && !self.alive(o) {
                self.stuck(o);
                return;
            }
        }
        h.wait_while(st, super::frame::WAIT_TICK);
    }

    /// Start this process's flusher if it has none yet.
    fn start_flusher(&self) {
        let gen = crate::fork::generation();
        let cur = self.local.flusher_gen.load(Ordering::Acquire);
        if cur == gen
            || self
                .local
                .flusher_gen
                .compare_exchange(cur, gen, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let Some(me) = self.self_arc() else { return };
        let weak = Arc::downgrade(&me);
        drop(me);
        let _ = std::thread::Builder::new()
            .name("kxarray-shared-flush".into())
            .spawn(move || flusher(weak, gen));
    }
}

/// The flusher: every half second, this member's frames older than
/// [`DIRTY_EXPIRE_MS`]; ends with the region or in a child process.
fn flusher(region: Weak<Region>, gen: u64) {
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let Some(r) = region.upgrade() else { return };
        if crate::fork::generation() != gen {
            return;
        }
        let Ok(me) = r.me() else { return };
        r.flush_own(me, DIRTY_EXPIRE_MS, DIRTY_MAX);
        r.publish_counters();
    }
}

/// Call off a writeback of frame `h` begun for `tag` before its write:
/// the frame is dirty again, as it was (the count the writeback held
/// becomes the dirty flag's, or is given back if a write made the frame
/// dirty meanwhile).
fn abort_writeback(h: &FrameHeader, tag: Tag, slot: &super::map::FileSlot) {
    let st = h.state();
    if st & VALID != 0 && h.tag() == tag && st & DIRTY == 0 {
        h.end_writeback(DIRTY);
    } else {
        h.end_writeback(0);
        slot.dirty_dec();
    }
}

/// End a writeback of frame `h` begun for `tag` (`err`: its errno if it
/// failed): the count the writeback held is given back unless the frame is
/// dirty again because of the error.
fn end_writeback(h: &FrameHeader, tag: Tag, err: Option<i32>, slot: &super::map::FileSlot) {
    let st = h.state();
    let same = st & VALID != 0 && h.tag() == tag;
    if err.is_some() && same && st & DIRTY == 0 {
        // the held count becomes the dirty flag's
        h.end_writeback(DIRTY | ERROR);
    } else {
        h.end_writeback(if err.is_some() && same { ERROR } else { 0 });
        slot.dirty_dec();
    }
}
