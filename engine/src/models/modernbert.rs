//! ModernBERT sequence classifiers (`ModernBertForSequenceClassification`: the
//! mxbai-rerank-v2 / gte-reranker-modernbert shape) for `/score`, `/rerank` and `/classify`.
//!
//! Token embeddings and LayerNorm (no positions: RoPE), then pre-LN layers: attention with
//! RoPE whose base depends on the layer's type, global (every token) or local (tokens at most
//! `local_attention / 2` apart), and a GeGLU feed-forward; a final LayerNorm. The head pools
//! the first token or the mean (`classifier_pooling`), then dense, activation and LayerNorm,
//! then the classifier. LayerNorms and linear layers carry biases only where the config's
//! `norm_bias`, `attention_bias`, `mlp_bias` and `classifier_bias` say.
//!
//! A batch is packed without padding as the BERT encoder packs it: each dense layer is one
//! matrix product over every token, attention runs per (head, sequence) on that sequence's rows
//! only, so an input's logits do not depend on its batch.

use kernels::{add_layer_norm, Activation};
use rayon::prelude::*;
use serde::Deserialize;

use super::bert::dense::{activation_from_hf, Dense};
use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::model::{EmbeddingModel, EncoderHead, EncoderInfo, EncoderInput, Pooling};

/// The fields of `config.json` ModernBERT adds to BERT's, with transformers' defaults. Both
/// spellings are read: `layer_types` and `rope_parameters` (transformers 5), or
/// `global_attn_every_n_layers` and `global_rope_theta` / `local_rope_theta` (the published
/// checkpoints).
#[derive(Debug, Deserialize)]
struct ModernBertConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_act")]
    hidden_activation: String,
    #[serde(default = "default_eps")]
    norm_eps: f64,
    #[serde(default)]
    norm_bias: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    classifier_bias: bool,
    #[serde(default = "default_act")]
    classifier_activation: String,
    #[serde(default = "default_pooling")]
    classifier_pooling: String,
    #[serde(default = "default_local")]
    local_attention: usize,
    layer_types: Option<Vec<String>>,
    global_attn_every_n_layers: Option<usize>,
    rope_parameters: Option<RopeParameters>,
    global_rope_theta: Option<f64>,
    local_rope_theta: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    full_attention: Option<RopeEntry>,
    sliding_attention: Option<RopeEntry>,
}

#[derive(Debug, Deserialize)]
struct RopeEntry {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_pooling() -> String {
    "cls".into()
}
fn default_local() -> usize {
    128
}

const GLOBAL_THETA: f64 = 160_000.0;
const LOCAL_THETA: f64 = 10_000.0;

fn bad(reason: String) -> EngineError {
    EngineError::load("config.json", reason)
}

/// A LayerNorm's scale and (with `norm_bias`) shift.
struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
}

struct Layer {
    /// None for the first layer, whose input is the embeddings' own norm.
    attn_norm: Option<Norm>,
    wqkv: Dense,
    wo: Dense,
    mlp_norm: Norm,
    /// n = 2 x intermediate: the GELU input, then the gate.
    wi: Dense,
    mlp_out: Dense,
    /// Largest distance a token attends over (local layers), or every token (global).
    window: Option<usize>,
    /// RoPE's `cos` and `sin` per position, `[max_position][head_dim / 2]`.
    cos: std::sync::Arc<Vec<f32>>,
    sin: std::sync::Arc<Vec<f32>>,
}

struct Head {
    pooling: Pooling,
    dense: Dense,
    act: Activation,
    norm: Norm,
    classifier: Dense,
    labels: usize,
}

/// A loaded ModernBERT classifier.
pub struct ModernBertEncoder {
    info: EncoderInfo,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    vocab: usize,
    eps: f32,
    act: Activation,
    tok_emb: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
    final_norm: Norm,
    head: Head,
}

impl std::fmt::Debug for ModernBertEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModernBertEncoder")
            .field("info", &self.info)
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// RoPE tables for `theta` over `positions`, as transformers computes them in f32:
/// `inv_freq[i] = theta^(-2i/d)`, angle `p * inv_freq[i]`.
fn rope_tables(theta: f64, head_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in &inv {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

impl ModernBertEncoder {
    /// Builds the classifier from `config.json` (as JSON) and the checkpoint's weights; `head`
    /// is the classification head's labels and activations, `max_seq_len` the longest input.
    pub fn load(
        config: &serde_json::Value,
        weights: &SafetensorsWeights,
        head: EncoderHead,
        max_seq_len: usize,
    ) -> Result<Self> {
        let cfg = ModernBertConfig::deserialize(config)
            .map_err(|e| bad(format!("ModernBERT config: {e}")))?;
        let EncoderHead::Classify(classes) = &head else {
            return Err(bad("ModernBERT is served as a classifier only".into()));
        };
        let labels = classes.labels.len();
        let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        if heads == 0 || h == 0 || !h.is_multiple_of(heads) || !(h / heads).is_multiple_of(2) {
            return Err(bad(format!(
                "hidden_size {h} is not a multiple of num_attention_heads {heads} with an even head size"
            )));
        }
        let head_dim = h / heads;
        let act = |name: &str| {
            activation_from_hf(name).ok_or_else(|| bad(format!("unsupported activation `{name}`")))
        };
        let pooling = match cfg.classifier_pooling.as_str() {
            "cls" => Pooling::Cls,
            "mean" => Pooling::Mean,
            other => return Err(bad(format!("unsupported classifier_pooling `{other}`"))),
        };
        let layer_types = match &cfg.layer_types {
            Some(types) if types.len() == cfg.num_hidden_layers => types.clone(),
            Some(types) => {
                return Err(bad(format!(
                    "layer_types lists {} layers for num_hidden_layers {}",
                    types.len(),
                    cfg.num_hidden_layers
                )))
            }
            None => {
                let every = cfg.global_attn_every_n_layers.unwrap_or(3).max(1);
                (0..cfg.num_hidden_layers)
                    .map(|i| {
                        if i % every == 0 {
                            "full_attention".to_string()
                        } else {
                            "sliding_attention".to_string()
                        }
                    })
                    .collect()
            }
        };
        let theta = |entry: Option<&RopeEntry>, legacy: Option<f64>, default: f64| {
            if let Some(kind) = entry.and_then(|e| e.rope_type.as_deref()) {
                if kind != "default" {
                    return Err(bad(format!(
                        "unsupported rope_type `{kind}` (only default)"
                    )));
                }
            }
            Ok(entry
                .and_then(|e| e.rope_theta)
                .or(legacy)
                .unwrap_or(default))
        };
        let rope = cfg.rope_parameters.as_ref();
        let global = theta(
            rope.and_then(|r| r.full_attention.as_ref()),
            cfg.global_rope_theta,
            GLOBAL_THETA,
        )?;
        let local = theta(
            rope.and_then(|r| r.sliding_attention.as_ref()),
            cfg.local_rope_theta,
            LOCAL_THETA,
        )?;
        let positions = cfg.max_position_embeddings;
        if max_seq_len == 0 || max_seq_len > positions {
            return Err(bad(format!(
                "max_seq_len {max_seq_len} is outside 1..={positions} (max_position_embeddings)"
            )));
        }
        let tables = |t: f64| {
            let (c, s) = rope_tables(t, head_dim, positions);
            (std::sync::Arc::new(c), std::sync::Arc::new(s))
        };
        let (global_tables, local_tables) = (tables(global), tables(local));

        let get = |name: &str, shape: &[usize]| weights.tensor_f32_shaped(name, shape);
        let bias = |name: &str, n: usize, present: bool| -> Result<Vec<f32>> {
            if present {
                get(name, &[n])
            } else {
                Ok(vec![0.0; n])
            }
        };
        let norm = |base: &str| -> Result<Norm> {
            Ok(Norm {
                g: get(&format!("{base}.weight"), &[h])?,
                b: bias(&format!("{base}.bias"), h, cfg.norm_bias)?,
            })
        };
        let dense = |base: &str, n: usize, k: usize, biased: bool| -> Result<Dense> {
            let w = get(&format!("{base}.weight"), &[n, k])?;
            Ok(Dense::new(
                &w,
                bias(&format!("{base}.bias"), n, biased)?,
                n,
                k,
            ))
        };
        let inter = cfg.intermediate_size;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for (i, kind) in layer_types.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let (window, (cos, sin)) = match kind.as_str() {
                "full_attention" => (None, global_tables.clone()),
                "sliding_attention" => (Some(cfg.local_attention / 2), local_tables.clone()),
                other => return Err(bad(format!("unsupported layer type `{other}`"))),
            };
            layers.push(Layer {
                attn_norm: if i == 0 {
                    None
                } else {
                    Some(norm(&format!("{p}.attn_norm"))?)
                },
                wqkv: dense(&format!("{p}.attn.Wqkv"), 3 * h, h, cfg.attention_bias)?,
                wo: dense(&format!("{p}.attn.Wo"), h, h, cfg.attention_bias)?,
                mlp_norm: norm(&format!("{p}.mlp_norm"))?,
                wi: dense(&format!("{p}.mlp.Wi"), 2 * inter, h, cfg.mlp_bias)?,
                mlp_out: dense(&format!("{p}.mlp.Wo"), h, inter, cfg.mlp_bias)?,
                window,
                cos,
                sin,
            });
        }
        let head_impl = Head {
            pooling,
            dense: dense("head.dense", h, h, cfg.classifier_bias)?,
            act: act(&cfg.classifier_activation)?,
            norm: norm("head.norm")?,
            classifier: dense("classifier", labels, h, true)?,
            labels,
        };
        tracing::info!(
            hidden = h,
            layers = layers.len(),
            heads,
            max_seq_len,
            ?pooling,
            labels,
            local_window = cfg.local_attention / 2,
            "loaded ModernBERT classifier"
        );
        Ok(ModernBertEncoder {
            info: EncoderInfo {
                hidden_size: h,
                max_seq_len,
                pooling,
                normalize: false,
                head,
            },
            hidden: h,
            heads,
            intermediate: inter,
            vocab: cfg.vocab_size,
            eps: cfg.norm_eps as f32,
            act: act(&cfg.hidden_activation)?,
            tok_emb: get(
                "model.embeddings.tok_embeddings.weight",
                &[cfg.vocab_size, h],
            )?,
            emb_norm: norm("model.embeddings.norm")?,
            layers,
            final_norm: norm("model.final_norm")?,
            head: head_impl,
        })
    }

    fn check_input(&self, index: usize, input: &EncoderInput<'_>) -> Result<()> {
        let invalid = |m: String| EngineError::invalid(m, Some("input"));
        if input.ids.is_empty() {
            return Err(invalid(format!("input {index} has no tokens")));
        }
        if input.ids.len() > self.info.max_seq_len {
            return Err(invalid(format!(
                "This model's maximum context length is {} tokens. However, input {index} has {} tokens.",
                self.info.max_seq_len,
                input.ids.len()
            )));
        }
        if let Some(&bad) = input.ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(invalid(format!(
                "token id {bad} in input {index} is out of vocabulary (size {})",
                self.vocab
            )));
        }
        // Token type ids are not read: ModernBERT has no segment embedding, and transformers
        // does not pass the ones a pair template may write (its tokenizer's inputs leave them
        // out).
        Ok(())
    }

    /// `x = LayerNorm(x)` row-wise, into `out`.
    fn norm_into(&self, x: &[f32], n: &Norm, out: &mut [f32]) {
        out.copy_from_slice(x);
        out.par_chunks_mut(32 * self.hidden)
            .for_each(|rows| add_layer_norm(rows, &[], &n.g, &n.b, self.eps));
    }

    /// Rotates each head's query and key of every token by its position in its sequence.
    fn rope(&self, layer: &Layer, qkv: &mut [f32], spans: &[(usize, usize)]) {
        let (h, hd) = (self.hidden, self.hidden / self.heads);
        let half = hd / 2;
        let mut positions = Vec::with_capacity(qkv.len() / (3 * h));
        for &(_, len) in spans {
            positions.extend(0..len);
        }
        qkv.par_chunks_mut(3 * h)
            .zip(positions.par_iter())
            .for_each(|(row, &p)| {
                let (cos, sin) = (
                    &layer.cos[p * half..(p + 1) * half],
                    &layer.sin[p * half..(p + 1) * half],
                );
                for v in row[..2 * h].chunks_exact_mut(hd) {
                    let (a, b) = v.split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (a[i], b[i]);
                        a[i] = x1 * cos[i] - x2 * sin[i];
                        b[i] = x2 * cos[i] + x1 * sin[i];
                    }
                }
            });
    }

    /// Attention of every (head, sequence), each token over the tokens its layer lets it see,
    /// into `out` (`[token][hidden]`).
    fn attention(&self, layer: &Layer, qkv: &[f32], spans: &[(usize, usize)], out: &mut [f32]) {
        let (h, heads) = (self.hidden, self.heads);
        let hd = h / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let rows: Vec<(usize, usize, usize)> = spans
            .iter()
            .flat_map(|&(t0, len)| (0..len).map(move |i| (t0, len, i)))
            .collect();
        out.par_chunks_mut(h).zip(rows.par_iter()).for_each_init(
            Vec::new,
            |scores: &mut Vec<f32>, (dst, &(t0, len, i))| {
                let (lo, hi) = match layer.window {
                    Some(w) => (i.saturating_sub(w), (i + w + 1).min(len)),
                    None => (0, len),
                };
                for head in 0..heads {
                    let q = &qkv[(t0 + i) * 3 * h + head * hd..][..hd];
                    scores.clear();
                    for j in lo..hi {
                        let k = &qkv[(t0 + j) * 3 * h + h + head * hd..][..hd];
                        scores.push(q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale);
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0f32;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let o = &mut dst[head * hd..(head + 1) * hd];
                    o.fill(0.0);
                    for (j, &p) in (lo..hi).zip(scores.iter()) {
                        let v = &qkv[(t0 + j) * 3 * h + 2 * h + head * hd..][..hd];
                        for (o, &v) in o.iter_mut().zip(v) {
                            *o += p / sum * v;
                        }
                    }
                }
            },
        );
    }

    fn forward_packed(
        &self,
        seqs: &[EncoderInput<'_>],
        spans: &[(usize, usize)],
    ) -> Result<Vec<Vec<f32>>> {
        let h = self.hidden;
        let total: usize = spans.iter().map(|s| s.1).sum();
        let mut x = vec![0.0f32; total * h];
        for (row, &id) in x
            .chunks_exact_mut(h)
            .zip(seqs.iter().flat_map(|s| s.ids.iter()))
        {
            row.copy_from_slice(&self.tok_emb[id as usize * h..(id as usize + 1) * h]);
        }
        let mut normed = vec![0.0f32; total * h];
        self.norm_into(&x, &self.emb_norm, &mut normed);
        std::mem::swap(&mut x, &mut normed);
        let mut qkv = vec![0.0f32; total * 3 * h];
        let mut ctx = vec![0.0f32; total * h];
        let mut tmp = vec![0.0f32; total * h];
        let mut ffn = vec![0.0f32; total * 2 * self.intermediate];
        let inter = self.intermediate;
        for layer in &self.layers {
            let input = match &layer.attn_norm {
                Some(n) => {
                    self.norm_into(&x, n, &mut normed);
                    &normed
                }
                None => &x,
            };
            layer.wqkv.forward(total, input, &mut qkv)?;
            self.rope(layer, &mut qkv, spans);
            self.attention(layer, &qkv, spans, &mut ctx);
            layer.wo.forward(total, &ctx, &mut tmp)?;
            x.iter_mut().zip(&tmp).for_each(|(x, t)| *x += t);
            self.norm_into(&x, &layer.mlp_norm, &mut normed);
            layer.wi.forward(total, &normed, &mut ffn)?;
            // GeGLU: act(first half) x second half, into the first half's place.
            ffn.par_chunks_mut(2 * inter).for_each(|row| {
                let (a, gate) = row.split_at_mut(inter);
                self.act.apply(a);
                a.iter_mut().zip(gate.iter()).for_each(|(a, g)| *a *= g);
            });
            let gated: Vec<f32> = ffn
                .chunks_exact(2 * inter)
                .flat_map(|row| row[..inter].iter().copied())
                .collect();
            layer.mlp_out.forward(total, &gated, &mut tmp)?;
            x.iter_mut().zip(&tmp).for_each(|(x, t)| *x += t);
        }
        self.norm_into(&x, &self.final_norm, &mut normed);
        self.apply_head(&normed, spans)
    }

    fn apply_head(&self, x: &[f32], spans: &[(usize, usize)]) -> Result<Vec<Vec<f32>>> {
        let (h, head) = (self.hidden, &self.head);
        let n = spans.len();
        let mut pooled = Vec::with_capacity(n * h);
        for &(t0, len) in spans {
            pooled.extend(head.pooling.pool(&x[t0 * h..(t0 + len) * h], h));
        }
        let mut mid = vec![0.0f32; n * h];
        head.dense
            .forward_act(n, &pooled, &mut mid, Some(head.act))?;
        let mut normed = vec![0.0f32; n * h];
        self.norm_into(&mid, &head.norm, &mut normed);
        let mut logits = vec![0.0f32; n * head.labels];
        head.classifier.forward(n, &normed, &mut logits)?;
        Ok(logits
            .chunks_exact(head.labels)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

impl EmbeddingModel for ModernBertEncoder {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn step_host_bytes(&self, tokens: usize, _threads: usize) -> u64 {
        // x, normed, qkv (3), ctx, tmp and the GeGLU rows (2 x intermediate, and the gated
        // copy); attention keeps one row of scores per thread, within a row's window.
        let floats = tokens * (7 * self.hidden + 3 * self.intermediate);
        (floats as u64).saturating_mul(4)
    }

    fn forward(&self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>> {
        for (i, input) in batch.iter().enumerate() {
            self.check_input(i, input)?;
        }
        let mut spans = Vec::with_capacity(batch.len());
        let mut t0 = 0;
        for s in batch {
            spans.push((t0, s.ids.len()));
            t0 += s.ids.len();
        }
        self.forward_packed(batch, &spans)
    }
}
