//! Element-wise and row-wise operations of the encoder: LayerNorm, GELU, softmax, exp.
//!
//! The loops are written so that LLVM vectorises them; on x86-64 the hot ones are compiled a
//! second time with AVX2+FMA enabled, and the erf GELU and the softmax have AVX2 and AVX-512
//! versions written with intrinsics; the [`Isa`] picks one.

use super::features::{cpu_isa, CpuLevel, Isa};

/// `x = LayerNorm(x + residual)` over rows of `gamma.len()` values (biased variance, as
/// PyTorch), in place. `residual` may be empty (plain LayerNorm).
pub fn add_layer_norm(x: &mut [f32], residual: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    add_layer_norm_at(cpu_isa(), x, residual, gamma, beta, eps);
}

/// [`add_layer_norm`] compiled for `isa`.
pub(crate) fn add_layer_norm_at(
    isa: Isa,
    x: &mut [f32],
    residual: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    match isa.level() {
        CpuLevel::Scalar => layer_norm_generic(x, residual, gamma, beta, eps),
        // SAFETY: every level above Scalar has AVX2 and FMA, and `isa` runs here.
        #[cfg(target_arch = "x86_64")]
        _ => unsafe { layer_norm_avx2(x, residual, gamma, beta, eps) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => layer_norm_generic(x, residual, gamma, beta, eps),
    }
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
pub enum Activation {
    /// `0.5 x (1 + erf(x / sqrt 2))` (`hidden_act: gelu`).
    GeluErf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
}

impl Activation {
    /// Applies the activation in place.
    pub fn apply(self, x: &mut [f32]) {
        self.apply_at(cpu_isa(), x);
    }

    /// [`Activation::apply`] on `isa`'s kernel.
    pub(crate) fn apply_at(self, isa: Isa, x: &mut [f32]) {
        match (isa.level(), self) {
            (CpuLevel::Scalar, _) => apply_generic(self, x),
            // SAFETY: `isa` runs here, and these levels have AVX-512F.
            #[cfg(target_arch = "x86_64")]
            (CpuLevel::Avx512 | CpuLevel::Avx512Vnni, Activation::GeluErf) => unsafe {
                avx512::gelu_erf(x)
            },
            // SAFETY: `isa` runs here, and these levels have AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            (CpuLevel::Avx2 | CpuLevel::AvxVnni, Activation::GeluErf) => unsafe {
                avx2::gelu_erf(x)
            },
            // SAFETY: every level above Scalar has AVX2 and FMA, and `isa` runs here.
            #[cfg(target_arch = "x86_64")]
            _ => unsafe { apply_avx2(self, x) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => apply_generic(self, x),
        }
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
pub fn exp(x: f32) -> f32 {
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
pub fn erf(x: f32) -> f32 {
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

/// Row-wise `softmax(scale * x)` over rows of `width` values, in place (`scale > 0`).
pub fn softmax_rows(x: &mut [f32], width: usize, scale: f32) {
    softmax_rows_at(cpu_isa(), x, width, scale);
}

/// [`softmax_rows`] on `isa`'s kernel.
pub(crate) fn softmax_rows_at(isa: Isa, x: &mut [f32], width: usize, scale: f32) {
    match isa.level() {
        CpuLevel::Scalar => softmax_generic(x, width, scale),
        // SAFETY: `isa` runs here, and these levels have AVX-512F.
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe { avx512::softmax_rows(x, width, scale) },
        // SAFETY: every level above Scalar has AVX2 and FMA, and `isa` runs here.
        #[cfg(target_arch = "x86_64")]
        _ => unsafe { avx2::softmax_rows(x, width, scale) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => softmax_generic(x, width, scale),
    }
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

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
mod tests;
