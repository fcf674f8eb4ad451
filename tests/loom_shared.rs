//! Loom models of the shared cache's frame state machine and index
//! (`src/shared/loom_models.rs`, on the crate's own code): fills, writes,
//! evictions and writeback ends against the optimistic reader, and the
//! take-over of a dead holder's lock; a process's clock batch taken by
//! its threads.
//!
//! Run with:
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_shared --target-dir target/loom`

#[cfg(all(loom, target_os = "linux"))]
mod tests {
    #[test]
    fn a_reader_sees_a_fill_whole_or_not_at_all() {
        kxarray::shared::loom_models::a_reader_sees_a_fill_whole_or_not_at_all();
    }

    #[test]
    fn a_reader_never_keeps_a_torn_write() {
        kxarray::shared::loom_models::a_reader_never_keeps_a_torn_write();
    }

    #[test]
    fn a_reader_never_takes_a_reused_frame_for_its_page() {
        kxarray::shared::loom_models::a_reader_never_takes_a_reused_frame_for_its_page();
    }

    #[test]
    fn a_dead_holders_lock_is_taken_over_once() {
        kxarray::shared::loom_models::a_dead_holders_lock_is_taken_over_once();
    }

    #[test]
    fn a_write_during_writeback_stays_dirty() {
        kxarray::shared::loom_models::a_write_during_writeback_stays_dirty();
    }

    #[test]
    fn a_batch_hands_out_each_frame_once() {
        kxarray::shared::loom_models::a_batch_hands_out_each_frame_once();
    }
}
