//! AVX2 + FMA versions of [`super::exp`], the erf GELU and the softmax: the formulas of the
//! AVX-512 ones on 8 lanes. LLVM vectorises the scalar loops too, but without fused
//! multiply-adds and with the constants reloaded per call, which costs about twice the time.
//! A row's tail goes through the same code with masked loads and stores, so an element's
//! result does not depend on where it sits in the row.

use std::arch::x86_64::*;

const W: usize = 8;

/// Mask of the first `n` (< 8) lanes, for `maskload` / `maskstore`.
#[inline(always)]
fn tail_mask(n: usize) -> __m256i {
    let lanes: [i32; W] = std::array::from_fn(|i| if i < n { -1 } else { 0 });
    // SAFETY: `lanes` holds the 8 i32 the load reads.
    unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) }
}

/// `e^x` lane-wise: [`super::exp`]'s reduction and polynomial.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp(x: __m256) -> __m256 {
    exp_n([x])[0]
}

/// [`exp`] on `N` vectors, step by step (see [`gelu`]).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
fn exp_n<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0;
    let x: [__m256; N] = std::array::from_fn(|i| {
        _mm256_min_ps(
            _mm256_max_ps(x[i], _mm256_set1_ps(-87.0)),
            _mm256_set1_ps(88.0),
        )
    });
    let t: [__m256; N] = std::array::from_fn(|i| {
        _mm256_fmadd_ps(x[i], _mm256_set1_ps(LOG2E), _mm256_set1_ps(MAGIC))
    });
    let n: [__m256; N] = std::array::from_fn(|i| _mm256_sub_ps(t[i], _mm256_set1_ps(MAGIC)));
    let f: [__m256; N] = std::array::from_fn(|i| {
        let f = _mm256_fnmadd_ps(n[i], _mm256_set1_ps(LN2_HI), x[i]);
        _mm256_fnmadd_ps(n[i], _mm256_set1_ps(LN2_LO), f)
    });
    let mut p = [_mm256_set1_ps(1.0 / 5040.0); N];
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        for i in 0..N {
            p[i] = _mm256_fmadd_ps(p[i], f[i], _mm256_set1_ps(c));
        }
    }
    std::array::from_fn(|i| {
        let ni = _mm256_sub_epi32(
            _mm256_castps_si256(t[i]),
            _mm256_set1_epi32(MAGIC.to_bits() as i32),
        );
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            ni,
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(p[i], scale)
    })
}

/// `0.5 x (1 + erf(x / sqrt 2))` lane-wise, erf as in [`super::erf`], on `N` vectors at once:
/// each step runs on all of them before the next, so their long dependency chains overlap
/// (one at a time, the GELU is bound by the latency of its chain, not by the FMA units).
/// The GEMM applies it to its accumulators before they are stored, and [`gelu_erf`] to a
/// slice, with the same result for each lane.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub(crate) fn gelu<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let sign_bit = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let u: [__m256; N] = std::array::from_fn(|i| {
        _mm256_mul_ps(x[i], _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2))
    });
    let z: [__m256; N] = std::array::from_fn(|i| _mm256_andnot_ps(sign_bit, u[i]));
    let t: [__m256; N] =
        std::array::from_fn(|i| _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(P), z[i], one)));
    let mut poly = [_mm256_set1_ps(A[4]); N];
    for &c in A[..4].iter().rev() {
        for i in 0..N {
            poly[i] = _mm256_fmadd_ps(poly[i], t[i], _mm256_set1_ps(c));
        }
    }
    let neg_sq: [__m256; N] =
        std::array::from_fn(|i| _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(z[i], z[i])));
    let e = exp_n(neg_sq);
    std::array::from_fn(|i| {
        // erf(|u|) = 1 - poly * t * e; erf(u) takes u's sign.
        let erf_abs = _mm256_fnmadd_ps(_mm256_mul_ps(poly[i], t[i]), e[i], one);
        let erf = _mm256_or_ps(erf_abs, _mm256_and_ps(u[i], sign_bit));
        _mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(0.5), x[i]),
            _mm256_add_ps(one, erf),
        )
    })
}

/// The erf GELU over `x`, in place.
#[target_feature(enable = "avx2,fma")]
pub(super) fn gelu_erf(x: &mut [f32]) {
    const STEP: usize = 4;
    let mut wide = x.chunks_exact_mut(STEP * W);
    for c in &mut wide {
        let p = c.as_mut_ptr();
        // SAFETY: `c` holds STEP vectors of 8 floats.
        unsafe {
            let v: [__m256; STEP] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(i * W)));
            for (i, g) in gelu(v).into_iter().enumerate() {
                _mm256_storeu_ps(p.add(i * W), g);
            }
        }
    }
    let mut chunks = wide.into_remainder().chunks_exact_mut(W);
    for c in &mut chunks {
        // SAFETY: `c` holds 8 floats.
        unsafe {
            let v = _mm256_loadu_ps(c.as_ptr());
            _mm256_storeu_ps(c.as_mut_ptr(), gelu([v])[0]);
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let m = tail_mask(rest.len());
        // SAFETY: the masked lanes are the `rest.len()` floats of `rest`.
        unsafe {
            let v = _mm256_maskload_ps(rest.as_ptr(), m);
            _mm256_maskstore_ps(rest.as_mut_ptr(), m, gelu([v])[0]);
        }
    }
}

/// Horizontal sum of the 8 lanes, in a fixed order.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn reduce_add(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Largest of the 8 lanes.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn reduce_max(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Row-wise `softmax(scale * x)` over rows of `width` values, in place (`scale > 0`).
#[target_feature(enable = "avx2,fma")]
pub(super) fn softmax_rows(x: &mut [f32], width: usize, scale: f32) {
    if width == 0 {
        return;
    }
    let full = width / W * W;
    let m = tail_mask(width - full);
    let s = _mm256_set1_ps(scale);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for row in x.chunks_exact_mut(width) {
        let p = row.as_mut_ptr();
        let mut mx = neg_inf;
        // SAFETY (all blocks below): offsets below `full` are whole vectors of the row,
        // and the masked lanes of the tail are its last `width - full` floats.
        for i in (0..full).step_by(W) {
            mx = _mm256_max_ps(mx, unsafe { _mm256_loadu_ps(p.add(i)) });
        }
        if full < width {
            let v = unsafe { _mm256_maskload_ps(p.add(full), m) };
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(m)));
        }
        // scale > 0, so max(scale * v) = scale * max(v).
        let max = _mm256_set1_ps(reduce_max(mx) * scale);
        let mut sum = _mm256_setzero_ps();
        for i in (0..full).step_by(W) {
            let v = unsafe { _mm256_loadu_ps(p.add(i)) };
            let e = exp(_mm256_fmsub_ps(v, s, max));
            sum = _mm256_add_ps(sum, e);
            unsafe { _mm256_storeu_ps(p.add(i), e) };
        }
        if full < width {
            let v = unsafe { _mm256_maskload_ps(p.add(full), m) };
            let e = _mm256_and_ps(exp(_mm256_fmsub_ps(v, s, max)), _mm256_castsi256_ps(m));
            sum = _mm256_add_ps(sum, e);
            unsafe { _mm256_maskstore_ps(p.add(full), m, e) };
        }
        let inv = _mm256_set1_ps(1.0 / reduce_add(sum));
        for i in (0..full).step_by(W) {
            unsafe {
                let v = _mm256_loadu_ps(p.add(i));
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(v, inv));
            }
        }
        if full < width {
            unsafe {
                let v = _mm256_maskload_ps(p.add(full), m);
                _mm256_maskstore_ps(p.add(full), m, _mm256_mul_ps(v, inv));
            }
        }
    }
}
