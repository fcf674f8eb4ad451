//! The file table: which files have pages in the region, by an identity
//! that survives inode reuse, with the state every member of a file shares
//! (its size, its lock, its writeback error, who has it open).
//!
//! Owns the file slot's words and the table's protocol.
//!
//! - **Identity** ([`FileId`]): the device and inode number, the kernel's
//!   file handle for the inode (`name_to_handle_at`: on ext4, xfs, btrfs
//!   and tmpfs it carries the inode's generation, so a file deleted and
//!   made again at the same inode number has another handle), and its
//!   birth time (`statx`). A file with neither handle nor birth time cannot
//!   be told from a successor and is not shared (the caller keeps it in its
//!   private cache).
//! - **Epochs.** Every frame's tag names a slot and the slot's epoch. The
//!   epoch only grows, across reuses of the slot too, so moving it on
//!   retires every frame of the file at once: no lookup matches them, the
//!   clock frees them. It moves on when a slot is claimed for a file, when
//!   it is freed, and when a file that no member has open is found changed
//!   by someone else (its size, modification or change time differ from
//!   what members last left: [`w::SEEN_SIZE`] and on), which is only done
//!   when the file has no dirty frame.
//! - **A look taken in the tick of a change is not trusted.** A file's
//!   times come from the kernel's coarse clock (a tick, 1 to 10 ms) before
//!   Linux 6.13's multigrain timestamps and on file systems without them
//!   (ext2, for one), so a change in the same tick as the one a member's
//!   look saw (a truncation and a growth back to the size, a rewrite)
//!   leaves size and times as they were. When the change time a
//!   look returns is not older than the coarse clock read just before it
//!   ([`Seen::racy`]), what is recorded is [`RACY`], which no look matches:
//!   the next open checks the file's pages again (as git's index treats a
//!   racily clean entry).
//! - **Claims and frees** take the table's lock (a header word, an owner
//!   word like a frame's): a file is looked for along its probe sequence
//!   and claimed at the first free or never-used slot on it, so two
//!   members opening one file at once end in one slot. Slots whose file no
//!   member has open and which hold no dirty frame are freed when the table
//!   fills.
//! - **The file's lock** ([`w::LOCK`]) serializes what changes the size:
//!   writes past the end, truncation, and the check at open. Writes inside
//!   the file take only frame locks and check the size under them.
//! - **Counts that never undercount.** `DIRTY` is raised before a frame's
//!   `DIRTY` flag is set and lowered after it is cleared, so a member's
//!   death between the two leaves it too high (the file is then never
//!   thought clean while it is not), never too low.

use super::frame::Owner;
use super::layout::{FILES, PATH_BYTES};
use super::map::{FileSlot, Mapping};
use crate::sync::{AtomicU32, Ordering};
use std::os::fd::{AsRawFd, BorrowedFd};

/// File slot words.
pub(crate) mod w {
    /// [`super::NEVER`], [`super::LIVE`] or [`super::FREED`].
    pub(crate) const STATE: usize = 0;
    /// The identity: device.
    pub(crate) const DEV: usize = 1;
    /// The identity: inode number.
    pub(crate) const INO: usize = 2;
    /// The identity: a hash of the file handle (type and bytes), 0 if none.
    pub(crate) const HANDLE: usize = 3;
    /// The identity: birth time in nanoseconds, 0 if unknown.
    pub(crate) const BTIME: usize = 4;
    /// The epoch frames of this file are tagged with.
    pub(crate) const EPOCH: usize = 5;
    /// The file's size as members see it.
    pub(crate) const SIZE: usize = 6;
    /// The file's lock: an owner in the low 32 bits.
    pub(crate) const LOCK: usize = 7;
    /// A bit per member that has the file open.
    pub(crate) const OPENERS: usize = 8;
    /// Frames of the file with `DIRTY` set (never fewer).
    pub(crate) const DIRTY: usize = 9;
    /// The writeback error sequence: errors so far << 16 | the last errno.
    pub(crate) const ERRSEQ: usize = 10;
    /// The size members last left the file at.
    pub(crate) const SEEN_SIZE: usize = 11;
    /// The modification time members last left (ns).
    pub(crate) const SEEN_MTIME: usize = 12;
    /// The change time members last left (ns).
    pub(crate) const SEEN_CTIME: usize = 13;
    /// When a member last opened it ([`super::super::member::now_ms`]).
    pub(crate) const LAST_USE: usize = 14;
    /// The size a truncation started from, while one runs (0 otherwise):
    /// a recoverer finishes it.
    pub(crate) const TRUNCATING: usize = 15;
    /// The member whose changes to the file's frames are not final yet
    /// (an owner in the low 32 bits; 0: none): a recoverer of that member
    /// retires every frame of the file before anyone trusts one.
    pub(crate) const WRITER: usize = 16;
    /// The first of [`super::STAMPS`] words the file's members keep for
    /// their own protocol ([`SharedFile::stamp`](super::super::SharedFile::stamp)).
    pub(crate) const STAMP: usize = 17;
}

/// How many stamp words a file slot has.
pub(crate) const STAMPS: usize = 2;

/// A slot never used (ends a probe sequence).
pub(crate) const NEVER: u64 = 0;
/// A slot holding a file.
pub(crate) const LIVE: u64 = 1;
/// A slot freed (a probe sequence goes on past it).
pub(crate) const FREED: u64 = 2;

/// What tells one file from every other, now and after it is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FileId {
    /// `st_dev`.
    pub(crate) dev: u64,
    /// `st_ino`.
    pub(crate) ino: u64,
    /// A hash of the file handle, 0 if the file system gives none.
    pub(crate) handle: u64,
    /// Birth time (ns), 0 if unknown.
    pub(crate) btime: u64,
}

/// What a file looks like now (`fstat`), for the check at open. Two looks
/// are equal when size and times are (whether they were racy aside).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    /// Size in bytes.
    pub(crate) size: u64,
    /// Modification time (ns).
    pub(crate) mtime: u64,
    /// Change time (ns).
    pub(crate) ctime: u64,
    /// The change time is not older than the coarse clock's tick the look
    /// was taken in: another change may follow in that tick and keep the
    /// times (see the module notes).
    pub(crate) racy: bool,
}

impl PartialEq for Seen {
    fn eq(&self, o: &Seen) -> bool {
        (self.size, self.mtime, self.ctime) == (o.size, o.mtime, o.ctime)
    }
}

impl Eq for Seen {}

/// The change time recorded for a racy look: no file's look has it.
pub(crate) const RACY: u64 = u64::MAX;

/// The kernel's coarse real-time clock now (ns): what a file's times are
/// taken from where they are not fine-grained.
fn coarse_now() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid out-pointer; the clock id is Linux's.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) } != 0 {
        return 0; // every look racy: checked again, never trusted wrongly
    }
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The identity and the current look of the open file `fd`, or `None` if
/// it cannot be identified beyond its inode number (no file handle and no
/// birth time) or is not a regular file.
pub(crate) fn identify(fd: BorrowedFd<'_>) -> Option<(FileId, Seen)> {
    let before = coarse_now();
    // SAFETY: `st` is a valid out-pointer for statx.
    let mut st: libc::statx = unsafe { core::mem::zeroed() };
    let empty = c"";
    // SAFETY: `fd` is open, the path is an empty C string with
    // AT_EMPTY_PATH, `st` is writable.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut st,
        )
    };
    if r != 0 || u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let ns = |t: libc::statx_timestamp| {
        (t.tv_sec as u64).wrapping_mul(1_000_000_000) + u64::from(t.tv_nsec)
    };
    let btime = if st.stx_mask & libc::STATX_BTIME != 0 {
        ns(st.stx_btime).max(1)
    } else {
        0
    };
    let handle = file_handle_hash(fd);
    if handle == 0 && btime == 0 {
        return None;
    }
    let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
    Some((
        FileId {
            dev,
            ino: st.stx_ino,
            handle,
            btime,
        },
        Seen {
            size: st.stx_size,
            mtime: ns(st.stx_mtime),
            ctime: ns(st.stx_ctime),
            racy: ns(st.stx_ctime) >= before,
        },
    ))
}

/// What the file `fd` looks like now, if `fstat` answers.
pub(crate) fn look(fd: BorrowedFd<'_>) -> Option<Seen> {
    let before = coarse_now();
    // SAFETY: `st` is a valid out-pointer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let ns = |s: i64, n: i64| {
        (s as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(n as u64)
    };
    let ctime = ns(st.st_ctime, st.st_ctime_nsec);
    Some(Seen {
        size: st.st_size as u64,
        mtime: ns(st.st_mtime, st.st_mtime_nsec),
        ctime,
        racy: ctime >= before,
    })
}

/// A hash of the kernel's handle for `fd`'s inode, 0 if none.
fn file_handle_hash(fd: BorrowedFd<'_>) -> u64 {
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        f: [u8; 128],
    }
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mount: libc::c_int = 0;
    let empty = c"";
    // SAFETY: `h` has the layout of `struct file_handle` with 128 bytes of
    // `f_handle`, as `handle_bytes` says; `mount` is writable; the path is
    // empty with AT_EMPTY_PATH.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            empty.as_ptr(),
            (&mut h as *mut Handle).cast::<libc::file_handle>(),
            &mut mount,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 || h.bytes as usize > h.f.len() {
        return 0;
    }
    let x = fnv(
        &h.f[..h.bytes as usize],
        fnv(&h.kind.to_le_bytes(), 0xcbf2_9ce4_8422_2325),
    );
    x.max(1)
}

impl FileSlot {
    /// Word `i` now.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Acquire)
    }

    /// Set word `i`.
    #[inline]
    pub(crate) fn set(&self, i: usize, v: u64) {
        self.words[i].store(v, Ordering::Release);
    }

    /// The slot's identity words.
    pub(crate) fn id(&self) -> FileId {
        FileId {
            dev: self.get(w::DEV),
            ino: self.get(w::INO),
            handle: self.get(w::HANDLE),
            btime: self.get(w::BTIME),
        }
    }

    /// The member that marked itself the file's writer, if any.
    #[inline]
    pub(crate) fn writer(&self) -> Option<Owner> {
        Owner::from_bits(self.get(w::WRITER) as u32)
    }

    /// Whether a member other than `me` holds the file's writer mark: its
    /// dirty frames may hold an unfinished transaction, so `me` must not
    /// write them back or wait for them.
    #[inline]
    pub(crate) fn marked_by_other(&self, me: Owner) -> bool {
        self.writer().is_some_and(|o| o != me)
    }

    /// Retire every frame of the file left by writer `dead` (its changes
    /// were never made final: dirty ones are discarded, never written
    /// back), then clear the mark; whether this call did it. The caller
    /// proved `dead` dead or is `dead` leaving.
    pub(crate) fn retire_writer(&self, dead: Owner) -> bool {
        if self.get(w::STATE) != LIVE || self.writer() != Some(dead) {
            return false;
        }
        self.bump_epoch();
        // Every dirty frame of the file is the writer's, and stale now.
        self.set(w::DIRTY, 0);
        self.words[w::WRITER]
            .compare_exchange(
                u64::from(dead.bits()),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The epoch now.
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.words[w::EPOCH].load(Ordering::Acquire)
    }

    /// Move the epoch on (retiring every frame of the slot); the new one.
    pub(crate) fn bump_epoch(&self) -> u64 {
        // Never 0, and never back to a value a frame may still carry.
        let e = self.words[w::EPOCH].fetch_add(1, Ordering::AcqRel) + 1;
        if e == 0 {
            self.words[w::EPOCH].store(1, Ordering::Release);
            1
        } else {
            e
        }
    }

    /// The size as members see it.
    #[inline]
    pub(crate) fn size(&self) -> u64 {
        self.words[w::SIZE].load(Ordering::SeqCst)
    }

    /// Raise the size to at least `end`.
    pub(crate) fn grow_to(&self, end: u64) {
        self.words[w::SIZE].fetch_max(end, Ordering::SeqCst);
    }

    /// The file lock's word (an owner in its low half).
    pub(crate) fn lock_word(&self) -> &AtomicU32 {
        let p = (&self.words[w::LOCK] as *const crate::sync::AtomicU64).cast::<AtomicU32>();
        // SAFETY: an 8-byte aligned atomic word of the region; its low half
        // is only ever accessed as this `AtomicU32` (the lock), the high
        // half never. Under loom the slot is never built (no region).
        unsafe { &*p }
    }

    /// Count a frame made dirty (before its flag is set).
    pub(crate) fn dirty_inc(&self) {
        self.words[w::DIRTY].fetch_add(1, Ordering::AcqRel);
    }

    /// Count a frame made clean (after its flag is cleared); never below 0.
    pub(crate) fn dirty_dec(&self) {
        let d = &self.words[w::DIRTY];
        let mut v = d.load(Ordering::Relaxed);
        while v > 0 {
            match d.compare_exchange_weak(v, v - 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => v = now,
            }
        }
    }

    /// Record a writeback error (`errno`): the sequence moves on.
    pub(crate) fn set_error(&self, errno: i32) {
        let e = &self.words[w::ERRSEQ];
        let mut v = e.load(Ordering::Relaxed);
        loop {
            let new = ((v >> 16) + 1) << 16 | u64::from(errno as u16);
            match e.compare_exchange_weak(v, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => v = now,
            }
        }
    }

    /// The error sequence now.
    pub(crate) fn errseq(&self) -> u64 {
        self.get(w::ERRSEQ)
    }

    /// Record what the file looks like after a member's change (a racy
    /// look as [`RACY`]: the next open checks the file's pages again).
    pub(crate) fn set_seen(&self, s: Seen) {
        self.set(w::SEEN_SIZE, s.size);
        self.set(w::SEEN_MTIME, s.mtime);
        self.set(w::SEEN_CTIME, if s.racy { RACY } else { s.ctime });
    }

    /// What members last left.
    pub(crate) fn seen(&self) -> Seen {
        Seen {
            size: self.get(w::SEEN_SIZE),
            mtime: self.get(w::SEEN_MTIME),
            ctime: self.get(w::SEEN_CTIME),
            racy: false,
        }
    }
}

/// The slot a file's probe sequence starts at.
fn home(id: &FileId) -> usize {
    let mut h = id.dev.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id.ino;
    h = (h ^ id.handle ^ id.btime.rotate_left(17)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    (h >> 32) as usize % FILES
}

/// A file slot found or claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// The slot.
    pub(crate) slot: usize,
    /// Whether it was claimed now (no member had the file in the region).
    pub(crate) new: bool,
}

/// The file table is full of files members have open or that hold dirty
/// frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableFull;

/// Find `id`'s slot or claim one for it, the table's lock held by the
/// caller. A new slot gets a new epoch, the file's size and look, and its
/// path (truncated to what fits: the path is only a way back to the file
/// for a recoverer, who checks the identity it reopens).
pub(crate) fn find_or_claim(
    map: &Mapping,
    id: &FileId,
    seen: Seen,
    path: &[u8],
    now: u32,
) -> Result<Claimed, TableFull> {
    for attempt in 0..2 {
        let start = home(id);
        let mut free = None;
        for i in 0..FILES {
            let s = (start + i) % FILES;
            let f = map.file(s);
            match f.get(w::STATE) {
                LIVE if f.id() == *id => {
                    return Ok(Claimed {
                        slot: s,
                        new: false,
                    })
                }
                LIVE => {}
                NEVER => {
                    free.get_or_insert(s);
                    break;
                }
                _ => {
                    free.get_or_insert(s);
                }
            }
        }
        if let Some(s) = free {
            let f = map.file(s);
            f.set(w::DEV, id.dev);
            f.set(w::INO, id.ino);
            f.set(w::HANDLE, id.handle);
            f.set(w::BTIME, id.btime);
            f.bump_epoch();
            f.set(w::SIZE, seen.size);
            f.set(w::OPENERS, 0);
            f.set(w::DIRTY, 0);
            f.set(w::ERRSEQ, 0);
            f.set(w::TRUNCATING, 0);
            f.set(w::WRITER, 0);
            for i in 0..STAMPS {
                f.set(w::STAMP + i, 0);
            }
            f.set_seen(seen);
            f.set(w::LAST_USE, u64::from(now));
            write_path(map, s, path);
            f.set(w::STATE, LIVE);
            return Ok(Claimed { slot: s, new: true });
        }
        if attempt == 0 && free_idle(map, FILES / 8) == 0 {
            break;
        }
    }
    Err(TableFull)
}

/// Free up to `n` slots whose file no member has open and that hold no
/// dirty frame (the least recently opened first), the table's lock held.
/// How many were freed.
pub(crate) fn free_idle(map: &Mapping, n: usize) -> usize {
    let now = super::member::now_ms();
    let mut idle: Vec<(u32, usize)> = (0..FILES)
        .filter(|&s| {
            let f = map.file(s);
            f.get(w::STATE) == LIVE
                && f.get(w::OPENERS) == 0
                && f.get(w::DIRTY) == 0
                && f.lock_word().load(Ordering::Acquire) == 0
        })
        .map(|s| (now.wrapping_sub(map.file(s).get(w::LAST_USE) as u32), s))
        .collect();
    idle.sort_unstable_by_key(|&(age, _)| std::cmp::Reverse(age));
    let mut freed = 0;
    for &(_, s) in idle.iter().take(n) {
        let f = map.file(s);
        f.bump_epoch();
        f.set(w::STATE, FREED);
        freed += 1;
    }
    freed
}

fn write_path(map: &Mapping, s: usize, path: &[u8]) {
    let words = map.path_words(s);
    let path = &path[..path.len().min(PATH_BYTES - 8)];
    for (i, chunk) in path.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        words[1 + i].store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    words[0].store(path.len() as u64, Ordering::Release);
}

/// File slot `s`'s path as recorded (bounded by the area).
pub(crate) fn read_path(map: &Mapping, s: usize) -> Vec<u8> {
    let words = map.path_words(s);
    let len = (words[0].load(Ordering::Acquire) as usize).min(PATH_BYTES - 8);
    let mut out = Vec::with_capacity(len);
    for word in &words[1..1 + len.div_ceil(8)] {
        out.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The member bit of `me` in an openers mask.
#[inline]
pub(crate) fn member_bit(me: Owner) -> u64 {
    1u64 << me.slot()
}
