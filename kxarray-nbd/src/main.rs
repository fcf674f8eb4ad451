//! `kxarray-nbd`: serve a kxarray backend over NBD.
//!
//! ```text
//! kxarray-nbd --size 1G --listen 127.0.0.1:10809
//! kxarray-nbd --size 1G --unix /tmp/nbd.sock --backend hashmap
//! ```
//! Ctrl-C (or SIGTERM) stops accepting, lets every connection finish the
//! requests it has read, flushes the backend and exits.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache};
use kxarray_nbd::{parse_size, workers_for, Export, HashMapDisk, Listener, Server};
use tracing::{error, info};

/// The backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// kxarray's `RamDisk`: 4 KiB pages in an XArray (lock-free reads).
    Xarray,
    /// The baseline RAM disk: 4 KiB pages in a `Mutex<HashMap>`.
    Hashmap,
    /// A real file (`--file`), read and written with pread/pwrite.
    File,
    /// A real file (`--file`) through kxarray's page cache
    /// (`--cache-size`): reads hit the cache, writes are written back on
    /// FLUSH, FUA and by the cache's flusher.
    Cached,
}

/// Serve a kxarray RAM disk or cached file over the NBD protocol.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Export size (K, M, G, T suffixes: powers of 1024).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// TCP address to listen on (host:port).
    #[arg(long)]
    listen: Option<String>,
    /// Unix socket path to listen on.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Backing store.
    #[arg(long, value_enum, default_value = "xarray")]
    backend: BackendKind,
    /// The file for `--backend file` (created if missing; grown to
    /// `--size` if shorter).
    #[arg(long, required_if_eq_any([("backend", "file"), ("backend", "cached")]))]
    file: Option<PathBuf>,
    /// Page-cache capacity for `--backend cached` (bytes, K/M/G suffixes).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    cache_size: u64,
    /// Export name (the empty name also selects it).
    #[arg(long, default_value = "")]
    export_name: String,
    /// Worker threads per connection (requests handled at once). Default:
    /// 1 for the RAM disks (xarray, hashmap), whose requests cost less
    /// than a hand-off between threads; 4 for file and cached.
    #[arg(long)]
    threads: Option<usize>,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if args.listen.is_none() && args.unix.is_none() {
        return Err("give --listen HOST:PORT and/or --unix PATH".into());
    }
    let backend: Arc<dyn Backend> = match args.backend {
        BackendKind::Xarray => Arc::new(RamDisk::new(args.size)),
        BackendKind::Hashmap => Arc::new(HashMapDisk::new(args.size)),
        BackendKind::File | BackendKind::Cached => {
            let path = args
                .file
                .as_ref()
                .ok_or("--backend file|cached needs --file PATH")?;
            let f = FileBackend::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            if f.len().map_err(|e| e.to_string())? < args.size {
                f.set_len(args.size)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if args.backend == BackendKind::Cached {
                let cache = PageCache::new(CacheConfig::default().capacity(args.cache_size));
                let file = cache
                    .open(f)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Arc::new(file)
            } else {
                Arc::new(f)
            }
        }
    };
    let mut export = Export::new(args.export_name.clone(), backend)
        .map_err(|e| format!("backend: {e}"))?
        .with_description(format!("kxarray {:?} backend", args.backend));
    export.read_only = args.read_only;
    let workers = args.threads.unwrap_or_else(|| workers_for(&export));
    let server = Server::new(export, workers);

    let mut listeners = Vec::new();
    if let Some(addr) = &args.listen {
        listeners.push(Listener::tcp(addr).map_err(|e| format!("listen on {addr}: {e}"))?);
    }
    if let Some(path) = &args.unix {
        listeners
            .push(Listener::unix(path).map_err(|e| format!("listen on {}: {e}", path.display()))?);
    }
    let handle = server.handle();
    ctrlc::set_handler(move || handle.shutdown()).map_err(|e| format!("signal handler: {e}"))?;

    let threads: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let server = server.clone();
            std::thread::spawn(move || server.serve(l))
        })
        .collect();
    let mut failed = None;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                error!(error = %e, "listener failed");
                server.handle().shutdown();
                failed = Some(e.to_string());
            }
            Err(_) => failed = Some("listener thread panicked".into()),
        }
    }
    server.finish().map_err(|e| format!("final flush: {e}"))?;
    info!("clean shutdown");
    failed.map_or(Ok(()), Err)
}
