//! Opening a file through the cache: `FileBackend::open` does not create
//! a mistyped path, open errors name the path, and a file opened with
//! `open_read_only` refuses every write when it is made (the backend's,
//! and the page cache's over it: `write_at`, `write_begin`,
//! `try_write_begin`, `write_through`, `set_len`), with a `ReadOnly`
//! error, instead of accepting it and failing at writeback.

use kxarray::backend::{Backend, FileBackend, ReadOnly};
use kxarray::pagecache::{CacheConfig, PageCache};
use std::io::ErrorKind;

#[test]
fn open_does_not_create_and_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("dtaa.img");
    for e in [
        FileBackend::open(&typo).unwrap_err(),
        FileBackend::open_read_only(&typo).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains(typo.to_str().unwrap()), "{e}");
    }
    assert!(!typo.exists(), "open made the file");
    let nowhere = dir.path().join("no/such/dir/x.img");
    for e in [
        FileBackend::create(&nowhere).unwrap_err(),
        FileBackend::create_direct(&nowhere).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains(nowhere.to_str().unwrap()), "{e}");
    }
    // an existing file opens, and keeps its bytes
    let p = dir.path().join("data.img");
    std::fs::write(&p, b"kept").unwrap();
    let f = FileBackend::open(&p).unwrap();
    assert!(!f.is_read_only());
    assert_eq!(f.len().unwrap(), 4);
    f.write_all_at(b"K", 0).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"Kept");
}

#[test]
fn a_read_only_file_refuses_writes_when_they_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro.img");
    std::fs::write(&p, vec![7u8; 3 * 4096]).unwrap();
    let refused = |e: std::io::Error| {
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert!(ReadOnly::is(&e), "not a ReadOnly error: {e}");
    };

    let b = FileBackend::open_read_only(&p).unwrap();
    assert!(b.is_read_only());
    refused(b.write_at(b"x", 0).unwrap_err());
    refused(b.set_len(0).unwrap_err());
    refused(b.discard(0, 4096).unwrap_err());
    let e = b.write_at(b"x", 0).unwrap_err();
    assert!(e.to_string().contains(p.to_str().unwrap()), "{e}");

    let cache = PageCache::new(CacheConfig::default().capacity(1 << 20));
    let file = cache.open(b).unwrap();
    assert!(Backend::is_read_only(&file));
    refused(file.write_at(b"x", 0).unwrap_err());
    refused(file.write_at(b"x", 1 << 20).unwrap_err()); // nor extends
    refused(file.set_len(0).unwrap_err());
    refused(file.write_begin(0, 8).err().unwrap());
    refused(file.write_through(b"x", 0).unwrap_err());
    let mut buf = [0u8; 4];
    file.read_at(&mut buf, 4096).unwrap(); // now cached
    refused(file.try_write_begin(4096, 4).err().unwrap());
    assert_eq!(buf, [7; 4]);
    assert_eq!(cache.stats().dirty_bytes, 0, "nothing dirty");
    assert_eq!(file.len(), 3 * 4096);
    file.sync().unwrap(); // nothing to write back, nothing failed
    drop(file);
    assert_eq!(std::fs::read(&p).unwrap(), vec![7u8; 3 * 4096]);
}
