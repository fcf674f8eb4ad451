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
#[cfg(target_os = "linux")]
mod monitor;
#[cfg(target_os = "linux")]
mod poll;
#[cfg(target_os = "linux")]
mod psi;
#[cfg(target_os = "linux")]
mod source;
#[cfg(target_os = "linux")]
pub use monitor::{LogSink, PressureConfig, PressureMonitor, Resizable, THREAD_NAME};
#[cfg(target_os = "linux")]
pub use poll::StopSignal;
#[cfg(target_os = "linux")]
pub use psi::Psi;
#[cfg(target_os = "linux")]
pub use source::{Clock, MonotonicClock, PressureSource, Wait};
