//! Attention's two products over the query heads that share a KV head: the scores of every
//! head against a run of key rows, and every head's weighted sum of a run of value rows.
//!
//! Each key or value row is loaded once for all the heads (a tile of heads by rows keeps its
//! sums in registers), where a call per head loads every row once per head and pays the
//! call, the lane reduction and the tails per head. The one-head operations
//! ([`super::dots`], [`super::axpy_rows`]) are these with one head, so a query's attention is
//! the same bits whichever path (or group size) computed it.

use super::super::features::{cpu_isa, CpuLevel, Isa};

/// `out[h * out_stride + r] = q_h · row_r` for the `q.len() / d` vectors `q_h = q[h·d..][..d]`
/// and the `n` rows `row_r = rows[r·stride..][..d]`: each value bit for bit what
/// [`super::dots`] gives for that vector and row.
///
/// # Panics
/// If `q.len()` is not a multiple of `d`, or `rows` or `out` is shorter than the shapes
/// claim.
pub fn dots_heads(
    q: &[f32],
    d: usize,
    rows: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    dots_heads_at(cpu_isa(), q, d, rows, stride, n, out, out_stride);
}

/// [`dots_heads`] on `isa`'s kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dots_heads_at(
    isa: Isa,
    q: &[f32],
    d: usize,
    rows: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    if n == 0 || q.is_empty() {
        return;
    }
    assert!(
        d > 0 && q.len().is_multiple_of(d),
        "dots_heads: {} floats in heads of {d}",
        q.len()
    );
    let heads = q.len() / d;
    assert!(
        rows.len() >= (n - 1) * stride + d && out.len() >= (heads - 1) * out_stride + n,
        "dots_heads: rows or output too short"
    );
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here; the bounds
        // were checked above.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::dots_heads(q, d, rows, stride, n, out, out_stride)
        },
        _ => {
            for (h, qh) in q.chunks_exact(d).enumerate() {
                super::dots_at(isa, qh, rows, stride, &mut out[h * out_stride..][..n]);
            }
        }
    }
}

/// `y_h += Σ_{j<n} alpha[h·alpha_stride + j] · row_j` for the `y.len() / d` vectors
/// `y_h = y[h·d..][..d]` and the rows `row_j = x[j·stride..][..d]`: each vector bit for bit
/// what [`super::axpy_rows`] gives for it.
///
/// # Panics
/// If `y.len()` is not a multiple of `d`, or `alpha` or `x` is shorter than the shapes claim.
pub fn axpy_rows_heads(
    alpha: &[f32],
    alpha_stride: usize,
    n: usize,
    x: &[f32],
    stride: usize,
    y: &mut [f32],
    d: usize,
) {
    axpy_rows_heads_at(cpu_isa(), alpha, alpha_stride, n, x, stride, y, d);
}

/// [`axpy_rows_heads`] on `isa`'s kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn axpy_rows_heads_at(
    isa: Isa,
    alpha: &[f32],
    alpha_stride: usize,
    n: usize,
    x: &[f32],
    stride: usize,
    y: &mut [f32],
    d: usize,
) {
    if n == 0 || y.is_empty() {
        return;
    }
    assert!(
        d > 0 && y.len().is_multiple_of(d),
        "axpy_rows_heads: {} floats in heads of {d}",
        y.len()
    );
    let heads = y.len() / d;
    assert!(
        alpha.len() >= (heads - 1) * alpha_stride + n && x.len() >= (n - 1) * stride + d,
        "axpy_rows_heads: weights or rows too short"
    );
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every level above Scalar has the features, and `isa` runs here; the bounds
        // were checked above.
        CpuLevel::Avx2 | CpuLevel::AvxVnni | CpuLevel::Avx512 | CpuLevel::Avx512Vnni => unsafe {
            x86::axpy_rows_heads(alpha, alpha_stride, n, x, stride, y, d)
        },
        _ => {
            for (h, yh) in y.chunks_exact_mut(d).enumerate() {
                super::axpy_rows_at(isa, &alpha[h * alpha_stride..][..n], x, stride, yh);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The shapes are as [`super::dots_heads_at`] checked them.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dots_heads(
        q: &[f32],
        d: usize,
        rows: &[f32],
        stride: usize,
        n: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let heads = q.len() / d;
        let mut h0 = 0;
        while h0 < heads {
            let hn = (heads - h0).min(4);
            // Eight sums a tile: heads by rows.
            let rt = 8 / hn.next_power_of_two();
            let mut r0 = 0;
            while r0 < n {
                let rn = (n - r0).min(rt);
                let t = Tile {
                    q: &q[h0 * d..(h0 + hn) * d],
                    d,
                    rows: &rows[r0 * stride..],
                    stride,
                    out: &mut out[h0 * out_stride + r0..],
                    out_stride,
                };
                // SAFETY: `hn` heads and `rn` rows are inside the slices (checked by the
                // caller's bounds).
                unsafe {
                    match (hn, rn) {
                        (4, 1) => t.dots::<4, 1>(),
                        (4, _) => t.dots::<4, 2>(),
                        (3, 1) => t.dots::<3, 1>(),
                        (3, _) => t.dots::<3, 2>(),
                        (2, 1) => t.dots::<2, 1>(),
                        (2, 2) => t.dots::<2, 2>(),
                        (2, 3) => t.dots::<2, 3>(),
                        (2, _) => t.dots::<2, 4>(),
                        (_, 1) => t.dots::<1, 1>(),
                        (_, 2) => t.dots::<1, 2>(),
                        (_, 3) => t.dots::<1, 3>(),
                        (_, 4) => t.dots::<1, 4>(),
                        (_, 5) => t.dots::<1, 5>(),
                        (_, 6) => t.dots::<1, 6>(),
                        (_, 7) => t.dots::<1, 7>(),
                        (_, _) => t.dots::<1, 8>(),
                    }
                }
                r0 += rn;
            }
            h0 += hn;
        }
    }

    struct Tile<'a> {
        q: &'a [f32],
        d: usize,
        rows: &'a [f32],
        stride: usize,
        out: &'a mut [f32],
        out_stride: usize,
    }

    impl Tile<'_> {
        /// `H` heads against `R` rows (`H·R ≤ 8`): one multiply-add chain per (head, row)
        /// over 8-float chunks, lane sums as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)),
        /// then the leftover elements in order: the operations of `dots` for each pair.
        ///
        /// # Safety
        /// `q` holds `H` vectors of `d`, `rows` `R` rows of `d` floats `stride` apart, `out`
        /// `R` values at each of `H` offsets `out_stride` apart.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn dots<const H: usize, const R: usize>(self) {
            let d = self.d;
            let full = d / 8 * 8;
            let (qp, rp) = (self.q.as_ptr(), self.rows.as_ptr());
            let mut acc = [[_mm256_setzero_ps(); R]; H];
            // SAFETY (both blocks): chunks `c + 8 <= full <= d` of vectors and rows inside
            // the slices, as the caller vouches.
            unsafe {
                for c in (0..full).step_by(8) {
                    let rv: [__m256; R] =
                        std::array::from_fn(|r| _mm256_loadu_ps(rp.add(r * self.stride + c)));
                    for (h, ah) in acc.iter_mut().enumerate() {
                        let qv = _mm256_loadu_ps(qp.add(h * d + c));
                        for (a, &r) in ah.iter_mut().zip(&rv) {
                            *a = _mm256_fmadd_ps(qv, r, *a);
                        }
                    }
                }
            }
            let flat: [__m256; 8] = std::array::from_fn(|i| {
                if i < H * R {
                    acc[i / R][i % R]
                } else {
                    _mm256_setzero_ps()
                }
            });
            let lanes = lane_sums(&flat);
            for h in 0..H {
                for r in 0..R {
                    let row = &self.rows[r * self.stride..][..d];
                    let qh = &self.q[h * d..][..d];
                    let mut s = lanes[h * R + r];
                    for e in full..d {
                        s += qh[e] * row[e];
                    }
                    self.out[h * self.out_stride + r] = s;
                }
            }
        }
    }

    /// Each vector's lane sum, as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn lane_sums(acc: &[__m256; 8]) -> [f32; 8] {
        let h01 = _mm256_hadd_ps(acc[0], acc[1]);
        let h23 = _mm256_hadd_ps(acc[2], acc[3]);
        let h45 = _mm256_hadd_ps(acc[4], acc[5]);
        let h67 = _mm256_hadd_ps(acc[6], acc[7]);
        let h0123 = _mm256_hadd_ps(h01, h23);
        let h4567 = _mm256_hadd_ps(h45, h67);
        let sums = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(h0123, h4567),
            _mm256_permute2f128_ps::<0x31>(h0123, h4567),
        );
        let mut lanes = [0f32; 8];
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
        lanes
    }

    /// # Safety
    /// The shapes are as [`super::axpy_rows_heads_at`] checked them.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy_rows_heads(
        alpha: &[f32],
        alpha_stride: usize,
        n: usize,
        x: &[f32],
        stride: usize,
        y: &mut [f32],
        d: usize,
    ) {
        let heads = y.len() / d;
        let full = d / 8 * 8;
        let mut h0 = 0;
        while h0 < heads {
            let hn = (heads - h0).min(4);
            let mut c0 = 0;
            while c0 < full {
                let vn = ((full - c0) / 8).min(2);
                let t = AxpyTile {
                    alpha: &alpha[h0 * alpha_stride..],
                    alpha_stride,
                    n,
                    x: &x[c0..],
                    stride,
                    y: &mut y[h0 * d + c0..],
                    d,
                };
                // SAFETY: `hn` heads and `vn` vectors from `c0` are inside the slices.
                unsafe {
                    match (hn, vn) {
                        (4, 1) => t.run::<4, 1>(),
                        (4, _) => t.run::<4, 2>(),
                        (3, 1) => t.run::<3, 1>(),
                        (3, _) => t.run::<3, 2>(),
                        (2, 1) => t.run::<2, 1>(),
                        (2, _) => t.run::<2, 2>(),
                        (_, 1) => t.run::<1, 1>(),
                        (_, _) => t.run::<1, 2>(),
                    }
                }
                c0 += 8 * vn;
            }
            h0 += hn;
        }
        // The leftover elements as `axpy_rows` takes them: row by row, each its own multiply
        // and add.
        for h in 0..heads {
            for i in full..d {
                for j in 0..n {
                    y[h * d + i] += alpha[h * alpha_stride + j] * x[j * stride + i];
                }
            }
        }
    }

    struct AxpyTile<'a> {
        alpha: &'a [f32],
        alpha_stride: usize,
        n: usize,
        x: &'a [f32],
        stride: usize,
        y: &'a mut [f32],
        d: usize,
    }

    impl AxpyTile<'_> {
        /// `H` heads' `V` vectors of `y` held in registers while every row meets them: per
        /// element, one fused multiply-add per row in order, as `axpy_rows`.
        ///
        /// # Safety
        /// `y` holds `V` vectors at each of `H` offsets `d` apart, `x` `n` rows of `8·V`
        /// floats `stride` apart, `alpha` `n` weights at each of `H` offsets.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run<const H: usize, const V: usize>(self) {
            let (xp, ap, yp) = (self.x.as_ptr(), self.alpha.as_ptr(), self.y.as_mut_ptr());
            // SAFETY (whole block): the offsets below are inside the slices, as the caller
            // vouches.
            unsafe {
                let mut acc: [[__m256; V]; H] = std::array::from_fn(|h| {
                    std::array::from_fn(|v| _mm256_loadu_ps(yp.add(h * self.d + 8 * v)))
                });
                for j in 0..self.n {
                    let row: [__m256; V] =
                        std::array::from_fn(|v| _mm256_loadu_ps(xp.add(j * self.stride + 8 * v)));
                    for (h, ah) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*ap.add(h * self.alpha_stride + j));
                        for (a, &r) in ah.iter_mut().zip(&row) {
                            *a = _mm256_fmadd_ps(w, r, *a);
                        }
                    }
                }
                for (h, ah) in acc.iter().enumerate() {
                    for (v, a) in ah.iter().enumerate() {
                        _mm256_storeu_ps(yp.add(h * self.d + 8 * v), *a);
                    }
                }
            }
        }
    }
}
