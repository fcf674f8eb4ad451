//! A cache that fits the machine: a capacity sized from the memory this
//! process may use, and a monitor that shrinks the cache while the system
//! stalls on memory and grows it back afterwards.
//!
//! Owns the reading of memory limits (`cgroup`: the process's cgroup and
//! its limit files; `limits`: [`MemoryLimits`]), the sizing formula
//! (`policy`: [`CapacityPolicy`]) and the pressure monitor (`trigger`:
//! [`Trigger`], the PSI line; `shrinker`: [`Shrinker`], its pure
//! decisions; `source`: the [`PressureSource`] and [`Clock`] traits;
//! `poll`: `poll(2)` and the [`StopSignal`] eventfd; `psi`: [`Psi`], the
//! kernel's source; `monitor`: [`PressureMonitor`], the thread, and
//! [`Resizable`], what it resizes). Nothing here knows the page cache: a
//! cache is sized with a number and resized through [`Resizable`].
//! `budget` ([`SharedBudget`]) shares one budget among the caches of every
//! process in a cgroup (or on the machine): a registry in the user's
//! private runtime directory ([`crate::ipc`]), members alive while they
//! hold their life byte, a fair division, growth into headroom and
//! shrinking before the limit (docs/memory.md). `budget` imports
//! [`crate::ipc`] and [`crate::fork`]; nothing else here imports the rest
//! of the crate.
//! Invariants: no file content makes the readers panic (every bad file is
//! a [`LimitsError`] naming it); the monitor is never started by the
//! library on its own, blocks in `poll` while nothing happens, and stops
//! when its handle is dropped.
//!
//! # Sizing the cache
//!
//! [`MemoryLimits`] reads physical memory (`MemTotal`) and the cgroup
//! limits of the process (cgroup v2 `memory.max` and `memory.high` of its
//! cgroup and every ancestor, or cgroup v1 `memory.limit_in_bytes` on a
//! hybrid host); [`CapacityPolicy`] turns the smallest of them, the
//! budget, into a capacity: `(budget - headroom) * fraction`, a quarter
//! of the budget less 64 MiB by default, with a floor and a ceiling (the
//! formula and a table of examples are in [`CapacityPolicy`]'s docs).
//! Both read from roots given as parameters, so a test (or this example)
//! uses a fake tree:
//!
//! ```
//! use kxarray::memory::{Bound, CapacityPolicy, MemoryLimits};
//! use kxarray::pagecache::{CacheConfig, PageCache};
//! use std::fs;
//!
//! // A container with a 2 GiB limit on a 64 GiB machine.
//! let tmp = tempfile::tempdir().unwrap();
//! let (proc_root, cg) = (tmp.path().join("proc"), tmp.path().join("cgroup"));
//! fs::create_dir_all(proc_root.join("self")).unwrap();
//! fs::write(proc_root.join("meminfo"), "MemTotal: 67108864 kB\n").unwrap();
//! fs::write(proc_root.join("self/cgroup"), "0::/ctr\n").unwrap();
//! fs::create_dir_all(cg.join("ctr")).unwrap();
//! fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
//! fs::write(cg.join("ctr/memory.max"), "2147483648\n").unwrap();
//!
//! let limits = MemoryLimits::read(&proc_root, &cg).unwrap();
//! let capacity = CapacityPolicy::default().capacity(&limits);
//! assert_eq!(capacity.bound, Bound::CgroupMax);
//! assert_eq!(capacity.bytes, (2048 - 64) / 4 << 20); // 496 MiB, not 16 GiB
//! let cache = PageCache::new(CacheConfig::default().capacity(capacity.bytes).flusher(false));
//! assert_eq!(cache.config().capacity, 496 << 20);
//! ```
//!
//! On a real system, [`MemoryLimits::from_system`] or
//! [`CapacityPolicy::capacity_from_system`] read `/proc` and
//! `/sys/fs/cgroup`.
//!
//! # Following memory pressure
//!
//! [`PressureMonitor::start`] writes a PSI trigger (default `some 300000
//! 2000000`: 300 ms of stall in 2 s) to the process's cgroup
//! `memory.pressure` (or `/proc/pressure/memory`) and runs a thread that
//! blocks in `poll` on it. Each stall event shrinks the target by an
//! eighth of its capacity, down to a floor (an eighth of the configured
//! capacity, at least 16 MiB); after 10 s without a stall it grows back
//! by an eighth of the configured capacity every 2 s ([`ShrinkPolicy`]).
//! Each change is one log line ([`LogSink`]: the `log` facade, a callback,
//! or off). Where PSI is unavailable, `start` logs `PSI unavailable:
//! <reason>; running without it` and returns the error, which the caller
//! may ignore: nothing runs then. Off by default: the library never
//! starts a monitor on its own.
//!
//! The decisions are a pure state machine ([`Shrinker`]); the monitor
//! drives it from any [`PressureSource`] and [`Clock`], so a test drives
//! it with a fake:
//!
//! ```
//! use kxarray::memory::*;
//! use std::io;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! /// One stall, then quiet until stopped.
//! struct OneStall(bool);
//! impl PressureSource for OneStall {
//!     fn wait(&mut self, timeout: Option<Duration>, stop: &StopSignal) -> io::Result<Wait> {
//!         if !std::mem::replace(&mut self.0, true) {
//!             return Ok(Wait::Stall);
//!         }
//!         Ok(if stop.wait(timeout)? { Wait::Stop } else { Wait::Timeout })
//!     }
//!     fn describe(&self) -> String {
//!         "a fake".into()
//!     }
//! }
//!
//! struct Cache(AtomicU64);
//! impl Resizable for Cache {
//!     type Error = io::Error;
//!     fn capacity(&self) -> u64 {
//!         self.0.load(Ordering::SeqCst)
//!     }
//!     fn set_capacity(&self, bytes: u64) -> io::Result<()> {
//!         Ok(self.0.store(bytes, Ordering::SeqCst))
//!     }
//! }
//!
//! let cache = Arc::new(Cache(AtomicU64::new(1 << 30)));
//! let config = PressureConfig { log: LogSink::Off, ..PressureConfig::default() };
//! let monitor =
//!     PressureMonitor::start_with(Arc::clone(&cache), OneStall(false), MonotonicClock, config)
//!         .unwrap();
//! while cache.capacity() == 1 << 30 {
//!     std::thread::sleep(Duration::from_millis(1));
//! }
//! assert_eq!(cache.capacity(), 896 << 20); // an eighth less
//! drop(monitor); // stops the thread at once (it grows back only after 10 s)
//! ```
//!
//! On a real system, with a cache that implements [`Resizable`]:
//!
//! ```no_run
//! # use kxarray::memory::*;
//! # use std::sync::Arc;
//! # struct Cache;
//! # impl Resizable for Cache {
//! #     type Error = std::io::Error;
//! #     fn capacity(&self) -> u64 { 0 }
//! #     fn set_capacity(&self, _: u64) -> std::io::Result<()> { Ok(()) }
//! # }
//! # let cache = Arc::new(Cache);
//! // Keep the handle as long as the cache should follow pressure.
//! let _monitor = PressureMonitor::start(cache, PressureConfig::default()).ok();
//! ```

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
mod budget;
#[cfg(target_os = "linux")]
pub use budget::{
    BudgetConfig, BudgetReason, BudgetStats, Marks, RegistryDir, RegistryError, Scope, ScopeKind,
    SharedBudget, Usage,
};
// The registry's table and the division's rules, for tests and tools that
// inspect a budget from outside (the NBD server's tests): not part of the
// documented API, which is `SharedBudget` and `PageCache::join_budget`.
#[cfg(target_os = "linux")]
#[doc(hidden)]
pub use budget::{
    budget_decide, budget_shares, file_name, start_time, Look, Registry, Slot, Table, View,
    FILE_BYTES, KEY_BYTES, LIFE, LOCK_PATIENCE, SLOTS, SLOT_WORDS, TABLE_LOCK,
};
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
