//! Writeback error reporting with the kernel's `errseq_t` semantics.
//!
//! Owns a file's last writeback error and its sequence number. Every new
//! error bumps the sequence; each handle remembers the sequence it last
//! reported, so an error is returned once per handle by the next `sync`,
//! and a later `sync` with no new error returns `Ok`. Invariant: `seq` only
//! grows, and `seen` says whether any handle has reported the current error
//! (a handle opened after an unreported error still gets it, as
//! `errseq_sample` does).

use crate::sync::Lock;
use std::io;

struct State {
    seq: u64,
    kind: io::ErrorKind,
    msg: String,
    seen: bool,
}

/// One file's writeback error state.
pub(crate) struct ErrSeq(Lock<State>);

impl ErrSeq {
    pub(crate) fn new() -> Self {
        ErrSeq(Lock::new(State {
            seq: 0,
            kind: io::ErrorKind::Other,
            msg: String::new(),
            seen: true,
        }))
    }

    /// Record a writeback error (`errseq_set`).
    pub(crate) fn set(&self, e: &io::Error) {
        let mut s = self.0.lock();
        s.seq += 1;
        s.kind = e.kind();
        s.msg = e.to_string();
        s.seen = false;
    }

    /// The sequence a new handle starts from (`errseq_sample`): an error no
    /// one has reported yet stays visible to it.
    pub(crate) fn sample(&self) -> u64 {
        let s = self.0.lock();
        if s.seen {
            s.seq
        } else {
            s.seq.saturating_sub(1)
        }
    }

    /// The last error recorded, if any, without reporting it (a write
    /// refused because writeback keeps failing returns it; the next
    /// `sync` still reports it).
    pub(crate) fn current(&self) -> Option<io::Error> {
        let s = self.0.lock();
        (s.seq > 0).then(|| io::Error::new(s.kind, format!("writeback failed: {}", s.msg)))
    }

    /// Report an error recorded after `*since`, once (`errseq_check_and_advance`).
    pub(crate) fn check_and_advance(&self, since: &mut u64) -> io::Result<()> {
        let mut s = self.0.lock();
        if s.seq == *since {
            return Ok(());
        }
        *since = s.seq;
        s.seen = true;
        Err(io::Error::new(
            s.kind,
            format!("writeback failed: {}", s.msg),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_once_per_handle() {
        let e = ErrSeq::new();
        let mut a = e.sample();
        assert!(e.check_and_advance(&mut a).is_ok());
        e.set(&io::Error::other("boom"));
        let mut b = e.sample();
        assert!(e.check_and_advance(&mut a).is_err());
        assert!(e.check_and_advance(&mut a).is_ok());
        // b sampled before anyone reported it: it still sees it once
        let mut b2 = b;
        assert!(e.check_and_advance(&mut b).is_err());
        assert!(e.check_and_advance(&mut b).is_ok());
        // a handle opened after the report does not see it
        let mut c = e.sample();
        assert!(e.check_and_advance(&mut c).is_ok());
        assert!(e.check_and_advance(&mut b2).is_err());
    }
}
