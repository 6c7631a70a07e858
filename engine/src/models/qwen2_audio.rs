//! Qwen2-Audio's audio tower and projector: a Whisper-style encoder over a 30 s log-mel window
//! whose pooled output, projected to the language model's width, replaces the `<|AUDIO|>`
//! placeholder tokens of the prompt. The decoder is the Llama-family one
//! ([`crate::models::llama`]) with plain RoPE.
//!
//! The encoder: two convolutions (kernel 3; the second with stride 2) with GELU, learned
//! position embeddings, pre-norm layers (LayerNorm, attention, LayerNorm, GELU MLP), average
//! pooling over pairs of positions, LayerNorm, then the projector. The reference runs it over
//! the whole window and masks the keys past the clip; only the rows of the clip are used
//! afterwards, and none of them depends on a padded row except through the convolutions'
//! edges, so this computes only those rows: `(L - 1) / 2 + 1` after the strided convolution for
//! `L` valid mel frames, `((L - 1) / 2 + 1 - 2) / 2 + 1` output tokens.

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::models::layers::{attend, gelu_erf, LayerNorm, Linear};

/// `audio_config` of a Qwen2-Audio `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioConfig {
    pub num_mel_bins: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub max_source_positions: usize,
    /// The language model's hidden size (the projector's output).
    pub text_hidden: usize,
}

fn cfg_error(msg: impl Into<String>) -> EngineError {
    EngineError::load("config.json", msg)
}

impl AudioConfig {
    /// Reads `audio_config` and `text_config.hidden_size`.
    pub fn from_json(config: &Value) -> Result<Self> {
        let a = config
            .get("audio_config")
            .ok_or_else(|| cfg_error("`audio_config` is missing"))?;
        let get = |v: &Value, k: &str, default: usize| -> Result<usize> {
            match v.get(k) {
                None => Ok(default),
                Some(x) => x
                    .as_u64()
                    .map(|n| n as usize)
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        cfg_error(format!("audio_config.{k} must be a positive integer"))
                    }),
            }
        };
        if a.get("activation_function")
            .and_then(Value::as_str)
            .unwrap_or("gelu")
            != "gelu"
        {
            return Err(cfg_error("audio_config.activation_function must be gelu"));
        }
        if a.get("scale_embedding")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            return Err(cfg_error("audio_config.scale_embedding is not supported"));
        }
        let cfg = AudioConfig {
            num_mel_bins: get(a, "num_mel_bins", 128)?,
            d_model: get(a, "d_model", 1280)?,
            layers: get(a, "encoder_layers", 32)?,
            heads: get(a, "encoder_attention_heads", 20)?,
            ffn: get(a, "encoder_ffn_dim", 5120)?,
            max_source_positions: get(a, "max_source_positions", 1500)?,
            text_hidden: config
                .get("text_config")
                .and_then(|t| t.get("hidden_size"))
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| cfg_error("text_config.hidden_size is missing"))?,
        };
        if !cfg.d_model.is_multiple_of(cfg.heads) {
            return Err(cfg_error(format!(
                "audio_config.d_model {} is not a multiple of {} heads",
                cfg.d_model, cfg.heads
            )));
        }
        Ok(cfg)
    }

    /// Mel frames of the window the encoder expects (3000 for 30 s).
    pub fn window_frames(&self) -> usize {
        self.max_source_positions * 2
    }
}

/// A 1-D convolution with kernel 3 and padding 1; weights `[out, in, 3]`.
#[derive(Debug)]
struct Conv1d {
    w: Vec<f32>,
    b: Vec<f32>,
    inp: usize,
    out: usize,
    stride: usize,
}

impl Conv1d {
    fn load(
        w: &SafetensorsWeights,
        name: &str,
        out: usize,
        inp: usize,
        stride: usize,
    ) -> Result<Self> {
        Ok(Conv1d {
            w: w.tensor_f32_shaped(&format!("{name}.weight"), &[out, inp, 3])?,
            b: w.tensor_f32_shaped(&format!("{name}.bias"), &[out])?,
            inp,
            out,
            stride,
        })
    }

    /// The first `rows` output positions, as rows `[t][out]`, of an input of `len` positions
    /// whose position `src` `column` writes into its buffer (`in` values).
    fn forward(&self, len: usize, rows: usize, column: impl Fn(usize, &mut Vec<f32>)) -> Vec<f32> {
        let mut y = vec![0f32; rows * self.out];
        let mut col = Vec::with_capacity(self.inp);
        for t in 0..rows {
            let out = &mut y[t * self.out..(t + 1) * self.out];
            out.copy_from_slice(&self.b);
            for k in 0..3 {
                let Some(src) = (t * self.stride + k).checked_sub(1).filter(|s| *s < len) else {
                    continue;
                };
                column(src, &mut col);
                for (o, row) in out.iter_mut().zip(self.w.chunks_exact(self.inp * 3)) {
                    *o += col
                        .iter()
                        .enumerate()
                        .map(|(c, v)| row[c * 3 + k] * v)
                        .sum::<f32>();
                }
            }
        }
        y
    }

    /// `x` is `[in][len]` (channel-major, as the mel features come).
    fn forward_channel_major(&self, x: &[f32], len: usize, rows: usize) -> Vec<f32> {
        self.forward(len, rows, |src, col| {
            col.clear();
            col.extend((0..self.inp).map(|c| x[c * len + src]));
        })
    }

    /// `x` is rows `[t][in]`.
    fn forward_rows(&self, x: &[f32], len: usize, rows: usize) -> Vec<f32> {
        self.forward(len, rows, |src, col| {
            col.clear();
            col.extend_from_slice(&x[src * self.inp..(src + 1) * self.inp]);
        })
    }
}

#[derive(Debug)]
struct EncoderLayer {
    attn_norm: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// A loaded audio tower with its projector.
#[derive(Debug)]
pub struct AudioTower {
    cfg: AudioConfig,
    conv1: Conv1d,
    conv2: Conv1d,
    positions: Vec<f32>,
    layers: Vec<EncoderLayer>,
    final_norm: LayerNorm,
    projector: Linear,
}

const LN_EPS: f32 = 1e-5;

impl AudioTower {
    pub fn load(cfg: &AudioConfig, w: &SafetensorsWeights) -> Result<Self> {
        let p = ["audio_tower.", "model.audio_tower."]
            .into_iter()
            .find(|p| w.contains(&format!("{p}conv1.weight")))
            .ok_or_else(|| {
                EngineError::load(
                    "model.safetensors",
                    "no audio tower (`audio_tower.conv1.weight`)",
                )
            })?;
        let proj = if w.contains("multi_modal_projector.linear.weight") {
            "multi_modal_projector.linear"
        } else {
            "model.multi_modal_projector.linear"
        };
        let d = cfg.d_model;
        let layers = (0..cfg.layers)
            .map(|i| {
                let l = format!("{p}layers.{i}");
                Ok(EncoderLayer {
                    attn_norm: LayerNorm::load(w, &format!("{l}.self_attn_layer_norm"), d, LN_EPS)?,
                    q: Linear::load(w, &format!("{l}.self_attn.q_proj"), d, d, true)?,
                    k: Linear::load(w, &format!("{l}.self_attn.k_proj"), d, d, false)?,
                    v: Linear::load(w, &format!("{l}.self_attn.v_proj"), d, d, true)?,
                    o: Linear::load(w, &format!("{l}.self_attn.out_proj"), d, d, true)?,
                    ffn_norm: LayerNorm::load(w, &format!("{l}.final_layer_norm"), d, LN_EPS)?,
                    fc1: Linear::load(w, &format!("{l}.fc1"), cfg.ffn, d, true)?,
                    fc2: Linear::load(w, &format!("{l}.fc2"), d, cfg.ffn, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AudioTower {
            cfg: cfg.clone(),
            conv1: Conv1d::load(w, &format!("{p}conv1"), d, cfg.num_mel_bins, 1)?,
            conv2: Conv1d::load(w, &format!("{p}conv2"), d, d, 2)?,
            positions: w.tensor_f32_shaped(
                &format!("{p}embed_positions.weight"),
                &[cfg.max_source_positions, d],
            )?,
            layers,
            final_norm: LayerNorm::load(w, &format!("{p}layer_norm"), d, LN_EPS)?,
            projector: Linear::load(w, proj, cfg.text_hidden, d, true)?,
        })
    }

    pub fn config(&self) -> &AudioConfig {
        &self.cfg
    }

    /// Encodes one clip: `features` is the log-mel window `[num_mel_bins][window_frames]`
    /// (channel-major, padded as the feature extractor pads), of which the first
    /// `valid_frames` are the clip. Returns [`AudioConfig::num_tokens`] rows of the language
    /// model's width.
    pub fn encode(&self, features: &[f32], valid_frames: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let window = cfg.window_frames();
        if features.len() != cfg.num_mel_bins * window {
            return Err(EngineError::invalid(
                format!(
                    "audio features hold {} values; the encoder takes {} mel bins x {window} frames",
                    features.len(),
                    cfg.num_mel_bins
                ),
                None,
            ));
        }
        if media::tokens::audio(valid_frames) == 0 || valid_frames > window {
            return Err(EngineError::invalid(
                format!("an audio clip of {valid_frames} mel frames does not fit the {window}-frame window"),
                None,
            ));
        }
        let d = cfg.d_model;
        // Rows after the strided convolution that the clip covers (the keys attention sees).
        let n = (valid_frames - 1) / 2 + 1;
        // conv2 row t reads conv1 rows 2t-1..=2t+1.
        let conv1_rows = (2 * n + 1).min(window);
        let mut h1 = self
            .conv1
            .forward_channel_major(features, window, conv1_rows);
        gelu_erf(&mut h1);
        let mut x = self.conv2.forward_rows(&h1, conv1_rows, n);
        gelu_erf(&mut x);
        x.iter_mut()
            .zip(&self.positions[..n * d])
            .for_each(|(a, p)| *a += p);

        let heads = cfg.heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let (mut h, mut q, mut k, mut v, mut attn, mut tmp, mut ff) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let mut scores = Vec::new();
        for layer in &self.layers {
            layer.attn_norm.forward(&x, &mut h);
            layer.q.forward(&h, n, &mut q);
            layer.k.forward(&h, n, &mut k);
            layer.v.forward(&h, n, &mut v);
            attn.clear();
            attn.resize(n * d, 0.0);
            for head in 0..heads {
                let off = head * hd;
                let qkv = (&q[off..], &k[off..], &v[off..]);
                attend(n, hd, scale, qkv, d, &mut attn[off..], d, &mut scores);
            }
            layer.o.forward(&attn, n, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
            layer.ffn_norm.forward(&x, &mut h);
            layer.fc1.forward(&h, n, &mut ff);
            gelu_erf(&mut ff);
            layer.fc2.forward(&ff, n, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        }
        // Average pairs of rows, LayerNorm, project; keep the clip's tokens.
        let tokens = media::tokens::audio(valid_frames);
        let mut pooled = vec![0f32; tokens * d];
        for (t, out) in pooled.chunks_exact_mut(d).enumerate() {
            let (a, b) = (
                &x[2 * t * d..(2 * t + 1) * d],
                &x[(2 * t + 1) * d..(2 * t + 2) * d],
            );
            for ((o, p), q) in out.iter_mut().zip(a).zip(b) {
                *o = 0.5 * (p + q);
            }
        }
        self.final_norm.forward(&pooled, &mut h);
        let mut out = Vec::new();
        self.projector.forward(&h, tokens, &mut out);
        Ok(out)
    }
}
