//! The bytes the fio example lays out, writes and checks: block stamps, the
//! check of a block (whole or piece by piece), and the `--touch` checksum.
//!
//! Owns the stamp format. A stamp of block `b`, generation `g` is the
//! little-endian word `b`, then `g`, then [`stamp_word`]`(b, g)` repeated;
//! so a torn, misplaced, stale or lost block fails [`check_piece`]. Every
//! function here works on any split of a block into pieces that start at a
//! multiple of 8 bytes from the block's start (a zero-copy engine shows a
//! block as one piece per folio): checking or summing the pieces gives the
//! same answer as the whole block.

/// The body word of the stamp of block `block` written by generation `gen`.
pub(crate) fn stamp_word(block: u64, gen: u64) -> u64 {
    (block.rotate_left(24) ^ gen).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Fill `buf` (a whole block, a multiple of 8 bytes, at least 16) with the
/// stamp of (`block`, `gen`).
pub(crate) fn stamp(buf: &mut [u8], block: u64, gen: u64) {
    let w = stamp_word(block, gen).to_le_bytes();
    buf[..8].copy_from_slice(&block.to_le_bytes());
    buf[8..16].copy_from_slice(&gen.to_le_bytes());
    for c in buf[16..].chunks_exact_mut(8) {
        c.copy_from_slice(&w);
    }
}

/// Whether `buf` (a whole block) is exactly the stamp of (`block`, `gen`);
/// else a description of what it holds.
#[cfg(test)]
pub(crate) fn check(buf: &[u8], block: u64, gen: u64) -> Result<(), String> {
    check_piece(buf, block, gen, 0)
}

/// Whether `piece`, the bytes of the block starting `at` bytes into it (`at`
/// a multiple of 8), are those of the stamp of (`block`, `gen`); else a
/// description of what they hold.
pub(crate) fn check_piece(piece: &[u8], block: u64, gen: u64, at: usize) -> Result<(), String> {
    debug_assert!(at.is_multiple_of(8), "pieces start at a word");
    let w = stamp_word(block, gen);
    let want = |i: usize| match i {
        0 => block,
        1 => gen,
        _ => w,
    };
    let first = at / 8;
    let words = piece.chunks_exact(8);
    let tail_ok = words.remainder().is_empty();
    let bad = words
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .enumerate()
        .find(|&(i, v)| v != want(first + i));
    match bad {
        None if tail_ok => Ok(()),
        None => Err(format!(
            "block {block}: a piece of {} bytes at {at} is not whole words",
            piece.len()
        )),
        Some((i, v)) => {
            let word = first + i;
            Err(match word {
                0 => format!("block {block}: want generation {gen}, found the header of block {v}"),
                1 => format!("block {block}: want generation {gen}, found generation {v}"),
                _ => format!(
                    "block {block}: want generation {gen}, a torn body at byte {}",
                    word * 8
                ),
            })
        }
    }
}

/// The `--touch` checksum: the wrapping sum of the little-endian 8-byte
/// words of `bytes` (a trailing partial word zero-padded). Summing the
/// pieces of a block that start at multiples of 8 gives the block's sum.
#[inline]
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    // Four independent lanes so the adds pipeline (and vectorize).
    let mut lanes = [0u64; 4];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c.chunks_exact(8)) {
            *l = l.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
    }
    let mut sum = lanes.iter().fold(0u64, |a, &l| a.wrapping_add(l));
    for w in chunks.remainder().chunks(8) {
        let mut x = [0u8; 8];
        x[..w.len()].copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(x));
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::{check, check_piece, checksum, stamp};

    #[test]
    fn verify_catches_stale_misplaced_and_torn_blocks() {
        let mut b = vec![0u8; 4096];
        stamp(&mut b, 7, 3);
        assert!(check(&b, 7, 3).is_ok());
        assert!(check(&b, 7, 2).is_err(), "a stale generation passes");
        assert!(check(&b, 8, 3).is_err(), "a misplaced block passes");
        let mut torn = b.clone();
        let mut other = vec![0u8; 4096];
        stamp(&mut other, 7, 4);
        torn[2048..].copy_from_slice(&other[2048..]);
        assert!(check(&torn, 7, 3).is_err(), "a torn block passes");
        assert!(check(&torn, 7, 4).is_err(), "a torn block passes");
        assert!(check(&[0u8; 4096], 0, 0).is_err(), "zeros pass");
    }

    #[test]
    fn pieces_check_like_the_whole_block() {
        let mut b = vec![0u8; 3 * 4096];
        stamp(&mut b, 11, 5);
        for cut in [8, 16, 4096, 8192, 3 * 4096 - 8] {
            assert!(check_piece(&b[..cut], 11, 5, 0).is_ok());
            assert!(check_piece(&b[cut..], 11, 5, cut).is_ok());
        }
        // A torn second piece is caught in the piece, and names its byte.
        let mut torn = b.clone();
        torn[5000] ^= 1;
        assert!(check_piece(&torn[..4096], 11, 5, 0).is_ok());
        let e = check_piece(&torn[4096..], 11, 5, 4096).unwrap_err();
        assert!(e.contains("torn body at byte 5000"), "{e}");
        // A piece checked at the wrong place is caught (its header words
        // are not body words).
        assert!(check_piece(&b[..4096], 11, 5, 4096).is_err());
        // A ragged piece is not whole words.
        assert!(check_piece(&b[16..21], 11, 5, 16).is_err());
    }

    #[test]
    fn checksum_of_pieces_is_the_checksum_of_the_block() {
        let mut b = vec![0u8; 64 << 10];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i.wrapping_mul(0x9e37_79b9) >> 7) as u8;
        }
        let whole = checksum(&b);
        for cut in [8, 40, 4096, 12288, (64 << 10) - 8] {
            assert_eq!(checksum(&b[..cut]).wrapping_add(checksum(&b[cut..])), whole);
        }
        // It sees every byte.
        for at in [0, 1, 31, 32, 4095, (64 << 10) - 1] {
            let mut c = b.clone();
            c[at] ^= 0x80;
            assert_ne!(checksum(&c), whole, "a flip at {at} is not seen");
        }
        // Words are little-endian and a partial word is zero-padded.
        assert_eq!(checksum(&[1, 0, 0, 0, 0, 0, 0, 0, 2]), 3);
    }
}
