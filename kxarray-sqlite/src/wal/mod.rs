//! The WAL index and the cache's coherence with other processes: the
//! `-shm` a database's handles share, the WAL file's own lengths and
//! frames, and which of this process's cached pages another process's
//! writes cost.
//!
//! - [`shm`]: the WAL index, [`Shm`](shm::Shm) (the regions and eight
//!   lock slots of one database: the `-shm` file in the unix VFS's layout,
//!   or process memory with `kx_locking=exclusive`) and each handle's view
//!   of it;
//! - [`walindex`]: the index's header and page-number arrays, read as
//!   untrusted input;
//! - [`walframes`]: the WAL file's frames read straight from the file
//!   (a generation's frames after a restart);
//! - [`filesig`]: a database file's signature (header, size, modification
//!   time), read from the file;
//! - [`coherence`]: [`Coherence`](coherence::Coherence), one per database
//!   inode: at a lock gap, at a hold's end and at a WAL read transaction,
//!   which cached pages still hold what the file holds, and the drops; its
//!   tests are `coherence/tests.rs`;
//! - [`walsize`]: a WAL's two lengths, the one SQLite wrote and the file's,
//!   grown ahead of its appends.
//!
//! Invariants (each file's notes say how):
//! - a cached page is trusted only while this process knows no other
//!   process changed it; what a check compares is read from the file or
//!   the index, never from the cache;
//! - nothing read from the `-shm` or the WAL file is trusted: values are
//!   validated as `wal.c` validates them, arithmetic on them is checked,
//!   reads of them are bounded, and a check that cannot conclude drops
//!   every cached page of the database (the safe answer);
//! - a region of the index keeps its address and size while SQLite may use
//!   it, and a lock slot's count in the process matches the OFD lock the
//!   process holds on the slot's byte (but for one downgraded reader slot,
//!   between two lock calls of one SQLite operation).
//!
//! Below `locking` (the inode owns a `Coherence`, a `Shm` and a `WalSize`
//! and runs the checks from its lock calls); above `sys` (the `-shm`'s OFD
//! locks and file mode, `pread` of a header) and `sqlite`. Inside:
//! `coherence` sits on `shm`, `walindex`, `walframes` and `filesig`;
//! `walindex` on `shm`.

pub(crate) mod coherence;
pub(crate) mod filesig;
pub(crate) mod shm;
pub(crate) mod walframes;
pub(crate) mod walindex;
pub(crate) mod walsize;
