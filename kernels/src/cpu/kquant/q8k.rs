//! Activations quantised per 256 values (ggml's Q8_K layout) and the integer dot products of
//! the super-block types against them.
//!
//! A weight super-block times an activation block is
//! `d_x·(d·Σ_g sc[g]·Σ_{i∈g} q_i·x_i − dmin·Σ_g m[g]·bsum[g])`: the group sums of the
//! activations (`bsums`) carry the minimums, so the inner loops are integer only.

use super::rows8::GROUP;
use super::{unpack, Unpacked, QK_K};
use crate::cpu::features::{CpuLevel, Isa};
use crate::cpu::q8::{block_scale, round_to_i8};
use crate::DType;

/// 256 quantised activations: `x[i] ≈ d·qs[i]`, and `bsums[g]` the sum of `qs[16g..16g + 16]`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct Q8KBlock {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; 16],
}

impl Default for Q8KBlock {
    fn default() -> Self {
        Q8KBlock {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; 16],
        }
    }
}

/// Quantise `x` (a multiple of 256 values) into `out` (`x.len() / 256` blocks), with the
/// same rounding as [`crate::quantize_row_q8`]: `d = max|x| / 127`, quants rounded half to
/// even.
///
/// # Panics
/// If the lengths disagree (a bug in the caller).
pub fn quantize_row_q8k(x: &[f32], out: &mut [Q8KBlock]) {
    assert!(
        x.len() == out.len() * QK_K,
        "quantize_row_q8k: {} values into {} blocks",
        x.len(),
        out.len()
    );
    for (blk, c) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (d, id) = block_scale(c);
        for (q, &v) in blk.qs.iter_mut().zip(c) {
            *q = round_to_i8(v * id);
        }
        for (s, g) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
            // At most 16 · 127 in magnitude.
            *s = g.iter().map(|&q| i16::from(q)).sum();
        }
        blk.d = d;
    }
}

/// Inputs of one kernel call: `w_rows` consecutive weight rows against `x_rows` consecutive
/// quantised activation rows.
pub(crate) struct Q8KArgs<'a> {
    pub dtype: DType,
    /// Weight bytes starting at the first row; row `i` at `i * w_stride`.
    pub w: &'a [u8],
    pub w_stride: usize,
    /// Activation blocks starting at the first row; row `j` is `x[j * nb..][..nb]`.
    pub x: &'a [Q8KBlock],
    /// Super-blocks per row (`k / 256`).
    pub nb: usize,
    /// The weights are in the interleaved layout (`super::rows8`): `w` starts at a group of
    /// eight rows, `w_stride` is the bytes of a row as stored, and the call takes whole
    /// groups.
    pub interleaved: bool,
}

/// Most activation rows one kernel call handles, on every level.
pub(crate) const MAX_XK: usize = 8;

/// Most activation rows one kernel call handles on any level.
pub(crate) const MAX_XK_WIDE: usize = 64;

/// Most activation rows one kernel call handles for `dtype` (`interleaved` or not) on
/// `isa`'s level: AVX-512 VNNI's kernels unpack each super-block once for up to 64.
pub(crate) fn max_xk(isa: Isa, dtype: DType, interleaved: bool) -> usize {
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx512Vnni if interleaved => MAX_XK_WIDE,
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx512Vnni if super::vnni::takes(dtype) => MAX_XK_WIDE,
        _ => MAX_XK,
    }
}

/// `out[i * x_rows + j] = w_i · x_j` for `i < w_rows`, `j < x_rows` (at most
/// [`max_xk`]).
///
/// AVX-512 VNNI takes its own kernel for three or more activation rows of Q2_K, Q3_K, Q4_K
/// and IQ4_XS; every other case above scalar runs the AVX2 kernels (there is no AVX-VNNI
/// version).
///
/// # Panics
/// If `a.dtype` is not a super-block type, or the slices are shorter than the arguments claim
/// (bugs in the caller).
pub(crate) fn dot_q8k(isa: Isa, a: &Q8KArgs<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    assert!(
        super::is_super_block(a.dtype),
        "dot_q8k: {} weights",
        a.dtype
    );
    assert!(
        (1..=max_xk(isa, a.dtype, a.interleaved)).contains(&x_rows),
        "dot_q8k: {x_rows} rows"
    );
    let row_bytes = a.nb * a.dtype.block_bytes();
    assert!(
        a.w_stride >= row_bytes
            && (w_rows == 0 || a.w.len() >= (w_rows - 1) * a.w_stride + row_bytes),
        "dot_q8k: weights too short"
    );
    assert!(a.x.len() >= x_rows * a.nb, "dot_q8k: activations too short");
    assert!(out.len() >= w_rows * x_rows, "dot_q8k: output too short");
    if a.interleaved {
        return interleaved(isa, a, w_rows, x_rows, out);
    }
    match isa.level() {
        CpuLevel::Scalar => scalar(a, w_rows, x_rows, out),
        // SAFETY: every level above Scalar has AVX2, FMA and F16C, and `isa` says this CPU
        // runs its level; the bounds the kernels read within were asserted above.
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx512Vnni if x_rows >= 3 && super::vnni::takes(a.dtype) => unsafe {
            super::vnni::rows(a, w_rows, x_rows, out)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        _ => unsafe { super::x86::dispatch(a, w_rows, x_rows, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar(a, w_rows, x_rows, out),
    }
}

/// [`dot_q8k`] on interleaved weights: AVX-512 VNNI's kernel, the AVX2 one on the other SIMD
/// levels, or (portable) each group brought back to rows for the row kernels.
fn interleaved(isa: Isa, a: &Q8KArgs<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    assert!(
        super::rows8::has_layout(a.dtype)
            && w_rows.is_multiple_of(GROUP)
            && a.w_stride == a.nb * a.dtype.block_bytes(),
        "dot_q8k: {w_rows} interleaved rows of {}",
        a.dtype
    );
    #[cfg(target_arch = "x86_64")]
    match isa.level() {
        // SAFETY: the level says the CPU has the kernel's features; the bounds were checked
        // by `dot_q8k` and above (whole groups of whole rows).
        CpuLevel::Avx512Vnni => return unsafe { super::rows8_vnni::rows(a, w_rows, x_rows, out) },
        CpuLevel::Scalar => {}
        // SAFETY: every level above Scalar has AVX2, FMA and F16C; bounds as above.
        _ => return unsafe { super::rows8_avx2::rows(a, w_rows, x_rows, out) },
    }
    super::rows8::by_groups(a.dtype, a.nb, a.w, w_rows, x_rows, out, |rows, o| {
        let args = Q8KArgs {
            w: rows,
            interleaved: false,
            ..*a
        };
        dot_q8k(isa, &args, GROUP, x_rows, o);
    });
}

/// One super-block (unpacked) times one activation block.
pub(crate) fn block_dot(u: &Unpacked, x: &Q8KBlock) -> f32 {
    let mut sumi = 0i32;
    let mut summ = 0i32;
    for g in 0..16 {
        let s: i32 = u.q[16 * g..16 * g + 16]
            .iter()
            .zip(&x.qs[16 * g..16 * g + 16])
            .map(|(&w, &v)| i32::from(w) * i32::from(v))
            .sum();
        sumi += i32::from(u.sc[g]) * s;
        summ += i32::from(u.m[g]) * i32::from(x.bsums[g]);
    }
    x.d * (u.d * sumi as f32 - u.dmin * summ as f32)
}

fn scalar(a: &Q8KArgs<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    let bb = a.dtype.block_bytes();
    let mut u = Unpacked::default();
    for i in 0..w_rows {
        let wrow = &a.w[i * a.w_stride..];
        let mut acc = [0f32; MAX_XK];
        for b in 0..a.nb {
            unpack(a.dtype, &wrow[b * bb..(b + 1) * bb], &mut u);
            for (j, acc_j) in acc.iter_mut().enumerate().take(x_rows) {
                *acc_j += block_dot(&u, &a.x[j * a.nb + b]);
            }
        }
        out[i * x_rows..(i + 1) * x_rows].copy_from_slice(&acc[..x_rows]);
    }
}
