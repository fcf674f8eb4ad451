//! Cursor-borrowing iterators and the stale-position error.

use super::lock::XaLock;
use super::state::XaState;
use crate::item::{EntryRef, Item};

/// Returned by [`XaState::reload`] when the cursor's node was detached by a
/// writer (or the cursor is not positioned): reset and load again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale;

impl core::fmt::Display for Stale {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("cursor position is stale; reset and reload")
    }
}

impl std::error::Error for Stale {}

/// Iterator over present entries from a cursor; see [`XaState::iter`].
pub struct CursorIter<'c, 'a, T: Item> {
    pub(crate) xas: &'c mut XaState<'a, T>,
    pub(crate) max: u64,
}

impl<T: Item> core::fmt::Debug for CursorIter<'_, '_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CursorIter")
            .field("cursor", &*self.xas)
            .field("max", &self.max)
            .finish()
    }
}

impl<'a, T: Item> Iterator for CursorIter<'_, 'a, T> {
    type Item = (u64, EntryRef<'a, T>);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let e = self.xas.find(self.max)?;
        Some((self.xas.index, e))
    }
}

/// Iterator over conflicting entries; see [`XaState::conflicts`].
pub struct Conflicts<'c, 'a, 'l, T: Item> {
    pub(crate) xas: &'c mut XaState<'a, T>,
    pub(crate) lock: &'c XaLock<'l, T>,
}

impl<T: Item> core::fmt::Debug for Conflicts<'_, '_, '_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Conflicts")
            .field("cursor", &*self.xas)
            .finish_non_exhaustive()
    }
}

impl<'a, T: Item> Iterator for Conflicts<'_, 'a, '_, T> {
    type Item = EntryRef<'a, T>;
    fn next(&mut self) -> Option<Self::Item> {
        self.xas.find_conflict(self.lock)
    }
}
