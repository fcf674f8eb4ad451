//! Typed errors. The XArray itself only ever fails for the reasons listed in
//! [`Error`]; operations that consume an entry hand it back inside
//! [`crate::Rejected`] so that a failed call never loses the caller's data.

use core::fmt;

/// Why an XArray operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// A node allocation failed (the kernel's `-ENOMEM`). The array is unchanged.
    NoMemory,
    /// The index (or a reserved entry at it) is already occupied (`-EBUSY` from
    /// `xa_insert`), or no free ID was left in the requested range (`xa_alloc`).
    Busy,
    /// A value entry must fit in 63 bits (`0..=i64::MAX`); this one does not.
    ValueOutOfRange(u64),
    /// An order larger than 63 was requested.
    OrderTooLarge(u32),
    /// A multi-index request whose index is not aligned to its order.
    Misaligned {
        /// The index given.
        index: u64,
        /// The order given.
        order: u32,
    },
    /// A range whose last index is below its first.
    InvalidRange {
        /// First index of the range.
        first: u64,
        /// Last index of the range.
        last: u64,
    },
    /// `alloc` was called on an array not created with [`crate::Flags::ALLOC`]
    /// or [`crate::Flags::ALLOC1`].
    NotAllocating,
    /// The split cannot be done in one step (the kernel's `-EINVAL` from
    /// `xas_split_alloc`/`xas_try_split`), or the entry to split changed.
    InvalidSplit,
    /// A cmpxchg found a different entry than expected.
    Mismatch,
    /// [`crate::XaState::create_range`] over a range that spans more nodes
    /// than [`crate::MAX_RANGE_NODES`]; nothing was allocated or changed.
    RangeTooLarge {
        /// Nodes the range spans.
        nodes: u64,
        /// The bound.
        max: u64,
    },
    /// A multi-index entry of a [`crate::ChunkedXArray`] would reach past
    /// its chunk: its order is larger than the array's chunk shift.
    CrossesChunk {
        /// The index given.
        index: u64,
        /// The order given.
        order: u32,
        /// The array's chunk shift (chunks hold `2^shift` indices).
        shift: u32,
    },
    /// A chunk shift larger than 63 was requested for a
    /// [`crate::ChunkedXArray`].
    InvalidChunkShift(u32),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoMemory => f.write_str("node allocation failed"),
            Error::Busy => f.write_str("index already occupied or no free id in range"),
            Error::ValueOutOfRange(v) => write!(f, "value {v} does not fit in 63 bits"),
            Error::OrderTooLarge(o) => write!(f, "order {o} is larger than 63"),
            Error::Misaligned { index, order } => {
                write!(f, "index {index:#x} is not aligned to order {order}")
            }
            Error::InvalidRange { first, last } => {
                write!(f, "invalid range: last {last:#x} < first {first:#x}")
            }
            Error::NotAllocating => f.write_str("array was not created as an allocating array"),
            Error::InvalidSplit => f.write_str("split not possible in one step"),
            Error::Mismatch => f.write_str("current entry differs from the expected one"),
            Error::RangeTooLarge { nodes, max } => {
                write!(f, "range spans {nodes} nodes, more than the {max} allowed")
            }
            Error::CrossesChunk {
                index,
                order,
                shift,
            } => write!(
                f,
                "an order-{order} entry at {index:#x} does not fit in a chunk of 2^{shift} indices"
            ),
            Error::InvalidChunkShift(s) => write!(f, "chunk shift {s} is larger than 63"),
        }
    }
}

impl std::error::Error for Error {}
