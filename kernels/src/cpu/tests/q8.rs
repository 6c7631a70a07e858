//! Quantised activations: the quantiser, every integer kernel level, the drivers.

use super::super::q8::{dot_q8, q8_blocks, Q8Args, MAX_X};
use super::*;
use crate::{matmul_multi_q8, matmul_q8, quantize_row_q8, Q8Block};

/// The 32-weight block types, which the [`Q8Block`] kernels take.
fn q8_types() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|&d| q8_blocks(d))
}

#[test]
fn q8_quantisation_rounds_and_sums() {
    // Largest magnitude 127 gives d = 1: the quants are the values rounded half to even.
    let mut x = [0f32; 32];
    x[0] = -127.0;
    x[1] = 2.5;
    x[2] = 3.5;
    x[3] = -2.5;
    x[4] = 0.49;
    x[5] = 126.6;
    let mut b = [Q8Block::default()];
    quantize_row_q8(&x, &mut b);
    assert_eq!(b[0].d, 1.0);
    assert_eq!(&b[0].qs[..6], &[-127, 2, 4, -2, 0, 127]);
    assert_eq!(b[0].s, (-127 + 2 + 4 - 2 + 127) as f32);
    // An all-zero block.
    quantize_row_q8(&[0.0; 32], &mut b);
    assert_eq!(b[0], Q8Block::default());
    // Random rows: every value within half a step, the sum consistent.
    let mut rng = Rng(5);
    let x: Vec<f32> = (0..96).map(|_| rng.f32() * 3.0).collect();
    let mut q = [Q8Block::default(); 3];
    quantize_row_q8(&x, &mut q);
    for (blk, c) in q.iter().zip(x.chunks_exact(32)) {
        let amax = c.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(blk.d, amax / 127.0);
        assert!(blk.qs.iter().any(|&v| v.abs() == 127));
        for (&qi, &v) in blk.qs.iter().zip(c) {
            assert!((v - blk.d * f32::from(qi)).abs() <= blk.d * 0.5 * 1.0001);
        }
        let sum: i32 = blk.qs.iter().map(|&v| i32::from(v)).sum();
        assert_eq!(blk.s, blk.d * sum as f32);
    }
}

/// Weights and activation blocks whose scales are 0.5 or 1 (and Q4_1 minimums ±0.5 or ±1),
/// so that every partial sum of the dot products is a multiple of 0.25 below 2^22: f32
/// arithmetic is then exact in any order, and every level must give the exact value.
fn exact_inputs(rng: &mut Rng, dtype: DType, rows: usize, nb: usize) -> (Vec<u8>, Vec<Q8Block>) {
    let pick = |rng: &mut Rng| if rng.next_u32() & 1 == 0 { 0.5 } else { 1.0 };
    let sign = |rng: &mut Rng| if rng.next_u32() & 1 == 0 { -1.0 } else { 1.0 };
    let mut w = Vec::new();
    for _ in 0..rows * nb {
        push_f16(&mut w, pick(rng));
        match dtype {
            DType::Q4_1 => {
                let m = sign(rng) * pick(rng);
                push_f16(&mut w, m);
                (0..16).for_each(|_| w.push(rng.next_u32() as u8));
            }
            DType::Q4_0 | DType::IQ4_NL => (0..16).for_each(|_| w.push(rng.next_u32() as u8)),
            DType::Q5_0 | DType::Q5_1 => {
                if dtype == DType::Q5_1 {
                    let m = sign(rng) * pick(rng);
                    push_f16(&mut w, m);
                }
                (0..20).for_each(|_| w.push(rng.next_u32() as u8));
            }
            // Include −128, which only weights can hold.
            _ => (0..32).for_each(|_| w.push(rng.next_u32() as u8)),
        }
    }
    let x = (0..MAX_XR * nb)
        .map(|_| {
            let mut b = Q8Block {
                d: pick(rng),
                ..Q8Block::default()
            };
            for q in b.qs.iter_mut() {
                *q = ((rng.next_u32() % 255) as i32 - 127) as i8;
            }
            b.s = b.d * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>() as f32;
            b
        })
        .collect();
    (w, x)
}

const MAX_XR: usize = MAX_X;

/// The exact value in f64 from the dequantised weights and activations.
fn exact_dot(dtype: DType, wrow: &[u8], x: &[Q8Block]) -> f64 {
    let k = x.len() * 32;
    let mut wf = vec![0f32; k];
    dequantize_row(dtype, wrow, &mut wf);
    x.iter()
        .flat_map(|b| b.qs.iter().map(move |&q| f64::from(b.d) * f64::from(q)))
        .zip(&wf)
        .map(|(xv, &wv)| xv * f64::from(wv))
        .sum()
}

/// `isa`'s integer kernels give the exact value on inputs where f32 arithmetic is exact.
fn q8_kernels_exact(isa: Isa) {
    let mut rng = Rng(0xDEAD_BEEF);
    // An odd block count exercises the kernels' lone last block.
    for (dtype, nb) in q8_types().flat_map(|d| [(d, 7usize), (d, 8)]) {
        let rb = dtype.row_bytes(nb * 32);
        let (w, x) = exact_inputs(&mut rng, dtype, 17, nb);
        // Up to 17 weight rows: whole passes of eight and every tail, against 1..=MAX_X
        // activation rows.
        for w_rows in [1, 2, 3, 5, 7, 8, 9, 15, 16, 17] {
            for x_rows in 1..=MAX_XR {
                let want: Vec<f64> = (0..w_rows * x_rows)
                    .map(|o| {
                        let (i, j) = (o / x_rows, o % x_rows);
                        exact_dot(dtype, &w[i * rb..(i + 1) * rb], &x[j * nb..(j + 1) * nb])
                    })
                    .collect();
                let mut out = vec![f32::NAN; w_rows * x_rows];
                let args = Q8Args {
                    dtype,
                    w: &w,
                    w_stride: rb,
                    x: &x,
                    nb,
                    interleaved: false,
                    xu: &[],
                };
                dot_q8(isa, &args, w_rows, x_rows, &mut out);
                for (o, (&g, &e)) in out.iter().zip(&want).enumerate() {
                    assert_eq!(
                        f64::from(g),
                        e,
                        "{dtype} {isa:?} {w_rows}x{x_rows} output {o}"
                    );
                }
            }
        }
    }
}

mod q8_kernels_exact {
    // Avx512 runs the AVX2 integer kernels, tested at Avx2.
    level_tests!(super::q8_kernels_exact => Scalar, Avx2, AvxVnni, Avx512Vnni);
}

/// |x·w − xq·w| ≤ Σ_i |w_i|·d_block(i)/2: the rounding error bound of the quantised row.
fn q8_error_bound(x: &[f32], m: usize, w: &QMatrix<'_>) -> Vec<f64> {
    let (n, k) = (w.rows(), w.cols());
    let mut row = vec![0f32; k];
    let mut out = vec![0f64; m * n];
    let mut q = vec![Q8Block::default(); k / 32];
    for i in 0..m {
        quantize_row_q8(&x[i * k..(i + 1) * k], &mut q);
        for j in 0..n {
            dequantize_row(w.dtype(), w.row(j), &mut row);
            out[i * n + j] = (0..k)
                .map(|t| f64::from(row[t]).abs() * f64::from(q[t / 32].d) * 0.5)
                .sum();
        }
    }
    out
}

#[test]
fn matmul_q8_within_quantisation_error() {
    let mut rng = Rng(99);
    for dtype in q8_types() {
        for &(n, k) in &[(7usize, 64usize), (130, 160), (33, 576)] {
            let bytes = random_matrix(&mut rng, dtype, n, k);
            let w = QMatrix::new(dtype, n, k, &bytes).unwrap();
            for m in [1usize, 2, 3, 5, 8, 17] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
                let want = reference(&x, m, &w);
                let bound = q8_error_bound(&x, m, &w);
                let mut out = vec![f32::NAN; m * n];
                matmul_q8(&x, m, &w, &mut out, false).unwrap();
                let mut worst = 0f64;
                for i in 0..m * n {
                    let err = (f64::from(out[i]) - want[i]).abs();
                    worst = worst.max(err / bound[i].max(1e-12));
                    assert!(
                        err <= bound[i] * 1.001 + 1e-5 * (1.0 + want[i].abs()),
                        "{dtype} {n}x{k} m={m} element {i}: error {err} over bound {}",
                        bound[i]
                    );
                }
                // The error is a real quantisation error, not zero (the path is used).
                assert!(worst > 0.0, "{dtype} {n}x{k} m={m}: no quantisation error");
                // Each activation row is quantised alone: a batch row equals that row alone.
                let mut alone = vec![0f32; n];
                matmul_q8(&x[(m - 1) * k..], 1, &w, &mut alone, false).unwrap();
                assert_eq!(
                    &out[(m - 1) * n..],
                    &alone[..],
                    "{dtype} m={m}: batch vs alone"
                );
                // Accumulate adds onto what is there.
                let mut acc = vec![1.0f32; m * n];
                matmul_q8(&x, m, &w, &mut acc, true).unwrap();
                for (a, o) in acc.iter().zip(&out) {
                    assert_eq!(*a, 1.0 + *o);
                }
            }
        }
    }
}

#[test]
fn matmul_multi_q8_jobs_and_fallback() {
    let mut rng = Rng(17);
    let k = 96;
    let a = random_matrix(&mut rng, DType::Q4_1, 41, k);
    let b = random_matrix(&mut rng, DType::Q8_0, 22, k);
    let f = random_matrix(&mut rng, DType::F16, 9, k);
    let wa = QMatrix::new(DType::Q4_1, 41, k, &a).unwrap();
    let wb = QMatrix::new(DType::Q8_0, 22, k, &b).unwrap();
    let wf = QMatrix::new(DType::F16, 9, k, &f).unwrap();
    for m in [1usize, 6] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let (mut oa, mut ob) = (vec![0f32; m * 41], vec![0f32; m * 22]);
        matmul_multi_q8(
            &x,
            m,
            &mut [
                MatmulJob {
                    w: wa,
                    out: &mut oa,
                },
                MatmulJob {
                    w: wb,
                    out: &mut ob,
                },
            ],
            false,
        )
        .unwrap();
        // Same as each job alone.
        let (mut sa, mut sb) = (vec![0f32; m * 41], vec![0f32; m * 22]);
        matmul_q8(&x, m, &wa, &mut sa, false).unwrap();
        matmul_q8(&x, m, &wb, &mut sb, false).unwrap();
        assert_eq!(oa, sa);
        assert_eq!(ob, sb);
        // Weights without an integer kernel take the exact f32 path.
        let mut of = vec![0f32; m * 9];
        matmul_q8(&x, m, &wf, &mut of, false).unwrap();
        assert_close(&of, &reference(&x, m, &wf), "F16 through matmul_q8");
    }
    // Shape errors are still typed errors.
    let mut out = vec![0f32; 41];
    assert!(matmul_q8(&[0.0; 95], 1, &wa, &mut out, false).is_err());
}

/// The largest sums the 32-weight kernels' narrow integers meet: every quant at its top or
/// bottom (bytes 0xFF or 0x00), activations at ±127 in every value, by rows and interleaved,
/// against the f64 product of the dequantised weights and the quantised activations. The AVX2
/// kernel adds the pair sums of several dwords in i16 for Q4_0 and Q5_0 (eight, four), exact
/// only within the bounds its comment states; random blocks stay far from them.
fn extreme_blocks_match_dequantised(isa: Isa) {
    use crate::cpu::matmul::matmul_multi_q8_at;
    use crate::{interleave_rows, MatmulJob};
    let (n, k) = (16usize, 256usize);
    let nb = k / 32;
    for dtype in q8_types() {
        // The block's f16 scale (and minimum) lead it.
        let fields: &[usize] = if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
            &[0, 2]
        } else {
            &[0]
        };
        let m = 8;
        let (w, x) = extreme_inputs(dtype, n, k, fields, m);
        // What the kernels see: each block's quants times its scale.
        let mut q = vec![Q8Block::default(); m * nb];
        for (xr, qr) in x.chunks_exact(k).zip(q.chunks_exact_mut(nb)) {
            quantize_row_q8(xr, qr);
        }
        let mut deq = vec![0f32; n * k];
        for (j, row) in deq.chunks_exact_mut(k).enumerate() {
            dequantize_row(
                dtype,
                &w[j * dtype.row_bytes(k)..][..dtype.row_bytes(k)],
                row,
            );
        }
        let mut packed = vec![0u8; w.len()];
        let mut layouts = vec![QMatrix::new(dtype, n, k, &w).unwrap()];
        if crate::cpu::has_interleaved_layout(dtype) {
            interleave_rows(dtype, n, k, &w, &mut packed).unwrap();
            layouts.push(QMatrix::interleaved(dtype, n, k, &packed).unwrap());
        }
        for wm in layouts {
            for rows in [1usize, 3, 8] {
                let mut out = vec![f32::NAN; rows * n];
                let jobs = &mut [MatmulJob {
                    w: wm,
                    out: &mut out,
                }];
                matmul_multi_q8_at(isa, &x[..rows * k], rows, jobs, false).unwrap();
                for i in 0..rows {
                    for j in 0..n {
                        let terms = (0..k).map(|t| {
                            let blk = &q[i * nb + t / 32];
                            f64::from(deq[j * k + t]) * f64::from(blk.d) * f64::from(blk.qs[t % 32])
                        });
                        let (want, size) =
                            terms.fold((0f64, 0f64), |(s, a), v| (s + v, a + v.abs()));
                        let got = f64::from(out[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-5 * size + 1e-6,
                            "{dtype} {isa:?} interleaved={} {rows} rows: weight row {j}, x row \
                             {i}: got {got}, want {want}",
                            wm.is_interleaved()
                        );
                    }
                }
            }
        }
    }
}

mod extreme_blocks_match_dequantised {
    level_tests!(super::extreme_blocks_match_dequantised => Scalar, Avx2, AvxVnni, Avx512Vnni);
}
