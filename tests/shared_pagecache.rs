//! The shared cache through the page cache's own API: `CacheConfig::shared`
//! caches a file's pages in the region every such cache maps, other
//! backends stay private, and a child after `fork` or a raw `clone` is a
//! member of its own.
//!
//! The tests fork, so they take one lock each.

mod harness;
mod shared_common;

use kxarray::backend::{FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache, SharedConfig};
use shared_common::private_dir;
use std::path::Path;
use std::sync::Mutex;

static FORK: Mutex<()> = Mutex::new(());

fn shared_cache(dir: &Path, capacity: u64) -> PageCache {
    PageCache::new(
        CacheConfig::default()
            .capacity(capacity)
            .flusher(false)
            .shared_with(SharedConfig {
                dir: Some(dir.to_path_buf()),
                name: "pc".into(),
                max_bytes: Some(64 << 20),
            }),
    )
}

fn two_caches_share_a_files_pages_and_keep_a_ram_disk_private() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let a = shared_cache(d.path(), 4 << 20);
    let b = shared_cache(d.path(), 4 << 20);
    let (ra, rb) = (a.region().unwrap(), b.region().unwrap());
    assert_ne!(ra.member_slot(), rb.member_slot(), "two members");
    let path = d.path().join("f");
    std::fs::write(&path, vec![5u8; 1 << 16]).unwrap();
    let fa = a.open(FileBackend::create(&path).unwrap()).unwrap();
    let fb = b.open(FileBackend::create(&path).unwrap()).unwrap();
    assert!(fa.is_shared() && fb.is_shared());
    let mut buf = vec![0u8; 1 << 16];
    fa.read_at(&mut buf, 0).unwrap();
    let fills = ra.stats().fills;
    fb.read_at(&mut buf, 0).unwrap();
    assert_eq!(rb.stats().fills, fills, "b's reads were hits on a's frames");
    assert!(buf.iter().all(|&x| x == 5));
    fb.write_at(b"from b", 100).unwrap();
    let mut six = [0u8; 6];
    fa.read_at(&mut six, 100).unwrap();
    assert_eq!(&six, b"from b");
    fa.sync().unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[100..106], b"from b");
    // a RAM disk is no file other processes can open: private
    let ram = a.open(RamDisk::new(8192)).unwrap();
    assert!(!ram.is_shared());
    ram.write_at(b"x", 0).unwrap();
    assert_eq!(a.stats().dirty_bytes, 4096, "the private cache holds it");
    // zero-copy calls say why they are refused on a shared file
    let e = fa.read_folio(0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
    assert!(ram.read_folio(0).is_ok());
}

fn a_read_only_file_refuses_writes_at_the_call() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let a = shared_cache(d.path(), 4 << 20);
    let path = d.path().join("ro");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let fd = std::fs::File::open(&path).unwrap();
    let f = a.open(FileBackend::from_file(fd)).unwrap();
    assert!(f.is_shared());
    let e = f.write_at(b"no", 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    let mut b = [0u8; 2];
    f.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [1, 1]);
}

/// Fork (or clone) a child that runs `f` and exits with its status
/// without running destructors (a child's death, as far as the region is
/// concerned: its slot is recovered).
fn in_child(clone: bool, f: impl FnOnce() -> i32) -> i32 {
    let pid = if clone {
        // SAFETY: a raw clone with only SIGCHLD: a copy of the process
        // like fork, without glibc's atfork handlers; the child runs only
        // `f` and `_exit`s.
        unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::SIGCHLD as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            ) as libc::pid_t
        }
    } else {
        // SAFETY: the child runs only `f` and `_exit`s.
        unsafe { libc::fork() }
    };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = f();
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status}");
    libc::WEXITSTATUS(status)
}

fn fork_child_is_a_member_of_its_own(clone: bool) {
    let d = private_dir();
    let cache = shared_cache(d.path(), 4 << 20);
    let region = cache.region().unwrap().clone();
    let path = d.path().join("f");
    std::fs::write(&path, vec![0u8; 1 << 16]).unwrap();
    let file = cache.open(FileBackend::create(&path).unwrap()).unwrap();
    let mut buf = [0u8; 16];
    file.read_at(&mut buf, 0).unwrap();
    let parent_slot = region.member_slot().unwrap();
    let code = in_child(clone, || {
        // the inherited handle: the first write joins a slot of its own
        if file.write_at(b"child", 4096).is_err() {
            return 10;
        }
        match region.member_slot() {
            Some(s) if s != parent_slot => {}
            _ => return 11,
        }
        let mut b = [0u8; 5];
        if file.read_at(&mut b, 4096).is_err() || &b != b"child" {
            return 12;
        }
        0
    });
    assert_eq!(code, 0, "the child's checks");
    assert_eq!(
        region.member_slot(),
        Some(parent_slot),
        "the parent's slot is its own still"
    );
    let mut b = [0u8; 5];
    file.read_at(&mut b, 4096).unwrap();
    assert_eq!(&b, b"child", "the child's write, in the shared frames");
    // the child died without leaving: the parent's reaper recovers it and
    // adopts its dirty page, which a sync then writes
    assert_eq!(region.reap(), 1);
    assert_eq!(region.stats().members, 1);
    file.sync().unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[4096..4101], b"child");
}

fn a_child_after_fork_joins_as_a_member_of_its_own() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    fork_child_is_a_member_of_its_own(false);
}

fn a_raw_clone_child_joins_as_a_member_of_its_own() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    fork_child_is_a_member_of_its_own(true);
}

/// A region file another user owns at the region's name is refused (the
/// cache then keeps its files private), and nothing in it is written.
fn another_users_region_file_is_refused() -> harness::Outcome {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return harness::skip("needs root to make a file another user owns");
    }
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    drop(kxarray::shared::Region::join(d.path(), "pc", 1 << 14).unwrap());
    let path = d.path().join("pc");
    let before = std::fs::read(&path).unwrap();
    let p = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; uid 65534 is nobody.
    assert_eq!(unsafe { libc::chown(p.as_ptr(), 65534, 65534) }, 0);
    assert!(matches!(
        kxarray::shared::Region::join(d.path(), "pc", 1 << 14),
        Err(kxarray::shared::RegionError::Refused(_))
    ));
    let cache = shared_cache(d.path(), 4 << 20);
    assert!(cache.region().is_none(), "the cache fell back to private");
    let f = d.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    assert!(!cache
        .open(FileBackend::create(&f).unwrap())
        .unwrap()
        .is_shared());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the foreign file is untouched"
    );
    Ok(())
}

/// The region is one member of the memory budget whatever the number of
/// processes (here caches, each a member of the region with its own open
/// of it) that map it: two shared caches in a budget make three members
/// (each cache, and the region once), the first to miss holds the region's
/// place and sizes it within its share, and when the holder goes, the
/// other takes the place at a miss a second later.
fn the_region_is_one_member_of_the_budget_whoever_holds_it() {
    use kxarray::memory::{BudgetConfig, RegistryDir};
    use std::time::{Duration, Instant};
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let reg = private_dir();
    let config = || BudgetConfig {
        registry_dir: RegistryDir::Private(reg.path().into()),
        thread_after: Duration::ZERO,
        interval: Duration::from_millis(20),
        ..BudgetConfig::new(24 << 20)
    };
    let path = d.path().join("f");
    std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
    let a = shared_cache(d.path(), 4 << 20);
    let b = shared_cache(d.path(), 4 << 20);
    let ba = a.join_budget(config()).unwrap();
    let bb = b.join_budget(config()).unwrap();
    let fa = a.open(FileBackend::open(&path).unwrap()).unwrap();
    let fb = b.open(FileBackend::open(&path).unwrap()).unwrap();
    let mut page = [0u8; 4096];
    fa.read_at(&mut page, 0).unwrap(); // a miss in a: a takes the place
    fb.read_at(&mut page, 4096).unwrap(); // b asks, a holds it
    let (ra, rb) = (a.region().unwrap(), b.region().unwrap());
    assert!(ra.holds_budget() && !rb.holds_budget());
    let deadline = Instant::now() + Duration::from_secs(10);
    while bb.stats().members != 3 || ba.stats().members != 3 {
        assert!(
            Instant::now() < deadline,
            "members: a sees {}, b sees {} (two caches and the region: 3)",
            ba.stats().members,
            bb.stats().members
        );
        fb.read_at(&mut page, 0).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let cap = rb.capacity();
    assert!(
        cap > 0 && cap <= 24 << 20,
        "the region within its share: {cap}"
    );
    // The holder goes; the other takes the place at a miss a second on.
    drop((fa, ba, a));
    std::thread::sleep(Duration::from_millis(1100));
    let mut at = 8192;
    while !rb.holds_budget() {
        assert!(Instant::now() < deadline, "b never took the place");
        fb.read_at(&mut page, at).unwrap();
        at += 4096;
        std::thread::sleep(Duration::from_millis(20));
    }
    while bb.stats().members != 2 {
        assert!(Instant::now() < deadline, "members: {}", bb.stats().members);
        fb.read_at(&mut page, 0).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

harness::main!(
    tests: [
        two_caches_share_a_files_pages_and_keep_a_ram_disk_private,
        a_read_only_file_refuses_writes_at_the_call,
        a_child_after_fork_joins_as_a_member_of_its_own,
        a_raw_clone_child_joins_as_a_member_of_its_own,
        another_users_region_file_is_refused,
        the_region_is_one_member_of_the_budget_whoever_holds_it,
    ],
);
