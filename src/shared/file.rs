//! A file in the shared cache ([`SharedFile`]): byte-range reads and
//! writes, size changes and syncs over the page paths, with the file's
//! shared state in its slot.
//!
//! Owns the file-level protocol:
//!
//! - **Open.** The file is identified (`files::identify`); a file that
//!   cannot be told from a successor is refused (the caller keeps it
//!   private). Under the file table's lock its slot is found or claimed,
//!   and what the file looks like now is compared with what members last
//!   left: if someone else changed it, the frames are retired at once (a
//!   new epoch) when no member has it open and none of its frames is dirty,
//!   and otherwise its clean frames are dropped one by one (its dirty ones
//!   are members' newer bytes).
//! - **Size.** The slot's size is the file's for every member. A write
//!   past it and a truncation take the file's lock; a write inside it takes
//!   only frame locks and checks the size again under each, so it either
//!   lands before a truncation drops its page or sees the smaller size and
//!   takes the lock. A truncation lowers the size first, drops the frames
//!   above it (waiting out writebacks in flight, so none lands after), then
//!   truncates the file.
//! - **Sync** writes back every member's dirty frames of the file and syncs
//!   this member's descriptor; the slot's error sequence reports a failed
//!   writeback to every handle once (the kernel's `errseq_t`).
//! - **Close.** The last handle of the process writes back what this
//!   member dirtied in the file and clears its bit in the openers; the
//!   region's last close of a file with no name left retires its frames
//!   (a new epoch), as the kernel frees a deleted file's pages.

use super::access::{pread_into, Dropped, Fill, Got};
use super::files::{self, find_or_claim, member_bit, w as fw, TableFull};
use super::frame::{Owner, Tag, WRITEBACK};
use super::layout::{hdr, PAGE, PAGE64};
use super::region::FileIo;
use super::region::{Region, RegionError};
use crate::sync::{Lock, Ordering};
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

/// A handle of a file in the shared cache. Clones share this process's
/// open of the file; each reports a writeback error once.
#[derive(Debug)]
pub struct SharedFile {
    region: Arc<Region>,
    io: Arc<FileIo>,
    since: Lock<u64>,
    /// Whether the descriptor was opened for writing.
    writable: bool,
}

impl Clone for SharedFile {
    fn clone(&self) -> Self {
        SharedFile {
            region: Arc::clone(&self.region),
            io: Arc::clone(&self.io),
            since: Lock::new(*self.since.lock()),
            writable: self.writable,
        }
    }
}

/// Why a file was not opened in the shared cache (the caller caches it
/// privately).
#[derive(Debug)]
pub enum NotShared {
    /// It cannot be told from a file made later at the same inode (no file
    /// handle, no birth time), or it is not a regular file.
    Unidentifiable,
    /// The file table is full of files in use.
    TableFull,
    /// This process could not take part (a child that could not join).
    Region(RegionError),
}

impl std::fmt::Display for NotShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotShared::Unidentifiable => {
                f.write_str("the file has no identity that survives its inode's reuse")
            }
            NotShared::TableFull => f.write_str("the shared cache's file table is full"),
            NotShared::Region(e) => write!(f, "{e}"),
        }
    }
}

fn pages(range: Range<u64>) -> Range<u64> {
    range.start / PAGE64..range.end.div_ceil(PAGE64)
}

impl SharedFile {
    /// Open the file `fd` (this handle's own descriptor: the cache reads,
    /// writes back and syncs through it) in `region`; `path` is recorded
    /// for a member that must write back this process's dirty pages after
    /// its death.
    ///
    /// # Errors
    /// [`NotShared`] when the file cannot be shared.
    pub fn open(region: Arc<Region>, fd: OwnedFd, path: &[u8]) -> Result<SharedFile, NotShared> {
        SharedFile::open_checked(region, fd, path, true)
    }

    /// [`open`](SharedFile::open), with the check at open (`check`) on or
    /// off. Off, the caller keeps the frames coherent with the file
    /// itself: an open takes the file's size when no member has a dirty
    /// page of it, and drops no frame because the file's times moved (the
    /// SQLite VFS compares a database's header, size and time at every
    /// lock gap instead, which no change by SQLite escapes, where a change
    /// time inside the coarse clock's tick leaves every member's commit
    /// looking like someone else's to the check).
    ///
    /// # Errors
    /// As [`open`](SharedFile::open).
    pub fn open_checked(
        region: Arc<Region>,
        fd: OwnedFd,
        path: &[u8],
        check: bool,
    ) -> Result<SharedFile, NotShared> {
        let (id, now) = files::identify(fd.as_fd()).ok_or(NotShared::Unidentifiable)?;
        // SAFETY: F_GETFL on a descriptor of ours reads its flags.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        let writable = flags >= 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        let me = region.me().map_err(NotShared::Region)?;
        let map = region.map();
        let table = map.header_u32(hdr::FILES_LOCK);
        region.lock_word(table, me);
        let claimed = find_or_claim(map, &id, now, path, super::member::now_ms());
        let claimed = match claimed {
            Ok(c) => c,
            Err(TableFull) => {
                Region::unlock_word(table);
                return Err(NotShared::TableFull);
            }
        };
        let slot = map.file(claimed.slot);
        let mut revalidate = None;
        let mut take_size = false;
        if !claimed.new && !check {
            take_size = slot.size() != now.size && slot.get(fw::DIRTY) == 0;
        } else if !claimed.new && slot.seen() != now {
            let openers = slot.get(fw::OPENERS) & !member_bit(me);
            let dirty = slot.get(fw::DIRTY);
            if openers == 0 && dirty == 0 {
                slot.bump_epoch();
                slot.set(fw::SIZE, now.size);
            } else {
                revalidate = Some(slot.seen().size.max(now.size));
                if dirty == 0 {
                    slot.set(fw::SIZE, now.size);
                } else {
                    slot.grow_to(now.size);
                }
            }
            slot.set_seen(now);
        }
        slot.words[fw::OPENERS].fetch_or(member_bit(me), Ordering::AcqRel);
        slot.set(fw::LAST_USE, u64::from(super::member::now_ms()));
        Region::unlock_word(table);
        let io = Arc::new(FileIo {
            slot: claimed.slot,
            fd: fd.into(),
            opener: Some(Arc::downgrade(&region)),
        });
        region.local.register(&io);
        let since = slot.errseq();
        let f = SharedFile {
            region,
            io,
            since: Lock::new(since),
            writable,
        };
        if let Some(end) = revalidate {
            f.drop_clean(0..end);
        }
        if take_size {
            f.take_size(now.size);
        }
        Ok(f)
    }

    /// The region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    fn slot(&self) -> &super::map::FileSlot {
        self.region.map().file(self.io.slot)
    }

    /// The file's size as members see it.
    pub fn len(&self) -> u64 {
        self.slot().size()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Read up to `buf.len()` bytes at `offset`: fewer at the end of the
    /// file, 0 past it.
    ///
    /// # Errors
    /// The file's read error for a page not cached.
    #[inline]
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_counted(buf, offset).map(|(n, _, _)| n)
    }

    /// [`read_at`](Self::read_at), also saying how many pages it read and
    /// how many of them were misses (for the page cache's statistics).
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    #[inline]
    pub fn read_counted(&self, buf: &mut [u8], offset: u64) -> io::Result<(usize, u64, u64)> {
        let slot = self.slot();
        let size = slot.size();
        if offset >= size || buf.is_empty() {
            return Ok((0, 0, 0));
        }
        let n = (size - offset).min(buf.len() as u64) as usize;
        let epoch = slot.epoch();
        let mut done = 0;
        let (mut pages, mut misses) = (0, 0);
        while done < n {
            let pos = offset + done as u64;
            let index = pos / PAGE64;
            let off = (pos % PAGE64) as usize;
            let len = (PAGE - off).min(n - done);
            let tag = Tag::new(self.io.slot, epoch, index);
            let dst = &mut buf[done..done + len];
            if !self.region.read_cached(tag, off, dst) && self.read_slow(tag, off, dst, size)? {
                misses += 1;
            }
            pages += 1;
            done += len;
        }
        Ok((n, pages, misses))
    }

    /// The page when the lock-free copy failed (no frame held it, or its
    /// frame was changing): `true` when its bytes came from the file (a
    /// miss), `false` when a frame held it after all (a hit).
    #[cold]
    fn read_slow(&self, tag: Tag, off: usize, dst: &mut [u8], size: u64) -> io::Result<bool> {
        let me = match self.region.me() {
            Ok(me) => me,
            Err(_) => return self.read_file(tag, off, dst).map(|()| true),
        };
        match self
            .region
            .get_locked(tag, me, Fill::Read, self.io.fd.as_fd(), size)?
        {
            Got::Frame(l) => {
                let filled = l.filled;
                self.region.read_locked(l, me, off, dst);
                Ok(filled)
            }
            Got::Uncached => self.read_file(tag, off, dst).map(|()| true),
        }
    }

    /// Read bytes of a page the region does not hold from the file.
    fn read_file(&self, tag: Tag, off: usize, dst: &mut [u8]) -> io::Result<()> {
        let pos = tag.index * PAGE64 + off as u64;
        // SAFETY: `dst` is a unique borrow of the caller's buffer.
        let n = unsafe { pread_into(self.io.fd.as_fd(), dst.as_mut_ptr(), dst.len(), pos)? };
        dst[n..].fill(0);
        Ok(())
    }

    /// Write `buf` at `offset`, growing the file if it ends past its size.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] if the end overflows; the file's
    /// read error for a partly written page not cached; the file's write
    /// error when the region has no room and the write goes through.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        if buf.is_empty() {
            return Ok(0);
        }
        self.check_writable()?;
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let slot = self.slot();
        if end <= slot.size() && self.write_pages(me, buf, offset, false)? {
            return Ok(buf.len());
        }
        let lw = slot.lock_word();
        self.region.lock_word(lw, me);
        let r = self.write_pages(me, buf, offset, true);
        if r.is_ok() {
            slot.grow_to(end);
        }
        Region::unlock_word(lw);
        r.map(|_| buf.len())
    }

    /// Write the pages of `buf` at `offset`; `false` if a write inside the
    /// file found it shrunk under a frame lock (the caller retries holding
    /// the file's lock; pages already written stay, as a write racing a
    /// truncation may leave them).
    fn write_pages(&self, me: Owner, buf: &[u8], offset: u64, locked: bool) -> io::Result<bool> {
        let slot = self.slot();
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let index = pos / PAGE64;
            let off = (pos % PAGE64) as usize;
            let len = (PAGE - off).min(buf.len() - done);
            let src = &buf[done..done + len];
            let epoch = slot.epoch();
            let tag = Tag::new(self.io.slot, epoch, index);
            let size = slot.size();
            let fill = if off == 0 && len == PAGE {
                Fill::Overwrite
            } else if index * PAGE64 >= size {
                Fill::Zero
            } else {
                Fill::Read
            };
            // Without room on the dirty list the page is written through
            // (the frame, if any, kept clean and the file's).
            let reserved = self.region.reserve_dirty(me);
            let got = self
                .region
                .get_locked(tag, me, fill, self.io.fd.as_fd(), size);
            match got {
                Ok(Got::Frame(l)) => {
                    if !locked && pos + len as u64 > slot.size() {
                        // shrunk under us: give the frame back untouched
                        if let Some(s) = l.open {
                            self.region.abandon(l.frame, me, tag, s);
                        } else if let Some(h) = self.region.map().frame(l.frame) {
                            h.unlock(me, 0, 0);
                        }
                        if reserved {
                            self.region.unreserve_dirty();
                        }
                        return Ok(false);
                    }
                    if let (Some(s), true) = (l.open, len < PAGE) {
                        // an overwrite claim only for whole pages
                        debug_assert!(false, "partial overwrite {s}");
                    }
                    if reserved {
                        self.region.write_locked(l, me, tag, off, src);
                    } else {
                        self.region
                            .write_locked_through(l, me, tag, off, src, &self.io.fd)?;
                    }
                }
                Ok(Got::Uncached) => {
                    if reserved {
                        self.region.unreserve_dirty();
                    }
                    if !self.region.write_uncached(tag, me, src, pos, &self.io.fd)? {
                        continue; // a frame holds the page now: through it
                    }
                }
                Err(e) => {
                    if reserved {
                        self.region.unreserve_dirty();
                    }
                    return Err(e);
                }
            }
            done += len;
        }
        Ok(true)
    }

    /// Set the file's length: a shorter one drops every frame above it
    /// (dirty bytes there are discarded) and zeroes the tail of the last
    /// page; a longer one reads as zeros.
    ///
    /// # Errors
    /// The file's `ftruncate` error.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.check_writable()?;
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let slot = self.slot();
        let lw = slot.lock_word();
        self.region.lock_word(lw, me);
        let old = slot.size();
        let r = (|| {
            if len < old {
                slot.set(fw::TRUNCATING, old);
                slot.set(fw::SIZE, len);
                let epoch = slot.epoch();
                for index in len.div_ceil(PAGE64)..old.div_ceil(PAGE64) {
                    self.drop_waiting(Tag::new(self.io.slot, epoch, index), me);
                }
                if !len.is_multiple_of(PAGE64) {
                    self.region.zero_tail(
                        Tag::new(self.io.slot, epoch, len / PAGE64),
                        me,
                        (len % PAGE64) as usize,
                    );
                }
            }
            // SAFETY: a descriptor of ours.
            if unsafe { libc::ftruncate(self.io.fd.as_raw_fd(), len as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if len >= old {
                slot.set(fw::SIZE, len);
            }
            slot.set(fw::TRUNCATING, 0);
            if let Some(s) = files::look(self.io.fd.as_fd()) {
                slot.set_seen(s);
            }
            Ok(())
        })();
        Region::unlock_word(lw);
        r
    }

    /// Drop page `tag`, waiting for a writeback in flight first.
    fn drop_waiting(&self, tag: Tag, me: Owner) {
        for _ in 0..100_000 {
            match self.region.under_writeback(tag) {
                Some(f) => {
                    if let Some(h) = self.region.map().frame(f) {
                        let st = h.state();
                        if st & WRITEBACK != 0 {
                            self.region.wait_writeback_end(h, st, me);
                        }
                    }
                }
                None => break,
            }
        }
        self.region.drop_page(tag, me);
    }

    /// Drop the clean frames of pages `pages`: how many, and whether a dirty
    /// one stayed.
    fn drop_clean(&self, pages: Range<u64>) -> (u64, bool) {
        let Ok(me) = self.region.me() else {
            return (0, false);
        };
        let epoch = self.slot().epoch();
        let mut n = 0;
        let mut dirty = false;
        for i in pages {
            match self
                .region
                .drop_clean_page(Tag::new(self.io.slot, epoch, i), me)
            {
                Dropped::Yes => n += 1,
                Dropped::Dirty => dirty = true,
                Dropped::Absent => {}
            }
        }
        (n, dirty)
    }

    /// Forget the clean cached pages holding any byte of `range` (the file
    /// changed under the cache there), after any fill in flight: the next
    /// reads read the file. How many pages were dropped.
    ///
    /// # Errors
    /// [`io::ErrorKind::ResourceBusy`] when a page of the range is dirty or
    /// being written back (newer than the file: it stays).
    pub fn revalidate_range(&self, range: Range<u64>) -> io::Result<u64> {
        let (n, dirty) = self.drop_clean(pages(range));
        if dirty {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "a page of the range is dirty in the shared cache",
            ));
        }
        Ok(n)
    }

    /// Drop the clean cached pages lying wholly inside `range`; dirty ones
    /// stay. How many.
    pub fn invalidate(&self, range: Range<u64>) -> u64 {
        let first = range.start.div_ceil(PAGE64);
        let last = range.end / PAGE64;
        if last <= first {
            return 0;
        }
        self.drop_clean(first..last).0
    }

    /// Forget every clean cached page of the file and take its size from
    /// the file when no member has dirty pages of it.
    ///
    /// # Errors
    /// The file's `fstat` error.
    pub fn revalidate(&self) -> io::Result<u64> {
        let now = files::look(self.io.fd.as_fd()).ok_or_else(io::Error::last_os_error)?;
        let slot = self.slot();
        let (n, _) = self.drop_clean(pages(0..slot.size().max(now.size)));
        self.take_size(now.size);
        slot.set_seen(now);
        Ok(n)
    }

    /// Take the file's size as it is now (another process grew or shrank
    /// it); the new size.
    ///
    /// # Errors
    /// The file's `fstat` error.
    pub fn refresh_len(&self) -> io::Result<u64> {
        let now = files::look(self.io.fd.as_fd()).ok_or_else(io::Error::last_os_error)?;
        self.take_size(now.size);
        Ok(self.len())
    }

    /// Take `size` as the file's (when no member has dirty pages of it):
    /// the pages past a shorter end are dropped, and so is the page holding
    /// the lower of the two ends, as the private cache's `refresh_len` does:
    /// past that end it holds the bytes from before a cut, or zeros read
    /// past the old end, where the file may hold others now.
    fn take_size(&self, size: u64) {
        let slot = self.slot();
        if slot.get(fw::DIRTY) == 0 {
            let old = slot.size();
            slot.set(fw::SIZE, size);
            if size != old {
                if let Ok(me) = self.region.me() {
                    let epoch = slot.epoch();
                    let low = size.min(old);
                    if !low.is_multiple_of(PAGE64) {
                        self.region
                            .drop_clean_page(Tag::new(self.io.slot, epoch, low / PAGE64), me);
                    }
                    for index in size.div_ceil(PAGE64)..old.div_ceil(PAGE64) {
                        self.region
                            .drop_page(Tag::new(self.io.slot, epoch, index), me);
                    }
                }
            }
        } else {
            slot.grow_to(size);
        }
    }

    /// Write back every member's dirty pages of the file overlapping
    /// `range`, without syncing the file.
    ///
    /// # Errors
    /// A writeback error not reported to this handle before.
    pub fn write_back(&self, range: Range<u64>) -> io::Result<()> {
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let p = pages(range);
        let (dirty, _) = self.region.dirty_of(self.io.slot);
        let mut list: Vec<(u64, u32)> = dirty
            .iter()
            .filter_map(|&f| self.region.map().frame(f).map(|h| (h.tag().index, f)))
            .filter(|(i, _)| p.contains(i))
            .collect();
        list.sort_unstable();
        let r = self.region.write_back_file(me, &self.io, &list);
        self.region.compact_own(me);
        self.check_errseq().and(r)
    }

    /// [`write_back`](Self::write_back) then `fsync`.
    ///
    /// # Errors
    /// As [`sync`](Self::sync).
    pub fn sync_range(&self, range: Range<u64>) -> io::Result<()> {
        self.write_back(range)?;
        // SAFETY: a descriptor of ours.
        if unsafe { libc::fsync(self.io.fd.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the file was opened read-only",
            ))
        }
    }

    fn check_errseq(&self) -> io::Result<()> {
        let now = self.slot().errseq();
        let mut since = self.since.lock();
        if now != *since {
            *since = now;
            let errno = (now & 0xffff) as i32;
            return Err(io::Error::from_raw_os_error(if errno == 0 {
                libc::EIO
            } else {
                errno
            }));
        }
        Ok(())
    }

    /// Write back every member's dirty pages of the file and sync it
    /// (`fsync`).
    ///
    /// # Errors
    /// A writeback error not reported to this handle before, or the sync's.
    pub fn sync(&self) -> io::Result<()> {
        self.sync_as(false)
    }

    /// As [`sync`](Self::sync) with `fdatasync`.
    ///
    /// # Errors
    /// As [`sync`](Self::sync).
    pub fn sync_data(&self) -> io::Result<()> {
        self.sync_as(true)
    }

    fn sync_as(&self, data: bool) -> io::Result<()> {
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let r = self.region.sync_file(me, &self.io, data);
        if r.is_ok() && self.region.drop_behind() {
            // clean now: the kernel's copy goes (see `set_drop_behind`)
            super::access::drop_kernel_copy(self.io.fd.as_fd(), PAGE64, 0);
        }
        if let Some(s) = files::look(self.io.fd.as_fd()) {
            self.slot().set_seen(s);
        }
        self.check_errseq().and(r)
    }

    /// Pages of the file the region holds now (a probe of each page up to
    /// the size: O(pages)).
    pub fn cached_pages(&self) -> u64 {
        let slot = self.slot();
        let epoch = slot.epoch();
        (0..slot.size().div_ceil(PAGE64))
            .filter(|&i| self.region.holds(Tag::new(self.io.slot, epoch, i)))
            .count() as u64
    }

    /// The file slot (for tests and statistics).
    pub fn slot_index(&self) -> usize {
        self.io.slot
    }

    /// Mark this member the file's writer: until
    /// [`clear_writer`](SharedFile::clear_writer), the changes it makes
    /// through the cache are not final, and if it dies (or leaves) with
    /// the mark, whoever recovers it retires every frame of the file
    /// before any member trusts one again (dirty ones discarded, never
    /// written back). A database's writer marks itself before its first
    /// write of a transaction and clears the mark once the transaction is
    /// final in the file, so a transaction rolled back after its writer's
    /// death, by a member or by a process outside the region writing the
    /// file directly, leaves no frame holding its pages.
    ///
    /// The caller holds the right to change the file by a protocol of its
    /// own (SQLite's write locks): a mark a dead member left is recovered
    /// first ([`check_writer`](SharedFile::check_writer)), and one a live
    /// member left is taken over (that member's change is final by then,
    /// or the caller could not hold the right).
    ///
    /// # Errors
    /// The region's error when this process is not a member.
    pub fn mark_writer(&self) -> io::Result<()> {
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let mine = u64::from(me.bits());
        let word = &self.slot().words[fw::WRITER];
        loop {
            let cur = word.load(Ordering::Acquire);
            if cur == mine {
                return Ok(());
            }
            if cur != 0 {
                // a dead writer's frames go before this one's change
                self.check_writer()?;
            }
            let cur = word.load(Ordering::Acquire);
            let dead = Owner::from_bits(cur as u32).is_some_and(|o| !self.region.alive(o));
            if !dead
                && word
                    .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // Other members write back none of the file's frames from
                // now on; one that looked at the mark before it was set
                // has its run flagged by now, and is waited out here (with
                // any frame still dirty from before, written back as this
                // writer's). A file with no dirty frame has none in flight
                // (a writeback's count goes at its end): one load.
                crate::sync::fence(Ordering::SeqCst);
                if self.slot().get(fw::DIRTY) != 0 {
                    // A write error stays in the frames (`ERROR`) and the
                    // file's error sequence, where a sync reports it.
                    let _ = self.region.settle_file(me, &self.io);
                }
                return Ok(());
            }
        }
    }

    /// Clear this member's writer mark (its changes are final in the
    /// file); nothing when it holds none.
    pub fn clear_writer(&self) {
        if let Ok(me) = self.region.me() {
            let _ = self.slot().words[fw::WRITER].compare_exchange(
                u64::from(me.bits()),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Whether another live member holds the file's writer mark (a
    /// change of its own under way through the frames).
    pub fn writer_elsewhere(&self) -> bool {
        let Ok(me) = self.region.me() else {
            return false;
        };
        self.slot()
            .writer()
            .is_some_and(|o| o != me && self.region.alive(o))
    }

    /// Whether this member holds the file's writer mark.
    pub fn is_writer(&self) -> bool {
        self.region
            .me()
            .is_ok_and(|me| self.slot().writer() == Some(me))
    }

    /// Look at the file's writer mark (one load when there is none): a
    /// mark left by a dead member is recovered (that member's whole
    /// recovery, which retires every frame of the file) before this
    /// returns. Returns `true` when no other live member holds the mark.
    ///
    /// # Errors
    /// The region's error when this process is not a member.
    #[inline]
    pub fn check_writer(&self) -> io::Result<bool> {
        let Some(o) = self.slot().writer() else {
            return Ok(true);
        };
        self.check_writer_slow(o)
    }

    #[cold]
    fn check_writer_slow(&self, mut o: Owner) -> io::Result<bool> {
        let me = self
            .region
            .me()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let mut b = super::wait::Backoff::new();
        loop {
            if o == me {
                return Ok(true);
            }
            if self.region.alive(o) {
                return Ok(false);
            }
            // Dead: recover it (or wait for whoever does).
            self.region.stuck(o);
            match self.slot().writer() {
                None => return Ok(true),
                Some(now) => o = now,
            }
            if !b.spin() {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }

    /// Stamp word `i` (`i` < 2) of the file: two words the file's members
    /// keep for a protocol of their own (0 when the slot was claimed). The
    /// SQLite VFS keeps in them what its members know the frames to be
    /// current with: the database's signature, and its WAL index's state.
    ///
    /// # Panics
    /// When `i` is 2 or more.
    #[inline]
    pub fn stamp(&self, i: usize) -> u64 {
        assert!(i < files::STAMPS, "a file has {} stamps", files::STAMPS);
        self.slot().get(fw::STAMP + i)
    }

    /// Set stamp word `i` (`i` < 2). A stamp that already holds `v` is
    /// left alone: members that find the file as it was write nothing to
    /// the slot every other member reads.
    ///
    /// # Panics
    /// When `i` is 2 or more.
    #[inline]
    pub fn set_stamp(&self, i: usize, v: u64) {
        assert!(i < files::STAMPS, "a file has {} stamps", files::STAMPS);
        if self.slot().get(fw::STAMP + i) != v {
            self.slot().set(fw::STAMP + i, v);
        }
    }

    /// Retire every cached page of the file at once (a new epoch) when no
    /// member has a dirty page of it, else drop its clean pages one by
    /// one; then take its size from the file. How many pages were dropped
    /// (the retired ones are not counted).
    ///
    /// # Errors
    /// The file's `fstat` error.
    pub fn retire(&self) -> io::Result<u64> {
        let slot = self.slot();
        if slot.get(fw::DIRTY) == 0 {
            let now = files::look(self.io.fd.as_fd()).ok_or_else(io::Error::last_os_error)?;
            slot.bump_epoch();
            self.take_size(now.size);
            slot.set_seen(now);
            return Ok(0);
        }
        self.revalidate()
    }
}
