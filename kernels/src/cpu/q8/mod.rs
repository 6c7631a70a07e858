//! Quantised activations and integer dot products (the fast decode path).
//!
//! An activation row is cut into blocks of 32 values; each block keeps an f32 scale
//! `d = max|x| / 127`, 32 `i8` quants `q = round(x / d)` and the block sum `s = d·Σq` (the
//! layout ggml calls Q8_1, with f32 instead of f16 scales). A weight block times an activation
//! block is then one integer dot product and two multiplies:
//!
//! - Q4_1 (`w = d_w·q_w + m_w`, `q_w` in 0..16): `d_w·d_x·Σ q_w·q_x + m_w·s_x`;
//! - Q4_0 (`w = d_w·(q_w − 8)`): the same with `m_w = −8·d_w`;
//! - Q8_0 (`w = d_w·q_w`, `q_w` signed): `d_w·d_x·Σ q_w·q_x`.
//!
//! The integer sums are exact on every SIMD level (the products fit: `15·127·2` and
//! `128·127·2` stay inside the `i16` pair sums of `maddubs`); only the order of the final f32
//! accumulation differs between levels.
//!
//! Rounding is half-to-even through the `1.5·2^23` trick, which is plain f32 arithmetic and so
//! gives the same quants in any implementation.

use super::features::{CpuLevel, Isa};
use crate::DType;

/// Values per activation block.
pub const Q8_BLOCK: usize = 32;

/// 32 quantised activations: `x[i] ≈ d·qs[i]`, and `s = d·Σ qs`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Q8Block {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; Q8_BLOCK],
}

/// Whether the integer kernels handle weights of `dtype`.
pub fn q8_supports(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Adding then subtracting this rounds an f32 of magnitude below 2^22 to the nearest integer,
/// ties to even (under the default rounding mode, which Rust assumes).
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantise `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
///
/// # Panics
/// If the lengths disagree (a bug in the caller).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    assert!(
        x.len() == out.len() * Q8_BLOCK,
        "quantize_row_q8: {} values into {} blocks",
        x.len(),
        out.len()
    );
    for (blk, c) in out.iter_mut().zip(x.chunks_exact(Q8_BLOCK)) {
        let mut amax = 0f32;
        for &v in c {
            let a = v.abs();
            // NaN never wins: the block then quantises as if it were absent.
            if a > amax {
                amax = a;
            }
        }
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(c) {
            let r = ((v * id + ROUND_MAGIC) - ROUND_MAGIC).clamp(-127.0, 127.0);
            // In range after the clamp (NaN casts to 0).
            let r = r as i32;
            *q = r as i8;
            sum += r;
        }
        blk.d = d;
        blk.s = d * sum as f32;
    }
}

/// Most weight rows one kernel call handles.
pub(crate) const MAX_W: usize = 2;
/// Most activation rows one kernel call handles.
pub(crate) const MAX_X: usize = 4;

/// Inputs of one kernel call: `w_rows` consecutive weight rows against `x_rows` consecutive
/// quantised activation rows.
pub(crate) struct Q8Args<'a> {
    pub dtype: DType,
    /// Weight bytes starting at the first row; row `i` at `i * w_stride`.
    pub w: &'a [u8],
    pub w_stride: usize,
    /// Activation blocks starting at the first row; row `j` is `x[j * nb..][..nb]`.
    pub x: &'a [Q8Block],
    /// Blocks per row (`k / 32`).
    pub nb: usize,
}

/// `out[i * x_rows + j] = w_i · x_j` for `i < w_rows` (any number of rows), `j < x_rows`,
/// taking `w_step` (1 or 2) weight rows per pass.
///
/// The kernel follows `isa`: AVX-512 VNNI (512-bit vectors for the 4-bit types), AVX-VNNI,
/// or AVX2 `maddubs` for the other levels above scalar.
///
/// # Panics
/// If the shape is not one the kernels are built for, or the slices are shorter than the
/// arguments claim (bugs in the caller).
pub(crate) fn dot_q8(
    isa: Isa,
    a: &Q8Args<'_>,
    w_rows: usize,
    w_step: usize,
    x_rows: usize,
    out: &mut [f32],
) {
    assert!(q8_supports(a.dtype), "dot_q8: {} weights", a.dtype);
    assert!(
        (1..=MAX_W).contains(&w_step) && (1..=MAX_X).contains(&x_rows),
        "dot_q8: {w_step} x {x_rows}"
    );
    let row_bytes = a.nb * a.dtype.block_bytes();
    assert!(
        a.w_stride >= row_bytes
            && (w_rows == 0 || a.w.len() >= (w_rows - 1) * a.w_stride + row_bytes),
        "dot_q8: weights too short"
    );
    assert!(a.x.len() >= x_rows * a.nb, "dot_q8: activations too short");
    assert!(out.len() >= w_rows * x_rows, "dot_q8: output too short");
    match isa.level() {
        CpuLevel::Scalar => scalar(a, w_rows, x_rows, out),
        // SAFETY: `isa` says this CPU runs the level whose features the chosen kernels
        // enable, and the bounds the kernels read within were asserted above.
        #[cfg(target_arch = "x86_64")]
        level => unsafe { x86::dispatch(level, a, w_rows, w_step, x_rows, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar(a, w_rows, x_rows, out),
    }
}

/// `Σ q_w·q_x` of weight block `blk` (its quants as stored: nibbles for Q4, `i8` for Q8_0)
/// and activation quants `xq`, with the weight's `(d, m)` (`m` already `−8d` for Q4_0, 0 for
/// Q8_0).
pub(crate) fn block_int_dot(dtype: DType, blk: &[u8], xq: &[i8; 32]) -> (i32, f32, f32) {
    let d = super::dequant::f16_at(blk, 0);
    match dtype {
        DType::Q4_0 | DType::Q4_1 => {
            let (m, qoff) = if dtype == DType::Q4_1 {
                (super::dequant::f16_at(blk, 2), 4)
            } else {
                (-8.0 * d, 2)
            };
            let mut s = 0i32;
            for (j, &b) in blk[qoff..qoff + 16].iter().enumerate() {
                s += i32::from(b & 0x0F) * i32::from(xq[j]);
                s += i32::from(b >> 4) * i32::from(xq[16 + j]);
            }
            (s, d, m)
        }
        _ => {
            let mut s = 0i32;
            for (&b, &x) in blk[2..34].iter().zip(xq) {
                s += i32::from(b as i8) * i32::from(x);
            }
            (s, d, 0.0)
        }
    }
}

fn scalar(a: &Q8Args<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    let bb = a.dtype.block_bytes();
    let has_min = matches!(a.dtype, DType::Q4_0 | DType::Q4_1);
    for i in 0..w_rows {
        let wrow = &a.w[i * a.w_stride..];
        for j in 0..x_rows {
            let xrow = &a.x[j * a.nb..(j + 1) * a.nb];
            let mut acc = 0f32;
            for (b, xb) in xrow.iter().enumerate() {
                let (s, d, m) = block_int_dot(a.dtype, &wrow[b * bb..(b + 1) * bb], &xb.qs);
                acc += d * xb.d * s as f32;
                if has_min {
                    acc += m * xb.s;
                }
            }
            out[i * x_rows + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
