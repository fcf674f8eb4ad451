//! Settings: the cache capacity, O_DIRECT below the cache, zero-copy
//! fetch, memory pressure, the prefetch of a scan's B-tree children, the
//! shared memory budget, the locking mode (shared with other processes, or
//! exclusive). [`Settings`] is what one open asks for; it is read from URI
//! parameters (`kx_cache`, `kx_direct`, `kx_fetch`, `kx_pressure`,
//! `kx_prefetch`, `kx_budget`, `kx_locking`), then environment variables
//! (`KXARRAY_SQLITE_CACHE`, `KXARRAY_SQLITE_DIRECT`, `KXARRAY_SQLITE_FETCH`,
//! `KXARRAY_SQLITE_PRESSURE`, `KXARRAY_SQLITE_PREFETCH`,
//! `KXARRAY_SQLITE_BUDGET`, `KXARRAY_SQLITE_LOCKING`), then the
//! defaults.
//!
//! Owns the parsing of sizes (`parse_size`: bytes with an optional
//! `k`/`m`/`g`/`t` suffix, powers of 1024) and booleans, the default
//! capacity ([`default_capacity`]) and the names the VFS reads
//! ([`URI_PARAMETERS`], [`ENVIRONMENT`], [`check_names`]). Invariant: a
//! setting that does not parse, or a `kx_` parameter or `KXARRAY_SQLITE_`
//! variable of no setting, is an error the open reports (SQLITE_CANTOPEN
//! with a message in SQLite's log), never silently replaced by a default.

use std::fmt;

/// What one open asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Capacity of the process-wide cache in bytes (used by the open that
    /// creates it; later opens cannot change it).
    pub cache_bytes: u64,
    /// Open the database file with `O_DIRECT` below the cache (kxarray is
    /// then the only cache of its pages; the journal or WAL stay buffered).
    pub direct: bool,
    /// Serve `xFetch` (SQLite's memory-mapped reads) with zero-copy
    /// references into the cache's folios, when `PRAGMA mmap_size` > 0.
    pub fetch: bool,
    /// Follow memory pressure (the kernel's PSI): shrink the process's
    /// cache while the system stalls on memory, grow it back after
    /// (`kxarray::memory::PressureMonitor`; read by the open that creates
    /// the cache).
    pub pressure: bool,
    /// With `direct`: when a scan reads an interior B-tree page and then
    /// its first two children in order, submit the reads of its other
    /// children at once, wherever they lie in the file.
    pub prefetch: bool,
    /// Share one memory budget with the other processes of the cgroup (or
    /// machine): the cache starts small, grows toward its share of the
    /// budget (at most `cache_bytes`) while the cgroup has room, and
    /// shrinks before its limit (`kxarray::memory::SharedBudget`; read by
    /// the open that creates the cache). Off: a fixed `cache_bytes`.
    pub budget: bool,
    /// Keep other processes out (`kx_locking=exclusive`): one OFD lock
    /// over SQLite's lock bytes held while the process has the database
    /// open, the WAL index in process memory, journals and WALs cached, no
    /// revalidation. `false` (the default, `kx_locking=shared`): SQLite's
    /// own locks on the unix VFS's bytes, a `-shm` file, and a cache kept
    /// coherent with other processes' writes.
    pub exclusive: bool,
    /// With `kx_locking=shared`: keep the database's pages in the cache
    /// shared by the machine's processes on this VFS (`kx_shared=1`, the
    /// default; `kxarray::shared`), one copy for all of them, instead of
    /// this process's own cache. A process that cannot join the shared
    /// cache, and a file it cannot share, keep their pages privately.
    pub shared: bool,
}

/// A setting that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError {
    /// Where it came from (`kx_cache` or `KXARRAY_SQLITE_CACHE`...).
    pub source: String,
    /// The text that did not parse.
    pub value: String,
    /// What was expected.
    pub expected: &'static str,
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not {}",
            self.source, self.value, self.expected
        )
    }
}

impl std::error::Error for SettingError {}

/// Smallest default capacity: 256 MiB, so a newcomer's database (speedtest1
/// at `--size 100` is about 50 MB; the read benchmark's is 180 MB) fits.
pub const MIN_DEFAULT_CACHE: u64 = 256 << 20;
/// Largest default capacity: 64 GiB.
pub const MAX_DEFAULT_CACHE: u64 = 64 << 30;
/// Smallest capacity accepted from a setting: 1 MiB.
pub const MIN_CACHE: u64 = 1 << 20;

/// The default capacity: a quarter of the process's memory budget, the
/// smallest of physical memory and its cgroup's limits (`memory.max`,
/// `memory.high` of its cgroup and every ancestor; see
/// [`kxarray::memory::MemoryLimits`]), at least [`MIN_DEFAULT_CACHE`] (but
/// never more than half the budget) and at most [`MAX_DEFAULT_CACHE`],
/// rounded down to whole pages. 6 GiB on a 24 GiB machine without a
/// limit; 512 MiB in a container limited to 2 GiB. When nothing can be
/// read, a quarter of 4 GiB. Read once per process (every open of a
/// journal asks for the settings).
pub fn default_capacity() -> u64 {
    static C: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *C.get_or_init(read_default_capacity)
}

fn read_default_capacity() -> u64 {
    use kxarray::memory::CapacityPolicy;
    let policy = CapacityPolicy::new(0.25, 0)
        .expect("a quarter is a valid fraction")
        .min_bytes(MIN_DEFAULT_CACHE)
        .max_bytes(MAX_DEFAULT_CACHE)
        .unknown_budget(4 << 30);
    match policy.capacity_from_system() {
        Ok(c) => c.bytes,
        Err(_) => {
            policy
                .capacity(&kxarray::memory::MemoryLimits::default())
                .bytes
        }
    }
}

/// Parse a size: decimal bytes with an optional suffix `k`, `m`, `g` or
/// `t` (any case, an optional trailing `b` or `ib`: `64m`, `1GiB`, `4096`).
/// `None` for anything else, zero, or an overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (digits, shift) = match t.char_indices().last()? {
        (i, 'k') => (&t[..i], 10),
        (i, 'm') => (&t[..i], 20),
        (i, 'g') => (&t[..i], 30),
        (i, 't') => (&t[..i], 40),
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let v = n.checked_mul(1u64 << shift)?;
    (v > 0).then_some(v)
}

/// Parse a boolean as SQLite's `sqlite3_uri_boolean` does: `1`, `yes`,
/// `true`, `on` or `0`, `no`, `false`, `off` (any case).
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Some(true),
        "0" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// The names of one setting.
struct Names {
    uri: &'static str,
    env: &'static str,
}

const CACHE: Names = Names {
    uri: "kx_cache",
    env: "KXARRAY_SQLITE_CACHE",
};
const DIRECT: Names = Names {
    uri: "kx_direct",
    env: "KXARRAY_SQLITE_DIRECT",
};
const FETCH: Names = Names {
    uri: "kx_fetch",
    env: "KXARRAY_SQLITE_FETCH",
};
const PRESSURE: Names = Names {
    uri: "kx_pressure",
    env: "KXARRAY_SQLITE_PRESSURE",
};
const LOCKING: Names = Names {
    uri: "kx_locking",
    env: "KXARRAY_SQLITE_LOCKING",
};
const PREFETCH: Names = Names {
    uri: "kx_prefetch",
    env: "KXARRAY_SQLITE_PREFETCH",
};
const BUDGET: Names = Names {
    uri: "kx_budget",
    env: "KXARRAY_SQLITE_BUDGET",
};
const SHARED: Names = Names {
    uri: "kx_shared",
    env: "KXARRAY_SQLITE_SHARED",
};

/// The URI parameters the VFS reads, besides SQLite's own (`psow`,
/// `readonly_shm`, `mode`, `vfs`...): every other `kx_` parameter is a
/// mistake an open refuses.
pub const URI_PARAMETERS: [&str; 8] = [
    "kx_cache",
    "kx_shared",
    "kx_budget",
    "kx_pressure",
    "kx_direct",
    "kx_prefetch",
    "kx_fetch",
    "kx_locking",
];

/// The environment variables the VFS reads: the settings', and
/// `KXARRAY_SQLITE_DEFAULT` (the `LD_PRELOAD` library makes `kxarray` the
/// default VFS) and `KXARRAY_SQLITE_WRITE_BACK` (the crash test's control
/// knob); every other `KXARRAY_SQLITE_` variable is a mistake an open
/// refuses.
pub const ENVIRONMENT: [&str; 10] = [
    "KXARRAY_SQLITE_CACHE",
    "KXARRAY_SQLITE_SHARED",
    "KXARRAY_SQLITE_BUDGET",
    "KXARRAY_SQLITE_PRESSURE",
    "KXARRAY_SQLITE_DIRECT",
    "KXARRAY_SQLITE_PREFETCH",
    "KXARRAY_SQLITE_FETCH",
    "KXARRAY_SQLITE_LOCKING",
    "KXARRAY_SQLITE_DEFAULT",
    "KXARRAY_SQLITE_WRITE_BACK",
];

/// Refuse a `kx_` URI parameter or a `KXARRAY_SQLITE_` variable the VFS
/// does not read (`kx_cahce=64m`), so that a misspelt setting fails the
/// open instead of leaving the default in force. `uri` and `env` are
/// (name, value) pairs; names without those prefixes are not looked at.
///
/// # Errors
/// A [`SettingError`] naming the first unknown one and listing the known.
pub fn check_names(
    uri: impl IntoIterator<Item = (String, String)>,
    env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), SettingError> {
    let unknown = |k: &str, known: &[&str], prefix: &str| {
        k.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
            && !known.contains(&k)
    };
    for (k, v) in uri {
        if unknown(&k, &URI_PARAMETERS, "kx_") {
            return Err(SettingError {
                source: k,
                value: v,
                expected: "a kxarray URI parameter (kx_cache, kx_shared, kx_budget, \
                           kx_pressure, kx_direct, kx_prefetch, kx_fetch, kx_locking)",
            });
        }
    }
    for (k, v) in env {
        let k = k.to_string_lossy();
        if unknown(&k, &ENVIRONMENT, "KXARRAY_SQLITE_") {
            return Err(SettingError {
                source: k.into_owned(),
                value: v.to_string_lossy().into_owned(),
                expected: "a kxarray-sqlite variable (KXARRAY_SQLITE_CACHE, _SHARED, \
                           _BUDGET, _PRESSURE, _DIRECT, _PREFETCH, _FETCH, _LOCKING, _DEFAULT, \
                           _WRITE_BACK)",
            });
        }
    }
    Ok(())
}

impl Settings {
    /// The settings for an open: each from `uri(name)` (the URI parameter,
    /// if the open has one), else from `env(name)`, else the default
    /// (cache [`default_capacity`], direct off, fetch on, pressure on,
    /// prefetch on, budget on).
    ///
    /// # Errors
    /// A [`SettingError`] naming the first value that does not parse (or a
    /// cache below [`MIN_CACHE`]).
    pub fn resolve(
        uri: impl Fn(&str) -> Option<String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingError> {
        let pick = |n: &Names| -> Option<(String, String)> {
            uri(n.uri)
                .map(|v| (n.uri.to_string(), v))
                .or_else(|| env(n.env).map(|v| (n.env.to_string(), v)))
        };
        let cache_bytes = match pick(&CACHE) {
            None => default_capacity(),
            Some((source, value)) => match parse_size(&value).filter(|&v| v >= MIN_CACHE) {
                Some(v) => v,
                None => {
                    return Err(SettingError {
                        source,
                        value,
                        expected: "a size of at least 1m (bytes, or with a k/m/g/t suffix)",
                    })
                }
            },
        };
        let boolean = |n: &Names, default: bool| match pick(n) {
            None => Ok(default),
            Some((source, value)) => parse_bool(&value).ok_or(SettingError {
                source,
                value,
                expected: "0 or 1",
            }),
        };
        let exclusive = match pick(&LOCKING) {
            None => false,
            Some((source, value)) => match value.trim().to_ascii_lowercase().as_str() {
                "shared" | "normal" => false,
                "exclusive" => true,
                _ => {
                    return Err(SettingError {
                        source,
                        value,
                        expected: "shared or exclusive",
                    })
                }
            },
        };
        Ok(Settings {
            exclusive,
            cache_bytes,
            direct: boolean(&DIRECT, false)?,
            fetch: boolean(&FETCH, true)?,
            pressure: boolean(&PRESSURE, true)?,
            prefetch: boolean(&PREFETCH, true)?,
            budget: boolean(&BUDGET, true)?,
            shared: boolean(&SHARED, true)?,
        })
    }

    /// [`resolve`](Settings::resolve) with the process environment.
    ///
    /// # Errors
    /// As [`resolve`](Settings::resolve).
    pub fn from_uri_and_env(
        uri: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingError> {
        Settings::resolve(uri, |k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("2gb"), Some(2 << 30));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        for bad in [
            "",
            "k",
            "0",
            "-1",
            "1.5g",
            "12q",
            "99999999999999999999",
            "16777216t",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn booleans() {
        assert_eq!(parse_bool("ON"), Some(true));
        assert_eq!(parse_bool("0"), Some(false));
        assert_eq!(parse_bool("maybe"), None);
    }

    #[test]
    fn uri_beats_env_beats_default() {
        let uri = |k: &str| (k == "kx_cache").then(|| "8m".to_string());
        let env = |k: &str| match k {
            "KXARRAY_SQLITE_CACHE" => Some("16m".to_string()),
            "KXARRAY_SQLITE_DIRECT" => Some("1".to_string()),
            _ => None,
        };
        let s = Settings::resolve(uri, env).unwrap();
        assert_eq!(
            s,
            Settings {
                cache_bytes: 8 << 20,
                direct: true,
                fetch: true,
                pressure: true,
                prefetch: true,
                budget: true,
                shared: true,
                exclusive: false,
            }
        );
        let x = Settings::resolve(
            |k| (k == "kx_locking").then(|| "EXCLUSIVE".into()),
            |_| None,
        );
        assert!(x.unwrap().exclusive);
        let x = Settings::resolve(|k| (k == "kx_locking").then(|| "excl".into()), |_| None);
        assert_eq!(x.unwrap_err().source, "kx_locking");
        let d = Settings::resolve(|_| None, |_| None).unwrap();
        assert_eq!(d.cache_bytes, default_capacity());
        assert!(!d.direct && d.fetch && d.pressure);
        let off = Settings::resolve(|k| (k == "kx_pressure").then(|| "0".into()), |_| None);
        assert!(!off.unwrap().pressure);
        let off = Settings::resolve(
            |_| None,
            |k| (k == "KXARRAY_SQLITE_PREFETCH").then(|| "0".into()),
        );
        assert!(!off.unwrap().prefetch);
        let off = Settings::resolve(|k| (k == "kx_budget").then(|| "0".into()), |_| None);
        assert!(!off.unwrap().budget);
        let bad = Settings::resolve(
            |_| None,
            |k| (k == "KXARRAY_SQLITE_BUDGET").then(|| "2".into()),
        );
        assert_eq!(bad.unwrap_err().source, "KXARRAY_SQLITE_BUDGET");
    }

    #[test]
    fn bad_values_are_errors() {
        let e = Settings::resolve(|k| (k == "kx_fetch").then(|| "perhaps".into()), |_| None)
            .unwrap_err();
        assert_eq!(e.source, "kx_fetch");
        let e = Settings::resolve(
            |_| None,
            |k| (k == "KXARRAY_SQLITE_CACHE").then(|| "4k".into()),
        )
        .unwrap_err();
        assert_eq!(e.source, "KXARRAY_SQLITE_CACHE");
        assert!(e.to_string().contains("at least 1m"), "{e}");
    }

    #[test]
    fn unknown_names_are_refused_known_ones_and_others_are_not() {
        let uri = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let env = |pairs: &[(&str, &str)]| -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
            pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
        };
        let known = uri(&[("kx_cache", "64m"), ("psow", "0"), ("mode", "ro")]);
        let known_env = env(&[("KXARRAY_SQLITE_DEFAULT", "1"), ("PATH", "/bin")]);
        assert_eq!(check_names(known, known_env), Ok(()));
        let e = check_names(uri(&[("kx_cahce", "64m")]), env(&[])).unwrap_err();
        assert_eq!((e.source.as_str(), e.value.as_str()), ("kx_cahce", "64m"));
        assert!(
            e.to_string().contains("kx_cache, kx_shared, kx_budget"),
            "{e}"
        );
        let e = check_names(uri(&[("KX_CACHE", "1g")]), env(&[])).unwrap_err();
        assert_eq!(e.source, "KX_CACHE");
        let e = check_names(uri(&[]), env(&[("KXARRAY_SQLITE_CAHCE", "1g")])).unwrap_err();
        assert_eq!(e.source, "KXARRAY_SQLITE_CAHCE");
        // the lists are the settings' names
        for n in [
            CACHE, DIRECT, FETCH, PRESSURE, LOCKING, PREFETCH, BUDGET, SHARED,
        ] {
            assert!(URI_PARAMETERS.contains(&n.uri), "{}", n.uri);
            assert!(ENVIRONMENT.contains(&n.env), "{}", n.env);
        }
        assert_eq!(URI_PARAMETERS.len() + 2, ENVIRONMENT.len());
    }

    #[test]
    fn default_capacity_is_bounded() {
        let c = default_capacity();
        let budget = kxarray::memory::MemoryLimits::from_system()
            .ok()
            .and_then(|l| l.budget())
            .map_or(4 << 30, |(b, _)| b);
        assert!(c <= MAX_DEFAULT_CACHE);
        assert!(c <= budget / 2 || c == MIN_DEFAULT_CACHE.min(budget / 2));
        assert!(c >= MIN_DEFAULT_CACHE.min(budget / 2) & !4095);
    }
}
