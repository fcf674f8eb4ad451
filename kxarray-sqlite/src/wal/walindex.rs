//! The WAL index header and page-number arrays, read from the `-shm` as
//! untrusted input: any process that can write the `-shm` can put
//! anything there, and the coherence checks (`coherence`) must fail no
//! worse than SQLite does on the same bytes.
//!
//! Owns [`WalSeen`] (what the checks keep of a header), [`read_seen`] (the
//! header, validated as `wal.c`'s `walIndexTryHdr` validates it),
//! [`page_size`] and [`frame_pgno`] (`walFramePgno`), and the bounds the
//! checks keep to ([`MAX_FRAMES_READ`]).
//!
//! Invariants:
//! - a header is used only if both copies are equal word for word,
//!   `isInit` is set, the checksum over the first 40 bytes (SQLite's
//!   `walChecksumBytes` in native order) matches, and `nBackfill <=
//!   mxFrame`; anything else is `None`, which the checks answer with a
//!   full drop (the safe answer: every cached page read again);
//! - arithmetic on values from the `-shm` is checked or done in `u64`: no
//!   value makes it overflow or panic;
//! - nothing here maps a region ([`Shm::words`] reads only regions SQLite
//!   mapped through `xShmMap`), allocates by a count from the `-shm`, or
//!   loops on one: callers read at most [`MAX_FRAMES_READ`] page numbers
//!   per check ([`frames_readable`] says whether a range is within the
//!   bound and the regions mapped), and give up with a full drop beyond.

use crate::wal::shm::Shm;

/// Bytes of the index header (two `WalIndexHdr` and the `WalCkptInfo`):
/// `WALINDEX_HDR_SIZE`.
const INDEX_HDR_BYTES: u32 = 136;
/// Page numbers in an index region (`HASHTABLE_NPAGE`).
const NPAGE: u64 = 4096;
/// Page numbers in the first region (`HASHTABLE_NPAGE_ONE`).
const NPAGE_ONE: u64 = NPAGE - INDEX_HDR_BYTES as u64 / 4;
/// Words of one `WalIndexHdr` copy.
const HDR_WORDS: usize = 12;
/// The word of `WalCkptInfo.nBackfill`.
const BACKFILL_WORD: usize = 24;

/// The most page numbers a check reads from the index: a checkpoint that
/// copied more frames since the last check (256 MiB of 4 KiB pages) costs
/// a full drop instead.
pub(crate) const MAX_FRAMES_READ: u32 = 1 << 16;

/// The WAL-index state the cache is valid against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WalSeen {
    /// `aSalt` (the WAL generation).
    pub(crate) salts: [u32; 2],
    /// `nBackfill`: frames copied to the database.
    pub(crate) backfill: u32,
    /// `iChange`: commits ever written to the index (a restart keeps it).
    pub(crate) change: u32,
    /// `mxFrame`: the last valid frame.
    pub(crate) mx: u32,
}

impl WalSeen {
    /// Whether the database file may differ from `self`'s time to
    /// `other`'s (salts or backfill moved).
    pub(crate) fn same_file(&self, other: &WalSeen) -> bool {
        self.salts == other.salts && self.backfill == other.backfill
    }
}

/// `walChecksumBytes` in native byte order over `words` (an even count),
/// from zero.
fn checksum(words: &[u32]) -> [u32; 2] {
    let (mut s1, mut s2) = (0u32, 0u32);
    for pair in words.chunks_exact(2) {
        s1 = s1.wrapping_add(pair[0]).wrapping_add(s2);
        s2 = s2.wrapping_add(pair[1]).wrapping_add(s1);
    }
    [s1, s2]
}

/// Whether `h` (one header copy) is a header SQLite would use: `isInit`
/// set and its checksum right.
fn valid_copy(h: &[u32; HDR_WORDS]) -> bool {
    let is_init = h[3].to_ne_bytes()[0] != 0;
    is_init && checksum(&h[..10]) == [h[10], h[11]]
}

/// The index header (both copies agreeing: a commit elsewhere writes copy
/// 1, then copy 0; a few retries wait one out), validated (see the module
/// notes), and `nBackfill`; `None` when region 0 is not mapped, the copies
/// keep disagreeing, or the header is not one SQLite would use.
#[inline]
pub(crate) fn read_seen(shm: &Shm) -> Option<WalSeen> {
    const ALL: [usize; 2 * HDR_WORDS + 1] = {
        let mut a = [0; 2 * HDR_WORDS + 1];
        let mut i = 0;
        while i < 2 * HDR_WORDS {
            a[i] = i;
            i += 1;
        }
        a[2 * HDR_WORDS] = BACKFILL_WORD;
        a
    };
    for _ in 0..100 {
        // copy 0, then copy 1, then nBackfill, in that order (`Acquire`
        // loads: none is read before the one ahead of it)
        let w = shm.words(0, ALL)?;
        let a: [u32; HDR_WORDS] = w[..HDR_WORDS].try_into().expect("12 words");
        if a[..] == w[HDR_WORDS..2 * HDR_WORDS] {
            let backfill = w[2 * HDR_WORDS];
            let (change, mx) = (a[2], a[4]);
            if !valid_copy(&a) || backfill > mx {
                return None;
            }
            return Some(WalSeen {
                salts: [a[8], a[9]],
                backfill,
                change,
                mx,
            });
        }
        std::thread::yield_now();
    }
    None
}

/// The database page size the index header records (`szPage`; 1 means
/// 65536), or `None` when it is not a page size.
pub(crate) fn page_size(shm: &Shm) -> Option<u64> {
    let b = shm.word(0, 3)?.to_ne_bytes();
    let sz = u16::from_ne_bytes([b[2], b[3]]);
    let sz = if sz == 1 { 65536 } else { u64::from(sz) };
    (sz >= 512 && sz.is_power_of_two()).then_some(sz)
}

/// The region and word of WAL frame `frame`'s page number (1-based;
/// `walFramePage` and the array's layout), in `u64` so that no frame
/// number overflows; `None` for frame 0.
fn frame_slot(frame: u32) -> Option<(u64, u64)> {
    let f = u64::from(frame).checked_sub(1)?;
    if f < NPAGE_ONE {
        Some((0, u64::from(INDEX_HDR_BYTES / 4) + f))
    } else {
        let past = f - NPAGE_ONE;
        Some((1 + past / NPAGE, past % NPAGE))
    }
}

/// The page number of WAL frame `frame` (1-based) in the index
/// (`walFramePgno`), from a region SQLite mapped; `None` otherwise.
pub(crate) fn frame_pgno(shm: &Shm, frame: u32) -> Option<u32> {
    let (region, word) = frame_slot(frame)?;
    shm.word(usize::try_from(region).ok()?, usize::try_from(word).ok()?)
}

/// Whether the page numbers of frames `from..=to` may be read by a check:
/// at most [`MAX_FRAMES_READ`] of them, every one in a region SQLite has
/// mapped (`mapped` regions).
pub(crate) fn frames_readable(from: u32, to: u32, mapped: usize) -> bool {
    if to < from {
        return true;
    }
    if to - from >= MAX_FRAMES_READ {
        return false;
    }
    frame_slot(to).is_some_and(|(region, _)| region < mapped as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header copy SQLite would write (`walIndexWriteHdr`): `isInit`,
    /// the checksum over the first 40 bytes.
    pub(crate) fn header(change: u32, mx: u32, salts: [u32; 2]) -> [u32; HDR_WORDS] {
        let mut h = [0u32; HDR_WORDS];
        h[0] = 3007000; // WALINDEX_MAX_VERSION
        h[2] = change;
        h[3] = u32::from_ne_bytes([1, 0, 0x10, 0x00]); // isInit, 4096 pages
        h[4] = mx;
        h[8] = salts[0];
        h[9] = salts[1];
        let c = checksum(&h[..10]);
        h[10] = c[0];
        h[11] = c[1];
        h
    }

    fn shm_with(words: &[(usize, u32)]) -> Shm {
        let s = Shm::heap();
        let (p, _) = s.map(0, 32768, true);
        for &(i, v) in words {
            // SAFETY: region 0 has 32768 bytes, 4-aligned: word `i` (< 8192)
            // is inside.
            let w = unsafe { p.cast::<u32>().add(i) };
            // SAFETY: as above.
            unsafe { w.write(v) };
        }
        s
    }

    fn both(h: &[u32; HDR_WORDS]) -> Vec<(usize, u32)> {
        (0..HDR_WORDS)
            .flat_map(|i| [(i, h[i]), (HDR_WORDS + i, h[i])])
            .collect()
    }

    /// A header is used only as `walIndexTryHdr` would: copies equal,
    /// `isInit`, the checksum; and `nBackfill <= mxFrame`.
    #[test]
    fn only_a_header_sqlite_would_use_is_used() {
        let h = header(5, 100, [7, 9]);
        let mut w = both(&h);
        w.push((BACKFILL_WORD, 40));
        let s = shm_with(&w);
        assert_eq!(
            read_seen(&s),
            Some(WalSeen {
                salts: [7, 9],
                backfill: 40,
                change: 5,
                mx: 100
            })
        );
        // nBackfill past mxFrame
        let mut bad = both(&h);
        bad.push((BACKFILL_WORD, u32::MAX));
        assert_eq!(read_seen(&shm_with(&bad)), None);
        // a forged mxFrame without its checksum
        let mut forged = both(&h);
        forged.push((4, 0x7FFF_FFFF));
        forged.push((HDR_WORDS + 4, 0x7FFF_FFFF));
        assert_eq!(read_seen(&shm_with(&forged)), None);
        // not initialised (all zero), and garbage (0x01 bytes)
        assert_eq!(read_seen(&shm_with(&[])), None);
        let ones: Vec<(usize, u32)> = (0..32).map(|i| (i, 0x0101_0101)).collect();
        assert_eq!(read_seen(&shm_with(&ones)), None);
        // the copies differ
        let mut differ = both(&h);
        differ.push((HDR_WORDS + 2, 6));
        assert_eq!(read_seen(&shm_with(&differ)), None);
    }

    /// Frame numbers at the ends of `u32` neither overflow nor map: frame
    /// 0 has no slot, the last one's region is far past what is mapped.
    #[test]
    fn frame_arithmetic_is_checked() {
        assert_eq!(frame_slot(0), None);
        assert_eq!(frame_slot(1), Some((0, 34)));
        assert_eq!(frame_slot(NPAGE_ONE as u32), Some((0, 34 + NPAGE_ONE - 1)));
        assert_eq!(frame_slot(NPAGE_ONE as u32 + 1), Some((1, 0)));
        let (region, word) = frame_slot(u32::MAX).unwrap();
        assert!(region > 1 << 19 && word < NPAGE);
        let s = shm_with(&[]);
        assert_eq!(frame_pgno(&s, u32::MAX), None);
        assert_eq!(frame_pgno(&s, 0), None);
        assert!(frames_readable(1, NPAGE_ONE as u32, 1));
        assert!(!frames_readable(1, NPAGE_ONE as u32 + 1, 1));
        assert!(!frames_readable(0, u32::MAX, 1 << 20));
        assert!(frames_readable(5, 4, 0));
    }
}
