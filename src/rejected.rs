//! [`Rejected`]: a failed operation that consumed an entry hands it back
//! with the [`Error`], so that a failed call never loses the caller's data.

use crate::entry::RawEntry;
use crate::error::Error;
use crate::item::{Entry, Item};
use core::fmt;

/// A failed operation that consumed an entry: the error plus the entry,
/// handed back untouched.
pub struct Rejected<T> {
    /// Why the operation failed.
    pub error: Error,
    /// The entry the caller passed in, returned unchanged (or `None` when the
    /// call stored no entry).
    pub entry: Option<Entry<T>>,
}

impl<T> Rejected<T> {
    pub(crate) fn new(error: Error, entry: Option<Entry<T>>) -> Self {
        Rejected { error, entry }
    }
}

impl<T: Item> Rejected<T> {
    /// The failure of an operation that was given `raw` (from
    /// `Entry::into_raw`) and did not publish it: the caller's entry goes
    /// back in the `Rejected` (none for an empty or internal word).
    ///
    /// # Safety
    ///
    /// - `raw` came from `Entry::<T>::into_raw` (or is not a user entry)
    ///   and was never published in an array, or its publication was
    ///   undone: the caller still owns it;
    /// - it is handed back once.
    pub(crate) unsafe fn unpublished(error: Error, raw: RawEntry) -> Self {
        debug_assert!(!raw.is_node(), "a node word handed back as an entry");
        // SAFETY: the caller's contract: an unpublished entry it owns.
        let entry = raw.is_user().then(|| unsafe { Entry::from_raw(raw) });
        Rejected { error, entry }
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .field("has_entry", &self.entry.is_some())
            .finish()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Rejected<T> {}

impl<T> From<Rejected<T>> for Error {
    fn from(r: Rejected<T>) -> Error {
        r.error
    }
}
