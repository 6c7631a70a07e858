//! Quantised activations and integer dot products (the fast decode path).
//!
//! An activation row is cut into blocks of 32 values; each block keeps an f32 scale
//! `d = max|x| / 127`, 32 `i8` quants `q = round(x / d)` and the block sum `s = d·Σq` (the
//! layout ggml calls Q8_1, with f32 instead of f16 scales). A weight block times an activation
//! block is then one integer dot product and two multiplies:
//!
//! - Q4_1 (`w = d_w·q_w + m_w`, `q_w` in 0..16): `d_w·d_x·Σ q_w·q_x + m_w·s_x`;
//! - Q4_0 (`w = d_w·(q_w − 8)`): the same with `m_w = −8·d_w` (the portable path), or
//!   `d_w·d_x·Σ (q_w − 8)·q_x` with the offset taken off in the bytes (the SIMD paths);
//! - Q5_1 and Q5_0 as Q4_1 and Q4_0, with `q_w` in 0..32 and an offset of 16 for Q5_0;
//! - Q8_0 (`w = d_w·q_w`, `q_w` signed): `d_w·d_x·Σ q_w·q_x`;
//! - IQ4_NL as Q8_0, `q_w` its table's level.
//!
//! The integer sums are exact on every SIMD level (the products fit: `31·127·2` and
//! `128·127·2` stay inside the `i16` pair sums of `maddubs`); only the order of the final f32
//! accumulation differs between levels. The AVX2 kernels put eight weight rows in the eight
//! lanes of a vector: each block's whole integer sum, then one multiply-add per block into the
//! row's lane, so decode and prefill run the same operations per output; AVX-512 VNNI reads
//! matrices interleaved at load (`rows8_vnni`) with the same operations. The 256-weight types
//! pair with 256-value activation blocks instead (`super::kquant`).
//!
//! Rounding is half-to-even through the `1.5·2^23` trick, which is plain f32 arithmetic and so
//! gives the same quants in any implementation.

use super::features::{CpuLevel, Isa};
use super::kquant::IQ4_LEVELS;
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

/// Whether the integer kernels handle weights of `dtype` (every quantised type: the 32-weight
/// blocks against [`Q8Block`]s, the 256-weight super-blocks against
/// [`crate::Q8KBlock`]s).
pub fn q8_supports(dtype: DType) -> bool {
    q8_blocks(dtype) || super::kquant::is_super_block(dtype)
}

/// Whether `dtype` is a 32-weight block type the [`Q8Block`] kernels take.
pub(crate) fn q8_blocks(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::IQ4_NL
    )
}

/// Adding then subtracting this rounds an f32 of magnitude below 2^22 to the nearest integer,
/// ties to even (under the default rounding mode, which Rust assumes).
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `v` rounded half to even and clamped to ±127 (NaN gives 0).
#[inline]
pub(crate) fn round_to_i8(v: f32) -> i8 {
    // In range after the clamp; NaN stays NaN through the clamp and casts to 0.
    ((v + ROUND_MAGIC) - ROUND_MAGIC).clamp(-127.0, 127.0) as i8
}

/// The step `d = max|x| / 127` of a block of activations, and its inverse (0 for an all-zero
/// block).
pub(crate) fn block_scale(c: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    for &v in c {
        let a = v.abs();
        // NaN never wins: the block then quantises as if it were absent.
        if a > amax {
            amax = a;
        }
    }
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

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
        let (d, id) = block_scale(c);
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(c) {
            *q = round_to_i8(v * id);
            sum += i32::from(*q);
        }
        blk.d = d;
        blk.s = d * sum as f32;
    }
}

/// Most activation rows one kernel call handles.
pub(crate) const MAX_X: usize = 8;

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
    /// The weights are in the interleaved layout (`crate::cpu::kquant::rows8`): `w` starts at
    /// a group of eight rows, `w_stride` is the bytes of a row as stored, and the call takes
    /// whole groups.
    pub interleaved: bool,
    /// The activation quants offset to unsigned (`x + 128`), block for block as in `x`:
    /// what the interleaved kernels multiply signed weights by (AVX-512 VNNI's, every signed
    /// type; AVX2's, Q4_0 and Q5_0), read as broadcast memory operands (built in registers,
    /// each broadcast took two shuffles, which bounded the kernel). Required where
    /// [`wants_unsigned`] says so, else ignored.
    pub xu: &'a [[u8; Q8_BLOCK]],
}

/// Whether [`dot_q8`] on `isa` reads [`Q8Args::xu`] for `dtype` weights in the layout
/// `interleaved` says.
pub(crate) fn wants_unsigned(isa: Isa, dtype: DType, interleaved: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    match isa.level() {
        CpuLevel::Avx512Vnni => {
            return interleaved
                && matches!(
                    dtype,
                    DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL
                )
        }
        CpuLevel::Scalar => {}
        _ => {
            return interleaved
                && q8_blocks(dtype)
                && type_code::offset_unsigned(type_code::code(dtype))
        }
    }
    let _ = (isa, dtype, interleaved);
    false
}

/// [`Q8Args::xu`] for the blocks `x`.
pub(crate) fn unsigned_quants(x: &[Q8Block]) -> Vec<[u8; Q8_BLOCK]> {
    x.iter()
        .map(|b| {
            let mut u = [0u8; Q8_BLOCK];
            for (o, &v) in u.iter_mut().zip(&b.qs) {
                *o = v as u8 ^ 0x80;
            }
            u
        })
        .collect()
}

/// `out[i * x_rows + j] = w_i · x_j` for `i < w_rows` (any number of rows), `j < x_rows`.
///
/// Above scalar, every level runs the eight-row lane kernels. AVX-512 VNNI and AVX-VNNI take
/// `vpdpbusd` for the byte products of Q8_0 and IQ4_NL (whose pair sums would not fit
/// `maddubs`'s `i16`), and for three or more activation rows the broadcast form of every
/// type; all of them give the same bits for a row.
///
/// # Panics
/// If the shape is not one the kernels are built for, or the slices are shorter than the
/// arguments claim (bugs in the caller).
pub(crate) fn dot_q8(isa: Isa, a: &Q8Args<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    assert!(q8_blocks(a.dtype), "dot_q8: {} weights", a.dtype);
    assert!(
        (1..=MAX_X).contains(&x_rows),
        "dot_q8: {x_rows} activation rows"
    );
    let row_bytes = a.nb * a.dtype.block_bytes();
    assert!(
        a.w_stride >= row_bytes
            && (w_rows == 0 || a.w.len() >= (w_rows - 1) * a.w_stride + row_bytes),
        "dot_q8: weights too short"
    );
    assert!(a.x.len() >= x_rows * a.nb, "dot_q8: activations too short");
    assert!(out.len() >= w_rows * x_rows, "dot_q8: output too short");
    if a.interleaved {
        return interleaved(isa, a, w_rows, x_rows, out);
    }
    match isa.level() {
        CpuLevel::Scalar => scalar(a, w_rows, x_rows, out),
        // SAFETY: `isa` says this CPU runs the level whose features the chosen kernels
        // enable, and the bounds the kernels read within were asserted above.
        #[cfg(target_arch = "x86_64")]
        level => unsafe { x86::dispatch(level, a, w_rows, x_rows, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar(a, w_rows, x_rows, out),
    }
}

/// [`dot_q8`] on interleaved weights: AVX-512 VNNI's kernel, the AVX2 one on the other SIMD
/// levels, or (scalar) each group brought back to rows for the row kernels.
fn interleaved(isa: Isa, a: &Q8Args<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    const GROUP: usize = 8;
    assert!(
        crate::cpu::has_interleaved_layout(a.dtype)
            && w_rows.is_multiple_of(GROUP)
            && a.w_stride == a.nb * a.dtype.block_bytes(),
        "dot_q8: {w_rows} interleaved rows of {}",
        a.dtype
    );
    // SAFETY (both kernels): the level says the CPU has the kernel's features; the bounds
    // were checked by `dot_q8` and above (whole groups of whole rows).
    #[cfg(target_arch = "x86_64")]
    match isa.level() {
        CpuLevel::Avx512Vnni => return unsafe { rows8_vnni::rows(a, w_rows, x_rows, out) },
        CpuLevel::Scalar => {}
        _ => return unsafe { rows8_avx2::rows(a, w_rows, x_rows, out) },
    }
    crate::cpu::kquant::by_groups(a.dtype, a.nb, a.w, w_rows, x_rows, out, |rows, o| {
        let args = Q8Args {
            w: rows,
            interleaved: false,
            ..*a
        };
        dot_q8(isa, &args, GROUP, x_rows, o);
    });
}

/// The 32 quants of weight block `blk` as the integer kernels multiply them (unsigned 0..32
/// for the 4- and 5-bit types, signed for Q8_0 and IQ4_NL's levels), with the weight's
/// `(d, m)` (`m` is `−8d` for Q4_0, `−16d` for Q5_0, 0 for the signed types).
pub(crate) fn block_quants(dtype: DType, blk: &[u8]) -> ([i8; 32], f32, f32) {
    use super::dequant::{f16_at, q5_quants};
    let d = f16_at(blk, 0);
    let mut q = [0i8; 32];
    let m = match dtype {
        DType::Q4_0 | DType::Q4_1 => {
            let (m, qoff) = if dtype == DType::Q4_1 {
                (f16_at(blk, 2), 4)
            } else {
                (-8.0 * d, 2)
            };
            for (j, &b) in blk[qoff..qoff + 16].iter().enumerate() {
                q[j] = (b & 0x0F) as i8;
                q[16 + j] = (b >> 4) as i8;
            }
            m
        }
        DType::Q5_0 | DType::Q5_1 => {
            let (m, head) = if dtype == DType::Q5_1 {
                (f16_at(blk, 2), 4)
            } else {
                (-16.0 * d, 2)
            };
            let qh = u32::from_le_bytes([blk[head], blk[head + 1], blk[head + 2], blk[head + 3]]);
            for (o, v) in q.iter_mut().zip(q5_quants(&blk[head + 4..head + 20], qh)) {
                *o = v as i8;
            }
            m
        }
        DType::IQ4_NL => {
            for (j, &b) in blk[2..18].iter().enumerate() {
                q[j] = IQ4_LEVELS[usize::from(b & 0x0F)];
                q[16 + j] = IQ4_LEVELS[usize::from(b >> 4)];
            }
            0.0
        }
        _ => {
            for (o, &b) in q.iter_mut().zip(&blk[2..34]) {
                *o = b as i8;
            }
            0.0
        }
    };
    (q, d, m)
}

/// `Σ q_w·q_x` of weight block `blk` and activation quants `xq`, with the weight's `(d, m)`
/// as [`block_quants`] gives them.
pub(crate) fn block_int_dot(dtype: DType, blk: &[u8], xq: &[i8; 32]) -> (i32, f32, f32) {
    let (q, d, m) = block_quants(dtype, blk);
    let s = q
        .iter()
        .zip(xq)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum();
    (s, d, m)
}

/// Whether `dtype`'s integer kernel adds a minimum term `m·s_x`.
pub(crate) fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1)
}

fn scalar(a: &Q8Args<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    let bb = a.dtype.block_bytes();
    let has_min = has_min(a.dtype);
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
pub(crate) mod gemm_vnni;
#[cfg(target_arch = "x86_64")]
mod rows8_avx2;
#[cfg(target_arch = "x86_64")]
mod rows8_vnni;

/// The 32-weight types as the SIMD kernels number them (a const parameter `T`): 0 Q4_0,
/// 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL.
#[cfg(target_arch = "x86_64")]
mod type_code {
    /// Q4_1 and Q5_1 have a minimum term.
    pub(super) const fn has_min(t: u8) -> bool {
        t == 1 || t == 3
    }
    /// Q5_0 and Q5_1 have fifth bits.
    pub(super) const fn five(t: u8) -> bool {
        t == 2 || t == 3
    }
    /// The types whose quants are small enough (±16) for the AVX2 kernel to multiply them by
    /// the activations offset to unsigned (`super::Q8Args::xu`): Q4_0 and Q5_0.
    pub(super) const fn offset_unsigned(t: u8) -> bool {
        t == 0 || t == 2
    }
    /// The code of a 32-weight type.
    pub(super) fn code(dtype: crate::DType) -> u8 {
        use crate::DType;
        match dtype {
            DType::Q4_0 => 0,
            DType::Q4_1 => 1,
            DType::Q5_0 => 2,
            DType::Q5_1 => 3,
            DType::Q8_0 => 4,
            DType::IQ4_NL => 5,
            other => unreachable!("not a 32-weight type: {other}"),
        }
    }
    pub(super) const fn block_bytes(t: u8) -> usize {
        match t {
            0 | 5 => 18,
            1 => 20,
            2 => 22,
            3 => 24,
            _ => 34,
        }
    }
}
#[cfg(target_arch = "x86_64")]
mod x86;
