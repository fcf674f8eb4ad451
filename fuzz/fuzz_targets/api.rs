//! The whole XArray API (items with drop counting, values, reservations,
//! range stores, both splits, ID allocation, cmpxchg, cursor walks, cursors
//! reused across a dropped lock) against a model. The harness lives in
//! `tests/fuzz_common/api.rs`, shared with `tests/fuzz_replay.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;

fuzz_target!(|data: &[u8]| {
    fuzz_common::api::run_bytes(data);
});
