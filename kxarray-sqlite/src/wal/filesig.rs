//! What a database file's header, size and modification time say: its
//! signature ([`Sig`]), which the coherence checks compare at a lock gap
//! and at a hold's end (`coherence`), and the header bytes in it
//! ([`Header`]).
//!
//! Invariant: a signature is read from the file itself (`pread`, `fstat`),
//! never from the cache.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

/// The header bytes a signature compares: the change counter, the size
/// in pages and the freelist (24..40, what SQLite's pager compares at a
/// lock, `dbFileVers`), and version-valid-for (92..96).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    vers: [u8; 16],
    valid_for: [u8; 4],
}

impl Header {
    /// The header bytes of `h`, whose byte 0 is the file's byte `start`
    /// (`start` at most 24, `h` reaching at least byte 96 of the file).
    fn at(h: &[u8], start: usize) -> Header {
        let mut vers = [0u8; 16];
        vers.copy_from_slice(&h[24 - start..40 - start]);
        let v = 92 - start;
        Header {
            vers,
            valid_for: [h[v], h[v + 1], h[v + 2], h[v + 3]],
        }
    }

    /// The header bytes a write of `data` at `off` of a database puts in
    /// place, when it covers all of them (SQLite writes page 1 whole).
    pub(crate) fn written(data: &[u8], off: u64) -> Option<Header> {
        let start = usize::try_from(off).ok().filter(|&s| s <= 24)?;
        (start + data.len() >= 96).then(|| Header::at(data, start))
    }
}

/// What the header and the size of a database file say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sig {
    pub(crate) header: Header,
    pub(crate) len: u64,
    pub(crate) mtime: (i64, i64),
}

/// A 64-bit mix of words (FNV-1a over bytes, then a finalizer): the same
/// in every process and build, so members compare what they stamp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mix(u64);

impl Mix {
    pub(crate) fn new() -> Mix {
        Mix(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    pub(crate) fn word(&mut self, w: u64) {
        self.bytes(&w.to_le_bytes());
    }
    /// The mix, never 0 (a stamp of 0 means none).
    pub(crate) fn finish(self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).max(1)
    }
}

impl Sig {
    /// The signature as a stamp word (never 0): what members of the
    /// shared cache compare at a lock gap.
    pub(crate) fn stamp(&self) -> u64 {
        let mut h = Mix::new();
        h.bytes(&self.header.vers);
        h.bytes(&self.header.valid_for);
        h.word(self.len);
        h.word(self.mtime.0 as u64);
        h.word(self.mtime.1 as u64);
        h.finish()
    }

    pub(crate) fn read(fd: &File) -> io::Result<Sig> {
        let mut h = [0u8; 100];
        crate::sys::fdio::pread_full(fd, &mut h, 0)?;
        let m = fd.metadata()?;
        Ok(Sig {
            header: Header::at(&h, 0),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}
