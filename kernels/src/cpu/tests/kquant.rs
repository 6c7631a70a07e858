//! The super-block kernels past the reference fixtures' four rows: whole passes of eight
//! weight rows and every ragged last pass (the lane kernels put eight rows in a vector), and
//! every activation-row count a level's kernels take, each against the dequantised weights
//! and the quantised activations in f64.

use super::super::kquant::{dot_q8k, is_super_block, max_xk, Q8KArgs};
use super::{extreme_inputs, random_matrix, scale_fields, Rng};
use crate::cpu::features::Isa;
use crate::{dequantize_row, quantize_row_q8k, DType, Q8KBlock};

fn super_block_kernels_match_dequantised(isa: Isa) {
    let mut rng = Rng(0x5EED_2606);
    let (rows, cols) = (19usize, 512usize);
    for dtype in DType::ALL.into_iter().filter(|&d| is_super_block(d)) {
        let w = random_matrix(&mut rng, dtype, rows, cols);
        // Up to the level's most activation rows per call (64 on AVX-512 VNNI), with ragged
        // counts past the AVX2 kernels' eight.
        let x_max = max_xk(isa, dtype, false);
        let x: Vec<f32> = (0..x_max * cols).map(|_| rng.f32() * 2.0).collect();
        for w_rows in [1, 3, 7, 8, 9, 16, 17, 19] {
            assert_matches_dequantised(isa, dtype, &w, w_rows, cols, &x, false);
        }
    }
}

/// The kernels' products of the first `w_rows` rows of `w` (`cols` wide, stored by rows; in
/// the interleaved layout too with `interleave`) against the rows of `x` quantised, for every
/// activation-row count the level takes up to those `x` holds, each against the dequantised
/// weights and the quantised activations in f64.
fn assert_matches_dequantised(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    w_rows: usize,
    cols: usize,
    x: &[f32],
    interleave: bool,
) {
    let (nb, rb) = (cols / 256, dtype.row_bytes(cols));
    let w = &w[..w_rows * rb];
    let deq: Vec<Vec<f32>> = (0..w_rows)
        .map(|i| {
            let mut r = vec![0f32; cols];
            dequantize_row(dtype, &w[i * rb..(i + 1) * rb], &mut r);
            r
        })
        .collect();
    let mut packed = vec![0u8; w.len()];
    if interleave {
        crate::interleave_rows(dtype, w_rows, cols, w, &mut packed).expect("interleavable");
    }
    let x_max = max_xk(isa, dtype, interleave).min(x.len() / cols);
    let mut q = vec![Q8KBlock::default(); x_max * nb];
    for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(nb)) {
        quantize_row_q8k(xr, qr);
    }
    // The activations the kernels see: each block's quants times its scale.
    let seen = |j: usize, t: usize| {
        let blk = &q[j * nb + t / 256];
        f64::from(blk.d) * f64::from(blk.qs[t % 256])
    };
    for x_rows in (1..=8).chain([13, 33, 64]).filter(|&r| r <= x_max) {
        let args = Q8KArgs {
            dtype,
            w: if interleave { &packed } else { w },
            w_stride: rb,
            x: &q,
            nb,
            interleaved: interleave,
        };
        let mut out = vec![f32::NAN; w_rows * x_rows];
        dot_q8k(isa, &args, w_rows, x_rows, &mut out);
        for i in 0..w_rows {
            for j in 0..x_rows {
                let terms = (0..cols).map(|t| f64::from(deq[i][t]) * seen(j, t));
                let (want, size) = terms.fold((0f64, 0f64), |(s, a), v| (s + v, a + v.abs()));
                let got = f64::from(out[i * x_rows + j]);
                assert!(
                    (got - want).abs() <= 1e-5 * size + 1e-6,
                    "{dtype} {isa:?} interleaved={interleave} {w_rows}x{x_rows}: weight row {i}, \
                     x row {j}: got {got}, want {want} (terms summing to {size} in magnitude)"
                );
            }
        }
    }
}

mod super_block_kernels_match_dequantised {
    level_tests!(super::super_block_kernels_match_dequantised => Scalar, Avx2, AvxVnni, Avx512Vnni);
}

/// The largest sums the kernels' narrow integers meet: every quant at its top or bottom
/// (bytes 0xFF or 0x00, the scales' bytes too), activations at ±127 in every value, by rows
/// and interleaved. The kernels that add pair products in i16 before scaling them (Q4_K's
/// eight steps, Q5_K's four) are exact only within the bounds their comments state; random
/// blocks stay far from them.
fn extreme_blocks_match_dequantised(isa: Isa) {
    let (rows, cols) = (16usize, 512usize);
    for dtype in DType::ALL.into_iter().filter(|&d| is_super_block(d)) {
        let (w, x) = extreme_inputs(dtype, rows, cols, scale_fields(dtype), 8);
        assert_matches_dequantised(isa, dtype, &w, rows, cols, &x, false);
        if crate::cpu::has_interleaved_layout(dtype) {
            assert_matches_dequantised(isa, dtype, &w, rows, cols, &x, true);
        }
    }
}

mod extreme_blocks_match_dequantised {
    level_tests!(super::extreme_blocks_match_dequantised => Scalar, Avx2, AvxVnni, Avx512Vnni);
}

/// Matrices in the interleaved layout (the K-quants but Q2_K and Q3_K, IQ4_XS and the
/// 32-weight types) give the bits the same matrices give by rows: the super-block kernels'
/// products for every activation-row count the level takes, the f32 and q8 matmul paths, and
/// each row's dequantisation (the row kernels are checked against references above and in
/// `reference`).
fn interleaved_matrices_match_rows(isa: Isa) {
    use crate::cpu::matmul::{matmul_multi_at, matmul_multi_q8_at};
    use crate::{interleave_rows, MatmulJob, QMatrix};
    let mut rng = Rng(0x5EED_2612);
    let types = DType::ALL
        .into_iter()
        .filter(|&d| crate::cpu::has_interleaved_layout(d));
    for dtype in types {
        for (rows, cols) in [(8usize, 256usize), (24, 768), (40, 512)] {
            let nb = cols / 256;
            let w = random_matrix(&mut rng, dtype, rows, cols);
            let mut packed = vec![0u8; w.len()];
            interleave_rows(dtype, rows, cols, &w, &mut packed).expect("interleavable");
            let by_rows = QMatrix::new(dtype, rows, cols, &w).expect("shape");
            let inter = QMatrix::interleaved(dtype, rows, cols, &packed).expect("shape");
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                by_rows.dequantize_row_into(r, &mut a);
                inter.dequantize_row_into(r, &mut b);
                assert_eq!(a, b, "{dtype} row {r} dequantised");
            }
            let x: Vec<f32> = (0..64 * cols).map(|_| rng.f32() * 2.0).collect();
            let x_max = if is_super_block(dtype) {
                max_xk(isa, dtype, true)
            } else {
                0
            };
            let mut q = vec![Q8KBlock::default(); x_max * nb];
            for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(nb)) {
                quantize_row_q8k(xr, qr);
            }
            for x_rows in (1..=9).chain([13, 33, 64]).filter(|&r| r <= x_max) {
                let args = Q8KArgs {
                    dtype,
                    w: &packed,
                    w_stride: dtype.row_bytes(cols),
                    x: &q,
                    nb,
                    interleaved: true,
                };
                let mut got = vec![f32::NAN; rows * x_rows];
                dot_q8k(isa, &args, rows, x_rows, &mut got);
                // The row kernels, a few activation rows at a time.
                let per = max_xk(isa, dtype, false);
                let mut want = vec![f32::NAN; rows * x_rows];
                let mut j0 = 0;
                while j0 < x_rows {
                    let xn = (x_rows - j0).min(per);
                    let args = Q8KArgs {
                        dtype,
                        w: &w,
                        w_stride: dtype.row_bytes(cols),
                        x: &q[j0 * nb..],
                        nb,
                        interleaved: false,
                    };
                    let mut part = vec![f32::NAN; rows * xn];
                    dot_q8k(isa, &args, rows, xn, &mut part);
                    for i in 0..rows {
                        for j in 0..xn {
                            want[i * x_rows + j0 + j] = part[i * xn + j];
                        }
                    }
                    j0 += xn;
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype} {isa:?} {rows}x{cols}, {x_rows} x"
                );
            }
            // 17 and 33 rows take AVX-512 VNNI's panel product for the interleaved matrix;
            // `accumulate` adds into outputs that hold values already.
            for m in [1, 3, 5, 17, 33] {
                let xs = &x[..m * cols];
                for (q8, accumulate) in [(false, false), (true, false), (true, true)] {
                    let run = |w: QMatrix<'_>| {
                        let mut out: Vec<f32> =
                            (0..m * rows).map(|i| (i % 7) as f32 - 3.0).collect();
                        if !accumulate {
                            out.fill(f32::NAN);
                        }
                        let jobs = &mut [MatmulJob { w, out: &mut out }];
                        if q8 {
                            matmul_multi_q8_at(isa, xs, m, jobs, accumulate)
                        } else {
                            matmul_multi_at(isa, xs, m, jobs, accumulate)
                        }
                        .expect("shapes");
                        out.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
                    };
                    assert_eq!(
                        run(inter),
                        run(by_rows),
                        "{dtype} {isa:?} m={m} q8={q8} accumulate={accumulate}"
                    );
                }
            }
        }
    }
}

mod interleaved_matrices_match_rows {
    level_tests!(super::interleaved_matrices_match_rows => Scalar, Avx2, AvxVnni, Avx512Vnni);
}
