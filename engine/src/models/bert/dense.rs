//! The encoder's dense layers (`y = x · Wᵀ + b`) behind one type, with two backends chosen at
//! load time:
//! - [`DenseBackend::Packed`]: our AVX2/FMA kernel on weights packed once ([`super::gemm`]);
//!   as fast as the `gemm` crate on AVX2 machines and bit-identical whatever the batch;
//! - [`DenseBackend::GemmCrate`]: the `gemm` crate through `kernels::gemm_abt`, on CPUs with
//!   AVX-512, where its wider kernels beat ours.
//!
//! Both split the rows over the current rayon pool.

use rayon::prelude::*;

use super::gemm::{gemm, PackedB};
use crate::error::{EngineError, Result};

/// Which matrix-multiply implementation the dense layers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseBackend {
    Packed,
    GemmCrate,
}

impl DenseBackend {
    /// `GemmCrate` where the CPU has AVX-512F, else `Packed`.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return DenseBackend::GemmCrate;
            }
        }
        DenseBackend::Packed
    }
}

/// Rows per task on the `GemmCrate` backend (at least).
const MIN_ROWS_PER_TASK: usize = 16;

/// One `Linear` layer's weight (`n` outputs × `k` inputs) and bias.
pub(crate) struct Dense {
    n: usize,
    k: usize,
    bias: Vec<f32>,
    weight: Weight,
}

enum Weight {
    Packed(PackedB),
    /// PyTorch layout, `n` rows of `k`.
    RowMajor(Vec<f32>),
}

impl Dense {
    /// `w` is the PyTorch weight (`n × k`, row-major), `bias` has `n` values.
    pub(crate) fn new(
        w: Vec<f32>,
        bias: Vec<f32>,
        n: usize,
        k: usize,
        backend: DenseBackend,
    ) -> Self {
        let weight = match backend {
            DenseBackend::Packed => Weight::Packed(PackedB::from_linear(&w, n, k)),
            DenseBackend::GemmCrate => Weight::RowMajor(w),
        };
        Dense { n, k, bias, weight }
    }

    /// `out[m × n] = x[m × k] · Wᵀ + b` (both row-major, contiguous).
    pub(crate) fn forward(&self, m: usize, x: &[f32], out: &mut [f32]) -> Result<()> {
        let (n, k) = (self.n, self.k);
        if x.len() < m * k || out.len() < m * n || self.bias.len() != n {
            return Err(EngineError::Internal(format!(
                "dense layer {n}x{k}: {} inputs and {} outputs for {m} rows",
                x.len(),
                out.len()
            )));
        }
        match &self.weight {
            Weight::Packed(b) => gemm(m, x, k, b, out, n, Some(&self.bias), true),
            Weight::RowMajor(w) => {
                if m == 0 || n == 0 {
                    return Ok(());
                }
                let threads = rayon::current_num_threads().max(1);
                let rows = m.div_ceil(4 * threads).max(MIN_ROWS_PER_TASK);
                out[..m * n]
                    .par_chunks_mut(rows * n)
                    .zip(x[..m * k].par_chunks(rows * k))
                    .for_each(|(o, xi)| {
                        let r = xi.len() / k.max(1);
                        kernels::gemm_abt(r, n, k, 1.0, xi, k, w, k, o, n);
                        for row in o.chunks_exact_mut(n) {
                            row.iter_mut().zip(&self.bias).for_each(|(y, b)| *y += b);
                        }
                    });
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_agree() {
        let (m, k, n) = (53, 96, 40);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let mut outs = Vec::new();
        for backend in [DenseBackend::Packed, DenseBackend::GemmCrate] {
            let layer = Dense::new(w.clone(), b.clone(), n, k, backend);
            let mut out = vec![f32::NAN; m * n];
            layer.forward(m, &x, &mut out).unwrap();
            outs.push(out);
        }
        for (i, (p, g)) in outs[0].iter().zip(&outs[1]).enumerate() {
            assert!(
                (p - g).abs() <= 1e-4 * (1.0 + p.abs()),
                "element {i}: {p} vs {g}"
            );
        }
        let naive: f32 = (0..k).map(|t| x[t] * w[t]).sum::<f32>() + b[0];
        assert!((outs[0][0] - naive).abs() < 1e-4);
    }

    #[test]
    fn shape_errors() {
        let layer = Dense::new(vec![0.0; 6], vec![0.0; 2], 2, 3, DenseBackend::GemmCrate);
        let mut out = vec![0.0; 2];
        assert!(layer.forward(2, &[0.0; 6], &mut out).is_err());
    }
}
