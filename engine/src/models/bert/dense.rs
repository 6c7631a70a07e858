//! The encoder's dense layers (`y = x · Wᵀ + b`): weights packed once at load time into the
//! panels of [`kernels::PackedB`], so a forward pass only multiplies (no per-call packing of the
//! weights), and a row's result does not depend on the batch it was computed in. Large
//! products are split over the current rayon pool.

use kernels::{gemm_packed_cols, gemm_packed_post, Activation, Epilogue, KernelError, PackedB};

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
        self.forward_act(m, x, out, None)
    }

    /// `out = act(x · Wᵀ + b)`, the activation applied to each tile of the product as it is
    /// finished (no second pass over `out`).
    pub(crate) fn forward_act(
        &self,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        act: Option<Activation>,
    ) -> Result<()> {
        let (n, k) = (self.n, self.k);
        if x.len() < m * k || out.len() < m * n || self.bias.len() != n {
            return Err(EngineError::Internal(format!(
                "dense layer {n}x{k}: {} inputs and {} outputs for {m} rows",
                x.len(),
                out.len()
            )));
        }
        let post = Epilogue {
            bias: Some(&self.bias),
            act,
        };
        gemm_packed_post(m, x, k, &self.weight, out, n, post, true).map_err(internal)
    }
}

/// The activation a config's `hidden_act` names.
impl Dense {
    /// Whether [`Dense::forward_cols`] serves outputs `first .. first + n` (whole panels).
    pub(crate) fn has_cols(&self, first: usize, n: usize) -> bool {
        self.weight.cols(first, n).is_ok()
    }

    /// Outputs `first .. first + n` only ([`Dense::has_cols`]), written `ldc` apart: part of a
    /// fused projection, e.g. the keys and values of a fused query-key-value layer.
    pub(crate) fn forward_cols(
        &self,
        m: usize,
        x: &[f32],
        (first, n): (usize, usize),
        out: &mut [f32],
        ldc: usize,
    ) -> Result<()> {
        let bias = self.bias.get(first..first + n).ok_or_else(|| {
            EngineError::Internal(format!("dense layer {}: no outputs {first}+{n}", self.n))
        })?;
        let post = Epilogue {
            bias: Some(bias),
            act: None,
        };
        let cols = self.weight.cols(first, n).map_err(internal)?;
        gemm_packed_cols(m, x, self.k, cols, out, ldc, post, true).map_err(internal)
    }
}

pub(crate) fn activation_from_hf(name: &str) -> Option<Activation> {
    match name {
        "gelu" => Some(Activation::GeluErf),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
        "relu" => Some(Activation::Relu),
        _ => None,
    }
}

/// A kernel's shape error here is a bug in the layer wiring.
pub(crate) fn internal(e: KernelError) -> EngineError {
    EngineError::Internal(e.to_string())
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
    fn fused_activation_equals_a_second_pass() {
        // Enough rows for several row blocks, and columns for whole and partial tiles.
        let (m, k, n) = (200, 384, 1552);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13) % 89) as f32 / 440.0 - 0.1)
            .collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let layer = Dense::new(&w, b, n, k);
        for act in [Activation::GeluErf, Activation::GeluTanh, Activation::Relu] {
            let mut want = vec![f32::NAN; m * n];
            layer.forward(m, &x, &mut want).unwrap();
            assert!(
                want.iter().any(|&v| v < -0.5),
                "some inputs to the activation are negative"
            );
            act.apply(&mut want);
            let mut got = vec![f32::NAN; m * n];
            layer.forward_act(m, &x, &mut got, Some(act)).unwrap();
            assert_eq!(got, want, "{act:?}");
        }
    }

    #[test]
    fn hidden_act_names() {
        assert_eq!(activation_from_hf("gelu"), Some(Activation::GeluErf));
        assert_eq!(activation_from_hf("gelu_new"), Some(Activation::GeluTanh));
        assert_eq!(activation_from_hf("relu"), Some(Activation::Relu));
        assert_eq!(activation_from_hf("swish"), None);
    }

    #[test]
    fn shape_errors() {
        let layer = Dense::new(&[0.0; 6], vec![0.0; 2], 2, 3);
        let mut out = vec![0.0; 2];
        assert!(layer.forward(2, &[0.0; 6], &mut out).is_err());
    }
}
