//! Random split / multi-order insert sequences against a BTreeMap model.
//! The harness lives in `tests/fuzz_common/mod.rs`, shared with
//! `tests/fuzz_replay.rs`, which replays the saved corpus under `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;

fuzz_target!(|data: &[u8]| {
    fuzz_common::run_bytes(data);
});
