//! Scalar dequantisation (the reference semantics every fast path must match).

use super::kquant::IQ4_LEVELS;
use crate::DType;

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
pub(crate) fn bf16_at(b: &[u8], i: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[i], b[i + 1]])) << 16)
}

/// Dequantise one row (`out.len()` weights, block-aligned) stored as `dtype` in `bytes`.
///
/// # Panics
/// If `bytes` is shorter than `dtype.row_bytes(out.len())` (callers pass rows of a checked
/// [`crate::QMatrix`]).
pub fn dequantize_row(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(
        bytes.len() >= dtype.row_bytes(n) && n.is_multiple_of(dtype.block_elems()),
        "dequantize_row: {} bytes cannot hold {n} {dtype} weights",
        bytes.len()
    );
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(bytes, 2 * i);
            }
        }
        DType::BF16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = bf16_at(bytes, 2 * i);
            }
        }
        DType::Q8_0 => {
            for (blk, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for (w, &q) in o.iter_mut().zip(&blk[2..34]) {
                    *w = d * f32::from(q as i8);
                }
            }
        }
        DType::Q4_0 => {
            for (blk, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = blk[2 + j];
                    lo[j] = d * (f32::from(q & 0x0F) - 8.0);
                    hi[j] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        DType::Q4_1 => {
            for (blk, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = blk[4 + j];
                    lo[j] = d * f32::from(q & 0x0F) + m;
                    hi[j] = d * f32::from(q >> 4) + m;
                }
            }
        }
        DType::Q5_0 | DType::Q5_1 => {
            let has_min = dtype == DType::Q5_1;
            let head = if has_min { 4 } else { 2 };
            for (blk, o) in bytes
                .chunks_exact(dtype.block_bytes())
                .zip(out.chunks_exact_mut(32))
            {
                let d = f16_at(blk, 0);
                let qh =
                    u32::from_le_bytes([blk[head], blk[head + 1], blk[head + 2], blk[head + 3]]);
                let q = q5_quants(&blk[head + 4..head + 20], qh);
                if has_min {
                    let m = f16_at(blk, 2);
                    for (w, &q) in o.iter_mut().zip(&q) {
                        *w = d * f32::from(q) + m;
                    }
                } else {
                    for (w, &q) in o.iter_mut().zip(&q) {
                        *w = d * (f32::from(q) - 16.0);
                    }
                }
            }
        }
        DType::IQ4_NL => {
            for (blk, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = blk[2 + j];
                    lo[j] = d * f32::from(IQ4_LEVELS[usize::from(q & 0x0F)]);
                    hi[j] = d * f32::from(IQ4_LEVELS[usize::from(q >> 4)]);
                }
            }
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
            super::kquant::dequantize(dtype, bytes, out)
        }
    }
}

/// The 32 unsigned 5-bit quants of a Q5_0 / Q5_1 block: nibbles as Q4_0, bit `j` of `qh`
/// the fifth bit of weight `j`.
#[inline]
pub(crate) fn q5_quants(nibbles: &[u8], qh: u32) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        let b = nibbles[j];
        q[j] = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[16 + j] = (b >> 4) | ((((qh >> (16 + j)) & 1) as u8) << 4);
    }
    q
}
