//! The AVX-512 VNNI kernels of [`super::dot_q8k`] for Q4_K, Q5_K, Q6_K and IQ4_XS matrices in
//! the interleaved layout (`super::rows8`): eight weight rows in the eight lanes of a vector.
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

use super::q45k_lanes::fifth_bit;
use super::q8k::{Q8KArgs, Q8KBlock};
use super::rows8::GROUP;
use super::IQ4_LEVELS;
use crate::cpu::x86::lanes_out;
use crate::DType;

/// Most activation rows one pass takes: the Q4_K pass holds three accumulators per
/// activation row and group.
const X_PASS: usize = 4;
/// Most groups one pass takes where the activation rows are many: each activation dword,
/// loaded and broadcast once, meets the same four columns of both groups (sixteen rows),
/// halving the broadcast loads that bound these kernels there.
const G_PASS: usize = 2;

/// `out[i * x_rows + j] = w_i · x_j` for `rows` (a multiple of eight) weight rows in the
/// interleaved layout, from the group at the start of `a.w`, against `x_rows` activation
/// rows.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `a.w` must hold `rows / 8`
/// whole groups of `a.nb` tiles of `a.dtype` (Q4_K, Q6_K or IQ4_XS), `a.x` `x_rows · a.nb`
/// blocks with quants within ±127, and `out` `rows · x_rows` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows(a: &Q8KArgs<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    let group = a.nb * GROUP * a.dtype.block_bytes();
    assert!(
        rows.is_multiple_of(GROUP)
            && a.w.len() >= rows / GROUP * group
            && a.x.len() >= x_rows * a.nb
            && out.len() >= rows * x_rows,
        "rows8_vnni::rows: {rows} rows x {x_rows}"
    );
    let mut vals = [0f32; G_PASS * GROUP * X_PASS];
    // One activation row (decode) streams the weights from memory: one group at a time keeps
    // one stream per thread, which the prefetchers follow best; more rows are compute-bound.
    let g_pass = if x_rows >= X_PASS { G_PASS } else { 1 };
    let mut g0 = 0;
    while g0 < rows / GROUP {
        let gn = (rows / GROUP - g0).min(g_pass);
        let w = &a.w[g0 * group..(g0 + gn) * group];
        // Q6_K holds four accumulators per activation row and group: three rows for two
        // groups.
        let x_pass = if a.dtype == DType::Q6_K && gn == 2 {
            3
        } else {
            X_PASS
        };
        let mut j0 = 0;
        while j0 < x_rows {
            let xn = (x_rows - j0).min(x_pass);
            let x = &a.x[j0 * a.nb..(j0 + xn) * a.nb];
            // SAFETY: `w` is `gn` whole groups, `x` holds `xn` rows of `a.nb` blocks.
            unsafe {
                macro_rules! pick {
                    ($kernel:ident $(, $five:expr)?) => {
                        match (gn, xn) {
                            (1, 1) => $kernel::<1, 1 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (1, 2) => $kernel::<2, 1 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (1, 3) => $kernel::<3, 1 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (1, _) => $kernel::<4, 1 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (_, 1) => $kernel::<1, 2 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (_, 2) => $kernel::<2, 2 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (_, 3) => $kernel::<3, 2 $(, $five)?>(w, group, x, a.nb, &mut vals),
                            (_, _) => $kernel::<4, 2 $(, $five)?>(w, group, x, a.nb, &mut vals),
                        }
                    };
                }
                match a.dtype {
                    DType::Q4_K => pick!(q45k, false),
                    DType::Q5_K => pick!(q45k, true),
                    DType::Q6_K => pick!(q6k),
                    DType::IQ4_XS => pick!(iq4xs),
                    other => unreachable!("only the interleaved types come here: {other}"),
                }
            }
            for i in 0..gn * GROUP {
                for j in 0..xn {
                    out[(g0 * GROUP + i) * x_rows + j0 + j] = vals[i * xn + j];
                }
            }
            j0 += xn;
        }
        g0 += gn;
    }
}

#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer has 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Activation quants `at..at + 4` in every dword.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn bcast(x: &Q8KBlock, at: usize) -> __m256i {
    let q = &x.qs[at..at + 4];
    _mm256_set1_epi32(i32::from_le_bytes([
        q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8,
    ]))
}

/// The pair of activation group sums `2p, 2p + 1` in every dword.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn bsum_pair(x: &Q8KBlock, p: usize) -> __m256i {
    let (lo, hi) = (x.bsums[2 * p] as u16, x.bsums[2 * p + 1] as u16);
    _mm256_set1_epi32((u32::from(lo) | (u32::from(hi) << 16)) as i32)
}

/// Byte `j` of each dword's bytes as that dword (`pair`: as both i16 halves).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn spread(j: usize, pair: bool) -> __m256i {
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

/// A Q4_K / Q5_K tile's packed scales as four vectors whose lanes hold, for their row, the
/// bytes of scales 0-3, scales 4-7, minimums 0-3 and minimums 4-7.
///
/// # Safety
/// `t` must point to a Q4_K or Q5_K tile.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn q45k_scales(t: *const u8) -> [__m256i; 4] {
    let (low6, low4, low2) = (
        _mm256_set1_epi8(0x3F),
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x03),
    );
    // SAFETY: the packed scales are bytes 32..128 of the tile.
    let (u0, u1, u2) = unsafe { (load(t.add(32)), load(t.add(64)), load(t.add(96))) };
    let high = |u: __m256i, v: __m256i| {
        _mm256_or_si256(
            v,
            _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u), low2)),
        )
    };
    [
        _mm256_and_si256(u0, low6),
        high(u0, _mm256_and_si256(u2, low4)),
        _mm256_and_si256(u1, low6),
        high(u1, _mm256_and_si256(_mm256_srli_epi32::<4>(u2), low4)),
    ]
}

/// The four weight vectors of a Q6_K tile's step at `at` (its `ql` quarters and `qh` bytes),
/// quants as stored (0..64): weights `32k + 4s..` of the half for `k` = 0..4.
///
/// # Safety
/// `at` must point to 96 readable bytes of a Q6_K tile.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn q6k_quants(at: *const u8) -> [__m256i; 4] {
    let nib = _mm256_set1_epi8(0x0F);
    let top = _mm256_set1_epi8(0x30);
    // SAFETY: 96 bytes, as the caller vouches.
    let (l0, l1, h) = unsafe { (load(at), load(at.add(32)), load(at.add(64))) };
    let join = |l: __m256i, h: __m256i| {
        _mm256_or_si256(_mm256_and_si256(l, nib), _mm256_and_si256(h, top))
    };
    [
        join(l0, _mm256_slli_epi16::<4>(h)),
        join(l1, _mm256_slli_epi16::<2>(h)),
        join(_mm256_srli_epi16::<4>(l0), h),
        join(_mm256_srli_epi16::<4>(l1), _mm256_srli_epi16::<2>(h)),
    ]
}

/// An IQ4_XS tile's sub-block scales less 32, sub-block `s` in each row's lane of vector `s`.
///
/// # Safety
/// `t` must point to an IQ4_XS tile.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn iq4xs_scales(t: *const u8) -> [__m256i; 8] {
    // SAFETY: `scales_h` at 16, `scales_l` at 32, inside the tile.
    let (high, low) = unsafe {
        (
            _mm256_cvtepu16_epi32(_mm_loadu_si128(t.add(16) as *const __m128i)),
            load(t.add(32)),
        )
    };
    std::array::from_fn(|s| {
        let lo = _mm256_and_si256(
            _mm256_srlv_epi32(low, _mm256_set1_epi32(4 * s as i32)),
            _mm256_set1_epi32(0x0F),
        );
        let hi = _mm256_and_si256(
            _mm256_srlv_epi32(high, _mm256_set1_epi32(2 * s as i32)),
            _mm256_set1_epi32(3),
        );
        _mm256_sub_epi32(
            _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)),
            _mm256_set1_epi32(32),
        )
    })
}

/// `G` groups of Q4_K rows (Q5_K with `FIVE`; `group` bytes apart) against `X` activation
/// rows: `vals[(8g + i) * X + j]`.
///
/// # Safety
/// As for [`rows`]: `w` holds `G` groups of `nb` Q4_K (Q5_K) tiles, `x` `X` rows of `nb`
/// blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q45k<const X: usize, const G: usize, const FIVE: bool>(
    w: &[u8],
    group: usize,
    x: &[Q8KBlock],
    nb: usize,
    vals: &mut [f32],
) {
    let tile = GROUP * if FIVE { 176 } else { 144 };
    // Where the quants start in a tile: Q5_K's fifth bits come before them.
    let qs = if FIVE { 384 } else { 128 };
    assert!(
        group == nb * tile
            && w.len() >= G * group
            && x.len() >= X * nb
            && vals.len() >= G * GROUP * X
    );
    let nib = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let one: [__m256i; 4] = std::array::from_fn(|j| spread(j, false));
    let two: [__m256i; 4] = std::array::from_fn(|j| spread(j, true));
    let mut acc = [[_mm256_setzero_ps(); X]; G];
    let mut offs = [[_mm256_setzero_ps(); X]; G];
    for b in 0..nb {
        let t: [*const u8; G] = std::array::from_fn(|g| w[g * group + b * tile..][..tile].as_ptr());
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside a tile.
        unsafe {
            let mut sc = [[_mm256_setzero_si256(); 8]; G];
            for g in 0..G {
                let t = t[g];
                let dminv = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i));
                let [sc_lo, sc_hi, mn_lo, mn_hi] = q45k_scales(t);
                sc[g] = std::array::from_fn(|k| {
                    _mm256_shuffle_epi8(if k < 4 { sc_lo } else { sc_hi }, one[k % 4])
                });
                // The minimums' term first: it needs nothing from the products.
                let mut msum = [_mm256_setzero_si256(); X];
                for p in 0..8 {
                    let m = _mm256_shuffle_epi8(if p < 4 { mn_lo } else { mn_hi }, two[p % 4]);
                    for j in 0..X {
                        msum[j] = _mm256_dpwssd_epi32(msum[j], m, bsum_pair(xb[j], p));
                    }
                }
                for j in 0..X {
                    let dx = _mm256_set1_ps(xb[j].d);
                    offs[g][j] = _mm256_sub_ps(
                        offs[g][j],
                        _mm256_mul_ps(_mm256_mul_ps(dminv, dx), _mm256_cvtepi32_ps(msum[j])),
                    );
                }
            }
            let mut sumi = [[_mm256_setzero_si256(); X]; G];
            for c in 0..4 {
                let mut lo = [[_mm256_setzero_si256(); X]; G];
                let mut hi = [[_mm256_setzero_si256(); X]; G];
                for s in 0..8 {
                    let mut wl = [_mm256_setzero_si256(); G];
                    let mut wh = [_mm256_setzero_si256(); G];
                    for g in 0..G {
                        let v = load(t[g].add(qs + 256 * c + 32 * s));
                        wl[g] = _mm256_and_si256(v, nib);
                        wh[g] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                        if FIVE {
                            // Bits `2c` and `2c + 1` of the rows' `qh` bytes, to bit 4.
                            let h = load(t[g].add(128 + 32 * s));
                            wl[g] = _mm256_or_si256(wl[g], fifth_bit(h, 2 * c, sixteen));
                            wh[g] = _mm256_or_si256(wh[g], fifth_bit(h, 2 * c + 1, sixteen));
                        }
                    }
                    for j in 0..X {
                        let (xl, xh) = (
                            bcast(xb[j], 64 * c + 4 * s),
                            bcast(xb[j], 64 * c + 32 + 4 * s),
                        );
                        for g in 0..G {
                            lo[g][j] = _mm256_dpbusd_epi32(lo[g][j], wl[g], xl);
                            hi[g][j] = _mm256_dpbusd_epi32(hi[g][j], wh[g], xh);
                        }
                    }
                }
                for g in 0..G {
                    for j in 0..X {
                        let s = _mm256_add_epi32(
                            _mm256_mullo_epi32(lo[g][j], sc[g][2 * c]),
                            _mm256_mullo_epi32(hi[g][j], sc[g][2 * c + 1]),
                        );
                        sumi[g][j] = _mm256_add_epi32(sumi[g][j], s);
                    }
                }
            }
            end_block(&t, &xb, &sumi, &mut acc);
        }
    }
    for g in 0..G {
        lanes_out(&acc[g], &offs[g], GROUP, &mut vals[g * GROUP * X..]);
    }
}

/// The end of a super-block, as in every kernel: each row's exact sum times `d·d_x` into its
/// lane in one fused multiply-add (`d` the tile's first eight f16).
///
/// # Safety
/// Each `t[g]` must point to a tile.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn end_block<const X: usize, const G: usize>(
    t: &[*const u8; G],
    xb: &[&Q8KBlock; X],
    sumi: &[[__m256i; X]; G],
    acc: &mut [[__m256; X]; G],
) {
    for g in 0..G {
        // SAFETY: a tile starts with its rows' `d`, as the caller vouches.
        let dv = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(t[g] as *const __m128i) });
        for j in 0..X {
            let dx = _mm256_set1_ps(xb[j].d);
            acc[g][j] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(sumi[g][j]),
                _mm256_mul_ps(dv, dx),
                acc[g][j],
            );
        }
    }
}

/// `G` groups of Q6_K rows against `X` activation rows: `vals[(8g + i) * X + j]`.
///
/// # Safety
/// As for [`q45k`], with Q6_K tiles.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6k<const X: usize, const G: usize>(
    w: &[u8],
    group: usize,
    x: &[Q8KBlock],
    nb: usize,
    vals: &mut [f32],
) {
    const TILE: usize = GROUP * 210;
    assert!(
        group == nb * TILE
            && w.len() >= G * group
            && x.len() >= X * nb
            && vals.len() >= G * GROUP * X
    );
    let mut acc = [[_mm256_setzero_ps(); X]; G];
    let offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t: [*const u8; G] = std::array::from_fn(|g| w[g * group + b * TILE..][..TILE].as_ptr());
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside a tile.
        unsafe {
            // Quants are multiplied as stored (0..64); `32·Σ_g sc[g]·bsum[g]` comes off.
            let mut sumi = [[_mm256_setzero_si256(); X]; G];
            for g in 0..G {
                for p in 0..8 {
                    let v = _mm_loadu_si128(t[g].add(16 + 16 * p) as *const __m128i);
                    // Each lane: the row's scales of groups 2p and 2p + 1, as i16.
                    let pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128::<8>(v)));
                    for j in 0..X {
                        sumi[g][j] = _mm256_dpwssd_epi32(sumi[g][j], pair, bsum_pair(xb[j], p));
                    }
                }
                for v in sumi[g].iter_mut() {
                    *v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(*v));
                }
            }
            for n in 0..2 {
                for half in 0..2 {
                    let mut a = [[[_mm256_setzero_si256(); X]; G]; 4];
                    for s in 4 * half..4 * half + 4 {
                        let at = 144 + 96 * (8 * n + s);
                        let mut q = [[_mm256_setzero_si256(); 4]; G];
                        for g in 0..G {
                            q[g] = q6k_quants(t[g].add(at));
                        }
                        for k in 0..4 {
                            for j in 0..X {
                                let xv = bcast(xb[j], 128 * n + 32 * k + 4 * s);
                                for g in 0..G {
                                    a[k][g][j] = _mm256_dpbusd_epi32(a[k][g][j], q[g][k], xv);
                                }
                            }
                        }
                    }
                    for (k, ak) in a.iter().enumerate() {
                        for g in 0..G {
                            let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                t[g].add(16 + 8 * (8 * n + 2 * k + half)) as *const __m128i,
                            ));
                            for j in 0..X {
                                sumi[g][j] = _mm256_add_epi32(
                                    sumi[g][j],
                                    _mm256_mullo_epi32(ak[g][j], scale),
                                );
                            }
                        }
                    }
                }
            }
            end_block(&t, &xb, &sumi, &mut acc);
        }
    }
    for g in 0..G {
        lanes_out(&acc[g], &offs, GROUP, &mut vals[g * GROUP * X..]);
    }
}

/// `G` groups of IQ4_XS rows against `X` activation rows: `vals[(8g + i) * X + j]`.
///
/// `vpdpbusd` multiplies unsigned by signed bytes: the levels are looked up plus 128
/// (unsigned) and `128·Σ_b sc[b]·Σ_{i∈b} x_i` comes off through the activation group sums,
/// so the integer sum is the exact `Σ_b sc[b]·Σ_{i∈b} q_i·x_i` of the other kernels.
///
/// # Safety
/// As for [`q45k`], with IQ4_XS tiles.
// The sub-block index is an offset as well as an index: a range loop says both.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn iq4xs<const X: usize, const G: usize>(
    w: &[u8],
    group: usize,
    x: &[Q8KBlock],
    nb: usize,
    vals: &mut [f32],
) {
    const TILE: usize = GROUP * 136;
    assert!(
        group == nb * TILE
            && w.len() >= G * group
            && x.len() >= X * nb
            && vals.len() >= G * GROUP * X
    );
    let nib = _mm256_set1_epi8(0x0F);
    let levels = IQ4_LEVELS.map(|v| (i16::from(v) + 128) as u8);
    // SAFETY: 16 bytes.
    let table =
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(levels.as_ptr() as *const __m128i) });
    let low16 = _mm256_set1_epi32(0xFFFF);
    let mut acc = [[_mm256_setzero_ps(); X]; G];
    let offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t: [*const u8; G] = std::array::from_fn(|g| w[g * group + b * TILE..][..TILE].as_ptr());
        let xb: [&Q8KBlock; X] = std::array::from_fn(|j| &x[j * nb + b]);
        // SAFETY: every offset below is inside a tile.
        unsafe {
            let mut sc = [[_mm256_setzero_si256(); 8]; G];
            let mut sumi = [[_mm256_setzero_si256(); X]; G];
            for g in 0..G {
                sc[g] = iq4xs_scales(t[g]);
                // `128·Σ_s sc[s]·(bsum[2s] + bsum[2s + 1])`, through the scales as i16 pairs.
                for (s, &scale) in sc[g].iter().enumerate() {
                    let pair = _mm256_or_si256(
                        _mm256_and_si256(scale, low16),
                        _mm256_slli_epi32::<16>(scale),
                    );
                    for j in 0..X {
                        sumi[g][j] = _mm256_dpwssd_epi32(sumi[g][j], pair, bsum_pair(xb[j], s));
                    }
                }
                for v in sumi[g].iter_mut() {
                    *v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(*v));
                }
            }
            for s in 0..8 {
                let mut a = [[_mm256_setzero_si256(); X]; G];
                for q in 0..4 {
                    let mut wl = [_mm256_setzero_si256(); G];
                    let mut wh = [_mm256_setzero_si256(); G];
                    for g in 0..G {
                        let v = load(t[g].add(64 + 128 * s + 32 * q));
                        wl[g] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
                        wh[g] = _mm256_shuffle_epi8(
                            table,
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
                        );
                    }
                    for j in 0..X {
                        let (xl, xh) = (
                            bcast(xb[j], 32 * s + 4 * q),
                            bcast(xb[j], 32 * s + 16 + 4 * q),
                        );
                        for g in 0..G {
                            a[g][j] = _mm256_dpbusd_epi32(a[g][j], wl[g], xl);
                            a[g][j] = _mm256_dpbusd_epi32(a[g][j], wh[g], xh);
                        }
                    }
                }
                for g in 0..G {
                    for j in 0..X {
                        sumi[g][j] =
                            _mm256_add_epi32(sumi[g][j], _mm256_mullo_epi32(a[g][j], sc[g][s]));
                    }
                }
            }
            end_block(&t, &xb, &sumi, &mut acc);
        }
    }
    for g in 0..G {
        lanes_out(&acc[g], &offs, GROUP, &mut vals[g * GROUP * X..]);
    }
}
