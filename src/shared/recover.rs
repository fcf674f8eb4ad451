//! Recovering a dead member: whoever proves a member dead undoes what it
//! left, while every other member goes on.
//!
//! Owns the one recovery procedure. Its caller holds the dead member's
//! liveness byte (so it is the only recoverer of that slot, and no new
//! member can take the slot meanwhile). A member can only leave behind the
//! locks it held and the marks it made; recovery finds them by scanning
//! (no log is written on any hot path), in an order that never waits for a
//! lock the dead member holds:
//!
//! 0. **The files it was changing** (its mark in a file's writer word,
//!    [`SharedFile::mark_writer`](super::SharedFile::mark_writer)): every
//!    frame of such a file is retired first (a new epoch; dirty ones are
//!    discarded, never written back), then the mark cleared. Its changes
//!    were not final, and whoever undoes them (a journal's rollback, by a
//!    member or by a process outside the region writing the file
//!    directly) must find no frame holding them.
//! 1. **Bucket locks** it held are released: every change under a bucket
//!    lock is a single store, so the bucket is consistent as it stands.
//! 2. **The table locks** (files, resize) it held are released; a file
//!    lock it held with a truncation running is released after the
//!    truncation's frames above the size are dropped.
//! 3. **Frames**, every one with memory (below the backed mark): a frame
//!    it had locked is taken over ([`FrameHeader::steal`]) and finished by
//!    the rule for its state:
//!    - not `VALID` (a fill, a claim or an eviction never finished): the
//!      frame is freed and any index entry naming it removed; waiters find
//!      nothing and fill the page again;
//!    - `VALID` with an odd version (a write cut short): the version is
//!      made even and the frame dirty, its bytes as the dead member left
//!      them (the kernel's `write` cut short by death leaves what it
//!      copied too);
//!    - `VALID` with an even version: dirty frames are put on the
//!      recoverer's dirty list, the lock released.
//!
//!    A writeback it had in flight is made dirty again (its `pwrite` may
//!    not have happened).
//! 4. **Its dirty list** is adopted: every frame on it still dirty or
//!    being written back goes on the recoverer's list, which its flusher
//!    writes back. Nothing the dead member wrote is lost.
//! 5. **Its openers bits** are cleared from every file, its counters folded
//!    into the region's, and its slot freed.

use super::files::{member_bit, w as fw, LIVE as FILE_LIVE};
use super::frame::{FrameHeader, Owner, Tag, DIRTY, OWNER, VALID, WRITEBACK};
use super::index::fingerprint;
use super::layout::{hdr, FILES, FILE_BYTES, PAGE64};
use super::member::{w as mw, DirtyEntry};
use super::region::Region;
use crate::sync::Ordering;

/// Undo what member `dead` left; the caller (`me`) holds its liveness
/// byte. The slot is free afterwards, unless `me == dead`: a joiner taking
/// over the dead member's slot, which then keeps its dirty list as its own.
pub(crate) fn recover(region: &Region, dead: Owner, me: Owner) {
    let same = dead == me;
    let map = region.map();
    let geo = *map.geo();
    let mut locks = 0u64;
    let mut freed = 0u64;

    // 0. the files it was changing
    let retired = retire_changes(region, dead);
    // 1. bucket locks (only in the index's pages that were ever written:
    // a hole of the file holds no lock, and reading it would allocate it)
    let size = 128u64;
    for (from, to) in region.with_fd(|fd| data_ranges(fd, geo.index_off, geo.buckets * size)) {
        for b in from / size..to.div_ceil(size).min(geo.buckets) {
            if map.bucket(b).release_dead(dead) {
                locks += 1;
            }
        }
    }
    // 2. the table locks
    locks += region.release_table_locks(dead);
    let mut adopt: Vec<DirtyEntry> = Vec::new();
    // 3. frames
    // Frames above the backed mark were never used, or were evicted and
    // their memory punched out: none holds anything of the dead member's
    // (and reading their headers would allocate the metadata's pages).
    let top = region
        .hword(hdr::BACKED)
        .load(Ordering::Acquire)
        .min(geo.max_frames);
    for f in 0..top as u32 {
        let Some(h) = map.frame(f) else { break };
        let st = h.state();
        if st & OWNER == dead.bits() {
            let prev = if same {
                Some(st & !OWNER)
            } else {
                h.steal(dead, me)
            };
            if let Some(prev) = prev {
                locks += 1;
                if finish_frame(region, f, h, me, prev, &mut adopt) {
                    freed += 1;
                }
            }
        }
        let st = h.state();
        if st & WRITEBACK != 0 && FrameHeader::writeback_owner(st) == Some(dead) {
            // the dead member's count for the frame stays with the frame
            let was_dirty = st & DIRTY != 0;
            if h.steal_writeback(dead, DIRTY) {
                locks += 1;
                if was_dirty {
                    let t = h.tag();
                    if t.slot() < FILES {
                        map.file(t.slot()).dirty_dec();
                    }
                }
                adopt.push(DirtyEntry {
                    frame: f,
                    at: super::member::now_ms(),
                });
            }
        }
    }
    // 2b. file locks (after the frames: a truncation's frames are dropped
    // under the file lock, which the recoverer now finishes)
    for s in used_file_slots(region) {
        let slot = map.file(s);
        if slot.get(fw::STATE) != FILE_LIVE {
            continue;
        }
        let lw = slot.lock_word();
        if lw.load(Ordering::Acquire) == dead.bits() {
            let from = slot.get(fw::TRUNCATING);
            if from != 0 {
                drop_above(region, s, slot.size(), from, me);
                slot.set(fw::TRUNCATING, 0);
            }
            if lw
                .compare_exchange(dead.bits(), 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                super::wait::wake_all(lw);
                locks += 1;
            }
        }
    }
    // 4. the dirty list (a joiner of the slot keeps it as its own)
    let ms = map.member(dead.slot());
    if !same {
        let mut list = Vec::new();
        ms.dirty_snapshot(&mut list);
        for e in list {
            if let Some(h) = map.frame(e.frame) {
                if h.state() & (DIRTY | WRITEBACK) != 0 {
                    adopt.push(e);
                }
            }
        }
    }
    region.adopt_dirty(me, &adopt);
    // 5. openers, counters, the slot
    release_openers(region, dead);
    for i in 0..super::member::COUNTERS {
        let v = ms.counter(i);
        region
            .hword(hdr::RETIRED + i)
            .fetch_add(v, Ordering::Relaxed);
        ms.set_counter(i, 0);
    }
    if !same {
        ms.words[mw::DIRTY_COUNT].store(0, Ordering::Relaxed);
        region.clear_dirty_member(dead.slot());
        ms.words[mw::STATE].store(0, Ordering::Release);
    }
    region.hword(hdr::RECOVERED).fetch_add(1, Ordering::Relaxed);
    region
        .hword(hdr::RECOVERED_FRAMES)
        .fetch_add(freed, Ordering::Relaxed);
    region
        .hword(hdr::RECOVERED_LOCKS)
        .fetch_add(locks, Ordering::Relaxed);
    region.hword(hdr::MEMBERSHIP).fetch_add(1, Ordering::AcqRel);
    // A member that ended without leaving and left nothing to undo (a
    // process's exit with the region in a static) is not news.
    let level = if retired == 0 && locks == 0 && freed == 0 && adopt.is_empty() {
        log::Level::Debug
    } else {
        log::Level::Info
    };
    log::log!(
        level,
        "kxarray: shared cache {}: member {} died; retired {retired} files it was changing, recovered {locks} locks, freed {freed} frames, adopted {} dirty",
        region.path().display(),
        dead.slot(),
        adopt.len()
    );
}

/// Finish frame `f`, taken over from a dead member (state `prev` without
/// the owner); whether it was freed.
fn finish_frame(
    region: &Region,
    f: u32,
    h: &FrameHeader,
    me: Owner,
    prev: u32,
    adopt: &mut Vec<DirtyEntry>,
) -> bool {
    let changing = h.seq() & 1 != 0;
    let tag = h.tag();
    if prev & VALID == 0 {
        // a fill, claim or eviction never finished: free the frame
        let s = h.begin_change();
        if tag != Tag::NONE {
            let b = region.map().bucket(tag.hash());
            let g = b.lock(me, &mut |o| region.stuck(o));
            if !g.remove(fingerprint(tag.hash()), f, None) {
                g.remove_frame(f);
            }
        }
        h.set_tag(Tag::NONE);
        h.end_change(s);
        h.unlock(me, 0, DIRTY | VALID);
        return true;
    }
    if changing {
        // a write cut short: the bytes stay as they are, dirty
        let s = h.seq() & !1;
        if prev & DIRTY == 0 && tag.slot() < FILES {
            region.map().file(tag.slot()).dirty_inc();
        }
        h.set_flags(me, DIRTY, 0);
        h.end_change(s);
    }
    if h.state() & DIRTY != 0 {
        adopt.push(DirtyEntry {
            frame: f,
            at: super::member::now_ms(),
        });
    }
    h.unlock(me, 0, 0);
    false
}

/// Drop every frame of file slot `s` from page `size` up to page `from`
/// (the end of a truncation a dead member began).
fn drop_above(region: &Region, s: usize, size: u64, from: u64, me: Owner) {
    let slot = region.map().file(s);
    let epoch = slot.epoch();
    let first = size.div_ceil(PAGE64);
    let last = from.div_ceil(PAGE64);
    for index in first..last {
        region.drop_page(Tag::new(s, epoch, index), me);
    }
}

/// The parts of `len` bytes of the region file from `off` that hold data
/// (`SEEK_DATA`/`SEEK_HOLE`; a swapped-out page is data), relative to
/// `off`; the whole range when the file system cannot tell.
fn data_ranges(fd: std::os::fd::BorrowedFd<'_>, off: u64, len: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let end = off + len;
    let mut out = Vec::new();
    let mut pos = off;
    while pos < end {
        // SAFETY: lseek on a descriptor of ours moves only its offset,
        // which nothing else of the region uses (every I/O is positional).
        let data = unsafe { libc::lseek(fd.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // no data past `pos`
            }
            return vec![(0, len)];
        }
        let data = data as u64;
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd.as_raw_fd(), data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return vec![(0, len)];
        }
        let hole = (hole as u64).min(end);
        out.push((data - off, hole - off));
        pos = hole;
    }
    out
}

/// Retire every frame of each file member `o` marked itself the writer
/// of and clear its marks (`o` is dead, or leaving with a change not made
/// final); how many files.
fn retire_changes(region: &Region, o: Owner) -> usize {
    used_file_slots(region)
        .into_iter()
        .filter(|&s| region.map().file(s).retire_writer(o))
        .count()
}

/// The file slots whose bytes the region's file holds: a slot in a hole
/// of it was never written (never claimed), and reading it would allocate
/// its page (the table is 3 MiB, and every join after an exit recovers).
fn used_file_slots(region: &Region) -> Vec<usize> {
    let geo = region.map().geo();
    let size = FILE_BYTES as u64;
    let mut slots = Vec::new();
    for (from, to) in region.with_fd(|fd| data_ranges(fd, geo.files_off, FILES as u64 * size)) {
        slots.extend((from / size) as usize..(to.div_ceil(size) as usize).min(FILES));
    }
    slots
}

/// A member leaving: its writer marks cleared (their files' frames
/// retired), then its bit in every file's openers.
pub(crate) fn leave_files(region: &Region, o: Owner) {
    retire_changes(region, o);
    release_openers(region, o);
}

/// Clear member `o`'s bit in every file's openers.
pub(crate) fn release_openers(region: &Region, o: Owner) {
    let bit = member_bit(o);
    for s in used_file_slots(region) {
        let slot = region.map().file(s);
        if slot.get(fw::OPENERS) & bit != 0 {
            slot.words[fw::OPENERS].fetch_and(!bit, Ordering::AcqRel);
        }
    }
}
