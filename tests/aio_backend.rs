//! `Backend`'s submission side: `FileBackend` on each engine (buffered and
//! `O_DIRECT`, aligned and misaligned buffers, batches mixing them), the
//! synchronous defaults of `RamDisk` and of a backend written without
//! them, and through `Arc<dyn Backend>`.

mod harness;

mod aio_common;

use aio_common::{engines, pattern};
use kxarray::aio::{downcast_buf, AlignedBuf};
use kxarray::backend::{Backend, FileBackend, RamDisk, ReadBuf, WriteBuf, DIRECT_ALIGN};
use std::io;
use std::sync::Arc;

const LEN: usize = 1 << 20;

fn fill(b: &dyn Backend) {
    let bytes: Vec<u8> = (0..LEN as u64).map(pattern).collect();
    b.write_all_at(&bytes, 0).unwrap();
}

fn check(buf: &[u8], offset: u64, what: &str) {
    for (i, &x) in buf.iter().enumerate() {
        assert_eq!(
            x,
            pattern(offset + i as u64),
            "{what}: byte {i} at {offset}"
        );
    }
}

/// A batch mixing aligned and misaligned buffers, aligned and unaligned
/// offsets, a read past the end and one past the largest offset.
fn mixed_batch(b: &dyn Backend, what: &str) {
    let mut reqs: Vec<(u64, ReadBuf)> = Vec::new();
    let mut want = Vec::new();
    for i in 0..64u64 {
        let (off, buf): (u64, ReadBuf) = match i % 4 {
            0 => (i * 8192, Box::new(AlignedBuf::new(4096))), // direct, aligned
            1 => (i * 8192, Box::new(vec![0u8; 4096])), // direct, bounce (a Vec is rarely aligned)
            2 => (i * 8192 + 5, Box::new(vec![0u8; 100])), // buffered descriptor
            _ => (i * 8192, Box::new(AlignedBuf::new(16384))), // larger
        };
        want.push((off, buf.bytes_len()));
        reqs.push((off, buf));
    }
    reqs.push((LEN as u64 - 10, Box::new(vec![0u8; 4096])));
    want.push((LEN as u64 - 10, 10));
    reqs.push((u64::MAX - 4096, Box::new(vec![0u8; 4096])));
    let cs = b.read_many(reqs);
    assert_eq!(cs.len(), 66, "{what}");
    let mut cs = cs.into_iter();
    // `want` first: zip stops on it without taking the last completion.
    for ((off, len), c) in want.into_iter().zip(cs.by_ref()) {
        let (n, buf) = c.wait();
        assert_eq!(n.unwrap(), len, "{what}: read of {len} at {off}");
        check(&buf.as_slice()[..len], off, what);
    }
    let (r, _) = cs.next().unwrap().wait();
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput, "{what}");
}

use kxarray::aio::IoBuf;

fn file_backends_submit_to_each_engine() {
    for (name, engine) in engines() {
        let dir = tempfile::tempdir().unwrap();
        let buffered = FileBackend::create(&dir.path().join("b"))
            .unwrap()
            .with_engine(engine.clone());
        let mut backends = vec![("buffered", buffered)];
        match FileBackend::create_direct(&dir.path().join("d")) {
            Ok(d) => backends.push(("direct", d.with_engine(engine.clone()))),
            Err(e) => eprintln!(
                "{name}: no O_DIRECT here, buffered only (o_direct_ran_here says so): {e}"
            ),
        }
        for (mode, b) in backends {
            let what = format!("{name}/{mode}");
            fill(&b);
            mixed_batch(&b, &what);
            // One read, and the caller's own type back.
            let (n, buf) = b.submit_read(Box::new(vec![0u8; 4096]), 3 * 4096).wait();
            assert_eq!(n.unwrap(), 4096);
            let v = downcast_buf::<Vec<u8>>(buf).unwrap();
            check(&v, 3 * 4096, &what);
            // Writes: aligned, misaligned (a bounce on O_DIRECT), unaligned.
            let mut misaligned = vec![0u8; DIRECT_ALIGN + 1];
            misaligned[1..].fill(0x5A);
            let tail: Vec<u8> = misaligned[1..].to_vec();
            let writes: Vec<(u64, WriteBuf, u8)> = vec![
                (
                    0,
                    Box::new({
                        let mut a = AlignedBuf::new(DIRECT_ALIGN);
                        a.fill(0xA5);
                        a
                    }),
                    0xA5,
                ),
                (DIRECT_ALIGN as u64, Box::new(tail), 0x5A),
                (
                    3 * DIRECT_ALIGN as u64 + 7,
                    Box::new(vec![0x77u8; 50]),
                    0x77,
                ),
            ];
            let mut pending = Vec::new();
            for (off, buf, byte) in writes {
                let len = buf.bytes_len();
                pending.push((off, len, byte, b.submit_write(buf, off)));
            }
            for (off, len, byte, c) in pending {
                let (n, _) = c.wait();
                assert_eq!(n.unwrap(), len, "{what}: write at {off}");
                let mut got = vec![0u8; len];
                b.read_exact_at(&mut got, off).unwrap();
                assert!(got.iter().all(|&x| x == byte), "{what}: write at {off}");
            }
            // Through Arc<dyn Backend>.
            let shared: Arc<dyn Backend> = Arc::new(b);
            let (n, buf) = shared
                .submit_read(Box::new(AlignedBuf::new(4096)), 8192)
                .wait();
            assert_eq!(n.unwrap(), 4096);
            check(buf.as_slice(), 8192, &what);
        }
    }
}

/// A backend written before the submission side existed: only the
/// synchronous methods.
#[derive(Debug)]
struct Plain(RamDisk);

impl Backend for Plain {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

fn backends_without_an_engine_keep_working_through_the_defaults() {
    let ram = RamDisk::new(LEN as u64);
    fill(&ram);
    mixed_batch(&ram, "ramdisk");
    let plain = Plain(RamDisk::new(LEN as u64));
    fill(&plain);
    mixed_batch(&plain, "plain");
    let (n, _) = plain.submit_write(Box::new(vec![9u8; 10]), 100).wait();
    assert_eq!(n.unwrap(), 10);
    let (r, _) = plain
        .submit_write(Box::new(vec![9u8; 10]), LEN as u64 - 5)
        .wait();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull, "as write_at: {e}");
}

/// Reported as ignored, with the reason, when io_uring cannot be set up
/// here: the tests above then ran on the thread pool alone.
fn io_uring_ran_here() -> harness::Outcome {
    aio_common::uring_here().map_err(harness::Skip)
}

/// Reported as ignored, with the reason, when the temporary directory
/// refuses `O_DIRECT`: the tests above then skipped their direct halves.
fn o_direct_ran_here() -> harness::Outcome {
    aio_common::direct_here().map_err(harness::Skip)
}

harness::main!(
    tests: [
        file_backends_submit_to_each_engine,
        backends_without_an_engine_keep_working_through_the_defaults,
        io_uring_ran_here,
        o_direct_ran_here,
    ],
);
