//! Every quantised type against fixtures made by an independent implementation: the `gguf`
//! Python package's dequantisers (`scripts/make_quant_fixtures.py` writes
//! `kernels/tests/data/quants/`: 4 rows of 512 weights per type, as GGUF block bytes and as the
//! floats the package dequantises them to).
//!
//! - Dequantisation equals the reference bit for bit.
//! - The f32 kernels (dequantise-and-dot) are within `1e-5·Σ|w·x|` of the f64 dot of the
//!   reference floats and the activations.
//! - The integer kernels are within `1e-5·Σ|w·x̂|` of the f64 dot of the reference floats and
//!   the quantised activations `x̂` they were given, and so within the quantisation bound
//!   `Σ|w_i|·d_x(i)/2` (plus that rounding) of the dot with the exact activations.
//!
//! The kernel checks run at every level this CPU has.

use super::super::dot::{block_sums, dot_rows, DotArgs};
use super::super::kquant::{dot_q8k, is_super_block, Q8KArgs};
use super::super::q8::{dot_q8, Q8Args};
use super::Rng;
use crate::cpu::features::Isa;
use crate::{
    matmul, matmul_multi_q8, matmul_q8, quantize_row_q8, quantize_row_q8k, DType, MatmulJob,
    Q8Block, Q8KBlock, QMatrix,
};

const ROWS: usize = 4;
const COLS: usize = 512;

struct Fixture {
    dtype: DType,
    blocks: &'static [u8],
    /// `ROWS × COLS` reference floats.
    floats: Vec<f32>,
}

impl Fixture {
    fn matrix(&self) -> QMatrix<'static> {
        QMatrix::new(self.dtype, ROWS, COLS, self.blocks).unwrap()
    }
    fn row(&self, r: usize) -> &[f32] {
        &self.floats[r * COLS..(r + 1) * COLS]
    }
}

macro_rules! fixture {
    ($dtype:ident) => {
        (
            DType::$dtype,
            &include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/quants/",
                stringify!($dtype),
                ".bin"
            ))[..],
            &include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/quants/",
                stringify!($dtype),
                ".f32"
            ))[..],
        )
    };
}

fn fixtures() -> Vec<Fixture> {
    let raw: [(DType, &'static [u8], &'static [u8]); 12] = [
        fixture!(Q4_0),
        fixture!(Q4_1),
        fixture!(Q5_0),
        fixture!(Q5_1),
        fixture!(Q8_0),
        fixture!(IQ4_NL),
        fixture!(Q2_K),
        fixture!(Q3_K),
        fixture!(Q4_K),
        fixture!(Q5_K),
        fixture!(Q6_K),
        fixture!(IQ4_XS),
    ];
    raw.into_iter()
        .map(|(dtype, blocks, f)| {
            assert_eq!(blocks.len(), ROWS * dtype.row_bytes(COLS), "{dtype} blocks");
            assert_eq!(f.len(), ROWS * COLS * 4, "{dtype} floats");
            let floats = f
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Fixture {
                dtype,
                blocks,
                floats,
            }
        })
        .collect()
}

#[test]
fn every_quantised_type_has_a_fixture() {
    let covered: Vec<DType> = fixtures().iter().map(|f| f.dtype).collect();
    for dtype in DType::ALL {
        let float = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
        assert_eq!(covered.contains(&dtype), !float, "{dtype}");
    }
}

#[test]
fn dequantisation_equals_the_reference_bitwise() {
    for f in fixtures() {
        let w = f.matrix();
        let mut out = vec![0f32; COLS];
        for r in 0..ROWS {
            w.dequantize_row_into(r, &mut out);
            for (i, (&got, &want)) in out.iter().zip(f.row(r)).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} row {r} weight {i}: {got} vs reference {want}",
                    f.dtype
                );
            }
        }
    }
}

fn activations(rng: &mut Rng, rows: usize) -> Vec<f32> {
    (0..rows * COLS).map(|_| rng.f32()).collect()
}

/// `(Σ w·x, Σ |w·x|)` in f64.
fn dot64(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| {
        let p = f64::from(w) * f64::from(x);
        (s + p, a + p.abs())
    })
}

/// The f32 dequantise-and-dot kernel of `isa` against the reference, 1 to 4 activation rows.
fn f32_kernels_match(isa: Isa) {
    let mut rng = Rng(0x5EED_0F32);
    for f in fixtures() {
        let w = f.matrix();
        for rows in 1..=4 {
            let x = activations(&mut rng, rows);
            let mut xsum = vec![0f32; rows * COLS / 32];
            for r in 0..rows {
                let nb = COLS / 32;
                block_sums(
                    &x[r * COLS..(r + 1) * COLS],
                    &mut xsum[r * nb..(r + 1) * nb],
                );
            }
            for wr in 0..ROWS {
                let args = DotArgs {
                    dtype: f.dtype,
                    w: w.row(wr),
                    k: COLS,
                    x: &x,
                    x_stride: COLS,
                    xsum: &xsum,
                    xsum_stride: COLS / 32,
                };
                let mut out = [0f32; 4];
                dot_rows(isa, &args, &mut out[..rows]);
                for (r, &got) in out[..rows].iter().enumerate() {
                    let (want, mag) = dot64(f.row(wr), &x[r * COLS..(r + 1) * COLS]);
                    let err = (f64::from(got) - want).abs();
                    assert!(
                        err <= 1e-5 * mag,
                        "{} {isa:?} weight row {wr} x row {r}: {got} vs {want} (sum |w x| {mag})",
                        f.dtype
                    );
                }
            }
        }
    }
}

mod f32_kernels_match {
    level_tests!(super::f32_kernels_match => Scalar, Avx2, AvxVnni, Avx512, Avx512Vnni);
}

/// One activation row quantised for `dtype`'s kernel: the values the kernel sees (`d·q`) and
/// each value's step `d`.
fn quantised(dtype: DType, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut seen = Vec::with_capacity(x.len());
    let mut step = Vec::with_capacity(x.len());
    if is_super_block(dtype) {
        let mut q = vec![Q8KBlock::default(); x.len() / 256];
        quantize_row_q8k(x, &mut q);
        for b in &q {
            seen.extend(b.qs.iter().map(|&v| b.d * f32::from(v)));
            step.extend(std::iter::repeat_n(b.d, 256));
        }
    } else {
        let mut q = vec![Q8Block::default(); x.len() / 32];
        quantize_row_q8(x, &mut q);
        for b in &q {
            seen.extend(b.qs.iter().map(|&v| b.d * f32::from(v)));
            step.extend(std::iter::repeat_n(b.d, 32));
        }
    }
    (seen, step)
}

/// The integer kernels of `isa` against the reference: every weight row against 1 to 4
/// activation rows, in one call.
fn integer_kernels_match(isa: Isa) {
    let mut rng = Rng(0x5EED_0018);
    for f in fixtures() {
        for rows in 1..=4 {
            let x = activations(&mut rng, rows);
            let mut out = vec![f32::NAN; ROWS * rows];
            if is_super_block(f.dtype) {
                let nb = COLS / 256;
                let mut q = vec![Q8KBlock::default(); rows * nb];
                for (xr, qr) in x.chunks_exact(COLS).zip(q.chunks_exact_mut(nb)) {
                    quantize_row_q8k(xr, qr);
                }
                let args = Q8KArgs {
                    dtype: f.dtype,
                    w: f.blocks,
                    w_stride: f.dtype.row_bytes(COLS),
                    x: &q,
                    nb,
                    interleaved: false,
                };
                dot_q8k(isa, &args, ROWS, rows, &mut out);
            } else {
                let nb = COLS / 32;
                let mut q = vec![Q8Block::default(); rows * nb];
                for (xr, qr) in x.chunks_exact(COLS).zip(q.chunks_exact_mut(nb)) {
                    quantize_row_q8(xr, qr);
                }
                let args = Q8Args {
                    dtype: f.dtype,
                    w: f.blocks,
                    w_stride: f.dtype.row_bytes(COLS),
                    x: &q,
                    nb,
                    interleaved: false,
                    xu: &[],
                };
                dot_q8(isa, &args, ROWS, rows, &mut out);
            }
            for wr in 0..ROWS {
                for r in 0..rows {
                    let xr = &x[r * COLS..(r + 1) * COLS];
                    let (seen, step) = quantised(f.dtype, xr);
                    let got = f64::from(out[wr * rows + r]);
                    let what = format!("{} {isa:?} weight row {wr} x row {r}", f.dtype);
                    // Against the activations the kernel was given: f32 rounding only.
                    let (want_q, mag_q) = dot64(f.row(wr), &seen);
                    assert!(
                        (got - want_q).abs() <= 1e-5 * mag_q,
                        "{what}: {got} vs {want_q} on the quantised activations"
                    );
                    // Against the exact activations: within the quantisation bound.
                    let (want, _) = dot64(f.row(wr), xr);
                    let bound: f64 = f
                        .row(wr)
                        .iter()
                        .zip(&step)
                        .map(|(&w, &d)| f64::from(w).abs() * f64::from(d) * 0.5)
                        .sum();
                    assert!(
                        (got - want).abs() <= bound + 1e-5 * mag_q,
                        "{what}: {got} vs {want}, error over the bound {bound}"
                    );
                }
            }
        }
    }
}

mod integer_kernels_match {
    level_tests!(super::integer_kernels_match => Scalar, Avx2, AvxVnni, Avx512, Avx512Vnni);
}

/// The public drivers on the fixtures: the tiled GEMM path (many rows), and the q8 path with
/// both activation block kinds in one call, each job equal to its own call.
#[test]
fn drivers_take_every_type() {
    let fx = fixtures();
    let mut rng = Rng(77);
    let m = 20;
    let x = activations(&mut rng, m);
    for f in &fx {
        let w = f.matrix();
        let mut out = vec![f32::NAN; m * ROWS];
        matmul(&x, m, &w, &mut out, false).unwrap();
        for i in 0..m {
            for r in 0..ROWS {
                let (want, mag) = dot64(f.row(r), &x[i * COLS..(i + 1) * COLS]);
                let got = f64::from(out[i * ROWS + r]);
                assert!(
                    (got - want).abs() <= 1e-5 * mag,
                    "{} tiled m={m}: {got} vs {want}",
                    f.dtype
                );
            }
        }
    }
    let m = 3;
    let x = &x[..m * COLS];
    let mats: Vec<QMatrix<'_>> = fx.iter().map(Fixture::matrix).collect();
    let mut outs = vec![vec![0f32; m * ROWS]; mats.len()];
    let mut jobs: Vec<MatmulJob<'_, '_>> = mats
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, out)| MatmulJob { w: *w, out })
        .collect();
    matmul_multi_q8(x, m, &mut jobs, false).unwrap();
    drop(jobs);
    for ((w, got), f) in mats.iter().zip(&outs).zip(&fx) {
        let mut alone = vec![0f32; m * ROWS];
        matmul_q8(x, m, w, &mut alone, false).unwrap();
        assert_eq!(got, &alone, "{} in a mixed batch vs alone", f.dtype);
    }
}
