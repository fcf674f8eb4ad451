//! Whether the pages a process cached of a database still hold what the
//! file holds, while other processes write it: [`Coherence`], one per
//! database inode.
//!
//! A cached page is trusted only while the process knows no other process
//! changed it. Two moments decide:
//! - **a lock gap** (rollback journal, and any mode's first lock): when
//!   the process goes from no lock to SHARED, [`Coherence::after_gap`]
//!   reads the header's change counter (offset 24) and version-valid-for
//!   (92), the file's size and its modification time from the file itself
//!   (`pread`, `fstat`: never the cache), and drops every cached page of
//!   the file when any of them differs from what the process recorded when
//!   it last held a lock ([`Coherence::after_write`] records the file as a
//!   writer leaves it). A hot journal rolled back by another process
//!   rewrites the file, which moves its modification time;
//! - **a hold's end** (a handle leaves EXCLUSIVE, [`Coherence::after_write`]):
//!   the file is taken as this process's own only when what changed is
//!   what this process wrote. [`Coherence::hold_start`] records the file
//!   when EXCLUSIVE is granted (the signature of the last gap, unless the
//!   WAL index is mapped: WAL checkpoints of other processes write the
//!   file under SHARED); at the end, a hold that wrote nothing must find
//!   the file exactly so, and one that wrote must find the header bytes
//!   it wrote last ([`Coherence::wrote_header`]; its start's when it wrote
//!   no page 1) and the length its cache has. Anything else (the file
//!   rewritten under the lock by plain I/O: a backup restored under a
//!   superlock, a test's file I/O) makes the state unknown, and the next
//!   gap drops every cached page, as SQLite's own pager drops its cache
//!   when the header moved;
//! - **a WAL read transaction**: in WAL mode the database file changes only
//!   when a checkpoint copies frames back. At a read transaction's first
//!   read of the database (and when this process takes the checkpoint
//!   lock or restarts the WAL), [`Coherence::wal_check`] reads the WAL
//!   index this process maps: the
//!   salts of both header copies and `nBackfill`. Same salts and
//!   `nBackfill` grown from `b0` to `b1`: the pages of frames `b0+1..=b1`,
//!   read from the index's page-number arrays, are dropped, nothing else
//!   (a one-row commit elsewhere costs the pages it changed). Same salts
//!   and same `nBackfill`: nothing to do, no system call. New salts (the
//!   WAL restarted once since): the old generation's frames copied since
//!   are its frames `nBackfill+1..=mxFrame` as last seen, whose page
//!   numbers each check records from the index (`Coherence::known`), and
//!   the frames of its commits since, still in the WAL file past the new
//!   generation's (read from their headers, which must carry the old
//!   salts, chain by checksum from the last frame seen, and number as
//!   many commits as `iChange` says); those pages go, and the new
//!   generation's copied frames as above (`old_generation_pages`).
//!   Anything else (two restarts, an old frame overwritten, `nBackfill`
//!   went back: the index was rebuilt; a page-number region this process
//!   cannot map): every cached page of the database is dropped. So is
//!   every page after this process takes the recovery lock (it rebuilds
//!   the index from the WAL file: a superlock's holder may have replaced
//!   the database and its WAL, and SQLite's own pager drops its cache
//!   after a recovery too). A checkpoint that grew or cut the
//!   file also costs the pages from the lower end on
//!   (`CachedFile::refresh_len`).
//!   The read transaction's check waits for its first read of the
//!   database (`Inode::recheck_wal`), not its read lock: SQLite loads
//!   `nBackfill`, below which it reads pages from the database file
//!   instead of the WAL, after it took the lock, and a checkpoint by
//!   another process may end in between (the lock keeps only frames past
//!   the reader's mark from being copied; slot 0 keeps every checkpoint
//!   from copying); and a transaction that reads nothing from the file (a
//!   commit whose pages SQLite's cache holds) needs none. A dropped page
//!   leaves the cache alone (a large folio holding it is split), one
//!   whose read is in flight too, once that read has landed
//!   (`CachedFile::revalidate_range`): the read may have fetched the
//!   bytes from before the checkpoint.
//!   Frames copied by this process's own checkpoint (between taking and
//!   releasing the checkpoint lock, which keeps every other checkpointer
//!   out) were written through this cache and are recorded without a drop,
//!   and so is this process's own WAL restart (under the WAL write lock and
//!   exclusive read locks 1-4, which keep every other writer and
//!   checkpointer out).
//!
//! Invariants:
//! - `sig` is the file as this process last saw it under a lock, or
//!   `None` (unknown: the next gap drops everything); a hold's end records
//!   it only when every change since the hold started is this process's
//!   own (see above), never merely what the file holds then;
//! - `wal`, when `Some`, is a WAL-index state such that every cached page
//!   of the database holds the file's bytes as of a moment when the index
//!   showed that state or later; `None` after every lock gap (the next WAL
//!   check drops everything);
//! - `known[i]` is the page number of frame `i+1` of the WAL generation
//!   `known_salts`, read from the index while that generation was current;
//! - the WAL itself and the rollback journal are not cached in shared
//!   mode (`Inode::uncached`), so a restarted WAL or a new journal cannot
//!   be served stale, and nothing is read ahead past the WAL's last valid
//!   frame; the one exception is a connection under `PRAGMA
//!   locking_mode=EXCLUSIVE` while it holds the EXCLUSIVE lock (`hold`,
//!   `heldio`: no other process can write them then, the cache is made
//!   current at the hold's first operation, and every write reaches the
//!   file before `xWrite` returns).

use crate::sqlite::ffi::{SQLITE_SHM_EXCLUSIVE, SQLITE_SHM_LOCK};
use crate::sqlite::process::vfs_stats;
pub(crate) use crate::wal::filesig::Header;
use crate::wal::filesig::Sig;
use crate::wal::shm::Shm;
use crate::wal::walframes::{commits_in, frame_checksum_ok, frame_header, frame_salts, open_wal};
use crate::wal::walindex::{frame_pgno, frames_readable, page_size, read_seen, WalSeen};
use kxarray::pagecache::CachedFile;
use std::fs::File;
use std::io;
use std::os::raw::c_int;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};

/// What the checks need of a database (its `Inode`'s parts).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Db<'a> {
    /// A descriptor of the file (read with `pread` and `fstat`).
    pub(crate) fd: &'a File,
    /// Its cached pages.
    pub(crate) file: &'a CachedFile,
    /// Its name (for messages, and the WAL's name).
    pub(crate) path: &'a Path,
}

/// The shared file's stamp holding the signature its frames are current
/// with (see the module notes).
const SIG_STAMP: usize = 0;
/// The shared file's stamp holding the WAL-index state (salts and
/// `nBackfill`) its frames are current with.
const WAL_STAMP: usize = 1;

/// A WAL-index state as a stamp word (never 0).
fn wal_stamp(w: &WalSeen) -> u64 {
    let mut h = crate::wal::filesig::Mix::new();
    h.word(u64::from(w.salts[0]) << 32 | u64::from(w.salts[1]));
    h.word(u64::from(w.backfill));
    h.finish()
}

/// The most old-generation frames [`old_generation_pages`] reads.
const MAX_OLD_FRAMES: u32 = 1 << 16;

/// The database pages of the old WAL generation's frames that a
/// checkpoint may have copied since `seen`, when the WAL restarted once
/// since (`now`: new salts; `known`: the page numbers of the old
/// generation's frames from 1, recorded at the checks); `None` when they
/// cannot all be told.
///
/// They are frames `seen.backfill+1..=seen.mx` (from `known`) and the
/// frames of the old generation's commits since `seen`, `seen.mx+1..=end`,
/// read from their headers in the WAL file past the new generation's. Its
/// commits since `seen` are the index's new commits (`iChange`) less the
/// new generation's own (counted in its frames); `end` is the frame where
/// its commit frames past `seen.mx` reach that number, and must not be
/// followed by a whole old frame other than its padding. Every frame read
/// must carry the old salts. The new generation writes its frames in order
/// from frame 1, so frame `seen.mx+1` is overwritten before any later one:
/// its checksum, continuing from frame `seen.mx`'s, and the same header
/// read again after the others show that none of them was overwritten
/// while read. Padding frames (a commit's last page repeated up to a
/// sector) would be counted as commits: a commit frame right after a
/// commit frame of the same page and size gives up. Empty when nothing of
/// the old generation was copied since `seen`.
fn old_generation_pages(
    inode: &Db<'_>,
    shm: &Shm,
    seen: &WalSeen,
    now: &WalSeen,
    known: Option<&[u32]>,
) -> Option<Vec<u32>> {
    let page = page_size(shm)?;
    let commits_new = commits_in(inode.path, now.salts, now.mx, page)?;
    let old_commits = now
        .change
        .wrapping_sub(seen.change)
        .checked_sub(commits_new)?;
    if old_commits == 0 && seen.backfill == seen.mx {
        fence(Ordering::Acquire);
        return read_seen(shm)
            .is_some_and(|again| again.salts == now.salts)
            .then(Vec::new);
    }
    // exactly one restart since `seen` (`walRestartHdr` adds one to the
    // first salt, big-endian), and a frame before the first to chain from
    let first_salt = |s: [u32; 2]| u32::from_be_bytes(s[0].to_ne_bytes());
    if first_salt(now.salts) != first_salt(seen.salts).wrapping_add(1)
        || old_commits > MAX_OLD_FRAMES
    {
        return None;
    }
    // frames `seen.backfill+1..=seen.mx`: recorded at the checks
    let mut pages = known?
        .get(seen.backfill as usize..seen.mx as usize)?
        .to_vec();
    if old_commits == 0 {
        fence(Ordering::Acquire);
        return read_seen(shm)
            .is_some_and(|again| again.salts == now.salts)
            .then_some(pages);
    }
    if seen.mx == 0 {
        return None;
    }
    let big = shm.word(0, 3)?.to_ne_bytes()[1] != 0;
    let wal = open_wal(inode.path)?;
    // frames `seen.mx+1..=end`: from the WAL file
    let start = seen.mx;
    let base = frame_header(&wal, start, page)?;
    let first = frame_header(&wal, start + 1, page)?;
    if frame_salts(&base) != seen.salts
        || frame_salts(&first) != seen.salts
        || !frame_checksum_ok(&wal, start + 1, page, &base, &first, big)
    {
        return None;
    }
    let (mut f, mut h, mut prev) = (start + 1, first, base);
    let mut counted = 0;
    loop {
        let pgno = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        if frame_salts(&h) != seen.salts || pgno == 0 {
            return None;
        }
        pages.push(pgno);
        let commit = h[4..8] != [0; 4];
        if f > seen.mx && commit {
            if f - 1 > seen.mx && prev[..8] == h[..8] {
                return None; // padding, or a commit of the same page: cannot tell
            }
            counted += 1;
        }
        if f >= seen.mx && counted == old_commits {
            break;
        }
        if f - start >= MAX_OLD_FRAMES {
            return None;
        }
        f += 1;
        prev = h;
        h = frame_header(&wal, f, page)?;
    }
    // A whole old frame right after `end` that is not its padding: the
    // count may be short (an index rebuilt by recovery restarts
    // `iChange`), so it cannot tell where the generation ended.
    if let Some(next) = frame_header(&wal, f + 1, page) {
        if frame_salts(&next) == seen.salts
            && next[..8] != h[..8]
            && frame_checksum_ok(&wal, f + 1, page, &h, &next, big)
        {
            return None;
        }
    }
    fence(Ordering::Acquire);
    (frame_header(&wal, start + 1, page)? == first
        && read_seen(shm).is_some_and(|again| again.salts == now.salts))
    .then_some(pages)
}

/// The coherence state of one database's cache (see the module notes).
#[derive(Debug, Default)]
pub(crate) struct Coherence {
    sig: Option<Sig>,
    /// The header bytes this process last wrote to the file since `sig`
    /// was recorded (a write of page 1), for the hold's end.
    wrote_header: Option<Header>,
    wal: Option<WalSeen>,
    /// This process holds the checkpoint lock (after its check).
    own_ckpt: bool,
    /// This process holds the exclusive read locks 1-4 of a WAL restart;
    /// the state it checked when it took them.
    restart_from: Option<WalSeen>,
    /// The page numbers of frames `1..=len` of WAL generation
    /// `known_salts`, from the index at the checks (a restart erases them).
    known: Vec<u32>,
    known_salts: [u32; 2],
    /// This process took the recovery lock since its last check: the next
    /// one drops every page whatever the shared cache's stamp says (the
    /// index was rebuilt; a superlock's holder may have replaced the file).
    recovered: bool,
}

/// Drop every cached page of the database and take its length again; a
/// dirty page (this process's own, newer than the file) is written back
/// first.
fn drop_all(inode: &Db<'_>) -> Result<(), String> {
    // (the shared cache's pages are retired at once, not counted)
    let count = || {
        if inode.file.is_shared() {
            0
        } else {
            inode.file.cached_pages()
        }
    };
    let before = count();
    let r = match inode.file.shared_file() {
        // every frame of the file retired at once, for every member
        Some(f) => f.retire().map(drop),
        None => inode.file.revalidate(),
    };
    let r = match r {
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => inode
            .file
            .write_back(0..u64::MAX)
            .and_then(|()| inode.file.revalidate()),
        r => r,
    };
    let v = vfs_stats();
    v.coherence_full_drops.fetch_add(1, Ordering::Relaxed);
    v.coherence_pages_dropped
        .fetch_add(before.saturating_sub(count()), Ordering::Relaxed);
    r.map_err(|e| {
        format!(
            "kxarray: dropping the cache of {} (another process changed it): {e}",
            inode.path.display()
        )
    })
}

/// Drop the cached bytes of database pages `pages` (1-based, of `size`
/// bytes), which a checkpoint by another process copied into the file: the
/// pages alone (a large folio holding one is split, its other pages stay).
/// Returns the pages dropped.
///
/// # Errors
/// The write-back error of a dirty folio in the way.
fn drop_pages(file: &CachedFile, pages: &mut Vec<u32>, size: u64) -> io::Result<u64> {
    pages.sort_unstable();
    pages.dedup();
    let mut dropped = 0;
    let mut i = 0;
    while i < pages.len() {
        // a run of adjacent pages at a time
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 {
            j += 1;
        }
        let range = (u64::from(pages[i]) - 1) * size..u64::from(pages[j - 1]) * size;
        // Every folio holding a byte of the run, those whose read is in
        // flight too (waited for: the read may predate the checkpoint's
        // write, and must not land after this drop).
        dropped += match file.revalidate_range(range.clone()) {
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                file.write_back(range.clone())?;
                file.revalidate_range(range)?
            }
            r => r?,
        };
        i = j;
    }
    Ok(dropped)
}

impl Coherence {
    /// Forget what the cache knew (a check unwound half-way): the next
    /// check drops everything.
    pub(crate) fn forget(&mut self) {
        self.sig = None;
        self.wal = None;
        self.own_ckpt = false;
        self.restart_from = None;
        self.known.clear();
    }

    /// The process took SHARED from no lock (see the module notes).
    ///
    /// # Errors
    /// A message when the file cannot be read or the cache not dropped.
    pub(crate) fn after_gap(&mut self, inode: &Db<'_>) -> Result<(), String> {
        vfs_stats().coherence_checks.fetch_add(1, Ordering::Relaxed);
        self.wal = None;
        let now = Sig::read(inode.fd).map_err(|e| {
            format!(
                "kxarray: reading the header of {}: {e}",
                inode.path.display()
            )
        });
        let now = match now {
            Ok(n) => n,
            Err(e) => {
                self.sig = None;
                return Err(e);
            }
        };
        self.wrote_header = None;
        if self.sig != Some(now) {
            self.sig = None;
            let stamp = now.stamp();
            match inode.file.shared_file() {
                // The frames are current with the file as it is now (the
                // last change was a member's, or a member dropped them
                // after someone else's): nothing to drop.
                Some(f) if f.stamp(SIG_STAMP) == stamp => {
                    vfs_stats()
                        .coherence_member_skips
                        .fetch_add(1, Ordering::Relaxed);
                }
                Some(f) => {
                    drop_all(inode)?;
                    f.set_stamp(SIG_STAMP, stamp);
                }
                None => drop_all(inode)?,
            }
        }
        self.sig = Some(now);
        Ok(())
    }

    /// A handle of this process was granted EXCLUSIVE: the file as the
    /// hold starts. The last gap's signature still says it unless another
    /// process may have written since (`wal_index`: a WAL index is mapped,
    /// and other processes' checkpoints write the file under SHARED), or
    /// it is unknown; then it is read again (no other process holds a lock
    /// now). Returns whether it was read (the caller forgets its record of
    /// this process's writes with it).
    pub(crate) fn hold_start(&mut self, inode: &Db<'_>, wal_index: bool) -> bool {
        if self.sig.is_some() && !wal_index {
            return false;
        }
        self.sig = Sig::read(inode.fd).ok();
        self.wrote_header = None;
        true
    }

    /// This process wrote the header bytes `h` to the file (a write of
    /// page 1).
    pub(crate) fn wrote_header(&mut self, h: Header) {
        self.wrote_header = Some(h);
    }

    /// A handle of this process leaves EXCLUSIVE (its writes are in the
    /// file by now; `wrote`: whether this process wrote, truncated or grew
    /// the file since the hold started): record the file as it is only if
    /// what changed since the hold's start is what this process wrote (see
    /// the module notes); else the state is unknown and the next gap drops
    /// every cached page.
    pub(crate) fn after_write(&mut self, inode: &Db<'_>, wrote: bool) {
        let start = self.sig.take();
        let header = self.wrote_header.take();
        let Ok(now) = Sig::read(inode.fd) else {
            return;
        };
        let ours = match start {
            None => false,
            Some(start) if !wrote => now == start,
            Some(start) => {
                now.header == header.unwrap_or(start.header) && now.len == inode.file.len()
            }
        };
        if ours {
            self.sig = Some(now);
            // Every change was this member's, through the frames.
            if let Some(f) = inode.file.shared_file() {
                f.set_stamp(SIG_STAMP, now.stamp());
            }
        }
    }

    /// The WAL check at a read lock, at the checkpoint lock and at a WAL
    /// restart's locks (see the module notes). A dropped page takes the
    /// whole folio holding it.
    ///
    /// # Errors
    /// A message when the cache could not be dropped (the state is then
    /// unknown, and the next check drops everything).
    pub(crate) fn wal_check(&mut self, inode: &Db<'_>, shm: &Shm) -> Result<(), String> {
        let r = self.wal_check_inner(inode, shm);
        if let (Ok(()), Some(f), Some(w)) = (&r, inode.file.shared_file(), self.wal) {
            // The frames are current with the index's state now.
            f.set_stamp(WAL_STAMP, wal_stamp(&w));
        }
        self.record(shm);
        r
    }

    /// Record the page numbers of the cache's WAL generation's frames up to
    /// its `mxFrame` from the index, for [`old_generation_pages`].
    fn record(&mut self, shm: &Shm) {
        let Some(w) = self.wal else {
            self.known.clear();
            return;
        };
        if self.known_salts != w.salts || w.mx < self.known.len() as u32 {
            self.known.clear();
            self.known_salts = w.salts;
        }
        if w.mx > MAX_OLD_FRAMES
            || !frames_readable(self.known.len() as u32 + 1, w.mx, shm.mapped())
        {
            self.known.clear();
            return;
        }
        for f in self.known.len() as u32 + 1..=w.mx {
            match frame_pgno(shm, f) {
                Some(p) if p > 0 => self.known.push(p),
                _ => {
                    self.known.clear();
                    return;
                }
            }
        }
        // read before the salts again: a restart writes its salts before
        // any new frame's page number
        fence(Ordering::Acquire);
        if read_seen(shm).is_none_or(|again| again.salts != w.salts) {
            self.known.clear();
        }
    }

    fn wal_check_inner(&mut self, inode: &Db<'_>, shm: &Shm) -> Result<(), String> {
        vfs_stats().coherence_checks.fetch_add(1, Ordering::Relaxed);
        let now = read_seen(shm);
        if let (Some(now), Some(f), false) = (
            now,
            inode.file.shared_file(),
            std::mem::take(&mut self.recovered),
        ) {
            if f.stamp(WAL_STAMP) == wal_stamp(&now) {
                // A member left the frames current with this state.
                if !self.wal.is_some_and(|s| s.same_file(&now)) {
                    vfs_stats()
                        .coherence_member_skips
                        .fetch_add(1, Ordering::Relaxed);
                }
                self.wal = Some(now);
                return Ok(());
            }
        }
        let (Some(mut seen), Some(now)) = (self.wal, now) else {
            return self.full(inode, now);
        };
        if let Some(f) = inode.file.shared_file() {
            // A member's checkpoint under way, past its `nBackfill` store
            // and before it records the state: the pages it copied went
            // through the frames (the checks before it dropped what other
            // processes changed), so nothing is dropped.
            if seen.salts == now.salts
                && now.backfill >= seen.backfill
                && f.writer_elsewhere()
                && shm.held_elsewhere(WAL_CKPT_LOCK, 1).unwrap_or(false)
            {
                vfs_stats()
                    .coherence_member_skips
                    .fetch_add(1, Ordering::Relaxed);
                self.wal = Some(now);
                return Ok(());
            }
        }
        if seen.same_file(&now) {
            self.wal = Some(now);
            return Ok(());
        }
        let mut pages = Vec::new();
        if seen.salts != now.salts {
            let known = (self.known_salts == seen.salts).then_some(&self.known[..]);
            if let Some(old) = old_generation_pages(inode, shm, &seen, &now, known) {
                // The old generation's frames copied since `seen` are
                // `old`'s pages: count the new one's frames from its first.
                pages = old;
                seen = WalSeen {
                    salts: now.salts,
                    backfill: 0,
                    ..now
                };
            }
        }
        if seen.salts != now.salts || now.backfill < seen.backfill {
            return self.full(inode, Some(now));
        }
        if self.own_ckpt && pages.is_empty() {
            // Our own checkpoint's frames, written through this cache.
            self.wal = Some(now);
            return Ok(());
        }
        // Values from the `-shm`: at most `MAX_FRAMES_READ` page numbers,
        // from regions SQLite mapped, else a full drop (`walindex`).
        if !frames_readable(seen.backfill + 1, now.backfill, shm.mapped()) {
            return self.full(inode, Some(now));
        }
        pages.reserve((now.backfill - seen.backfill) as usize);
        for f in seen.backfill + 1..=now.backfill {
            match frame_pgno(shm, f) {
                Some(p) if p > 0 => pages.push(p),
                _ => return self.full(inode, Some(now)),
            }
        }
        // The page numbers were read before the salts again: a restart
        // writes its salts before any new frame's page number.
        fence(Ordering::Acquire);
        let (Some(size), Some(again)) = (page_size(shm), read_seen(shm)) else {
            return self.full(inode, Some(now));
        };
        if again.salts != now.salts {
            return self.full(inode, Some(now));
        }
        // A checkpoint that grew or cut the file: its length again (the
        // pages past the lower end go; the others are the frames' own).
        let grown = match inode.fd.metadata() {
            Ok(m) if m.len() == inode.file.len() => 0,
            Ok(_) => match inode.file.refresh_len() {
                Ok(n) => n,
                Err(_) => return self.full(inode, Some(now)),
            },
            Err(_) => return self.full(inode, Some(now)),
        };
        let dropped = match drop_pages(inode.file, &mut pages, size) {
            Ok(n) => grown + n,
            Err(_) => return self.full(inode, Some(now)),
        };
        let v = vfs_stats();
        v.coherence_partial_drops.fetch_add(1, Ordering::Relaxed);
        v.coherence_pages_dropped
            .fetch_add(dropped, Ordering::Relaxed);
        self.wal = Some(now);
        Ok(())
    }

    /// Drop everything and record `now` (read before the drop: a later
    /// change shows at the next check).
    fn full(&mut self, inode: &Db<'_>, now: Option<WalSeen>) -> Result<(), String> {
        self.wal = None;
        drop_all(inode)?;
        self.wal = now;
        Ok(())
    }

    /// This process took the checkpoint lock (after its check): the
    /// frames copied until it releases it are its own.
    pub(crate) fn ckpt_begin(&mut self) {
        self.own_ckpt = true;
    }

    /// This process released the checkpoint lock: record what its own
    /// checkpoint copied.
    pub(crate) fn ckpt_end(&mut self, inode: &Db<'_>, shm: &Shm) {
        if !std::mem::take(&mut self.own_ckpt) {
            return;
        }
        if let (Some(seen), Some(now)) = (self.wal, read_seen(shm)) {
            if seen.salts == now.salts && now.backfill >= seen.backfill {
                // Our own checkpoint: the frames it copied are in the
                // cache as copied.
                self.wal = Some(now);
                if let Some(f) = inode.file.shared_file() {
                    f.set_stamp(WAL_STAMP, wal_stamp(&now));
                    // and the file as the checkpoint left it (the
                    // checkpoint lock is still held: no other changes it)
                    if let Ok(sig) = Sig::read(inode.fd) {
                        f.set_stamp(SIG_STAMP, sig.stamp());
                    }
                }
            }
        }
        self.record(shm);
    }

    /// This process took the exclusive read locks 1-4 (a WAL restart
    /// follows, under the write lock), after its check.
    pub(crate) fn restart_begin(&mut self) {
        self.restart_from = self.wal;
    }

    /// This process released the exclusive read locks 1-4: record its own
    /// restart (new salts, nothing copied) when nothing else happened.
    pub(crate) fn restart_end(&mut self, inode: &Db<'_>, shm: &Shm) {
        let Some(from) = self.restart_from.take() else {
            return;
        };
        if self.wal != Some(from) {
            return;
        }
        if let Some(now) = read_seen(shm) {
            if now.salts != from.salts && now.backfill == 0 && now.mx == 0 {
                self.wal = Some(now);
                if let Some(f) = inode.file.shared_file() {
                    f.set_stamp(WAL_STAMP, wal_stamp(&now));
                }
            }
        }
        self.record(shm);
    }
}

/// `xShmLock`'s checkpoint lock slot (`WAL_CKPT_LOCK`, `wal.c`).
pub(crate) const WAL_CKPT_LOCK: c_int = 1;
/// The recovery lock slot (`WAL_RECOVER_LOCK`): taken exclusive only to
/// rebuild the index from the WAL file (and by `test_superlock.c`'s
/// superlock, which zeroes the index header so that the next reader
/// rebuilds it).
pub(crate) const WAL_RECOVER_LOCK: c_int = 2;
/// The first reader slot, `WAL_READ_LOCK(0)`.
pub(crate) const WAL_READ_LOCK0: c_int = 3;

/// After a successful `xShmLock(offset, n, flags)` of a database in shared
/// mode, what [`shm_lock_action`] says of the call: a read lock (any of
/// the five; the VFS runs its check at the transaction's first read of
/// the database instead, `Inode::recheck_wal`) and the checkpoint lock
/// run [`Coherence::wal_check`] first;
/// the release of the checkpoint lock by its holder records the frames
/// this process's checkpoint copied; the exclusive read locks 1-4 (taken
/// only to restart the WAL) check, and their release records the restart;
/// the recovery lock forgets the index state (the next check drops every
/// cached page).
/// (The caller calls it before the lock for a release.)
///
/// # Errors
/// The failed check's message: the caller releases the lock and fails.
pub(crate) fn on_shm_lock(
    coh: &mut Coherence,
    inode: &Db<'_>,
    shm: &Shm,
    action: ShmLockAction,
) -> Result<(), String> {
    match action {
        ShmLockAction::ReadCheck => {
            coh.wal_check(inode, shm)?;
            #[cfg(test)]
            tests::after_read_check();
            Ok(())
        }
        ShmLockAction::CkptBegin => {
            coh.wal_check(inode, shm)?;
            coh.ckpt_begin();
            Ok(())
        }
        ShmLockAction::RestartBegin => {
            coh.wal_check(inode, shm)?;
            coh.restart_begin();
            Ok(())
        }
        ShmLockAction::CkptEnd => {
            coh.ckpt_end(inode, shm);
            Ok(())
        }
        ShmLockAction::Recover => {
            // The index is rebuilt from the WAL file: its history says
            // nothing of the database file any more (a superlock's holder
            // may have replaced it), as SQLite's own pager takes a
            // recovery as a change and drops its cache.
            coh.wal = None;
            coh.recovered = true;
            Ok(())
        }
        ShmLockAction::RestartEnd => {
            coh.restart_end(inode, shm);
            Ok(())
        }
    }
}

/// A test's stand-in for another process acting right after this thread
/// was granted a read lock, before SQLite loads `nBackfill` (run once).
#[cfg(test)]
pub(crate) fn after_read_lock() {
    tests::after_read_check();
}

/// What [`on_shm_lock`] does for an `xShmLock` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShmLockAction {
    /// A read lock: the WAL check (the VFS runs it at the transaction's
    /// first read of the database).
    ReadCheck,
    /// The checkpoint lock: the check, then this process's checkpoint.
    CkptBegin,
    /// The exclusive read locks 1-4 of a WAL restart: the check, then the
    /// restart.
    RestartBegin,
    /// The release of the checkpoint lock by its holder.
    CkptEnd,
    /// The release of the exclusive read locks 1-4.
    RestartEnd,
    /// The recovery lock, taken by this process: the next check drops
    /// every cached page.
    Recover,
}

/// What [`on_shm_lock`] does for `xShmLock(offset, n, flags)` (`held_ckpt`:
/// the calling handle holds the checkpoint lock), `None` for nothing (the
/// write lock, a read lock's release, a reader slot taken exclusive to set
/// its mark): the caller then leaves the coherence state alone.
#[inline]
pub(crate) fn shm_lock_action(
    (offset, n, flags): (c_int, c_int, c_int),
    held_ckpt: bool,
) -> Option<ShmLockAction> {
    let locking = flags & SQLITE_SHM_LOCK != 0;
    let excl = flags & SQLITE_SHM_EXCLUSIVE != 0;
    let restart = excl && offset == WAL_READ_LOCK0 + 1 && n == 4;
    let recover = offset <= WAL_RECOVER_LOCK && offset + n > WAL_RECOVER_LOCK;
    match (locking, excl) {
        (true, true) if recover => Some(ShmLockAction::Recover),
        (true, false) if offset >= WAL_READ_LOCK0 => Some(ShmLockAction::ReadCheck),
        (true, true) if offset == WAL_CKPT_LOCK && n == 1 => Some(ShmLockAction::CkptBegin),
        (true, true) if restart => Some(ShmLockAction::RestartBegin),
        (false, true) if offset <= WAL_CKPT_LOCK && offset + n > WAL_CKPT_LOCK && held_ckpt => {
            Some(ShmLockAction::CkptEnd)
        }
        (false, true) if restart => Some(ShmLockAction::RestartEnd),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
