//! Search marks: three independent bits per entry, aggregated up the tree so
//! that a marked search skips whole unmarked subtrees.
//!
//! Invariant (checked by `XArray::check_invariants`): a mark bit on an
//! internal slot is set exactly when some entry below it carries the mark,
//! and the array's root flag for a mark is set exactly when any entry has it.

use core::fmt;

/// One of the three search marks (`XA_MARK_0..=XA_MARK_2`).
///
/// ```
/// use kxarray::Mark;
/// assert_eq!(Mark::new(2), Some(Mark::M2));
/// assert_eq!(Mark::new(3), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mark(u8);

impl Mark {
    /// Mark 0 (also the free-slot mark of allocating arrays).
    pub const M0: Mark = Mark(0);
    /// Mark 1.
    pub const M1: Mark = Mark(1);
    /// Mark 2.
    pub const M2: Mark = Mark(2);
    /// All three marks.
    pub const ALL: [Mark; 3] = [Mark::M0, Mark::M1, Mark::M2];
    /// The mark that allocating arrays use to track free indices.
    pub(crate) const FREE: Mark = Mark::M0;

    /// A mark from its number, `None` above 2.
    pub const fn new(n: u8) -> Option<Mark> {
        if n < 3 {
            Some(Mark(n))
        } else {
            None
        }
    }
    /// The mark's number, 0..=2.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "M{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_three() {
        assert_eq!(Mark::ALL.map(Mark::index), [0, 1, 2]);
        assert_eq!(Mark::new(1), Some(Mark::M1));
        assert_eq!(Mark::new(3), None);
        assert_eq!(format!("{:?}", Mark::M2), "M2");
    }
}
