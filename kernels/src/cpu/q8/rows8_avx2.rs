//! The AVX2 kernel of [`super::dot_q8`] for the 32-weight types in the interleaved layout
//! (`crate::cpu::kquant::rows8`), for the levels without VNNI: the broadcast form of
//! `super::rows8_vnni` with `vpmaddubsw` and `vpmaddwd` in place of `vpdpbusd`.
//!
//! Each activation dword, broadcast, meets four quants of eight rows: the types with a
//! minimum multiply their unsigned quants by the activations as they are and add the pair
//! sums of several dwords in `i16` (a pair is at most `2·15·127` for Q4_1, eight dwords;
//! `2·31·127` for Q5_1, four); Q4_0 and Q5_0 multiply the activations offset to unsigned
//! (`x + 128`, once per matrix product: `Q8Args::xu`) by their small signed quants, add the
//! pair sums in `i16` the same way (at most `2·255·8` a pair for Q4_0, eight dwords;
//! `2·255·16` for Q5_0, four) and take `128·Σq` of each row off; Q8_0 and IQ4_NL, whose
//! quants reach ±127, multiply the quants' magnitudes by the activations carrying the quants'
//! signs (a pair sum is at most `2·128·127`, inside `vpmaddubsw`'s `i16`: one dword at a
//! time). Every block's sum is exact and ends as in the row kernels, so a row gives the same
//! bits from either layout.

use std::arch::x86_64::*;

use super::rows8_vnni::{group_passes, tile_quants};
use super::type_code::{block_bytes, code, has_min, offset_unsigned};
use super::{Q8Args, Q8Block};
use crate::cpu::x86::lanes_out;
use crate::DType;

/// Rows per group.
const GROUP: usize = 8;
/// Most activation rows one pass over a group takes.
const X_PASS: usize = 4;

/// `out[i * x_rows + j] = w_i · x_j` for `rows` (a multiple of eight) weight rows in the
/// interleaved layout against `x_rows` activation rows.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `a.w` must hold `rows / 8` whole groups of `a.nb`
/// tiles of `a.dtype` (a 32-weight type), `a.x` `x_rows · a.nb` blocks, and `out`
/// `rows · x_rows` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(a: &Q8Args<'_>, rows: usize, x_rows: usize, out: &mut [f32]) {
    let small = offset_unsigned(code(a.dtype));
    assert!(
        !small || a.xu.len() >= x_rows * a.nb,
        "rows8_avx2::rows: {} needs the offset activations",
        a.dtype
    );
    group_passes(a, rows, x_rows, X_PASS, out, |w, j0, xn, vals| {
        let x = &a.x[j0 * a.nb..(j0 + xn) * a.nb];
        let xu: &[[u8; 32]] = if small {
            &a.xu[j0 * a.nb..(j0 + xn) * a.nb]
        } else {
            &[]
        };
        macro_rules! pick {
            ($t:expr) => {
                // SAFETY: `w` is one whole group, `x` holds `xn` rows of `a.nb` blocks; the
                // caller vouches for the features.
                unsafe {
                    match xn {
                        1 => group_dot::<1, $t>(w, x, xu, a.nb, vals),
                        2 => group_dot::<2, $t>(w, x, xu, a.nb, vals),
                        3 => group_dot::<3, $t>(w, x, xu, a.nb, vals),
                        _ => group_dot::<4, $t>(w, x, xu, a.nb, vals),
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

/// One group of type `T` against `X` activation rows: `vals[i * X + j]`.
///
/// # Safety
/// As for [`rows`]: `w` one group of `nb` tiles of type `T`, `x` `X` rows of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot<const X: usize, const T: u8>(
    w: &[u8],
    x: &[Q8Block],
    xu: &[[u8; 32]],
    nb: usize,
    vals: &mut [f32],
) {
    let tile = GROUP * block_bytes(T);
    // Q4_0 and Q5_0 take the offset activations.
    let small = offset_unsigned(T);
    // Dwords whose pair sums add up in i16 before widening (see the module's comment).
    let steps = match T {
        0 | 1 => 8,
        2 | 3 => 4,
        _ => 1,
    };
    assert!(
        w.len() >= nb * tile
            && x.len() >= X * nb
            && (!small || xu.len() >= X * nb)
            && vals.len() >= GROUP * X
    );
    let ones = _mm256_set1_epi16(1);
    let ones8 = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); X];
    let mut offs = [_mm256_setzero_ps(); X];
    for b in 0..nb {
        let t = w[b * tile..(b + 1) * tile].as_ptr();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let dwv = _mm256_cvtph_ps(_mm_loadu_si128(t as *const __m128i));
            let q = tile_quants::<T>(t);
            // The unsigned operand: the quants, or their magnitudes for the signed types.
            let uq = if has_min(T) {
                q
            } else {
                q.map(|v| _mm256_sign_epi8(v, v))
            };
            let mwv = if has_min(T) {
                _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            // Q4_0 and Q5_0: each row's `128·Σq`, the offset activations' excess.
            let mut corr = _mm256_setzero_si256();
            if small {
                let mut s16 = _mm256_setzero_si256();
                for qc in &q {
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(ones8, *qc));
                }
                corr = _mm256_slli_epi32::<7>(_mm256_madd_epi16(s16, ones));
            }
            for j in 0..X {
                let xb = &x[j * nb + b];
                // The offset activations for Q4_0 and Q5_0, the signed ones for the rest.
                let xp = if small {
                    xu[j * nb + b].as_ptr() as *const i32
                } else {
                    xb.qs.as_ptr() as *const i32
                };
                let mut sums = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
                for c0 in (0..8).step_by(steps) {
                    let mut s16 = _mm256_setzero_si256();
                    for c in c0..c0 + steps {
                        let xv = _mm256_set1_epi32(xp.add(c).read_unaligned());
                        // `vpmaddubsw` takes the unsigned operand first.
                        let pairs = if small {
                            _mm256_maddubs_epi16(xv, q[c])
                        } else if has_min(T) {
                            _mm256_maddubs_epi16(uq[c], xv)
                        } else {
                            _mm256_maddubs_epi16(uq[c], _mm256_sign_epi8(xv, q[c]))
                        };
                        s16 = _mm256_add_epi16(s16, pairs);
                    }
                    sums = _mm256_add_epi32(sums, _mm256_madd_epi16(s16, ones));
                }
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
