//! The super-block kernels past the reference fixtures' four rows: whole passes of eight
//! weight rows and every ragged last pass (the lane kernels put eight rows in a vector), and
//! every activation-row count a level's kernels take, each against the dequantised weights
//! and the quantised activations in f64.

use super::super::kquant::{dot_q8k, is_super_block, max_xk, Q8KArgs};
use super::{random_matrix, Rng};
use crate::cpu::features::Isa;
use crate::{dequantize_row, quantize_row_q8k, DType, Q8KBlock};

fn super_block_kernels_match_dequantised(isa: Isa) {
    let mut rng = Rng(0x5EED_2606);
    let (rows, cols) = (19usize, 512usize);
    let nb = cols / 256;
    for dtype in DType::ALL.into_iter().filter(|&d| is_super_block(d)) {
        let w = random_matrix(&mut rng, dtype, rows, cols);
        let rb = dtype.row_bytes(cols);
        let deq: Vec<Vec<f32>> = (0..rows)
            .map(|i| {
                let mut r = vec![0f32; cols];
                dequantize_row(dtype, &w[i * rb..(i + 1) * rb], &mut r);
                r
            })
            .collect();
        // Up to the level's most activation rows per call (64 on AVX-512 VNNI), with ragged
        // counts past the AVX2 kernels' eight.
        let x_max = max_xk(isa, dtype);
        let x: Vec<f32> = (0..x_max * cols).map(|_| rng.f32() * 2.0).collect();
        let mut q = vec![Q8KBlock::default(); x_max * nb];
        for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(nb)) {
            quantize_row_q8k(xr, qr);
        }
        // The activations the kernels see: each block's quants times its scale.
        let seen = |j: usize, t: usize| {
            let blk = &q[j * nb + t / 256];
            f64::from(blk.d) * f64::from(blk.qs[t % 256])
        };
        for w_rows in [1, 3, 7, 8, 9, 16, 17, 19] {
            for x_rows in (1..=8).chain([13, 33, 64]).filter(|&r| r <= x_max) {
                let args = Q8KArgs {
                    dtype,
                    w: &w,
                    w_stride: rb,
                    x: &q,
                    nb,
                };
                let mut out = vec![f32::NAN; w_rows * x_rows];
                dot_q8k(isa, &args, w_rows, x_rows, &mut out);
                for i in 0..w_rows {
                    for j in 0..x_rows {
                        let terms = (0..cols).map(|t| f64::from(deq[i][t]) * seen(j, t));
                        let (want, size) =
                            terms.fold((0f64, 0f64), |(s, a), v| (s + v, a + v.abs()));
                        let got = f64::from(out[i * x_rows + j]);
                        assert!(
                            (got - want).abs() <= 1e-5 * size + 1e-6,
                            "{dtype} {isa:?} {w_rows}x{x_rows}: weight row {i}, x row {j}: \
                             got {got}, want {want} (terms summing to {size} in magnitude)"
                        );
                    }
                }
            }
        }
    }
}

mod super_block_kernels_match_dequantised {
    level_tests!(super::super_block_kernels_match_dequantised => Scalar, Avx2, AvxVnni, Avx512Vnni);
}
