//! The process's cgroup: where its directories are (from
//! `/proc/self/cgroup` and the cgroup mount root) and what its memory
//! limit files say, from its own directory up to the root (a parent's
//! limit binds its children too).
//!
//! Owns the parsing of `/proc/self/cgroup`, of cgroup v2's `memory.max`
//! and `memory.high` ("max" is no limit) and of cgroup v1's
//! `memory.limit_in_bytes` (for hybrid hosts, whose memory controller is
//! still on v1), and the walk up the ancestors. Invariants: a file is read
//! with a size cap, so a garbage file of any size cannot make it allocate
//! without bound; an absent file means "no limit here"; a present file
//! that does not parse is an error naming it; no content makes it panic;
//! a cgroup path never leads outside the mount (`..` is refused).

use super::error::LimitsError;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The largest file read (`/proc/self/cgroup`, `meminfo` and the limit
/// files are far smaller).
const READ_MAX: u64 = 64 << 10;

/// cgroup v1 reports "no limit" as the largest page-aligned `i64`; any
/// value this large is treated as no limit.
const V1_UNLIMITED: u64 = 1 << 62;

/// A limit read from a cgroup file: the tightest of the process's cgroup
/// and its ancestors, and the file it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// The file that set it (`.../memory.max`, `.../memory.high` or, on
    /// cgroup v1, `.../memory.limit_in_bytes`).
    pub file: PathBuf,
}

/// A cgroup directory: the hierarchy's mount and the path below it, as
/// components (the directory is `mount` joined with all of them; its
/// ancestors with the first few).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CgroupDir {
    pub(crate) mount: PathBuf,
    pub(crate) components: Vec<String>,
}

impl CgroupDir {
    /// The directory itself.
    pub(crate) fn path(&self) -> PathBuf {
        self.ancestor(self.components.len())
    }

    /// The ancestor `depth` levels below the mount (0 is the mount).
    pub(crate) fn ancestor(&self, depth: usize) -> PathBuf {
        let mut p = self.mount.clone();
        p.extend(&self.components[..depth]);
        p
    }
}

/// The process's cgroup directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CgroupDirs {
    /// In the v2 (unified) hierarchy: `cgroup_root` itself, or
    /// `cgroup_root/unified` on a hybrid host.
    pub(crate) v2: Option<CgroupDir>,
    /// In the v1 memory controller's hierarchy (`cgroup_root/memory`), when
    /// `/proc/self/cgroup` names one.
    pub(crate) v1_memory: Option<CgroupDir>,
}

/// Read a small file whole: `None` if it (or a directory on its path) does
/// not exist.
pub(crate) fn read_small(path: &Path) -> Result<Option<Vec<u8>>, LimitsError> {
    let io_err = |source| LimitsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(io_err(e)),
    };
    let mut buf = Vec::new();
    file.take(READ_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(io_err)?;
    if buf.len() as u64 > READ_MAX {
        return Err(LimitsError::parse(
            path.to_path_buf(),
            &buf,
            "a file under 64 KiB",
        ));
    }
    Ok(Some(buf))
}

/// Where the process's cgroups are, from `proc_root/self/cgroup` and the
/// hierarchies mounted under `cgroup_root`. No `/proc/self/cgroup`, or no
/// hierarchy mounted, is no cgroup (not an error).
///
/// A directory named in `/proc/self/cgroup` that does not exist under the
/// mount (a container that mounts its own cgroup at the root without a
/// cgroup namespace) is looked for by its longest tail that exists, down
/// to the mount itself.
pub(crate) fn locate(proc_root: &Path, cgroup_root: &Path) -> Result<CgroupDirs, LimitsError> {
    let path = proc_root.join("self").join("cgroup");
    let Some(bytes) = read_small(&path)? else {
        return Ok(CgroupDirs::default());
    };
    const EXPECTED: &str = "lines `id:controllers:/path`";
    let bad = || LimitsError::parse(path.clone(), &bytes, EXPECTED);
    let text = std::str::from_utf8(&bytes).map_err(|_| bad())?;
    let (mut v2, mut v1) = (None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(cgroup)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if id.parse::<u32>().is_err() {
            return Err(bad());
        }
        let components = components(cgroup).ok_or_else(bad)?;
        if id == "0" && controllers.is_empty() {
            v2 = Some(components);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(components);
        }
    }
    let v2_mount = [cgroup_root.to_path_buf(), cgroup_root.join("unified")]
        .into_iter()
        .find(|m| m.join("cgroup.controllers").is_file());
    let v1_mount = cgroup_root.join("memory");
    Ok(CgroupDirs {
        v2: v2.zip(v2_mount).map(|(c, m)| resolve(m, c)),
        v1_memory: v1
            .filter(|_| v1_mount.is_dir())
            .map(|c| resolve(v1_mount, c)),
    })
}

/// The components of an absolute cgroup path, or `None` if it is not
/// absolute or climbs (`..`). A removed cgroup's " (deleted)" is dropped.
fn components(cgroup: &str) -> Option<Vec<String>> {
    let cgroup = cgroup.strip_suffix(" (deleted)").unwrap_or(cgroup);
    let rest = cgroup.strip_prefix('/')?;
    let mut out = Vec::new();
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c if c.contains('\0') => return None,
            c => out.push(c.to_string()),
        }
    }
    Some(out)
}

/// The directory for `components` under `mount`: the longest tail of the
/// path that exists there (all of it, normally), else the mount.
fn resolve(mount: PathBuf, components: Vec<String>) -> CgroupDir {
    for skip in 0..components.len() {
        let tail = &components[skip..];
        let mut p = mount.clone();
        p.extend(tail);
        if p.is_dir() {
            return CgroupDir {
                mount,
                components: tail.to_vec(),
            };
        }
    }
    CgroupDir {
        mount,
        components: Vec::new(),
    }
}

/// A cgroup v2 limit: "max" is `Some(None)`, a decimal is `Some(Some(n))`,
/// anything else `None`.
pub(crate) fn parse_v2_limit(bytes: &[u8]) -> Option<Option<u64>> {
    let t = std::str::from_utf8(bytes).ok()?.trim();
    if t == "max" {
        return Some(None);
    }
    decimal(t).map(Some)
}

/// A cgroup v1 limit: a decimal, where -1 or anything from 2^62 up is no
/// limit.
pub(crate) fn parse_v1_limit(bytes: &[u8]) -> Option<Option<u64>> {
    let t = std::str::from_utf8(bytes).ok()?.trim();
    if t == "-1" {
        return Some(None);
    }
    decimal(t).map(|v| (v < V1_UNLIMITED).then_some(v))
}

/// Plain ASCII digits (no sign), without overflow.
pub(crate) fn decimal(t: &str) -> Option<u64> {
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// The tightest limit in the file `name` of `dir` and of each of its
/// ancestors up to the mount; `parse` reads one file.
pub(crate) fn tightest(
    dir: &CgroupDir,
    name: &str,
    parse: fn(&[u8]) -> Option<Option<u64>>,
    expected: &'static str,
) -> Result<Option<CgroupLimit>, LimitsError> {
    let mut best: Option<CgroupLimit> = None;
    for depth in (0..=dir.components.len()).rev() {
        let file = dir.ancestor(depth).join(name);
        let Some(bytes) = read_small(&file)? else {
            continue;
        };
        match parse(&bytes) {
            None => return Err(LimitsError::parse(file, &bytes, expected)),
            Some(None) => {}
            Some(Some(v)) => {
                if best.as_ref().is_none_or(|b| v < b.bytes) {
                    best = Some(CgroupLimit { bytes: v, file });
                }
            }
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_values() {
        assert_eq!(parse_v2_limit(b"max\n"), Some(None));
        assert_eq!(parse_v2_limit(b"1073741824\n"), Some(Some(1 << 30)));
        assert_eq!(parse_v2_limit(b"0"), Some(Some(0)));
        for bad in [
            &b""[..],
            b"-1",
            b"+5",
            b"1e9",
            b"max max",
            b"\xff",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_v2_limit(bad), None, "{bad:?}");
        }
        assert_eq!(parse_v1_limit(b"9223372036854771712\n"), Some(None));
        assert_eq!(parse_v1_limit(b"-1"), Some(None));
        assert_eq!(parse_v1_limit(b"536870912"), Some(Some(512 << 20)));
        assert_eq!(parse_v1_limit(b"max"), None);
    }

    #[test]
    fn cgroup_paths() {
        assert_eq!(components("/"), Some(vec![]));
        assert_eq!(components("/a/b/"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(components("/a (deleted)"), Some(vec!["a".into()]));
        assert_eq!(components("/a/../../etc"), None);
        assert_eq!(components("relative"), None);
    }
}
