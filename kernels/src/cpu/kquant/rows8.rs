//! The eight-row interleaved layout of quantised matrices (Q4_K, Q5_K, Q6_K, IQ4_XS and the
//! 32-weight types), which the AVX-512 VNNI kernels (`super::rows8_vnni`,
//! `crate::cpu::q8::rows8_vnni`) and the AVX2 ones (`super::rows8_avx2`,
//! `crate::cpu::q8::rows8_avx2`) read: the same bytes as the file, reordered at
//! load so that one 32-byte load holds four quants of each of eight rows, and the rows'
//! scales sit side by side. Nothing is widened: a matrix keeps its size.
//!
//! Rows come in groups of eight; a group's super-block `b` (the eight rows' blocks `b`) is one
//! *tile* of `8 · block_bytes` bytes, and a group is its `nb` tiles in order. A tile:
//!
//! - `Q4_K` (1152 bytes): the rows' `d` (eight f16), their `dmin`, then the rows' three
//!   little-endian words of packed scales (bytes 0-3 of each row, then 4-7, then 8-11: 32
//!   bytes each), then the quants: for each 32-byte chunk `c` of a row's `qs` and each
//!   `t < 8`, bytes `4t..4t + 4` of that chunk of rows 0..8 (32 bytes).
//! - `Q5_K` (1408 bytes): as Q4_K, with bytes `4t..4t + 4` of the rows' `qh` (`t < 8`)
//!   between the scales and the quants.
//! - `Q6_K` (1680 bytes): the rows' `d`, their 16 scales by group (group `g` of rows 0..8 at
//!   `16 + 8g`), then for each half `n` of the block and `t < 8`, 96 bytes: bytes `4t..4t + 4`
//!   of `ql`'s quarters `2n` and `2n + 1` and of `qh`'s half `n`, each of rows 0..8. The
//!   kernel reads a tile front to back (the hardware prefetchers follow it).
//! - `IQ4_XS` (1088 bytes): the rows' `d`, their `scales_h` (eight u16), their `scales_l`
//!   (eight 4-byte words), then for each 32-weight sub-block `b` and `t < 4`, bytes
//!   `16b + 4t..16b + 4t + 4` of `qs` of rows 0..8.
//! - The 32-weight types (eight times their block): the rows' `d` (and `m` for Q4_1 and
//!   Q5_1), their `qh` words (Q5_0, Q5_1), then each dword of the rows' quants (four for the
//!   nibble types, eight for Q8_0) as 32 bytes: dword `c` of rows 0..8.
//!
//! Packing and unpacking are exact inverses; a matrix in this layout gives the same results,
//! bit for bit, as the same matrix in rows (the kernels end every block with the same
//! operations), so whether a matrix was packed is invisible in the outputs.

use crate::DType;

/// Rows per group.
pub(crate) const GROUP: usize = 8;

/// Whether `dtype` has this layout.
pub(crate) fn has_layout(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ4_XS
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::IQ4_NL
    )
}

/// Where each byte of a tile comes from, in tile order: `(row, offset in the row's block)`.
fn tile_sources(dtype: DType) -> Vec<(usize, usize)> {
    let mut src = Vec::with_capacity(GROUP * dtype.block_bytes());
    let four = |src: &mut Vec<(usize, usize)>, at: usize| {
        for r in 0..GROUP {
            for i in 0..4 {
                src.push((r, at + i));
            }
        }
    };
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            // d, dmin.
            for field in [0, 2] {
                for r in 0..GROUP {
                    src.push((r, field));
                    src.push((r, field + 1));
                }
            }
            // The three words of scales.
            for word in 0..3 {
                four(&mut src, 4 + 4 * word);
            }
            // Q5_K's fifth bits: bytes `4t..4t + 4` of `qh` of rows 0..8.
            let qs = if dtype == DType::Q5_K {
                for t in 0..8 {
                    four(&mut src, 16 + 4 * t);
                }
                48
            } else {
                16
            };
            for c in 0..4 {
                for t in 0..8 {
                    four(&mut src, qs + 32 * c + 4 * t);
                }
            }
        }
        DType::Q6_K => {
            for r in 0..GROUP {
                src.push((r, 208));
                src.push((r, 209));
            }
            for g in 0..16 {
                for r in 0..GROUP {
                    src.push((r, 192 + g));
                }
            }
            // In the order the kernel reads them: per half `n` of the block and `t < 8`, the
            // two `ql` quarters' and the `qh` half's bytes `4t..4t + 4` of rows 0..8.
            for n in 0..2 {
                for t in 0..8 {
                    four(&mut src, 64 * n + 4 * t);
                    four(&mut src, 64 * n + 32 + 4 * t);
                    four(&mut src, 128 + 32 * n + 4 * t);
                }
            }
        }
        DType::IQ4_XS => {
            // d, scales_h.
            for field in [0, 2] {
                for r in 0..GROUP {
                    src.push((r, field));
                    src.push((r, field + 1));
                }
            }
            four(&mut src, 4);
            for b in 0..8 {
                for t in 0..4 {
                    four(&mut src, 8 + 16 * b + 4 * t);
                }
            }
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::IQ4_NL => {
            // The f16 scale (and minimum), Q5's fifth bits, then the quants by dword.
            let min = matches!(dtype, DType::Q4_1 | DType::Q5_1);
            let five = matches!(dtype, DType::Q5_0 | DType::Q5_1);
            let head = if min { 4 } else { 2 };
            for field in (0..head).step_by(2) {
                for r in 0..GROUP {
                    src.push((r, field));
                    src.push((r, field + 1));
                }
            }
            if five {
                four(&mut src, head);
            }
            let qs = head + if five { 4 } else { 0 };
            let dwords = if dtype == DType::Q8_0 { 8 } else { 4 };
            for c in 0..dwords {
                four(&mut src, qs + 4 * c);
            }
        }
        other => unreachable!("has_layout checks the type: {other}"),
    }
    debug_assert_eq!(src.len(), GROUP * dtype.block_bytes());
    src
}

/// A row's bytes `at..at + len` of a block, at `o..o + len` in the tile.
#[derive(Debug, Clone, Copy)]
struct Run {
    at: u16,
    o: u16,
    len: u8,
}

/// For each row of a group, where its block's bytes go in the tile, as runs of up to four
/// bytes that stay together (the inverse of [`tile_sources`]): copied a word at a time.
fn tile_runs(dtype: DType) -> &'static [Vec<Run>; GROUP] {
    use std::sync::OnceLock;
    type Cell = OnceLock<[Vec<Run>; GROUP]>;
    static CELLS: [Cell; 10] = [const { OnceLock::new() }; 10];
    let at = match dtype {
        DType::Q4_K => 0,
        DType::Q5_K => 1,
        DType::Q6_K => 2,
        DType::IQ4_XS => 3,
        DType::Q4_0 => 4,
        DType::Q4_1 => 5,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        _ => 9,
    };
    CELLS[at].get_or_init(|| {
        let bb = dtype.block_bytes();
        let mut inv = vec![0usize; GROUP * bb];
        for (o, (r, at)) in tile_sources(dtype).into_iter().enumerate() {
            inv[r * bb + at] = o;
        }
        std::array::from_fn(|r| {
            let row = &inv[r * bb..(r + 1) * bb];
            let mut runs = Vec::new();
            let mut at = 0;
            while at < bb {
                let mut len = 1;
                while len < 4 && at + len < bb && row[at + len] == row[at] + len {
                    len += 1;
                }
                runs.push(Run {
                    at: at as u16,
                    o: row[at] as u16,
                    len: len as u8,
                });
                at += len;
            }
            runs
        })
    })
}

/// `to[o..o + len] = from[at..at + len]` for each run (`forward`), or the reverse.
#[inline]
fn copy_runs(runs: &[Run], from: &[u8], to: &mut [u8], forward: bool) {
    for r in runs {
        let (a, o) = (usize::from(r.at), usize::from(r.o));
        let (src, dst) = if forward { (a, o) } else { (o, a) };
        match r.len {
            4 => to[dst..dst + 4].copy_from_slice(&from[src..src + 4]),
            2 => to[dst..dst + 2].copy_from_slice(&from[src..src + 2]),
            n => {
                let n = usize::from(n);
                to[dst..dst + n].copy_from_slice(&from[src..src + n]);
            }
        }
    }
}

/// Reorder a `rows x cols` matrix of `dtype` stored by rows (`src`) into the interleaved
/// layout (`dst`, the same length), a group of rows per task on the current rayon pool.
///
/// # Panics
/// If `dtype` has no such layout, `rows` is not a multiple of eight, `cols` of the block, or the
/// lengths do not match the shape (bugs in the caller: [`crate::interleave_rows`] checks
/// first).
pub(crate) fn pack(dtype: DType, rows: usize, cols: usize, src: &[u8], dst: &mut [u8]) {
    use rayon::prelude::*;
    let (bb, nb) = check(dtype, rows, cols, src.len(), dst.len());
    let runs = tile_runs(dtype);
    let row_bytes = nb * bb;
    src.par_chunks_exact(GROUP * row_bytes)
        .zip(dst.par_chunks_exact_mut(GROUP * row_bytes))
        .for_each(|(s, d)| {
            for (r, row) in s.chunks_exact(row_bytes).enumerate() {
                for (blk, tile) in row.chunks_exact(bb).zip(d.chunks_exact_mut(GROUP * bb)) {
                    copy_runs(&runs[r], blk, tile, true);
                }
            }
        });
}

/// Row `r` (of eight) of one group of `nb` tiles, as stored, into `row_out`.
fn unpack_row(dtype: DType, nb: usize, tiles: &[u8], r: usize, row_out: &mut [u8]) {
    let bb = dtype.block_bytes();
    let runs = &tile_runs(dtype)[r];
    for (tile, blk) in tiles
        .chunks_exact(GROUP * bb)
        .zip(row_out.chunks_exact_mut(bb))
        .take(nb)
    {
        copy_runs(runs, tile, blk, false);
    }
}

/// Bring eight rows back from one group of the interleaved layout: `tiles` is the group's
/// `nb` tiles, `rows_out` receives the eight rows as stored (`8 · nb · block_bytes` bytes).
///
/// # Panics
/// If the lengths disagree (a bug in the caller).
pub(crate) fn unpack_group(dtype: DType, nb: usize, tiles: &[u8], rows_out: &mut [u8]) {
    let row_bytes = nb * dtype.block_bytes();
    assert!(
        has_layout(dtype)
            && tiles.len() >= GROUP * row_bytes
            && rows_out.len() >= GROUP * row_bytes,
        "unpack_group: {} bytes of {dtype}",
        tiles.len()
    );
    for (r, row) in rows_out.chunks_exact_mut(row_bytes).take(GROUP).enumerate() {
        unpack_row(dtype, nb, tiles, r, row);
    }
}

/// The products of `w_rows` interleaved rows (whole groups from the start of `w`) for a
/// level without a kernel on the layout: each group brought back to rows, then
/// `dot(rows, out)` with that group's `8 · x_rows` outputs.
pub(crate) fn by_groups(
    dtype: DType,
    nb: usize,
    w: &[u8],
    w_rows: usize,
    x_rows: usize,
    out: &mut [f32],
    mut dot: impl FnMut(&[u8], &mut [f32]),
) {
    let group_bytes = GROUP * nb * dtype.block_bytes();
    let mut rows = vec![0u8; group_bytes];
    for (tiles, o) in w
        .chunks(group_bytes)
        .zip(out.chunks_mut(GROUP * x_rows))
        .take(w_rows / GROUP)
    {
        unpack_group(dtype, nb, tiles, &mut rows);
        dot(&rows, o);
    }
}

/// Dequantise row `r` of an interleaved matrix of `cols` columns into `out`.
pub(crate) fn dequantize_row(dtype: DType, data: &[u8], cols: usize, r: usize, out: &mut [f32]) {
    let (bb, nb) = (dtype.block_bytes(), cols / dtype.block_elems());
    let group = &data[(r / GROUP) * GROUP * nb * bb..][..GROUP * nb * bb];
    let mut row = vec![0u8; nb * bb];
    unpack_row(dtype, nb, group, r % GROUP, &mut row);
    crate::cpu::dequant::dequantize_row(dtype, &row, out);
}

fn check(dtype: DType, rows: usize, cols: usize, src: usize, dst: usize) -> (usize, usize) {
    let (bb, be) = (dtype.block_bytes(), dtype.block_elems());
    assert!(
        has_layout(dtype)
            && rows.is_multiple_of(GROUP)
            && cols.is_multiple_of(be)
            && src == rows * (cols / be) * bb
            && dst == src,
        "rows8::pack: {rows} x {cols} {dtype} from {src} into {dst} bytes"
    );
    (bb, cols / be)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_a_permutation_and_unpacking_inverts_packing() {
        for dtype in DType::ALL.into_iter().filter(|&d| has_layout(d)) {
            let bb = dtype.block_bytes();
            let mut seen = vec![false; GROUP * bb];
            for (r, at) in tile_sources(dtype) {
                assert!(!seen[r * bb + at], "{dtype}: byte {at} of row {r} twice");
                seen[r * bb + at] = true;
            }
            assert!(seen.iter().all(|&s| s), "{dtype}: a byte left out");
            let (rows, cols) = (16, 2 * dtype.block_elems());
            let src: Vec<u8> = (0..rows * 2 * bb).map(|i| (i * 131 % 251) as u8).collect();
            let mut packed = vec![0u8; src.len()];
            pack(dtype, rows, cols, &src, &mut packed);
            assert_ne!(packed, src);
            let mut back = vec![0u8; src.len()];
            for (p, b) in packed
                .chunks_exact(GROUP * 2 * bb)
                .zip(back.chunks_exact_mut(GROUP * 2 * bb))
            {
                unpack_group(dtype, 2, p, b);
            }
            assert_eq!(back, src, "{dtype}");
        }
    }
}
