//! The page cache (`AddressSpace`: add_folio over shadows, remove_folio,
//! drop_shadow, tags, lookups, injected allocation failures) against a
//! model. The harness lives in `tests/fuzz_common/filemap.rs`, shared with
//! `tests/fuzz_replay.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;

fuzz_target!(|data: &[u8]| {
    fuzz_common::filemap::run_bytes(data);
});
