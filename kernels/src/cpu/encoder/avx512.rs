//! AVX-512 versions of [`super::exp`], the erf GELU and the softmax: the same formulas on 16 lanes
//! with fused multiply-adds. A row's tail goes through the same code with masked loads and
//! stores, so an element's result does not depend on where it sits in the row.

use std::arch::x86_64::*;

const W: usize = 16;

/// Mask of the first `n` (< 16) lanes.
#[inline(always)]
fn tail_mask(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// `e^x` lane-wise: [`super::exp`]'s reduction and polynomial.
#[target_feature(enable = "avx512f")]
pub(crate) fn exp(x: __m512) -> __m512 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0;
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let t = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), _mm512_set1_ps(MAGIC));
    let n = _mm512_sub_ps(t, _mm512_set1_ps(MAGIC));
    let ni = _mm512_sub_epi32(
        _mm512_castps_si512(t),
        _mm512_set1_epi32(MAGIC.to_bits() as i32),
    );
    let f = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let f = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), f);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        ni,
        _mm512_set1_epi32(127),
    )));
    _mm512_mul_ps(p, scale)
}

/// `0.5 x (1 + erf(x / sqrt 2))` lane-wise, erf as in [`super::erf`].
#[target_feature(enable = "avx512f")]
fn gelu(x: __m512) -> __m512 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let u = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
    let z = _mm512_abs_ps(u);
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(P), z, one));
    let mut poly = _mm512_set1_ps(A[4]);
    for &c in A[..4].iter().rev() {
        poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(c));
    }
    poly = _mm512_mul_ps(poly, t);
    let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z)));
    // erf(|u|) = 1 - poly * e; erf(u) takes u's sign.
    let erf_abs = _mm512_fnmadd_ps(poly, e, one);
    let sign = _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32(i32::MIN));
    let erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf_abs), sign));
    _mm512_mul_ps(
        _mm512_mul_ps(_mm512_set1_ps(0.5), x),
        _mm512_add_ps(one, erf),
    )
}

/// The erf GELU over `x`, in place.
#[target_feature(enable = "avx512f")]
pub(super) fn gelu_erf(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(W);
    for c in &mut chunks {
        // SAFETY: `c` holds 16 floats.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            _mm512_storeu_ps(c.as_mut_ptr(), gelu(v));
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let m = tail_mask(rest.len());
        // SAFETY: the masked lanes are the `rest.len()` floats of `rest`.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, rest.as_ptr());
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), m, gelu(v));
        }
    }
}

/// Row-wise `softmax(scale * x)` over rows of `width` values, in place.
#[target_feature(enable = "avx512f")]
pub(super) fn softmax_rows(x: &mut [f32], width: usize, scale: f32) {
    if width == 0 {
        return;
    }
    let full = width / W * W;
    let m = tail_mask(width - full);
    let s = _mm512_set1_ps(scale);
    for row in x.chunks_exact_mut(width) {
        let p = row.as_mut_ptr();
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        // SAFETY (all blocks below): offsets below `full` are whole vectors of the row,
        // and the masked lanes of the tail are its last `width - full` floats.
        for i in (0..full).step_by(W) {
            mx = _mm512_max_ps(mx, unsafe { _mm512_loadu_ps(p.add(i)) });
        }
        if full < width {
            let v =
                unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), m, p.add(full)) };
            mx = _mm512_max_ps(mx, v);
        }
        // scale > 0, so max(scale * v) = scale * max(v).
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(mx) * scale);
        let mut sum = _mm512_setzero_ps();
        for i in (0..full).step_by(W) {
            let v = unsafe { _mm512_loadu_ps(p.add(i)) };
            let e = exp(_mm512_fmsub_ps(v, s, max));
            sum = _mm512_add_ps(sum, e);
            unsafe { _mm512_storeu_ps(p.add(i), e) };
        }
        if full < width {
            let v = unsafe { _mm512_maskz_loadu_ps(m, p.add(full)) };
            let e = _mm512_maskz_mov_ps(m, exp(_mm512_fmsub_ps(v, s, max)));
            sum = _mm512_add_ps(sum, e);
            unsafe { _mm512_mask_storeu_ps(p.add(full), m, e) };
        }
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(sum));
        for i in (0..full).step_by(W) {
            unsafe {
                let v = _mm512_loadu_ps(p.add(i));
                _mm512_storeu_ps(p.add(i), _mm512_mul_ps(v, inv));
            }
        }
        if full < width {
            unsafe {
                let v = _mm512_maskz_loadu_ps(m, p.add(full));
                _mm512_mask_storeu_ps(p.add(full), m, _mm512_mul_ps(v, inv));
            }
        }
    }
}
