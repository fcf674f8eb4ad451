//! Lock-free iteration through a cursor: `find`, `find_marked`, `next`, `prev`, `pause`.

use super::iter::CursorIter;
use super::state::{max_index, Pos, XaState};
use crate::entry::RawEntry;
use crate::item::{EntryRef, Item};
use crate::mark::Mark;
use crate::node::{NodeRef, Shared, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};

impl<'a, T: Item> XaState<'a, T> {
    #[inline]
    pub(crate) fn move_index(&mut self, n: NodeRef<'_, Shared>, offset: u64) {
        let shift = n.shift as u32;
        // the kernel's `~XA_CHUNK_MASK << shift`: clears the bits below the
        // node's offset too, so the index lands on the slot's first index
        self.index &= (!CHUNK_MASK) << shift;
        self.index = self.index.wrapping_add(offset << shift);
    }

    /// `xas_find`, raw: may return RETRY and ZERO entries.
    pub(crate) fn find_raw(&mut self, max: u64) -> RawEntry {
        match self.pos {
            Pos::Error(_) | Pos::Bounds => return RawEntry::NULL,
            _ => {}
        }
        if self.index > max {
            return self.set_bounds();
        }
        match self.pos {
            Pos::Head => {
                self.index = 1;
                return self.set_bounds();
            }
            Pos::Restart => {
                let entry = self.load_raw();
                if !entry.is_null() || !matches!(self.pos, Pos::Node(_)) {
                    return entry;
                }
            }
            Pos::Node(node) => {
                let n = node;
                if self.offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
                    if n.shift == 0 {
                        self.offset = (((self.index.wrapping_sub(1)) & CHUNK_MASK) + 1) as u8;
                    } else {
                        self.offset = ((self.index >> n.shift) & CHUNK_MASK) as u8;
                    }
                }
            }
            _ => {}
        }
        let Pos::Node(mut node) = self.pos else {
            return RawEntry::NULL;
        };
        // xas_next_offset
        self.offset += 1;
        self.move_index(node, self.offset as u64);
        loop {
            if self.index > max {
                break;
            }
            let n = node;
            if self.offset as usize == CHUNK_SIZE {
                self.offset = n.offset + 1;
                match n.parent_ref() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                        continue;
                    }
                    None => {
                        self.pos = Pos::Bounds;
                        self.bounds_at_root = false;
                        return RawEntry::NULL;
                    }
                }
            }
            // Skip the empty slots in one step with the occupancy word
            // (node.rs invariants: an entry present throughout has its bit).
            let next = n.next_occupied(self.offset as usize);
            if next != self.offset as usize {
                self.offset = next as u8;
                self.move_index(n, next as u64);
                if self.index == 0 && next == CHUNK_SIZE {
                    // wrapped past u64::MAX
                    self.pos = Pos::Bounds;
                    self.bounds_at_root = false;
                    return RawEntry::NULL;
                }
                continue;
            }
            let entry = n.slot(self.offset as usize);
            if entry.is_node() {
                // SAFETY: a node entry read from this tree under the cursor's
                // guard; nodes are retired only through the epoch (state.rs inv. 1).
                node = unsafe { self.node_of(entry) };
                self.look_ahead(n, self.offset as usize, node);
                self.pos = Pos::Node(node);
                self.offset = 0;
                continue;
            }
            if !entry.is_null() && !entry.is_sibling() {
                return entry;
            }
            self.offset += 1;
            self.move_index(n, self.offset as u64);
            if self.index == 0 && self.offset as usize == CHUNK_SIZE {
                // wrapped past u64::MAX
                self.pos = Pos::Bounds;
                self.bounds_at_root = false;
                return RawEntry::NULL;
            }
        }
        RawEntry::NULL
    }

    /// The leaf the cursor sits on, for an iterator that scans its slots
    /// directly: `(leaf, current offset, last offset to scan, index of slot
    /// 0)`, the last offset bounded by `max`. `None` unless the cursor is on
    /// an entry in a leaf.
    #[inline]
    pub(crate) fn leaf_window(&self, max: u64) -> Option<(NodeRef<'a, Shared>, usize, usize, u64)> {
        let Pos::Node(n) = self.pos else { return None };
        if n.shift != 0 || self.offset as u64 != self.index & CHUNK_MASK || self.index > max {
            return None;
        }
        let base = self.index & !CHUNK_MASK;
        let last = (max - base).min(CHUNK_MASK);
        Some((n, self.offset as usize, last as usize, base))
    }

    /// Move the cursor to `offset` of the leaf it is on (after an iterator
    /// scanned the leaf directly).
    #[inline]
    pub(crate) fn set_leaf_offset(&mut self, offset: usize) {
        self.offset = offset as u8;
        self.index = (self.index & !CHUNK_MASK) | offset as u64;
    }

    /// `xas_next_entry`: the inline fast path of iteration within a leaf.
    #[inline(always)]
    pub(crate) fn next_entry_raw(&mut self, max: u64) -> RawEntry {
        if let Pos::Node(node) = self.pos {
            let n = node;
            if n.shift == 0 && self.offset as u64 == self.index & CHUNK_MASK {
                loop {
                    if self.index >= max || self.offset as u64 == CHUNK_MASK {
                        break;
                    }
                    let entry = n.slot(self.offset as usize + 1);
                    if entry.is_internal() {
                        break;
                    }
                    self.offset += 1;
                    self.index += 1;
                    if !entry.is_null() {
                        return entry;
                    }
                    // An empty slot: jump to the next non-empty one by the
                    // occupancy word (or leave the leaf if there is none),
                    // not past `max`.
                    let next = n.next_occupied(self.offset as usize + 1);
                    if next == CHUNK_SIZE {
                        break;
                    }
                    let skip = (next - 1 - self.offset as usize) as u64;
                    if skip > max - self.index {
                        break;
                    }
                    self.offset += skip as u8;
                    self.index += skip;
                }
            }
        }
        self.find_raw(max)
    }

    /// The next present entry at or after the cursor's index, up to `max`
    /// (`xas_find`). On an unwalked cursor this returns the entry at the
    /// index itself; on a walked one it moves past the current entry. The
    /// entry's index is then [`XaState::index`]. Multi-index entries are
    /// returned once.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(7, Entry::Value(7)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// assert_eq!(xas.find(u64::MAX).and_then(|e| e.value()), Some(7));
    /// assert_eq!(xas.index(), 7);
    /// ```
    #[inline]
    pub fn find(&mut self, max: u64) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.next_entry_raw(max);
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            if e.is_zero() {
                continue;
            }
            // SAFETY: user entries read under `self.guard` (default
            // collector, where item frees are deferred) live for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// The next entry with `mark` at or after the index, up to `max`
    /// (`xas_find_marked`).
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(7, Entry::Value(7)).unwrap();
    /// xa.store(8, Entry::Value(8)).unwrap();
    /// xa.set_mark(8, Mark::M0);
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// assert_eq!(xas.find_marked(u64::MAX, Mark::M0).and_then(|e| e.value()), Some(8));
    /// ```
    pub fn find_marked(&mut self, max: u64, mark: Mark) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.find_marked_raw(max, mark);
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            if e.is_zero() {
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    #[inline]
    pub(crate) fn find_chunk(
        n: NodeRef<'_, Shared>,
        offset: usize,
        advance: bool,
        mark: Mark,
    ) -> usize {
        let offset = offset + advance as usize;
        if offset < CHUNK_SIZE {
            let data = n.marks(mark) & (u64::MAX << offset);
            if data != 0 {
                return data.trailing_zeros() as usize;
            }
        }
        CHUNK_SIZE
    }

    /// `xas_find_marked`, raw.
    pub(crate) fn find_marked_raw(&mut self, max: u64, mark: Mark) -> RawEntry {
        let xa = self.xa;
        let mut advance = true;
        let mut climbed = false;
        if let Pos::Error(_) = self.pos {
            return RawEntry::NULL;
        }
        if self.index > max {
            self.pos = Pos::Restart;
            return RawEntry::NULL;
        }
        let mut node;
        match self.pos {
            Pos::Head => {
                self.index = 1;
                return self.find_marked_out(max);
            }
            Pos::Restart | Pos::Bounds => {
                advance = false;
                self.walks += 1;
                self.seq = xa.seq();
                let entry = xa.head.load();
                self.pos = Pos::Head;
                // SAFETY: the head, read under the cursor's guard (state.rs inv. 1).
                let top = entry.is_node().then(|| unsafe { self.node_of(entry) });
                if self.index > max_index(top) {
                    return self.find_marked_out(max);
                }
                if !entry.is_node() {
                    if xa.marked(mark) {
                        return entry;
                    }
                    self.index = 1;
                    return self.find_marked_out(max);
                }
                // SAFETY: a node entry read from this tree under the cursor's
                // guard; nodes are retired only through the epoch (state.rs inv. 1).
                node = unsafe { self.node_of(entry) };
                self.pos = Pos::Node(node);
                self.offset = (self.index >> node.shift) as u8;
            }
            Pos::Node(n) => node = n,
            Pos::Error(_) => unreachable!(),
        }
        while self.index <= max {
            let n = node;
            if self.offset as usize == CHUNK_SIZE {
                self.offset = n.offset + 1;
                match n.parent_ref() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                    }
                    None => break,
                }
                advance = false;
                climbed = true;
                continue;
            }
            if !advance {
                let entry = n.slot(self.offset as usize);
                if entry.is_sibling() {
                    if climbed {
                        // Just climbed out of the child at the previous
                        // slot: a sibling here belongs to an entry stored
                        // over that child meanwhile, which lies behind the
                        // cursor. Moving back to it would make a lock-free
                        // walk go backwards; step past it instead.
                        advance = true;
                    } else {
                        self.offset = entry.to_sibling() as u8;
                        self.move_index(n, self.offset as u64);
                    }
                }
            }
            climbed = false;
            let offset = Self::find_chunk(n, self.offset as usize, advance, mark);
            if offset > self.offset as usize {
                advance = false;
                self.move_index(n, offset as u64);
                // mind the wrap
                if self.index.wrapping_sub(1) >= max {
                    self.pos = Pos::Restart;
                    return RawEntry::NULL;
                }
                self.offset = offset as u8;
                if offset == CHUNK_SIZE {
                    continue;
                }
            }
            let entry = n.slot(self.offset as usize);
            if entry.is_null() && !(xa.track_free() && mark == Mark::FREE) {
                advance = true;
                continue;
            }
            if entry.is_sibling() {
                advance = true;
                continue;
            }
            if !entry.is_node() {
                return entry;
            }
            // SAFETY: a node entry read from this tree under the cursor's
            // guard; nodes are retired only through the epoch (state.rs inv. 1).
            node = unsafe { self.node_of(entry) };
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> node.shift) & CHUNK_MASK) as u8;
        }
        self.find_marked_out(max)
    }

    pub(crate) fn find_marked_out(&mut self, max: u64) -> RawEntry {
        if self.index > max {
            self.pos = Pos::Restart;
            return RawEntry::NULL;
        }
        self.set_bounds()
    }

    /// Move to the next index and return its entry (`xas_next`); wraps from
    /// `u64::MAX` to 0. On an unwalked cursor, loads the current index
    /// without moving.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.load();
    /// assert_eq!(xas.next().and_then(|e| e.value()), Some(1));
    /// ```
    #[allow(clippy::should_implement_trait)] // the kernel's name, not an Iterator
    pub fn next(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.next_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Move to the previous index and return its entry (`xas_prev`); wraps
    /// from 0 to `u64::MAX`.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 2);
    /// xas.load();
    /// assert_eq!(xas.prev().and_then(|e| e.value()), Some(1));
    /// ```
    pub fn prev(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.prev_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: as in `find`.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    pub(crate) fn frozen(&self) -> bool {
        matches!(self.pos, Pos::Restart | Pos::Error(_))
    }

    /// Whether the slot offset is out of step with the index (a load that
    /// landed on a sibling slot leaves it at the canonical slot).
    #[inline]
    fn desynced(&self) -> bool {
        match self.pos {
            Pos::Node(node) => {
                let n = node;
                self.offset as u64 != (self.index >> n.shift) & CHUNK_MASK
            }
            _ => false,
        }
    }

    pub(crate) fn next_raw(&mut self) -> RawEntry {
        // inline fast path
        if let Pos::Node(node) = self.pos {
            let n = node;
            if n.shift == 0
                && (self.offset as u64) < CHUNK_MASK
                && self.offset as u64 == self.index & CHUNK_MASK
            {
                self.index += 1;
                self.offset += 1;
                return n.slot(self.offset as usize);
            }
        }
        // A load that landed on a sibling slot leaves the offset at the
        // canonical slot while the index stays put; the kernel then steps
        // the offset alongside the index and reads slots that lie behind it
        // (in a non-leaf node, inside an unrelated subtree). kxarray walks
        // from the top instead, so every step returns what covers its index
        // (a deliberate difference, see docs/kernel-differences.md).
        let desynced = self.desynced();
        if !self.frozen() {
            self.index = self.index.wrapping_add(1);
            // Stepping off the top of the index space. The kernel relies on
            // climbing past the top node's last slot instead, which a full
            // height tree (a 64-slot top node at shift 60 uses 16 slots)
            // never reaches: it went on reading slots 16.. of the top node
            // while its index counted 0, 1, 2... (a deliberate difference).
            if self.index == 0 && matches!(self.pos, Pos::Node(_)) {
                return self.set_bounds();
            }
        }
        if desynced && !self.frozen() {
            self.pos = Pos::Restart;
            return self.load_raw();
        }
        let node = match self.pos {
            Pos::Head => return self.set_bounds(),
            Pos::Node(n) => n,
            _ => return self.load_raw(),
        };
        let mut node = node;
        let n = node;
        if self.offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
            self.offset += 1;
        }
        while self.offset as usize == CHUNK_SIZE {
            let n = node;
            self.offset = n.offset + 1;
            match n.parent_ref() {
                Some(p) => {
                    node = p;
                    self.pos = Pos::Node(p);
                }
                None => return self.set_bounds(),
            }
        }
        loop {
            let n = node;
            let entry = n.slot(self.offset as usize);
            if !entry.is_node() {
                return entry;
            }
            // SAFETY: a node entry read from this tree under the cursor's
            // guard; nodes are retired only through the epoch (state.rs inv. 1).
            node = unsafe { self.node_of(entry) };
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> node.shift) & CHUNK_MASK) as u8;
        }
    }

    pub(crate) fn prev_raw(&mut self) -> RawEntry {
        if let Pos::Node(node) = self.pos {
            let n = node;
            if n.shift == 0 && self.offset != 0 && self.offset as u64 == self.index & CHUNK_MASK {
                self.index -= 1;
                self.offset -= 1;
                return n.slot(self.offset as usize);
            }
        }
        // A load that landed on a sibling slot leaves the offset at the
        // canonical slot while the index stays put; the kernel then steps
        // the offset alongside the index and reads slots that lie behind it
        // (in a non-leaf node, inside an unrelated subtree). kxarray walks
        // from the top instead, so every step returns what covers its index
        // (a deliberate difference, see docs/kernel-differences.md).
        let desynced = self.desynced();
        if !self.frozen() {
            self.index = self.index.wrapping_sub(1);
            // Stepping off the bottom of the index space (see `next_raw`).
            if self.index == u64::MAX && matches!(self.pos, Pos::Node(_)) {
                return self.set_bounds();
            }
        }
        if desynced && !self.frozen() {
            self.pos = Pos::Restart;
            return self.load_raw();
        }
        let node = match self.pos {
            Pos::Head => return self.set_bounds(),
            Pos::Node(n) => n,
            _ => return self.load_raw(),
        };
        let mut node = node;
        let n = node;
        // offset as i32 to model the kernel's 255 wrap
        let mut offset = self.offset as i32;
        if offset as u64 != (self.index >> n.shift) & CHUNK_MASK {
            offset -= 1;
        }
        while offset == -1 {
            let n = node;
            offset = n.offset as i32 - 1;
            match n.parent_ref() {
                Some(p) => {
                    node = p;
                    self.pos = Pos::Node(p);
                }
                None => return self.set_bounds(),
            }
        }
        self.offset = offset as u8;
        loop {
            let n = node;
            let entry = n.slot(self.offset as usize);
            if !entry.is_node() {
                return entry;
            }
            // SAFETY: a node entry read from this tree under the cursor's
            // guard; nodes are retired only through the epoch (state.rs inv. 1).
            node = unsafe { self.node_of(entry) };
            self.pos = Pos::Node(node);
            self.offset = ((self.index >> node.shift) & CHUNK_MASK) as u8;
        }
    }

    /// Prepare to drop the lock (or guard) mid-iteration (`xas_pause`): the
    /// index moves past the current entry and its siblings and the position
    /// is forgotten, so the next `find` resumes correctly.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{CursorState, Entry, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.find(u64::MAX);
    /// xas.pause();
    /// assert_eq!((xas.index(), xas.state()), (2, CursorState::Restart));
    /// ```
    pub fn pause(&mut self) {
        let node = match self.pos {
            Pos::Node(n) => n,
            Pos::Head => {
                self.pos = Pos::Restart;
                self.index = self.index.wrapping_add(1);
                return;
            }
            _ => return,
        };
        self.pos = Pos::Restart;
        let n = node;
        let mut offset = self.offset as usize;
        loop {
            offset += 1;
            if offset >= CHUNK_SIZE || !n.slot(offset).is_sibling() {
                break;
            }
        }
        // Resume at the slot after the entry, counted from the node's first
        // index. The kernel adds `offset - xa_offset` to the index instead,
        // which overshoots (skipping entries) when a load left the index
        // inside a multi-index entry past its canonical slot; see
        // docs/kernel-differences.md.
        let shift = n.shift as u32;
        let node_span_bits = shift + CHUNK_SHIFT;
        let base = if node_span_bits >= 64 {
            0
        } else {
            self.index & (u64::MAX << node_span_bits)
        };
        self.index = base.wrapping_add((offset as u64) << shift);
        if self.index == 0 {
            self.pos = Pos::Bounds;
            self.bounds_at_root = false;
        }
    }

    /// An iterator over the present entries from the cursor's index to
    /// `max` (inclusive), yielding `(index, entry)` (`xas_for_each`).
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// for i in [2, 4] {
    ///     xa.store(i, Entry::Value(i)).unwrap();
    /// }
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// assert_eq!(xas.iter(u64::MAX).count(), 2);
    /// ```
    pub fn iter<'c>(&'c mut self, max: u64) -> CursorIter<'c, 'a, T> {
        CursorIter { xas: self, max }
    }
}
