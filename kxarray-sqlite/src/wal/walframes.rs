//! The WAL file's frames as `wal.c` writes them, read straight from the
//! file (never the cache): a frame's 24-byte header (page number, the
//! database size of a commit frame, the salts of its generation, the
//! running checksum), the checksum chain that shows a frame whole, and
//! the commit frames of a generation. What `coherence` reads when the WAL
//! index no longer says enough (a generation's frames after a restart).
//!
//! Invariants: every function only reads; a frame that cannot be read
//! whole, or carries other salts, gives `None`/`false` (the caller then
//! knows nothing and drops the whole cache); frames are numbered from 1,
//! frame `f` at byte `32 + (f - 1) * (24 + page)`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The WAL beside database `db`, opened to read.
pub(crate) fn open_wal(db: &Path) -> Option<File> {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    File::open(name).ok()
}

/// The most frames of a new WAL generation [`commits_in`] reads (a
/// 24-byte read each, where the alternative is dropping the whole cache).
const MAX_COUNTED_FRAMES: u32 = 1 << 14;

/// The commit frames among frames `1..=mx` of the WAL beside database
/// `db` whose salts are `salts` (raw, as the index holds them), read
/// from the WAL file's frame headers; `None` when it cannot tell (no such
/// file, a frame of another generation, too many frames).
pub(crate) fn commits_in(db: &Path, salts: [u32; 2], mx: u32, page: u64) -> Option<u32> {
    if mx > MAX_COUNTED_FRAMES {
        return None;
    }
    let wal = open_wal(db)?;
    let mut commits = 0;
    for f in 1..=u64::from(mx) {
        let mut h = [0u8; 24];
        wal.read_exact_at(&mut h, 32 + (f - 1) * (24 + page)).ok()?;
        let salt = |at: usize| u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        if [salt(8), salt(12)] != salts {
            return None;
        }
        commits += u32::from(h[4..8] != [0; 4]);
    }
    Some(commits)
}

/// WAL frame `f`'s 24-byte header (1-based; frames of `page` bytes).
pub(crate) fn frame_header(wal: &File, f: u32, page: u64) -> Option<[u8; 24]> {
    let mut h = [0u8; 24];
    wal.read_exact_at(&mut h, 32 + (u64::from(f) - 1) * (24 + page))
        .ok()?;
    Some(h)
}

/// The raw salts of a frame header (as the index holds them).
pub(crate) fn frame_salts(h: &[u8; 24]) -> [u32; 2] {
    let salt = |at: usize| u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    [salt(8), salt(12)]
}

/// Whether frame `f`'s header `h` and page hold the checksum that
/// continues from frame `f - 1`'s header `prev` (`walEncodeFrame`: the
/// running checksum over the header's first 8 bytes and the page,
/// big-endian words when `big`): the frame is whole, not half written.
pub(crate) fn frame_checksum_ok(
    wal: &File,
    f: u32,
    page: u64,
    prev: &[u8; 24],
    h: &[u8; 24],
    big: bool,
) -> bool {
    let mut data = vec![0u8; page as usize];
    if wal
        .read_exact_at(&mut data, 32 + (u64::from(f) - 1) * (24 + page) + 24)
        .is_err()
    {
        return false;
    }
    let be = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let word = |b: &[u8], at: usize| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if big {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    };
    let (mut s1, mut s2) = (be(prev, 16), be(prev, 20));
    for chunk in [&h[..8], &data[..]] {
        for at in (0..chunk.len()).step_by(8) {
            s1 = s1.wrapping_add(word(chunk, at)).wrapping_add(s2);
            s2 = s2.wrapping_add(word(chunk, at + 4)).wrapping_add(s1);
        }
    }
    [s1, s2] == [be(h, 16), be(h, 20)]
}
