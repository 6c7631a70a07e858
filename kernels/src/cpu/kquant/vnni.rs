//! The AVX-512 VNNI kernel of [`super::dot_q8k`] for three or more activation rows (prefill,
//! batches) of Q2_K, Q3_K, Q4_K and IQ4_XS: eight weight rows in the eight lanes of a vector.
//! (Q5_K and Q6_K keep their AVX2 lane kernels, which this form did not beat on Zen 4.)
//!
//! Per pass of eight rows and super-block, each row's 256 quants are brought to bytes in
//! weight order (the types' own unpacking, as in `super::x86`) and transposed, so that lane
//! `i` of a vector holds four quants of row `i`. One activation dword, broadcast, then meets
//! the eight rows in one `vpdpbusd`, and four of them give each row's 16-weight group sum in
//! its `i32` lane; one `vpmulld` by the rows' group scales and an add make the super-block's
//! sum. The unpacking is shared by every activation row of the call (up to
//! [`MAX_X_VNNI`]), so it costs little against the products.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. The types whose quants are never negative
//! (Q2_K, Q4_K) multiply them by the activations as they are; the others (Q3_K, IQ4_XS)
//! multiply the activations offset to unsigned (`x + 128`) by the signed quants and
//! take `128·Σq` of each group off. Either way each row's super-block sum is the exact
//! `Σ_g sc[g]·Σ_{i∈g} q_i·x_i` (and `Σ_g m[g]·bsum[g]` for the minimums), the integers the
//! other kernels get, and it ends the same way (one fused multiply-add into the row's lane,
//! one subtraction for the minimums): a row's output is bit-identical whichever kernel
//! computed it, so decode (the row-at-a-time kernels) and prefill agree.

use std::arch::x86_64::*;

use super::q8k::{Q8KArgs, Q8KBlock};
use super::x86::{crumbs, load16, load32, where_bit};
use super::{iq4xs_scales, q3k_scales, scales_mins_k4, IQ4_LEVELS};
use crate::cpu::dequant::f16_at;
use crate::cpu::x86::transpose8;
use crate::DType;

/// Rows per pass: one per f32 lane.
const LANES: usize = 8;
/// Most activation rows one call takes.
const MAX_X_VNNI: usize = super::q8k::MAX_XK_WIDE;

/// `out[i * x_rows + j] = w_i · x_j` for `rows` weight rows against `x_rows` (at most
/// [`MAX_X_VNNI`]) activation rows.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available and `a` must satisfy the bounds
/// `dot_q8k` checks, with activation quants within ±127 (as `quantize_row_q8k` makes them).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows(a: &Q8KArgs<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    assert!(x_rows <= MAX_X_VNNI, "vnni::rows: {x_rows} activation rows");
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(LANES);
        let o = &mut out[r * x_rows..(r + n) * x_rows];
        // SAFETY: rows `r..r + n` are inside the checked rows.
        unsafe {
            match a.dtype {
                DType::Q2_K => pass::<0>(a, r, n, x_rows, o),
                DType::Q3_K => pass::<1>(a, r, n, x_rows, o),
                DType::Q4_K => pass::<2>(a, r, n, x_rows, o),
                DType::IQ4_XS => pass::<5>(a, r, n, x_rows, o),
                other => unreachable!("dot_q8k sends only this kernel's types: {other}"),
            }
        }
        r += n;
    }
}

/// Whether this kernel takes `dtype`.
pub(super) fn takes(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::IQ4_XS
    )
}

/// Type `T` of [`pass`]: 0 Q2_K, 1 Q3_K, 2 Q4_K, 5 IQ4_XS.
const fn signed(t: u8) -> bool {
    matches!(t, 1 | 5)
}
const fn has_min(t: u8) -> bool {
    matches!(t, 0 | 2)
}
const fn block_bytes(t: u8) -> usize {
    match t {
        0 => 84,
        1 => 110,
        2 => 144,
        _ => 136,
    }
}

/// One row's super-block: its quants in weight order (vector `v` holds weights
/// `32v..32v + 32`), signed for the [`signed`] types; the 16 group scales and minimums into
/// column `i` of `sc` and `m`; `d` and `dmin`.
///
/// # Safety
/// `blk` must hold a whole super-block of type `T`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn unpack_row<const T: u8>(
    blk: &[u8],
    i: usize,
    sc: &mut [[i32; LANES]; 16],
    m: &mut [[i32; LANES]; 16],
) -> ([__m256i; 8], f32, f32) {
    let mut q = [_mm256_setzero_si256(); 8];
    let nib = _mm256_set1_epi8(0x0F);
    match T {
        0 => {
            let (scales, qs) = (&blk[..16], &blk[16..80]);
            for g in 0..16 {
                sc[g][i] = i32::from(scales[g] & 0x0F);
                m[g][i] = i32::from(scales[g] >> 4);
            }
            for n in 0..2 {
                let v = load32(&qs[32 * n..]);
                for s in 0..4 {
                    q[4 * n + s] = crumbs(v, s as i32);
                }
            }
            (q, f16_at(blk, 80), f16_at(blk, 82))
        }
        1 => {
            let (hmask, qs) = (&blk[..32], &blk[32..96]);
            for (g, s) in q3k_scales(&blk[96..108]).into_iter().enumerate() {
                sc[g][i] = i32::from(s);
            }
            let hm = load32(hmask);
            let four = _mm256_set1_epi8(4);
            for n in 0..2 {
                let v = load32(&qs[32 * n..]);
                for s in 0..4 {
                    let high = where_bit(hm, 1 << (4 * n + s), 4);
                    let u = _mm256_or_si256(crumbs(v, s as i32), high);
                    q[4 * n + s] = _mm256_sub_epi8(u, four);
                }
            }
            (q, f16_at(blk, 108), 0.0)
        }
        2 => {
            let (s8, m8) = scales_mins_k4(&blk[4..16]);
            for j in 0..8 {
                for g in [2 * j, 2 * j + 1] {
                    sc[g][i] = i32::from(s8[j]);
                    m[g][i] = i32::from(m8[j]);
                }
            }
            let qs = &blk[16..144];
            for c in 0..4 {
                let v = load32(&qs[32 * c..]);
                q[2 * c] = _mm256_and_si256(v, nib);
                q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
            }
            (q, f16_at(blk, 0), f16_at(blk, 2))
        }
        _ => {
            for (b, s) in iq4xs_scales(blk).into_iter().enumerate() {
                sc[2 * b][i] = i32::from(s);
                sc[2 * b + 1][i] = i32::from(s);
            }
            let qs = &blk[8..136];
            let table = _mm256_broadcastsi128_si256(load16(&IQ4_LEVELS.map(|v| v as u8)));
            let nib16 = _mm_set1_epi8(0x0F);
            for b in 0..8 {
                let raw = load16(&qs[16 * b..]);
                let idx = _mm256_set_m128i(
                    _mm_and_si128(_mm_srli_epi16::<4>(raw), nib16),
                    _mm_and_si128(raw, nib16),
                );
                q[b] = _mm256_shuffle_epi8(table, idx);
            }
            (q, f16_at(blk, 0), 0.0)
        }
    }
}

/// The activation quants of `xb`, offset to unsigned (`x + 128`), as dwords: what the
/// [`signed`] types multiply by their quants.
#[target_feature(enable = "avx2")]
#[inline]
fn x_offset(xb: &Q8KBlock, out: &mut [i32; 64]) {
    let high = _mm256_set1_epi8(-128);
    for v in 0..8 {
        // SAFETY: 32 of the block's 256 quants, and eight dwords of `out` at `8v`.
        unsafe {
            let x = _mm256_loadu_si256(xb.qs[32 * v..].as_ptr() as *const __m256i);
            _mm256_storeu_si256(
                out[8 * v..].as_mut_ptr() as *mut __m256i,
                _mm256_xor_si256(x, high),
            );
        }
    }
}

/// Rows `r0..r0 + n` (`n` at most [`LANES`]) of type `T` against `x_rows` activation rows.
///
/// # Safety
/// As for [`rows`], with `r0 + n` at most its `rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn pass<const T: u8>(a: &Q8KArgs<'_>, r0: usize, n: usize, x_rows: usize, out: &mut [f32]) {
    let bb = block_bytes(T);
    let mut acc = [_mm256_setzero_ps(); MAX_X_VNNI];
    let mut offs = [_mm256_setzero_ps(); MAX_X_VNNI];
    let ones = _mm256_set1_epi8(1);
    // Per super-block, rows past `n` stay zero with zero scales.
    let mut rq = [[_mm256_setzero_si256(); 8]; LANES];
    let mut sc = [[0i32; LANES]; 16];
    let mut mn = [[0i32; LANES]; 16];
    let mut d = [0f32; LANES];
    let mut dmin = [0f32; LANES];
    let mut xo = [0i32; 64];
    for b in 0..a.nb {
        for i in 0..n {
            let at = (r0 + i) * a.w_stride + b * bb;
            // SAFETY: a whole super-block (the bounds `dot_q8k` checked).
            (rq[i], d[i], dmin[i]) =
                unsafe { unpack_row::<T>(&a.w[at..at + bb], i, &mut sc, &mut mn) };
        }
        // Vector `v`, dword `c`: lane `i` holds quants `32v + 4c..+ 4` of row `i`.
        let t: [[__m256i; LANES]; 8] =
            std::array::from_fn(|v| transpose8(std::array::from_fn(|i| rq[i][v])));
        // SAFETY: arrays of eight i32 / f32.
        let (scv, mnv, dv, dminv) = unsafe {
            (
                sc.map(|s| _mm256_loadu_si256(s.as_ptr() as *const __m256i)),
                mn.map(|s| _mm256_loadu_si256(s.as_ptr() as *const __m256i)),
                _mm256_loadu_ps(d.as_ptr()),
                _mm256_loadu_ps(dmin.as_ptr()),
            )
        };
        // The signed types: `128·Σq` of each row's group `g`.
        let mut corr = [_mm256_setzero_si256(); 16];
        if signed(T) {
            for (g, c) in corr.iter_mut().enumerate() {
                let (v, c0) = (g / 2, 4 * (g % 2));
                let mut s = _mm256_setzero_si256();
                for k in 0..4 {
                    s = _mm256_dpbusd_epi32(s, ones, t[v][c0 + k]);
                }
                *c = _mm256_slli_epi32::<7>(s);
            }
        }
        for j in 0..x_rows {
            let xb = &a.x[j * a.nb + b];
            // The activation dwords the products broadcast: offset for the signed types, as
            // they are for the others.
            let xp = if signed(T) {
                x_offset(xb, &mut xo);
                xo.as_ptr()
            } else {
                xb.qs.as_ptr() as *const i32
            };
            let mut sumi = _mm256_setzero_si256();
            for g in 0..16 {
                let (v, c0) = (g / 2, 4 * (g % 2));
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                for k in [0, 2] {
                    let at = 8 * v + c0 + k;
                    // SAFETY: dwords `at`, `at + 1` of the block's 64.
                    let (x0, x1) = unsafe {
                        (
                            _mm256_set1_epi32(xp.add(at).read_unaligned()),
                            _mm256_set1_epi32(xp.add(at + 1).read_unaligned()),
                        )
                    };
                    let (t0, t1) = (t[v][c0 + k], t[v][c0 + k + 1]);
                    if signed(T) {
                        s0 = _mm256_dpbusd_epi32(s0, x0, t0);
                        s1 = _mm256_dpbusd_epi32(s1, x1, t1);
                    } else {
                        s0 = _mm256_dpbusd_epi32(s0, t0, x0);
                        s1 = _mm256_dpbusd_epi32(s1, t1, x1);
                    }
                }
                let mut s = _mm256_add_epi32(s0, s1);
                if signed(T) {
                    s = _mm256_sub_epi32(s, corr[g]);
                }
                sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(s, scv[g]));
            }
            let dx = _mm256_set1_ps(xb.d);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dv, dx), acc[j]);
            if has_min(T) {
                let mut summ = _mm256_setzero_si256();
                for (g, m) in mnv.iter().enumerate() {
                    let bs = _mm256_set1_epi32(i32::from(xb.bsums[g]));
                    summ = _mm256_add_epi32(summ, _mm256_mullo_epi32(*m, bs));
                }
                offs[j] = _mm256_sub_ps(
                    offs[j],
                    _mm256_mul_ps(_mm256_mul_ps(dminv, dx), _mm256_cvtepi32_ps(summ)),
                );
            }
        }
    }
    let mut lanes = [[0f32; LANES]; 2];
    for j in 0..x_rows {
        // SAFETY: two arrays of eight floats.
        unsafe {
            _mm256_storeu_ps(lanes[0].as_mut_ptr(), acc[j]);
            _mm256_storeu_ps(lanes[1].as_mut_ptr(), offs[j]);
        }
        for i in 0..n {
            out[i * x_rows + j] = lanes[0][i] + lanes[1][i];
        }
    }
}
