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

/// Eight vectors of eight dwords transposed: lane `i` of output `c` is lane `c` of input `i`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}
