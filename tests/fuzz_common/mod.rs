//! Shared harness for the `split_insert` fuzz target and its replay test.
//!
//! Included by `fuzz/fuzz_targets/split_insert.rs` (through `#[path]`) and
//! by `tests/fuzz_replay.rs` (as `mod fuzz_common;`), so the fuzzer and a
//! plain `cargo test` decode and check inputs with the very same code.
//!
//! An input is a sequence of [`Op`]s decoded with `arbitrary`; each op is
//! applied to an `XArray<Box<u64>>` and to [`Model`], a `BTreeMap` of
//! multi-index value entries, and the two are compared after every op
//! (together with `check_invariants`).
//!
//! Model semantics (the kernel's):
//! - an order-`o` entry covers the aligned block of `2^o` indices;
//! - storing into part of a larger entry replaces it for its whole range,
//!   keeping its shape and marks;
//! - storing over smaller entries replaces them all; the new entry carries
//!   the union of their marks (`xas_squash_marks`, and the aggregated mark
//!   of a replaced subtree's slot);
//! - erasing any index of an entry erases the whole entry; marks belong to
//!   the whole entry;
//! - splitting an order-`o` value entry into order `n` leaves `2^(o-n)`
//!   entries of order `n` with the same value and the same marks.
#![allow(dead_code)]

pub(crate) mod api;
pub(crate) mod api_model;
pub(crate) mod filemap;

use arbitrary::{Arbitrary, Unstructured};
use kxarray::{fault, Entry, Error, Mark, XArray, XaState, MAX_VALUE};
use std::collections::BTreeMap;

/// At most this many ops are run per input.
pub(crate) const MAX_OPS: usize = 256;

/// One operation. Indices, orders, marks and values are raw fuzzer bytes,
/// mapped by [`idx`], [`order`], [`mark`] and [`value`].
#[derive(Arbitrary, Debug, Clone)]
pub(crate) enum Op {
    /// `store_order` at `idx` aligned down to the order.
    Store {
        index: u16,
        order: u8,
        value: u16,
        fault: u8,
    },
    /// `split_alloc` + `split` of the entry covering `index`.
    Split {
        index: u16,
        new_order: u8,
        twist: u8,
        fault: u8,
    },
    /// `erase` of the entry covering `index`.
    Erase { index: u16 },
    /// Store `None` through a cursor of order `order` (erases every entry
    /// the block touches).
    EraseOrder { index: u16, order: u8 },
    /// `set_mark`.
    SetMark { index: u16, mark: u8 },
    /// `clear_mark`.
    ClearMark { index: u16, mark: u8 },
    /// `get_mark`.
    GetMark { index: u16, mark: u8 },
    /// `xas_for_each_conflict` over a block, compared with the model.
    Conflicts { index: u16, order: u8 },
    /// A conflict scan followed by a store through the same cursor (the
    /// page cache's `add_folio` pattern).
    ConflictStore {
        index: u16,
        order: u8,
        value: u16,
        fault: u8,
    },
    /// `find` (`xa_find`) with an optional mark filter.
    Find {
        start: u16,
        max: u16,
        mark: Option<u8>,
    },
    /// `get_order`.
    GetOrder { index: u16 },
    /// `load`.
    Load { index: u16 },
}

const SPECIAL: [u64; 16] = [
    u64::MAX,
    u64::MAX - 63,
    u64::MAX - 4095,
    1 << 63,
    (1 << 63) - 1,
    1 << 32,
    (1 << 32) - 1,
    1 << 12,
    1 << 18,
    1 << 24,
    1 << 30,
    1 << 36,
    1 << 42,
    1 << 48,
    1 << 54,
    1 << 60,
];

/// Map a raw index: half the time 0..=255, a quarter 0..=16383, a quarter
/// near one of a few big indices (u64::MAX, 2^63, 2^32, ...).
pub(crate) fn idx(raw: u16) -> u64 {
    match raw >> 14 {
        0 | 1 => (raw & 0xff) as u64,
        2 => (raw & 0x3fff) as u64,
        _ => SPECIAL[(raw & 0xf) as usize] ^ ((raw >> 4) & 0x3f) as u64,
    }
}

/// Map a raw order: mostly 0..=13, sometimes a big one.
pub(crate) fn order(raw: u8) -> u32 {
    const BIG: [u32; 8] = [18, 24, 30, 36, 63, 62, 57, 17];
    if raw >= 0xf0 {
        BIG[(raw & 7) as usize]
    } else {
        (raw % 14) as u32
    }
}

/// Map a raw mark.
pub(crate) fn mark(raw: u8) -> Mark {
    Mark::ALL[(raw % 3) as usize]
}

/// Map a raw value (small values collide on purpose; 0xffff is the largest
/// value entry).
pub(crate) fn value(raw: u16) -> u64 {
    if raw == u16::MAX {
        MAX_VALUE
    } else {
        (raw % 512) as u64
    }
}

fn fault_count(raw: u8) -> u64 {
    match raw {
        1..=3 => raw as u64,
        _ => 0,
    }
}

fn align(index: u64, order: u32) -> u64 {
    index & !((1u64 << order) - 1)
}

fn last(start: u64, order: u32) -> u64 {
    start + ((1u64 << order) - 1)
}

/// One multi-index entry of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MEntry {
    pub order: u32,
    pub value: u64,
    /// Bit i = mark i.
    pub marks: u8,
}

/// The reference model: non-overlapping aligned blocks keyed by first index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Model {
    pub map: BTreeMap<u64, MEntry>,
}

impl Model {
    /// The entry covering `index`.
    pub(crate) fn covering(&self, index: u64) -> Option<(u64, MEntry)> {
        let (&s, &e) = self.map.range(..=index).next_back()?;
        (last(s, e.order) >= index).then_some((s, e))
    }

    /// First indices of every entry meeting `first..=last`, in order.
    pub(crate) fn overlapping(&self, first: u64, end: u64) -> Vec<u64> {
        let mut v = Vec::new();
        if let Some((s, _)) = self.covering(first) {
            if s < first {
                v.push(s);
            }
        }
        v.extend(self.map.range(first..=end).map(|(&s, _)| s));
        v
    }

    /// Store `val` over the order-`o` block at `start`. Returns the expected
    /// old entry when it is determined (`Some(None)`: nothing was there).
    pub(crate) fn store(&mut self, start: u64, o: u32, val: u64) -> Option<Option<u64>> {
        if let Some((s, e)) = self.covering(start) {
            if e.order > o {
                // replaces the larger entry, keeping its shape and marks
                self.map.get_mut(&s).unwrap().value = val;
                return Some(Some(e.value));
            }
        }
        let starts = self.overlapping(start, last(start, o));
        let mut marks = 0;
        let ret = match starts.as_slice() {
            [] => Some(None),
            [s] if *s == start && self.map[s].order == o => Some(Some(self.map[s].value)),
            _ => None,
        };
        for s in starts {
            let e = self.map.remove(&s).unwrap();
            debug_assert!(s >= start && last(s, e.order) <= last(start, o));
            marks |= e.marks;
        }
        self.map.insert(
            start,
            MEntry {
                order: o,
                value: val,
                marks,
            },
        );
        ret
    }

    /// Erase the entry covering `index`.
    pub(crate) fn erase(&mut self, index: u64) -> Option<u64> {
        let (s, e) = self.covering(index)?;
        self.map.remove(&s);
        Some(e.value)
    }

    /// Erase every entry meeting the order-`o` block at `start` (a larger
    /// entry covering the block is erased whole).
    pub(crate) fn erase_order(&mut self, start: u64, o: u32) {
        for s in self.overlapping(start, last(start, o)) {
            self.map.remove(&s);
        }
    }

    /// What `xas_for_each_conflict` over the order-`o` block at `start`
    /// returns.
    pub(crate) fn conflicts(&self, start: u64, o: u32) -> Vec<u64> {
        self.overlapping(start, last(start, o))
            .into_iter()
            .map(|s| self.map[&s].value)
            .collect()
    }

    /// Split the entry at `s` into entries of order `n`.
    pub(crate) fn split(&mut self, s: u64, n: u32) {
        let e = self.map.remove(&s).unwrap();
        let count = 1u64 << (e.order - n);
        for i in 0..count {
            self.map.insert(s + (i << n), MEntry { order: n, ..e });
        }
    }

    /// Set or clear a mark on the entry covering `index`.
    pub(crate) fn mark(&mut self, index: u64, m: Mark, set: bool) {
        if let Some((s, _)) = self.covering(index) {
            let e = self.map.get_mut(&s).unwrap();
            let bit = 1u8 << m.index();
            if set {
                e.marks |= bit;
            } else {
                e.marks &= !bit;
            }
        }
    }

    /// Whether the entry covering `index` has mark `m`.
    pub(crate) fn get_mark(&self, index: u64, m: Mark) -> bool {
        self.covering(index)
            .is_some_and(|(_, e)| e.marks & (1 << m.index()) != 0)
    }
}

/// Whether `xas_split_alloc` accepts splitting order `o` into order `n`
/// (one level of new nodes at most).
fn split_possible(o: u32, n: u32) -> bool {
    let shift = n - n % kxarray::CHUNK_SHIFT;
    o > n && shift + 2 * kxarray::CHUNK_SHIFT > o
}

/// Decode an input the way the fuzz target does (`None`: not decodable).
pub(crate) fn decode(data: &[u8]) -> Option<Vec<Op>> {
    Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// Decode an input and run it. Inputs that do not decode are ignored.
pub(crate) fn run_bytes(data: &[u8]) {
    if let Some(ops) = decode(data) {
        run(&ops);
    }
}

struct Harness {
    xa: XArray<Box<u64>>,
    model: Model,
    step: usize,
    /// A split has run: the tree may be taller than needed.
    tall_ok: bool,
}

impl Harness {
    fn fail(&self, op: &Op, msg: String) -> ! {
        panic!(
            "step {} {:?}: {}\nmodel: {:?}\n{}",
            self.step,
            op,
            msg,
            self.model.map,
            self.xa.dump()
        );
    }

    /// Compare the whole array with the model.
    fn check_all(&self, op: &Op) {
        if let Err(e) = self.xa.check_invariants() {
            // Like the kernel's xas_split, a split does not shrink the tree:
            // splitting an order-k*CHUNK_SHIFT entry at index 0 leaves a top
            // node whose only child is in slot 0 until the next erase.
            // check_invariants reports exactly that last; accept it then.
            if !(self.tall_ok && e.starts_with("tree not minimal")) {
                self.fail(op, format!("invariant: {e}"));
            }
        }
        let guard = kxarray::pin();
        let got: Vec<(u64, Option<u64>)> =
            self.xa.iter(&guard).map(|(i, e)| (i, e.value())).collect();
        let want: Vec<(u64, Option<u64>)> = self
            .model
            .map
            .iter()
            .map(|(&s, e)| (s, Some(e.value)))
            .collect();
        if got != want {
            self.fail(op, format!("iter {got:?}\n want {want:?}"));
        }
        for m in Mark::ALL {
            let got: Vec<u64> = self.xa.iter_marked(.., m, &guard).map(|(i, _)| i).collect();
            let want: Vec<u64> = self
                .model
                .map
                .iter()
                .filter(|(_, e)| e.marks & (1 << m.index()) != 0)
                .map(|(&s, _)| s)
                .collect();
            if got != want {
                self.fail(op, format!("iter_marked {m:?} {got:?}, want {want:?}"));
            }
            if self.xa.marked(m) == want.is_empty() {
                self.fail(op, format!("marked({m:?}) is {}", self.xa.marked(m)));
            }
        }
        drop(guard);
        // per-entry probes on at most ~64 entries (splits can make thousands)
        let stride = self.model.map.len() / 64 + 1;
        for (&s, e) in self.model.map.iter().step_by(stride) {
            let l = last(s, e.order);
            for i in [s, l] {
                if self.xa.get_order(i) != e.order {
                    self.fail(
                        op,
                        format!(
                            "get_order({i:#x}) = {}, want {}",
                            self.xa.get_order(i),
                            e.order
                        ),
                    );
                }
                if self.xa.load_value(i) != Some(e.value) {
                    self.fail(
                        op,
                        format!(
                            "load({i:#x}) = {:?}, want {}",
                            self.xa.load_value(i),
                            e.value
                        ),
                    );
                }
                for m in Mark::ALL {
                    let want = e.marks & (1 << m.index()) != 0;
                    if self.xa.get_mark(i, m) != want {
                        self.fail(op, format!("get_mark({i:#x}, {m:?}) != {want}"));
                    }
                }
            }
            for i in [s.wrapping_sub(1), l.wrapping_add(1)] {
                if i < s || i > l {
                    let want = self.model.covering(i).map(|(_, e)| e.value);
                    if self.xa.load_value(i) != want {
                        self.fail(
                            op,
                            format!("load({i:#x}) = {:?}, want {want:?}", self.xa.load_value(i)),
                        );
                    }
                }
            }
        }
        if self.model.map.is_empty() && !self.xa.is_empty() {
            self.fail(op, "array should be empty".into());
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Store {
                index,
                order: o,
                value: v,
                fault: f,
            } => {
                let o = order(o);
                let start = align(idx(index), o);
                let v = value(v);
                fault::fail_next_allocations(fault_count(f));
                let r = self.xa.store_order(start, o, Entry::Value(v));
                fault::fail_next_allocations(0);
                match r {
                    Ok(old) => {
                        let old = old.map(|r| r.value().expect("value entries only"));
                        if let Some(want) = self.model.store(start, o, v) {
                            if old != want {
                                self.fail(op, format!("store_order({start:#x}, {o}) returned {old:?}, want {want:?}"));
                            }
                        }
                    }
                    Err(r) if r.error == Error::NoMemory && fault_count(f) > 0 => {
                        if r.entry.and_then(|e| e.value()) != Some(v) {
                            self.fail(op, "rejected store lost its entry".into());
                        }
                    }
                    Err(r) => self.fail(
                        op,
                        format!("store_order({start:#x}, {o}) failed: {:?}", r.error),
                    ),
                }
            }
            Op::Split {
                index,
                new_order,
                twist,
                fault: f,
            } => {
                self.tall_ok = true;
                self.split(op, idx(index), new_order, twist, f)
            }
            Op::Erase { index } => {
                let i = idx(index);
                let got = self.xa.erase(i).map(|r| r.value().expect("value"));
                let want = self.model.erase(i);
                if got != want {
                    self.fail(op, format!("erase({i:#x}) = {got:?}, want {want:?}"));
                }
            }
            Op::EraseOrder { index, order: o } => {
                let o = order(o);
                let i = idx(index);
                let guard = kxarray::pin();
                let lock = self.xa.lock();
                let mut xas = XaState::with_order(&self.xa, &guard, i, o).unwrap();
                let start = xas.index();
                if start != align(i, o) {
                    self.fail(op, format!("with_order index {start:#x}"));
                }
                if let Err(r) = xas.store(&lock, None) {
                    self.fail(op, format!("erase store failed: {:?}", r.error));
                }
                drop(xas);
                drop(lock);
                self.model.erase_order(start, o);
            }
            Op::SetMark { index, mark: m } | Op::ClearMark { index, mark: m } => {
                let set = matches!(op, Op::SetMark { .. });
                let (i, m) = (idx(index), mark(m));
                if set {
                    self.xa.set_mark(i, m);
                } else {
                    self.xa.clear_mark(i, m);
                }
                self.model.mark(i, m, set);
            }
            Op::GetMark { index, mark: m } => {
                let (i, m) = (idx(index), mark(m));
                let want = self.model.get_mark(i, m);
                if self.xa.get_mark(i, m) != want {
                    self.fail(op, format!("get_mark({i:#x}, {m:?}) != {want}"));
                }
            }
            Op::Conflicts { index, order: o } => {
                let o = order(o);
                let start = align(idx(index), o);
                let got = self.conflicts(start, o);
                let want = self.model.conflicts(start, o);
                if got != want {
                    self.fail(
                        op,
                        format!("conflicts({start:#x}, {o}) = {got:?}, want {want:?}"),
                    );
                }
            }
            Op::ConflictStore {
                index,
                order: o,
                value: v,
                fault: f,
            } => {
                let o = order(o);
                let start = align(idx(index), o);
                let v = value(v);
                let want_conflicts = self.model.conflicts(start, o);
                let (got, stored) = {
                    let guard = kxarray::pin();
                    let lock = self.xa.lock();
                    let mut xas = XaState::with_order(&self.xa, &guard, start, o).unwrap();
                    let got: Vec<u64> = xas
                        .conflicts(&lock)
                        .map(|e| e.value().expect("value"))
                        .collect();
                    fault::fail_next_allocations(fault_count(f));
                    let r = xas.store(&lock, Some(Entry::Value(v)));
                    fault::fail_next_allocations(0);
                    let stored = match r {
                        Ok(old) => Ok(old.map(|e| e.value().expect("value"))),
                        Err(r) => Err((r.error, r.entry.and_then(|e| e.value()))),
                    };
                    (got, stored)
                };
                if got != want_conflicts {
                    self.fail(
                        op,
                        format!("conflicts({start:#x}, {o}) = {got:?}, want {want_conflicts:?}"),
                    );
                }
                match stored {
                    Ok(old) => {
                        if let Some(want) = self.model.store(start, o, v) {
                            if old != want {
                                self.fail(
                                    op,
                                    format!("cursor store returned {old:?}, want {want:?}"),
                                );
                            }
                        }
                    }
                    Err((Error::NoMemory, back)) if fault_count(f) > 0 => {
                        if back != Some(v) {
                            self.fail(op, "rejected store lost its entry".into());
                        }
                    }
                    Err((e, _)) => self.fail(op, format!("cursor store failed: {e:?}")),
                }
            }
            Op::Find {
                start,
                max,
                mark: m,
            } => {
                let (s, mx) = (idx(start), idx(max));
                let m = m.map(mark);
                let want = self
                    .model
                    .overlapping(s, mx.max(s))
                    .into_iter()
                    .map(|st| (st, self.model.map[&st]))
                    .find(|(_, e)| m.is_none_or(|m| e.marks & (1 << m.index()) != 0))
                    .filter(|_| s <= mx);
                let guard = kxarray::pin();
                let got = self.xa.find(s, mx, m, &guard).map(|(i, e)| (i, e.value()));
                match (got, want) {
                    (None, None) => {}
                    (Some((i, gv)), Some((st, e))) => {
                        let ok_index = if st >= s { i == st } else { i >= st && i <= s };
                        if !ok_index || gv != Some(e.value) {
                            self.fail(op, format!("find({s:#x}, {mx:#x}, {m:?}) = ({i:#x}, {gv:?}), want entry at {st:#x} {e:?}"));
                        }
                    }
                    (got, want) => self.fail(
                        op,
                        format!("find({s:#x}, {mx:#x}, {m:?}) = {got:?}, want {want:?}"),
                    ),
                }
            }
            Op::GetOrder { index } => {
                let i = idx(index);
                let want = self.model.covering(i).map_or(0, |(_, e)| e.order);
                if self.xa.get_order(i) != want {
                    self.fail(
                        op,
                        format!("get_order({i:#x}) = {}, want {want}", self.xa.get_order(i)),
                    );
                }
            }
            Op::Load { index } => {
                let i = idx(index);
                let want = self.model.covering(i).map(|(_, e)| e.value);
                if self.xa.load_value(i) != want {
                    self.fail(
                        op,
                        format!("load({i:#x}) = {:?}, want {want:?}", self.xa.load_value(i)),
                    );
                }
            }
        }
    }

    /// Values returned by a conflict scan of the order-`o` block at `start`.
    fn conflicts(&self, start: u64, o: u32) -> Vec<u64> {
        let guard = kxarray::pin();
        let lock = self.xa.lock();
        let mut xas = XaState::with_order(&self.xa, &guard, start, o).unwrap();
        let v: Vec<u64> = xas
            .conflicts(&lock)
            .map(|e| e.value().expect("value"))
            .collect();
        v
    }

    /// `twist` picks the new order and sometimes a wrong expectation:
    /// low 4 bits: how far below the entry's order to split; bits 4..7:
    /// 1 = wrong value, 2 = wrong order (+1), 3 = wrong order (-1),
    /// 4 = the entry is replaced between `split_alloc` and `split`,
    /// 5 = split at the entry's first index instead of `index`.
    fn split(&mut self, op: &Op, index: u64, new_order: u8, twist: u8, f: u8) {
        let cov = self.model.covering(index);
        let (s, e) = cov.unwrap_or((
            index,
            MEntry {
                order: 1,
                value: 0,
                marks: 0,
            },
        ));
        let n = if e.order == 0 {
            0
        } else {
            e.order.saturating_sub(1 + (new_order % 14) as u32)
        };
        let mode = twist >> 4;
        let mut want_value = e.value;
        let mut want_order = e.order;
        match mode {
            1 => want_value = (want_value + 1) % 512,
            2 if want_order < 63 => want_order += 1,
            3 if want_order > n + 1 => want_order -= 1,
            _ => {}
        }
        let at = if mode == 5 { s } else { index };
        let faults = fault_count(f);
        let guard = kxarray::pin();
        let mut xas = XaState::with_order(&self.xa, &guard, at, n).unwrap();
        fault::fail_next_allocations(faults);
        let alloc = xas.split_alloc(want_value, want_order);
        fault::fail_next_allocations(0);
        let possible = split_possible(want_order, n);
        match alloc {
            Ok(()) if possible => {}
            Err(Error::InvalidSplit) if !possible => {}
            Err(Error::NoMemory) if faults > 0 && possible => {}
            other => self.fail(op, format!("split_alloc({want_value}, {want_order}) at order {n} = {other:?}, possible {possible}")),
        }
        if mode == 4 && cov.is_some() {
            // the entry changes under the preallocation: the split must notice
            let nv = (e.value + 7) % 512;
            self.xa.store(s, Entry::Value(nv)).unwrap();
            self.model.store(s, 0, nv);
            want_value = e.value; // still what the nodes were built for
        }
        let lock = self.xa.lock();
        let r = xas.split(&lock, want_value, want_order);
        drop(xas);
        drop(lock);
        drop(guard);
        let matches = cov.is_some()
            && alloc.is_ok()
            && mode != 4
            && want_value == self.model.map.get(&s).map_or(u64::MAX, |e| e.value)
            && want_order == e.order;
        match r {
            Ok(()) if matches => self.model.split(s, n),
            Err(Error::InvalidSplit) if !matches => {}
            other => self.fail(op, format!("split({want_value}, {want_order}) at {at:#x} order {n} = {other:?}, expected ok: {matches}")),
        }
    }
}

/// Run a sequence of ops against a fresh array and the model, panicking on
/// the first difference.
pub(crate) fn run(ops: &[Op]) {
    let mut h = Harness {
        xa: XArray::new(),
        model: Model::default(),
        step: 0,
        tall_ok: false,
    };
    for op in ops.iter().take(MAX_OPS) {
        h.apply(op);
        h.check_all(op);
        h.step += 1;
    }
    // tear down through the exclusive API too
    let mut xa = h.xa;
    for (&s, e) in &h.model.map {
        match xa.remove(s) {
            Some(Entry::Value(v)) if v == e.value => {}
            other => panic!("remove({s:#x}) = {other:?}, want {}", e.value),
        }
    }
    assert!(
        xa.is_empty(),
        "array not empty after removing every entry:\n{}",
        xa.dump()
    );
    assert_eq!(xa.node_count(), 0);
    drop(xa);
    // Let the epoch free what this run retired, so the fuzzer's leak check
    // (run whenever an input ends with more mallocs than frees) stays rare.
    for _ in 0..64 {
        kxarray::pin().flush();
    }
}
