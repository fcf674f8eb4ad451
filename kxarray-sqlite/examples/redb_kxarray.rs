//! redb on kxarray: [`KxBackend`], redb's `StorageBackend` over a
//! [`CachedFile`], and a benchmark of random point reads with redb's own
//! cache set small (so reads reach the backend) against redb's file backend.
//!
//! ```text
//! cargo run --release -p kxarray-sqlite --example redb_kxarray -- --keys 400000 --seconds 2
//! ```
//!
//! An example rather than a module of `kxarray-sqlite`: redb is not SQLite,
//! and the adapter is a few lines over the page cache's public API; an
//! example keeps redb out of this crate's dependencies (it is a
//! dev-dependency) while `tests/redb.rs` tests the same code.
//!
//! The adapter takes no file locks (redb's own backend takes an exclusive
//! `flock`): one process per database, as for the SQLite VFS.

use clap::Parser;
use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, CachedFile, PageCache};
use rand::{RngExt, SeedableRng};
use redb::{Database, ReadableDatabase, StorageBackend, TableDefinition};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The table the example and its test use: u64 keys, byte values.
pub(crate) const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("kv");

/// redb's storage on a kxarray [`CachedFile`]: reads hit the page cache,
/// writes go into it and `sync_data` writes them back and flushes.
#[derive(Debug)]
pub(crate) struct KxBackend {
    file: CachedFile,
}

impl KxBackend {
    /// Open (creating) `path` as a file of `cache`.
    pub(crate) fn open(cache: &PageCache, path: &Path) -> io::Result<KxBackend> {
        Ok(KxBackend {
            file: cache.open(FileBackend::create(path)?)?,
        })
    }
}

impl StorageBackend for KxBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let n = self.file.read_at(out, offset)?;
        if n < out.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {} bytes at {offset} past the end", out.len()),
            ));
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_at(data, offset).map(|_| ())
    }
}

/// The value stored under `k` (deterministic, 400 bytes).
pub(crate) fn value_of(k: u64) -> Vec<u8> {
    (0..400u64)
        .map(|i| (k.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
        .collect()
}

/// Insert keys `0..keys` in batches of 10,000 per transaction.
pub(crate) fn load(db: &Database, keys: u64) -> Result<(), redb::Error> {
    let mut k = 0;
    while k < keys {
        let w = db.begin_write()?;
        {
            let mut t = w.open_table(TABLE)?;
            for key in k..(k + 10_000).min(keys) {
                t.insert(key, value_of(key).as_slice())?;
            }
        }
        w.commit()?;
        k += 10_000;
    }
    Ok(())
}

#[derive(Parser, Debug)]
#[command(about = "redb point reads on kxarray against redb's file backend, redb's cache small")]
struct Args {
    /// Keys (400-byte values).
    #[arg(long, default_value_t = 400_000)]
    keys: u64,
    /// Seconds per measured run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// redb's own cache, bytes (small so that reads reach the backend).
    #[arg(long, default_value_t = 4 << 20)]
    redb_cache: usize,
    /// Rounds (the backends alternate).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Directory for the database.
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn point_reads(db: &Database, keys: u64, seconds: f64) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let r = db.begin_read().unwrap();
    let t = r.open_table(TABLE).unwrap();
    let t0 = Instant::now();
    let mut ops = 0u64;
    let mut sum = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(seconds) {
        for _ in 0..256 {
            let k = rng.random_range(0..keys);
            sum += u64::from(t.get(k).unwrap().unwrap().value()[0]);
            ops += 1;
        }
    }
    assert!(sum > 0);
    ops as f64 / t0.elapsed().as_secs_f64()
}

#[allow(dead_code)]
fn main() {
    let a = Args::parse();
    let tmp = tempfile::tempdir().unwrap();
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let path = dir.join("redb-bench.redb");
    let _ = std::fs::remove_file(&path);
    {
        let db = Database::create(&path).unwrap();
        load(&db, a.keys).unwrap();
    }
    let size = std::fs::metadata(&path).unwrap().len();
    let (mut file_runs, mut kx_runs) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        for which in if round % 2 == 0 {
            ["file", "kx"]
        } else {
            ["kx", "file"]
        } {
            let mut b = redb::Builder::new();
            b.set_cache_size(a.redb_cache);
            let db = if which == "kx" {
                let cache =
                    PageCache::new(CacheConfig::default().capacity(size * 2).flusher(false));
                b.create_with_backend(KxBackend::open(&cache, &path).unwrap())
                    .unwrap()
            } else {
                b.open(&path).unwrap()
            };
            // warm: every page once (the kernel's cache or kxarray's)
            point_reads(&db, a.keys, a.seconds / 2.0);
            let r = point_reads(&db, a.keys, a.seconds);
            if which == "kx" {
                kx_runs.push(r)
            } else {
                file_runs.push(r)
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, k) = (med(&mut file_runs), med(&mut kx_runs));
    println!(
        "| redb {} keys ({} MB), redb cache {} MiB, random point reads | {:.0} /s | {:.0} /s | {:.2} |",
        a.keys,
        size >> 20,
        a.redb_cache >> 20,
        f,
        k,
        k / f
    );
}
