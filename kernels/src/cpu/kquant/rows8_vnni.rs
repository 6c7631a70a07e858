//! The AVX-512 VNNI kernels of [`super::dot_q8k`] for Q4_K and Q6_K matrices in the
//! interleaved layout (`super::rows8`): eight weight rows in the eight lanes of a vector.
//!
//! A tile's 32-byte loads each hold four quants of every row, so one activation dword,
//! broadcast, meets the eight rows in one `vpdpbusd`: per 32 weights of eight rows, a load, a
//! mask (and a shift) and one product per activation row, against the row-at-a-time kernels'
//! two multiplies, an add and the unpacking per row. The group scales multiply each row's
//! group sum in its lane (`vpmulld`), the minimums' and offsets' terms come from the
//! activation group sums through `vpdpwssd`, and each super-block ends as in every other
//! kernel: the exact integer sum, one fused multiply-add into the row's lane, one subtraction
//! for the minimums. A row's output is the same bits whichever kernel or layout computed it.

use std::arch::x86_64::*;

use super::q8k::{Q8KArgs, Q8KBlock};
use super::rows8::GROUP;
use crate::cpu::x86::lanes_out;
use crate::DType;

/// Most activation rows one pass over a group takes: the Q6_K pass holds four accumulators
/// per activation row.
const X_PASS: usize = 4;

/// `out[i * x_rows + j] = w_i · x_j` for `rows` (a multiple of eight) weight rows in the
/// interleaved layout, from the group at the start of `a.w`, against `x_rows` activation
/// rows.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `a.w` must hold `rows / 8`
/// whole groups of `a.nb` tiles of `a.dtype` (Q4_K or Q6_K), `a.x` `x_rows · a.nb` blocks
/// with quants within ±127, and `out` `rows · x_rows` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows(a: &Q8KArgs<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    let tile = GROUP * a.dtype.block_bytes();
    assert!(
        rows.is_multiple_of(GROUP)
            && a.w.len() >= rows / GROUP * a.nb * tile
            && a.x.len() >= x_rows * a.nb
            && out.len() >= rows * x_rows,
        "rows8_vnni::rows: {rows} rows x {x_rows}"
    );
    let mut vals = [0f32; GROUP * X_PASS];
    for grp in 0..rows / GROUP {
        let w = &a.w[grp * a.nb * tile..(grp + 1) * a.nb * tile];
        let mut j0 = 0;
        while j0 < x_rows {
            let xn = (x_rows - j0).min(X_PASS);
            let x = &a.x[j0 * a.nb..(j0 + xn) * a.nb];
            // SAFETY: `w` is one whole group, `x` holds `xn` rows of `a.nb` blocks.
            unsafe {
                match (a.dtype, xn) {
                    (DType::Q4_K, 1) => q4k::<1>(w, x, a.nb, &mut vals),
                    (DType::Q4_K, 2) => q4k::<2>(w, x, a.nb, &mut vals),
                    (DType::Q4_K, 3) => q4k::<3>(w, x, a.nb, &mut vals),
                    (DType::Q4_K, _) => q4k::<4>(w, x, a.nb, &mut vals),
                    (DType::Q6_K, 1) => q6k::<1>(w, x, a.nb, &mut vals),
                    (DType::Q6_K, 2) => q6k::<2>(w, x, a.nb, &mut vals),
                    (DType::Q6_K, 3) => q6k::<3>(w, x, a.nb, &mut vals),
                    (DType::Q6_K, _) => q6k::<4>(w, x, a.nb, &mut vals),
                    (other, _) => unreachable!("only the interleaved types come here: {other}"),
                }
            }
            for i in 0..GROUP {
                for j in 0..xn {
                    out[(grp * GROUP + i) * x_rows + j0 + j] = vals[i * xn + j];
                }
            }
            j0 += xn;
        }
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer has 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Activation quants `at..at + 4` in every dword.
#[target_feature(enable = "avx2")]
#[inline]
fn bcast(x: &Q8KBlock, at: usize) -> __m256i {
    let q = &x.qs[at..at + 4];
    _mm256_set1_epi32(i32::from_le_bytes([
        q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8,
    ]))
}

/// The pair of activation group sums `2p, 2p + 1` in every dword.
#[target_feature(enable = "avx2")]
#[inline]
fn bsum_pair(x: &Q8KBlock, p: usize) -> __m256i {
    let (lo, hi) = (x.bsums[2 * p] as u16, x.bsums[2 * p + 1] as u16);
    _mm256_set1_epi32((u32::from(lo) | (u32::from(hi) << 16)) as i32)
}

/// Byte `j` of each dword's bytes as that dword (`pair`: as both i16 halves).
#[target_feature(enable = "avx2")]
#[inline]
fn spread(j: usize, pair: bool) -> __m256i {
    let mut c = [-1i8; 32];
    for k in 0..8 {
        let at = 4 * (k % 4) + j;
        c[4 * k] = at as i8;
        if pair {
            c[4 * k + 2] = at as i8;
        }
    }
    // SAFETY: 32 bytes.
    unsafe { _mm256_loadu_si256(c.as_ptr() as *const __m256i) }
}

/// One group of Q4_K rows against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`rows`]: `w` one group of `nb` Q4_K tiles, `x` `X` rows of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4k<const X: usize>(w: &[u8], x: &[Q8KBlock], nb: usize, vals: &mut [f32]) {
    const TILE: usize = GROUP * 144;
    assert!(w.len() >= nb * TILE && x.len() >= X * nb && vals.len() >= GROUP * X);
    let nib = _mm256_set1_epi8(0x0F);
    let (low6, low4, low2) = (
        _mm256_set1_epi8(0x3F),
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x03),
    );
    let one: [__m256i; 4] = std::array::from_fn(|j| spread(j, false));
    let two: [__m256i; 4] = std::array::from_fn(|j| spread(j, true));
    let mut acc = [_mm256_setzero_ps(); X];
    let mut offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * TILE..(b + 1) * TILE].as_ptr();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(t as *const __m128i));
            let dminv = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i));
            let (u0, u1, u2) = (load(t.add(32)), load(t.add(64)), load(t.add(96)));
            // Each lane's four bytes: scales 0-3, 4-7 and minimums 0-3, 4-7 of its row.
            let sc_lo = _mm256_and_si256(u0, low6);
            let sc_hi = _mm256_or_si256(
                _mm256_and_si256(u2, low4),
                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u0), low2)),
            );
            let mn_lo = _mm256_and_si256(u1, low6);
            let mn_hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(u2), low4),
                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), low2)),
            );
            let sc: [__m256i; 8] = std::array::from_fn(|g| {
                _mm256_shuffle_epi8(if g < 4 { sc_lo } else { sc_hi }, one[g % 4])
            });
            let mut sumi = [_mm256_setzero_si256(); X];
            let mut msum = [_mm256_setzero_si256(); X];
            for p in 0..8 {
                let m = _mm256_shuffle_epi8(if p < 4 { mn_lo } else { mn_hi }, two[p % 4]);
                for j in 0..X {
                    msum[j] = _mm256_dpwssd_epi32(msum[j], m, bsum_pair(&x[j * nb + b], p));
                }
            }
            for c in 0..4 {
                let mut lo = [_mm256_setzero_si256(); X];
                let mut hi = [_mm256_setzero_si256(); X];
                for s in 0..8 {
                    let v = load(t.add(128 + 256 * c + 32 * s));
                    let (wl, wh) = (
                        _mm256_and_si256(v, nib),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
                    );
                    for j in 0..X {
                        let xb = &x[j * nb + b];
                        lo[j] = _mm256_dpbusd_epi32(lo[j], wl, bcast(xb, 64 * c + 4 * s));
                        hi[j] = _mm256_dpbusd_epi32(hi[j], wh, bcast(xb, 64 * c + 32 + 4 * s));
                    }
                }
                for j in 0..X {
                    let s = _mm256_add_epi32(
                        _mm256_mullo_epi32(lo[j], sc[2 * c]),
                        _mm256_mullo_epi32(hi[j], sc[2 * c + 1]),
                    );
                    sumi[j] = _mm256_add_epi32(sumi[j], s);
                }
            }
            for j in 0..X {
                let dx = _mm256_set1_ps(x[j * nb + b].d);
                acc[j] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(dv, dx), acc[j]);
                offs[j] = _mm256_sub_ps(
                    offs[j],
                    _mm256_mul_ps(_mm256_mul_ps(dminv, dx), _mm256_cvtepi32_ps(msum[j])),
                );
            }
        }
    }
    lanes_out(&acc, &offs, GROUP, vals);
}

/// One group of Q6_K rows against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`q4k`], with Q6_K tiles.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6k<const X: usize>(w: &[u8], x: &[Q8KBlock], nb: usize, vals: &mut [f32]) {
    const TILE: usize = GROUP * 210;
    assert!(w.len() >= nb * TILE && x.len() >= X * nb && vals.len() >= GROUP * X);
    let nib = _mm256_set1_epi8(0x0F);
    let top = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); X];
    let offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * TILE..(b + 1) * TILE].as_ptr();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(t as *const __m128i));
            let sc: [__m256i; 16] = std::array::from_fn(|g| {
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(t.add(16 + 8 * g) as *const __m128i))
            });
            // Quants are multiplied as stored (0..64); `32·Σ_g sc[g]·bsum[g]` comes off.
            let mut sumi = [_mm256_setzero_si256(); X];
            for p in 0..8 {
                let v = _mm_loadu_si128(t.add(16 + 16 * p) as *const __m128i);
                // Each lane: the row's scales of groups 2p and 2p + 1, as i16.
                let pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128::<8>(v)));
                for j in 0..X {
                    sumi[j] = _mm256_dpwssd_epi32(sumi[j], pair, bsum_pair(&x[j * nb + b], p));
                }
            }
            for s in sumi.iter_mut() {
                *s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(*s));
            }
            for n in 0..2 {
                for half in 0..2 {
                    let mut a = [[_mm256_setzero_si256(); X]; 4];
                    for s in 4 * half..4 * half + 4 {
                        let at = 144 + 96 * (8 * n + s);
                        let (l0, l1, h) =
                            (load(t.add(at)), load(t.add(at + 32)), load(t.add(at + 64)));
                        let q = [
                            _mm256_or_si256(
                                _mm256_and_si256(l0, nib),
                                _mm256_and_si256(_mm256_slli_epi16::<4>(h), top),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(l1, nib),
                                _mm256_and_si256(_mm256_slli_epi16::<2>(h), top),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), nib),
                                _mm256_and_si256(h, top),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), nib),
                                _mm256_and_si256(_mm256_srli_epi16::<2>(h), top),
                            ),
                        ];
                        for (k, qk) in q.into_iter().enumerate() {
                            for j in 0..X {
                                let xv = bcast(&x[j * nb + b], 128 * n + 32 * k + 4 * s);
                                a[k][j] = _mm256_dpbusd_epi32(a[k][j], qk, xv);
                            }
                        }
                    }
                    for (k, ak) in a.iter().enumerate() {
                        let scale = sc[8 * n + 2 * k + half];
                        for j in 0..X {
                            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(ak[j], scale));
                        }
                    }
                }
            }
            for j in 0..X {
                let dx = _mm256_set1_ps(x[j * nb + b].d);
                acc[j] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(dv, dx), acc[j]);
            }
        }
    }
    lanes_out(&acc, &offs, GROUP, vals);
}
