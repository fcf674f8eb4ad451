//! The whole XArray API (items with drop counting, values, reservations,
//! range stores, both splits, ID allocation, cmpxchg, cursor walks, cursors
//! reused across a dropped lock) against a model. The harness lives in
//! `tests/fuzz_common/api.rs`, shared with `tests/fuzz_replay.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;

fuzz_target!(|data: &[u8]| {
    // The whole API, including the operations that reach the known-defect
    // defects, unless KX_FUZZ_KNOWN_DEFECT_OPS says otherwise.
    static ON: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| fuzz_common::api::known_defect_ops(true));
    fuzz_common::api::run_bytes(data, on);
});
