//! Per-block state inside folios (the kernel's `iomap_folio_state`): an
//! `uptodate` and a `dirty` bit per block of one file's folios.
//!
//! Owns the bitmaps and the rules a partial write, a partial read and
//! writeback follow: which blocks a write must read first (the not
//! uptodate blocks it does not fully overwrite), which blocks a read must
//! fill, and which dirty blocks writeback takes and in what runs.
//!
//! Invariants:
//! - a folio with no entry is wholly uptodate and clean; an entry exists
//!   only while some block is dirty or not uptodate, and `partial` counts
//!   the entries with a block not uptodate (0 lets the read hit path skip
//!   the lookup);
//! - entries are keyed by the folio's address, and every path that removes
//!   a folio from the cache sets `DETACHED` and then calls
//!   [`BlockMap::forget`], and nothing re-creates the entry of a detached
//!   folio (checked under the map lock), so an address is never matched to
//!   a later folio's state;
//! - the byte count of set dirty bits over all entries is what this file
//!   contributes to the cache's dirty gauge: every function that sets or
//!   clears dirty bits returns the bytes it changed for the caller to book;
//! - a folio's [`FolioFlags::OWNER_PRIV`] means every block is dirty and
//!   uptodate: it is set (by the caller, from [`Dirtied::all`]) and cleared
//!   (by [`BlockMap::take_dirty`], the one function that clears dirty bits
//!   of a live folio; [`BlockMap::forget`] drops a detached folio's, which
//!   no writer touches again) under the folio's lock, so a writer holding
//!   that lock that sees it may skip the map.

use crate::filemap::{Folio, FolioFlags, PAGE_SIZE};
use crate::sync::{AtomicUsize, Lock, Ordering};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The map's hasher: its keys are folio addresses (distinct, 8-byte
/// aligned), which a multiplication spreads well enough; SipHash's
/// protection against chosen keys buys nothing here and cost a write path
/// about 270 instructions.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 3)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
    }
}

type Map = HashMap<usize, Bits, BuildHasherDefault<AddrHasher>>;

/// One bitmap: inline for folios of up to 64 blocks (no allocation on the
/// write path), on the heap beyond.
enum Words {
    One(u64),
    Many(Box<[u64]>),
}

impl Words {
    fn new(words: usize) -> Words {
        if words <= 1 {
            Words::One(0)
        } else {
            Words::Many(vec![0; words].into_boxed_slice())
        }
    }
}

impl core::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            Words::One(w) => core::slice::from_ref(w),
            Words::Many(v) => v,
        }
    }
}

impl core::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            Words::One(w) => core::slice::from_mut(w),
            Words::Many(v) => v,
        }
    }
}

/// A folio's two bitmaps.
struct Bits {
    nblocks: usize,
    uptodate: Words,
    dirty: Words,
}

fn test(map: &[u64], i: usize) -> bool {
    map[i / 64] & (1 << (i % 64)) != 0
}
fn set(map: &mut [u64], i: usize) {
    map[i / 64] |= 1 << (i % 64);
}

/// The bits of blocks `0..n` of a word array: all ones in full words, the
/// low `n % 64` bits in the last.
fn word_mask(n: usize, w: usize) -> u64 {
    let bits = n.saturating_sub(w * 64).min(64);
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

impl Bits {
    fn new(nblocks: usize, uptodate: bool) -> Bits {
        let words = nblocks.div_ceil(64);
        let mut b = Bits {
            nblocks,
            uptodate: Words::new(words),
            dirty: Words::new(words),
        };
        if uptodate {
            for (w, word) in b.uptodate.iter_mut().enumerate() {
                *word = word_mask(nblocks, w);
            }
        }
        b
    }
    fn all_uptodate(&self) -> bool {
        self.uptodate
            .iter()
            .enumerate()
            .all(|(w, &word)| word == word_mask(self.nblocks, w))
    }
    fn any_dirty(&self) -> bool {
        self.dirty.iter().any(|w| *w != 0)
    }
    fn all_dirty(&self) -> bool {
        self.dirty
            .iter()
            .enumerate()
            .all(|(w, &word)| word == word_mask(self.nblocks, w))
    }
}

/// What marking blocks dirty did: the bytes newly dirty, and whether every
/// block of the folio is now dirty and uptodate (the caller, holding the
/// folio's lock, then sets [`FolioFlags::OWNER_PRIV`]: a later write to the
/// folio changes no block state and skips the map).
#[must_use]
pub(crate) struct Dirtied {
    pub(crate) bytes: u64,
    pub(crate) all: bool,
}

/// Runs of consecutive block indices `(first, count)` among `0..n` for
/// which `pred` holds.
fn runs(n: usize, mut pred: impl FnMut(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        if pred(i) {
            let s = i;
            while i < n && pred(i) {
                i += 1;
            }
            out.push((s, i - s));
        } else {
            i += 1;
        }
    }
    out
}

/// Lock shards of a block map: writers of different folios of one file
/// (two jobs writing disjoint halves) rarely meet on one lock.
const SHARDS: usize = 16;

/// The block state of one file's folios.
pub(crate) struct BlockMap {
    shift: u32,
    /// Entries by folio address, over `SHARDS` locks (a folio's entry lives
    /// in the shard its address picks).
    maps: [Lock<Map>; SHARDS],
    partial: AtomicUsize,
}

fn key(f: &Folio) -> usize {
    f as *const Folio as usize
}

impl BlockMap {
    /// Blocks of `1 << shift` bytes.
    pub(crate) fn new(shift: u32) -> BlockMap {
        BlockMap {
            shift,
            maps: std::array::from_fn(|_| Lock::new(Map::default())),
            partial: AtomicUsize::new(0),
        }
    }

    /// The shard holding `f`'s entry.
    #[inline]
    fn shard(&self, f: &Folio) -> &Lock<Map> {
        let k = (key(f) >> 5).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.maps[(k >> (usize::BITS - 4)) % SHARDS]
    }

    /// Bytes per block.
    pub(crate) fn block_size(&self) -> usize {
        1 << self.shift
    }

    fn nblocks(&self, f: &Folio) -> usize {
        (f.nr_pages() as usize * PAGE_SIZE) >> self.shift
    }

    /// The first and one-past-last block touching bytes `from..to`.
    fn span(&self, from: usize, to: usize) -> (usize, usize) {
        (from >> self.shift, to.div_ceil(self.block_size()))
    }

    /// Drop an entry that became clean and wholly uptodate.
    fn settle(&self, map: &mut Map, k: usize, was_partial: bool) {
        let Some(b) = map.get(&k) else { return };
        let partial = !b.all_uptodate();
        if was_partial && !partial {
            self.partial.fetch_sub(1, Ordering::Relaxed);
        } else if !was_partial && partial {
            self.partial.fetch_add(1, Ordering::Relaxed);
        }
        if !partial && !b.any_dirty() {
            map.remove(&k);
        }
    }

    /// Give a new folio (not yet published) no uptodate block: its bytes
    /// are zeros to be filled block by block.
    pub(crate) fn new_empty(&self, f: &Folio) {
        let mut map = self.shard(f).lock();
        map.insert(key(f), Bits::new(self.nblocks(f), false));
        self.settle(&mut map, key(f), false);
    }

    /// Estimated heap bytes of the map: each shard's table (capacity times
    /// an entry, plus a control byte per bucket) and the bitmaps of folios
    /// over 64 blocks.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.maps
            .iter()
            .map(|m| {
                let m = m.lock();
                m.capacity() * (core::mem::size_of::<(usize, Bits)>() + 1)
                    + m.values()
                        .map(|b| match (&b.uptodate, &b.dirty) {
                            (Words::One(_), _) => 0,
                            _ => 2 * b.nblocks.div_ceil(64) * 8,
                        })
                        .sum::<usize>()
            })
            .sum()
    }

    /// Whether no folio of the file has a block that is not uptodate (one
    /// relaxed load, no lock).
    #[inline(always)]
    pub(crate) fn none_partial(&self) -> bool {
        self.partial.load(Ordering::Relaxed) == 0
    }

    /// Whether every block touching bytes `from..to` of `f` is uptodate:
    /// one relaxed load while no folio of the file is partial.
    #[inline(always)]
    pub(crate) fn is_uptodate(&self, f: &Folio, from: usize, to: usize) -> bool {
        self.partial.load(Ordering::Relaxed) == 0 || self.is_uptodate_slow(f, from, to)
    }

    #[cold]
    #[inline(never)]
    fn is_uptodate_slow(&self, f: &Folio, from: usize, to: usize) -> bool {
        let map = self.shard(f).lock();
        let Some(b) = map.get(&key(f)) else {
            return true;
        };
        let (s, e) = self.span(from, to);
        (s..e).all(|i| test(&b.uptodate, i))
    }

    /// Byte ranges (merged runs of blocks) among the blocks touching
    /// `from..to` that are not uptodate, leaving out blocks lying wholly
    /// inside `skip` (bytes a write is about to overwrite).
    pub(crate) fn missing(
        &self,
        f: &Folio,
        from: usize,
        to: usize,
        skip: (usize, usize),
    ) -> Vec<(usize, usize)> {
        if self.partial.load(Ordering::Relaxed) == 0 {
            return Vec::new(); // every folio of the file is wholly uptodate
        }
        let map = self.shard(f).lock();
        let Some(b) = map.get(&key(f)) else {
            return Vec::new();
        };
        let (s, e) = self.span(from, to);
        let bs = self.block_size();
        let need = |i: usize| {
            let (bf, bt) = ((s + i) * bs, (s + i + 1) * bs);
            let covered = skip.0 <= bf && bt <= skip.1;
            let uptodate = test(&b.uptodate, s + i);
            !uptodate && !covered
        };
        runs(e - s, need)
            .into_iter()
            .map(|(i, n)| ((s + i) * bs, (s + i + n) * bs))
            .collect()
    }

    /// Mark the blocks touching `from..to` uptodate (the caller filled or
    /// wholly wrote them, holding the folio's data lock for writing).
    pub(crate) fn set_uptodate(&self, f: &Folio, from: usize, to: usize) {
        if self.partial.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut map = self.shard(f).lock();
        let k = key(f);
        let Some(b) = map.get_mut(&k) else { return };
        let was = !b.all_uptodate();
        let (s, e) = self.span(from, to);
        for i in s..e {
            set(&mut b.uptodate, i);
        }
        self.settle(&mut map, k, was);
    }

    /// A write filled bytes `from..to` (the blocks it touches are all
    /// uptodate now): mark them uptodate and dirty under one lock. Returns
    /// the bytes newly dirty.
    pub(crate) fn wrote(&self, f: &Folio, from: usize, to: usize) -> Dirtied {
        let mut map = self.shard(f).lock();
        let k = key(f);
        let nb = self.nblocks(f);
        let b = map.entry(k).or_insert_with(|| Bits::new(nb, true));
        let was = !b.all_uptodate();
        let (s, e) = self.span(from, to);
        let mut newly = 0;
        for i in s..e {
            set(&mut b.uptodate, i);
            if !test(&b.dirty, i) {
                set(&mut b.dirty, i);
                newly += 1;
            }
        }
        let all = b.all_dirty() && b.all_uptodate();
        if was {
            self.settle(&mut map, k, was);
        }
        Dirtied {
            bytes: newly << self.shift,
            all,
        }
    }

    /// Mark the blocks touching `from..to` dirty (the caller holds the
    /// data lock for writing and the folio is live). Returns the bytes
    /// newly dirty.
    pub(crate) fn mark_dirty(&self, f: &Folio, from: usize, to: usize) -> Dirtied {
        let mut map = self.shard(f).lock();
        let k = key(f);
        let nb = self.nblocks(f);
        let b = map.entry(k).or_insert_with(|| Bits::new(nb, true));
        let (s, e) = self.span(from, to);
        let mut newly = 0;
        for i in s..e {
            if !test(&b.dirty, i) {
                set(&mut b.dirty, i);
                newly += 1;
            }
        }
        Dirtied {
            bytes: newly << self.shift,
            all: b.all_dirty() && b.all_uptodate(),
        }
    }

    /// Take every dirty block of `f` for writeback: clear the bits and
    /// return the runs `(first block, count)`, in order.
    pub(crate) fn take_dirty(&self, f: &Folio) -> Vec<(usize, usize)> {
        let mut map = self.shard(f).lock();
        let k = key(f);
        f.clear(FolioFlags::OWNER_PRIV);
        let Some(b) = map.get_mut(&k) else {
            return Vec::new();
        };
        let was = !b.all_uptodate();
        let out = runs(b.nblocks, |i| test(&b.dirty, i));
        b.dirty.iter_mut().for_each(|w| *w = 0);
        self.settle(&mut map, k, was);
        out
    }

    /// Dirty blocks `first..first + count` again after their write failed,
    /// unless the folio was detached meanwhile. Returns the bytes newly
    /// dirty (0 for blocks a writer re-dirtied already).
    pub(crate) fn redirty(&self, f: &Folio, first: usize, count: usize) -> u64 {
        let mut map = self.shard(f).lock();
        if f.test(FolioFlags::DETACHED) {
            return 0;
        }
        let nb = self.nblocks(f);
        let b = map.entry(key(f)).or_insert_with(|| Bits::new(nb, true));
        let mut newly = 0;
        for i in first..first + count {
            if !test(&b.dirty, i) {
                set(&mut b.dirty, i);
                newly += 1;
            }
        }
        newly << self.shift
    }

    /// Drop the state of a folio leaving the cache (after `DETACHED` was
    /// set). Returns the bytes of its dirty blocks.
    pub(crate) fn forget(&self, f: &Folio) -> u64 {
        let mut map = self.shard(f).lock();
        let Some(b) = map.remove(&key(f)) else {
            return 0;
        };
        if !b.all_uptodate() {
            self.partial.fetch_sub(1, Ordering::Relaxed);
        }
        let n: u32 = b.dirty.iter().map(|w| w.count_ones()).sum();
        (n as u64) << self.shift
    }

    /// Bytes of dirty blocks of `f`.
    #[cfg(test)]
    pub(crate) fn dirty_bytes(&self, f: &Folio) -> u64 {
        let map = self.shard(f).lock();
        map.get(&key(f)).map_or(0, |b| {
            (b.dirty.iter().map(|w| w.count_ones() as u64).sum::<u64>()) << self.shift
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_on_clean_blocks() {
        let dirty = [true, true, false, true, false, false, true, true, true];
        assert_eq!(
            runs(dirty.len(), |i| dirty[i]),
            vec![(0, 2), (3, 1), (6, 3)]
        );
        assert_eq!(runs(4, |_| false), vec![]);
    }

    #[test]
    fn a_write_reads_only_partial_blocks_it_does_not_cover() {
        let m = BlockMap::new(9); // 512 B blocks
        let f = Folio::new(0, 4).unwrap(); // 64 KiB: 128 blocks
        m.new_empty(&f);
        // Bytes 100..1700 touch blocks 0..=3; blocks 1 and 2 are covered.
        let miss = m.missing(&f, 100, 1700, (100, 1700));
        assert_eq!(miss, vec![(0, 512), (1536, 2048)]);
        m.set_uptodate(&f, 0, 2048);
        assert!(m.is_uptodate(&f, 0, 2048));
        assert!(!m.is_uptodate(&f, 0, 2049));
        assert_eq!(m.mark_dirty(&f, 100, 1700).bytes, 2048);
        assert_eq!(m.mark_dirty(&f, 600, 700).bytes, 0, "already dirty");
        assert_eq!(m.dirty_bytes(&f), 2048);
        assert_eq!(m.take_dirty(&f), vec![(0, 4)]);
        assert_eq!(m.dirty_bytes(&f), 0);
        assert_eq!(m.forget(&f), 0);
    }

    #[test]
    fn all_is_reported_only_when_every_block_is_dirty_and_uptodate() {
        let m = BlockMap::new(12);
        let f = Folio::new(0, 2).unwrap(); // 4 blocks
        m.new_empty(&f);
        let d = m.wrote(&f, 0, 3 * 4096);
        assert_eq!((d.bytes, d.all), (3 * 4096, false), "block 3 clean");
        let d = m.wrote(&f, 3 * 4096 + 10, 3 * 4096 + 20);
        assert_eq!((d.bytes, d.all), (4096, true));
        f.set(FolioFlags::OWNER_PRIV);
        assert_eq!(m.take_dirty(&f), vec![(0, 4)]);
        assert!(!f.test(FolioFlags::OWNER_PRIV), "writeback clears the hint");
        // Dirty but not uptodate everywhere: no hint.
        let g = Folio::new(4, 2).unwrap();
        m.new_empty(&g);
        let d = m.mark_dirty(&g, 0, 4 * 4096);
        assert!(!d.all);
    }

    #[test]
    fn redirty_skips_a_detached_folio() {
        let m = BlockMap::new(12);
        let f = Folio::new(0, 2).unwrap();
        assert_eq!(m.redirty(&f, 1, 2), 8192);
        f.set(FolioFlags::DETACHED);
        assert_eq!(m.forget(&f), 8192);
        assert_eq!(m.redirty(&f, 1, 2), 0);
        assert_eq!(m.forget(&f), 0);
    }
}
