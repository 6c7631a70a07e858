//! The x86_64 integer kernels of [`super::dot_q8`], one module per instruction choice.

use super::Q8Args;
use crate::cpu::features::CpuLevel;
use crate::DType;

/// `dispatch` for the x86 levels.
///
/// # Safety
/// `level`'s features must be available and `a` must satisfy the bounds `dot_q8` checks.
pub(super) unsafe fn dispatch(
    level: CpuLevel,
    a: &Q8Args<'_>,
    w_rows: usize,
    x_rows: usize,
    out: &mut [f32],
) {
    macro_rules! by_rows {
        ($m:ident) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                match x_rows {
                    1 => $m::rows::<1>(a, w_rows, out),
                    2 => $m::rows::<2>(a, w_rows, out),
                    3 => $m::rows::<3>(a, w_rows, out),
                    4 => $m::rows::<4>(a, w_rows, out),
                    5 => $m::rows::<5>(a, w_rows, out),
                    6 => $m::rows::<6>(a, w_rows, out),
                    7 => $m::rows::<7>(a, w_rows, out),
                    _ => $m::rows::<8>(a, w_rows, out),
                }
            }
        };
    }
    // SAFETY (whole match): forwarded from the caller.
    match level {
        CpuLevel::Avx512Vnni => by_rows!(avx512vnni),
        CpuLevel::AvxVnni => by_rows!(avxvnni),
        _ => by_rows!(avx2),
    }
}

/// Weight rows per pass of the `u8 × i8` kernels: one per f32 lane.
pub(super) const LANES: usize = 8;

/// How far ahead of a pass's start, in bytes, the decode kernels prefetch the weights.
const PREFETCH_AHEAD: usize = 6144;

/// One kernel set per instruction choice for the `u8 × i8 → i32x8` dot product (lane `l`
/// holds the sum of the products of bytes `4l..4l + 4`).
macro_rules! int_kernels {
    (
        $name:ident,
        $features:literal,
        $exact4:expr,
        |$a:ident, $b:ident| $dot:expr,
        |$c2:ident, $a2:ident, $b2:ident| $dot_acc:expr
    ) => {
        pub(super) mod $name {
            use super::{DType, Q8Args, LANES, PREFETCH_AHEAD};
            use crate::cpu::x86::{lanes_out, transpose8};
            use std::arch::x86_64::*;

            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8i8($a: __m256i, $b: __m256i) -> __m256i {
                $dot
            }

            /// `c + dot_u8i8(a, b)`, in one instruction where there is one.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_acc($c2: __m256i, $a2: __m256i, $b2: __m256i) -> __m256i {
                $dot_acc
            }

            /// Whether [`dot_u8i8`] sums its four products exactly for any bytes (no `i16`
            /// pair sums that could saturate).
            const EXACT4: bool = $exact4;

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

            /// `out[i * X + j] = w_i · x_j` for `rows` weight rows, [`LANES`] per pass, and
            /// `X` activation rows.
            ///
            /// # Safety
            /// The features of this module must be available; `a` must hold `rows`
            /// weight rows and `X` activation rows of `a.nb` blocks, `out` `rows * X`
            /// floats, and `a.dtype` must be a 32-weight block type (all checked by
            /// `dot_q8`).
            #[target_feature(enable = $features)]
            pub(super) unsafe fn rows<const X: usize>(
                a: &Q8Args<'_>,
                rows: usize,
                out: &mut [f32],
            ) {
                let mut r = 0;
                // The type and a full pass are compile-time constants, so that each block's
                // unpacking stays in registers.
                macro_rules! by_type {
                    ($full:expr, $n:expr) => {{
                        let o = &mut out[r * X..(r + $n) * X];
                        match a.dtype {
                            DType::Q4_0 => dot::<X, 0, $full>(a, r, $n, o),
                            DType::Q4_1 => dot::<X, 1, $full>(a, r, $n, o),
                            DType::Q5_0 => dot::<X, 2, $full>(a, r, $n, o),
                            DType::Q5_1 => dot::<X, 3, $full>(a, r, $n, o),
                            DType::Q8_0 => dot::<X, 4, $full>(a, r, $n, o),
                            _ => dot::<X, 5, $full>(a, r, $n, o),
                        }
                    }};
                }
                // SAFETY: each call covers rows `r..r + n` below `rows`.
                unsafe {
                    while r + LANES <= rows {
                        by_type!(true, LANES);
                        r += LANES;
                    }
                    if r < rows {
                        by_type!(false, rows - r);
                    }
                }
            }

            use super::super::type_code::{block_bytes, has_min};

            /// Type `T` of the lane kernels ([`super::super::type_code`]): Q8_0 and IQ4_NL
            /// are "wide": their byte products fill the `i16` pair sums.
            const fn wide(t: u8) -> bool {
                t >= 4
            }

            /// One weight block of type `T`, unpacked: the bytes to multiply (unsigned), the
            /// signs to move onto the activations (signed types), the scale and the minimum.
            ///
            /// # Safety
            /// `blk` must point to one block of type `T`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn unpack<const T: u8>(blk: *const u8) -> (__m256i, __m256i, f32, f32) {
                let five = T == 2 || T == 3;
                // The nibbles follow the scale (and minimum) and, in Q5, the fifth bits.
                let qoff = 2 + 2 * usize::from(has_min(T)) + 4 * usize::from(five);
                // SAFETY: every read is inside the block, as the caller vouches.
                unsafe {
                    let q = if T == 4 {
                        _mm256_loadu_si256(blk.add(2) as *const __m256i)
                    } else if T == 5 {
                        iq4nl_levels(blk.add(2))
                    } else {
                        let mask = _mm_set1_epi8(0x0F);
                        let raw = _mm_loadu_si128(blk.add(qoff) as *const __m128i);
                        let lo = _mm_and_si128(raw, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
                        let q = _mm256_set_m128i(hi, lo);
                        if five {
                            let qh = (blk.add(qoff - 4) as *const u32).read_unaligned();
                            _mm256_or_si256(q, fifth_bits(qh))
                        } else {
                            q
                        }
                    };
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(if has_min(T) {
                        (blk as *const i32).read_unaligned()
                    } else {
                        i32::from((blk as *const u16).read_unaligned())
                    }));
                    let d = _mm_cvtss_f32(dm);
                    if has_min(T) {
                        (q, q, d, _mm_cvtss_f32(_mm_movehdup_ps(dm)))
                    } else {
                        // Q4_0 and Q5_0 store `q + 8` / `q + 16`: the offset comes off in
                        // the bytes, so the integer sum is exact with no minimum term.
                        let q = match T {
                            0 => _mm256_sub_epi8(q, _mm256_set1_epi8(8)),
                            2 => _mm256_sub_epi8(q, _mm256_set1_epi8(16)),
                            _ => q,
                        };
                        // |w| as unsigned bytes (−128 becomes 128).
                        (_mm256_sign_epi8(q, q), q, d, 0.0)
                    }
                }
            }

            /// The scales (and minimums) of block `blk` of eight rows `stride` bytes apart,
            /// lane `i` row `i`: what [`unpack`] gives, row by row.
            ///
            /// # Safety
            /// Eight blocks of type `T` must lie at `blk + i * stride`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn scales8<const T: u8>(blk: *const u8, stride: usize) -> (__m256, __m256) {
                // SAFETY: each read is the first bytes of a block, as the caller vouches.
                unsafe {
                    if has_min(T) {
                        // Each row's (d, m) pair of f16, as one i32.
                        let dm = |i: usize| (blk.add(i * stride) as *const i32).read_unaligned();
                        // [d0 m0 d1 m1 d2 m2 d3 m3] and the same for rows 4-7.
                        let lo = _mm256_cvtph_ps(_mm_set_epi32(dm(3), dm(2), dm(1), dm(0)));
                        let hi = _mm256_cvtph_ps(_mm_set_epi32(dm(7), dm(6), dm(5), dm(4)));
                        // Rows in the order 0 1 4 5 2 3 6 7, put back in order by 64-bit pairs.
                        let order = |v: __m256| {
                            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(
                                _mm256_castps_pd(v),
                            ))
                        };
                        (
                            order(_mm256_shuffle_ps::<0b10_00_10_00>(lo, hi)),
                            order(_mm256_shuffle_ps::<0b11_01_11_01>(lo, hi)),
                        )
                    } else {
                        let d = |i: usize| (blk.add(i * stride) as *const i16).read_unaligned();
                        let v = _mm_set_epi16(d(7), d(6), d(5), d(4), d(3), d(2), d(1), d(0));
                        (_mm256_cvtph_ps(v), _mm256_setzero_ps())
                    }
                }
            }

            /// One weight block times one activation block, partly summed: `i16` pair sums
            /// for the narrow types, `i32` for the wide.
            #[target_feature(enable = $features)]
            #[inline]
            fn part<const T: u8>(wu: __m256i, ws: __m256i, xq: __m256i) -> __m256i {
                let xs = if has_min(T) {
                    xq
                } else {
                    _mm256_sign_epi8(xq, ws)
                };
                if wide(T) {
                    dot_u8i8(wu, xs)
                } else {
                    _mm256_maddubs_epi16(wu, xs)
                }
            }

            /// The eight rows' whole integer sums from their [`part`]s, lane `i` row `i`.
            /// Narrow parts are summed across lanes twice more in `i16` (eight products: at
            /// most `8·31·127 < 2^15`), then widened: one `madd` per four rows.
            #[target_feature(enable = $features)]
            #[inline]
            fn reduce<const T: u8>(p: &[__m256i; LANES]) -> __m256i {
                let (h0123, h4567) = if wide(T) {
                    let h01 = _mm256_hadd_epi32(p[0], p[1]);
                    let h23 = _mm256_hadd_epi32(p[2], p[3]);
                    let h45 = _mm256_hadd_epi32(p[4], p[5]);
                    let h67 = _mm256_hadd_epi32(p[6], p[7]);
                    (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67))
                } else {
                    let ones = _mm256_set1_epi16(1);
                    let h01 = _mm256_hadd_epi16(p[0], p[1]);
                    let h23 = _mm256_hadd_epi16(p[2], p[3]);
                    let h45 = _mm256_hadd_epi16(p[4], p[5]);
                    let h67 = _mm256_hadd_epi16(p[6], p[7]);
                    (
                        _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones),
                        _mm256_madd_epi16(_mm256_hadd_epi16(h45, h67), ones),
                    )
                };
                // Lanes 0-3 of each half hold rows 0-3 (4-7): add the halves.
                _mm256_add_epi32(
                    _mm256_permute2x128_si256::<0x20>(h0123, h4567),
                    _mm256_permute2x128_si256::<0x31>(h0123, h4567),
                )
            }

            /// The eight rows' block sums with activation block `xq` in the broadcast form
            /// (see [`dot`]), from the transposed quants `t` and the signed types' `128·Σw`.
            #[target_feature(enable = $features)]
            #[inline]
            fn bcast_sums<const T: u8>(
                t: &[__m256i; LANES],
                xq: __m256i,
                high: __m256i,
                corr: __m256i,
            ) -> __m256i {
                let xv = if has_min(T) {
                    xq
                } else {
                    // `x + 128` as unsigned bytes.
                    _mm256_xor_si256(xq, high)
                };
                let mut xd = [0i32; 8];
                // SAFETY: eight dwords.
                unsafe { _mm256_storeu_si256(xd.as_mut_ptr() as *mut __m256i, xv) };
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                for c in 0..4 {
                    let (x0, x1) = (
                        _mm256_set1_epi32(xd[2 * c]),
                        _mm256_set1_epi32(xd[2 * c + 1]),
                    );
                    if has_min(T) {
                        s0 = dot_acc(s0, t[2 * c], x0);
                        s1 = dot_acc(s1, t[2 * c + 1], x1);
                    } else {
                        s0 = dot_acc(s0, x0, t[2 * c]);
                        s1 = dot_acc(s1, x1, t[2 * c + 1]);
                    }
                }
                _mm256_sub_epi32(_mm256_add_epi32(s0, s1), corr)
            }

            /// `out[i * X + j] = w_{r0 + i} · x_j` for `n` (at most [`LANES`]) weight rows
            /// from `r0` and `X` activation rows; `FULL`: `n` is `LANES`.
            ///
            /// Lane `i` of a float vector belongs to weight row `r0 + i`. Per block, each
            /// row's integer sum is exact (and exact in f32: at most `32·128·127`), and the
            /// row's accumulator takes one fused multiply-add by `d_w·d_x`, in block order;
            /// the minimum term, where the type has one, goes into its own accumulator the
            /// same way. So an output's value comes from the same operations whatever `X`,
            /// `n` and the row's lane are: a row gives the same result in any batch. Each
            /// block of the eight weight rows is unpacked once for all the activation rows.
            ///
            /// A row's block sums come one of two ways. Per activation row, eight `part`s
            /// summed across rows by [`reduce`]; or, for three or more activation rows where
            /// [`EXACT4`] holds, the broadcast form: the eight rows' bytes transposed once per
            /// block so that lane `i` of vector `c` holds bytes `4c..4c + 4` of row `i`, and
            /// each activation dword, broadcast, meets all eight rows in one `vpdpbusd`, with
            /// no sign moves and no horizontal sums. There the types with a minimum multiply
            /// their unsigned quants by the activations as they are; the signed types multiply
            /// the activations offset to unsigned (`x + 128`) by the signed quants and take
            /// `128·Σw` off each row's sum. Both give the same exact sums, so the same bits.
            ///
            /// # Safety
            /// As for [`rows`], with `r0 + n` at most its `rows`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn dot<const X: usize, const T: u8, const FULL: bool>(
                a: &Q8Args<'_>,
                r0: usize,
                n: usize,
                out: &mut [f32],
            ) {
                let n = if FULL { LANES } else { n };
                let mut acc = [_mm256_setzero_ps(); X];
                let mut offs = [_mm256_setzero_ps(); X];
                // SAFETY: row `r0` is inside the checked rows.
                let w = unsafe { a.w.as_ptr().add(r0 * a.w_stride) };
                let x = a.x.as_ptr();
                let nb = a.nb;
                let bb = block_bytes(T);
                let bcast = EXACT4 && X >= 3;
                let ones = _mm256_set1_epi8(1);
                let high = _mm256_set1_epi8(-128);
                // SAFETY (whole block): block `b` of weight row `i` is the bytes
                // `i * w_stride + b * bb..+ bb`, and activation block `j * nb + b`, both
                // inside what `dot_q8` asserted for `b < nb`, `i < n`, `j < X`. Rows past `n`
                // keep zero parts and zero scales.
                unsafe {
                    let mut wu = [_mm256_setzero_si256(); LANES];
                    let mut ws = [_mm256_setzero_si256(); LANES];
                    let mut dw = [0f32; LANES];
                    let mut mw = [0f32; LANES];
                    // Bytes of weights each block's step reads (the eight rows' blocks).
                    let chunk = (LANES * a.w_stride).div_ceil(nb);
                    for b in 0..nb {
                        // With one or two activation rows (decode, where the weights
                        // come from memory) the eight interleaved row streams defeat the
                        // hardware prefetcher: fetch ahead in address order, as much per
                        // block as a block's step reads, so the lines arrive in the order
                        // the memory serves best. A prefetch past the matrix is harmless
                        // (the address is only computed, never dereferenced).
                        if X <= 2 {
                            let from = PREFETCH_AHEAD + b * chunk;
                            let mut o = from & !63;
                            while o < from + chunk {
                                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(o) as *const i8);
                                o += 64;
                            }
                        }
                        for i in 0..n {
                            (wu[i], ws[i], dw[i], mw[i]) =
                                unpack::<T>(w.add(i * a.w_stride + b * bb));
                        }
                        let (dwv, mwv) = if FULL {
                            // The same values, converted eight at a time: one conversion
                            // per pass instead of one per row, and no vector load of
                            // scalar stores.
                            scales8::<T>(w.add(b * bb), a.w_stride)
                        } else {
                            (_mm256_loadu_ps(dw.as_ptr()), _mm256_loadu_ps(mw.as_ptr()))
                        };
                        // The broadcast form's transposed quants, and for the signed types
                        // `128·Σw` of each row (lane).
                        let mut t = [_mm256_setzero_si256(); LANES];
                        let mut corr = _mm256_setzero_si256();
                        if bcast {
                            t = transpose8(if has_min(T) { wu } else { ws });
                            if !has_min(T) {
                                for tc in &t {
                                    corr = dot_acc(corr, ones, *tc);
                                }
                                corr = _mm256_slli_epi32::<7>(corr);
                            }
                        }
                        for j in 0..X {
                            let xb = &*x.add(j * nb + b);
                            let xq = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                            let sums = if bcast {
                                bcast_sums::<T>(&t, xq, high, corr)
                            } else {
                                reduce::<T>(&std::array::from_fn(|i| part::<T>(wu[i], ws[i], xq)))
                            };
                            let sc = _mm256_mul_ps(dwv, _mm256_set1_ps(xb.d));
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), sc, acc[j]);
                            if has_min(T) {
                                offs[j] = _mm256_fmadd_ps(mwv, _mm256_set1_ps(xb.s), offs[j]);
                            }
                        }
                    }
                }
                lanes_out(&acc, &offs, n, out);
            }
        }
    };
}

int_kernels!(
    avx2,
    "avx2,fma,f16c",
    false,
    |a, b| _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)),
    |c, a, b| _mm256_add_epi32(c, dot_u8i8(a, b))
);
int_kernels!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    true,
    |a, b| _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b),
    |c, a, b| _mm256_dpbusd_avx_epi32(c, a, b)
);
int_kernels!(
    avx512vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    true,
    |a, b| _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b),
    |c, a, b| _mm256_dpbusd_epi32(c, a, b)
);
