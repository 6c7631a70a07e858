//! The AVX2 + FMA micro-kernel: one panel of 16 columns, 6 rows.

use super::{Acc, Tile, MR, NR};
use crate::cpu::encoder::avx2::gelu;
use std::arch::x86_64::*;

/// The accumulators of one tile, as (low 8, high 8) column halves per row.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a_rows[r] + (kc-1) * a_step < a.len()` for every row and
/// the panel holds `kc * NR` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_compute(t: &Tile<'_>) -> [[__m256; 2]; MR] {
    // SAFETY: every pointer below stays inside `a` or the panel, as documented above.
    unsafe {
        let a = t.a.as_ptr();
        let p0 = a.add(t.a_rows[0]);
        let p1 = a.add(t.a_rows[1]);
        let p2 = a.add(t.a_rows[2]);
        let p3 = a.add(t.a_rows[3]);
        let p4 = a.add(t.a_rows[4]);
        let p5 = a.add(t.a_rows[5]);
        let step = t.a_step;
        let mut idx = 0;
        let mut c00 = _mm256_setzero_ps();
        let mut c01 = _mm256_setzero_ps();
        let mut c10 = _mm256_setzero_ps();
        let mut c11 = _mm256_setzero_ps();
        let mut c20 = _mm256_setzero_ps();
        let mut c21 = _mm256_setzero_ps();
        let mut c30 = _mm256_setzero_ps();
        let mut c31 = _mm256_setzero_ps();
        let mut c40 = _mm256_setzero_ps();
        let mut c41 = _mm256_setzero_ps();
        let mut c50 = _mm256_setzero_ps();
        let mut c51 = _mm256_setzero_ps();
        let mut bp = t.panel.as_ptr();
        for _ in 0..t.kc {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            let x = _mm256_broadcast_ss(&*p0.add(idx));
            c00 = _mm256_fmadd_ps(x, b0, c00);
            c01 = _mm256_fmadd_ps(x, b1, c01);
            let x = _mm256_broadcast_ss(&*p1.add(idx));
            c10 = _mm256_fmadd_ps(x, b0, c10);
            c11 = _mm256_fmadd_ps(x, b1, c11);
            let x = _mm256_broadcast_ss(&*p2.add(idx));
            c20 = _mm256_fmadd_ps(x, b0, c20);
            c21 = _mm256_fmadd_ps(x, b1, c21);
            let x = _mm256_broadcast_ss(&*p3.add(idx));
            c30 = _mm256_fmadd_ps(x, b0, c30);
            c31 = _mm256_fmadd_ps(x, b1, c31);
            let x = _mm256_broadcast_ss(&*p4.add(idx));
            c40 = _mm256_fmadd_ps(x, b0, c40);
            c41 = _mm256_fmadd_ps(x, b1, c41);
            let x = _mm256_broadcast_ss(&*p5.add(idx));
            c50 = _mm256_fmadd_ps(x, b0, c50);
            c51 = _mm256_fmadd_ps(x, b1, c51);
            bp = bp.add(NR);
            idx += step;
        }
        [
            [c00, c01],
            [c10, c11],
            [c20, c21],
            [c30, c31],
            [c40, c41],
            [c50, c51],
        ]
    }
}

/// The full tile straight into C, through the GELU when [`Tile::gelu`] says so.
///
/// # Safety
/// As [`tile_compute`], and `c_off + (MR-1)*ldc + NR <= c.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_store(t: &Tile<'_>, c: &mut [f32]) {
    // SAFETY: bounds as documented above.
    unsafe {
        let acc = tile_compute(t);
        let cp = c.as_mut_ptr().add(t.c_off);
        let mut out = [[_mm256_setzero_ps(); 2]; MR];
        for (r, halves) in acc.iter().enumerate().take(MR) {
            for (h, &v) in halves.iter().enumerate() {
                let dst = cp.add(r * t.ldc + h * 8);
                let mut o = if t.first {
                    v
                } else {
                    _mm256_add_ps(_mm256_loadu_ps(dst), v)
                };
                if let Some(bias) = t.bias {
                    o = _mm256_add_ps(o, _mm256_loadu_ps(bias.as_ptr().add(h * 8)));
                }
                out[r][h] = o;
            }
        }
        if t.gelu {
            // Two rows (four vectors) at a time: enough chains to overlap, few enough to
            // stay in registers.
            for pair in out.chunks_exact_mut(2) {
                let [a0, a1] = pair[0];
                let [b0, b1] = pair[1];
                let [a0, a1, b0, b1] = gelu([a0, a1, b0, b1]);
                pair[0] = [a0, a1];
                pair[1] = [b0, b1];
            }
        }
        for (r, halves) in out.iter().enumerate() {
            for (h, &o) in halves.iter().enumerate() {
                _mm256_storeu_ps(cp.add(r * t.ldc + h * 8), o);
            }
        }
    }
}

/// The tile into an accumulator array (for edge tiles).
///
/// # Safety
/// As [`tile_store`], without the condition on C.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_acc(t: &Tile<'_>, out: &mut Acc) {
    // SAFETY: bounds as documented above; `out` rows hold NR = 16 floats.
    unsafe {
        let acc = tile_compute(t);
        for (r, halves) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[r].as_mut_ptr(), halves[0]);
            _mm256_storeu_ps(out[r].as_mut_ptr().add(8), halves[1]);
        }
    }
}

/// `groups` full tiles down the rows: tile `g` is `t` with A `g * a_stride` and C `g * MR`
/// rows further on.
///
/// # Safety
/// As [`tile_store`] for every one of the tiles.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiles_store(t: &Tile<'_>, groups: usize, a_stride: usize, c: &mut [f32]) {
    for g in 0..groups {
        let tile = Tile {
            a_rows: t.a_rows.map(|off| off + g * a_stride),
            c_off: t.c_off + g * MR * t.ldc,
            ..*t
        };
        // SAFETY: as documented above.
        unsafe { tile_store(&tile, c) };
    }
}
