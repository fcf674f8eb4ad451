//! Helpers for the shared cache's multi-process tests: a private directory,
//! child processes (this test binary run again with a role in its
//! environment), and the page pattern every writer writes, so any reader
//! can tell a whole page of some write from a torn or stale one.

#![allow(dead_code)]

use kxarray::shared::{Region, SharedFile};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

pub(crate) const PAGE: usize = 4096;
/// The environment variable that makes this binary a child.
pub(crate) const ROLE: &str = "KX_SHARED_CHILD";

/// A temporary directory of mode 0700 (what a region's directory must be).
pub(crate) fn private_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Open `path` in `region`.
pub(crate) fn open(region: &Arc<Region>, path: &Path) -> SharedFile {
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    SharedFile::open(region.clone(), fd.into(), path.as_os_str().as_bytes()).unwrap()
}

/// Run this test binary's test `test` again as a child with `role` set.
pub(crate) fn spawn(test: &str, role: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The role this process was started with, if it is a child.
pub(crate) fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Page `page` as writer `writer` writes it at sequence `seq`.
pub(crate) fn pattern(writer: u32, page: u32, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    b[0..4].copy_from_slice(&writer.to_le_bytes());
    b[4..8].copy_from_slice(&page.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let base = mix(u64::from(writer) << 40 ^ u64::from(page) << 20 ^ seq);
    for (i, chunk) in b[16..].chunks_mut(8).enumerate() {
        let v = mix(base ^ i as u64).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    b
}

/// What a page read holds: `None` for zeros (never written), else the
/// writer and sequence of the whole write it is; `Err` for anything else
/// (torn, wrong page, garbage).
pub(crate) fn decode(page: u32, b: &[u8]) -> Result<Option<(u32, u64)>, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let w = u32::from_le_bytes(b[0..4].try_into().unwrap());
    let p = u32::from_le_bytes(b[4..8].try_into().unwrap());
    let s = u64::from_le_bytes(b[8..16].try_into().unwrap());
    if p != page {
        return Err(format!("page {page} holds page {p}'s bytes"));
    }
    if pattern(w, p, s) != b {
        return Err(format!("page {page}: writer {w} seq {s}: torn or garbage"));
    }
    Ok(Some((w, s)))
}

/// A small deterministic random source.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
