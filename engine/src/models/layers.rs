//! Small f32 building blocks of the encoders kept in f32 (vision and audio towers): a linear
//! map over rows, LayerNorm and full attention over one segment.

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

/// Query rows whose scores exist at once in [`attend`]: memory grows with `QUERY_BLOCK x len`,
/// linearly in the patches, instead of `len x len` for a whole image.
pub(crate) const QUERY_BLOCK: usize = 256;

/// One head of full (bidirectional) attention over `len` positions:
/// `out[i] = softmax(scale · q[i] · Kᵀ) · V`, computed [`QUERY_BLOCK`] query rows at a time.
/// Each row's softmax spans all keys, so the result is the whole-matrix one, row for row.
/// `q`, `k`, `v` start at the head's first value and step `ld` per position; `out` steps
/// `ldo`. `scores` is scratch, reused across calls.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    len: usize,
    head_dim: usize,
    scale: f32,
    (q, k, v): (&[f32], &[f32], &[f32]),
    ld: usize,
    out: &mut [f32],
    ldo: usize,
    scores: &mut Vec<f32>,
) {
    let block = QUERY_BLOCK.min(len);
    scores.clear();
    scores.resize(block * len, 0.0);
    for r0 in (0..len).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(len - r0);
        let s = &mut scores[..rows * len];
        kernels::gemm_abt(rows, len, head_dim, scale, &q[r0 * ld..], ld, k, ld, s, len);
        for row in s.chunks_exact_mut(len) {
            kernels::ops::softmax(row);
        }
        kernels::gemm_ab(
            rows,
            head_dim,
            len,
            s,
            len,
            v,
            ld,
            &mut out[r0 * ldo..],
            ldo,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole-matrix attention, one row at a time in f64.
    fn reference(len: usize, hd: usize, scale: f32, qkv: &[f32], ld: usize) -> Vec<f32> {
        let mut out = vec![0f32; len * hd];
        for i in 0..len {
            let logits: Vec<f64> = (0..len)
                .map(|j| {
                    (0..hd)
                        .map(|t| f64::from(qkv[i * ld + t]) * f64::from(qkv[j * ld + hd + t]))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let max = logits.iter().copied().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for t in 0..hd {
                let acc: f64 = (0..len)
                    .map(|j| weights[j] * f64::from(qkv[j * ld + 2 * hd + t]))
                    .sum();
                out[i * hd + t] = (acc / total) as f32;
            }
        }
        out
    }

    #[test]
    fn attention_in_query_blocks_equals_the_whole_matrix() {
        let (hd, ld) = (8, 24);
        for len in [1, 5, QUERY_BLOCK, QUERY_BLOCK + 1, 2 * QUERY_BLOCK + 37] {
            let qkv: Vec<f32> = (0..len * ld)
                .map(|i| ((i as f32) * 0.37).sin() * 1.5)
                .collect();
            let mut out = vec![0f32; len * hd];
            let mut scores = Vec::new();
            let parts = (&qkv[..], &qkv[hd..], &qkv[2 * hd..]);
            attend(len, hd, 0.35, parts, ld, &mut out, hd, &mut scores);
            assert!(
                scores.len() <= QUERY_BLOCK * len,
                "scores for one block only"
            );
            let want = reference(len, hd, 0.35, &qkv, ld);
            let worst = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "len {len}: largest difference {worst}");
        }
    }
}
