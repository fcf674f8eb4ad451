//! Lock-free iterators over an array, the owning iterator, and `FromIterator`.

use crate::engine::array::XArray;
use crate::engine::state::XaState;
use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, ItemRef};
use crate::mark::Mark;
use crate::node::{NodeRef, Shared};
use crate::rejected::Rejected;

// ----------------------------------------------------------------------
// Iteration
// ----------------------------------------------------------------------

/// An ordered, lock-free iterator over entries (one item per multi-index
/// entry), yielding `(index, entry)`. See [`XArray::iter`].
pub struct Iter<'g, T: Item> {
    xas: XaState<'g, T>,
    max: u64,
    mark: Option<Mark>,
    done: bool,
    /// Fast path for unmarked iteration: the leaf being scanned, the offset
    /// of the last entry returned, the last offset to scan, and the index of
    /// slot 0. The cursor is brought up to date before any slow step.
    leaf: Option<(NodeRef<'g, Shared>, usize, usize, u64)>,
}

impl<T: Item> core::fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Iter")
            .field("index", &self.xas.index())
            .field("max", &self.max)
            .field("mark", &self.mark)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<'g, T: Item> Iter<'g, T> {
    pub(crate) fn new(
        xa: &'g XArray<T>,
        guard: &'g Guard,
        start: u64,
        max: u64,
        mark: Option<Mark>,
    ) -> Self {
        Iter {
            xas: XaState::new(xa, guard, start),
            max,
            mark,
            done: false,
            leaf: None,
        }
    }
    pub(crate) fn empty(xa: &'g XArray<T>, guard: &'g Guard) -> Self {
        Iter {
            xas: XaState::new(xa, guard, 0),
            max: 0,
            mark: None,
            done: true,
            leaf: None,
        }
    }
}

impl<'g, T: Item> Iterator for Iter<'g, T> {
    type Item = (u64, EntryRef<'g, T>);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some((leaf, off, last, base)) = &mut self.leaf {
            while *off < *last {
                let e = leaf.slot(*off + 1);
                if e.is_internal() {
                    break; // sibling, retry, reserved: the cursor decides
                }
                *off += 1;
                if !e.is_null() {
                    // SAFETY: read under the iterator's guard, which lives
                    // for 'g and is pinned on the default collector, where
                    // removed items' frees are deferred: they wait for it.
                    return Some((*base + *off as u64, unsafe { EntryRef::from_raw(e) }));
                }
                // An empty slot: jump over the run of empty ones with the
                // leaf's occupancy word (dense leaves never get here).
                let next = leaf.next_occupied(*off + 1);
                *off = (next - 1).min(*last);
            }
            let off = *off;
            self.xas.set_leaf_offset(off);
            self.leaf = None;
        }
        if self.done {
            return None;
        }
        let e = match self.mark {
            None => self.xas.find(self.max),
            Some(m) => self.xas.find_marked(self.max, m),
        };
        match e {
            Some(e) => {
                if self.mark.is_none() {
                    self.leaf = self.xas.leaf_window(self.max);
                }
                Some((self.xas.index(), e))
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

/// An owning iterator, in index order; see `XArray::into_iter`.
pub struct IntoIter<T: Item> {
    xa: XArray<T>,
    next: Option<u64>,
}

impl<T: Item> core::fmt::Debug for IntoIter<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IntoIter")
            .field("next", &self.next)
            .field("array", &self.xa)
            .finish()
    }
}

impl<T: Item> Iterator for IntoIter<T> {
    type Item = (u64, Entry<T>);
    fn next(&mut self) -> Option<Self::Item> {
        let start = self.next?;
        let index = {
            let guard = pin();
            let (i, _) = self.xa.find(start, u64::MAX, None, &guard)?;
            i
        };
        self.next = index.checked_add(1);
        let e = self.xa.remove(index)?;
        Some((index, e))
    }
}

impl<T: Item> IntoIterator for XArray<T> {
    type Item = (u64, Entry<T>);
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter {
            xa: self,
            next: Some(0),
        }
    }
}

/// Collects `(index, entry)` pairs; a later pair for the same index
/// replaces the earlier one.
///
/// # Panics
///
/// If a pair cannot be stored: a node allocation failed
/// ([`Error::NoMemory`], as std collections panic when allocation fails) or
/// a value is above [`MAX_VALUE`](crate::MAX_VALUE). Use
/// [`XArray::try_from_iter`] to get the error instead.
impl<T: Item> FromIterator<(u64, Entry<T>)> for XArray<T> {
    fn from_iter<I: IntoIterator<Item = (u64, Entry<T>)>>(iter: I) -> Self {
        match XArray::try_from_iter(iter) {
            Ok(xa) => xa,
            Err((index, rejected)) => from_iter_failed(index, rejected.error),
        }
    }
}

#[cold]
#[inline(never)]
fn from_iter_failed(index: u64, error: Error) -> ! {
    panic!(
        "kxarray: XArray::from_iter could not store index {index}: {error} \
         (XArray::try_from_iter reports this as an error)"
    )
}

impl<T: Item> XArray<T> {
    /// Builds an array from `(index, entry)` pairs, the fallible form of
    /// `collect()`: a later pair for the same index replaces the earlier
    /// one. No lock is taken (the array is not shared yet).
    ///
    /// # Errors
    ///
    /// The first pair that cannot be stored stops the build and comes back
    /// with its index and entry: [`Error::NoMemory`] when a node cannot be
    /// allocated, [`Error::ValueOutOfRange`] for a value above
    /// [`MAX_VALUE`](crate::MAX_VALUE). The pairs stored before it are
    /// dropped with the partly built array.
    ///
    /// ```
    /// use kxarray::{Entry, Error, XArray};
    /// let xa: XArray<Box<u32>> =
    ///     XArray::try_from_iter([(1, Entry::Value(10)), (64, Entry::Item(Box::new(7)))]).unwrap();
    /// assert_eq!(xa.load_value(1), Some(10));
    ///
    /// let bad = XArray::<Box<u32>>::try_from_iter([(3, Entry::Value(u64::MAX))]);
    /// let (index, rejected) = bad.unwrap_err();
    /// assert_eq!((index, rejected.error), (3, Error::ValueOutOfRange(u64::MAX)));
    /// ```
    pub fn try_from_iter<I: IntoIterator<Item = (u64, Entry<T>)>>(
        iter: I,
    ) -> Result<Self, (u64, Rejected<T>)> {
        let mut xa = XArray::new();
        for (index, entry) in iter {
            xa.replace(index, entry).map_err(|r| (index, r))?;
        }
        Ok(xa)
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<XArray<Box<u64>>>();
    let _ = ItemRef::<Box<u64>>::get;
}
