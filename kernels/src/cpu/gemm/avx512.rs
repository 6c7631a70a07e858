//! The AVX-512 micro-kernels (up to three panels, masked edge tiles) and the gathered
//! transposed packing.

use super::{Tile, MR, NR};
use std::arch::x86_64::*;

/// The accumulators of one tile of `NP` panels, per row.
///
/// # Safety
/// The CPU has AVX-512F; `a_rows[r] + (kc-1) * a_step < a.len()` for every row and the
/// panel slice holds `(NP-1) * panel_stride + kc * NR` floats.
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn tile_compute<const NP: usize>(t: &Tile<'_>) -> [[__m512; NP]; MR] {
    // SAFETY: every pointer below stays inside `a` or the panels, as documented above.
    unsafe {
        let a = t.a.as_ptr();
        let rows: [*const f32; MR] = [
            a.add(t.a_rows[0]),
            a.add(t.a_rows[1]),
            a.add(t.a_rows[2]),
            a.add(t.a_rows[3]),
            a.add(t.a_rows[4]),
            a.add(t.a_rows[5]),
        ];
        let (step, stride) = (t.a_step, t.panel_stride);
        let mut acc = [[_mm512_setzero_ps(); NP]; MR];
        let mut bp = t.panel.as_ptr();
        let mut idx = 0;
        for _ in 0..t.kc {
            let mut b = [_mm512_setzero_ps(); NP];
            for j in 0..NP {
                b[j] = _mm512_loadu_ps(bp.add(j * stride));
            }
            for r in 0..MR {
                let x = _mm512_set1_ps(*rows[r].add(idx));
                for j in 0..NP {
                    acc[r][j] = _mm512_fmadd_ps(x, b[j], acc[r][j]);
                }
            }
            bp = bp.add(NR);
            idx += step;
        }
        acc
    }
}

/// The full tile straight into C.
///
/// # Safety
/// As [`tile_compute`], and `c_off + (MR-1)*ldc + NP*NR <= c.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_store<const NP: usize>(t: &Tile<'_>, c: &mut [f32]) {
    // SAFETY: bounds as documented above; the bias holds `cols` = NP*NR values.
    unsafe {
        let cp = c.as_mut_ptr().add(t.c_off);
        // Ask for the tile's lines of C (for writing) before the k loop, so that their
        // misses overlap the multiply-adds instead of stalling the stores at the end.
        for r in 0..MR {
            for j in 0..NP {
                _mm_prefetch::<_MM_HINT_ET0>(cp.add(r * t.ldc + j * NR) as *const i8);
            }
            _mm_prefetch::<_MM_HINT_ET0>(cp.add(r * t.ldc + NP * NR - 1) as *const i8);
        }
        let acc = tile_compute::<NP>(t);
        for (r, row) in acc.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let dst = cp.add(r * t.ldc + j * NR);
                let mut out = if t.first {
                    v
                } else {
                    _mm512_add_ps(_mm512_loadu_ps(dst), v)
                };
                if let Some(bias) = t.bias {
                    out = _mm512_add_ps(out, _mm512_loadu_ps(bias.as_ptr().add(j * NR)));
                }
                _mm512_storeu_ps(dst, out);
            }
        }
    }
}

/// An edge tile (fewer rows, or a last panel with fewer columns) straight into C: only
/// its `rows` rows are stored, and the last panel's columns past `cols` are masked off.
///
/// # Safety
/// As [`tile_compute`], and `(NP-1)*NR < cols <= NP*NR`, `1 <= rows <= MR`,
/// `c_off + (rows-1)*ldc + cols <= c.len()`; the bias (if any) holds `cols` values.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_store_masked<const NP: usize>(t: &Tile<'_>, c: &mut [f32]) {
    // SAFETY: bounds as documented above. Masked-off lanes are neither read nor written,
    // so every access stays inside the tile's valid rows and columns.
    unsafe {
        let acc = tile_compute::<NP>(t);
        let last = t.cols - (NP - 1) * NR;
        let last_mask = (u32::MAX >> (32 - last)) as __mmask16;
        let cp = c.as_mut_ptr().add(t.c_off);
        for (r, row) in acc.iter().enumerate().take(t.rows) {
            for (j, &v) in row.iter().enumerate() {
                let m = if j + 1 == NP { last_mask } else { !0 };
                let dst = cp.add(r * t.ldc + j * NR);
                let mut out = if t.first {
                    v
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), v)
                };
                if let Some(bias) = t.bias {
                    out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias.as_ptr().add(j * NR)));
                }
                _mm512_mask_storeu_ps(dst, m, out);
            }
        }
    }
}

/// One panel of a transposed pack: `panel[kk * NR + j] = src[j * ld + kk]` for `j < NR`,
/// `kk < k`, one 16-lane gather per `kk`.
///
/// # Safety
/// The CPU has AVX-512F; `(NR - 1) * ld + k <= src.len()`, `(NR - 1) * ld` fits in an
/// i32 and `panel` holds `k * NR` floats.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gather_panel(src: &[f32], ld: usize, k: usize, panel: &mut [f32]) {
    let ld = ld as i32;
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(ld));
    // SAFETY: every address read is src[j * ld + kk] with j < 16 and kk < k, inside `src`;
    // every store writes panel[kk * NR .. kk * NR + 16], inside `panel`.
    unsafe {
        let base = src.as_ptr();
        let out = panel.as_mut_ptr();
        for kk in 0..k {
            let v = _mm512_i32gather_ps::<4>(offsets, base.add(kk).cast());
            _mm512_storeu_ps(out.add(kk * NR), v);
        }
    }
}
