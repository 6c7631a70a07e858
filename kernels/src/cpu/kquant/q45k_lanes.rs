//! The AVX2 Q4_K and Q5_K kernels of [`super::dot_q8k`]: eight weight rows in the eight
//! lanes of a vector, as the 32-weight types' kernels (`crate::cpu::q8`).
//!
//! A Q4_K / Q5_K super-block is eight groups of 32 quants (0..16, or 0..32 with Q5_K's fifth
//! bits), each with a 6-bit scale and minimum. Per group and row, `maddubs` gives 16 pair
//! sums, and rounds of `hadd` across the eight rows sum them in `i16`:
//! - Q4_K, three rounds, into each row's two halves (16 products each: at most
//!   `16·15·127 < 2^15`), then one `madd` by the group's scales gives each row's scaled group
//!   sum in its `i32` lane: about one multiply per 32 weights instead of two;
//! - Q5_K, two rounds, into each row's four quarters (8 products: at most `8·31·127 < 2^15`),
//!   then two `madd`s by the scales of rows 0-3 and 4-7.
//!
//! The minimums' term is summed the same way from the activation group sums. Then, per
//! super-block, one multiply-add into the row's lane and one subtraction for the minimums: the
//! same operations for a row whatever the batch or its lane. One or two activation rows
//! (decode) take the row-at-a-time kernels of `super::x86` instead, which stream the weights
//! in order and end each super-block with these same operations, so decode and prefill agree
//! bit for bit.

use std::arch::x86_64::*;

use super::q8k::Q8KArgs;
use super::scales_mins_k4;
use crate::cpu::dequant::f16_at;
use crate::cpu::x86::lanes_out;

/// Rows per pass: one per f32 lane.
const LANES: usize = 8;
/// `out[i * X + j] = w_i · x_j` for `rows` Q4_K rows (Q5_K with `FIVE`) against `X`
/// activation rows.
///
/// # Safety
/// AVX2, FMA and F16C must be available and `a` must satisfy the bounds `dot_q8k` checks, with
/// `a.dtype` Q4_K (Q5_K with `FIVE`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<const X: usize, const FIVE: bool>(
    a: &Q8KArgs<'_>,
    rows: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(LANES);
        // SAFETY: rows `r..r + n` are inside the checked rows.
        unsafe { pass::<X, FIVE>(a, r, n, &mut out[r * X..(r + n) * X]) };
        r += n;
    }
}

/// Rows `r0..r0 + n` (`n` at most [`LANES`]).
///
/// # Safety
/// As for [`rows`], with `r0 + n` at most its `rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pass<const X: usize, const FIVE: bool>(
    a: &Q8KArgs<'_>,
    r0: usize,
    n: usize,
    out: &mut [f32],
) {
    // Bytes of a super-block, and where its quants start.
    let (block, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let mut acc = [_mm256_setzero_ps(); X];
    let mut offs = [_mm256_setzero_ps(); X];
    let nib = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    // Per super-block: each row's quants by group (rows past `n` stay zero, with zero scales),
    // the groups' scales with each row's twice in a row (for the `madd` of its two halves),
    // and each row's eight minimums.
    let mut q = [[_mm256_setzero_si256(); LANES]; 8];
    let mut srow = [0u64; LANES];
    let mut mrow = [0u64; LANES];
    let mut d = [0f32; LANES];
    let mut dmin = [0f32; LANES];
    for b in 0..a.nb {
        for i in 0..n {
            let at = (r0 + i) * a.w_stride + b * block;
            let blk = &a.w[at..at + block];
            d[i] = f16_at(blk, 0);
            dmin[i] = f16_at(blk, 2);
            let (s8, m8) = scales_mins_k4(&blk[4..16]);
            srow[i] = u64::from_le_bytes(s8);
            mrow[i] = u64::from_le_bytes(m8);
            let load = |o: usize| {
                let bytes = &blk[o..o + 32];
                // SAFETY: 32 bytes.
                unsafe { _mm256_loadu_si256(bytes.as_ptr() as *const __m256i) }
            };
            // Q5_K's fifth bits (Q4_K has none).
            let qh = if FIVE {
                load(16)
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let raw = load(qs + 32 * c);
                q[2 * c][i] = _mm256_and_si256(raw, nib);
                q[2 * c + 1][i] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib);
                if FIVE {
                    for g in [2 * c, 2 * c + 1] {
                        q[g][i] = _mm256_or_si256(q[g][i], fifth_bit(qh, g, sixteen));
                    }
                }
            }
        }
        // SAFETY: arrays of 8 floats.
        let (dv, dminv) = unsafe { (_mm256_loadu_ps(d.as_ptr()), _mm256_loadu_ps(dmin.as_ptr())) };
        let sc = group_scales(&srow);
        // Q5_K's: the scales of rows 0-3 (4-7), each twice in a row, in both halves.
        let sc4: [[__m256i; 2]; 8] = std::array::from_fn(|g| {
            [
                _mm256_permute4x64_epi64::<0b01_00_01_00>(sc[g]),
                _mm256_permute4x64_epi64::<0b11_10_11_10>(sc[g]),
            ]
        });
        // Minimums of rows (2p, 2p + 1) side by side, as i16.
        let row = |v: u64| _mm_cvtepu8_epi16(_mm_set_epi64x(0, v as i64));
        let mins: [__m256i; 4] =
            std::array::from_fn(|p| _mm256_set_m128i(row(mrow[2 * p + 1]), row(mrow[2 * p])));
        for j in 0..X {
            let xb = &a.x[j * a.nb + b];
            let mut sumi = _mm256_setzero_si256();
            let (mut s03, mut s47) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for g in 0..8 {
                // SAFETY: 32 activation quants of group `g`.
                let xq = unsafe { _mm256_loadu_si256(xb.qs[32 * g..].as_ptr() as *const __m256i) };
                let p = |i: usize| _mm256_maddubs_epi16(q[g][i], xq);
                let h01 = _mm256_hadd_epi16(p(0), p(1));
                let h23 = _mm256_hadd_epi16(p(2), p(3));
                let h45 = _mm256_hadd_epi16(p(4), p(5));
                let h67 = _mm256_hadd_epi16(p(6), p(7));
                if FIVE {
                    // Per half: rows 0-3 (4-7), two 8-product sums each.
                    let v03 = _mm256_hadd_epi16(h01, h23);
                    let v47 = _mm256_hadd_epi16(h45, h67);
                    s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(v03, sc4[g][0]));
                    s47 = _mm256_add_epi32(s47, _mm256_madd_epi16(v47, sc4[g][1]));
                    continue;
                }
                // Lanes 0-7 of each half: rows 0-7, the group's first (second) 16 products.
                let v = _mm256_hadd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_hadd_epi16(h45, h67));
                let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                // Each row's two halves side by side, rows 0-3 then 4-7.
                let halves =
                    _mm256_set_m128i(_mm_unpackhi_epi16(lo, hi), _mm_unpacklo_epi16(lo, hi));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(halves, sc[g]));
            }
            if FIVE {
                // Each half holds 16 of each group's 32 weights: rows 0-3, then 4-7.
                let half = |v: __m256i| {
                    _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
                };
                sumi = _mm256_set_m128i(half(s47), half(s03));
            }
            // The activation sums of the eight 32-value groups (two 16-value sums each), twice.
            // SAFETY: `bsums` is 16 i16.
            let bs = unsafe { _mm256_loadu_si256(xb.bsums.as_ptr() as *const __m256i) };
            let pairs = _mm256_hadd_epi16(bs, bs);
            let groups = _mm256_permute4x64_epi64::<0b10_00_10_00>(pairs);
            let m: [__m256i; 4] = std::array::from_fn(|p| _mm256_madd_epi16(mins[p], groups));
            // Lanes: rows 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high.
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
            let (even, odd) = (_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let msum =
                _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd));
            let dx = _mm256_set1_ps(xb.d);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dv, dx), acc[j]);
            offs[j] = _mm256_sub_ps(
                offs[j],
                _mm256_mul_ps(_mm256_mul_ps(dminv, dx), _mm256_cvtepi32_ps(msum)),
            );
        }
    }
    lanes_out(&acc, &offs, n, out);
}

/// 16 in each byte `l` whose bit `g` of `qh[l]` is set (Q5_K's fifth bits of group `g`), else
/// 0: the bit shifted to bit 4 (a 16-bit shift, but only each byte's own bit lands there).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn fifth_bit(qh: __m256i, g: usize, sixteen: __m256i) -> __m256i {
    let at4 = match g {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<3>(qh),
        2 => _mm256_slli_epi16::<2>(qh),
        3 => _mm256_slli_epi16::<1>(qh),
        4 => qh,
        5 => _mm256_srli_epi16::<1>(qh),
        6 => _mm256_srli_epi16::<2>(qh),
        _ => _mm256_srli_epi16::<3>(qh),
    };
    _mm256_and_si256(at4, sixteen)
}

/// Group `g`'s scales of the eight rows, each twice in a row, as i16: an 8x8 byte transpose of
/// the rows' scales (row `i`'s eight scales in the bytes of `rows[i]`).
#[target_feature(enable = "avx2")]
#[inline]
fn group_scales(rows: &[u64; LANES]) -> [__m256i; 8] {
    let r = |i: usize| _mm_set_epi64x(0, rows[i] as i64);
    // Bytes: rows (0, 1), (2, 3), ... interleaved by group.
    let (a, b) = (_mm_unpacklo_epi8(r(0), r(1)), _mm_unpacklo_epi8(r(2), r(3)));
    let (c, d) = (_mm_unpacklo_epi8(r(4), r(5)), _mm_unpacklo_epi8(r(6), r(7)));
    // Groups 0-3 (4-7), four rows each.
    let (ab_lo, ab_hi) = (_mm_unpacklo_epi16(a, b), _mm_unpackhi_epi16(a, b));
    let (cd_lo, cd_hi) = (_mm_unpacklo_epi16(c, d), _mm_unpackhi_epi16(c, d));
    // Two groups of eight rows each.
    let pairs = [
        _mm_unpacklo_epi32(ab_lo, cd_lo),
        _mm_unpackhi_epi32(ab_lo, cd_lo),
        _mm_unpacklo_epi32(ab_hi, cd_hi),
        _mm_unpackhi_epi32(ab_hi, cd_hi),
    ];
    std::array::from_fn(|g| {
        let v = pairs[g / 2];
        let twice = if g % 2 == 0 {
            _mm_unpacklo_epi8(v, v)
        } else {
            _mm_unpackhi_epi8(v, v)
        };
        _mm256_cvtepu8_epi16(twice)
    })
}
