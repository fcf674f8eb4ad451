//! Shared harness of the `filemap` fuzz target: the page cache's
//! `AddressSpace` (add_folio over shadows of every size, remove_folio with
//! and without a shadow, drop_shadow, the dirty/writeback/towrite tags,
//! lock-free lookups) against a model, with injected allocation failures.
//!
//! Included by `fuzz/fuzz_targets/filemap.rs` and by `tests/fuzz_replay.rs`
//! (through `tests/fuzz_common/mod.rs`).
//!
//! The model maps first index -> folio (id, order, tags) or shadow (value,
//! order). After every op the whole cache is compared with it: the tree's
//! invariants, every entry through `pages().iter`, every tag through
//! `iter_marked` and `tagged`, `nr_pages` and `nr_shadow_pages`, and
//! per-entry `get_order`/`lookup` probes. Folio references are counted: a
//! cached folio is referenced by the tree, and at the end, after the cache
//! is dropped and the epoch flushed, the harness holds the only reference
//! to every folio (each reference the tree took was dropped exactly once).

use super::api::ord;
use super::api_model::{align, end};
use arbitrary::{Arbitrary, Unstructured};
use kxarray::filemap::{AddError, AddressSpace, Folio, Lookup, Shadow, Tag};
use kxarray::{fault, EntryRef, MAX_VALUE};
use std::collections::BTreeMap;
use std::sync::Arc;

/// At most this many ops per input.
pub(crate) const MAX_OPS: usize = 200;

/// One operation on the cache.
#[derive(Arbitrary, Debug, Clone)]
pub(crate) enum FmOp {
    /// `add_folio` of a new folio at `index` (aligned down to `order`);
    /// `fault` 1..=3 fails that many node allocations.
    Add { index: u16, order: u8, fault: u8 },
    /// `remove_folio` of the folio covering `index` (or of an uncached
    /// one), leaving a shadow when `shadow` is set.
    Remove { index: u16, shadow: Option<u16> },
    /// `drop_shadow`.
    DropShadow { index: u16 },
    /// `mark_dirty`.
    MarkDirty { index: u16 },
    /// `tag_for_writeback(start, start + len)`.
    TagForWriteback { start: u16, len: u16 },
    /// `start_writeback`.
    StartWriteback { index: u16 },
    /// `end_writeback`.
    EndWriteback { index: u16 },
    /// `folios_tagged(start, start + len, tag)`.
    FoliosTagged { start: u16, len: u16, tag: u8 },
    /// `lookup` and `lookup_entry`.
    Lookup { index: u16 },
    /// Pin/flush cycles, so deferred frees run during the run.
    Flush,
}

const DIRTY: u8 = 1;
const WRITEBACK: u8 = 2;
const TOWRITE: u8 = 4;
const TAGS: [(Tag, u8); 3] = [
    (Tag::Dirty, DIRTY),
    (Tag::Writeback, WRITEBACK),
    (Tag::Towrite, TOWRITE),
];

/// A model entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FE {
    Folio { id: usize, order: u32, tags: u8 },
    Shadow { value: u64, order: u32 },
}

impl FE {
    fn order(&self) -> u32 {
        match *self {
            FE::Folio { order, .. } | FE::Shadow { order, .. } => order,
        }
    }
}

#[derive(Default, Debug)]
struct FmModel {
    map: BTreeMap<u64, FE>,
}

impl FmModel {
    fn covering(&self, i: u64) -> Option<(u64, FE)> {
        let (&s, &e) = self.map.range(..=i).next_back()?;
        (end(s, e.order()) >= i).then_some((s, e))
    }
    fn overlapping(&self, first: u64, last: u64) -> Vec<u64> {
        let mut v = Vec::new();
        if let Some((s, _)) = self.covering(first) {
            if s < first {
                v.push(s);
            }
        }
        v.extend(self.map.range(first..=last).map(|(&s, _)| s));
        v
    }
    fn folio_at(&self, i: u64) -> Option<(u64, usize)> {
        match self.covering(i)? {
            (s, FE::Folio { id, .. }) => Some((s, id)),
            _ => None,
        }
    }
    fn tags_mut(&mut self, s: u64) -> &mut u8 {
        match self.map.get_mut(&s) {
            Some(FE::Folio { tags, .. }) => tags,
            _ => unreachable!("not a folio"),
        }
    }
}

struct Harness {
    m: AddressSpace,
    model: FmModel,
    folios: Vec<Arc<Folio>>,
    step: usize,
}

/// Index mapping: the api target's, capped so every folio fits.
fn fix(raw: u16) -> u64 {
    super::api::ix(raw)
}

impl Harness {
    fn fail(&self, op: &FmOp, msg: String) -> ! {
        panic!(
            "step {} {:?}: {}\nmodel: {:?}\n{}",
            self.step,
            op,
            msg,
            self.model.map,
            self.m.pages().dump()
        );
    }

    fn id_of(&self, f: &Folio) -> Option<usize> {
        self.folios.iter().position(|x| core::ptr::eq(&**x, f))
    }

    fn check_all(&self, op: &FmOp) {
        let pages = self.m.pages();
        if let Err(e) = pages.check_invariants() {
            // partial splits leave the tree tall, as the kernel's do
            if !e.starts_with("tree not minimal") {
                self.fail(op, format!("invariant: {e}"));
            }
        }
        let guard = kxarray::pin();
        let got: Vec<(u64, FE)> = pages
            .iter(&guard)
            .map(|(i, e)| {
                let order = pages.get_order(i);
                let fe = match e {
                    EntryRef::Item(r) => {
                        let f: &Folio = r.get();
                        if f.index() != i || f.order() != order {
                            self.fail(
                                op,
                                format!(
                                    "folio ({:#x}, {}) at {i:#x} order {order}",
                                    f.index(),
                                    f.order()
                                ),
                            );
                        }
                        let id = self
                            .id_of(f)
                            .unwrap_or_else(|| self.fail(op, format!("unknown folio at {i:#x}")));
                        let tags = TAGS
                            .iter()
                            .filter(|(t, _)| pages.get_mark(i, t.mark()))
                            .fold(0, |a, (_, b)| a | b);
                        FE::Folio { id, order, tags }
                    }
                    EntryRef::Value(v) => FE::Shadow { value: v, order },
                };
                (i, fe)
            })
            .collect();
        let want: Vec<(u64, FE)> = self.model.map.iter().map(|(&s, &e)| (s, e)).collect();
        if got != want {
            self.fail(op, format!("entries {got:?}\n want {want:?}"));
        }
        for (tag, bit) in TAGS {
            let got: Vec<u64> = pages
                .iter_marked(.., tag.mark(), &guard)
                .map(|(i, _)| i)
                .collect();
            let want: Vec<u64> = self
                .model
                .map
                .iter()
                .filter(|(_, e)| matches!(e, FE::Folio { tags, .. } if tags & bit != 0))
                .map(|(&s, _)| s)
                .collect();
            if got != want {
                self.fail(op, format!("iter_marked {tag:?} {got:?}, want {want:?}"));
            }
            if self.m.tagged(tag) == want.is_empty() {
                self.fail(op, format!("tagged({tag:?}) = {}", self.m.tagged(tag)));
            }
        }
        let (mut np, mut ns) = (0u64, 0u64);
        for e in self.model.map.values() {
            match e {
                FE::Folio { order, .. } => np += 1 << order,
                FE::Shadow { order, .. } => ns += 1 << order,
            }
        }
        if self.m.nr_pages() != np || self.m.nr_shadow_pages() != ns {
            self.fail(
                op,
                format!(
                    "nr_pages {} nr_shadow_pages {}, want {np} {ns}",
                    self.m.nr_pages(),
                    self.m.nr_shadow_pages()
                ),
            );
        }
        // every folio the model caches is referenced by the tree
        for e in self.model.map.values() {
            if let FE::Folio { id, .. } = *e {
                if Arc::strong_count(&self.folios[id]) < 2 {
                    self.fail(op, format!("cached folio {id} lost its reference"));
                }
            }
        }
        let stride = self.model.map.len() / 32 + 1;
        for (&s, e) in self.model.map.iter().step_by(stride) {
            let l = end(s, e.order());
            for i in [s, l, s + (l - s) / 2] {
                let got = self.m.lookup(i).map(|f| self.id_of(&f));
                let want = match e {
                    FE::Folio { id, .. } => Some(Some(*id)),
                    FE::Shadow { .. } => None,
                };
                if got != want {
                    self.fail(op, format!("lookup({i:#x}) = {got:?}, want {want:?}"));
                }
            }
        }
    }

    fn apply(&mut self, op: &FmOp) {
        match *op {
            FmOp::Add {
                index,
                order,
                fault: f,
            } => {
                let o = ord(order);
                let s = align(fix(index), o);
                let folio = Arc::new(Folio::new(s, o).expect("aligned folio"));
                let faults = if (1..=3).contains(&f) { f as u64 } else { 0 };
                let overlap = self.model.overlapping(s, end(s, o));
                let exists = overlap
                    .iter()
                    .any(|x| matches!(self.model.map[x], FE::Folio { .. }));
                fault::fail_next_allocations(faults);
                let r = self.m.add_folio(&folio);
                fault::fail_next_allocations(0);
                match r {
                    Err(AddError::Exists) if exists => {}
                    Err(AddError::NoMemory) if faults > 0 && !exists => {}
                    Ok(shadow) if !exists => {
                        let id = self.folios.len();
                        self.folios.push(folio);
                        let new = FE::Folio {
                            id,
                            order: o,
                            tags: 0,
                        };
                        let want = match self.model.covering(s) {
                            Some((cs, FE::Shadow { value, order: co })) if co > o => {
                                // partial split of the larger shadow: buddy
                                // halves around the folio's block
                                self.model.map.remove(&cs);
                                let (mut lo, mut k) = (cs, co);
                                while k > o {
                                    k -= 1;
                                    let half = 1u64 << k;
                                    let sh = FE::Shadow { value, order: k };
                                    if s >= lo + half {
                                        self.model.map.insert(lo, sh);
                                        lo += half;
                                    } else {
                                        self.model.map.insert(lo + half, sh);
                                    }
                                }
                                Some(value)
                            }
                            _ => {
                                let mut last = None;
                                for x in overlap {
                                    if let Some(FE::Shadow { value, .. }) =
                                        self.model.map.remove(&x)
                                    {
                                        last = Some(value);
                                    }
                                }
                                last
                            }
                        };
                        self.model.map.insert(s, new);
                        let got = shadow.map(|sh| sh.to_value());
                        if got != want {
                            self.fail(op, format!("add_folio returned {got:?}, want {want:?}"));
                        }
                    }
                    r => self.fail(
                        op,
                        format!("add_folio({s:#x}, {o}) = {r:?}, exists {exists}, faults {faults}"),
                    ),
                }
            }
            FmOp::Remove { index, shadow } => {
                let i = fix(index);
                let sh = shadow.map(|v| Shadow::from_value((v as u64 * 0x1_0001) & MAX_VALUE));
                let (folio, at) = match self.model.folio_at(i) {
                    Some((s, id)) => (Arc::clone(&self.folios[id]), Some(s)),
                    None => match self.folios.len() {
                        0 => return,
                        n => (Arc::clone(&self.folios[index as usize % n]), None),
                    },
                };
                let cached = at.is_some()
                    || self.model.map.values().any(
                        |e| matches!(e, FE::Folio { id, .. } if core::ptr::eq(&*self.folios[*id], &*folio)),
                    );
                let at = at.or_else(|| cached.then(|| folio.index()));
                let r = self.m.remove_folio(&folio, sh);
                if r != cached {
                    self.fail(op, format!("remove_folio = {r}, cached {cached}"));
                }
                if let Some(s) = at {
                    let order = folio.order();
                    match sh {
                        Some(sh) => {
                            self.model.map.insert(
                                s,
                                FE::Shadow {
                                    value: sh.to_value(),
                                    order,
                                },
                            );
                        }
                        None => {
                            self.model.map.remove(&s);
                        }
                    }
                }
            }
            FmOp::DropShadow { index } => {
                let i = fix(index);
                let want = match self.model.covering(i) {
                    Some((s, FE::Shadow { .. })) => {
                        self.model.map.remove(&s);
                        true
                    }
                    _ => false,
                };
                if self.m.drop_shadow(i) != want {
                    self.fail(op, format!("drop_shadow({i:#x}) != {want}"));
                }
            }
            FmOp::MarkDirty { index } => {
                let i = fix(index);
                let want = self.model.folio_at(i);
                if let Some((s, _)) = want {
                    *self.model.tags_mut(s) |= DIRTY;
                }
                if self.m.mark_dirty(i) != want.is_some() {
                    self.fail(op, format!("mark_dirty({i:#x}) != {}", want.is_some()));
                }
            }
            FmOp::StartWriteback { index } | FmOp::EndWriteback { index } => {
                let i = fix(index);
                let start = matches!(op, FmOp::StartWriteback { .. });
                let want = self.model.folio_at(i);
                if let Some((s, _)) = want {
                    let t = self.model.tags_mut(s);
                    if start {
                        *t = (*t | WRITEBACK) & !(DIRTY | TOWRITE);
                    } else {
                        *t &= !WRITEBACK;
                    }
                }
                let got = if start {
                    self.m.start_writeback(i)
                } else {
                    self.m.end_writeback(i)
                };
                if got != want.is_some() {
                    self.fail(op, format!("writeback({i:#x}) != {}", want.is_some()));
                }
            }
            FmOp::TagForWriteback { start, len } => {
                let s = fix(start);
                let e = s.saturating_add(len as u64 % 4096);
                let mut n = 0;
                for x in self.model.overlapping(s, e) {
                    if let Some(FE::Folio { tags, .. }) = self.model.map.get_mut(&x) {
                        if *tags & DIRTY != 0 {
                            *tags |= TOWRITE;
                            n += 1;
                        }
                    }
                }
                let got = self.m.tag_for_writeback(s, e);
                if got != n {
                    self.fail(op, format!("tag_for_writeback = {got}, want {n}"));
                }
            }
            FmOp::FoliosTagged { start, len, tag } => {
                let s = fix(start);
                let e = s.saturating_add(len as u64 % 4096);
                let (tag, bit) = TAGS[tag as usize % 3];
                let want: Vec<usize> = self
                    .model
                    .overlapping(s, e)
                    .into_iter()
                    .filter_map(|x| match self.model.map[&x] {
                        FE::Folio { id, tags, .. } if tags & bit != 0 => Some(id),
                        _ => None,
                    })
                    .collect();
                let got: Vec<usize> = self
                    .m
                    .folios_tagged(s, e, tag)
                    .iter()
                    .map(|f| self.id_of(f).expect("known folio"))
                    .collect();
                if got != want {
                    self.fail(op, format!("folios_tagged {got:?}, want {want:?}"));
                }
            }
            FmOp::Lookup { index } => {
                let i = fix(index);
                let got = match self.m.lookup_entry(i) {
                    None => None,
                    Some(Lookup::Folio(f)) => Some(FE::Folio {
                        id: self.id_of(&f).expect("known folio"),
                        order: f.order(),
                        tags: 0,
                    }),
                    Some(Lookup::Shadow(sh)) => Some(FE::Shadow {
                        value: sh.to_value(),
                        order: 0,
                    }),
                };
                let want = self.model.covering(i).map(|(_, e)| match e {
                    FE::Folio { id, order, .. } => FE::Folio { id, order, tags: 0 },
                    FE::Shadow { value, .. } => FE::Shadow { value, order: 0 },
                });
                if got != want {
                    self.fail(op, format!("lookup_entry({i:#x}) = {got:?}, want {want:?}"));
                }
            }
            FmOp::Flush => {
                for _ in 0..4 {
                    kxarray::pin().flush();
                }
            }
        }
    }
}

/// Decode an input (`None`: not decodable).
pub(crate) fn decode(data: &[u8]) -> Option<Vec<FmOp>> {
    Vec::<FmOp>::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// Decode and run; undecodable inputs are ignored.
pub(crate) fn run_bytes(data: &[u8]) {
    if let Some(ops) = decode(data) {
        run(&ops);
    }
}

/// Run ops against a fresh cache and the model; panics on the first
/// difference.
pub(crate) fn run(ops: &[FmOp]) {
    let mut h = Harness {
        m: AddressSpace::new(),
        model: FmModel::default(),
        folios: Vec::new(),
        step: 0,
    };
    for op in ops.iter().take(MAX_OPS) {
        h.apply(op);
        h.check_all(op);
        h.step += 1;
    }
    let folios = std::mem::take(&mut h.folios);
    drop(h);
    // Other threads (parallel tests) may hold the epoch back for a while.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while folios.iter().any(|f| Arc::strong_count(f) != 1) && std::time::Instant::now() < deadline {
        kxarray::pin().flush();
    }
    for (id, f) in folios.iter().enumerate() {
        assert_eq!(
            Arc::strong_count(f),
            1,
            "folio {id}: the tree's reference was not dropped exactly once"
        );
    }
}
