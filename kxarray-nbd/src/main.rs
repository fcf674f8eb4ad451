//! `kxarray-nbd`: serve a kxarray backend over NBD.
//!
//! ```text
//! kxarray-nbd --size 1G --listen 127.0.0.1:10809
//! kxarray-nbd --size 1G --unix /tmp/nbd.sock --backend hashmap
//! ```
//! Ctrl-C (or SIGTERM) stops accepting, closes idle connections, lets
//! every other connection answer the requests it has read (closing it
//! after 2 s if its client does not read them), flushes the backend and
//! exits.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache};
use kxarray_nbd::config::DEFAULT_MAX_CONNECTIONS;
use kxarray_nbd::{
    parse_size, raise_nofile_limit, workers_for, Config, Export, HashMapDisk, Listener, Server,
    Tls, TlsMode,
};
use tracing::{error, info, warn};

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

/// TLS (`NBD_OPT_STARTTLS`), as nbdkit spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TlsArg {
    /// No TLS: `NBD_OPT_STARTTLS` is refused.
    Off,
    /// TLS offered; clients may stay in clear text.
    On,
    /// TLS required: nothing but `NBD_OPT_STARTTLS` (and `ABORT`) before it.
    Require,
}

/// File descriptors kept for the listeners, logs and backend besides the
/// connections.
const SPARE_FDS: u64 = 64;

/// An export size: a size more than 0 (an export of 0 bytes serves
/// nothing a client can use).
fn parse_export_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("an export of 0 bytes: give a size of at least 1 byte".into()),
        n => Ok(n),
    }
}

/// A page-cache capacity, refused as the library refuses it (less than
/// one page, more than `MAX_CAPACITY`).
fn parse_cache_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    CacheConfig::default()
        .capacity(n)
        .validate()
        .map_err(|e| e.to_string())?;
    Ok(n)
}

/// Seconds (a decimal number) as a duration.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s:?} seconds: {e}"))
}

/// Serve a kxarray RAM disk or cached file over the NBD protocol.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Export size (K, M, G, T suffixes: powers of 1024; more than 0).
    #[arg(long, value_parser = parse_export_size, default_value = "1G")]
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
    /// With `--backend file` or `cached`: open the file with `O_DIRECT`
    /// (aligned requests bypass the kernel's page cache; with `cached` the
    /// server's cache holds the only copy of a page in memory). Refused by
    /// filesystems without `O_DIRECT` (tmpfs).
    #[arg(long)]
    direct: bool,
    /// Page-cache capacity for `--backend cached` (bytes, K/M/G suffixes;
    /// at least one 4 KiB page).
    #[arg(long, value_parser = parse_cache_size, default_value = "256M")]
    cache_size: u64,
    /// Do not follow memory pressure. By default `--backend cached` shrinks
    /// its cache while the system stalls on memory (the kernel's PSI) and
    /// grows it back to `--cache-size` once the stalls stop, with a log
    /// line each time; where PSI is unavailable, one line says so.
    #[arg(long)]
    no_pressure: bool,
    /// Do not share the memory budget of the cgroup (or machine) with the
    /// other processes' caches. By default `--backend cached` joins it
    /// (`kxarray::memory::SharedBudget`): the cache starts small, grows
    /// toward its share (at most `--cache-size`) while the cgroup has room
    /// and shrinks before its limit. With this flag the cache is a fixed
    /// `--cache-size`.
    #[arg(long)]
    no_budget: bool,
    /// Export name (the empty name also selects it).
    #[arg(long, default_value = "")]
    export_name: String,
    /// Worker threads per connection (requests handled at once). Default:
    /// 1 for the RAM disks (xarray, hashmap), whose requests cost less
    /// than a hand-off between threads; 4 for file and cached.
    #[arg(long)]
    threads: Option<usize>,
    /// Keep a connection's READs in flight on one thread, each answered as
    /// it completes (file and cached backends, clear text); `false`: serve
    /// them in batches on the --threads workers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    in_flight_reads: bool,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
    /// Seconds a client has from connecting to reaching the transmission
    /// phase; a slower one is disconnected.
    #[arg(long, value_parser = parse_seconds, env = "KXARRAY_NBD_HANDSHAKE_TIMEOUT",
          default_value = "10")]
    handshake_timeout: Duration,
    /// Connections open at once (handshaking, served or idle); more are
    /// accepted and closed at once, with a log line. Lowered to fit the
    /// open-file limit.
    #[arg(long, env = "KXARRAY_NBD_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// TLS: off, on (offered), require (nothing served without it).
    #[arg(long, value_enum, default_value = "off")]
    tls: TlsArg,
    /// Directory of the TLS certificates, in nbdkit's layout:
    /// server-cert.pem, server-key.pem, and ca-cert.pem (client CA, read
    /// with --tls-verify-peer).
    #[arg(long, required_if_eq_any([("tls", "on"), ("tls", "require")]))]
    tls_certificates: Option<PathBuf>,
    /// Require a client certificate signed by the CA in ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    tls_verify_peer: bool,
}

fn main() -> ExitCode {
    // `init` also installs tracing-log's `LogTracer` (tracing-subscriber's
    // default `tracing-log` feature): kxarray's `log` records (the I/O
    // engine's line, the pressure monitor's) reach this subscriber.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a log file or a pipe
        // gets plain text (and never with NO_COLOR set).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    let args = Args::parse();
    kxarray_nbd::memory::tune_allocator();
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
    // The pressure monitor and the shared budget of a cached backend,
    // alive while the server runs.
    let mut pressure = None;
    let mut budget = None;
    let mut reader: Option<Arc<dyn kxarray_nbd::ReadMany>> = None;
    let backend: Arc<dyn Backend> = match args.backend {
        BackendKind::Xarray => Arc::new(RamDisk::new(args.size)),
        BackendKind::Hashmap => Arc::new(HashMapDisk::new(args.size)),
        BackendKind::File | BackendKind::Cached => {
            // Which I/O engine serves the file: one record, at startup.
            kxarray::aio::IoEngine::global();
            let path = args
                .file
                .as_ref()
                .ok_or("--backend file|cached needs --file PATH")?;
            let f = if args.direct {
                FileBackend::create_direct(path)
            } else {
                FileBackend::create(path)
            };
            let f = f.map_err(|e| e.to_string())?;
            if f.len().map_err(|e| e.to_string())? < args.size {
                f.set_len(args.size)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if args.backend == BackendKind::Cached {
                let start = if args.no_budget {
                    args.cache_size
                } else {
                    args.cache_size.min(16 << 20)
                };
                let cache = PageCache::new(CacheConfig::default().capacity(start));
                if !args.no_budget {
                    let config = kxarray::memory::BudgetConfig::new(args.cache_size);
                    match cache.join_budget(config) {
                        Ok(b) => {
                            info!(share = b.stats().share, key = %b.stats().key, "cache in the shared memory budget");
                            budget = Some(b);
                        }
                        Err(e) => {
                            warn!(error = %e, "no shared memory budget; a fixed --cache-size");
                            cache
                                .set_capacity(args.cache_size)
                                .map_err(|e| format!("--cache-size: {e}"))?;
                        }
                    }
                }
                if !args.no_pressure {
                    pressure = kxarray::memory::PressureMonitor::start(
                        Arc::new(cache.clone()),
                        kxarray::memory::PressureConfig::default(),
                    )
                    .ok();
                }
                let file = cache
                    .open(f)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let file = Arc::new(file);
                reader = Some(file.clone());
                file
            } else {
                let f = Arc::new(f);
                reader = Some(f.clone());
                f
            }
        }
    };
    if args.direct && reader.is_none() {
        return Err("--direct needs --backend file or cached".into());
    }
    let mut export = Export::new(args.export_name.clone(), backend)
        .map_err(|e| format!("backend: {e}"))?
        .with_description(format!("kxarray {:?} backend", args.backend));
    // The READs a worker takes together go to the batch read of the file
    // (its submission side) or of the cache.
    if let Some(r) = reader {
        export = export.with_read_many(r);
    }
    export.read_only = args.read_only;
    let workers = args.threads.unwrap_or_else(|| workers_for(&export));
    let tls = match (args.tls, &args.tls_certificates) {
        (TlsArg::Off, _) => None,
        (mode, None) => return Err(format!("--tls {mode:?} needs --tls-certificates DIR")),
        (mode, Some(dir)) => {
            let mode = if mode == TlsArg::Require {
                TlsMode::Require
            } else {
                TlsMode::On
            };
            Some(Arc::new(
                Tls::from_dir(dir, mode, args.tls_verify_peer).map_err(|e| e.to_string())?,
            ))
        }
    };
    let max_connections = fit_open_files(args.max_connections);
    let config = Config::new(workers)
        .handshake_timeout(args.handshake_timeout)
        .max_connections(max_connections)
        .in_flight_reads(args.in_flight_reads)
        .tls(tls.clone());
    let server = Server::new(export, config).map_err(|e| format!("event loop: {e}"))?;

    let mut listeners = Vec::new();
    if let Some(addr) = &args.listen {
        let l = Listener::tcp(addr).map_err(|e| format!("listen on {addr}: {e}"))?;
        if !tls.as_ref().is_some_and(|t| t.required()) && beyond_loopback(addr) {
            warn!(
                %addr,
                "serving TCP beyond loopback without --tls require: anyone who reaches \
                 the port can read and write the export, in clear text"
            );
        }
        listeners.push(l);
    }
    if let Some(path) = &args.unix {
        listeners.push(Listener::unix(path).map_err(|e| format!("--unix: {e}"))?);
    }
    let handle = server.handle();
    ctrlc::set_handler(move || handle.shutdown()).map_err(|e| format!("signal handler: {e}"))?;

    let served = server.serve(listeners);
    // The cache no longer follows pressure, nor the budget, once the
    // server stops.
    drop(pressure);
    drop(budget);
    if let Err(e) = &served {
        error!(error = %e, "event loop failed");
    }
    server.finish().map_err(|e| format!("final flush: {e}"))?;
    info!("clean shutdown");
    served.map_err(|e| e.to_string())
}

/// Raise the open-file limit, and lower `max` to fit it (one descriptor
/// per connection, plus spares).
fn fit_open_files(max: usize) -> usize {
    match raise_nofile_limit() {
        Ok(limit) => {
            let room = usize::try_from(limit.saturating_sub(SPARE_FDS))
                .unwrap_or(usize::MAX)
                .max(1);
            if room < max {
                warn!(
                    limit,
                    max_connections = room,
                    "the open-file limit (RLIMIT_NOFILE) is below --max-connections; lowered"
                );
            }
            max.min(room)
        }
        Err(e) => {
            warn!(error = %e, "cannot read or raise the open-file limit");
            max
        }
    }
}

/// Whether a TCP listen address reaches beyond this machine (not only
/// loopback addresses).
fn beyond_loopback(addr: &str) -> bool {
    let Ok(addrs) = addr.to_socket_addrs() else {
        return true;
    };
    let loopback = |a: &SocketAddr| match a.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.is_loopback(),
    };
    let addrs: Vec<SocketAddr> = addrs.collect();
    addrs.is_empty() || !addrs.iter().all(loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        let a = Args::parse_from(["kxarray-nbd", "--unix", "/x"]);
        assert_eq!(
            a.handshake_timeout,
            kxarray_nbd::config::DEFAULT_HANDSHAKE_TIMEOUT
        );
        assert_eq!(a.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(a.tls, TlsArg::Off);
        assert!(Args::try_parse_from(["kxarray-nbd", "--tls", "require"]).is_err());
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_seconds("-1").is_err());
    }

    #[test]
    fn sizes_that_cannot_be_meant_are_refused_on_the_command_line() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["kxarray-nbd", "--unix", "/x"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v)
        };
        for bad in [
            &["--size", "0"][..],
            &["--cache-size", "0"],
            &["--cache-size", "4095"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse(&["--size", "1"]).unwrap().size, 1);
        assert_eq!(parse(&["--cache-size", "4k"]).unwrap().cache_size, 4096);
    }

    #[test]
    fn loopback_addresses() {
        assert!(!beyond_loopback("127.0.0.1:10809"));
        assert!(!beyond_loopback("[::1]:10809"));
        assert!(beyond_loopback("0.0.0.0:10809"));
        assert!(beyond_loopback("[::]:10809"));
    }
}
