//! Shared harness of the `api` fuzz target: the whole XArray API on items
//! and values, against a model, with drop counting.
//!
//! Included by `fuzz/fuzz_targets/api.rs` and by `tests/fuzz_replay.rs`
//! (through `tests/fuzz_common/mod.rs`), so the fuzzer and `cargo test`
//! run inputs with the same code.
//!
//! Items are `Box<Tracked>`: every drop is counted per item id (a second
//! drop, or a drop while the harness holds a reference under its guard,
//! fails the run) and clobbers a canary that the harness checks through the
//! references it holds. At the end of a run, after the array is dropped and
//! the epoch flushed, every item must have been dropped exactly once.
//!
//! The model is a `BTreeMap` of first index -> (entry, order, marks), with
//! the kernel's semantics (see `fuzz_common/mod.rs`) plus reserved entries
//! (`insert(None)`, `reserve`, `alloc(None)`: read as empty, block
//! `insert` and `alloc`). After every op the whole array is compared with
//! it (`check_invariants`, `iter`, `iter_marked`, per-entry probes).
//!
//! Known defects: the `known_defect_ops` mask of [`run`] (classes in
//! [`defect`]) gates the operations that reach the known open defects of
//! the tree's integrity: range stores over
//! unaligned ranges and up to the whole index space, cursors reused after
//! their lock was dropped without a `reset`, partial splits of marked
//! entries across a node level. With a class off its inputs are mapped to
//! safe variants (aligned ranges, a `reset` before reuse, unmarked entries
//! skipped). The fuzz target turns every class on; `cargo test` replays the
//! saved corpus with them on only when [`KNOWN_DEFECTS_FIXED`]. Inputs that
//! reproduce a known defect are kept in `fuzz/regressions/api/` (and as
//! [`known_defect_seeds`]), not in the corpus.

mod cursors;

use super::api_model::{align, end, ApiModel, Kind, ME};
use arbitrary::{Arbitrary, Unstructured};
use kxarray::{fault, Entry, EntryRef, Error, Flags, Mark, XArray, XaState, MAX_VALUE};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// At most this many ops per input.
pub(crate) const MAX_OPS: usize = 200;

const LIVE: u64 = 0x11fe_c0de_0000_0000;
const DEAD: u64 = 0xdead_dead_dead_dead;

/// Drop count per item id. Global, not per thread: a deferred drop runs on
/// whichever thread collects the epoch garbage (another test's, in a
/// parallel `cargo test`). Ids are unique across runs and threads.
static DROPS: Mutex<BTreeMap<u64, u8>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn drops_map() -> std::sync::MutexGuard<'static, BTreeMap<u64, u8>> {
    DROPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fuzzed item: knows its id; its drop is counted.
#[derive(Debug)]
pub(crate) struct Tracked {
    id: u64,
    canary: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        assert_eq!(self.canary, LIVE ^ self.id, "item dropped twice or torn");
        self.canary = DEAD;
        *drops_map().entry(self.id).or_insert(0) += 1;
    }
}

fn drops(id: u64) -> u8 {
    drops_map().get(&id).copied().unwrap_or(0)
}

/// Flip to `true` when the known defects are fixed:
/// `cargo test` then replays the corpus and `fuzz/regressions/api/` with
/// every operation on, and CI fuzzes with them on.
pub(crate) const KNOWN_DEFECTS_FIXED: bool = true;

/// The known-defect operation classes (bits of the `known_defect_ops`
/// mask): each reaches one known defect.
pub(crate) mod defect {
    /// `store_range` over unaligned ranges (unaligned entries; splits of
    /// them panic).
    pub(crate) const RANGE: u8 = 1;
    /// `store_range` up to `u64::MAX`, including `0..=u64::MAX`.
    pub(crate) const WHOLE_RANGE: u8 = 2;
    /// A cursor stores after its lock was dropped and the array changed,
    /// without `reset` (stale revalidation).
    pub(crate) const STALE_CURSOR: u8 = 4;
    /// A partial split of a marked entry across a node level.
    pub(crate) const SPLIT_MARKS: u8 = 8;
    /// Every class.
    pub(crate) const ALL: u8 = 15;
    /// Names for `KX_FUZZ_KNOWN_DEFECT_OPS`.
    pub(crate) const NAMES: [(&str, u8); 4] = [
        ("range", RANGE),
        ("whole_range", WHOLE_RANGE),
        ("stale_cursor", STALE_CURSOR),
        ("split_marks", SPLIT_MARKS),
    ];
}

/// The known-defect classes to turn on: `KX_FUZZ_KNOWN_DEFECT_OPS` is `0`
/// (none), `1` (all) or a comma list of [`defect::NAMES`]; unset, `on`
/// picks all or none (the fuzz target: all; the replay:
/// [`KNOWN_DEFECTS_FIXED`]).
pub(crate) fn known_defect_ops(on: bool) -> u8 {
    match std::env::var("KX_FUZZ_KNOWN_DEFECT_OPS").as_deref() {
        Ok("1") => defect::ALL,
        Ok("0") => 0,
        Ok(list) => list
            .split(',')
            .map(|n| {
                defect::NAMES
                    .iter()
                    .find(|(k, _)| *k == n.trim())
                    .unwrap_or_else(|| panic!("KX_FUZZ_KNOWN_DEFECT_OPS: unknown class {n:?}"))
                    .1
            })
            .fold(0, |a, b| a | b),
        Err(_) if on => defect::ALL,
        Err(_) => 0,
    }
}

/// One operation; raw fuzzer numbers are mapped by [`ix`], [`ord`], ...
#[derive(Arbitrary, Debug, Clone)]
pub(crate) enum ApiOp {
    /// `store_order` (order 0: `store`) of an item (`kind` 0), a value or
    /// nothing (`kind` 255: erase the block through a cursor).
    Store {
        index: u16,
        order: u8,
        kind: u8,
        fault: u8,
    },
    /// `store_range(first, first + len, value)`.
    StoreRange {
        first: u16,
        len: u16,
        value: Option<u8>,
    },
    /// `erase`.
    Erase { index: u16 },
    /// `insert` of an item (`kind` 0), a value, or a reservation (`None`).
    Insert { index: u16, kind: Option<u8> },
    /// `reserve`.
    Reserve { index: u16 },
    /// `release`.
    Release { index: u16 },
    /// `cmpxchg`: `old` % 4: 0 = None, 1 = the current entry, 2 = some
    /// value, 3 = `cmpxchg_reserved`; `new` 0 = None, 1 = an item, else a
    /// value.
    Cmpxchg { index: u16, old: u8, new: u8 },
    /// `alloc` in `start..=start+len` of an item, a value or a reservation.
    Alloc {
        start: u8,
        len: u8,
        kind: Option<u8>,
    },
    /// `alloc_cyclic` in `start..=start+len` from `next`.
    AllocCyclic {
        start: u8,
        len: u8,
        next: u8,
        kind: Option<u8>,
    },
    /// `set_mark` / `clear_mark`.
    Mark { index: u16, mark: u8, set: bool },
    /// A uniform (`split_alloc`/`split`) or partial (`try_split_alloc`/
    /// `try_split`) split of the value entry at `index`.
    Split {
        index: u16,
        down: u8,
        partial: bool,
        wrong: u8,
    },
    /// A cursor walk from `start`: `how` % 4 = next, prev, find,
    /// find_marked; paused every `pause` steps (0: never).
    Walk {
        start: u16,
        max: u16,
        how: u8,
        pause: u8,
        mark: u8,
    },
    /// A cursor loads at `at`, the array is written through another path
    /// (`write` % 3: store_order, erase, store_range) while the cursor holds
    /// no lock, then the cursor stores `value` under a new lock.
    Stale {
        at: u16,
        write: u8,
        index: u16,
        order: u8,
        value: u8,
    },
    /// Hold a reference to the item at `index` under the harness's guard.
    Hold { index: u16 },
    /// Drop the held references and the guard.
    Unhold,
    /// Pin/flush cycles, so deferred frees run during the run.
    Flush,
    /// `load`, `get_order`, `get_mark` probes at `index`.
    Probe { index: u16 },
}

/// The input: array flags, then ops.
#[derive(Arbitrary, Debug, Clone)]
pub(crate) struct ApiInput {
    pub flags: u8,
    pub ops: Vec<ApiOp>,
}

/// Indices: mostly 0..=255, some up to 16383, a few near 2^32 and u64::MAX.
pub(crate) fn ix(raw: u16) -> u64 {
    match raw >> 13 {
        0..=4 => (raw & 0xff) as u64,
        5 | 6 => (raw & 0x3fff) as u64,
        _ => {
            let base = if raw & 0x1000 != 0 {
                u64::MAX - 4095
            } else {
                1 << 32
            };
            base + (raw & 0xfff) as u64
        }
    }
}

/// Orders: mostly 0..=9, sometimes 12 or 18.
pub(crate) fn ord(raw: u8) -> u32 {
    match raw {
        0xf0..=0xf7 => 12,
        0xf8..=0xff => 18,
        _ => (raw % 10) as u32,
    }
}

struct Harness {
    xa: XArray<Box<Tracked>>,
    model: ApiModel,
    alloc_flags: Option<bool>, // Some(zero_busy) on allocating arrays
    created: Vec<u64>,
    step: usize,
    known_defect_ops: u8,
    tall_ok: bool,
    hold: Option<kxarray::Guard>,
    held: Vec<(*const Tracked, u64)>,
}

fn mark_of(raw: u8, alloc: bool) -> Mark {
    if alloc {
        // mark 0 is the free-ID mark on allocating arrays
        [Mark::M1, Mark::M2][(raw % 2) as usize]
    } else {
        Mark::ALL[(raw % 3) as usize]
    }
}

impl Harness {
    fn on(&self, class: u8) -> bool {
        self.known_defect_ops & class != 0
    }

    fn fail(&self, op: &ApiOp, msg: String) -> ! {
        panic!(
            "step {} {:?}: {}\nmodel: {:?}\n{}",
            self.step,
            op,
            msg,
            self.model.map,
            self.xa.dump()
        );
    }

    fn new_item(&mut self) -> (Entry<Box<Tracked>>, Kind) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.created.push(id);
        (
            Entry::Item(Box::new(Tracked {
                id,
                canary: LIVE ^ id,
            })),
            Kind::Item(id),
        )
    }

    fn entry(&mut self, kind: u8) -> (Entry<Box<Tracked>>, Kind) {
        match kind {
            0 => self.new_item(),
            254 => (Entry::Value(MAX_VALUE), Kind::Value(MAX_VALUE)),
            k => (Entry::Value(k as u64), Kind::Value(k as u64)),
        }
    }

    fn kind_of(e: Option<EntryRef<'_, Box<Tracked>>>) -> Option<Kind> {
        e.map(|e| match e {
            EntryRef::Item(r) => {
                let t = r.get();
                assert_eq!(t.canary, LIVE ^ t.id, "item {} read after its drop", t.id);
                Kind::Item(t.id)
            }
            EntryRef::Value(v) => Kind::Value(v),
        })
    }

    fn visible(k: Kind) -> Option<Kind> {
        (k != Kind::Reserved).then_some(k)
    }

    fn check_old(&self, op: &ApiOp, got: Option<Kind>, want: Option<Option<Kind>>) {
        if let Some(w) = want {
            let w = w.and_then(Self::visible);
            if got != w {
                self.fail(op, format!("returned old {got:?}, want {w:?}"));
            }
        }
    }

    fn check_all(&self, op: &ApiOp) {
        if let Err(e) = self.xa.check_invariants() {
            // A split leaves the tree tall (as the kernel's does), and an
            // allocating array keeps a node for the free mark of index 0
            // (the kernel's xas_shrink stops there too); check_invariants
            // reports both as "tree not minimal".
            let tall_ok = self.tall_ok || self.alloc_flags.is_some();
            if !(tall_ok && e.starts_with("tree not minimal")) {
                self.fail(op, format!("invariant: {e}"));
            }
        }
        let alloc = self.alloc_flags.is_some();
        let guard = kxarray::pin();
        let got: Vec<(u64, Option<Kind>)> = self
            .xa
            .iter(&guard)
            .map(|(i, e)| (i, Self::kind_of(Some(e))))
            .collect();
        let want: Vec<(u64, Option<Kind>)> = self
            .model
            .map
            .iter()
            .filter(|(_, e)| e.kind != Kind::Reserved)
            .map(|(&s, e)| (s, Some(e.kind)))
            .collect();
        if got != want {
            self.fail(op, format!("iter {got:?}\n want {want:?}"));
        }
        for m in Mark::ALL {
            if alloc && m == Mark::M0 {
                continue;
            }
            let got: Vec<u64> = self.xa.iter_marked(.., m, &guard).map(|(i, _)| i).collect();
            let want: Vec<u64> = self
                .model
                .map
                .iter()
                .filter(|(_, e)| e.marks & (1 << m.index()) != 0 && e.kind != Kind::Reserved)
                .map(|(&s, _)| s)
                .collect();
            if got != want {
                self.fail(op, format!("iter_marked {m:?} {got:?}, want {want:?}"));
            }
        }
        let stride = self.model.map.len() / 48 + 1;
        for (&s, e) in self.model.map.iter().step_by(stride) {
            for i in [s, end(s, e.order), s + (end(s, e.order) - s) / 3] {
                let got = Self::kind_of(self.xa.load(i, &guard));
                if got != Self::visible(e.kind) {
                    self.fail(op, format!("load({i:#x}) = {got:?}, want {e:?}"));
                }
                if e.kind != Kind::Reserved && self.xa.get_order(i) != e.order {
                    self.fail(op, format!("get_order({i:#x}) = {}", self.xa.get_order(i)));
                }
            }
            for i in [s.wrapping_sub(1), end(s, e.order).wrapping_add(1)] {
                let want = self
                    .model
                    .covering(i)
                    .and_then(|(_, e)| Self::visible(e.kind));
                let got = Self::kind_of(self.xa.load(i, &guard));
                if got != want {
                    self.fail(op, format!("load({i:#x}) = {got:?}, want {want:?}"));
                }
            }
        }
        // drops: nothing in the array or held was dropped; nothing twice
        for e in self.model.map.values() {
            if let Kind::Item(id) = e.kind {
                if drops(id) != 0 {
                    self.fail(op, format!("item {id} in the array was dropped"));
                }
            }
        }
        for &(p, id) in &self.held {
            if drops(id) != 0 {
                self.fail(op, format!("item {id} dropped while referenced"));
            }
            // SAFETY: the harness's guard has been pinned since the
            // reference was loaded, so the item is not freed (that is what
            // is being checked; a premature free shows as a bad canary here
            // or as a use-after-free under AddressSanitizer).
            let c = unsafe { (*p).canary };
            if c != LIVE ^ id {
                self.fail(op, format!("held item {id} clobbered: {c:#x}"));
            }
        }
    }

    fn apply(&mut self, op: &ApiOp) {
        let alloc = self.alloc_flags.is_some();
        if self.alloc_flags == Some(true) {
            // On an ALLOC1 array index 0 holds a reservation once the tree
            // has a node (the kernel's xas_create does the same), so
            // insert/cmpxchg/reserve/release at 0 answer differently on an
            // empty and a non-empty array, and a mark set on the empty
            // index 0 sticks to the next entry stored there. The model does
            // not track that placeholder; tests/found_by_fuzz.rs
            // (`alloc1_index0_*`) pins the behaviour and
            // docs/kernel-differences.md ("Kernel behaviour kept on purpose")
            // explains it.
            if let ApiOp::Insert { index, .. }
            | ApiOp::Reserve { index }
            | ApiOp::Release { index }
            | ApiOp::Mark { index, .. }
            | ApiOp::Cmpxchg { index, .. } = *op
            {
                if ix(index) == 0 {
                    return;
                }
            }
        }
        if alloc && matches!(op, ApiOp::StoreRange { .. }) {
            // Found by this target, not a known defect (tests/found_by_fuzz.rs,
            // `alloc_after_store_range_overwrites_it`): store_range leaves
            // the free mark set on allocating arrays. Skipped there.
            return;
        }
        match *op {
            ApiOp::Store {
                index,
                order,
                kind,
                fault: f,
            } => {
                let o = ord(order);
                let s = align(ix(index), o);
                if kind == 255 {
                    if self.alloc_flags == Some(true) && s == 0 {
                        // a raw cursor erase over index 0 of an ALLOC1
                        // array frees index 0 for alloc (in the kernel too:
                        // xas_store(NULL) sets the free mark); not modelled
                        return;
                    }
                    let guard = kxarray::pin();
                    let lock = self.xa.lock();
                    let mut xas = XaState::with_order(&self.xa, &guard, s, o).unwrap();
                    if let Err(r) = xas.store(&lock, None) {
                        self.fail(op, format!("erase store: {:?}", r.error));
                    }
                    drop(lock);
                    self.model.erase_block(s, o);
                    return;
                }
                let (e, k) = self.entry(kind);
                let faults = (f % 4) as u64;
                fault::fail_next_allocations(if f >= 0xfc { faults } else { 0 });
                let r = self.xa.store_order(s, o, e);
                fault::fail_next_allocations(0);
                match r {
                    Ok(old) => {
                        let got = old.as_ref().map(|r| Self::kind_of(Some(r.get())).unwrap());
                        drop(old);
                        let want = self.model.store(s, o, k);
                        self.check_old(op, got, want);
                    }
                    Err(r) if r.error == Error::NoMemory && f >= 0xfc => {
                        if r.entry.is_none() {
                            self.fail(op, "rejected store lost its entry".into());
                        }
                    }
                    Err(r) => self.fail(op, format!("store_order: {:?}", r.error)),
                }
            }
            ApiOp::StoreRange { first, len, value } => {
                let f = ix(first);
                let whole = self.on(defect::WHOLE_RANGE);
                let (f, l) = if whole && len == 0xffff {
                    (0, u64::MAX)
                } else if whole && len == 0xfffe {
                    (f, u64::MAX)
                } else if self.on(defect::RANGE) {
                    (f, f.saturating_add(len as u64 % 300))
                } else {
                    let o = (len % 10) as u32;
                    let s = align(f, o);
                    (s, end(s, o))
                };
                let v = value.map(|v| v as u64);
                if let Err(e) = self.xa.store_range(f, l, v) {
                    self.fail(op, format!("store_range({f:#x}, {l:#x}): {e:?}"));
                }
                self.model.store_range(f, l, v);
            }
            ApiOp::Erase { index } => {
                let i = ix(index);
                let got = self
                    .xa
                    .erase(i)
                    .map(|r| Self::kind_of(Some(r.get())).unwrap());
                let want = self.model.covering(i).map(|(s, e)| {
                    self.model.map.remove(&s);
                    e.kind
                });
                if got != want.and_then(Self::visible) {
                    self.fail(op, format!("erase({i:#x}) = {got:?}, want {want:?}"));
                }
            }
            ApiOp::Insert { index, kind } => {
                let i = ix(index);
                let (e, k) = match kind {
                    None => (None, Kind::Reserved),
                    Some(k) => {
                        let (e, k) = self.entry(k);
                        (Some(e), k)
                    }
                };
                let busy = self.model.covering(i).is_some();
                match self.xa.insert(i, e) {
                    Ok(()) if !busy => {
                        self.model.store(i, 0, k);
                    }
                    Err(r) if busy && r.error == Error::Busy => {
                        if (r.entry.is_none()) != (k == Kind::Reserved) {
                            self.fail(op, "insert did not hand the entry back".into());
                        }
                    }
                    r => self.fail(
                        op,
                        format!("insert({i:#x}) = {:?}, busy {busy}", r.map_err(|r| r.error)),
                    ),
                }
            }
            ApiOp::Reserve { index } => {
                let i = ix(index);
                if let Err(e) = self.xa.reserve(i) {
                    self.fail(op, format!("reserve: {e:?}"));
                }
                if self.model.covering(i).is_none() {
                    self.model.map.insert(
                        i,
                        ME {
                            kind: Kind::Reserved,
                            order: 0,
                            marks: 0,
                        },
                    );
                }
            }
            ApiOp::Release { index } => {
                let i = ix(index);
                self.xa.release(i);
                if let Some((s, e)) = self.model.covering(i) {
                    if e.kind == Kind::Reserved {
                        self.model.map.remove(&s);
                    }
                }
            }
            ApiOp::Cmpxchg { index, old, new } => self.cmpxchg(op, ix(index), old, new),
            ApiOp::Alloc { start, len, kind }
            | ApiOp::AllocCyclic {
                start, len, kind, ..
            } => {
                let (lo, hi) = (start as u64, start as u64 + len as u64);
                let (e, k) = match kind {
                    None => (None, Kind::Reserved),
                    Some(k) => {
                        let (e, k) = self.entry(k);
                        (Some(e), k)
                    }
                };
                let Some(zero_busy) = self.alloc_flags else {
                    match self.xa.alloc(lo..=hi, e) {
                        Err(r) if r.error == Error::NotAllocating => return,
                        r => self.fail(
                            op,
                            format!("alloc on a plain array: {:?}", r.map_err(|r| r.error)),
                        ),
                    }
                };
                let (r, want) = if let ApiOp::AllocCyclic { next, .. } = *op {
                    let mut nx = next as u64;
                    let from = lo.max(nx);
                    let want = (from <= hi)
                        .then(|| self.model.first_free(from, hi, zero_busy))
                        .flatten()
                        .or_else(|| self.model.first_free(lo, hi, zero_busy));
                    let r = self.xa.alloc_cyclic(lo..=hi, &mut nx, e).map(|(id, _)| id);
                    if let Ok(id) = r {
                        if nx != id + 1 {
                            self.fail(op, format!("next = {nx} after id {id}"));
                        }
                    }
                    (r, want)
                } else {
                    let want = self.model.first_free(lo, hi, zero_busy);
                    (self.xa.alloc(lo..=hi, e), want)
                };
                match (r, want) {
                    (Ok(id), Some(w)) if id == w => {
                        self.model.store(id, 0, k);
                    }
                    (Err(r), None) if r.error == Error::Busy => {}
                    (r, w) => self.fail(
                        op,
                        format!("alloc = {:?}, want {w:?}", r.map_err(|r| r.error)),
                    ),
                }
                let _ = alloc;
            }
            ApiOp::Mark { index, mark, set } => {
                let i = ix(index);
                let m = mark_of(mark, alloc);
                if self
                    .model
                    .covering(i)
                    .is_some_and(|(_, e)| e.kind == Kind::Reserved)
                {
                    return; // marks on reservations: not modelled
                }
                if set {
                    self.xa.set_mark(i, m);
                } else {
                    self.xa.clear_mark(i, m);
                }
                if let Some((s, _)) = self.model.covering(i) {
                    let e = self.model.map.get_mut(&s).unwrap();
                    if set {
                        e.marks |= 1 << m.index();
                    } else {
                        e.marks &= !(1 << m.index());
                    }
                }
            }
            ApiOp::Split {
                index,
                down,
                partial,
                wrong,
            } => self.split(op, ix(index), down, partial, wrong),
            ApiOp::Walk {
                start,
                max,
                how,
                pause,
                mark,
            } => self.walk(op, ix(start), ix(max), how, pause, mark_of(mark, alloc)),
            ApiOp::Stale {
                at,
                write,
                index,
                order,
                value,
            } => self.stale(op, ix(at), write, ix(index), ord(order), value as u64),
            ApiOp::Hold { index } => {
                let i = ix(index);
                let g = self.hold.get_or_insert_with(kxarray::pin);
                if let Some(EntryRef::Item(r)) = self.xa.load(i, g) {
                    let t = r.get();
                    self.held.push((t as *const Tracked, t.id));
                }
            }
            ApiOp::Unhold => {
                self.held.clear();
                self.hold = None;
            }
            ApiOp::Flush => {
                for _ in 0..4 {
                    kxarray::pin().flush();
                }
            }
            ApiOp::Probe { index } => {
                let i = ix(index);
                let guard = kxarray::pin();
                let want = self.model.covering(i);
                let got = Self::kind_of(self.xa.load(i, &guard));
                if got != want.and_then(|(_, e)| Self::visible(e.kind)) {
                    self.fail(op, format!("load({i:#x}) = {got:?}, want {want:?}"));
                }
                if let Some((_, e)) = want.filter(|(_, e)| e.kind != Kind::Reserved) {
                    for m in Mark::ALL {
                        if alloc && m == Mark::M0 {
                            continue;
                        }
                        let w = e.marks & (1 << m.index()) != 0;
                        if self.xa.get_mark(i, m) != w {
                            self.fail(op, format!("get_mark({i:#x}, {m:?}) != {w}"));
                        }
                    }
                }
            }
        }
    }

    /// `old % 4`: 0 = None (matches only an empty index, not a
    /// reservation), 1 = the current entry, 2 = some value, 3 =
    /// `cmpxchg_reserved` (matches only a reservation). Kernel semantics
    /// (`__xa_cmpxchg_raw`): replacing with `None` erases, also on
    /// allocating arrays.
    fn cmpxchg(&mut self, op: &ApiOp, i: u64, old: u8, new: u8) {
        let cur = self.model.covering(i);
        let cur_kind = cur.map(|(_, e)| e.kind);
        let (e, k) = match new {
            0 => (None, None),
            1 => {
                let (e, k) = self.new_item();
                (Some(e), Some(k))
            }
            253 => (
                Some(Entry::Value(MAX_VALUE + 1)),
                Some(Kind::Value(MAX_VALUE + 1)),
            ),
            v => (Some(Entry::Value(v as u64)), Some(Kind::Value(v as u64))),
        };
        let apply = |model: &mut ApiModel| match k {
            Some(k) => {
                model.store(i, 0, k);
            }
            None => {
                if let Some((s, _)) = cur {
                    model.map.remove(&s);
                }
            }
        };
        if old % 4 == 3 {
            let matches = cur_kind == Some(Kind::Reserved);
            let bad = matches!(k, Some(Kind::Value(v)) if v > MAX_VALUE);
            match self.xa.cmpxchg_reserved(i, e) {
                Ok(()) if matches && !bad => apply(&mut self.model),
                Err(r) if bad && matches!(r.error, Error::ValueOutOfRange(_)) => {}
                Err(r) if !matches && !bad && r.error == Error::Mismatch => {}
                r => self.fail(
                    op,
                    format!(
                        "cmpxchg_reserved({i:#x}) = {:?}, cur {cur_kind:?}",
                        r.map_err(|r| r.error)
                    ),
                ),
            }
            return;
        }
        let guard = kxarray::pin();
        let old_ref = match old % 4 {
            0 => None,
            1 => match self.xa.load(i, &guard) {
                Some(e) => Some(e),
                None => return,
            },
            // out of range: a typed error, never a
            // match (1 << 63 once compared equal to a stored 0)
            _ if old & 0x80 != 0 => Some(EntryRef::Value(1 << 63)),
            _ => Some(EntryRef::Value(7)),
        };
        let out_of_range = matches!(old_ref, Some(EntryRef::Value(v)) if v > MAX_VALUE)
            || matches!(k, Some(Kind::Value(v)) if v > MAX_VALUE);
        let old_kind = Self::kind_of(old_ref);
        let matches = match old_kind {
            None => cur_kind.is_none(),
            Some(k) => cur_kind == Some(k),
        };
        let r = self.xa.cmpxchg(i, old_ref, e, &guard);
        match r {
            Ok(prev) if matches && !out_of_range => {
                let got = Self::kind_of(prev);
                if got != cur_kind.and_then(Self::visible) {
                    self.fail(op, format!("cmpxchg returned {got:?}, want {cur_kind:?}"));
                }
                apply(&mut self.model);
            }
            Err(r) if out_of_range && matches!(r.error, Error::ValueOutOfRange(_)) => {}
            Err(r) if !matches && !out_of_range && r.error == Error::Mismatch => {}
            r => self.fail(
                op,
                format!(
                    "cmpxchg({i:#x}, {old_kind:?}) = {:?}, cur {cur_kind:?}",
                    r.map(|_| ()).map_err(|r| r.error)
                ),
            ),
        }
    }

    fn split(&mut self, op: &ApiOp, i: u64, down: u8, partial: bool, wrong: u8) {
        let Some((s, e)) = self.model.covering(i) else {
            return;
        };
        let Kind::Value(v) = e.kind else { return };
        if e.order == 0 {
            return;
        }
        let n = e.order.saturating_sub(1 + (down as u32 % e.order));
        let (mut wv, mut wo) = (v, e.order);
        match wrong % 8 {
            1 => wv = (v + 1) % 256,
            2 => wo += 1,
            // out of range: refused (fixed in main)
            3 => wv = MAX_VALUE + 1,
            _ => {}
        }
        let crosses = e.order - e.order % kxarray::CHUNK_SHIFT > n - n % kxarray::CHUNK_SHIFT;
        if !self.on(defect::SPLIT_MARKS) && partial && crosses && e.marks != 0 {
            return; // a known defect: marks lost across levels
        }
        self.tall_ok = true;
        let guard = kxarray::pin();
        let mut xas = XaState::with_order(&self.xa, &guard, i, n).unwrap();
        let alloc = if partial {
            xas.try_split_alloc(wv, wo).map(|_| ())
        } else {
            xas.split_alloc(wv, wo)
        };
        let lock = self.xa.lock();
        let r = match alloc {
            Ok(()) if partial => xas.try_split(&lock, wv, wo),
            Ok(()) => xas.split(&lock, wv, wo),
            Err(e) => Err(e),
        };
        drop(lock);
        let right = wv == v && wo == e.order;
        match r {
            Ok(()) if right => self.model.split(s, n, i, partial),
            Ok(()) => self.fail(
                op,
                format!("split with ({wv}, {wo}) of ({v}, {}) succeeded", e.order),
            ),
            Err(_) => {
                // uniform splits are limited to one level of new nodes
                let uniform_ok = n - n % kxarray::CHUNK_SHIFT + 2 * kxarray::CHUNK_SHIFT > e.order;
                if right && (partial || uniform_ok) {
                    self.fail(
                        op,
                        format!("split of ({v}, {}) to {n} failed: {r:?}", e.order),
                    );
                }
            }
        }
    }
}

/// Decode an input (`None`: not decodable).
pub(crate) fn decode(data: &[u8]) -> Option<ApiInput> {
    ApiInput::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// Decode and run; undecodable inputs are ignored.
pub(crate) fn run_bytes(data: &[u8], known_defect_ops: u8) {
    if let Some(input) = decode(data) {
        run(&input, known_defect_ops);
    }
}

/// Run an input against a fresh array and the model; panics on the first
/// difference.
pub(crate) fn run(input: &ApiInput, known_defect_ops: u8) {
    let (flags, alloc_flags) = match input.flags % 3 {
        0 => (Flags::NONE, None),
        1 => (Flags::ALLOC, Some(false)),
        _ => (Flags::ALLOC1, Some(true)),
    };
    let mut h = Harness {
        xa: XArray::with_flags(flags),
        model: ApiModel::default(),
        alloc_flags,
        created: Vec::new(),
        step: 0,
        known_defect_ops,
        tall_ok: false,
        hold: None,
        held: Vec::new(),
    };
    for op in input.ops.iter().take(MAX_OPS) {
        h.apply(op);
        if h.model
            .map
            .get(&0)
            .is_some_and(|e| e.kind == Kind::Reserved)
        {
            // Found by this target (not a known defect): after a reservation at
            // index 0, storing there leaves a one-slot node that
            // check_invariants reports as "tree not minimal".
            h.tall_ok = true;
        }
        h.check_all(op);
        h.step += 1;
    }
    h.held.clear();
    h.hold = None;
    let created = std::mem::take(&mut h.created);
    let mut xa = h.xa;
    // tear down: remove some entries owned, drop the rest with the array
    for (&s, e) in h.model.map.iter().step_by(2) {
        let got = xa.remove(s);
        let ok = match (e.kind, &got) {
            (Kind::Item(id), Some(Entry::Item(t))) => t.id == id,
            (Kind::Value(v), Some(Entry::Value(w))) => v == *w,
            (Kind::Reserved, None) => true,
            _ => false,
        };
        assert!(ok, "remove({s:#x}) = {got:?}, model {e:?}");
    }
    drop(xa);
    // Other threads (parallel tests) may hold the epoch back for a while.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !created.iter().all(|&id| drops(id) == 1) && std::time::Instant::now() < deadline {
        kxarray::pin().flush();
    }
    let mut map = drops_map();
    for id in &created {
        let n = map.remove(id).unwrap_or(0);
        assert_eq!(n, 1, "item {id} dropped {n} times");
    }
}

/// Hand-written inputs for the known-defect scenarios the fuzzer reaches only
/// rarely (class, name, input), replayed by `tests/fuzz_replay.rs` like the
/// saved regressions.
pub(crate) fn known_defect_seeds() -> Vec<(u8, &'static str, ApiInput)> {
    // ix(): 0xC000 | i maps to i for i < 0x2000
    let at = |i: u16| 0xC000 | i;
    vec![
        (
            defect::SPLIT_MARKS,
            "partial split across a level of a marked entry",
            ApiInput {
                flags: 0,
                ops: vec![
                    ApiOp::Store {
                        index: at(1536),
                        order: 9,
                        kind: 1,
                        fault: 0,
                    },
                    ApiOp::Mark {
                        index: at(1536),
                        mark: 2,
                        set: true,
                    },
                    ApiOp::Split {
                        index: at(1772),
                        down: 6,
                        partial: true,
                        wrong: 0,
                    },
                ],
            },
        ),
        (
            defect::STALE_CURSOR,
            "cursor stores after a slot turned into a sibling",
            ApiInput {
                flags: 0,
                ops: vec![
                    ApiOp::Store {
                        index: 100,
                        order: 0,
                        kind: 5,
                        fault: 0,
                    },
                    ApiOp::Stale {
                        at: 69,
                        write: 0,
                        index: 68,
                        order: 2,
                        value: 9,
                    },
                ],
            },
        ),
        (
            defect::RANGE,
            "split of an unaligned store_range entry",
            ApiInput {
                flags: 0,
                ops: vec![
                    ApiOp::StoreRange {
                        first: at(1365),
                        len: 47,
                        value: Some(3),
                    },
                    ApiOp::Split {
                        index: at(1380),
                        down: 0,
                        partial: true,
                        wrong: 0,
                    },
                ],
            },
        ),
        (
            defect::WHOLE_RANGE,
            "store_range(0, u64::MAX)",
            ApiInput {
                flags: 0,
                ops: vec![ApiOp::StoreRange {
                    first: 0,
                    len: 0xffff,
                    value: Some(1),
                }],
            },
        ),
    ]
}
