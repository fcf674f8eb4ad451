//! The inode's lock levels, in shared and exclusive mode.

use super::*;
use kxarray::backend::RamDisk;
use kxarray::pagecache::{CacheConfig, PageCache};

/// A database inode over `fd` (its cache a RAM disk), in `exclusive`
/// or shared mode.
fn inode_on(fd: File, exclusive: bool) -> Inode {
    let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
    let file = cache.open(RamDisk::new(1 << 16)).unwrap();
    Inode::new("t".into(), file, fd, false, true, true, WritePolicy::Cached)
        .with_mode(exclusive, false)
}

fn open_rw(p: &std::path::Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap()
}

/// Two inodes over two descriptions of one file stand for two
/// processes (OFD locks of two descriptions conflict as two
/// processes' do); a third description takes the unix VFS's POSIX
/// locks.
#[test]
fn shared_mode_follows_os_unix_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("db");
    let (x, y) = (inode_on(open_rw(&p), false), inode_on(open_rw(&p), false));
    let (ox, ox2, oy) = (next_owner(), next_owner(), next_owner());
    let (mut lx, mut lx2, mut ly) = (SQLITE_LOCK_NONE, SQLITE_LOCK_NONE, SQLITE_LOCK_NONE);
    // two readers in two processes
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(y.lock(oy, &mut ly, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(x.lock(ox2, &mut lx2, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(lock(&x.locks).shared, 2);
    // RESERVED in x: seen by y through F_OFD_GETLK
    assert_eq!(y.reserved(), Ok(false));
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_RESERVED), Ok(SQLITE_OK));
    assert_eq!(y.reserved(), Ok(true));
    assert_eq!(y.lock(oy, &mut ly, SQLITE_LOCK_RESERVED), Ok(SQLITE_BUSY));
    // within x, a second handle cannot go above SHARED either
    assert_eq!(x.lock(ox2, &mut lx2, SQLITE_LOCK_RESERVED), Ok(SQLITE_BUSY));
    // EXCLUSIVE: busy (another handle of x is SHARED), left at PENDING
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_BUSY));
    assert_eq!(lx, SQLITE_LOCK_PENDING);
    x.unlock(ox2, &mut lx2, SQLITE_LOCK_NONE).unwrap();
    // still busy: y holds SHARED in its own process
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_BUSY));
    assert_eq!(lx, SQLITE_LOCK_PENDING);
    // PENDING keeps a new reader of y's out
    let oy2 = next_owner();
    let mut ly2 = SQLITE_LOCK_NONE;
    y.unlock(oy, &mut ly, SQLITE_LOCK_NONE).unwrap();
    assert_eq!(y.lock(oy2, &mut ly2, SQLITE_LOCK_SHARED), Ok(SQLITE_BUSY));
    assert_eq!(ly2, SQLITE_LOCK_NONE);
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_OK));
    // the unix VFS's POSIX lock on the shared range conflicts
    let posix = open_rw(&p);
    // SAFETY: an all-zero `flock` is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_RDLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = SHARED_FIRST as _;
    fl.l_len = 1;
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and `flock`.
    let r = unsafe { libc::fcntl(posix.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(r, -1);
    // down to SHARED: y may read again, not write
    x.unlock(ox, &mut lx, SQLITE_LOCK_SHARED).unwrap();
    assert_eq!(lx, SQLITE_LOCK_SHARED);
    assert_eq!(y.lock(oy2, &mut ly2, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(posix.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(r, 0);
    x.unlock(ox, &mut lx, SQLITE_LOCK_NONE).unwrap();
    y.unlock(oy2, &mut ly2, SQLITE_LOCK_NONE).unwrap();
    assert_eq!(lock(&x.locks).level, SQLITE_LOCK_NONE);
    // the POSIX reader alone keeps both out of EXCLUSIVE
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(x.lock(ox, &mut lx, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_BUSY));
    x.unlock(ox, &mut lx, SQLITE_LOCK_NONE).unwrap();
}

#[test]
fn five_levels() {
    let i = inode_on(tempfile::tempfile().unwrap(), true);
    let (a, b) = (next_owner(), next_owner());
    let (mut la, mut lb) = (SQLITE_LOCK_NONE, SQLITE_LOCK_NONE);
    assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_RESERVED), Ok(SQLITE_OK));
    assert!(i.reserved().unwrap());
    // a second writer waits
    assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_RESERVED), Ok(SQLITE_BUSY));
    assert_eq!(lb, SQLITE_LOCK_SHARED);
    // a reader is still there: PENDING, busy
    assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_BUSY));
    assert_eq!(la, SQLITE_LOCK_PENDING);
    // PENDING keeps new readers out
    let c = next_owner();
    let mut lc = SQLITE_LOCK_NONE;
    assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_BUSY));
    assert_eq!(lc, SQLITE_LOCK_NONE);
    i.unlock(b, &mut lb, SQLITE_LOCK_NONE).unwrap();
    assert_eq!(i.lock(a, &mut la, SQLITE_LOCK_EXCLUSIVE), Ok(SQLITE_OK));
    assert_eq!(la, SQLITE_LOCK_EXCLUSIVE);
    assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_BUSY));
    i.unlock(a, &mut la, SQLITE_LOCK_SHARED).unwrap();
    assert!(!i.reserved().unwrap());
    assert_eq!(i.lock(c, &mut lc, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    // b's failed RESERVED did not take a's: unlock of a non-owner is a no-op
    assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_SHARED), Ok(SQLITE_OK));
    assert_eq!(i.lock(b, &mut lb, SQLITE_LOCK_RESERVED), Ok(SQLITE_OK));
    i.unlock(c, &mut lc, SQLITE_LOCK_NONE).unwrap();
    assert!(i.reserved().unwrap());
    for (o, l) in [(a, &mut la), (b, &mut lb)] {
        i.unlock(o, l, SQLITE_LOCK_NONE).unwrap();
    }
    assert!(!i.reserved().unwrap());
    assert_eq!(lock(&i.locks).shared, 0);
}
