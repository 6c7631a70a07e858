//! AVX2 kernels of [`super::dot_q8k`]: one weight row at a time against up to
//! [`MAX_XK`](super::q8k::MAX_XK) activation rows, each super-block's weights unpacked once
//! into byte vectors in weight order and shared by the activation rows. Q4_K, Q5_K and Q6_K
//! take these only for one or two activation rows (decode, where reading each row in order
//! matters most); more rows take the lane kernels (`super::q45k_lanes`, `super::q6k_lanes`).
//! Every kernel ends a super-block the same way (an exact integer sum, one fused
//! multiply-add), so a row's output does not depend on which kernel computed it.
//!
//! Products go through `maddubs` (unsigned weight bytes times signed activation bytes, pairs
//! summed into i16) and `madd` by the group scales (into i32). Every pair sum fits in i16:
//! the largest unsigned quant is 63 (Q6_K stored plus 32), and `2·63·127 < 2^15`; IQ4_XS's
//! signed levels move their sign onto the activations, `2·127·127 < 2^15`. The types with a
//! quant offset (Q3_K's −4, Q6_K's −32) multiply unsigned quants and take the offset off
//! through the activation group sums, in integers.

use std::arch::x86_64::*;

use super::q8k::{Q8KArgs, Q8KBlock};
use super::{iq4xs_scales, q3k_scales, scales_mins_k4, IQ4_LEVELS};
use crate::DType;

/// `dot_q8k` above the scalar level.
///
/// # Safety
/// AVX2, FMA and F16C must be available and `a` must satisfy the bounds `dot_q8k` checks.
pub(super) unsafe fn dispatch(a: &Q8KArgs<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match x_rows {
            1 => rows::<1>(a, w_rows, out),
            2 => rows::<2>(a, w_rows, out),
            3 => rows::<3>(a, w_rows, out),
            4 => rows::<4>(a, w_rows, out),
            5 => rows::<5>(a, w_rows, out),
            6 => rows::<6>(a, w_rows, out),
            7 => rows::<7>(a, w_rows, out),
            _ => rows::<8>(a, w_rows, out),
        }
    }
}

/// How far ahead, in bytes, the decode kernels prefetch the weights.
const PREFETCH_AHEAD: usize = 3072;

/// Runs `$block::<X>` over every super-block of every weight row.
macro_rules! row_loop {
    ($a:expr, $w_rows:expr, $out:expr, $X:ident, $block:ident) => {{
        let a = $a;
        let bb = a.dtype.block_bytes();
        for i in 0..$w_rows {
            let mut acc = [0f32; $X];
            let mut offs = [0f32; $X];
            for b in 0..a.nb {
                let x: [&Q8KBlock; $X] = std::array::from_fn(|j| &a.x[j * a.nb + b]);
                let at = i * a.w_stride + b * bb;
                if $X <= 2 {
                    // One or two activation rows: the weights stream from memory faster than
                    // the hardware prefetcher fetches them; ask for the block a few lines ahead. A
                    // prefetch past the matrix is harmless (never dereferenced).
                    let ahead = a.w.as_ptr().wrapping_add(at + PREFETCH_AHEAD);
                    let mut line = 0;
                    while line < bb {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                        line += 64;
                    }
                }
                $block::<$X>(&a.w[at..at + bb], &x, &mut acc, &mut offs);
            }
            for j in 0..$X {
                $out[i * $X + j] = acc[j] + offs[j];
            }
        }
    }};
}

/// # Safety
/// As for [`dispatch`], with `X` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const X: usize>(a: &Q8KArgs<'_>, w_rows: usize, out: &mut [f32]) {
    match a.dtype {
        DType::Q2_K => row_loop!(a, w_rows, out, X, q2k),
        DType::Q3_K => row_loop!(a, w_rows, out, X, q3k),
        // One or two activation rows (decode) stream the weights from memory: one row at a
        // time reads them in order, faster than eight interleaved rows, with the same
        // operations per output as the lane kernels that more rows take.
        DType::Q4_K if X <= 2 => row_loop!(a, w_rows, out, X, q4k),
        DType::Q5_K if X <= 2 => row_loop!(a, w_rows, out, X, q5k),
        DType::Q6_K if X <= 2 => row_loop!(a, w_rows, out, X, q6k),
        // SAFETY: forwarded from the caller.
        DType::Q4_K => unsafe { super::q45k_lanes::rows::<X, false>(a, w_rows, out) },
        // SAFETY: forwarded from the caller.
        DType::Q5_K => unsafe { super::q45k_lanes::rows::<X, true>(a, w_rows, out) },
        // SAFETY: forwarded from the caller.
        DType::Q6_K => unsafe { super::q6k_lanes::rows::<X>(a, w_rows, out) },
        DType::IQ4_XS => row_loop!(a, w_rows, out, X, iq4xs),
        other => unreachable!("dot_q8k checked the type: {other}"),
    }
}

#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn load32(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: 32 bytes are there (checked above); unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn load16(b: &[u8]) -> __m128i {
    assert!(b.len() >= 16);
    // SAFETY: 16 bytes are there (checked above).
    unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
}

/// The f16 at byte `i` of `b` as f32 (exact), by F16C: `half`'s conversion checks the CPU's
/// features at every call, twice a super-block here.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16c_at(b: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([b[i], b[i + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 32 activation quants from value `at`.
#[target_feature(enable = "avx2")]
#[inline]
fn xq(x: &Q8KBlock, at: usize) -> __m256i {
    let q = &x.qs[at..at + 32];
    // SAFETY: `q` holds 32 bytes.
    unsafe { _mm256_loadu_si256(q.as_ptr() as *const __m256i) }
}

/// The 16 group sums of an activation block as i16 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn bsums(x: &Q8KBlock) -> __m256i {
    // SAFETY: `bsums` is 16 i16, 32 bytes.
    unsafe { _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i) }
}

/// i16 lanes `[a ×8, b ×8]`: the scales of two 16-weight groups.
#[target_feature(enable = "avx2")]
#[inline]
fn scales2(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// Σ over pairs of `w·x` (unsigned × signed bytes), times the i16 scale of each lane, in i32.
#[target_feature(enable = "avx2")]
#[inline]
fn dot_scaled(w: __m256i, x: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), s)
}

#[target_feature(enable = "avx2")]
#[inline]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `acc += sumi·(d·d_x)` for each row, with the row's integer sum exact: the operations the
/// lane kernels (`super::q45k_lanes`, `super::q6k_lanes`) do per super-block in a row's lane,
/// so that a row gives the same bits from either.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn finish<const X: usize>(d: f32, x: &[&Q8KBlock; X], sumi: &[__m256i; X], acc: &mut [f32; X]) {
    for j in 0..X {
        acc[j] = (hsum_i32(sumi[j]) as f32).mul_add(d * x[j].d, acc[j]);
    }
}

/// Bits `2s..2s + 2` of each byte of `q` (a variable shift: `s` comes from a loop).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn crumbs(q: __m256i, s: i32) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)),
        _mm256_set1_epi8(3),
    )
}

/// Bits `2s..2s + 2` of each byte of `h`, moved to bits 4 and 5.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn high2(h: __m256i, s: i32) -> __m256i {
    _mm256_slli_epi16::<4>(crumbs(h, s))
}

/// `val` in each byte of `bits` whose bit `mask` is set, 0 elsewhere.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn where_bit(bits: __m256i, mask: u8, val: i8) -> __m256i {
    let m = _mm256_set1_epi8(mask as i8);
    _mm256_and_si256(
        _mm256_cmpeq_epi8(_mm256_and_si256(bits, m), m),
        _mm256_set1_epi8(val),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q2k<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], offs: &mut [f32; X]) {
    let (scales, qs) = (&blk[..16], &blk[16..80]);
    let (d, dmin) = (f16c_at(blk, 80), f16c_at(blk, 82));
    let raw = _mm256_cvtepu8_epi16(load16(scales));
    let mins = _mm256_srli_epi16::<4>(raw);
    for j in 0..X {
        let m = hsum_i32(_mm256_madd_epi16(bsums(x[j]), mins));
        offs[j] -= dmin * x[j].d * m as f32;
    }
    let mut sumi = [_mm256_setzero_si256(); X];
    for n in 0..2 {
        let q = load32(&qs[32 * n..]);
        for s in 0..4 {
            let g = 8 * n + 2 * s as usize;
            let w = crumbs(q, s);
            let sc = scales2(i16::from(scales[g] & 0x0F), i16::from(scales[g + 1] & 0x0F));
            for j in 0..X {
                let p = dot_scaled(w, xq(x[j], 16 * g), sc);
                sumi[j] = _mm256_add_epi32(sumi[j], p);
            }
        }
    }
    finish(d, x, &sumi, acc);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3k<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], _offs: &mut [f32; X]) {
    let (hmask, qs) = (&blk[..32], &blk[32..96]);
    let d = f16c_at(blk, 108);
    let sc = q3k_scales(&blk[96..108]);
    let hm = load32(hmask);
    // The −4 offset of every quant whose high bit is clear: the quants are multiplied as
    // `low + 4·high` (0..8) and `4·Σ_g sc[g]·bsum[g]` comes off.
    let sc16 = _mm256_cvtepi8_epi16(load16(&sc.map(|v| v as u8)));
    let mut sumi = [_mm256_setzero_si256(); X];
    for j in 0..X {
        let off = _mm256_madd_epi16(bsums(x[j]), sc16);
        sumi[j] = _mm256_sub_epi32(sumi[j], _mm256_slli_epi32::<2>(off));
    }
    for n in 0..2 {
        let q = load32(&qs[32 * n..]);
        for s in 0..4 {
            let g = 8 * n + 2 * s as usize;
            let high = where_bit(hm, 1 << (4 * n + s as usize), 4);
            let w = _mm256_or_si256(crumbs(q, s), high);
            let scv = scales2(i16::from(sc[g]), i16::from(sc[g + 1]));
            for j in 0..X {
                let p = dot_scaled(w, xq(x[j], 16 * g), scv);
                sumi[j] = _mm256_add_epi32(sumi[j], p);
            }
        }
    }
    finish(d, x, &sumi, acc);
}

/// Q4_K and Q5_K (`qh` holds Q5_K's fifth bits).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q45k<const X: usize>(
    blk: &[u8],
    qh: Option<&[u8]>,
    qs: &[u8],
    x: &[&Q8KBlock; X],
    acc: &mut [f32; X],
    offs: &mut [f32; X],
) {
    let (d, dmin) = (f16c_at(blk, 0), f16c_at(blk, 2));
    let (s8, m8) = scales_mins_k4(&blk[4..16]);
    // The eight scales as i16 in both halves; each pass picks its two by a byte shuffle.
    let s = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(s8)));
    let s = _mm256_set_m128i(s, s);
    // Each minimum twice, as i16: the minimums of the 16-value groups the activation sums
    // come in.
    let m = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(m8)));
    let mins = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    for j in 0..X {
        let m = hsum_i32(_mm256_madd_epi16(bsums(x[j]), mins));
        offs[j] -= dmin * x[j].d * m as f32;
    }
    let hb = qh.map(|qh| load32(qh));
    let nib = _mm256_set1_epi8(0x0F);
    let mut sumi = [_mm256_setzero_si256(); X];
    for c in 0..4 {
        let q = load32(&qs[32 * c..]);
        let mut lo = _mm256_and_si256(q, nib);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nib);
        if let Some(hb) = hb {
            lo = _mm256_or_si256(lo, where_bit(hb, 1 << (2 * c), 16));
            hi = _mm256_or_si256(hi, where_bit(hb, 2 << (2 * c), 16));
        }
        // Scales 2c and 2c + 1 in every lane: a byte shuffle of the i16 scales (the same
        // eight in both halves, as the shuffle keeps to its half).
        let word = |w: i8| _mm256_set1_epi16(i16::from(2 * w) | (i16::from(2 * w + 1) << 8));
        let (s_lo, s_hi) = (
            _mm256_shuffle_epi8(s, word(2 * c as i8)),
            _mm256_shuffle_epi8(s, word(2 * c as i8 + 1)),
        );
        for j in 0..X {
            let p = _mm256_add_epi32(
                dot_scaled(lo, xq(x[j], 64 * c), s_lo),
                dot_scaled(hi, xq(x[j], 64 * c + 32), s_hi),
            );
            sumi[j] = _mm256_add_epi32(sumi[j], p);
        }
    }
    finish(d, x, &sumi, acc);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q4k<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], offs: &mut [f32; X]) {
    q45k(blk, None, &blk[16..144], x, acc, offs);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q5k<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], offs: &mut [f32; X]) {
    q45k(blk, Some(&blk[16..48]), &blk[48..176], x, acc, offs);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q6k<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], _offs: &mut [f32; X]) {
    let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
    let d = f16c_at(blk, 208);
    // Quants are multiplied as stored (0..64); `32·Σ_g sc[g]·bsum[g]` comes off.
    let sc16 = _mm256_cvtepi8_epi16(load16(scales));
    let mut sumi = [_mm256_setzero_si256(); X];
    for j in 0..X {
        let off = _mm256_madd_epi16(bsums(x[j]), sc16);
        sumi[j] = _mm256_sub_epi32(sumi[j], _mm256_slli_epi32::<5>(off));
    }
    let nib = _mm256_set1_epi8(0x0F);
    for n in 0..2 {
        let l0 = load32(&ql[64 * n..]);
        let l1 = load32(&ql[64 * n + 32..]);
        let h = load32(&qh[32 * n..]);
        let w = [
            _mm256_or_si256(_mm256_and_si256(l0, nib), high2(h, 0)),
            _mm256_or_si256(_mm256_and_si256(l1, nib), high2(h, 1)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), nib),
                high2(h, 2),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), nib),
                high2(h, 3),
            ),
        ];
        for (k, wk) in w.into_iter().enumerate() {
            let g = 8 * n + 2 * k;
            let scv = scales2(i16::from(scales[g] as i8), i16::from(scales[g + 1] as i8));
            for j in 0..X {
                let p = dot_scaled(wk, xq(x[j], 16 * g), scv);
                sumi[j] = _mm256_add_epi32(sumi[j], p);
            }
        }
    }
    finish(d, x, &sumi, acc);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn iq4xs<const X: usize>(blk: &[u8], x: &[&Q8KBlock; X], acc: &mut [f32; X], _offs: &mut [f32; X]) {
    let d = f16c_at(blk, 0);
    let sc = iq4xs_scales(blk);
    let qs = &blk[8..136];
    let table = _mm256_broadcastsi128_si256(load16(&IQ4_LEVELS.map(|v| v as u8)));
    let nib = _mm_set1_epi8(0x0F);
    let mut sumi = [_mm256_setzero_si256(); X];
    for (b, &s) in sc.iter().enumerate() {
        let raw = load16(&qs[16 * b..]);
        let idx = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16::<4>(raw), nib),
            _mm_and_si128(raw, nib),
        );
        let w = _mm256_shuffle_epi8(table, idx);
        // |w| times the activations with w's sign.
        let aw = _mm256_sign_epi8(w, w);
        let scv = _mm256_set1_epi16(i16::from(s));
        for j in 0..X {
            let sx = _mm256_sign_epi8(xq(x[j], 32 * b), w);
            sumi[j] = _mm256_add_epi32(sumi[j], dot_scaled(aw, sx, scv));
        }
    }
    finish(d, x, &sumi, acc);
}
