//! Small f32 building blocks of the encoders kept in f32 (vision and audio towers): a linear
//! map over rows and LayerNorm.

use crate::error::Result;
use crate::hf::SafetensorsWeights;

/// `y = x Wᵀ + b` with `W` stored `out x in`, as in the checkpoint.
#[derive(Debug)]
pub(crate) struct Linear {
    pub(crate) w: Vec<f32>,
    pub(crate) b: Option<Vec<f32>>,
    pub(crate) inp: usize,
    pub(crate) out: usize,
}

impl Linear {
    pub(crate) fn load(
        w: &SafetensorsWeights,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Self> {
        Ok(Linear {
            w: w.tensor_f32_shaped(&format!("{name}.weight"), &[out, inp])?,
            b: if bias {
                Some(w.tensor_f32_shaped(&format!("{name}.bias"), &[out])?)
            } else {
                None
            },
            inp,
            out,
        })
    }

    /// `rows` rows of `x` (row length `inp`) into `y` (row length `out`).
    pub(crate) fn forward(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        y.clear();
        y.resize(rows * self.out, 0.0);
        kernels::gemm_abt(
            rows, self.out, self.inp, 1.0, x, self.inp, &self.w, self.inp, y, self.out,
        );
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.out) {
                row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct LayerNorm {
    w: Vec<f32>,
    b: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub(crate) fn load(w: &SafetensorsWeights, name: &str, dim: usize, eps: f32) -> Result<Self> {
        Ok(LayerNorm {
            w: w.tensor_f32_shaped(&format!("{name}.weight"), &[dim])?,
            b: w.tensor_f32_shaped(&format!("{name}.bias"), &[dim])?,
            eps,
        })
    }

    pub(crate) fn forward(&self, x: &[f32], y: &mut Vec<f32>) {
        let dim = self.w.len();
        y.clear();
        y.resize(x.len(), 0.0);
        for (row, out) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
            let mean = row.iter().sum::<f32>() / dim as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / dim as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for (((o, &v), &g), &b) in out.iter_mut().zip(row).zip(&self.w).zip(&self.b) {
                *o = (v - mean) * inv * g + b;
            }
        }
    }
}

/// `0.5 x (1 + erf(x / sqrt 2))`, in place.
pub(crate) fn gelu_erf(x: &mut [f32]) {
    for v in x {
        *v = 0.5 * *v * (1.0 + kernels::erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}
