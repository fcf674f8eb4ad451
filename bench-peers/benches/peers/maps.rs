//! The structures the peer benchmark compares, behind one static-dispatch
//! trait each (no virtual call inside a timed loop).
//!
//! - [`Map`]: build (insert every key), batched point lookups, ordered
//!   iteration; single-threaded peers take `&mut self` to insert.
//! - [`ConcMap`]: lookups from one thread while another stores and erases
//!   in the same structure (`&self` everywhere; `std` maps behind a
//!   `parking_lot::RwLock`).
//!
//! Every lookup batch returns the sum of the values found, so the compiler
//! cannot drop the loads, and the caller checks the count.

use kxarray::{ChunkedXArray, Entry, XArray};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher that passes the `u64` key through (the "no-op hash" baseline).
#[derive(Default)]
pub struct NoHash(u64);
impl Hasher for NoHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
pub type NoHashBuild = BuildHasherDefault<NoHash>;

/// Values are small integers (kxarray value entries hold 63 bits).
pub trait Map: Send + Sync + Sized {
    const NAME: &'static str;
    /// Keeps keys in order (iteration is measured).
    const ORDERED: bool;
    /// Works only for dense keys below its capacity (`Vec`).
    const DENSE_ONLY: bool = false;
    fn with_keys(max_key: u64) -> Self;
    fn insert(&mut self, k: u64, v: u64);
    /// Sum of the values at `probes` (missing keys add nothing) and how many
    /// were found.
    fn lookups(&self, probes: &[u64]) -> (u64, usize);
    /// Sum and count over an ordered walk of every entry.
    fn iterate(&self) -> (u64, usize);
    /// Whether `iterate` is measured on this build (ordered, and a walk
    /// that ends in reasonable time).
    fn can_iterate(&self) -> bool {
        Self::ORDERED
    }
    /// Bytes held in the structure's own slab, when it has one (kxarray's
    /// node cache), instead of the counting allocator's figure.
    fn own_bytes(&self) -> Option<usize> {
        None
    }
}

pub struct Kx(pub XArray<Box<u64>>);
impl Map for Kx {
    const NAME: &'static str = "kxarray";
    const ORDERED: bool = true;
    fn with_keys(_: u64) -> Self {
        Kx(XArray::new())
    }
    fn own_bytes(&self) -> Option<usize> {
        Some(self.0.memory_usage())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        // The shared-reference store (the lock per call), kxarray's normal
        // write path; `&mut` replace is in the write-path table.
        self.0.store(k, Entry::Value(v)).expect("store");
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let guard = kxarray::pin();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(v) = self.0.load(k, &guard).and_then(|e| e.value()) {
                s = s.wrapping_add(v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let guard = kxarray::pin();
        let (mut s, mut n) = (0u64, 0usize);
        for (_, e) in self.0.iter(&guard) {
            s = s.wrapping_add(e.value().unwrap_or(0));
            n += 1;
        }
        (s, n)
    }
}

/// kxarray with the per-call read path (`load_value`, a fresh guard per
/// key): shares the build of [`Kx`], only lookups differ.
pub fn kx_per_call(xa: &XArray<Box<u64>>, probes: &[u64]) -> (u64, usize) {
    let (mut s, mut n) = (0u64, 0usize);
    for &k in probes {
        if let Some(v) = xa.load_value(k) {
            s = s.wrapping_add(v);
            n += 1;
        }
    }
    (s, n)
}

/// The per-call path as `load_value` was before the light pins: a
/// crossbeam-pinned `kxarray::pin()` and `load` per key.
pub fn kx_pin_per_call(xa: &XArray<Box<u64>>, probes: &[u64]) -> (u64, usize) {
    let (mut s, mut n) = (0u64, 0usize);
    for &k in probes {
        let guard = kxarray::pin();
        if let Some(v) = xa.load(k, &guard).and_then(|e| e.value()) {
            s = s.wrapping_add(v);
            n += 1;
        }
    }
    (s, n)
}

pub struct Chunked(pub ChunkedXArray<Box<u64>>);
impl Map for Chunked {
    const NAME: &'static str = "kx chunked";
    const ORDERED: bool = true;
    fn with_keys(max_key: u64) -> Self {
        Chunked(ChunkedXArray::with_capacity(14, max_key).expect("shift"))
    }
    fn own_bytes(&self) -> Option<usize> {
        Some(self.0.memory_usage())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        self.0.store(k, Entry::Value(v)).expect("store");
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let guard = kxarray::pin();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(v) = self.0.load(k, &guard).and_then(|e| e.value()) {
                s = s.wrapping_add(v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let guard = kxarray::pin();
        let (mut s, mut n) = (0u64, 0usize);
        for (_, e) in self.0.iter(&guard) {
            s = s.wrapping_add(e.value().unwrap_or(0));
            n += 1;
        }
        (s, n)
    }
}

macro_rules! std_map {
    ($ty:ident, $name:expr, $ordered:expr, $inner:ty, $new:expr) => {
        pub struct $ty(pub $inner);
        impl Map for $ty {
            const NAME: &'static str = $name;
            const ORDERED: bool = $ordered;
            fn with_keys(_: u64) -> Self {
                $ty($new)
            }
            #[inline]
            fn insert(&mut self, k: u64, v: u64) {
                self.0.insert(k, v);
            }
            fn lookups(&self, probes: &[u64]) -> (u64, usize) {
                let (mut s, mut n) = (0u64, 0usize);
                for &k in probes {
                    if let Some(&v) = self.0.get(&k) {
                        s = s.wrapping_add(v);
                        n += 1;
                    }
                }
                (s, n)
            }
            fn iterate(&self) -> (u64, usize) {
                let (mut s, mut n) = (0u64, 0usize);
                for (_, &v) in self.0.iter() {
                    s = s.wrapping_add(v);
                    n += 1;
                }
                (s, n)
            }
        }
    };
}
std_map!(BTree, "BTreeMap", true, BTreeMap<u64, u64>, BTreeMap::new());
std_map!(HashSip, "HashMap", false, HashMap<u64, u64>, HashMap::new());
std_map!(
    HashNo,
    "HashMap nohash",
    false,
    HashMap<u64, u64, NoHashBuild>,
    HashMap::default()
);

pub struct Congee(pub congee::U64Congee<usize>);
impl Map for Congee {
    const NAME: &'static str = "congee";
    const ORDERED: bool = true;
    fn with_keys(_: u64) -> Self {
        Congee(congee::U64Congee::new())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        let g = congee::epoch::pin();
        self.0.insert(k, v as usize, &g).expect("congee insert");
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let g = congee::epoch::pin();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(v) = self.0.get(k, &g) {
                s = s.wrapping_add(v as u64);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        // congee's only scan fills a caller's buffer in key order.
        let g = congee::epoch::pin();
        let mut buf = vec![([0u8; 8], 0usize); 4096];
        let (mut s, mut n) = (0u64, 0usize);
        let mut from = 0u64;
        loop {
            let got = self.0.range(from, u64::MAX, &mut buf, &g);
            for (_, v) in &buf[..got] {
                s = s.wrapping_add(*v as u64);
            }
            n += got;
            if got < buf.len() {
                break (s, n);
            }
            let last = u64::from_be_bytes(buf[got - 1].0);
            match last.checked_add(1) {
                Some(f) => from = f,
                None => break (s, n),
            }
        }
    }
}

pub struct SccTree(pub scc::TreeIndex<u64, u64>);
impl Map for SccTree {
    const NAME: &'static str = "scc TreeIndex";
    const ORDERED: bool = true;
    fn with_keys(_: u64) -> Self {
        SccTree(scc::TreeIndex::new())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        let _ = self.0.insert_sync(k, v);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let g = scc::Guard::new();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(&v) = self.0.peek(&k, &g) {
                s = s.wrapping_add(v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let g = scc::Guard::new();
        let (mut s, mut n) = (0u64, 0usize);
        for (_, &v) in self.0.iter(&g) {
            s = s.wrapping_add(v);
            n += 1;
        }
        (s, n)
    }
}

pub struct SccHash(pub scc::HashIndex<u64, u64>);
impl Map for SccHash {
    const NAME: &'static str = "scc HashIndex";
    const ORDERED: bool = false;
    fn with_keys(_: u64) -> Self {
        SccHash(scc::HashIndex::new())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        let _ = self.0.insert_sync(k, v);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let g = scc::Guard::new();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(&v) = self.0.peek(&k, &g) {
                s = s.wrapping_add(v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        (0, 0)
    }
}

pub struct Skip(pub crossbeam_skiplist::SkipMap<u64, u64>);
impl Map for Skip {
    const NAME: &'static str = "SkipMap";
    const ORDERED: bool = true;
    fn with_keys(_: u64) -> Self {
        Skip(crossbeam_skiplist::SkipMap::new())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        self.0.insert(k, v);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(e) = self.0.get(&k) {
                s = s.wrapping_add(*e.value());
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for e in self.0.iter() {
            s = s.wrapping_add(*e.value());
            n += 1;
        }
        (s, n)
    }
}

pub struct Papaya(pub papaya::HashMap<u64, u64>);
impl Map for Papaya {
    const NAME: &'static str = "papaya";
    const ORDERED: bool = false;
    fn with_keys(_: u64) -> Self {
        Papaya(papaya::HashMap::new())
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        self.0.pin().insert(k, v);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let m = self.0.pin();
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(&v) = m.get(&k) {
                s = s.wrapping_add(v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        (0, 0)
    }
}

/// `Vec<Option<u64>>` indexed by key: the floor, dense keys only.
pub struct Flat(pub Vec<Option<u64>>);
impl Map for Flat {
    const NAME: &'static str = "Vec";
    const ORDERED: bool = true;
    const DENSE_ONLY: bool = true;
    fn with_keys(max_key: u64) -> Self {
        Flat(vec![None; max_key as usize + 1])
    }
    #[inline]
    fn insert(&mut self, k: u64, v: u64) {
        self.0[k as usize] = Some(v);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(Some(v)) = self.0.get(k as usize) {
                s = s.wrapping_add(*v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for v in self.0.iter().flatten() {
            s = s.wrapping_add(*v);
            n += 1;
        }
        (s, n)
    }
}

/// The `xarray` crate (asterinas), nightly only: `Box<u64>` items (it
/// stores pointers only), `&mut` stores, borrowed loads.
/// Its `range` steps the cursor through every index (empty ones too), so
/// iteration is measured only for dense keys (the largest key is kept).
#[cfg(feature = "nightly-xarray")]
pub struct Aster(pub xarray::XArray<Box<u64>>, u64);
#[cfg(feature = "nightly-xarray")]
impl Map for Aster {
    const NAME: &'static str = "xarray crate";
    const ORDERED: bool = true;
    fn with_keys(max_key: u64) -> Self {
        Aster(xarray::XArray::new(), max_key)
    }
    fn can_iterate(&self) -> bool {
        self.1 < 1 << 24
    }
    fn insert(&mut self, k: u64, v: u64) {
        self.0.store(k, Box::new(v));
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for &k in probes {
            if let Some(v) = self.0.load(k) {
                s = s.wrapping_add(**v);
                n += 1;
            }
        }
        (s, n)
    }
    fn iterate(&self) -> (u64, usize) {
        let (mut s, mut n) = (0u64, 0usize);
        for (_, v) in self.0.range(0..self.1 + 1) {
            s = s.wrapping_add(**v);
            n += 1;
        }
        (s, n)
    }
}

/// Shared-reference maps for the one-writer test.
pub trait ConcMap: Send + Sync {
    const NAME: &'static str;
    fn put(&self, k: u64, v: u64);
    fn del(&self, k: u64);
    fn lookups(&self, probes: &[u64]) -> (u64, usize);
}

impl ConcMap for Kx {
    const NAME: &'static str = "kxarray";
    fn put(&self, k: u64, v: u64) {
        self.0.store(k, Entry::Value(v)).expect("store");
    }
    fn del(&self, k: u64) {
        self.0.erase(k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
impl ConcMap for Chunked {
    const NAME: &'static str = "kx chunked";
    fn put(&self, k: u64, v: u64) {
        self.0.store(k, Entry::Value(v)).expect("store");
    }
    fn del(&self, k: u64) {
        self.0.erase(k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}

/// A `std` map behind a `parking_lot::RwLock` (one read lock per lookup
/// batch would starve the writer, so each lookup takes the read lock).
pub struct Locked<M>(pub RwLock<M>);
macro_rules! locked {
    ($m:ty, $name:expr) => {
        impl ConcMap for Locked<$m> {
            const NAME: &'static str = $name;
            fn put(&self, k: u64, v: u64) {
                self.0.write().insert(k, v);
            }
            fn del(&self, k: u64) {
                self.0.write().remove(&k);
            }
            fn lookups(&self, probes: &[u64]) -> (u64, usize) {
                let (mut s, mut n) = (0u64, 0usize);
                for &k in probes {
                    if let Some(&v) = self.0.read().get(&k) {
                        s = s.wrapping_add(v);
                        n += 1;
                    }
                }
                (s, n)
            }
        }
    };
}
locked!(BTreeMap<u64, u64>, "RwLock<BTreeMap>");
locked!(HashMap<u64, u64, NoHashBuild>, "RwLock<HashMap nohash>");

impl ConcMap for Congee {
    const NAME: &'static str = "congee";
    fn put(&self, k: u64, v: u64) {
        let g = congee::epoch::pin();
        let _ = self.0.insert(k, v as usize, &g);
    }
    fn del(&self, k: u64) {
        let g = congee::epoch::pin();
        self.0.remove(k, &g);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
impl ConcMap for SccTree {
    const NAME: &'static str = "scc TreeIndex";
    fn put(&self, k: u64, v: u64) {
        let _ = self.0.insert_sync(k, v);
    }
    fn del(&self, k: u64) {
        self.0.remove_sync(&k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
impl ConcMap for SccHash {
    const NAME: &'static str = "scc HashIndex";
    fn put(&self, k: u64, v: u64) {
        let _ = self.0.insert_sync(k, v);
    }
    fn del(&self, k: u64) {
        self.0.remove_sync(&k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
impl ConcMap for Skip {
    const NAME: &'static str = "SkipMap";
    fn put(&self, k: u64, v: u64) {
        self.0.insert(k, v);
    }
    fn del(&self, k: u64) {
        self.0.remove(&k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
impl ConcMap for Papaya {
    const NAME: &'static str = "papaya";
    fn put(&self, k: u64, v: u64) {
        self.0.pin().insert(k, v);
    }
    fn del(&self, k: u64) {
        self.0.pin().remove(&k);
    }
    fn lookups(&self, probes: &[u64]) -> (u64, usize) {
        Map::lookups(self, probes)
    }
}
