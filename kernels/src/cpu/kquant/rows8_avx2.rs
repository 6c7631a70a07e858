//! The AVX2 kernels of [`super::dot_q8k`] for Q4_K, Q5_K, Q6_K and IQ4_XS matrices in the
//! interleaved layout (`super::rows8`), for the levels without AVX-512 VNNI: the broadcast form
//! of `super::rows8_vnni` with `vpmaddubsw` and `vpmaddwd` in place of `vpdpbusd`.
//!
//! Each activation dword, broadcast, meets four quants of eight rows, and the eight rows' sums
//! stay in the eight lanes of a vector: the per-row work of the row kernels (`super::x86`:
//! the scales unpacked by scalar code, a horizontal sum and a scalar multiply-add per
//! super-block and activation row) is done once for eight rows.
//!
//! - Q4_K and Q5_K sum the pair products of several steps in `i16` before one `vpmaddwd` by
//!   the rows' group scales: eight steps of Q4_K (at most `8·2·15·127 < 2^15`), four of Q5_K
//!   (`4·2·31·127 < 2^15`). The minimums' term comes from the activation group sums.
//! - Q6_K multiplies its quants as stored (0..64, pairs at most `2·63·127`) and takes
//!   `32·Σ sc·bsum` off through the activation group sums.
//! - IQ4_XS moves the levels' signs onto the activations (`vpsignb`) and multiplies their
//!   magnitudes (pairs at most `2·127·127`).
//!
//! Every super-block's integer sum is exact and ends as in the row kernels (one fused
//! multiply-add into the row's lane, one subtraction for the minimums), so a row gives the
//! same bits from either layout.

use std::arch::x86_64::*;

use super::q45k_lanes::fifth_bit;
use super::q8k::{Q8KArgs, Q8KBlock};
use super::rows8::GROUP;
use super::rows8_vnni::{
    bcast, bsum_pair, end_block, iq4xs_scales, load, q45k_scales, q6k_quants, spread,
};
use super::IQ4_LEVELS;
use crate::cpu::x86::lanes_out;
use crate::DType;

/// Most activation rows one pass over a group takes for `dtype`: as many as keep the pass's
/// accumulators, weights and constants in the sixteen vector registers (Q4_K holds three
/// vectors per activation row, Q5_K also its fifth bits' masks).
fn x_pass(dtype: DType) -> usize {
    match dtype {
        DType::Q4_K => 3,
        DType::Q5_K => 2,
        _ => 4,
    }
}

/// `out[i * x_rows + j] = w_i · x_j` for `rows` (a multiple of eight) weight rows in the
/// interleaved layout, from the group at the start of `a.w`, against `x_rows` activation
/// rows.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `a.w` must hold `rows / 8` whole groups of `a.nb`
/// tiles of `a.dtype` (Q4_K, Q5_K, Q6_K or IQ4_XS), `a.x` `x_rows · a.nb` blocks with quants
/// within ±127, and `out` `rows · x_rows` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(a: &Q8KArgs<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    let group = a.nb * GROUP * a.dtype.block_bytes();
    assert!(
        rows.is_multiple_of(GROUP)
            && a.w.len() >= rows / GROUP * group
            && a.x.len() >= x_rows * a.nb
            && out.len() >= rows * x_rows,
        "rows8_avx2::rows: {rows} rows x {x_rows}"
    );
    let mut vals = [0f32; GROUP * 4];
    let pass = x_pass(a.dtype);
    for g in 0..rows / GROUP {
        let w = &a.w[g * group..(g + 1) * group];
        let mut j0 = 0;
        while j0 < x_rows {
            let xn = (x_rows - j0).min(pass);
            let x = &a.x[j0 * a.nb..(j0 + xn) * a.nb];
            // SAFETY: `w` is one whole group, `x` holds `xn` rows of `a.nb` blocks; the caller
            // vouches for the features.
            unsafe {
                macro_rules! pick {
                    ($kernel:ident $(, $five:expr)?) => {
                        match xn {
                            1 => $kernel::<1 $(, $five)?>(w, x, a.nb, &mut vals),
                            2 => $kernel::<2 $(, $five)?>(w, x, a.nb, &mut vals),
                            3 => $kernel::<3 $(, $five)?>(w, x, a.nb, &mut vals),
                            _ => $kernel::<4 $(, $five)?>(w, x, a.nb, &mut vals),
                        }
                    };
                }
                match a.dtype {
                    DType::Q4_K => pick!(q45k, false),
                    DType::Q5_K => pick!(q45k, true),
                    DType::Q6_K => pick!(q6k),
                    DType::IQ4_XS => pick!(iq4xs),
                    other => {
                        unreachable!("only the interleaved super-block types come here: {other}")
                    }
                }
            }
            for i in 0..GROUP {
                for j in 0..xn {
                    out[(g * GROUP + i) * x_rows + j0 + j] = vals[i * xn + j];
                }
            }
            j0 += xn;
        }
    }
}

/// Each lane's i32 as both i16 halves of that lane (values within i16).
#[target_feature(enable = "avx2")]
#[inline]
fn i16_pair(v: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
        _mm256_slli_epi32::<16>(v),
    )
}

/// One group of Q4_K rows (Q5_K with `FIVE`) against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`rows`]: `w` holds one group of `nb` Q4_K (Q5_K) tiles, `x` `X` rows of `nb`
/// blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k<const X: usize, const FIVE: bool>(
    w: &[u8],
    x: &[Q8KBlock],
    nb: usize,
    vals: &mut [f32],
) {
    let tile = GROUP * if FIVE { 176 } else { 144 };
    // Where the quants start in a tile: Q5_K's fifth bits come before them.
    let qs = if FIVE { 384 } else { 128 };
    // Steps whose pair sums add up in i16 (see the module's comment).
    let steps = if FIVE { 4 } else { 8 };
    assert!(w.len() >= nb * tile && x.len() >= X * nb && vals.len() >= GROUP * X);
    let nib = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let two: [__m256i; 4] = std::array::from_fn(|j| spread(j, true));
    let mut acc = [[_mm256_setzero_ps(); X]];
    let mut offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * tile..][..tile].as_ptr();
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let dminv = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i));
            let [sc_lo, sc_hi, mn_lo, mn_hi] = q45k_scales(t);
            // Scale or minimum `k` of each row as both i16 halves of its lane.
            let pick = |lo: __m256i, hi: __m256i, k: usize| {
                _mm256_shuffle_epi8(if k < 4 { lo } else { hi }, two[k % 4])
            };
            let mut msum = [_mm256_setzero_si256(); X];
            for p in 0..8 {
                let m = pick(mn_lo, mn_hi, p);
                for j in 0..X {
                    msum[j] = _mm256_add_epi32(msum[j], _mm256_madd_epi16(m, bsum_pair(xb[j], p)));
                }
            }
            for j in 0..X {
                let dx = _mm256_set1_ps(xb[j].d);
                offs[j] = _mm256_sub_ps(
                    offs[j],
                    _mm256_mul_ps(_mm256_mul_ps(dminv, dx), _mm256_cvtepi32_ps(msum[j])),
                );
            }
            let mut sumi = [[_mm256_setzero_si256(); X]];
            for c in 0..4 {
                let (s_lo, s_hi) = (pick(sc_lo, sc_hi, 2 * c), pick(sc_lo, sc_hi, 2 * c + 1));
                for s0 in (0..8).step_by(steps) {
                    let mut lo = [_mm256_setzero_si256(); X];
                    let mut hi = [_mm256_setzero_si256(); X];
                    for s in s0..s0 + steps {
                        let v = load(t.add(qs + 256 * c + 32 * s));
                        let mut wl = _mm256_and_si256(v, nib);
                        let mut wh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                        if FIVE {
                            // Bits `2c` and `2c + 1` of the rows' `qh` bytes, to bit 4.
                            let h = load(t.add(128 + 32 * s));
                            wl = _mm256_or_si256(wl, fifth_bit(h, 2 * c, sixteen));
                            wh = _mm256_or_si256(wh, fifth_bit(h, 2 * c + 1, sixteen));
                        }
                        for j in 0..X {
                            let xl = bcast(xb[j], 64 * c + 4 * s);
                            let xh = bcast(xb[j], 64 * c + 32 + 4 * s);
                            lo[j] = _mm256_add_epi16(lo[j], _mm256_maddubs_epi16(wl, xl));
                            hi[j] = _mm256_add_epi16(hi[j], _mm256_maddubs_epi16(wh, xh));
                        }
                    }
                    for j in 0..X {
                        let s = _mm256_add_epi32(
                            _mm256_madd_epi16(lo[j], s_lo),
                            _mm256_madd_epi16(hi[j], s_hi),
                        );
                        sumi[0][j] = _mm256_add_epi32(sumi[0][j], s);
                    }
                }
            }
            end_block(&[t], &xb, &sumi, &mut acc);
        }
    }
    lanes_out(&acc[0], &offs, GROUP, vals);
}

/// One group of Q6_K rows against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`q45k`], with Q6_K tiles.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const X: usize>(w: &[u8], x: &[Q8KBlock], nb: usize, vals: &mut [f32]) {
    const TILE: usize = GROUP * 210;
    assert!(w.len() >= nb * TILE && x.len() >= X * nb && vals.len() >= GROUP * X);
    let mut acc = [[_mm256_setzero_ps(); X]];
    let offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * TILE..][..TILE].as_ptr();
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside the tile.
        unsafe {
            // Quants are multiplied as stored (0..64); `32·Σ_g sc[g]·bsum[g]` comes off.
            let mut sumi = [[_mm256_setzero_si256(); X]];
            for p in 0..8 {
                let v = _mm_loadu_si128(t.add(16 + 16 * p) as *const __m128i);
                // Each lane: the row's scales of groups 2p and 2p + 1, as i16.
                let pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128::<8>(v)));
                for j in 0..X {
                    let m = _mm256_madd_epi16(pair, bsum_pair(xb[j], p));
                    sumi[0][j] = _mm256_add_epi32(sumi[0][j], m);
                }
            }
            for v in sumi[0].iter_mut() {
                *v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(*v));
            }
            for n in 0..2 {
                for half in 0..2 {
                    // The scales of groups `8n + 2k + half`, each row's in its lane as i16
                    // twice.
                    let sc: [__m256i; 4] = std::array::from_fn(|k| {
                        i16_pair(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            t.add(16 + 8 * (8 * n + 2 * k + half)) as *const __m128i,
                        )))
                    });
                    for s in 4 * half..4 * half + 4 {
                        let q = q6k_quants(t.add(144 + 96 * (8 * n + s)));
                        for k in 0..4 {
                            for j in 0..X {
                                let xv = bcast(xb[j], 128 * n + 32 * k + 4 * s);
                                let p = _mm256_maddubs_epi16(q[k], xv);
                                sumi[0][j] =
                                    _mm256_add_epi32(sumi[0][j], _mm256_madd_epi16(p, sc[k]));
                            }
                        }
                    }
                }
            }
            end_block(&[t], &xb, &sumi, &mut acc);
        }
    }
    lanes_out(&acc[0], &offs, GROUP, vals);
}

/// One group of IQ4_XS rows against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`q45k`], with IQ4_XS tiles.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs<const X: usize>(w: &[u8], x: &[Q8KBlock], nb: usize, vals: &mut [f32]) {
    const TILE: usize = GROUP * 136;
    assert!(w.len() >= nb * TILE && x.len() >= X * nb && vals.len() >= GROUP * X);
    let nib = _mm256_set1_epi8(0x0F);
    // SAFETY: 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe {
        _mm_loadu_si128(IQ4_LEVELS.as_ptr() as *const __m128i)
    });
    let mut acc = [[_mm256_setzero_ps(); X]];
    let offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * TILE..][..TILE].as_ptr();
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let sc = iq4xs_scales(t);
            let mut sumi = [[_mm256_setzero_si256(); X]];
            for (s, &scale) in sc.iter().enumerate() {
                let scv = i16_pair(scale);
                for q in 0..4 {
                    let v = load(t.add(64 + 128 * s + 32 * q));
                    let wl = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
                    let wh = _mm256_shuffle_epi8(
                        table,
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
                    );
                    let (al, ah) = (_mm256_sign_epi8(wl, wl), _mm256_sign_epi8(wh, wh));
                    for j in 0..X {
                        let xl = _mm256_sign_epi8(bcast(xb[j], 32 * s + 4 * q), wl);
                        let xh = _mm256_sign_epi8(bcast(xb[j], 32 * s + 16 + 4 * q), wh);
                        let p = _mm256_add_epi32(
                            _mm256_madd_epi16(_mm256_maddubs_epi16(al, xl), scv),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(ah, xh), scv),
                        );
                        sumi[0][j] = _mm256_add_epi32(sumi[0][j], p);
                    }
                }
            }
            end_block(&[t], &xb, &sumi, &mut acc);
        }
    }
    lanes_out(&acc[0], &offs, GROUP, vals);
}
