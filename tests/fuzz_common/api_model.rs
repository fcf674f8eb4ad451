//! The reference model of the `api` fuzz target: aligned, non-overlapping
//! entries (items, values, reservations) keyed by first index, with the
//! kernel's semantics for stores over larger and smaller entries, range
//! stores as aligned blocks (`xas_set_range`), and both kinds of split.

use std::collections::BTreeMap;

pub(crate) fn align(i: u64, o: u32) -> u64 {
    i & !((1u64 << o) - 1)
}

pub(crate) fn end(s: u64, o: u32) -> u64 {
    s + ((1u64 << o) - 1)
}

/// What a model entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Item(u64),
    Value(u64),
    Reserved,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ME {
    pub kind: Kind,
    pub order: u32,
    pub marks: u8,
}

/// The model: aligned, non-overlapping entries keyed by first index.
#[derive(Default, Debug)]
pub(crate) struct ApiModel {
    pub map: BTreeMap<u64, ME>,
}

impl ApiModel {
    pub(crate) fn covering(&self, i: u64) -> Option<(u64, ME)> {
        let (&s, &e) = self.map.range(..=i).next_back()?;
        (end(s, e.order) >= i).then_some((s, e))
    }
    pub(crate) fn overlapping(&self, first: u64, last: u64) -> Vec<u64> {
        let mut v = Vec::new();
        if let Some((s, _)) = self.covering(first) {
            if s < first {
                v.push(s);
            }
        }
        v.extend(self.map.range(first..=last).map(|(&s, _)| s));
        v
    }
    /// Store over the order-`o` block at `s` (kernel semantics); returns
    /// the old kind when there was exactly one entry (or none).
    pub(crate) fn store(&mut self, s: u64, o: u32, kind: Kind) -> Option<Option<Kind>> {
        if let Some((cs, e)) = self.covering(s) {
            if e.order > o {
                self.map.get_mut(&cs).unwrap().kind = kind;
                return Some(Some(e.kind));
            }
        }
        let starts = self.overlapping(s, end(s, o));
        let ret = match starts.as_slice() {
            [] => Some(None),
            [x] if *x == s && self.map[x].order == o => Some(Some(self.map[x].kind)),
            _ => None,
        };
        let mut marks = 0;
        for x in starts {
            marks |= self.map.remove(&x).unwrap().marks;
        }
        self.map.insert(
            s,
            ME {
                kind,
                order: o,
                marks,
            },
        );
        ret
    }
    pub(crate) fn erase_block(&mut self, s: u64, o: u32) {
        for x in self.overlapping(s, end(s, o)) {
            self.map.remove(&x);
        }
    }
    /// `store_range` as aligned blocks (`xas_set_range`), replacing whole
    /// any entry that straddles a block edge.
    pub(crate) fn store_range(&mut self, first: u64, last: u64, value: Option<u64>) {
        let mut f = first;
        loop {
            let mut limit = last;
            let next_end = loop {
                let mut o = if f == 0 {
                    63
                } else {
                    f.trailing_zeros().min(63)
                };
                while o > 0 && (limit - f) < (1u64 << o) - 1 {
                    o -= 1;
                }
                let bl = end(f, o);
                if let Some((s, e)) = self.covering(f) {
                    if s < f || end(s, e.order) > bl {
                        let t = end(s, e.order);
                        match value {
                            Some(v) => {
                                self.map.get_mut(&s).unwrap().kind = Kind::Value(v);
                            }
                            None => {
                                self.map.remove(&s);
                            }
                        }
                        break t;
                    }
                }
                if let Some((s, e)) = self.covering(bl) {
                    if end(s, e.order) > bl && s > f {
                        limit = s - 1;
                        continue;
                    }
                }
                match value {
                    Some(v) => {
                        self.store(f, o, Kind::Value(v));
                    }
                    None => self.erase_block(f, o),
                }
                break bl;
            };
            if next_end >= last {
                return;
            }
            f = next_end + 1;
        }
    }
    pub(crate) fn split(&mut self, s: u64, n: u32, at: u64, partial: bool) {
        let e = self.map.remove(&s).unwrap();
        if !partial {
            for k in 0..(1u64 << (e.order - n)) {
                self.map.insert(s + (k << n), ME { order: n, ..e });
            }
            return;
        }
        // buddy halves around the block of order n containing `at`
        let mut lo = s;
        let mut o = e.order;
        while o > n {
            o -= 1;
            let half = 1u64 << o;
            if at >= lo + half {
                self.map.insert(lo, ME { order: o, ..e });
                lo += half;
            } else {
                self.map.insert(lo + half, ME { order: o, ..e });
            }
        }
        self.map.insert(lo, ME { order: n, ..e });
    }
    pub(crate) fn first_free(&self, lo: u64, hi: u64, zero_busy: bool) -> Option<u64> {
        let mut i = lo;
        while i <= hi {
            if i == 0 && zero_busy {
                i = 1;
                continue;
            }
            match self.covering(i) {
                Some((s, e)) => match end(s, e.order).checked_add(1) {
                    Some(n) => i = n,
                    None => return None,
                },
                None => return Some(i),
            }
        }
        None
    }
}
