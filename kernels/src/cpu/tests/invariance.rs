//! Batch invariance: a row's product is bit-identical alone and at every position of every
//! batch size, on both activation paths, for every storage type, on every kernel level; and
//! whatever the thread count (which changes how the weight rows are split into tasks).

use super::{random_matrix, Rng};
use crate::cpu::features::Isa;
use crate::cpu::matmul::{matmul_multi_at, matmul_multi_q8_at};
use crate::{interleave_rows, DType, MatmulJob, QMatrix};

/// Past the kernels' row groups (8 f32 rows, 8 quantised rows, 64 on AVX-512 VNNI's
/// super-block kernel) several times over, with ragged last groups.
const M_MAX: usize = 70;

fn rows_are_batch_invariant(isa: Isa) {
    let mut rng = Rng(0x5EED_1234);
    // 768 columns fit every block size, with three of the K-quants' super-blocks (so that a
    // row's sum crosses super-blocks, where decode's and prefill's kernels must agree); an odd
    // number of weight rows, enough that each pool size below splits them into other tasks (and
    // other odd last passes on the quantised path).
    let k = 768usize;
    for dtype in DType::ALL {
        // As stored, and (where the type has it) in the interleaved layout, whose prefill
        // takes its own product on AVX-512 VNNI: 200 rows, whole groups of eight.
        let n = 203;
        let bytes = random_matrix(&mut rng, dtype, n, k);
        let mut cases = vec![QMatrix::new(dtype, n, k, &bytes).unwrap()];
        let n8 = 200;
        let mut packed = vec![0u8; dtype.row_bytes(k) * n8];
        if crate::cpu::has_interleaved_layout(dtype) {
            interleave_rows(dtype, n8, k, &bytes[..packed.len()], &mut packed).unwrap();
            cases.push(QMatrix::interleaved(dtype, n8, k, &packed).unwrap());
        }
        let x: Vec<f32> = (0..M_MAX * k).map(|_| rng.f32() * 3.0).collect();
        for (w, q8) in cases.iter().flat_map(|&w| [(w, false), (w, true)]) {
            let (n, packed) = (w.rows(), w.is_interleaved());
            let run = |rows: &[f32], m: usize| -> Vec<f32> {
                let mut out = vec![f32::NAN; m * n];
                let mut jobs = [MatmulJob { w, out: &mut out }];
                if q8 {
                    matmul_multi_q8_at(isa, rows, m, &mut jobs, false).unwrap();
                } else {
                    matmul_multi_at(isa, rows, m, &mut jobs, false).unwrap();
                }
                out
            };
            let alone: Vec<Vec<f32>> = (0..M_MAX).map(|r| run(&x[r * k..(r + 1) * k], 1)).collect();
            let sizes = (1..=10).chain([15, 16, 17, 23, 31, 32, 33, 64, 65, M_MAX]);
            for m in sizes {
                // Rows 0..m of `x`, and the same rows in reverse, so that each row is also
                // seen at another position and in another group.
                let reversed: Vec<f32> = (0..m)
                    .rev()
                    .flat_map(|r| x[r * k..(r + 1) * k].iter().copied())
                    .collect();
                for (order, rows) in [("forward", &x[..m * k]), ("reversed", &reversed[..])] {
                    // Another pool size splits the weight rows into other tasks.
                    let threads = 1 + m % 5;
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let out = pool.install(|| run(rows, m));
                    for (pos, got) in out.chunks_exact(n).enumerate() {
                        let r = if order == "forward" { pos } else { m - 1 - pos };
                        let same = got
                            .iter()
                            .zip(&alone[r])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{dtype} {isa:?} q8={q8} interleaved={packed}: row {r} at position {pos} of a batch of {m} ({order}, {threads} threads) differs from the row alone"
                        );
                    }
                }
            }
        }
    }
}

mod rows_are_batch_invariant {
    level_tests!(super::rows_are_batch_invariant => Scalar, Avx2, AvxVnni, Avx512, Avx512Vnni);
}
