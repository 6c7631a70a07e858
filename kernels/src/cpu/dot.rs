//! Fused dequantise-and-dot kernels: one weight row against up to [`MAX_R`] activation rows.
//!
//! For the 4-bit types the per-block offset term is applied through precomputed block sums of
//! the activations: `Σ (d·q + m)·x = d·Σ q·x + m·Σ x` (Q4_0 has `m = −8d`).

use super::dequant::{bf16_at, f16_at};
use super::features::{CpuLevel, Isa};
use crate::DType;

/// Most activation rows one kernel call handles.
pub(crate) const MAX_R: usize = 8;

/// Block sums of an activation row (`x.len()` a multiple of 32), as the 4-bit kernels need.
pub(crate) fn block_sums(x: &[f32], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(x.chunks_exact(32)) {
        *o = c.iter().sum();
    }
}

/// Whether `dtype`'s kernel reads activation block sums.
pub(crate) fn needs_block_sums(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1)
}

/// Inputs of one call: a weight row and `rows` activation rows.
pub(crate) struct DotArgs<'a> {
    pub dtype: DType,
    /// Bytes of the weight row (`dtype.row_bytes(k)`).
    pub w: &'a [u8],
    pub k: usize,
    /// Activation rows: row `r` is `x[r * x_stride..][..k]`.
    pub x: &'a [f32],
    pub x_stride: usize,
    /// Block sums: row `r` is `xsum[r * xsum_stride..][..k / 32]` (4-bit types only).
    pub xsum: &'a [f32],
    pub xsum_stride: usize,
}

/// `out[r] = w · x_r` for `r < out.len()` (at most [`MAX_R`]).
///
/// # Panics
/// If the slices are shorter than the arguments claim (a bug in the caller).
pub(crate) fn dot_rows(isa: Isa, a: &DotArgs<'_>, out: &mut [f32]) {
    let rows = out.len();
    assert!((1..=MAX_R).contains(&rows), "dot_rows: {rows} rows");
    assert!(
        a.w.len() >= a.dtype.row_bytes(a.k),
        "dot_rows: weight row too short"
    );
    assert!(
        a.x.len() >= (rows - 1) * a.x_stride + a.k,
        "dot_rows: activations too short"
    );
    if needs_block_sums(a.dtype) {
        assert!(
            a.xsum.len() >= (rows - 1) * a.xsum_stride + a.k / 32,
            "dot_rows: block sums too short"
        );
    }
    match isa.level() {
        CpuLevel::Scalar => scalar_dot(a, out),
        #[cfg(target_arch = "x86_64")]
        _ => {
            // SAFETY: every level above Scalar has avx2, fma and f16c, and `isa` says this CPU
            // runs its level; the bounds were checked above.
            unsafe {
                match rows {
                    1 => x86::dot::<1>(a, out),
                    2 => x86::dot::<2>(a, out),
                    3 => x86::dot::<3>(a, out),
                    4 => x86::dot::<4>(a, out),
                    5 => x86::dot::<5>(a, out),
                    6 => x86::dot::<6>(a, out),
                    7 => x86::dot::<7>(a, out),
                    _ => x86::dot::<8>(a, out),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar_dot(a, out),
    }
}

fn scalar_dot(a: &DotArgs<'_>, out: &mut [f32]) {
    let rows = out.len();
    let mut acc = [0f32; MAX_R];
    let mut buf = [0f32; 256];
    let be = a.dtype.block_elems();
    let bb = a.dtype.block_bytes();
    // Work in groups of 32 weights, or whole blocks where they are larger.
    let group = be.max(32);
    let buf = &mut buf[..group];
    let full = a.k / group * group;
    let per_group_bytes = group / be * bb;
    for g in 0..full / group {
        let wb = &a.w[g * per_group_bytes..(g + 1) * per_group_bytes];
        super::dequant::dequantize_row(a.dtype, wb, buf);
        for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
            let xr = &a.x[r * a.x_stride + g * group..][..group];
            let mut s = 0f32;
            for (w, x) in buf.iter().zip(xr) {
                s += w * x;
            }
            *acc_r += s;
        }
    }
    // Tail (only for the unblocked float types).
    for i in full..a.k {
        let w = match a.dtype {
            DType::F32 => {
                f32::from_le_bytes([a.w[4 * i], a.w[4 * i + 1], a.w[4 * i + 2], a.w[4 * i + 3]])
            }
            DType::F16 => f16_at(a.w, 2 * i),
            DType::BF16 => bf16_at(a.w, 2 * i),
            // Quantised rows are block-aligned: no tail.
            _ => 0.0,
        };
        for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
            *acc_r += w * a.x[r * a.x_stride + i];
        }
    }
    out.copy_from_slice(&acc[..rows]);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::dequant::{bf16_at, f16_at};
    use super::super::x86::hsum;
    use super::DotArgs;
    use crate::DType;
    use std::arch::x86_64::*;

    /// `Σ_i w_i·x_r[i]` for a group of 32 weights (`$w`: four vectors) and each of the `R`
    /// activation rows at `$x` (row stride `$xs`), as `[__m256; R]`. A macro so that it is
    /// always inlined into the target-feature kernel.
    macro_rules! partial {
        ($R:ident, $w:expr, $x:expr, $xs:expr) => {{
            let w: [__m256; 4] = $w;
            let x: *const f32 = $x;
            let mut p = [_mm256_setzero_ps(); $R];
            for (r, pr) in p.iter_mut().enumerate() {
                let xr = x.add(r * $xs);
                let mut s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
                s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr.add(8)), s);
                s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr.add(16)), s);
                s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr.add(24)), s);
                *pr = s;
            }
            p
        }};
    }

    /// The 32 nibbles of a 4-bit block at `$qs` as floats, in weight order.
    macro_rules! nibbles {
        ($qs:expr) => {{
            let q = _mm_loadu_si128($qs as *const __m128i);
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
            [
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(lo))),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(hi))),
            ]
        }};
    }

    /// Two consecutive f16 values at `$p` as floats (lanes 0 and 1).
    macro_rules! two_f16 {
        ($p:expr) => {
            _mm_cvtph_ps(_mm_cvtsi32_si128(($p as *const i32).read_unaligned()))
        };
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available and the slices in `a` must satisfy the bounds
    /// `dot_rows` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot<const R: usize>(a: &DotArgs<'_>, out: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut offs = [0f32; R];
        let w = a.w.as_ptr();
        let x = a.x.as_ptr();
        let nb = a.k / 32;
        // SAFETY (whole body): every pointer offset stays within the lengths `dot_rows`
        // asserted: block `b` reads weight bytes `b * block_bytes..(b + 1) * block_bytes` and
        // floats `b * 32..b * 32 + 32` of each activation row.
        unsafe {
            match a.dtype {
                DType::Q4_0 | DType::Q4_1 => {
                    let has_min = a.dtype == DType::Q4_1;
                    let bb = a.dtype.block_bytes();
                    let qoff = if has_min { 4 } else { 2 };
                    macro_rules! q4_block {
                        ($b:expr, $acc:ident) => {{
                            let b = $b;
                            let blk = w.add(b * bb);
                            let dm = two_f16!(blk);
                            let d = _mm256_broadcastss_ps(dm);
                            let m = if has_min {
                                _mm_cvtss_f32(_mm_movehdup_ps(dm))
                            } else {
                                -8.0 * _mm_cvtss_f32(dm)
                            };
                            let q = nibbles!(blk.add(qoff));
                            let p = partial!(R, q, x.add(b * 32), a.x_stride);
                            for r in 0..R {
                                $acc[r] = _mm256_fmadd_ps(d, p[r], $acc[r]);
                                offs[r] += m * *a.xsum.get_unchecked(r * a.xsum_stride + b);
                            }
                        }};
                    }
                    // One chain per row whatever `R` is: a row's sum must not depend on how
                    // many rows share the call (batch invariance).
                    for b in 0..nb {
                        q4_block!(b, acc);
                    }
                }
                DType::Q8_0 => {
                    for b in 0..nb {
                        let blk = w.add(b * 34);
                        let d = _mm256_broadcastss_ps(two_f16!(blk));
                        let qs = blk.add(2);
                        let q = [
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                qs as *const __m128i,
                            ))),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                qs.add(8) as *const __m128i
                            ))),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                qs.add(16) as *const __m128i
                            ))),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                qs.add(24) as *const __m128i
                            ))),
                        ];
                        let p = partial!(R, q, x.add(b * 32), a.x_stride);
                        for r in 0..R {
                            acc[r] = _mm256_fmadd_ps(d, p[r], acc[r]);
                        }
                    }
                }
                DType::Q5_0
                | DType::Q5_1
                | DType::IQ4_NL
                | DType::Q2_K
                | DType::Q3_K
                | DType::Q4_K
                | DType::Q5_K
                | DType::Q6_K
                | DType::IQ4_XS => {
                    // Dequantise a block at a time into the stack, then the float kernel.
                    let be = a.dtype.block_elems();
                    let bb = a.dtype.block_bytes();
                    let mut buf = [0f32; 256];
                    for blk in 0..a.k / be {
                        let wb = &a.w[blk * bb..(blk + 1) * bb];
                        super::super::dequant::dequantize_row(a.dtype, wb, &mut buf[..be]);
                        for g in 0..be / 32 {
                            let bp = buf.as_ptr().add(32 * g);
                            let q = [
                                _mm256_loadu_ps(bp),
                                _mm256_loadu_ps(bp.add(8)),
                                _mm256_loadu_ps(bp.add(16)),
                                _mm256_loadu_ps(bp.add(24)),
                            ];
                            let p = partial!(R, q, x.add(blk * be + 32 * g), a.x_stride);
                            for r in 0..R {
                                acc[r] = _mm256_add_ps(acc[r], p[r]);
                            }
                        }
                    }
                }
                DType::F16 | DType::BF16 | DType::F32 => {
                    for g in 0..nb {
                        let e = g * 32;
                        let mut q = [_mm256_setzero_ps(); 4];
                        for (j, qj) in q.iter_mut().enumerate() {
                            let i = e + 8 * j;
                            *qj = match a.dtype {
                                DType::F16 => {
                                    _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i))
                                }
                                DType::BF16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                        w.add(2 * i) as *const __m128i
                                    )),
                                )),
                                _ => _mm256_loadu_ps(w.add(4 * i) as *const f32),
                            };
                        }
                        let p = partial!(R, q, x.add(e), a.x_stride);
                        for r in 0..R {
                            acc[r] = _mm256_add_ps(acc[r], p[r]);
                        }
                    }
                    for i in nb * 32..a.k {
                        let wi = match a.dtype {
                            DType::F16 => f16_at(a.w, 2 * i),
                            DType::BF16 => bf16_at(a.w, 2 * i),
                            _ => (w.add(4 * i) as *const f32).read_unaligned(),
                        };
                        for (r, o) in offs.iter_mut().enumerate() {
                            *o += wi * *x.add(r * a.x_stride + i);
                        }
                    }
                }
            }
        }
        for r in 0..R {
            out[r] = hsum(acc[r]) + offs[r];
        }
    }
}
