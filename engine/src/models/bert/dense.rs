//! The encoder's dense layers (`y = x · Wᵀ + b`): weights packed once at load time into the
//! panels of [`super::gemm`], so a forward pass only multiplies (no per-call packing of the
//! weights), and a row's result does not depend on the batch it was computed in. Large
//! products are split over the current rayon pool.

use super::gemm::{gemm, PackedB};
use crate::error::{EngineError, Result};

/// One `Linear` layer's weight (`n` outputs × `k` inputs), packed, and bias.
pub(crate) struct Dense {
    n: usize,
    k: usize,
    bias: Vec<f32>,
    weight: PackedB,
}

impl Dense {
    /// `w` is the PyTorch weight (`n × k`, row-major), `bias` has `n` values.
    pub(crate) fn new(w: &[f32], bias: Vec<f32>, n: usize, k: usize) -> Self {
        Dense {
            n,
            k,
            bias,
            weight: PackedB::from_linear(w, n, k),
        }
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
        gemm(m, x, k, &self.weight, out, n, Some(&self.bias), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition() {
        let (m, k, n) = (53, 96, 40);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let layer = Dense::new(&w, b.clone(), n, k);
        let mut out = vec![f32::NAN; m * n];
        layer.forward(m, &x, &mut out).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum::<f64>()
                    + b[j] as f64;
                let got = out[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "({i}, {j}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn shape_errors() {
        let layer = Dense::new(&[0.0; 6], vec![0.0; 2], 2, 3);
        let mut out = vec![0.0; 2];
        assert!(layer.forward(2, &[0.0; 6], &mut out).is_err());
    }
}
