//! The region file's layout: where each table starts, how large it is, and
//! the check that a file someone else made has the layout this code would
//! have made.
//!
//! Owns the constants of the format and [`Geometry`], the offsets computed
//! from the one free parameter (the most frames the region can hold). The
//! region is one file on tmpfs, mapped whole by every member:
//!
//! ```text
//! 0                  the header page: format words (written once, before
//!                    the region is marked ready) and the region's atomics
//!                    (capacity, clock hand, eviction clock, counters), each
//!                    on a cache line of its own
//! members_off        MEMBERS member slots: state, identity, counters, the
//!                    member's list of frames it dirtied
//! files_off          FILES file slots: identity, epoch, size, lock, openers
//! paths_off          FILES paths, one per file slot (a member that must
//!                    write back a dead member's pages reopens the file)
//! headers_off        one 32-byte header per frame
//! index_off          the lookup table: buckets of 16 words (a lock word and
//!                    15 entries), a power of two of them
//! frames_off         the frames, 4 KiB each, on a 2 MiB boundary
//! ```
//!
//! Invariants: every offset is a multiple of the page size and the frames'
//! a multiple of 2 MiB; `len` is the end of the frames; a geometry read
//! from a file is trusted only if recomputing it from its `max_frames`
//! gives the same words (anything else is a file this code did not make,
//! or garbage) and it is within [`MAX_FRAMES`].

use core::fmt;

/// Bytes per frame: the page size of the region.
pub(crate) const PAGE: usize = 4096;
/// `PAGE` as a `u64`.
pub(crate) const PAGE64: u64 = PAGE as u64;
/// Frames a member takes from the clock hand at once.
pub(crate) const BATCH: u64 = 16;
/// The format's magic word.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"KXSHRC01");
/// The format's version: a file of another version is refused.
pub(crate) const VERSION: u64 = 3;
/// Member slots: processes that can share one region (a member's bit in a
/// file's openers mask, so at most 64).
pub(crate) const MEMBERS: usize = 64;
/// File slots: files with frames in the region at once.
pub(crate) const FILES: usize = 16384;
/// Words in an index bucket: a lock word and [`WAYS`] entries.
pub(crate) const BUCKET_WORDS: usize = 16;
/// Entries per index bucket.
pub(crate) const WAYS: usize = BUCKET_WORDS - 1;
/// Entries in a member's dirty list: frames it dirtied and has not seen
/// written back (32 MiB of 4 KiB frames). A member whose list is full writes
/// back before it dirties another frame.
pub(crate) const DIRTY_MAX: usize = 8192;
/// Bytes of a member slot's fixed part (state, identity, counters).
pub(crate) const MEMBER_META: usize = 4096;
/// Bytes of a member slot.
pub(crate) const MEMBER_BYTES: usize = MEMBER_META + DIRTY_MAX * 8;
/// Bytes of a file slot.
pub(crate) const FILE_BYTES: usize = 192;
/// Bytes of a file slot's path (a length word, then the bytes).
pub(crate) const PATH_BYTES: usize = 4096;
/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 32;
/// The frames' alignment: a huge page, so a kernel that gives shared
/// memory huge pages can map them whole.
pub(crate) const FRAMES_ALIGN: u64 = 2 << 20;
/// The most frames a region may have (64 GiB of 4 KiB frames): keeps every
/// offset far inside `u64` and a frame number inside `u32`.
pub(crate) const MAX_FRAMES: u64 = 1 << 24;
/// The fewest frames a region has.
pub(crate) const MIN_FRAMES: u64 = 64;
/// Header words (the header page holds 512 `u64`s).
pub(crate) const HEADER_WORDS: usize = PAGE / 8;

/// Where the header's words are (indices into the header page's `u64`s).
/// The format words come first; each atomic the members change sits on a
/// cache line of its own (a multiple of 8 words).
pub(crate) mod hdr {
    /// [`super::MAGIC`].
    pub(crate) const MAGIC: usize = 0;
    /// [`super::VERSION`].
    pub(crate) const VERSION: usize = 1;
    /// The page size.
    pub(crate) const PAGE: usize = 2;
    /// The most frames.
    pub(crate) const MAX_FRAMES: usize = 3;
    /// Member slots.
    pub(crate) const MEMBERS: usize = 4;
    /// File slots.
    pub(crate) const FILES: usize = 5;
    /// Index buckets.
    pub(crate) const BUCKETS: usize = 6;
    /// Entries per dirty list.
    pub(crate) const DIRTY_MAX: usize = 7;
    /// The file's length.
    pub(crate) const LEN: usize = 8;
    /// The creator's uid.
    pub(crate) const UID: usize = 9;
    /// 0 while the creator lays the region out, [`super::READY`] after.
    pub(crate) const STATE: usize = 16;
    /// Frames the clock sweeps now (`[0, capacity)`): the capacity.
    pub(crate) const CAPACITY: usize = 24;
    /// Frames whose memory is allocated in the file (`fallocate`d), from 0.
    pub(crate) const BACKED: usize = 32;
    /// The clock hand (a frame number, taken in batches; wraps at the
    /// capacity).
    pub(crate) const HAND: usize = 40;
    /// The eviction clock of the workingset: evictions so far.
    pub(crate) const EVICTIONS: usize = 48;
    /// The owner of the resize lock (a member's slot + 1, 0 when free).
    pub(crate) const RESIZE: usize = 56;
    /// Dead members recovered so far.
    pub(crate) const RECOVERED: usize = 64;
    /// Frames freed by recoveries (fills a dead member left half done).
    pub(crate) const RECOVERED_FRAMES: usize = 72;
    /// Locks taken back from dead members (frames, buckets, files).
    pub(crate) const RECOVERED_LOCKS: usize = 80;
    /// The generation of the region's membership: moves on at every join,
    /// leave and recovery.
    pub(crate) const MEMBERSHIP: usize = 88;
    /// The owner of the file table's lock (claims and frees of file
    /// slots), a member's slot + 1 in the low 32 bits.
    pub(crate) const FILES_LOCK: usize = 96;
    /// Fills: pages read from files into frames, by every member.
    pub(crate) const FILLS: usize = 104;
    /// Evictions by the clock.
    pub(crate) const CLOCK_EVICTIONS: usize = 112;
    /// Frames handed out at least once, from 0 (never above the
    /// capacity): below the capacity, the clock takes a frame never used
    /// before it evicts one, allocating memory for it as it goes.
    pub(crate) const FRESH: usize = 120;
    /// The counters of members that left or died, folded in: first of
    /// `member::COUNTERS` words.
    pub(crate) const RETIRED: usize = 128;
    /// The members whose dirty lists may hold entries (bit `m` for member
    /// slot `m`; set before a member's first entry, cleared once its list
    /// is empty): a sync reads only those lists.
    pub(crate) const DIRTY_MEMBERS: usize = 160;
}

/// The header's state word once the region is laid out.
pub(crate) const READY: u64 = 0x0052_4541_4459; // "READY"

/// Where each part of a region lies, computed from its most frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The most frames the region can hold.
    pub(crate) max_frames: u64,
    /// Index buckets (a power of two).
    pub(crate) buckets: u64,
    /// Offset of the member slots.
    pub(crate) members_off: u64,
    /// Offset of the file slots.
    pub(crate) files_off: u64,
    /// Offset of the file slots' paths.
    pub(crate) paths_off: u64,
    /// Offset of the frame headers.
    pub(crate) headers_off: u64,
    /// Offset of the index.
    pub(crate) index_off: u64,
    /// Offset of the frames.
    pub(crate) frames_off: u64,
    /// The file's length.
    pub(crate) len: u64,
}

/// A region file whose layout is not one this code makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LayoutError(pub(crate) String);

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    debug_assert!(a.is_power_of_two());
    (x + a - 1) & !(a - 1)
}

impl Geometry {
    /// The layout of a region of at most `max_frames` frames (clamped to
    /// [`MIN_FRAMES`]..=[`MAX_FRAMES`]).
    pub(crate) fn for_frames(max_frames: u64) -> Geometry {
        let max_frames = max_frames.clamp(MIN_FRAMES, MAX_FRAMES);
        let page = PAGE64;
        // Three entries per frame leave room for shadows and keep buckets
        // a third full, so a bucket of 15 overflows very rarely (Poisson
        // with mean 5: under 1e-4 of them with every frame in use).
        let buckets = (max_frames * 3)
            .div_ceil(WAYS as u64)
            .next_power_of_two()
            .max(64);
        let members_off = page;
        let files_off = align_up(members_off + (MEMBERS * MEMBER_BYTES) as u64, page);
        let paths_off = align_up(files_off + (FILES * FILE_BYTES) as u64, page);
        let headers_off = align_up(paths_off + (FILES * PATH_BYTES) as u64, page);
        let index_off = align_up(headers_off + max_frames * FRAME_HEADER_BYTES as u64, page);
        let frames_off = align_up(
            index_off + buckets * (BUCKET_WORDS * 8) as u64,
            FRAMES_ALIGN,
        );
        let len = frames_off + max_frames * page;
        Geometry {
            max_frames,
            buckets,
            members_off,
            files_off,
            paths_off,
            headers_off,
            index_off,
            frames_off,
            len,
        }
    }

    /// The format words of the header, in order from [`hdr::MAGIC`].
    pub(crate) fn words(&self, uid: u32) -> [u64; 10] {
        let mut w = [0u64; 10];
        w[hdr::MAGIC] = MAGIC;
        w[hdr::VERSION] = VERSION;
        w[hdr::PAGE] = PAGE64;
        w[hdr::MAX_FRAMES] = self.max_frames;
        w[hdr::MEMBERS] = MEMBERS as u64;
        w[hdr::FILES] = FILES as u64;
        w[hdr::BUCKETS] = self.buckets;
        w[hdr::DIRTY_MAX] = DIRTY_MAX as u64;
        w[hdr::LEN] = self.len;
        w[hdr::UID] = u64::from(uid);
        w
    }

    /// The geometry the format words `w` describe, if they are exactly the
    /// words this code writes for some `max_frames` and `uid`.
    ///
    /// # Errors
    /// A [`LayoutError`] saying which word differs.
    pub(crate) fn from_words(w: &[u64; 10], uid: u32) -> Result<Geometry, LayoutError> {
        if w[hdr::MAGIC] != MAGIC {
            return Err(LayoutError(format!(
                "not a kxarray region (magic {:#x})",
                w[0]
            )));
        }
        if w[hdr::VERSION] != VERSION {
            return Err(LayoutError(format!(
                "region format {} (this build reads {VERSION})",
                w[hdr::VERSION]
            )));
        }
        let max = w[hdr::MAX_FRAMES];
        if !(MIN_FRAMES..=MAX_FRAMES).contains(&max) {
            return Err(LayoutError(format!("region of {max} frames")));
        }
        let g = Geometry::for_frames(max);
        let want = g.words(uid);
        if let Some(i) = (0..want.len()).find(|&i| want[i] != w[i]) {
            return Err(LayoutError(format!(
                "region header word {i} is {:#x}, expected {:#x}",
                w[i], want[i]
            )));
        }
        Ok(g)
    }

    /// Byte offset of frame `f`'s bytes.
    #[inline]
    pub(crate) fn frame_off(&self, f: u32) -> u64 {
        debug_assert!(u64::from(f) < self.max_frames);
        self.frames_off + u64::from(f) * PAGE64
    }

    /// Byte offset of file slot `s`'s path.
    #[inline]
    pub(crate) fn path_off(&self, s: usize) -> u64 {
        debug_assert!(s < FILES);
        self.paths_off + (s * PATH_BYTES) as u64
    }

    /// Byte offset of member slot `m`.
    #[inline]
    pub(crate) fn member_off(&self, m: usize) -> u64 {
        debug_assert!(m < MEMBERS);
        self.members_off + (m * MEMBER_BYTES) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_is_aligned_and_disjoint() {
        for max in [0, MIN_FRAMES, 1000, 1 << 16, 3 << 18, MAX_FRAMES, u64::MAX] {
            let g = Geometry::for_frames(max);
            assert!(g.max_frames >= MIN_FRAMES && g.max_frames <= MAX_FRAMES);
            assert!(g.buckets.is_power_of_two());
            assert!(g.buckets * WAYS as u64 >= 3 * g.max_frames);
            for off in [
                g.members_off,
                g.files_off,
                g.paths_off,
                g.headers_off,
                g.index_off,
            ] {
                assert_eq!(off % PAGE64, 0);
            }
            assert_eq!(g.frames_off % FRAMES_ALIGN, 0);
            assert!(g.members_off + (MEMBERS * MEMBER_BYTES) as u64 <= g.files_off);
            assert!(g.files_off + (FILES * FILE_BYTES) as u64 <= g.paths_off);
            assert!(g.paths_off + (FILES * PATH_BYTES) as u64 <= g.headers_off);
            assert!(g.headers_off + g.max_frames * FRAME_HEADER_BYTES as u64 <= g.index_off);
            assert!(g.index_off + g.buckets * 128 <= g.frames_off);
            assert_eq!(g.len, g.frames_off + g.max_frames * PAGE64);
        }
    }

    #[test]
    fn only_the_words_this_code_writes_are_accepted() {
        let g = Geometry::for_frames(5000);
        let w = g.words(1000);
        assert_eq!(Geometry::from_words(&w, 1000), Ok(g));
        assert!(
            Geometry::from_words(&w, 1001).is_err(),
            "another user's region"
        );
        for i in 0..w.len() {
            let mut bad = w;
            bad[i] ^= 1 << 3;
            assert!(
                Geometry::from_words(&bad, 1000).is_err(),
                "word {i} changed"
            );
        }
        let mut huge = w;
        huge[hdr::MAX_FRAMES] = u64::MAX;
        assert!(Geometry::from_words(&huge, 1000).is_err());
    }
}
