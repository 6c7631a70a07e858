//! The AVX-512 VNNI kernel of [`super::dot_q8`] for the 32-weight types in the interleaved
//! layout (`crate::cpu::kquant::rows8`): eight weight rows in the eight lanes of a vector.
//!
//! A tile is one block of eight rows; its quants come as dwords holding four quants of each
//! row, so each activation dword, broadcast, meets the eight rows in one `vpdpbusd` with no
//! unpacking into rows and no transposition: the broadcast form of the row kernels
//! (`super::x86`), read straight from memory. The types with a minimum (Q4_1, Q5_1) multiply
//! their unsigned quants by the activations as they are; the signed ones (Q4_0 and Q5_0 less
//! their offsets, Q8_0, IQ4_NL's levels) multiply the activations offset to unsigned
//! (`x + 128`, offset once per matrix product: `Q8Args::xu`) by the signed quants and take
//! `128·Σw` off each row's sum. Every block's sum is
//! exact and ends as in the row kernels (one fused multiply-add by `d_w·d_x` into the row's
//! lane, and `m_w·s_x` into its own accumulator), so a row gives the same bits from either.

use std::arch::x86_64::*;

use super::type_code::{block_bytes, five, has_min};
use super::{Q8Args, Q8Block};
use crate::cpu::kquant::IQ4_LEVELS;
use crate::cpu::x86::lanes_out;
use crate::DType;

/// Rows per group.
const GROUP: usize = 8;
/// Most activation rows one pass over a group takes: eight for the signed types, four for
/// those with a minimum, which hold a second accumulator per activation row.
const X_PASS: usize = 8;

/// `out[i * x_rows + j] = w_i · x_j` for `rows` (a multiple of eight) weight rows in the
/// interleaved layout against `x_rows` activation rows.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 VL/VNNI must be available; `a.w` must hold `rows / 8` whole
/// groups of `a.nb` tiles of `a.dtype` (a 32-weight type), `a.x` `x_rows · a.nb` blocks with
/// quants within ±127, and `out` `rows · x_rows` values.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn rows(a: &Q8Args<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    let signed = !matches!(a.dtype, DType::Q4_1 | DType::Q5_1);
    assert!(
        !signed || a.xu.len() >= x_rows * a.nb,
        "q8::rows8_vnni::rows: {} needs the unsigned activation quants",
        a.dtype
    );
    let xpass = if signed { X_PASS } else { X_PASS / 2 };
    group_passes(a, rows, x_rows, xpass, out, |w, j0, xn, vals| {
        let x = &a.x[j0 * a.nb..(j0 + xn) * a.nb];
        let xu = if signed {
            &a.xu[j0 * a.nb..(j0 + xn) * a.nb]
        } else {
            &[]
        };
        macro_rules! pick {
            ($t:expr) => {
                // SAFETY: `w` is one whole group, `x` (and `xu` for the signed types) holds
                // `xn` rows of `a.nb` blocks; the caller vouches for the features.
                unsafe {
                    match xn {
                        1 => group_dot::<1, $t>(w, x, xu, a.nb, vals),
                        2 => group_dot::<2, $t>(w, x, xu, a.nb, vals),
                        3 => group_dot::<3, $t>(w, x, xu, a.nb, vals),
                        4 => group_dot::<4, $t>(w, x, xu, a.nb, vals),
                        5 => group_dot::<5, $t>(w, x, xu, a.nb, vals),
                        6 => group_dot::<6, $t>(w, x, xu, a.nb, vals),
                        7 => group_dot::<7, $t>(w, x, xu, a.nb, vals),
                        _ => group_dot::<8, $t>(w, x, xu, a.nb, vals),
                    }
                }
            };
        }
        match a.dtype {
            DType::Q4_0 => pick!(0),
            DType::Q4_1 => pick!(1),
            DType::Q5_0 => pick!(2),
            DType::Q5_1 => pick!(3),
            DType::Q8_0 => pick!(4),
            DType::IQ4_NL => pick!(5),
            other => unreachable!("dot_q8 takes only the 32-weight types: {other}"),
        }
    });
}

/// The pass loop of the interleaved kernels: each group of eight weight rows against the
/// activation rows, `xpass` (at most 8) at a time; `pass(group's bytes, first activation row,
/// rows, vals)` fills `vals[i * rows + j]`, which lands in `out[i * x_rows + j]`.
///
/// # Panics
/// If `rows` is not whole groups or the slices are shorter than the shapes claim.
pub(super) fn group_passes(
    a: &Q8Args<'_>,
    rows: usize,
    x_rows: usize,
    xpass: usize,
    out: &mut [f32],
    mut pass: impl FnMut(&[u8], usize, usize, &mut [f32]),
) {
    let group = a.nb * GROUP * a.dtype.block_bytes();
    assert!(
        rows.is_multiple_of(GROUP)
            && xpass <= X_PASS
            && a.w.len() >= rows / GROUP * group
            && a.x.len() >= x_rows * a.nb
            && out.len() >= rows * x_rows,
        "q8 interleaved kernels: {rows} rows x {x_rows}"
    );
    let mut vals = [0f32; GROUP * X_PASS];
    for g in 0..rows / GROUP {
        let w = &a.w[g * group..(g + 1) * group];
        let mut j0 = 0;
        while j0 < x_rows {
            let xn = (x_rows - j0).min(xpass);
            pass(w, j0, xn, &mut vals);
            for i in 0..GROUP {
                for j in 0..xn {
                    out[(g * GROUP + i) * x_rows + j0 + j] = vals[i * xn + j];
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

/// The fifth bits of weights `at..at + 4` of each row (bits `at..at + 4` of its `qh` dword),
/// as 16 in the bytes whose bit is set: the four bits spread one per byte by a multiply
/// whose partial products never overlap.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth(qh: __m256i, at: i32) -> __m256i {
    let bits = _mm256_and_si256(
        _mm256_srl_epi32(qh, _mm_cvtsi32_si128(at)),
        _mm256_set1_epi32(0xF),
    );
    let spread = _mm256_mullo_epi32(bits, _mm256_set1_epi32(0x0020_4081));
    _mm256_slli_epi32::<4>(_mm256_and_si256(spread, _mm256_set1_epi32(0x0101_0101)))
}

/// The quants of one tile of type `T`, dword `c` of each row (weights `4c..4c + 4`) in
/// vector `c`: exact signed values for the signed types (offsets off, IQ4_NL's levels
/// looked up), the stored unsigned quants for those with a minimum.
///
/// # Safety
/// `t` must point to a whole tile of type `T`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn tile_quants<const T: u8>(t: *const u8) -> [__m256i; 8] {
    // Where the quants start in a tile: after the scales (and minimums, and fifth bits).
    let qs = 16 * (1 + usize::from(has_min(T))) + 32 * usize::from(five(T));
    let nib = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    // SAFETY: every offset below is inside the tile, as the caller vouches.
    unsafe {
        if T == 4 {
            for (c, qc) in q.iter_mut().enumerate() {
                *qc = load(t.add(qs + 32 * c));
            }
            return q;
        }
        let levels = IQ4_LEVELS.map(|v| v as u8);
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(levels.as_ptr() as *const __m128i));
        let qh = if five(T) {
            load(t.add(qs - 32))
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..4 {
            let v = load(t.add(qs + 32 * c));
            let (mut lo, mut hi) = (
                _mm256_and_si256(v, nib),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
            );
            if five(T) {
                lo = _mm256_or_si256(lo, fifth(qh, 4 * c as i32));
                hi = _mm256_or_si256(hi, fifth(qh, 16 + 4 * c as i32));
            }
            (q[c], q[4 + c]) = match T {
                // The stored offsets come off in the bytes: exact signed quants.
                0 => (
                    _mm256_sub_epi8(lo, _mm256_set1_epi8(8)),
                    _mm256_sub_epi8(hi, _mm256_set1_epi8(8)),
                ),
                2 => (
                    _mm256_sub_epi8(lo, _mm256_set1_epi8(16)),
                    _mm256_sub_epi8(hi, _mm256_set1_epi8(16)),
                ),
                5 => (
                    _mm256_shuffle_epi8(table, lo),
                    _mm256_shuffle_epi8(table, hi),
                ),
                _ => (lo, hi),
            };
        }
    }
    q
}

/// One group of type `T` against `X` activation rows: `vals[i * X + j]`. `xu`: the signed
/// types' activation quants offset to unsigned, block for block as in `x`.
///
/// # Safety
/// As for [`rows`]: `w` one group of `nb` tiles of type `T`, `x` `X` rows of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn group_dot<const X: usize, const T: u8>(
    w: &[u8],
    x: &[Q8Block],
    xu: &[[u8; 32]],
    nb: usize,
    vals: &mut [f32],
) {
    let tile = GROUP * block_bytes(T);
    assert!(
        w.len() >= nb * tile
            && x.len() >= X * nb
            && (has_min(T) || xu.len() >= X * nb)
            && vals.len() >= GROUP * X
    );
    let ones = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); X];
    let mut offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * tile..(b + 1) * tile].as_ptr();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let dwv = _mm256_cvtph_ps(_mm_loadu_si128(t as *const __m128i));
            let q = tile_quants::<T>(t);
            // The signed types' `128·Σw` of each row.
            let mut corr = _mm256_setzero_si256();
            if !has_min(T) {
                for qc in &q {
                    corr = _mm256_dpbusd_epi32(corr, ones, *qc);
                }
                corr = _mm256_slli_epi32::<7>(corr);
            }
            let mwv = if has_min(T) {
                _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            for j in 0..X {
                let xb = &x[j * nb + b];
                // Broadcast by dword from memory (the signed types: the offset quants).
                let xp = if has_min(T) {
                    xb.qs.as_ptr() as *const i32
                } else {
                    xu[j * nb + b].as_ptr() as *const i32
                };
                let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for c in 0..4 {
                    let (x0, x1) = (
                        _mm256_set1_epi32(xp.add(2 * c).read_unaligned()),
                        _mm256_set1_epi32(xp.add(2 * c + 1).read_unaligned()),
                    );
                    if has_min(T) {
                        s0 = _mm256_dpbusd_epi32(s0, q[2 * c], x0);
                        s1 = _mm256_dpbusd_epi32(s1, q[2 * c + 1], x1);
                    } else {
                        s0 = _mm256_dpbusd_epi32(s0, x0, q[2 * c]);
                        s1 = _mm256_dpbusd_epi32(s1, x1, q[2 * c + 1]);
                    }
                }
                let sums = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), corr);
                let sc = _mm256_mul_ps(dwv, _mm256_set1_ps(xb.d));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), sc, acc[j]);
                if has_min(T) {
                    offs[j] = _mm256_fmadd_ps(mwv, _mm256_set1_ps(xb.s), offs[j]);
                }
            }
        }
    }
    lanes_out(&acc, &offs, GROUP, vals);
}
