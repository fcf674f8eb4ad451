//! The engine: the raw array state and the `XaState` cursor (the kernel's `xas_*`) that
//! every operation of the crate runs on, one concept per file:
//!
//! - [`array`](mod@array): the array's state words and the lock-free descent;
//!   [`lock`]: the writer lock ([`XaLock`]) and what happens at unlock;
//!   [`poison`]: what happens when a write panics.
//! - [`state`]: the cursor's fields, constructors and accessors.
//! - [`walk`]: positioning and re-validation; [`find`]: iteration; [`lookahead`]:
//!   prefetching sparse subtrees for searches; [`conflict`]: the conflict scan.
//! - [`prealloc`], [`create`], [`store`]: allocation, path creation, stores, deletes, shrink.
//! - [`marks`], [`range`], [`split`] (uniform and partial), [`iter`].
//!
//! The public facade (the `xarray` module) is built on top; nothing here imports it.

pub(crate) mod array;
pub(crate) mod conflict;
pub(crate) mod create;
pub(crate) mod find;
pub(crate) mod iter;
pub(crate) mod lock;
pub(crate) mod lookahead;
pub(crate) mod marks;
pub(crate) mod poison;
pub(crate) mod prealloc;
pub(crate) mod range;
pub(crate) mod split;
pub(crate) mod state;
pub(crate) mod store;
pub(crate) mod walk;

pub use array::{Flags, XArray};
pub use iter::{Conflicts, CursorIter, Stale};
pub use lock::XaLock;
pub use range::MAX_RANGE_NODES;
pub(crate) use state::order_shape;
pub use state::{CursorState, XaState};
