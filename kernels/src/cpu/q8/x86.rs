//! The x86_64 integer kernels of [`super::dot_q8`], one module per instruction choice.

use super::Q8Args;
use crate::cpu::features::CpuLevel;
use crate::DType;

/// Q4_0 / Q4_1 against Q8 activations on 512-bit vectors: a pair of blocks per vector.
///
/// Register layout of a pair (blocks `b`, `b + 1`), in 128-bit lanes: weights
/// `[lo_b, lo_b1, hi_b, hi_b1]` (low nibbles = weights 0..16 of a block, high = 16..32),
/// activations permuted to match, so `vpdpbusd` lanes 0-3 and 8-11 belong to block `b` and
/// 4-7, 12-15 to block `b + 1`; the per-block scales are spread the same way.
pub(super) mod zmm_q4 {
    use super::{DType, Q8Args};
    use crate::cpu::q8::Q8Block;
    use std::arch::x86_64::*;

    /// As `avx2::rows` (same contract), for Q4_0 and Q4_1 only.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `a` must hold `rows`
    /// weight rows and `X` activation rows of `a.nb` blocks and `out` `rows * X` floats;
    /// `a.dtype` must be Q4_0 or Q4_1.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::cpu::q8) unsafe fn rows<const W: usize, const X: usize>(
        a: &Q8Args<'_>,
        rows: usize,
        out: &mut [f32],
    ) {
        let mut r = 0;
        // SAFETY: each call covers rows `r..r + W` (or `r..r + 1`) below `rows`.
        unsafe {
            while r + W <= rows {
                dot::<W, X>(a, r, &mut out[r * X..(r + W) * X]);
                r += W;
            }
            while r < rows {
                dot::<1, X>(a, r, &mut out[r * X..(r + 1) * X]);
                r += 1;
            }
        }
    }

    /// # Safety
    /// As for [`rows`], with `r0 + W` at most its `rows`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn dot<const W: usize, const X: usize>(a: &Q8Args<'_>, r0: usize, out: &mut [f32]) {
        let has_min = a.dtype == DType::Q4_1;
        let bb = if has_min { 20 } else { 18 };
        let qoff = if has_min { 4 } else { 2 };
        let nb = a.nb;
        let mut acc = [[_mm512_setzero_ps(); X]; W];
        let mut offs = [[_mm_setzero_ps(); X]; W];
        let mask = _mm512_set1_epi8(0x0F);
        // Activation qwords: [x_b lo, x_b1 lo, x_b hi, x_b1 hi].
        let xperm = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        // Scale lanes: [s_b x4, s_b1 x4, s_b x4, s_b1 x4] from [s_b, s_b1, s_b, s_b1].
        let sperm = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        // SAFETY (whole block): weight blocks `b` and `b + 1` (the latter only when
        // `b + 1 < nb`) of rows `r0..r0 + W` and activation blocks `j * nb + b` (and
        // `+ 1`) for `j < X` lie inside what `dot_q8` asserted.
        unsafe {
            let w = a.w.as_ptr().add(r0 * a.w_stride);
            let x = a.x.as_ptr();
            let mut b = 0;
            while b < nb {
                let pair = b + 1 < nb;
                let mut wq = [_mm512_setzero_si512(); W];
                let mut dd = [_mm_setzero_ps(); W];
                let mut mm = [_mm_setzero_ps(); W];
                for i in 0..W {
                    let blk0 = w.add(i * a.w_stride + b * bb);
                    let (raw, dm1) = if pair {
                        let blk1 = blk0.add(bb);
                        (
                            _mm256_loadu2_m128i(
                                blk1.add(qoff) as *const __m128i,
                                blk0.add(qoff) as *const __m128i,
                            ),
                            (blk1 as *const i32).read_unaligned(),
                        )
                    } else {
                        // A lone last block: the second half is zero weights with zero
                        // scale and minimum.
                        (
                            _mm256_zextsi128_si256(_mm_loadu_si128(
                                blk0.add(qoff) as *const __m128i
                            )),
                            0,
                        )
                    };
                    let dm0 = (blk0 as *const i32).read_unaligned();
                    wq[i] = _mm512_and_si512(
                        _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(raw),
                            _mm256_srli_epi16::<4>(raw),
                        ),
                        mask,
                    );
                    // [d_b, m_b, d_b1, m_b1]
                    let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, dm1, dm0));
                    dd[i] = _mm_shuffle_ps::<0b10_00_10_00>(f, f);
                    mm[i] = if has_min {
                        _mm_shuffle_ps::<0b11_01_11_01>(f, f)
                    } else {
                        _mm_mul_ps(dd[i], _mm_set1_ps(-8.0))
                    };
                }
                for j in 0..X {
                    let xb0: *const Q8Block = x.add(j * nb + b);
                    let xb1 = if pair { xb0.add(1) } else { xb0 };
                    let xa = _mm256_loadu_si256((*xb0).qs.as_ptr() as *const __m256i);
                    let xc = _mm256_loadu_si256((*xb1).qs.as_ptr() as *const __m256i);
                    let xv = _mm512_permutex2var_epi64(
                        _mm512_castsi256_si512(xa),
                        xperm,
                        _mm512_castsi256_si512(xc),
                    );
                    let dx = _mm_set_ps((*xb1).d, (*xb0).d, (*xb1).d, (*xb0).d);
                    let sx = _mm_set_ps((*xb1).s, (*xb0).s, (*xb1).s, (*xb0).s);
                    for i in 0..W {
                        let p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            wq[i],
                            xv,
                        ));
                        let sc = _mm512_permutexvar_ps(
                            sperm,
                            _mm512_castps128_ps512(_mm_mul_ps(dd[i], dx)),
                        );
                        acc[i][j] = _mm512_fmadd_ps(p, sc, acc[i][j]);
                        offs[i][j] = _mm_fmadd_ps(mm[i], sx, offs[i][j]);
                    }
                }
                b += 2;
            }
        }
        for i in 0..W {
            for j in 0..X {
                // Lanes 0 and 1 of `offs` hold the even and odd blocks' minimum terms
                // (2 and 3 repeat them).
                let o = offs[i][j];
                let o = _mm_cvtss_f32(o) + _mm_cvtss_f32(_mm_movehdup_ps(o));
                out[i * X + j] = _mm512_reduce_add_ps(acc[i][j]) + o;
            }
        }
    }
}

/// `dispatch` for the x86 levels.
///
/// # Safety
/// `level`'s features must be available and `a` must satisfy the bounds `dot_q8` checks.
pub(super) unsafe fn dispatch(
    level: CpuLevel,
    a: &Q8Args<'_>,
    w_rows: usize,
    w_step: usize,
    x_rows: usize,
    out: &mut [f32],
) {
    macro_rules! by_shape {
        ($m:ident) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                match (w_step, x_rows) {
                    (1, 1) => $m::rows::<1, 1>(a, w_rows, out),
                    (1, 2) => $m::rows::<1, 2>(a, w_rows, out),
                    (1, 3) => $m::rows::<1, 3>(a, w_rows, out),
                    (1, _) => $m::rows::<1, 4>(a, w_rows, out),
                    (_, 1) => $m::rows::<2, 1>(a, w_rows, out),
                    (_, 2) => $m::rows::<2, 2>(a, w_rows, out),
                    (_, 3) => $m::rows::<2, 3>(a, w_rows, out),
                    (_, _) => $m::rows::<2, 4>(a, w_rows, out),
                }
            }
        };
    }
    match level {
        // The AVX-VNNI and AVX-512 builds of Q5_0, Q5_1 and IQ4_NL have not run on hardware
        // that has them: those types take the AVX2 kernels, which every such CPU runs.
        _ if matches!(a.dtype, DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL) => by_shape!(avx2),
        CpuLevel::Avx512Vnni if matches!(a.dtype, DType::Q4_0 | DType::Q4_1) => {
            by_shape!(zmm_q4)
        }
        CpuLevel::Avx512Vnni => by_shape!(avx512vnni),
        CpuLevel::AvxVnni => by_shape!(avxvnni),
        _ => by_shape!(avx2),
    }
}

/// One kernel set per instruction choice for the `u8 × i8 → i32x8` dot product (lane `l`
/// holds the sum of the products of bytes `4l..4l + 4`).
macro_rules! int_kernels {
    ($name:ident, $features:literal, |$a:ident, $b:ident| $dot:expr) => {
        pub(super) mod $name {
            use super::{DType, Q8Args};
            use crate::cpu::x86::hsum;
            use std::arch::x86_64::*;

            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8i8($a: __m256i, $b: __m256i) -> __m256i {
                $dot
            }

            /// 16 in each byte `j` whose bit `j` of `qh` is set (the fifth bits of a Q5
            /// block, in weight order), 0 elsewhere.
            #[target_feature(enable = $features)]
            #[inline]
            fn fifth_bits(qh: u32) -> __m256i {
                // Byte `j` gets byte `j / 8` of `qh`, then tests its bit `j % 8`.
                let spread = _mm256_shuffle_epi8(
                    _mm256_set1_epi32(qh as i32),
                    _mm256_set_epi64x(
                        0x0303_0303_0303_0303,
                        0x0202_0202_0202_0202,
                        0x0101_0101_0101_0101,
                        0,
                    ),
                );
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                _mm256_and_si256(set, _mm256_set1_epi8(16))
            }

            /// The 32 signed levels of the IQ4_NL nibbles at `qs` (16 bytes), in weight
            /// order.
            ///
            /// # Safety
            /// `qs` must point to 16 readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn iq4nl_levels(qs: *const u8) -> __m256i {
                let levels = crate::cpu::kquant::IQ4_LEVELS.map(|v| v as u8);
                // SAFETY: `levels` is 16 bytes; the caller vouches for `qs`.
                let (table, raw) = unsafe {
                    (
                        _mm_loadu_si128(levels.as_ptr() as *const __m128i),
                        _mm_loadu_si128(qs as *const __m128i),
                    )
                };
                let mask = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(raw, mask);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
                _mm256_set_m128i(_mm_shuffle_epi8(table, hi), _mm_shuffle_epi8(table, lo))
            }

            /// `out[i * X + j] = w_i · x_j` for `rows` weight rows, `W` per pass, and `X`
            /// activation rows.
            ///
            /// # Safety
            /// The features of this module must be available; `a` must hold `rows`
            /// weight rows and `X` activation rows of `a.nb` blocks, `out` `rows * X`
            /// floats, and `a.dtype` must be a 32-weight block type (all checked by
            /// `dot_q8`).
            #[target_feature(enable = $features)]
            pub(super) unsafe fn rows<const W: usize, const X: usize>(
                a: &Q8Args<'_>,
                rows: usize,
                out: &mut [f32],
            ) {
                let mut r = 0;
                // SAFETY: each call covers rows `r..r + W` (or `r..r + 1`) below `rows`.
                unsafe {
                    while r + W <= rows {
                        dot::<W, X>(a, r, &mut out[r * X..(r + W) * X]);
                        r += W;
                    }
                    while r < rows {
                        dot::<1, X>(a, r, &mut out[r * X..(r + 1) * X]);
                        r += 1;
                    }
                }
            }

            /// `out[i * X + j] = w_{r0 + i} · x_j` for `W` weight rows from `r0` and `X`
            /// activation rows.
            ///
            /// # Safety
            /// As for [`rows`], with `r0 + W` at most its `rows`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn dot<const W: usize, const X: usize>(
                a: &Q8Args<'_>,
                r0: usize,
                out: &mut [f32],
            ) {
                let mut acc = [[_mm256_setzero_ps(); X]; W];
                let mut offs = [[0f32; X]; W];
                // SAFETY: row `r0` is inside the checked rows.
                let w = unsafe { a.w.as_ptr().add(r0 * a.w_stride) };
                let x = a.x.as_ptr();
                let nb = a.nb;
                // SAFETY (whole block): block `b` of weight row `i` is the bytes
                // `i * w_stride + b * block_bytes..+ block_bytes`, and activation block
                // `j * nb + b`, both inside what `dot_q8` asserted for `b < nb`,
                // `i < W`, `j < X`.
                // Blocks go in pairs: `t = p0·s0 + p1·s1`, then `acc += t`, so the
                // loop-carried chain is one add per two blocks, and the rounding is the
                // same whatever `W` and `X` are (a row gives the same result in any
                // batch).
                let mut t = [[_mm256_setzero_ps(); X]; W];
                unsafe {
                    match a.dtype {
                        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
                            let has_min = matches!(a.dtype, DType::Q4_1 | DType::Q5_1);
                            let five = matches!(a.dtype, DType::Q5_0 | DType::Q5_1);
                            let bb = a.dtype.block_bytes();
                            // The nibbles follow the scales and, in Q5, the fifth bits.
                            let qoff = 2 + 2 * usize::from(has_min) + 4 * usize::from(five);
                            // The minimum of the types without one: the quant offset.
                            let offset = if five { -16.0 } else { -8.0 };
                            let mask = _mm_set1_epi8(0x0F);
                            macro_rules! q4_block {
                                ($bi:expr, $first:expr) => {{
                                    let b = $bi;
                                    let mut wq = [_mm256_setzero_si256(); W];
                                    let mut dw = [0f32; W];
                                    let mut mw = [0f32; W];
                                    for i in 0..W {
                                        let blk = w.add(i * a.w_stride + b * bb);
                                        let raw = _mm_loadu_si128(blk.add(qoff) as *const __m128i);
                                        let lo = _mm_and_si128(raw, mask);
                                        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
                                        wq[i] = _mm256_set_m128i(hi, lo);
                                        if five {
                                            let qh =
                                                (blk.add(qoff - 4) as *const u32).read_unaligned();
                                            wq[i] = _mm256_or_si256(wq[i], fifth_bits(qh));
                                        }
                                        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(
                                            (blk as *const i32).read_unaligned(),
                                        ));
                                        dw[i] = _mm_cvtss_f32(dm);
                                        mw[i] = if has_min {
                                            _mm_cvtss_f32(_mm_movehdup_ps(dm))
                                        } else {
                                            offset * dw[i]
                                        };
                                    }
                                    for j in 0..X {
                                        let xb = &*x.add(j * nb + b);
                                        let xq =
                                            _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                                        for i in 0..W {
                                            let p = _mm256_cvtepi32_ps(dot_u8i8(wq[i], xq));
                                            let sc = _mm256_set1_ps(dw[i] * xb.d);
                                            t[i][j] = if $first {
                                                _mm256_mul_ps(p, sc)
                                            } else {
                                                _mm256_fmadd_ps(p, sc, t[i][j])
                                            };
                                            offs[i][j] += mw[i] * xb.s;
                                        }
                                    }
                                }};
                            }
                            let mut b = 0;
                            while b < nb {
                                q4_block!(b, true);
                                if b + 1 < nb {
                                    q4_block!(b + 1, false);
                                }
                                for i in 0..W {
                                    for j in 0..X {
                                        acc[i][j] = _mm256_add_ps(acc[i][j], t[i][j]);
                                    }
                                }
                                b += 2;
                            }
                        }
                        _ => {
                            // Q8_0, or IQ4_NL's levels looked up into the same signed bytes.
                            let nl = a.dtype == DType::IQ4_NL;
                            let bb = a.dtype.block_bytes();
                            macro_rules! q8_block {
                                ($bi:expr, $first:expr) => {{
                                    let b = $bi;
                                    let mut wa = [_mm256_setzero_si256(); W];
                                    let mut ws = [_mm256_setzero_si256(); W];
                                    let mut dw = [0f32; W];
                                    for i in 0..W {
                                        let blk = w.add(i * a.w_stride + b * bb);
                                        let q = if nl {
                                            iq4nl_levels(blk.add(2))
                                        } else {
                                            _mm256_loadu_si256(blk.add(2) as *const __m256i)
                                        };
                                        // |w| as unsigned bytes (−128 becomes 128); the
                                        // sign moves onto the activations below.
                                        wa[i] = _mm256_sign_epi8(q, q);
                                        ws[i] = q;
                                        dw[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                                            i32::from((blk as *const u16).read_unaligned()),
                                        )));
                                    }
                                    for j in 0..X {
                                        let xb = &*x.add(j * nb + b);
                                        let xq =
                                            _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                                        for i in 0..W {
                                            let sx = _mm256_sign_epi8(xq, ws[i]);
                                            let p = _mm256_cvtepi32_ps(dot_u8i8(wa[i], sx));
                                            let sc = _mm256_set1_ps(dw[i] * xb.d);
                                            t[i][j] = if $first {
                                                _mm256_mul_ps(p, sc)
                                            } else {
                                                _mm256_fmadd_ps(p, sc, t[i][j])
                                            };
                                        }
                                    }
                                }};
                            }
                            let mut b = 0;
                            while b < nb {
                                q8_block!(b, true);
                                if b + 1 < nb {
                                    q8_block!(b + 1, false);
                                }
                                for i in 0..W {
                                    for j in 0..X {
                                        acc[i][j] = _mm256_add_ps(acc[i][j], t[i][j]);
                                    }
                                }
                                b += 2;
                            }
                        }
                    }
                }
                for i in 0..W {
                    for j in 0..X {
                        out[i * X + j] = hsum(acc[i][j]) + offs[i][j];
                    }
                }
            }
        }
    };
}

int_kernels!(avx2, "avx2,fma,f16c", |a, b| _mm256_madd_epi16(
    _mm256_maddubs_epi16(a, b),
    _mm256_set1_epi16(1)
));
int_kernels!(avxvnni, "avx2,fma,f16c,avxvnni", |a, b| {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
});
int_kernels!(avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", |a, b| {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
});
