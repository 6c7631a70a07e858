//! Qwen2-VL's vision tower: patches in, one embedding per 2x2 group of patches out.
//!
//! The processor (`preprocess::image::Qwen2VlConfig`) hands over `pixel_values` as rows of
//! `channels x temporal_patch_size x patch x patch` values, ordered so that every run of
//! `spatial_merge_size^2` rows is one merge group, with the grid `(t, h, w)` of each image or
//! video in patches. The tower:
//!
//! 1. embeds each patch with one linear map (the checkpoint's `Conv3d` whose kernel equals its
//!    stride is exactly that);
//! 2. runs `depth` pre-norm blocks (LayerNorm, attention with a 2D rotary embedding over the
//!    patch's row and column, LayerNorm, MLP), attention restricted to the patches of one
//!    frame (one temporal patch) of one image or video;
//! 3. merges each group of `spatial_merge_size^2` consecutive patches: LayerNorm, concatenate,
//!    Linear, GELU, Linear to the language model's hidden size.

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::models::layers::{attend, gelu_erf, LayerNorm, Linear};

/// `vision_config` of a Qwen2-VL `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub embed_dim: usize,
    pub num_heads: usize,
    pub mlp_hidden: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub in_channels: usize,
    pub spatial_merge_size: usize,
    /// Output width: the language model's hidden size.
    pub hidden_size: usize,
    pub act: VisionAct,
    pub rope_theta: f32,
}

/// The activation of the blocks' MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `x * sigmoid(1.702 x)` (`quick_gelu`, Qwen2-VL's default).
    QuickGelu,
    /// `0.5 x (1 + erf(x / sqrt 2))` (`gelu`).
    GeluErf,
}

fn bad_config(msg: impl Into<String>) -> EngineError {
    EngineError::load("config.json", msg)
}

fn get_usize(v: &Value, key: &str, default: Option<usize>) -> Result<usize> {
    match v.get(key) {
        Some(x) => x
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| bad_config(format!("vision_config.{key} must be a positive integer"))),
        None => default.ok_or_else(|| bad_config(format!("vision_config.{key} is missing"))),
    }
}

impl VisionConfig {
    /// Reads `vision_config` with the reference's defaults for missing keys.
    pub fn from_json(v: &Value) -> Result<Self> {
        let embed_dim = get_usize(v, "embed_dim", Some(1280))?;
        let num_heads = get_usize(v, "num_heads", Some(16))?;
        let mlp_ratio = v.get("mlp_ratio").and_then(Value::as_f64).unwrap_or(4.0);
        let act = match v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("quick_gelu")
        {
            "quick_gelu" => VisionAct::QuickGelu,
            "gelu" => VisionAct::GeluErf,
            other => {
                return Err(bad_config(format!(
                    "vision_config.hidden_act '{other}' is not supported (quick_gelu, gelu)"
                )))
            }
        };
        let rope_theta = v
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| v.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0) as f32;
        let cfg = VisionConfig {
            depth: get_usize(v, "depth", Some(32))?,
            embed_dim,
            num_heads,
            mlp_hidden: (embed_dim as f64 * mlp_ratio) as usize,
            patch_size: get_usize(v, "patch_size", Some(14))?,
            temporal_patch_size: get_usize(v, "temporal_patch_size", Some(2))?,
            in_channels: get_usize(
                v,
                "in_channels",
                v.get("in_chans")
                    .and_then(Value::as_u64)
                    .map(|n| n as usize)
                    .or(Some(3)),
            )?,
            spatial_merge_size: get_usize(v, "spatial_merge_size", Some(2))?,
            hidden_size: get_usize(v, "hidden_size", Some(3584))?,
            act,
            rope_theta,
        };
        if num_heads == 0 || embed_dim % num_heads != 0 || (embed_dim / num_heads) % 4 != 0 {
            return Err(bad_config(format!(
                "vision_config: embed_dim {embed_dim} must split into num_heads {num_heads} heads of a multiple of 4"
            )));
        }
        if cfg.spatial_merge_size == 0 || cfg.patch_size == 0 || cfg.temporal_patch_size == 0 {
            return Err(bad_config(
                "vision_config: patch and merge sizes must be positive",
            ));
        }
        Ok(cfg)
    }

    /// Values per patch row of `pixel_values`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }

    fn merge_area(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

#[derive(Debug)]
struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// A loaded vision tower.
#[derive(Debug)]
pub struct VisionTower {
    cfg: VisionConfig,
    patch_embed: Linear,
    blocks: Vec<Block>,
    ln_q: LayerNorm,
    merge_fc1: Linear,
    merge_fc2: Linear,
}

/// The checkpoint prefix of the tower: `model.visual.` (transformers 5) or `visual.`.
fn prefix_of(w: &SafetensorsWeights) -> Result<&'static str> {
    ["model.visual.", "visual."]
        .into_iter()
        .find(|p| w.contains(&format!("{p}patch_embed.proj.weight")))
        .ok_or_else(|| {
            EngineError::load(
                "model.safetensors",
                "no vision tower: neither `model.visual.patch_embed.proj.weight` nor `visual.patch_embed.proj.weight` is present",
            )
        })
}

impl VisionTower {
    pub fn load(cfg: &VisionConfig, w: &SafetensorsWeights) -> Result<Self> {
        let p = prefix_of(w)?;
        let d = cfg.embed_dim;
        // The Conv3d kernel [d, c, tps, ps, ps] read as a d x patch_dim matrix.
        let conv_shape = [
            cfg.embed_dim,
            cfg.in_channels,
            cfg.temporal_patch_size,
            cfg.patch_size,
            cfg.patch_size,
        ];
        let patch_embed = Linear {
            w: w.tensor_f32_shaped(&format!("{p}patch_embed.proj.weight"), &conv_shape)?,
            b: None,
            inp: cfg.patch_dim(),
            out: d,
        };
        let blocks = (0..cfg.depth)
            .map(|i| {
                let b = format!("{p}blocks.{i}");
                Ok(Block {
                    norm1: LayerNorm::load(w, &format!("{b}.norm1"), d, 1e-6)?,
                    norm2: LayerNorm::load(w, &format!("{b}.norm2"), d, 1e-6)?,
                    qkv: Linear::load(w, &format!("{b}.attn.qkv"), 3 * d, d, true)?,
                    proj: Linear::load(w, &format!("{b}.attn.proj"), d, d, true)?,
                    fc1: Linear::load(w, &format!("{b}.mlp.fc1"), cfg.mlp_hidden, d, true)?,
                    fc2: Linear::load(w, &format!("{b}.mlp.fc2"), d, cfg.mlp_hidden, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merged = d * cfg.merge_area();
        Ok(VisionTower {
            cfg: cfg.clone(),
            patch_embed,
            blocks,
            ln_q: LayerNorm::load(w, &format!("{p}merger.ln_q"), d, 1e-6)?,
            merge_fc1: Linear::load(w, &format!("{p}merger.mlp.0"), merged, merged, true)?,
            merge_fc2: Linear::load(
                w,
                &format!("{p}merger.mlp.2"),
                cfg.hidden_size,
                merged,
                true,
            )?,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Embeds `pixels` (one row of [`VisionConfig::patch_dim`] values per patch, images and
    /// videos one after another) for the grids `(t, h, w)` in patches. Returns
    /// `sum(t*h*w) / merge^2` rows of `hidden_size` values, in the order of the patches.
    pub fn encode(&self, pixels: &[f32], grids: &[[usize; 3]]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let m = cfg.spatial_merge_size;
        let mut n = 0usize;
        for &[t, h, w] in grids {
            if t == 0 || h == 0 || w == 0 || h % m != 0 || w % m != 0 {
                return Err(EngineError::invalid(
                    format!("an image grid of {t}x{h}x{w} patches does not divide into {m}x{m} merge groups"),
                    None,
                ));
            }
            n += t * h * w;
        }
        if pixels.len() != n * cfg.patch_dim() {
            return Err(EngineError::invalid(
                format!(
                    "pixel values hold {} floats; the grids need {n} patches of {} values",
                    pixels.len(),
                    cfg.patch_dim()
                ),
                None,
            ));
        }
        let d = cfg.embed_dim;
        let hd = cfg.head_dim();
        let (cos, sin) = self.rotary(grids, n);
        // Each frame (temporal patch) of each image or video attends within itself.
        let mut segments = Vec::new();
        let mut start = 0;
        for &[t, h, w] in grids {
            for _ in 0..t {
                segments.push((start, h * w));
                start += h * w;
            }
        }

        let mut x = Vec::new();
        self.patch_embed.forward(pixels, n, &mut x);
        let (mut h, mut qkv, mut attn, mut tmp, mut ff) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scores = Vec::new();
        for blk in &self.blocks {
            blk.norm1.forward(&x, &mut h);
            blk.qkv.forward(&h, n, &mut qkv);
            // Rows are [q (heads x hd) | k | v]; rotate q and k of every head.
            for (tok, row) in qkv.chunks_exact_mut(3 * d).enumerate() {
                let (c, s) = (
                    &cos[tok * hd..(tok + 1) * hd],
                    &sin[tok * hd..(tok + 1) * hd],
                );
                for head in row[..2 * d].chunks_exact_mut(hd) {
                    rotate_half_apply(head, c, s);
                }
            }
            attn.clear();
            attn.resize(n * d, 0.0);
            for &(s0, len) in &segments {
                for head in 0..cfg.num_heads {
                    let q = &qkv[s0 * 3 * d + head * hd..];
                    let k = &qkv[s0 * 3 * d + d + head * hd..];
                    let v = &qkv[s0 * 3 * d + 2 * d + head * hd..];
                    let out = &mut attn[s0 * d + head * hd..];
                    attend(len, hd, scale, (q, k, v), 3 * d, out, d, &mut scores);
                }
            }
            blk.proj.forward(&attn, n, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);

            blk.norm2.forward(&x, &mut h);
            blk.fc1.forward(&h, n, &mut ff);
            match cfg.act {
                VisionAct::QuickGelu => ff
                    .iter_mut()
                    .for_each(|v| *v *= 1.0 / (1.0 + (-1.702 * *v).exp())),
                VisionAct::GeluErf => gelu_erf(&mut ff),
            }
            blk.fc2.forward(&ff, n, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        }

        // Merge: LayerNorm per patch, then each run of merge^2 patches is one row.
        self.ln_q.forward(&x, &mut h);
        let groups = n / cfg.merge_area();
        self.merge_fc1.forward(&h, groups, &mut ff);
        gelu_erf(&mut ff);
        let mut out = Vec::new();
        self.merge_fc2.forward(&ff, groups, &mut out);
        Ok(out)
    }

    /// cos/sin (`n x head_dim`) of the 2D rotary embedding: the first quarter of the
    /// frequencies turns with the patch's row, the second with its column, and the second
    /// half of the head repeats the first (`rotate_half` layout). Rows and columns are
    /// numbered within the image, patches taken merge group by merge group.
    fn rotary(&self, grids: &[[usize; 3]], n: usize) -> (Vec<f32>, Vec<f32>) {
        let hd = self.cfg.head_dim();
        let quarter = hd / 4;
        let inv_freq: Vec<f32> = (0..quarter)
            .map(|j| 1.0 / self.cfg.rope_theta.powf((2 * j) as f32 / (hd / 2) as f32))
            .collect();
        let m = self.cfg.spatial_merge_size;
        let (mut cos, mut sin) = (Vec::with_capacity(n * hd), Vec::with_capacity(n * hd));
        let mut angles = vec![0.0f32; hd / 2];
        for &[t, h, w] in grids {
            for _ in 0..t {
                for bh in 0..h / m {
                    for bw in 0..w / m {
                        for ih in 0..m {
                            for iw in 0..m {
                                let (row, col) = ((bh * m + ih) as f32, (bw * m + iw) as f32);
                                for (j, f) in inv_freq.iter().enumerate() {
                                    angles[j] = row * f;
                                    angles[quarter + j] = col * f;
                                }
                                for _ in 0..2 {
                                    cos.extend(angles.iter().map(|a| a.cos()));
                                    sin.extend(angles.iter().map(|a| a.sin()));
                                }
                            }
                        }
                    }
                }
            }
        }
        (cos, sin)
    }
}

/// `x * cos + rotate_half(x) * sin`, where `rotate_half(x) = [-x2, x1]` for the halves of `x`.
fn rotate_half_apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_reads_the_reference_keys_and_refuses_bad_ones() {
        let cfg = VisionConfig::from_json(&json!({
            "depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14,
            "temporal_patch_size": 2, "in_channels": 3, "spatial_merge_size": 2, "hidden_size": 64,
            "hidden_act": "quick_gelu"
        }))
        .unwrap();
        assert_eq!(cfg.mlp_hidden, 64);
        assert_eq!(cfg.patch_dim(), 3 * 2 * 14 * 14);
        assert_eq!(cfg.head_dim(), 16);
        assert_eq!(cfg.act, VisionAct::QuickGelu);
        assert!(VisionConfig::from_json(&json!({"embed_dim": 30, "num_heads": 4})).is_err());
        assert!(VisionConfig::from_json(&json!({"hidden_act": "swish"})).is_err());
    }

    #[test]
    fn rotation_keeps_norms_and_is_identity_at_zero() {
        let mut x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let before: f32 = x.iter().map(|v| v * v).sum();
        let angles = [0.3f32, 1.1, -0.4, 2.0];
        let cos: Vec<f32> = angles.iter().chain(&angles).map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().chain(&angles).map(|a| a.sin()).collect();
        rotate_half_apply(&mut x, &cos, &sin);
        let after: f32 = x.iter().map(|v| v * v).sum();
        assert!((before - after).abs() < 1e-4);
        let mut y = vec![1.0, 2.0, 3.0, 4.0];
        rotate_half_apply(&mut y, &[1.0; 4], &[0.0; 4]);
        assert_eq!(y, [1.0, 2.0, 3.0, 4.0]);
    }
}
