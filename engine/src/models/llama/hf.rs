//! The same decoder built from an HF folder: `config.json` and safetensors weights (F32, F16
//! or BF16), kept in the memory map in their stored type like GGUF weights.
//!
//! HF checkpoints store Q and K unpermuted, so every architecture rotates NeoX-style (pairs
//! `i`, `i + d/2`), which is what `transformers` does. The text half of a Qwen2-VL checkpoint
//! loads the same way (its M-RoPE sections are read; a text-only prompt has equal temporal,
//! row and column positions, where M-RoPE is plain RoPE).

use std::path::Path;
use std::sync::Mutex;

use kernels::DType;
use safetensors::Dtype;
use serde_json::Value;

use super::hf_config::{read_hf_config, text_section, HfDecoderConfig};
use super::rules::DecoderRules;
use super::weights::offset_norm;
use super::{load_layer, LlamaModel, StepState, Weight, WeightSource};
use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::model::{ActivationMode, DecoderInfo};

/// Whether [`LlamaModel::from_hf`] reads the checkpoint's LM head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmHead {
    Read,
    /// An embedding model: the final norm's output is what it serves.
    Skip,
}

struct HfLoader<'a> {
    w: &'a SafetensorsWeights,
    /// The rows a fused `qkv_proj` and `gate_up_proj` must have.
    qkv_rows: usize,
    gate_up_rows: usize,
}

/// Projections some checkpoints store fused, row-stacked in one matrix (Phi-3): each part's
/// fused name, its place among the stacked parts, and how many parts there are. The middle
/// part (`k`) has the last part's rows (`v`), so each part's rows follow from its own count.
const FUSED: &[(&str, &str, usize, usize)] = &[
    ("self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, 3),
    ("self_attn.k_proj.weight", "self_attn.qkv_proj.weight", 1, 3),
    ("self_attn.v_proj.weight", "self_attn.qkv_proj.weight", 2, 3),
    ("mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, 2),
    ("mlp.up_proj.weight", "mlp.gate_up_proj.weight", 1, 2),
];

impl HfLoader<'_> {
    /// `name`'s rows inside the fused matrix that holds them, as a view of the same bytes.
    fn fused(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Weight>> {
        let Some(&(part, fused, index, count)) = FUSED.iter().find(|f| name.ends_with(f.0)) else {
            return Ok(None);
        };
        let fused_name = format!("{}{fused}", &name[..name.len() - part.len()]);
        if !self.w.contains(&fused_name) {
            return Ok(None);
        }
        let total = if count == 3 {
            self.qkv_rows
        } else {
            self.gate_up_rows
        };
        // Checks the fused tensor's shape against the config before any view is taken.
        let whole = self.matrix(&fused_name, total, cols)?;
        let first = match index {
            0 => 0,
            i if i + 1 == count => total.saturating_sub(rows),
            _ => total.saturating_sub(2 * rows),
        };
        Ok(Some(whole.rows_view(first, rows)))
    }
}

impl WeightSource for HfLoader<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight> {
        if !self.w.contains(name) {
            if let Some(w) = self.fused(name, rows, cols)? {
                return Ok(w);
            }
        }
        let raw = self.w.raw(name)?;
        let file = self.w.file_of(name).to_string();
        if raw.shape != [rows, cols] {
            return Err(EngineError::load(
                file,
                format!(
                    "tensor `{name}` has shape {:?}, expected [{rows}, {cols}]",
                    raw.shape
                ),
            ));
        }
        let dtype = match raw.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                return Err(EngineError::load(
                    file,
                    format!("tensor `{name}` is {other:?}; supported: F32, F16, BF16"),
                ))
            }
        };
        Ok(Weight {
            file: raw.file,
            dtype,
            rows,
            cols,
            start: raw.start,
            len: raw.len,
            interleaved: false,
        })
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.w.tensor_f32_shaped(name, &[n])
    }

    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.w.contains(name) {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Biases the layers do not add (Llama's `attention_bias` on `o_proj`, `mlp_bias`): a
/// checkpoint that has them is refused rather than served without them.
fn refuse_unread_biases(
    dir: &Path,
    weights: &SafetensorsWeights,
    prefix: &str,
    n_layers: usize,
) -> Result<()> {
    const UNREAD: &[&str] = &[
        "self_attn.o_proj.bias",
        "mlp.gate_proj.bias",
        "mlp.up_proj.bias",
        "mlp.down_proj.bias",
    ];
    for i in 0..n_layers {
        for part in UNREAD {
            let name = format!("{prefix}layers.{i}.{part}");
            if weights.contains(&name) {
                return Err(EngineError::load(
                    dir.display().to_string(),
                    format!("tensor `{name}`: biases on the output and MLP projections are not supported"),
                ));
            }
        }
    }
    Ok(())
}

impl LlamaModel {
    /// Builds the decoder from an HF folder's parsed `config.json` and weights. `head`: read
    /// the LM head (generation), or leave it (an embedding model, whose checkpoint may have
    /// none).
    pub fn from_hf(
        dir: &Path,
        config: &Value,
        weights: &SafetensorsWeights,
        bos_token_id: Option<u32>,
        eos_token_ids: Vec<u32>,
        rules: &DecoderRules,
        head: LmHead,
    ) -> Result<Self> {
        let t0 = std::time::Instant::now();
        // The last: a checkpoint saved from the bare model class (`Qwen3Model`, as
        // Qwen3-Embedding's file is), whose names have no prefix.
        let prefix = ["model.language_model.", "model.", "language_model.model.", ""]
            .into_iter()
            .find(|p| weights.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| {
                EngineError::load(
                    dir.join("model.safetensors").display().to_string(),
                    "no `model.embed_tokens.weight` (nor `embed_tokens.weight`, `model.language_model.embed_tokens.weight`): not a decoder checkpoint",
                )
            })?;
        let embed_name = format!("{prefix}embed_tokens.weight");
        let vocab_from_weights = weights
            .shape(&embed_name)
            .and_then(|s| s.first().copied())
            .unwrap_or(0);
        let HfDecoderConfig {
            cfg,
            mrope_section,
            rope_factors,
            context_rope,
        } = read_hf_config(config, vocab_from_weights, rules)?;
        let l = HfLoader {
            w: weights,
            qkv_rows: (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim,
            gate_up_rows: 2 * cfg.ffn,
        };
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let token_embd = l.matrix(&embed_name, cfg.vocab, h)?;
        // Absent from the file, transformers' class default decides.
        let tied = text_section(config)
            .get("tie_word_embeddings")
            .or_else(|| config.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(rules.tied_by_default);
        let head_name = ["lm_head.weight", "language_model.lm_head.weight"]
            .into_iter()
            .find(|n| weights.contains(n));
        let output = match (tied, head_name) {
            // Never multiplied: an embedding model stops at the final norm.
            _ if head == LmHead::Skip => token_embd,
            (true, _) => token_embd,
            (false, Some(name)) => l.matrix(name, cfg.vocab, h)?,
            (false, None) => {
                return Err(EngineError::load(
                    dir.display().to_string(),
                    "tie_word_embeddings is false and the checkpoint has no `lm_head.weight`",
                ))
            }
        };
        refuse_unread_biases(dir, weights, prefix, cfg.n_layers)?;
        let sandwich = cfg.traits.sandwich_norms;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                load_layer(&l, &cfg, |part| {
                    format!("{prefix}layers.{i}.{}", part.hf(sandwich))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let output_norm = offset_norm(&cfg, l.vector(&format!("{prefix}norm.weight"), h)?);
        let info = DecoderInfo {
            vocab_size: cfg.vocab,
            n_layers: cfg.n_layers,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            max_position: cfg.max_position,
            bos_token_id,
            eos_token_ids,
        };
        tracing::info!(
            dir = %dir.display(),
            architecture = %cfg.architecture,
            layers = cfg.n_layers,
            hidden = h,
            heads = cfg.n_heads,
            kv_heads = cfg.n_kv_heads,
            ffn = cfg.ffn,
            vocab = cfg.vocab,
            tied_embeddings = tied,
            mrope = ?mrope_section,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "built Llama-family decoder from safetensors"
        );
        let mut model = LlamaModel {
            info,
            cfg,
            maps: weights.maps(),
            interleaved: None,
            file_pages: false,
            token_embd,
            output,
            output_norm,
            rope_factors,
            context_rope,
            layers,
            activation_mode: ActivationMode::default(),
            state: Mutex::new(StepState::default()),
        };
        // The model's own context until the server says otherwise.
        let max_position = model.cfg.max_position;
        crate::model::CausalLm::fit_context(&mut model, max_position);
        Ok(model)
    }
}
