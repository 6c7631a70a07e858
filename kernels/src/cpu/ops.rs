//! Element-wise and small vector operations: RMSNorm, RoPE, SiLU·mul, softmax, dot, axpy.
//!
//! All take plain slices and panic only on mismatched lengths (a caller bug, documented per
//! function).

use super::features::{cpu_isa, CpuLevel, Isa};

mod heads;
pub use heads::{axpy_rows_heads, dots_heads};
#[cfg(test)]
pub(crate) use heads::{axpy_rows_heads_at, dots_heads_at};

/// `out = x / sqrt(mean(x²) + eps) * w` (Llama RMSNorm), for one row.
///
/// # Panics
/// If `w` or `out` is not as long as `x`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        w.len() == x.len() && out.len() == x.len(),
        "rmsnorm: length mismatch"
    );
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (ss / x.len().max(1) as f64) as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (v * inv);
    }
}

/// Rotary angles for one position: `cos[i], sin[i]` of `pos · freq_scale · θ_i / factor_i`
/// with `θ_i = base^(−2i/rot_dim)`, for `i < rot_dim / 2`. `freq_factors` (Llama 3 style
/// `rope_freqs`) divides each frequency when given.
///
/// # Panics
/// If `cos`/`sin` are shorter than `rot_dim / 2` or `freq_factors` is.
pub fn rope_angles(
    pos: usize,
    base: f32,
    rot_dim: usize,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let half = rot_dim / 2;
    assert!(
        cos.len() >= half && sin.len() >= half,
        "rope_angles: buffers too short"
    );
    for i in 0..half {
        let mut inv = (1.0 / f64::from(base).powf((2 * i) as f64 / rot_dim as f64)) as f32;
        if let Some(f) = freq_factors {
            inv /= f[i];
        }
        // f32 product like the reference implementation, then an accurate cos/sin.
        let angle = (pos as f32 * freq_scale) * inv;
        cos[i] = f64::from(angle).cos() as f32;
        sin[i] = f64::from(angle).sin() as f32;
    }
}

/// Apply rotary embeddings in place to `n_heads` heads of `head_dim` in `x`, rotating the
/// first `rot_dim` dims of each head. `neox` rotates pairs `(i, i + rot_dim/2)` (GPT-NeoX /
/// HF layout); otherwise adjacent pairs `(2i, 2i + 1)` (the original Llama / GGUF layout).
///
/// # Panics
/// If `x` is shorter than `n_heads * head_dim` or `cos`/`sin` shorter than `rot_dim / 2`.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos: &[f32],
    sin: &[f32],
    neox: bool,
) {
    let half = rot_dim / 2;
    assert!(
        x.len() >= n_heads * head_dim && rot_dim <= head_dim,
        "rope: shape mismatch"
    );
    assert!(
        cos.len() >= half && sin.len() >= half,
        "rope: angle buffers too short"
    );
    for h in 0..n_heads {
        let v = &mut x[h * head_dim..h * head_dim + rot_dim];
        if neox {
            let (a, b) = v.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x0 * sin[i] + x1 * cos[i];
            }
        } else {
            for i in 0..half {
                let (x0, x1) = (v[2 * i], v[2 * i + 1]);
                v[2 * i] = x0 * cos[i] - x1 * sin[i];
                v[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU).
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_at(cpu_isa(), gate, up);
}

/// [`silu_mul`] on `isa`'s kernel.
pub(crate) fn silu_mul_at(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::silu_mul(gate, up)
        },
        _ => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
    }
}

/// Softmax in place (max-subtracted, f32).
pub fn softmax(x: &mut [f32]) {
    softmax_at(cpu_isa(), x);
}

/// [`softmax`] on `isa`'s kernel.
pub(crate) fn softmax_at(isa: Isa, x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::exp_sub_sum(x, max)
        },
        _ => {
            let mut s = 0f32;
            for v in x.iter_mut() {
                *v = (*v - max).exp();
                s += *v;
            }
            s
        }
    };
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `a · b`.
///
/// # Panics
/// If the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_at(cpu_isa(), a, b)
}

/// [`dot`] on `isa`'s kernel.
pub(crate) fn dot_at(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::dot(a, b)
        },
        _ => a.iter().zip(b).map(|(x, y)| x * y).sum(),
    }
}

/// `out[r] = q · row_r` for `out.len()` rows, row `r` at `rows[r * stride..][..q.len()]`.
///
/// Each row's value comes from the same operations whatever the other rows of the call are
/// (one chain of multiply-adds over 8-float chunks, a fixed pairwise sum of the lanes, then the
/// leftover elements), so attention scores computed eight keys at a time equal those computed
/// one at a time. Not bit-equal to [`dot`].
///
/// # Panics
/// If `rows` is shorter than the rows claim.
pub fn dots(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    dots_at(cpu_isa(), q, rows, stride, out);
}

/// [`dots`] on `isa`'s kernel.
pub(crate) fn dots_at(isa: Isa, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let n = out.len();
    if n == 0 {
        return;
    }
    assert!(
        rows.len() >= (n - 1) * stride + q.len(),
        "dots: rows too short"
    );
    match isa.level() {
        // One head of the heads' kernel: the same operations.
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni
            if !q.is_empty() =>
        {
            heads::dots_heads_at(isa, q, q.len(), rows, stride, n, out, n)
        }
        _ => {
            for (r, o) in out.iter_mut().enumerate() {
                let row = &rows[r * stride..r * stride + q.len()];
                *o = q.iter().zip(row).map(|(a, b)| a * b).sum();
            }
        }
    }
}

/// `y += alpha * x`.
///
/// # Panics
/// If the lengths differ.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_at(cpu_isa(), alpha, x, y);
}

/// [`axpy`] on `isa`'s kernel.
pub(crate) fn axpy_at(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::axpy(alpha, x, y)
        },
        _ => {
            for (yi, &xi) in y.iter_mut().zip(x) {
                *yi += alpha * xi;
            }
        }
    }
}

/// `y += Σ_j alpha[j] * x_j`, where row `j` is `x[j * stride..][..y.len()]`: bit for bit what
/// [`axpy`] called once per row in order gives (each element takes the same operations in the
/// same order), with `y` held in registers across the rows.
///
/// # Panics
/// If `x` is shorter than the rows claim.
pub fn axpy_rows(alpha: &[f32], x: &[f32], stride: usize, y: &mut [f32]) {
    axpy_rows_at(cpu_isa(), alpha, x, stride, y);
}

/// [`axpy_rows`] on `isa`'s kernel.
pub(crate) fn axpy_rows_at(isa: Isa, alpha: &[f32], x: &[f32], stride: usize, y: &mut [f32]) {
    let n = alpha.len();
    if n == 0 {
        return;
    }
    assert!(
        x.len() >= (n - 1) * stride + y.len(),
        "axpy_rows: rows too short"
    );
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni
            if !y.is_empty() =>
        {
            heads::axpy_rows_heads_at(isa, alpha, n, n, x, stride, y, y.len())
        }
        _ => {
            for (j, &a) in alpha.iter().enumerate() {
                let row = &x[j * stride..j * stride + y.len()];
                for (yi, &xi) in y.iter_mut().zip(row) {
                    *yi += a * xi;
                }
            }
        }
    }
}

/// `y += x` element-wise.
///
/// # Panics
/// If the lengths differ.
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_assign: length mismatch");
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += xi;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::x86::hsum;
    use std::arch::x86_64::*;

    /// e^x for 8 lanes (Cephes-style range reduction and polynomial; relative error about
    /// 1e-7 on the clamped range [-87.3, 88.3]).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
            _mm256_set1_ps(88.3),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_2e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166_666_65));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let n = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let zero = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(zero, g));
                let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
            }
        }
        for i in n..gate.len() {
            gate[i] = gate[i] / (1.0 + (-gate[i]).exp()) * up[i];
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn exp_sub_sum(x: &mut [f32], max: f32) -> f32 {
        let n = x.len() / 8 * 8;
        let m = _mm256_set1_ps(max);
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= x.len().
            unsafe {
                let v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
                _mm256_storeu_ps(x.as_mut_ptr().add(i), v);
                acc = _mm256_add_ps(acc, v);
            }
        }
        let mut s = hsum(acc);
        for v in &mut x[n..] {
            *v = (*v - max).exp();
            s += *v;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len() / 16 * 16;
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 <= n <= both lengths.
            unsafe {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    acc1,
                );
            }
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        for i in n..a.len() {
            s += a[i] * b[i];
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len() / 8 * 8;
        let a = _mm256_set1_ps(alpha);
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                let r = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr().add(i)), yv);
                _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
            }
        }
        for i in n..x.len() {
            y[i] += alpha * x[i];
        }
    }
}

/// Ask the caches to fetch `bytes` ahead of use (into the core's L2): a hint, without effect
/// on any result.
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // Every cache line the bytes touch, the first and last partial ones included.
        let start = bytes.as_ptr() as usize;
        let mut line = start & !63;
        while line < start + bytes.len() {
            // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the
            // address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    line as *const i8,
                )
            };
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
