//! redb through kxarray's page cache: what it writes reads back with
//! redb's own file backend, and the other way round.

#[path = "../examples/redb_kxarray.rs"]
#[allow(dead_code)]
mod redb_kxarray;

use kxarray::pagecache::{CacheConfig, PageCache};
use redb::{Database, ReadableDatabase, ReadableTableMetadata};
use redb_kxarray::{load, value_of, KxBackend, TABLE};

fn check_all(db: &Database, keys: u64) {
    let r = db.begin_read().unwrap();
    let t = r.open_table(TABLE).unwrap();
    assert_eq!(t.len().unwrap(), keys);
    for k in 0..keys {
        assert_eq!(
            t.get(k).unwrap().unwrap().value(),
            value_of(k).as_slice(),
            "key {k}"
        );
    }
}

#[test]
fn written_through_kxarray_reads_back_with_redbs_file_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kx.redb");
    let cache = PageCache::new(CacheConfig::default().capacity(16 << 20).flusher(false));
    {
        let mut b = redb::Builder::new();
        b.set_cache_size(1 << 20); // small: reads and writes reach the backend
        let db = b
            .create_with_backend(KxBackend::open(&cache, &path).unwrap())
            .unwrap();
        load(&db, 30_000).unwrap();
        // an update and a delete in a later transaction
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(TABLE).unwrap();
            t.insert(7u64, value_of(70_007).as_slice()).unwrap();
            t.remove(29_999u64).unwrap();
        }
        w.commit().unwrap();
        assert!(cache.stats().hits > 0);
    }
    let db = Database::open(&path).unwrap();
    let r = db.begin_read().unwrap();
    let t = r.open_table(TABLE).unwrap();
    assert_eq!(t.len().unwrap(), 29_999);
    assert_eq!(
        t.get(7u64).unwrap().unwrap().value(),
        value_of(70_007).as_slice()
    );
    assert!(t.get(29_999u64).unwrap().is_none());
    for k in (0..29_999).filter(|&k| k != 7) {
        assert_eq!(
            t.get(k).unwrap().unwrap().value(),
            value_of(k).as_slice(),
            "key {k}"
        );
    }
}

#[test]
fn written_by_redbs_file_backend_reads_through_kxarray() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file.redb");
    {
        let db = Database::create(&path).unwrap();
        load(&db, 20_000).unwrap();
    }
    let cache = PageCache::new(CacheConfig::default().capacity(16 << 20).flusher(false));
    let mut b = redb::Builder::new();
    b.set_cache_size(1 << 20);
    let db = b
        .create_with_backend(KxBackend::open(&cache, &path).unwrap())
        .unwrap();
    check_all(&db, 20_000);
    assert!(cache.stats().misses > 0);
}
