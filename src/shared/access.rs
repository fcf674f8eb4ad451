//! One page at a time: the hit, the miss and the write, the paths every
//! byte range is made of.
//!
//! Owns the page paths over the region.
//!
//! - **The hit** ([`Region::read_cached`]): the tag's bucket, a frame
//!   whose entry's fingerprint matches, its version and tag and `VALID` in
//!   one read section, the bytes copied, the version checked again. No
//!   lock, no store to shared memory but the reference bit when it is
//!   clear, no system call.
//! - **The miss** ([`Region::get_locked`]): under the bucket's lock, the
//!   page is looked for again (another member may have it: then this one
//!   waits on that frame's lock, so two members missing one page read the
//!   file once); if it is absent, a frame comes from the clock, is tagged
//!   inside a change, entered in the index, filled from the file with the
//!   frame locked (waiters sleep on it), marked `VALID`, its change ended.
//!   A frame is locked before any bucket lock is taken and no bucket lock
//!   is held while waiting for a frame, nor for I/O but a write the region
//!   has no frame for (below): the lock order is frame, then bucket.
//! - **The write** ([`Region::write_locked`]): under the frame's lock, the
//!   bytes stored inside a change; a frame made dirty is counted in its
//!   file's dirty count before its flag is set and put on the writer's
//!   dirty list before its lock is released.
//!
//! When the region has no frame to give (every one dirty, pinned by a
//! lock, or the bucket full), the page is not cached: reads go to the file
//! and writes go through to it, under the page's bucket lock after looking
//! for the page again, so a fill that races the write reads it (its frame
//! enters the index under that lock before its `pread`). When a writer's
//! dirty list has no room, the page is written through its frame: the
//! frame takes the bytes and, unless it is dirty already (then it is on a
//! list), the file gets them before the frame's lock is released. Either
//! way no frame is left holding bytes older than the file's.

use super::frame::{Owner, Tag, DIRTY, ERROR, VALID};
use super::index::{fingerprint, Inserted};
use super::layout::{hdr, PAGE, PAGE64};
use super::region::Region;
use crate::sync::Ordering;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;

/// How a frame claimed for a page gets its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Read from the file (`pread` of the page; past the end, zeros).
    Read,
    /// Zeros (a page wholly past the end of the file).
    Zero,
    /// Nothing: the caller overwrites the whole page inside the change,
    /// which stays open.
    Overwrite,
}

/// A frame holding a page, locked by this member.
#[derive(Debug)]
pub(crate) struct Locked {
    /// The frame.
    pub(crate) frame: u32,
    /// The change left open for an [`Fill::Overwrite`] claim (its version
    /// before): the caller stores the page and ends it.
    pub(crate) open: Option<u64>,
    /// Whether this call claimed the frame for the page (filled from the
    /// file, zeroed or left for an overwrite): `false` when a frame
    /// already held it, which is a hit for the page cache's statistics.
    pub(crate) filled: bool,
}

/// What [`Region::drop_clean_page`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// The page was cached clean and is dropped.
    Yes,
    /// It is dirty or being written back: it stays.
    Dirty,
    /// No frame held it.
    Absent,
}

/// What [`Region::get_locked`] got.
#[derive(Debug)]
pub(crate) enum Got {
    /// The page in a locked frame.
    Frame(Locked),
    /// No frame could hold it: do the I/O without the cache.
    Uncached,
}

/// Drop the kernel's page cache of `len` bytes of `fd` from `off` (0:
/// to the end): advice, whose failure changes nothing but memory.
pub(crate) fn drop_kernel_copy(fd: BorrowedFd<'_>, off: u64, len: u64) {
    // SAFETY: advice on a descriptor of ours; no memory is passed.
    unsafe {
        libc::posix_fadvise(
            fd.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// `pread` the whole of `len` bytes at `off` into `ptr`, stopping at the end
/// of the file: how many were read.
///
/// # Safety
/// - `ptr..ptr + len` is writable memory no Rust reference covers (a
///   frame's bytes, written by the kernel).
pub(crate) unsafe fn pread_into(
    fd: BorrowedFd<'_>,
    ptr: *mut u8,
    len: usize,
    off: u64,
) -> io::Result<usize> {
    debug_assert!(!ptr.is_null());
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's range, from `done` on.
        let r = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                ptr.wrapping_add(done).cast(),
                len - done,
                (off + done as u64) as libc::off_t,
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
            break;
        }
        done += r as usize;
    }
    Ok(done)
}

impl Region {
    /// Copy bytes `off..off + dst.len()` of page `tag` if a frame holds it
    /// now: whether it did (nothing written to `dst` is kept otherwise).
    #[inline]
    pub(crate) fn read_cached(&self, tag: Tag, off: usize, dst: &mut [u8]) -> bool {
        debug_assert!(off + dst.len() <= PAGE);
        let map = self.map();
        let hints = &self.local.hints;
        let key = tag.hint_key();
        // The frame this process found the page in last, accepted only as
        // an index entry is: its tag read inside the version window.
        if let Some(f) = hints.get(key) {
            if let Some(h) = map.frame(f) {
                if let Some(s) = h.read_begin() {
                    if h.tag() == tag && self.copy_valid(f, s, off, dst) == Some(true) {
                        return true;
                    }
                }
            }
        }
        let hash = tag.hash();
        let fp = fingerprint(hash);
        let b = map.bucket(hash);
        for _ in 0..4 {
            let Some((f, s)) = b.find(fp, tag, map) else {
                return false;
            };
            if s & 1 != 0 {
                return false; // being filled or written: the slow path waits
            }
            match self.copy_valid(f, s, off, dst) {
                None => return false,
                Some(true) => {
                    hints.set(key, f);
                    return true;
                }
                Some(false) => {} // the version moved: look again
            }
        }
        false
    }

    /// Copy bytes `off..` of frame `f` into `dst` if it is `VALID`, and
    /// mark it referenced if its version is still `s` after the copy:
    /// `Some(true)` when the copy is the page's, `Some(false)` when the
    /// version moved, `None` when the frame holds no page.
    #[inline]
    fn copy_valid(&self, f: u32, s: u64, off: usize, dst: &mut [u8]) -> Option<bool> {
        let map = self.map();
        let (Some(h), Some(bytes)) = (map.frame(f), map.bytes(f)) else {
            return None;
        };
        if h.state() & VALID == 0 {
            return None;
        }
        bytes.load(off, dst);
        let same = h.read_check(s);
        if same {
            h.touch();
        }
        Some(same)
    }

    /// The page `tag` in a frame locked by `me`: the frame holding it, or
    /// a new one filled by `fill` from `fd` (`size` is the file's size, for
    /// the part of the page past its end).
    ///
    /// # Errors
    /// The file's read error (nothing is cached for the page then).
    pub(crate) fn get_locked(
        &self,
        tag: Tag,
        me: Owner,
        fill: Fill,
        fd: BorrowedFd<'_>,
        size: u64,
    ) -> io::Result<Got> {
        let hash = tag.hash();
        let fp = fingerprint(hash);
        let map = self.map();
        let b = map.bucket(hash);
        let mut stuck = |o: Owner| self.stuck(o);
        loop {
            let found = b.lock(me, &mut stuck).lookup(fp, tag, map);
            if let Some(f) = found {
                let Some(h) = map.frame(f) else {
                    return Ok(Got::Uncached);
                };
                let st = h.lock(me, &mut stuck);
                if st & VALID != 0 && h.tag() == tag {
                    return Ok(Got::Frame(Locked {
                        frame: f,
                        open: None,
                        filled: false,
                    }));
                }
                h.unlock(me, 0, 0);
                continue;
            }
            let f = match self.alloc_frame(me) {
                Ok(f) => f,
                Err(_) => return Ok(Got::Uncached),
            };
            let (Some(h), Some(bytes)) = (map.frame(f), map.bytes(f)) else {
                return Ok(Got::Uncached);
            };
            let s = h.begin_change();
            h.set_tag(tag);
            let ins = b.lock(me, &mut stuck).insert(fp, tag, f, map);
            let refault = match ins {
                Inserted::New(r) => r,
                Inserted::Exists(_) | Inserted::Full => {
                    h.set_tag(Tag::NONE);
                    h.end_change(s);
                    h.unlock(me, 0, 0);
                    if matches!(ins, Inserted::Full) {
                        return Ok(Got::Uncached);
                    }
                    continue;
                }
            };
            let start = tag.index * PAGE64;
            let fill = if fill == Fill::Read && start >= size {
                Fill::Zero
            } else {
                fill
            };
            match fill {
                Fill::Overwrite => {
                    self.note_fill(refault, h);
                    return Ok(Got::Frame(Locked {
                        frame: f,
                        open: Some(s),
                        filled: true,
                    }));
                }
                Fill::Zero => bytes.zero(0, PAGE),
                Fill::Read => {
                    // SAFETY: a frame's bytes: no Rust reference covers
                    // them; the frame is locked and inside a change, so no
                    // reader keeps what it copies meanwhile.
                    match unsafe { pread_into(fd, bytes.as_ptr(), PAGE, start) } {
                        Ok(n) => {
                            if n < PAGE {
                                bytes.zero(n, PAGE - n);
                            }
                            if self.drop_behind() && start >= PAGE64 {
                                drop_kernel_copy(fd, start, PAGE as u64);
                            }
                        }
                        Err(e) => {
                            {
                                let g = b.lock(me, &mut stuck);
                                g.remove(fp, f, None);
                            }
                            h.set_tag(Tag::NONE);
                            h.end_change(s);
                            h.unlock(me, 0, VALID | DIRTY | ERROR);
                            return Err(e);
                        }
                    }
                    self.hword(hdr::FILLS).fetch_add(1, Ordering::Relaxed);
                }
            }
            h.set_flags(me, VALID, 0);
            h.end_change(s);
            self.note_fill(refault, h);
            return Ok(Got::Frame(Locked {
                frame: f,
                open: None,
                filled: true,
            }));
        }
    }

    fn note_fill(&self, refault: Option<u32>, h: &super::frame::FrameHeader) {
        if let Some(stamp) = refault {
            if self.refault_is_hot(stamp) {
                h.set_ref();
            }
        }
    }

    /// Copy bytes `off..` of the locked frame into `dst` and unlock it.
    pub(crate) fn read_locked(&self, l: Locked, me: Owner, off: usize, dst: &mut [u8]) {
        let map = self.map();
        let (Some(h), Some(bytes)) = (map.frame(l.frame), map.bytes(l.frame)) else {
            return;
        };
        debug_assert!(l.open.is_none());
        bytes.load(off, dst);
        h.touch();
        h.unlock(me, 0, 0);
    }

    /// Store `src` at `off` of the locked frame (page `tag`), mark it dirty
    /// (counted in file slot `tag.slot()`, put on this member's dirty list
    /// with the reservation the caller made), and unlock it.
    pub(crate) fn write_locked(&self, l: Locked, me: Owner, tag: Tag, off: usize, src: &[u8]) {
        let map = self.map();
        let (Some(h), Some(bytes)) = (map.frame(l.frame), map.bytes(l.frame)) else {
            self.unreserve_dirty();
            return;
        };
        let s = l.open.unwrap_or_else(|| h.begin_change());
        bytes.store(off, src);
        let was_dirty = h.state() & DIRTY != 0;
        if !was_dirty {
            map.file(tag.slot()).dirty_inc();
        }
        h.set_flags(me, VALID | DIRTY, 0);
        h.end_change(s);
        if was_dirty {
            self.unreserve_dirty();
        } else {
            self.push_dirty(l.frame);
        }
        h.unlock(me, 0, 0);
    }

    /// Store `src` at `off` of the locked frame (page `tag`, at byte `pos`
    /// of the file) without a dirty-list reservation: a frame dirty
    /// already is on a list, and takes the bytes as
    /// [`write_locked`](Self::write_locked) would; a clean one (or a claim
    /// for an overwrite) takes them and the file gets them at once, the
    /// frame's lock held until it has (so the frame stays clean and the
    /// file's). Unlocks it.
    ///
    /// # Errors
    /// The file's write error: the frame is dropped then (it holds bytes
    /// the file does not, and is on no dirty list).
    pub(crate) fn write_locked_through(
        &self,
        l: Locked,
        me: Owner,
        tag: Tag,
        off: usize,
        src: &[u8],
        file: &File,
    ) -> io::Result<()> {
        let map = self.map();
        let (Some(h), Some(bytes)) = (map.frame(l.frame), map.bytes(l.frame)) else {
            return file.write_all_at(src, tag.index * PAGE64 + off as u64);
        };
        let s = l.open.unwrap_or_else(|| h.begin_change());
        bytes.store(off, src);
        if h.state() & DIRTY != 0 {
            h.end_change(s);
            h.unlock(me, 0, 0);
            return Ok(());
        }
        match file.write_all_at(src, tag.index * PAGE64 + off as u64) {
            Ok(()) => {
                h.set_flags(me, VALID, 0);
                h.end_change(s);
                h.unlock(me, 0, 0);
                Ok(())
            }
            Err(e) => {
                self.abandon(l.frame, me, tag, s);
                Err(e)
            }
        }
    }

    /// Write `src` at byte `pos` of the file (page `tag`) straight through,
    /// when no frame could take it: under the page's bucket lock, after
    /// looking for the page again, so no fill of it can begin until the
    /// bytes are in the file (a fill enters its frame under that lock,
    /// then reads). `Ok(false)` when a frame holds the page now: nothing
    /// was written, the caller writes through that frame. (The one place a
    /// bucket lock is held across I/O: a write the region has no room for.)
    ///
    /// # Errors
    /// The file's write error.
    pub(crate) fn write_uncached(
        &self,
        tag: Tag,
        me: Owner,
        src: &[u8],
        pos: u64,
        file: &File,
    ) -> io::Result<bool> {
        let hash = tag.hash();
        let map = self.map();
        let b = map.bucket(hash);
        let g = b.lock(me, &mut |o| self.stuck(o));
        if g.lookup(fingerprint(hash), tag, map).is_some() {
            return Ok(false);
        }
        file.write_all_at(src, pos)?;
        drop(g);
        Ok(true)
    }

    /// Drop page `tag` from the region if a frame holds it (truncation,
    /// invalidation): its dirty bytes are discarded. Whether one did.
    pub(crate) fn drop_page(&self, tag: Tag, me: Owner) -> bool {
        let hash = tag.hash();
        let fp = fingerprint(hash);
        let map = self.map();
        let b = map.bucket(hash);
        let mut stuck = |o: Owner| self.stuck(o);
        let Some(f) = b.lock(me, &mut stuck).lookup(fp, tag, map) else {
            return false;
        };
        let Some(h) = map.frame(f) else { return false };
        let st = h.lock(me, &mut stuck);
        if h.tag() != tag || st & VALID == 0 {
            h.unlock(me, 0, 0);
            return false;
        }
        // a writeback in flight finishes on its own; the frame it ends on
        // is then free (its end only clears its flag)
        self.evict_locked(f, h, me, tag, st, true);
        h.unlock(me, 0, 0);
        true
    }

    /// Drop page `tag` if a frame holds it clean (revalidation: the kernel's
    /// `invalidate_mapping_pages`, which leaves dirty pages alone), after
    /// any fill in flight (its read may predate the change).
    pub(crate) fn drop_clean_page(&self, tag: Tag, me: Owner) -> Dropped {
        let hash = tag.hash();
        let fp = fingerprint(hash);
        let map = self.map();
        let b = map.bucket(hash);
        let mut stuck = |o: Owner| self.stuck(o);
        let Some(f) = b.lock(me, &mut stuck).lookup(fp, tag, map) else {
            return Dropped::Absent;
        };
        let Some(h) = map.frame(f) else {
            return Dropped::Absent;
        };
        let st = h.lock(me, &mut stuck);
        if h.tag() != tag || st & VALID == 0 {
            h.unlock(me, 0, 0);
            return Dropped::Absent;
        }
        if st & (DIRTY | super::frame::WRITEBACK) != 0 {
            h.unlock(me, 0, 0);
            return Dropped::Dirty;
        }
        self.evict_locked(f, h, me, tag, st, false);
        h.unlock(me, 0, 0);
        Dropped::Yes
    }

    /// Give back a frame claimed for an overwrite and not written (its
    /// change `s` still open): out of the index, free, unlocked.
    pub(crate) fn abandon(&self, f: u32, me: Owner, tag: Tag, s: u64) {
        let map = self.map();
        let Some(h) = map.frame(f) else { return };
        {
            let b = map.bucket(tag.hash());
            let g = b.lock(me, &mut |o| self.stuck(o));
            g.remove(fingerprint(tag.hash()), f, None);
        }
        h.set_tag(Tag::NONE);
        h.end_change(s);
        h.unlock(me, 0, VALID | DIRTY | ERROR);
    }

    /// Zero page `tag`'s bytes from `from` to its end if a frame holds it
    /// (a truncation's new last page: past the end of the file, bytes read
    /// as zeros if it grows again).
    pub(crate) fn zero_tail(&self, tag: Tag, me: Owner, from: usize) {
        let hash = tag.hash();
        let fp = fingerprint(hash);
        let map = self.map();
        let Some(f) = map
            .bucket(hash)
            .lock(me, &mut |o| self.stuck(o))
            .lookup(fp, tag, map)
        else {
            return;
        };
        let (Some(h), Some(bytes)) = (map.frame(f), map.bytes(f)) else {
            return;
        };
        let st = h.lock(me, &mut |o| self.stuck(o));
        if st & VALID != 0 && h.tag() == tag {
            let s = h.begin_change();
            bytes.zero(from, PAGE - from);
            h.end_change(s);
        }
        h.unlock(me, 0, 0);
    }

    /// The frame holding page `tag` if a writeback of it is in flight.
    pub(crate) fn under_writeback(&self, tag: Tag) -> Option<u32> {
        let f = self.lookup_frame(tag)?;
        let h = self.map().frame(f)?;
        (h.state() & super::frame::WRITEBACK != 0 && h.tag() == tag).then_some(f)
    }

    /// The frame holding page `tag` now, if any (no lock; a hint).
    pub(crate) fn lookup_frame(&self, tag: Tag) -> Option<u32> {
        let hash = tag.hash();
        let map = self.map();
        map.bucket(hash)
            .ways()
            .filter_map(|(_, w)| match w {
                super::index::Way::Frame(fp, f) if fp == fingerprint(hash) => Some(f),
                _ => None,
            })
            .find(|&f| map.frame(f).is_some_and(|h| h.tag() == tag))
    }

    /// Whether a frame holds page `tag` now.
    pub(crate) fn holds(&self, tag: Tag) -> bool {
        self.lookup_frame(tag)
            .and_then(|f| self.map().frame(f))
            .is_some_and(|h| h.state() & VALID != 0)
    }
}
