//! The background flusher (the kernel's per-bdi writeback worker): a thread
//! the cache owns that writes back files whose dirty data aged past
//! `dirty_expire`, or every dirty file when the cache's dirty bytes pass
//! `dirty_background_bytes`.
//!
//! Owns the thread and its wake-up event. Invariants: the thread holds only
//! a weak reference to the cache, so it never keeps it alive; dropping the
//! [`Flusher`] sets the event and joins the thread; a writer's request for
//! background writeback is never lost (one made during a pass stays
//! pending, the kernel's queued `wb_start_background_writeback` work);
//! once started, background writeback goes on pass after pass while the
//! dirty bytes are above the threshold and passes make progress (the
//! kernel's `wb_writeback` loop on `wb_over_bg_thresh`); it never waits
//! for a file's writeback lock (a `sync` in progress covers the file), and
//! its errors go to each file's error sequence.

use super::writeback::{self, Mode};
use super::CacheInner;
use crate::sync::{Event, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// The flusher thread's handle.
pub(crate) struct Flusher {
    event: Arc<Event>,
    thread: Option<JoinHandle<()>>,
}

impl CacheInner {
    /// Wake the flusher early (dirty data passed the threshold).
    pub(crate) fn kick_flusher(&self) {
        if let Some(e) = self.flusher_event.get() {
            e.kick();
        }
    }
}

impl Flusher {
    pub(crate) fn start(cache: &Arc<CacheInner>) -> Flusher {
        let event = Arc::new(Event::new());
        let _ = cache.flusher_event.set(Arc::clone(&event));
        let weak = Arc::downgrade(cache);
        let ev = Arc::clone(&event);
        let period = (cache.config.dirty_expire / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(500));
        let thread = std::thread::Builder::new()
            .name("kxarray-flusher".into())
            .spawn(move || run(weak, ev, period))
            .ok();
        Flusher { event, thread }
    }
}

fn run(cache: Weak<CacheInner>, event: Arc<Event>, period: Duration) {
    loop {
        if event.wait_timeout(period) {
            return;
        }
        let Some(cache) = cache.upgrade() else {
            return;
        };
        cache.counters.flusher_runs.fetch_add(1, Ordering::Relaxed);
        loop {
            // Requests from here on ask for another pass.
            event.take();
            let bg = cache.dirty_background_bytes();
            // The bytes whose last write failed wait for their retry
            // time (`retry`): they do not keep the flusher going.
            let over = cache.writable_dirty() > bg;
            let written = cache.counters.backend_written_bytes.load(Ordering::Relaxed);
            pass(&cache, over);
            let progress = cache.counters.backend_written_bytes.load(Ordering::Relaxed) > written;
            if !progress || cache.writable_dirty() <= bg || event.is_set() {
                break;
            }
        }
    }
}

/// Write back every file with dirty data (`over` the background
/// threshold) or only those whose dirty data expired.
fn pass(cache: &CacheInner, over: bool) {
    let expire = cache.config.dirty_expire.as_millis() as u64;
    let now = cache.now_ms();
    for file in cache.files() {
        let at = file.dirtied_at.load(Ordering::Relaxed);
        if at != 0 && (over || now.saturating_sub(at) >= expire) {
            let _ = writeback::writeback(&file, 0, u64::MAX, Mode::Background);
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.event.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
