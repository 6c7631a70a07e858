//! The AVX2 Q6_K kernel of [`super::dot_q8k`]: eight weight rows in the eight lanes of a
//! vector, as Q4_K's and Q5_K's (`super::q45k_lanes`).
//!
//! A Q6_K super-block is sixteen groups of 16 quants (stored plus 32, so 0..64), each with a
//! signed 8-bit scale. A vector holds 32 quants of a row: two groups, one per 128-bit half.
//! `maddubs` multiplies the stored quants; subtracting `maddubs(32, x)` (once per activation
//! vector, shared by the eight rows) makes each pair sum `(q − 32)·x`, at most `2·32·127` in
//! magnitude. Two rounds of `hadd` across the rows then sum eight products in `i16` (at most
//! `8·32·127 < 2^15`; the activations are within ±127), and one `madd` by the groups' scales
//! gives four rows' scaled half-group sums in `i32`: eleven multiplies per 32 weights of eight
//! rows instead of sixteen, and no offset term. Then, per super-block, one multiply-add into
//! each row's lane: the same operations for a row whatever the batch or its lane, and those
//! the row-at-a-time kernel that decode takes (`super::x86`) ends each super-block with.

use std::arch::x86_64::*;

use super::q8k::Q8KArgs;
use crate::cpu::dequant::f16_at;
use crate::cpu::x86::lanes_out;

/// Rows per pass: one per f32 lane.
const LANES: usize = 8;
/// Bytes of a Q6_K super-block.
const BLOCK: usize = 210;

/// `out[i * X + j] = w_i · x_j` for `rows` Q6_K rows against `X` activation rows.
///
/// # Safety
/// AVX2, FMA and F16C must be available and `a` must satisfy the bounds `dot_q8k` checks, with
/// `a.dtype` Q6_K and activation quants within ±127 (as `quantize_row_q8k` makes them).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<const X: usize>(a: &Q8KArgs<'_>, rows: usize, out: &mut [f32]) {
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(LANES);
        // SAFETY: rows `r..r + n` are inside the checked rows.
        unsafe { pass::<X>(a, r, n, &mut out[r * X..(r + n) * X]) };
        r += n;
    }
}

/// Rows `r0..r0 + n` (`n` at most [`LANES`]).
///
/// # Safety
/// As for [`rows`], with `r0 + n` at most its `rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pass<const X: usize>(a: &Q8KArgs<'_>, r0: usize, n: usize, out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); X];
    let nib = _mm256_set1_epi8(0x0F);
    let two = _mm256_set1_epi8(0x30);
    let thirty_two = _mm256_set1_epi8(32);
    // Per super-block: quants `m` (weights `32m..32m + 32`) of each row (rows past `n` stay
    // zero, with zero scales), each row's sixteen scales, and its `d`.
    let mut q = [[_mm256_setzero_si256(); LANES]; 8];
    let mut srow = [_mm_setzero_si128(); LANES];
    let mut d = [0f32; LANES];
    for b in 0..a.nb {
        for i in 0..n {
            let at = (r0 + i) * a.w_stride + b * BLOCK;
            let blk = &a.w[at..at + BLOCK];
            d[i] = f16_at(blk, 208);
            let load = |o: usize| {
                let bytes = &blk[o..o + 32];
                // SAFETY: 32 bytes.
                unsafe { _mm256_loadu_si256(bytes.as_ptr() as *const __m256i) }
            };
            // SAFETY: the 16 scale bytes at 192.
            srow[i] = unsafe { _mm_loadu_si128(blk[192..208].as_ptr() as *const __m128i) };
            for h in 0..2 {
                let (l0, l1, hb) = (load(64 * h), load(64 * h + 32), load(128 + 32 * h));
                // Weights `128h + 32k + l`: a nibble of `ql[64h + l]` (k = 0, 2) or
                // `ql[64h + 32 + l]` (k = 1, 3), and bits `2k..2k+2` of `qh[32h + l]` above.
                q[4 * h][i] = _mm256_or_si256(
                    _mm256_and_si256(l0, nib),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(hb), two),
                );
                q[4 * h + 1][i] = _mm256_or_si256(
                    _mm256_and_si256(l1, nib),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hb), two),
                );
                q[4 * h + 2][i] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l0), nib),
                    _mm256_and_si256(hb, two),
                );
                q[4 * h + 3][i] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), nib),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(hb), two),
                );
            }
        }
        // SAFETY: an array of 8 floats.
        let dv = unsafe { _mm256_loadu_ps(d.as_ptr()) };
        let sc = group_scales(&srow);
        for (j, accj) in acc.iter_mut().enumerate() {
            let xb = &a.x[j * a.nb + b];
            let mut s03 = _mm256_setzero_si256();
            let mut s47 = _mm256_setzero_si256();
            for (m, qm) in q.iter().enumerate() {
                // SAFETY: 32 activation quants from `32m`.
                let xq = unsafe { _mm256_loadu_si256(xb.qs[32 * m..].as_ptr() as *const __m256i) };
                let off = _mm256_maddubs_epi16(thirty_two, xq);
                let p = |i: usize| _mm256_sub_epi16(_mm256_maddubs_epi16(qm[i], xq), off);
                let h01 = _mm256_hadd_epi16(p(0), p(1));
                let h23 = _mm256_hadd_epi16(p(2), p(3));
                let h45 = _mm256_hadd_epi16(p(4), p(5));
                let h67 = _mm256_hadd_epi16(p(6), p(7));
                // Per half (group `2m`, then `2m + 1`): rows 0-3 (4-7), two 8-product sums each.
                let v03 = _mm256_hadd_epi16(h01, h23);
                let v47 = _mm256_hadd_epi16(h45, h67);
                s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(v03, sc[m][0]));
                s47 = _mm256_add_epi32(s47, _mm256_madd_epi16(v47, sc[m][1]));
            }
            // The two halves hold the even and the odd groups: rows 0-3, then 4-7.
            let half = |v: __m256i| {
                _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
            };
            let sumi = _mm256_set_m128i(half(s47), half(s03));
            let dx = _mm256_set1_ps(xb.d);
            *accj = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dv, dx), *accj);
        }
    }
    lanes_out(&acc, &[_mm256_setzero_ps(); X], n, out);
}

/// For quants vector `m`, the scales of groups `2m` (low half) and `2m + 1` (high half) of
/// rows 0-3 (`[m][0]`) and 4-7 (`[m][1]`), each twice in a row, as i16: a byte transpose of the
/// rows' sixteen scales (`rows[i]`).
#[target_feature(enable = "avx2")]
#[inline]
fn group_scales(rows: &[__m128i; LANES]) -> [[__m256i; 2]; 8] {
    // Groups 0-3, 4-7, 8-11, 12-15 of four rows (`r`, `r + 1`, `r + 2`, `r + 3`), four bytes
    // (the rows in order) per group.
    let four = |r: usize| {
        let (lo01, hi01) = (
            _mm_unpacklo_epi8(rows[r], rows[r + 1]),
            _mm_unpackhi_epi8(rows[r], rows[r + 1]),
        );
        let (lo23, hi23) = (
            _mm_unpacklo_epi8(rows[r + 2], rows[r + 3]),
            _mm_unpackhi_epi8(rows[r + 2], rows[r + 3]),
        );
        [
            _mm_unpacklo_epi16(lo01, lo23),
            _mm_unpackhi_epi16(lo01, lo23),
            _mm_unpacklo_epi16(hi01, hi23),
            _mm_unpackhi_epi16(hi01, hi23),
        ]
    };
    let (first, second) = (four(0), four(4));
    // Vector `m` takes groups `2m` and `2m + 1`: dwords `2(m % 2)` and the next of block
    // `m / 2`, each byte doubled, sign-extended (the scales are signed).
    let pick = |t: &[__m128i; 4], m: usize| {
        let v = t[m / 2];
        let doubled = if m.is_multiple_of(2) {
            _mm_unpacklo_epi8(v, v)
        } else {
            _mm_unpackhi_epi8(v, v)
        };
        _mm256_cvtepi8_epi16(doubled)
    };
    std::array::from_fn(|m| [pick(&first, m), pick(&second, m)])
}
