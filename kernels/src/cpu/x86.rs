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
