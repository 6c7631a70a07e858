//! Element-wise and row-wise operations of the encoder: LayerNorm, GELU, softmax, exp.
//!
//! The loops are written so that LLVM vectorises them; on x86-64 the hot ones are compiled a
//! second time with AVX2+FMA enabled and picked at run time.

/// `x = LayerNorm(x + residual)` over rows of `gamma.len()` values (biased variance, as
/// PyTorch), in place. `residual` may be empty (plain LayerNorm).
pub(crate) fn add_layer_norm(
    x: &mut [f32],
    residual: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected on this CPU.
            unsafe { layer_norm_avx2(x, residual, gamma, beta, eps) };
            return;
        }
    }
    layer_norm_generic(x, residual, gamma, beta, eps);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn layer_norm_avx2(x: &mut [f32], residual: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    layer_norm_generic(x, residual, gamma, beta, eps);
}

#[inline(always)]
fn layer_norm_generic(x: &mut [f32], residual: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let h = gamma.len();
    if h == 0 {
        return;
    }
    for (r, row) in x.chunks_exact_mut(h).enumerate() {
        if !residual.is_empty() {
            for (v, &res) in row.iter_mut().zip(&residual[r * h..(r + 1) * h]) {
                *v += res;
            }
        }
        let mean = sum_lanes(row) / h as f32;
        let mut sq = [0.0f32; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for (a, &v) in sq.iter_mut().zip(c) {
                *a += (v - mean) * (v - mean);
            }
        }
        let tail: f32 = chunks
            .remainder()
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum();
        let var = (sum_lanes(&sq) + tail) / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, &g), &b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// The activation between the two FFN matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// `0.5 x (1 + erf(x / sqrt 2))` (`hidden_act: gelu`).
    GeluErf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
}

impl Activation {
    pub(crate) fn from_hf(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    /// Applies the activation in place.
    pub(crate) fn apply(self, x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if self == Activation::GeluErf && std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was detected on this CPU.
                unsafe { avx512::gelu_erf(x) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the features were detected on this CPU.
                unsafe { apply_avx2(self, x) };
                return;
            }
        }
        apply_generic(self, x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn apply_avx2(act: Activation, x: &mut [f32]) {
    apply_generic(act, x);
}

#[inline(always)]
fn apply_generic(act: Activation, x: &mut [f32]) {
    match act {
        Activation::GeluErf => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        Activation::GeluTanh => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        Activation::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
    }
}

/// `e^x` for f32 without a libm call, so loops over it vectorise. Inputs are clamped to the
/// range where the result is a normal float; relative error about 2e-7.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact for |n| < 2^8.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 * 2^23 rounds to an integer and leaves it in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let f = (x - n * LN2_HI) - n * LN2_LO;
    // e^f on |f| <= ln2/2: Taylor series to degree 7 (truncation error < 1e-8).
    let p = 1.0
        + f * (1.0
            + f * (0.5
                + f * (1.0 / 6.0
                    + f * (1.0 / 24.0
                        + f * (1.0 / 120.0 + f * (1.0 / 720.0 + f * (1.0 / 5040.0)))))));
    let scale = f32::from_bits(((ni + 127) as u32) << 23);
    p * scale
}

/// `erf(x)` (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_6;
    const A2: f32 = -0.284_496_74;
    const A3: f32 = 1.421_413_8;
    const A4: f32 = -1.453_152;
    const A5: f32 = 1.061_405_4;
    let z = x.abs();
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5))));
    let y = 1.0 - poly * exp(-z * z);
    y.copysign(x)
}

#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    let u = C * (x + 0.044_715 * x * x * x);
    // tanh(u) = 1 - 2 / (e^{2u} + 1)
    let th = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
    0.5 * x * (1.0 + th)
}

/// Row-wise `softmax(scale * x)` over rows of `width` values, in place.
pub(crate) fn softmax_rows(x: &mut [f32], width: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected on this CPU.
            unsafe { avx512::softmax_rows(x, width, scale) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features were detected on this CPU.
            unsafe { softmax_avx2(x, width, scale) };
            return;
        }
    }
    softmax_generic(x, width, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_avx2(x: &mut [f32], width: usize, scale: f32) {
    softmax_generic(x, width, scale);
}

#[inline(always)]
fn softmax_generic(x: &mut [f32], width: usize, scale: f32) {
    if width == 0 {
        return;
    }
    for row in x.chunks_exact_mut(width) {
        // scale > 0, so max(scale * v) = scale * max(v).
        let max = max_lanes(row) * scale;
        row.iter_mut().for_each(|v| *v = exp(*v * scale - max));
        let inv = 1.0 / sum_lanes(row);
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// [`exp`] on 16 lanes, for the fused attention.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::exp as exp512;

/// AVX-512 versions of [`exp`], the erf GELU and the softmax: the same formulas on 16 lanes
/// with fused multiply-adds. A row's tail goes through the same code with masked loads and
/// stores, so an element's result does not depend on where it sits in the row.
#[cfg(target_arch = "x86_64")]
mod avx512 {
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
                let v = unsafe {
                    _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), m, p.add(full))
                };
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
}

/// Lanes of the partial sums and maxima below: fixed, so results do not depend on how the
/// loops were compiled.
const LANES: usize = 8;

/// Sum of `v` with [`LANES`] partial sums (vectorisable, unlike a strict left-to-right sum).
#[inline(always)]
pub(crate) fn sum_lanes(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let mut total =
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in chunks.remainder() {
        total += x;
    }
    total
}

/// Largest element of `v` (`-inf` for an empty slice).
#[inline(always)]
fn max_lanes(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let mut best = f32::NEG_INFINITY;
    for x in acc.into_iter().chain(chunks.remainder().iter().copied()) {
        best = if x > best { x } else { best };
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!(
                ((got - want) / want).abs() < 5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.173;
        }
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn erf_is_accurate() {
        // Reference values of erf.
        for &(x, want) in &[
            (0.0f32, 0.0f64),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((erf(x) as f64 - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn activations() {
        let mut v = vec![-3.0, -1.0, 0.0, 1.0, 3.0];
        Activation::GeluErf.apply(&mut v);
        let want = [-0.004_049_7, -0.158_655_25, 0.0, 0.841_344_7, 2.995_950_3];
        for (g, w) in v.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        let mut v = vec![-1.0, 1.0];
        Activation::GeluTanh.apply(&mut v);
        assert!(
            (v[1] - 0.841_192).abs() < 1e-5 && (v[0] + 0.158_808).abs() < 1e-5,
            "{v:?}"
        );
        let mut v = vec![-1.0, 2.0];
        Activation::Relu.apply(&mut v);
        assert_eq!(v, vec![0.0, 2.0]);
        assert_eq!(Activation::from_hf("gelu"), Some(Activation::GeluErf));
        assert_eq!(Activation::from_hf("swish"), None);
    }

    #[test]
    fn vector_paths_match_the_scalar_ones() {
        // 37 values: two whole 16-lane vectors and a masked tail.
        let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
        let mut g = x.clone();
        Activation::GeluErf.apply(&mut g);
        for (v, got) in x.iter().zip(&g) {
            let want = gelu_erf(*v);
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "gelu({v}) = {got}, want {want}"
            );
        }
        let mut s = x.clone();
        softmax_rows(&mut s, 37, 0.5);
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64 * 0.5;
        let e: Vec<f64> = x.iter().map(|&v| (v as f64 * 0.5 - max).exp()).collect();
        let total: f64 = e.iter().sum();
        for (got, want) in s.iter().zip(&e) {
            assert!(
                (*got as f64 - want / total).abs() < 1e-7,
                "{got} vs {}",
                want / total
            );
        }
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, 1000.0, 1000.0, -1000.0];
        softmax_rows(&mut x, 3, 0.5);
        let e: Vec<f64> = [0.5f64, 1.0, 1.5].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for (g, w) in x[..3].iter().zip(&e) {
            assert!((*g as f64 - w / s).abs() < 1e-6);
        }
        assert!(
            (x[3] - 0.5).abs() < 1e-6 && (x[4] - 0.5).abs() < 1e-6,
            "{x:?}"
        );
        assert!(x[5] < 1e-30, "{x:?}");
    }

    #[test]
    fn lane_reductions() {
        let v: Vec<f32> = (0..21).map(|i| i as f32 - 3.0).collect();
        assert_eq!(sum_lanes(&v), v.iter().sum::<f32>());
        assert_eq!(max_lanes(&v), 17.0);
        assert_eq!(max_lanes(&[]), f32::NEG_INFINITY);
        assert_eq!(sum_lanes(&[]), 0.0);
    }

    #[test]
    fn layer_norm_matches_definition() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        let res = vec![1.0, 0.0, 0.0, -1.0];
        add_layer_norm(&mut x, &res, &[1.0, 2.0], &[0.0, 1.0], 1e-12);
        // rows after the residual: [2, 2] and [3, 3] -> zero variance -> beta.
        assert_eq!(x, vec![0.0, 1.0, 0.0, 1.0]);
        let mut y = vec![0.0, 2.0];
        add_layer_norm(&mut y, &[], &[1.0, 1.0], &[0.0, 0.0], 0.0);
        assert!((y[0] + 1.0).abs() < 1e-6 && (y[1] - 1.0).abs() < 1e-6);
    }
}
