//! The real fio (`--ioengine=nbd`, through libnbd) against the server,
//! with `--verify=crc32c`: every block written is read back and checked.
//! Over the RAM disk, the hash-map baseline and a real file through the
//! page cache. Reported ignored, with the reason, when `fio` is not
//! installed.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{start, Transport};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache};
use kxarray_nbd::{HashMapDisk, ListenAddr};

fn uri(addr: &ListenAddr) -> String {
    match addr {
        ListenAddr::Tcp(a) => format!("nbd://{a}/"),
        ListenAddr::Unix(p) => format!("nbd+unix:///?socket={}", p.display()),
    }
}

/// Two jobs (two connections) of 4 KiB random writes at iodepth 64 on
/// disjoint halves, then fio reads everything back and checks crc32c.
fn verify(backend: Arc<dyn Backend>, transport: Transport, rw: &str) {
    let server = start(backend, "", transport);
    let out = Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", uri(&server.addr)),
            &format!("--rw={rw}"),
            "--bs=4k",
            "--iodepth=64",
            "--numjobs=2",
            "--size=24M",
            "--offset_increment=24M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--group_reporting",
        ])
        .output()
        .expect("run fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("err= 0"), "fio reported errors:\n{stdout}");
    assert!(
        stdout.contains("read: IOPS="),
        "fio did not read back to verify:\n{stdout}"
    );
    assert!(
        stdout.contains("write: IOPS="),
        "fio did not write:\n{stdout}"
    );
    assert!(!stderr.contains("verify:"), "verify complaints:\n{stderr}");
    server.stop();
}

fn fio_nbd_engine_verifies_crc32c() {
    harness::require(harness::tool("fio", "fio"));
    verify(
        Arc::new(RamDisk::new(64 << 20)),
        Transport::Unix,
        "randwrite",
    );
    verify(Arc::new(RamDisk::new(64 << 20)), Transport::Tcp, "write");
    verify(
        Arc::new(HashMapDisk::new(64 << 20)),
        Transport::Unix,
        "randwrite",
    );
    // A real file through a page cache of 8 MiB, a sixth of the 48 MiB fio
    // writes, so the verify pass reads back through eviction, writeback of
    // dirty folios and refaults.
    let f = tempfile::tempfile().expect("temporary file");
    f.set_len(64 << 20).expect("set_len");
    let cache = PageCache::new(CacheConfig::default().capacity(8 << 20));
    let cached = cache
        .open(FileBackend::from_file(f))
        .expect("open through the cache");
    verify(Arc::new(cached), Transport::Unix, "randwrite");
    let stats = cache.stats();
    assert!(
        stats.evictions > 0,
        "the cache never evicted, so the test did not exercise refaults: {stats:?}"
    );
}

harness::main!(
    tests: [
        fio_nbd_engine_verifies_crc32c,
    ],
);
