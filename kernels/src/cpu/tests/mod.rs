//! Kernel tests: every storage type through every path against scalar dequantise + f64 dot,
//! each SIMD kernel on every level this CPU runs.

use super::dot::{block_sums, dot_rows, DotArgs};
use super::features::Isa;
use crate::{dequantize_row, matmul, matmul_multi, ops, DType, MatmulJob, QMatrix};

struct Rng(u64);
impl Rng {
    fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 16) as u32
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next_u32() as f32 / u32::MAX as f32) * 2.0 - 1.0
    }
}

/// The types whose blocks are at most 32 weights (the shapes below are multiples of 32).
fn all() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|d| d.block_elems() <= 32)
}

fn push_f16(b: &mut Vec<u8>, v: f32) {
    b.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Random bytes of a `rows × cols` matrix in `dtype`, with realistic scales.
fn random_matrix(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(rows * dtype.row_bytes(cols));
    for _ in 0..rows {
        match dtype {
            DType::F32 => (0..cols).for_each(|_| b.extend_from_slice(&rng.f32().to_le_bytes())),
            DType::F16 => (0..cols).for_each(|_| push_f16(&mut b, rng.f32())),
            DType::BF16 => (0..cols).for_each(|_| {
                b.extend_from_slice(&((rng.f32().to_bits() >> 16) as u16).to_le_bytes())
            }),
            DType::Q8_0 => (0..cols / 32).for_each(|_| {
                push_f16(&mut b, rng.f32() * 0.01);
                (0..32).for_each(|_| b.push(rng.next_u32() as u8));
            }),
            DType::Q4_0 | DType::Q4_1 => (0..cols / 32).for_each(|_| {
                push_f16(&mut b, rng.f32() * 0.05);
                if dtype == DType::Q4_1 {
                    push_f16(&mut b, rng.f32() * 0.2);
                }
                (0..16).for_each(|_| b.push(rng.next_u32() as u8));
            }),
            // Random quants and packed sub-scales, small finite f16 scales.
            other => (0..cols / other.block_elems()).for_each(|_| {
                let start = b.len();
                (0..other.block_bytes()).for_each(|_| b.push(rng.next_u32() as u8));
                for &off in scale_fields(other) {
                    let v = half::f16::from_f32(rng.f32() * 0.01).to_bits();
                    b[start + off..start + off + 2].copy_from_slice(&v.to_le_bytes());
                }
            }),
        }
    }
    b
}

/// Byte offsets of the f16 scales in a block of `dtype` (the quantised types not built by
/// hand above).
fn scale_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        _ => &[0],
    }
}

/// The largest sums the kernels' narrow integers meet: a `rows x cols` matrix of `dtype`
/// whose bytes are all 0xFF or 0x00 (whole rows at the top, whole rows at the bottom, rows of
/// both by blocks) but each block's small finite f16 scales (`fields`), and `m` activation rows
/// at ±1 in every value (quantised to ±127): all +1, all -1, alternating, in turn.
fn extreme_inputs(
    dtype: DType,
    rows: usize,
    cols: usize,
    fields: &[usize],
    m: usize,
) -> (Vec<u8>, Vec<f32>) {
    let bb = dtype.block_bytes();
    let mut w = Vec::with_capacity(rows * dtype.row_bytes(cols));
    for r in 0..rows {
        for b in 0..cols / dtype.block_elems() {
            let start = w.len();
            let fill = if r % 3 == 0 || (r % 3 == 2 && b % 2 == 0) {
                0xFF
            } else {
                0x00
            };
            w.resize(start + bb, fill);
            for &off in fields {
                let v = half::f16::from_f32(0.01 + 0.001 * r as f32).to_bits();
                w[start + off..start + off + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    let x = (0..m * cols)
        .map(|i| match (i / cols) % 3 {
            0 => 1.0,
            1 => -1.0,
            _ if i % 2 == 0 => 1.0,
            _ => -1.0,
        })
        .collect();
    (w, x)
}

/// f64 reference: dequantise each row, dot in f64.
fn reference(x: &[f32], m: usize, w: &QMatrix<'_>) -> Vec<f64> {
    let (n, k) = (w.rows(), w.cols());
    let mut row = vec![0f32; k];
    let mut out = vec![0f64; m * n];
    for j in 0..n {
        dequantize_row(w.dtype(), w.row(j), &mut row);
        for i in 0..m {
            out[i * n + j] = (0..k)
                .map(|t| f64::from(x[i * k + t]) * f64::from(row[t]))
                .sum();
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * (1.0 + w.abs());
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn dequantize_known_blocks() {
    // Q4_1: d = 0.5, m = -1, nibbles q: byte j = (j+1) << 4 | j  ->  w[j] = 0.5 j - 1,
    // w[16 + j] = 0.5 (j + 1) - 1 (j + 1 wraps to 0 at j = 15).
    let mut b = Vec::new();
    push_f16(&mut b, 0.5);
    push_f16(&mut b, -1.0);
    for j in 0u8..16 {
        b.push((((j + 1) & 0x0F) << 4) | j);
    }
    let mut out = [0f32; 32];
    dequantize_row(DType::Q4_1, &b, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.5 * j as f32 - 1.0);
        assert_eq!(out[16 + j], 0.5 * ((j + 1) % 16) as f32 - 1.0);
    }
    // Q4_0: same nibbles, d = 2: w = 2 (q - 8).
    let mut b = Vec::new();
    push_f16(&mut b, 2.0);
    for j in 0u8..16 {
        b.push((((j + 1) & 0x0F) << 4) | j);
    }
    dequantize_row(DType::Q4_0, &b, &mut out);
    for (j, v) in out.iter().enumerate().take(16) {
        assert_eq!(*v, 2.0 * (j as f32 - 8.0));
    }
    // Q8_0: d = 0.25, q = j - 16.
    let mut b = Vec::new();
    push_f16(&mut b, 0.25);
    for j in 0..32i32 {
        b.push((j - 16) as i8 as u8);
    }
    dequantize_row(DType::Q8_0, &b, &mut out);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, 0.25 * (j as f32 - 16.0));
    }
}

/// The fused dequantise-and-dot kernel of `isa` against the f64 reference, every storage type
/// and 1 to 8 activation rows.
fn fused_kernels_match_reference(isa: Isa) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (n, k) = (5, 96);
    for dtype in all() {
        let bytes = random_matrix(&mut rng, dtype, n, k);
        let w = QMatrix::new(dtype, n, k, &bytes).unwrap();
        for rows in 1..=8 {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f32()).collect();
            let mut xsum = vec![0f32; rows * k / 32];
            for r in 0..rows {
                block_sums(&x[r * k..(r + 1) * k], &mut xsum[r * 3..(r + 1) * 3]);
            }
            let want = reference(&x, rows, &w);
            for j in 0..n {
                let mut out = [0f32; 8];
                let args = DotArgs {
                    dtype,
                    w: w.row(j),
                    k,
                    x: &x,
                    x_stride: k,
                    xsum: &xsum,
                    xsum_stride: k / 32,
                };
                dot_rows(isa, &args, &mut out[..rows]);
                let col: Vec<f64> = (0..rows).map(|r| want[r * n + j]).collect();
                assert_close(&out[..rows], &col, &format!("{dtype} {isa:?} rows={rows}"));
            }
        }
    }
}

mod fused_kernels_match_reference {
    level_tests!(super::fused_kernels_match_reference => Scalar, Avx2);
}

#[test]
fn matmul_paths_match_reference() {
    let mut rng = Rng(42);
    for dtype in all() {
        for &(n, k) in &[(7usize, 64usize), (130, 160)] {
            let bytes = random_matrix(&mut rng, dtype, n, k);
            let w = QMatrix::new(dtype, n, k, &bytes).unwrap();
            for m in [1usize, 3, 5, 8, 9, 16, 17, 33] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
                let want = reference(&x, m, &w);
                let mut out = vec![f32::NAN; m * n];
                matmul(&x, m, &w, &mut out, false).unwrap();
                assert_close(&out, &want, &format!("{dtype} {n}x{k} m={m}"));
                // Accumulate adds onto what is there.
                let mut acc = vec![1.0f32; m * n];
                matmul(&x, m, &w, &mut acc, true).unwrap();
                let want1: Vec<f64> = want.iter().map(|v| v + 1.0).collect();
                assert_close(&acc, &want1, &format!("{dtype} accumulate m={m}"));
            }
        }
    }
}

#[test]
fn float_rows_with_tails() {
    let mut rng = Rng(7);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (n, k) = (3, 45);
        let bytes = random_matrix(&mut rng, dtype, n, k);
        let w = QMatrix::new(dtype, n, k, &bytes).unwrap();
        let x: Vec<f32> = (0..2 * k).map(|_| rng.f32()).collect();
        let mut out = vec![0f32; 2 * n];
        matmul(&x, 2, &w, &mut out, false).unwrap();
        assert_close(&out, &reference(&x, 2, &w), &format!("{dtype} tail"));
    }
}

#[test]
fn multi_matches_single() {
    let mut rng = Rng(3);
    let k = 64;
    let a = random_matrix(&mut rng, DType::Q4_1, 40, k);
    let b = random_matrix(&mut rng, DType::Q8_0, 24, k);
    let wa = QMatrix::new(DType::Q4_1, 40, k, &a).unwrap();
    let wb = QMatrix::new(DType::Q8_0, 24, k, &b).unwrap();
    for m in [1usize, 12] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let (mut oa, mut ob) = (vec![0f32; m * 40], vec![0f32; m * 24]);
        matmul_multi(
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
        assert_close(&oa, &reference(&x, m, &wa), "multi a");
        assert_close(&ob, &reference(&x, m, &wb), "multi b");
    }
}

#[test]
fn shape_errors_are_typed() {
    let bytes = vec![0u8; 20];
    assert!(QMatrix::new(DType::Q4_1, 1, 16, &bytes).is_err());
    assert!(QMatrix::new(DType::Q4_1, 2, 32, &bytes).is_err());
    let w = QMatrix::new(DType::Q4_1, 1, 32, &bytes).unwrap();
    let mut out = vec![0f32; 1];
    assert!(matmul(&[0.0; 31], 1, &w, &mut out, false).is_err());
    assert!(matmul(&[0.0; 32], 1, &w, &mut [0.0; 2], false).is_err());
}

/// softmax, SiLU·mul, dot and axpy on `isa`'s kernels against their definitions in f64.
fn ops_match_scalar_definitions(isa: Isa) {
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..67).map(|_| rng.f32() * 10.0).collect();
    // softmax
    let mut s = x.clone();
    super::ops::softmax_at(isa, &mut s);
    let max = x.iter().copied().fold(f32::MIN, f32::max) as f64;
    let z: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    for (a, &v) in s.iter().zip(&x) {
        let want = (v as f64 - max).exp() / z;
        assert!((*a as f64 - want).abs() < 1e-6, "softmax {a} vs {want}");
    }
    // silu * up
    let up: Vec<f32> = (0..67).map(|_| rng.f32()).collect();
    let mut g = x.clone();
    super::ops::silu_mul_at(isa, &mut g, &up);
    for i in 0..67 {
        let v = x[i] as f64;
        let want = v / (1.0 + (-v).exp()) * up[i] as f64;
        assert!(
            (g[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
            "silu {i}"
        );
    }
    // dot / axpy
    let d = super::ops::dot_at(isa, &x, &up);
    let want: f64 = x.iter().zip(&up).map(|(a, b)| *a as f64 * *b as f64).sum();
    assert!((d as f64 - want).abs() < 1e-4);
    let mut y = up.clone();
    super::ops::axpy_at(isa, 0.5, &x, &mut y);
    for i in 0..67 {
        assert!((y[i] - (up[i] + 0.5 * x[i])).abs() < 1e-6);
    }
}

mod ops_match_scalar_definitions {
    level_tests!(super::ops_match_scalar_definitions => Scalar, Avx2);
}

#[test]
fn rmsnorm_matches_definition() {
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..67).map(|_| rng.f32() * 10.0).collect();
    // rmsnorm
    let w: Vec<f32> = (0..67).map(|_| rng.f32()).collect();
    let mut o = vec![0f32; 67];
    ops::rmsnorm(&x, &w, 1e-5, &mut o);
    let ms: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 67.0;
    for i in 0..67 {
        let want = x[i] as f64 / (ms + 1e-5).sqrt() * w[i] as f64;
        assert!((o[i] as f64 - want).abs() < 1e-5);
    }
}

#[test]
fn rope_layouts_agree_after_permutation() {
    // The GGUF (adjacent-pair) layout of a head equals the NeoX layout after llama.cpp's
    // permutation: neox index i <-> gguf index 2i, neox index half+i <-> gguf index 2i+1.
    let (hd, pos) = (8usize, 5usize);
    let mut cos = vec![0f32; hd / 2];
    let mut sin = vec![0f32; hd / 2];
    ops::rope_angles(pos, 10000.0, hd, 1.0, None, &mut cos, &mut sin);
    let neox_in: Vec<f32> = (0..hd).map(|i| i as f32 + 1.0).collect();
    let mut gguf_in = vec![0f32; hd];
    for i in 0..hd / 2 {
        gguf_in[2 * i] = neox_in[i];
        gguf_in[2 * i + 1] = neox_in[hd / 2 + i];
    }
    let mut a = neox_in.clone();
    ops::rope(&mut a, 1, hd, hd, &cos, &sin, true);
    let mut b = gguf_in;
    ops::rope(&mut b, 1, hd, hd, &cos, &sin, false);
    for i in 0..hd / 2 {
        assert!((a[i] - b[2 * i]).abs() < 1e-6);
        assert!((a[hd / 2 + i] - b[2 * i + 1]).abs() < 1e-6);
    }
    // Position 0 is the identity.
    ops::rope_angles(0, 10000.0, hd, 1.0, None, &mut cos, &mut sin);
    let mut c = neox_in.clone();
    ops::rope(&mut c, 1, hd, hd, &cos, &sin, true);
    assert_eq!(c, neox_in);
}

/// `axpy_rows` is bit for bit `axpy` once per row, at every width (tails included).
fn axpy_rows_is_repeated_axpy(isa: Isa) {
    let mut rng = Rng(77);
    for &(width, rows, stride) in &[
        (64usize, 5usize, 64usize),
        (72, 9, 80),
        (13, 3, 16),
        (128, 17, 192),
    ] {
        let x: Vec<f32> = (0..rows * stride).map(|_| rng.f32()).collect();
        let alpha: Vec<f32> = (0..rows).map(|_| rng.f32()).collect();
        let y0: Vec<f32> = (0..width).map(|_| rng.f32()).collect();
        let mut want = y0.clone();
        for (j, &a) in alpha.iter().enumerate() {
            super::ops::axpy_at(isa, a, &x[j * stride..j * stride + width], &mut want);
        }
        let mut got = y0.clone();
        super::ops::axpy_rows_at(isa, &alpha, &x, stride, &mut got);
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{isa:?} width {width} rows {rows}");
    }
}

mod axpy_rows_is_repeated_axpy {
    level_tests!(super::axpy_rows_is_repeated_axpy => Scalar, Avx2);
}

mod invariance;
mod kquant;
mod q8;
mod reference;

/// `dots`: each row's value is the same whether the row is alone or anywhere in a call of any
/// size (tails of the width and of the row count included), and close to the exact dot product.
fn dots_are_invariant(isa: Isa) {
    let mut rng = Rng(91);
    for &(width, rows, stride) in &[(64usize, 19usize, 64usize), (72, 9, 80), (13, 3, 16)] {
        let q: Vec<f32> = (0..width).map(|_| rng.f32()).collect();
        let x: Vec<f32> = (0..rows * stride).map(|_| rng.f32()).collect();
        let alone: Vec<f32> = (0..rows)
            .map(|r| {
                let mut o = [0f32];
                super::ops::dots_at(isa, &q, &x[r * stride..], stride, &mut o);
                o[0]
            })
            .collect();
        for (r, &a) in alone.iter().enumerate() {
            let exact: f64 = (0..width)
                .map(|e| f64::from(q[e]) * f64::from(x[r * stride + e]))
                .sum();
            assert!(
                (f64::from(a) - exact).abs() < 1e-4,
                "{isa:?} width {width} row {r}: {a} vs {exact}"
            );
        }
        for start in 0..rows {
            for n in 1..=rows - start {
                let mut got = vec![f32::NAN; n];
                super::ops::dots_at(isa, &q, &x[start * stride..], stride, &mut got);
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        alone[start + i].to_bits(),
                        "{isa:?} width {width}: row {} at {i} of {n}",
                        start + i
                    );
                }
            }
        }
    }
}

mod dots_are_invariant {
    level_tests!(super::dots_are_invariant => Scalar, Avx2);
}

/// The heads' scores and weighted sums are bit for bit the one-head operations, for every head
/// count (tiles of four heads and their leftovers), row count and width (tails included).
fn heads_match_one_head(isa: Isa) {
    let mut rng = Rng(5);
    for &(d, stride) in &[(64usize, 192usize), (72, 80), (13, 16), (128, 128)] {
        for heads in 1..=9 {
            for n in [1usize, 2, 3, 5, 8, 16, 17] {
                let q: Vec<f32> = (0..heads * d).map(|_| rng.f32()).collect();
                let x: Vec<f32> = (0..n * stride).map(|_| rng.f32()).collect();
                let out_stride = n + 3;
                let mut got = vec![f32::NAN; heads * out_stride];
                super::ops::dots_heads_at(isa, &q, d, &x, stride, n, &mut got, out_stride);
                let a_stride = n + 1;
                let alpha: Vec<f32> = (0..heads * a_stride).map(|_| rng.f32()).collect();
                let y0: Vec<f32> = (0..heads * d).map(|_| rng.f32()).collect();
                let mut y = y0.clone();
                super::ops::axpy_rows_heads_at(isa, &alpha, a_stride, n, &x, stride, &mut y, d);
                for h in 0..heads {
                    let mut want = vec![0f32; n];
                    super::ops::dots_at(isa, &q[h * d..][..d], &x, stride, &mut want);
                    for r in 0..n {
                        assert_eq!(
                            got[h * out_stride + r].to_bits(),
                            want[r].to_bits(),
                            "{isa:?} d {d}: head {h} of {heads}, row {r} of {n}"
                        );
                    }
                    let mut yh = y0[h * d..][..d].to_vec();
                    super::ops::axpy_rows_at(isa, &alpha[h * a_stride..][..n], &x, stride, &mut yh);
                    let same = yh
                        .iter()
                        .zip(&y[h * d..][..d])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} d {d}: sums of head {h} of {heads}, {n} rows");
                }
            }
        }
    }
}

mod heads_match_one_head {
    level_tests!(super::heads_match_one_head => Scalar, Avx2);
}
