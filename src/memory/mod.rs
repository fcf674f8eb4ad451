//! A cache that fits the machine: sizing from the environment's memory
//! limits, and following memory pressure.
//!
//! (Module docs are completed below.)

mod cgroup;
mod error;
mod limits;
mod policy;

pub use cgroup::CgroupLimit;
pub use error::LimitsError;
pub use limits::{Bound, MemoryLimits};
pub use policy::{Capacity, CapacityPolicy, PolicyError};
mod shrinker;
mod trigger;
pub use shrinker::{Decision, ShrinkPolicy, Shrinker};
pub use trigger::{Stall, Trigger, TriggerError};
