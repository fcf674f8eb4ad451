//! The cursor operations of the `api` harness: walks (`next`, `prev`,
//! `find`, `find_marked`, with `pause`) checked against the model, and a
//! cursor reused after its lock was dropped and the array written through
//! another path.

use super::super::api_model::{align, end, Kind, ME};
use super::{defect, ApiOp, Harness};
use kxarray::{Entry, Mark, XaState};

impl Harness {
    pub(super) fn walk(&mut self, op: &ApiOp, start: u64, max: u64, how: u8, pause: u8, m: Mark) {
        let guard = kxarray::pin();
        let mut xas = XaState::new(&self.xa, &guard, start);
        let visible = |e: &ME| e.kind != Kind::Reserved;
        match how % 4 {
            0 | 1 => {
                let fwd = how.is_multiple_of(4);
                // an unwalked cursor loads its index without moving
                let mut expect = Some(start);
                // How far behind its own index the walk may be reading once
                // desynced (see below).
                let mut lag: Option<u64> = None;
                for k in 0..40u32 {
                    let e = if fwd { xas.next() } else { xas.prev() };
                    let i = xas.index();
                    if expect.is_some_and(|x| x != i) {
                        self.fail(op, format!("walk step {k}: index {i:#x}, want {expect:x?}"));
                    }
                    let got = Self::kind_of(e);
                    let cov = self.model.covering(i);
                    let want = cov.and_then(|(_, e)| Self::visible(e.kind));
                    // next/prev on a slot inside a multi-index entry (past
                    // its first index) return None: the kernel's xas_next
                    // returns the raw sibling entry there, which kxarray
                    // cannot hand out. Documented behaviour, not a defect.
                    let sibling = cov.is_some_and(|(s, _)| s != i);
                    // Stepping off either end (u64::MAX -> 0, 0 -> u64::MAX)
                    // returns None, as the kernel's __xas_next/__xas_prev do
                    // (set_bounds), whatever is at the index it wrapped to.
                    let wrapped = k > 0 && (if fwd { i == 0 } else { i == u64::MAX });
                    // After a load that landed on a sibling slot the
                    // kernel's xas_load leaves the slot offset at the
                    // canonical slot while the index stays put, and
                    // xas_next/xas_prev then step both by one (the inline
                    // fast path), so the walk reads a slot as far behind
                    // its index as the landing was from the canonical slot
                    // until it leaves the node (in either direction the
                    // slot read is the lag below the index): None (a
                    // sibling) or an entry covering an index in that span.
                    if sibling {
                        let d = cov.map_or(0, |(s, _)| i - s);
                        lag = Some(lag.map_or(d, |l: u64| l.max(d)));
                    }
                    let behind_ok = lag.is_some_and(|d| {
                        self.model
                            .overlapping(i.saturating_sub(d), i)
                            .into_iter()
                            .any(|s| Self::visible(self.model.map[&s].kind) == got)
                    });
                    let kernel_like = (got.is_none() && (sibling || wrapped || lag.is_some()))
                        || (got.is_some() && behind_ok);
                    if got != want && !kernel_like {
                        self.fail(
                            op,
                            format!("walk step {k} at {i:#x}: {got:?}, want {want:?}"),
                        );
                    }
                    expect = Some(if fwd {
                        i.wrapping_add(1)
                    } else {
                        i.wrapping_sub(1)
                    });
                    if pause != 0 && k.is_multiple_of(pause as u32 % 8 + 1) {
                        if !fwd {
                            break;
                        }
                        // pause moves past the entry and its siblings
                        // (where the next step lands depends on the
                        // state pause left, as in the kernel)
                        xas.pause();
                        expect = None;
                    }
                }
            }
            h => {
                let marked = h == 3;
                let want: Vec<(u64, Kind)> = self
                    .model
                    .overlapping(start, max.max(start))
                    .into_iter()
                    .map(|s| (s, self.model.map[&s]))
                    .filter(|(_, e)| visible(e) && (!marked || e.marks & (1 << m.index()) != 0))
                    .map(|(s, e)| (s, e.kind))
                    .filter(|_| start <= max)
                    .collect();
                let mut got = Vec::new();
                let mut k = 0u32;
                loop {
                    let e = if marked {
                        xas.find_marked(max, m)
                    } else {
                        xas.find(max)
                    };
                    let Some(e) = e else { break };
                    got.push((xas.index(), Self::kind_of(Some(e)).unwrap()));
                    k += 1;
                    if got.len() > want.len() + 2 {
                        break;
                    }
                    if pause != 0 && k.is_multiple_of(pause as u32 % 8 + 1) {
                        xas.pause();
                    }
                }
                let ok = got.len() == want.len()
                    && got.iter().zip(&want).all(|(&(gi, gk), &(ws, wk))| {
                        gk == wk && (gi == ws || (ws < start && gi >= ws && gi <= start))
                    });
                if !ok {
                    self.fail(
                        op,
                        format!(
                            "find{} from {start:#x} to {max:#x}: {got:?}, want {want:?}",
                            if marked { "_marked" } else { "" }
                        ),
                    );
                }
            }
        }
    }

    pub(super) fn stale(&mut self, op: &ApiOp, at: u64, write: u8, index: u64, o: u32, value: u64) {
        if self.alloc_flags.is_some() {
            // A raw cursor store leaves the free mark alone, as the kernel's
            // xas_store does (xa_store clears it); not modelled.
            return;
        }
        let guard = kxarray::pin();
        let mut xas = XaState::new(&self.xa, &guard, at);
        let _ = xas.load();
        match write % 3 {
            0 => {
                let s = align(index, o);
                drop(self.xa.store_order(s, o, Entry::Value(value)).unwrap());
                self.model.store(s, o, Kind::Value(value));
            }
            1 => {
                drop(self.xa.erase(index));
                if let Some((s, _)) = self.model.covering(index) {
                    self.model.map.remove(&s);
                }
            }
            _ => {
                let s = align(index, o);
                self.xa.store_range(s, end(s, o), Some(value)).unwrap();
                self.model.store_range(s, end(s, o), Some(value));
            }
        }
        let lock = self.xa.lock();
        if !self.on(defect::STALE_CURSOR) {
            xas.reset(); // a known defect: stale cursors
        }
        match xas.store(&lock, Some(Entry::Value(value + 1))) {
            Ok(_) => {
                drop(lock);
                self.model.store(at, 0, Kind::Value(value + 1));
            }
            Err(r) => self.fail(op, format!("stale cursor store: {:?}", r.error)),
        }
    }
}
