//! x86_64 helpers shared by the kernels.

use std::arch::x86_64::*;

/// The sum of the 8 lanes of `v`. Callable without `unsafe` from any kernel compiled with AVX2
/// (which implies AVX).
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The outputs of a lane kernel (lane `i` holds weight row `i`, vector `j` activation row `j`):
/// `out[i * X + j] = acc[j][i] + offs[j][i]` for the first `n` lanes.
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn lanes_out<const X: usize>(
    acc: &[__m256; X],
    offs: &[__m256; X],
    n: usize,
    out: &mut [f32],
) {
    let mut lanes = [[0f32; 8]; 2];
    for j in 0..X {
        // SAFETY: two arrays of 8 floats.
        unsafe {
            _mm256_storeu_ps(lanes[0].as_mut_ptr(), acc[j]);
            _mm256_storeu_ps(lanes[1].as_mut_ptr(), offs[j]);
        }
        for i in 0..n {
            out[i * X + j] = lanes[0][i] + lanes[1][i];
        }
    }
}
