//! The fused attention on AVX2 + FMA: the AVX-512 kernel's steps on 8-lane vectors. A scores
//! tile covers one key panel (two vectors) and the products with the values take one value
//! panel per pass over the keys, so that each tile's twelve accumulators, its two panel
//! vectors and a broadcast query value fit the sixteen registers.

use super::{NR, QB};
use crate::cpu::encoder::avx2::{exp, reduce_add, reduce_max};
use std::arch::x86_64::*;

/// One head of one sequence, `D` panels of 16 values per row (`hd = 16 * D`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `q` holds `(len-1) * ld + hd` floats; `kp` the keys packed
/// transposed (`len.next_multiple_of(16) * hd` floats, panels of 16 keys); `vp` the values
/// packed by rows (`len * hd` floats, `D` panels of 16 columns); `s` holds
/// `QB * len.next_multiple_of(16)` floats; `out` holds `len * hd`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) unsafe fn attend<const D: usize>(
    q: &[f32],
    ld: usize,
    len: usize,
    kp: &[f32],
    vp: &[f32],
    scale: f32,
    s: &mut [f32],
    out: &mut [f32],
) {
    let hd = D * NR;
    let panels = len.div_ceil(NR);
    let width = panels * NR;
    let tail = len - (panels - 1) * NR;
    // The lanes of the last panel's two halves that hold keys.
    let lanes: [i32; NR] = std::array::from_fn(|i| if i < tail { -1 } else { 0 });
    // SAFETY: every pointer below stays inside the slices, as documented above: query rows
    // below `len`, `hd` values each; key panels below `panels`, depth below `hd`; value rows
    // below `len`; score rows below QB, `width` each; output rows below `len`.
    unsafe {
        let keep: [__m256; 2] = std::array::from_fn(|h| {
            _mm256_castsi256_ps(_mm256_loadu_si256(lanes.as_ptr().add(8 * h).cast()))
        });
        let (q, kp, vp, s, out) = (
            q.as_ptr(),
            kp.as_ptr(),
            vp.as_ptr(),
            s.as_mut_ptr(),
            out.as_mut_ptr(),
        );
        let sc = _mm256_set1_ps(scale);
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i0 = 0;
        while i0 < len {
            let rows = QB.min(len - i0);
            // Rows past the end repeat the block's last query; never stored.
            let qr: [*const f32; QB] = std::array::from_fn(|r| q.add((i0 + r.min(rows - 1)) * ld));
            for p in 0..panels {
                scores_tile(&qr, hd, kp, p, sc, s, width);
            }
            // Softmax of each row without the division; keys past `len` are masked off.
            let mut inv = [0.0f32; QB];
            for (r, inv_r) in inv.iter_mut().enumerate() {
                let row = s.add(r * width);
                let last = row.add((panels - 1) * NR);
                let full = (panels - 1) * 2;
                let mut mx = neg_inf;
                for c in 0..full {
                    mx = _mm256_max_ps(mx, _mm256_loadu_ps(row.add(c * 8)));
                }
                for h in 0..2 {
                    let v = _mm256_loadu_ps(last.add(8 * h));
                    mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, v, keep[h]));
                }
                let max = _mm256_set1_ps(reduce_max(mx));
                let mut sum = _mm256_setzero_ps();
                for c in 0..full {
                    let e = exp(_mm256_sub_ps(_mm256_loadu_ps(row.add(c * 8)), max));
                    sum = _mm256_add_ps(sum, e);
                    _mm256_storeu_ps(row.add(c * 8), e);
                }
                for h in 0..2 {
                    let v = _mm256_loadu_ps(last.add(8 * h));
                    let e = _mm256_and_ps(exp(_mm256_sub_ps(v, max)), keep[h]);
                    sum = _mm256_add_ps(sum, e);
                    _mm256_storeu_ps(last.add(8 * h), e);
                }
                *inv_r = 1.0 / reduce_add(sum);
            }
            // The block's outputs, one value panel at a time: probabilities times values, then
            // the normalisation.
            for d in 0..D {
                let panel = vp.add(d * NR * len);
                let mut acc = [[_mm256_setzero_ps(); 2]; QB];
                for j in 0..len {
                    let v0 = _mm256_loadu_ps(panel.add(j * NR));
                    let v1 = _mm256_loadu_ps(panel.add(j * NR + 8));
                    for r in 0..QB {
                        let x = _mm256_broadcast_ss(&*s.add(r * width + j));
                        acc[r][0] = _mm256_fmadd_ps(x, v0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(x, v1, acc[r][1]);
                    }
                }
                for r in 0..rows {
                    let iv = _mm256_set1_ps(inv[r]);
                    let dst = out.add((i0 + r) * hd + d * NR);
                    _mm256_storeu_ps(dst, _mm256_mul_ps(acc[r][0], iv));
                    _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(acc[r][1], iv));
                }
            }
            i0 += rows;
        }
    }
}

/// `scale · Q Kᵀ` of the block's QB queries against the 16 keys of panel `p`, into the score
/// rows (`width` apart).
///
/// # Safety
/// As [`attend`]: the query rows hold `hd` floats, panel `p` exists.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn scores_tile(
    qr: &[*const f32; QB],
    hd: usize,
    kp: *const f32,
    p: usize,
    sc: __m256,
    s: *mut f32,
    width: usize,
) {
    // SAFETY: as documented above.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; QB];
        let base = kp.add(p * hd * NR);
        for d in 0..hd {
            let b0 = _mm256_loadu_ps(base.add(d * NR));
            let b1 = _mm256_loadu_ps(base.add(d * NR + 8));
            for r in 0..QB {
                let x = _mm256_broadcast_ss(&*qr[r].add(d));
                acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
            }
        }
        for r in 0..QB {
            let dst = s.add(r * width + p * NR);
            _mm256_storeu_ps(dst, _mm256_mul_ps(acc[r][0], sc));
            _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(acc[r][1], sc));
        }
    }
}
