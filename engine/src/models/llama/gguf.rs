//! The Llama-family decoder built from a GGUF file: hyper-parameters from its metadata, weights
//! left in the memory map in their stored (possibly quantised) types.

use std::sync::{Arc, Mutex};

use kernels::{DType, QMatrix};

use super::rules::{DecoderRules, GgufShape};
use super::{load_layer, ContextRope, LlamaConfig, LlamaModel, StepState, Weight, WeightSource};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::model::{ActivationMode, DecoderInfo};
use crate::tokenizer::GgufTokenizer;

/// Loading helpers over one GGUF file.
struct Loader<'a> {
    g: &'a GgufFile,
}

impl WeightSource for Loader<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight> {
        Loader::matrix(self, name, rows, cols)
    }
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        Loader::vector(self, name, n)
    }
    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        Loader::optional_vector(self, name, n)
    }
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&crate::gguf::TensorInfo> {
        self.g
            .tensor(name)
            .ok_or_else(|| self.g.error(format!("missing tensor '{name}'")))
    }

    fn dtype(&self, name: &str) -> Result<DType> {
        let t = self.info(name)?;
        t.ggml_type.dtype().ok_or_else(|| {
            self.g.error(format!(
                "tensor '{name}' has type {}, which is not supported (supported: {})",
                t.ggml_type,
                crate::gguf::GgmlType::supported_names()
            ))
        })
    }

    /// A 2-D weight of `rows × cols` (GGML dims `[cols, rows]`), or its rows inside the
    /// fused matrix that holds it (Phi-3's `attn_qkv`, and `ffn_up` holding gate then up).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight> {
        if let Some(w) = self.fused(name, rows, cols)? {
            return Ok(w);
        }
        self.whole(name, rows, cols)
    }

    fn fused(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Weight>> {
        let Some((layer, part)) = name
            .rsplit_once('.')
            .and_then(|(rest, _)| rest.rsplit_once('.'))
        else {
            return Ok(None);
        };
        let has = |p: &str| self.g.tensor(&format!("{layer}.{p}.weight")).is_some();
        let total_rows = |p: &str| -> u64 {
            self.g
                .tensor(&format!("{layer}.{p}.weight"))
                .and_then(|t| t.dims.get(1).copied())
                .unwrap_or(0)
        };
        // (fused tensor, rows of the whole, first row of this part)
        let (fused, total, first) = match part {
            "attn_q" | "attn_k" | "attn_v" if !has(part) && has("attn_qkv") => {
                // Rows q, then k and v of equal size: k and v count back from the end.
                let total = total_rows("attn_qkv") as usize;
                let first = match part {
                    "attn_q" => 0,
                    "attn_k" => total.saturating_sub(2 * rows),
                    _ => total.saturating_sub(rows),
                };
                ("attn_qkv", total, first)
            }
            "ffn_gate" if !has("ffn_gate") && total_rows("ffn_up") == 2 * rows as u64 => {
                ("ffn_up", 2 * rows, 0)
            }
            "ffn_up" if !has("ffn_gate") && total_rows("ffn_up") == 2 * rows as u64 => {
                ("ffn_up", 2 * rows, rows)
            }
            _ => return Ok(None),
        };
        let whole = self.whole(&format!("{layer}.{fused}.weight"), total, cols)?;
        Ok(Some(whole.rows_view(first, rows)))
    }

    fn whole(&self, name: &str, rows: usize, cols: usize) -> Result<Weight> {
        let dtype = self.dtype(name)?;
        let t = self.info(name)?;
        if t.dims != [cols as u64, rows as u64] {
            return Err(self.g.error(format!(
                "tensor '{name}' has dims {:?}, expected [{cols}, {rows}]",
                t.dims
            )));
        }
        let w = Weight {
            file: 0,
            dtype,
            rows,
            cols,
            start: t.start,
            len: t.len,
            interleaved: false,
        };
        QMatrix::new(dtype, rows, cols, self.g.tensor_data(t))
            .map_err(|e| self.g.error(format!("tensor '{name}': {e}")))?;
        Ok(w)
    }

    /// A 1-D tensor of `n` values as f32.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let dtype = self.dtype(name)?;
        let t = self.info(name)?;
        if t.n_elements() != n as u64 || t.dims.len() != 1 {
            return Err(self.g.error(format!(
                "tensor '{name}' has dims {:?}, expected [{n}]",
                t.dims
            )));
        }
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(self.g.error(format!(
                "tensor '{name}' is {dtype}; 1-D tensors must be F32, F16 or BF16"
            )));
        }
        let mut v = vec![0f32; n];
        kernels::dequantize_row(dtype, self.g.tensor_data(t), &mut v);
        Ok(v)
    }

    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.g.tensor(name).is_some() {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    fn usize_key(&self, key: &str) -> Result<usize> {
        Ok(self.g.require_u64(key)? as usize)
    }
}

/// The registry has matched `general.architecture` to `rules` already.
fn read_config(g: &GgufFile, rules: &DecoderRules) -> Result<LlamaConfig> {
    let arch = g
        .get_str("general.architecture")?
        .ok_or_else(|| g.error("missing metadata 'general.architecture'"))?
        .to_string();
    let l = Loader { g };
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = l.usize_key(&key("embedding_length"))?;
    let n_layers = l.usize_key(&key("block_count"))?;
    // Each layer holds tensors: a count beyond the file's tensors is a claim, not a model (and
    // would size allocations by it).
    if n_layers > g.tensors().len() {
        return Err(g.error(format!(
            "block_count {n_layers} exceeds the file's {} tensors",
            g.tensors().len()
        )));
    }
    let n_heads = l.usize_key(&key("attention.head_count"))?;
    let n_kv_heads = g
        .get_u64(&key("attention.head_count_kv"))?
        .map_or(n_heads, |v| v as usize);
    let ffn = l.usize_key(&key("feed_forward_length"))?;
    if hidden == 0 || n_layers == 0 || n_heads == 0 || n_kv_heads == 0 || ffn == 0 {
        return Err(g.error("model dimensions must be non-zero"));
    }
    if !n_heads.is_multiple_of(n_kv_heads) {
        return Err(g.error(format!(
            "{n_heads} attention heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    let head_dim = match g.get_u64(&key("attention.key_length"))? {
        Some(v) => v as usize,
        None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
        None => {
            return Err(g.error(format!(
                "hidden size {hidden} is not a multiple of {n_heads} heads"
            )))
        }
    };
    // The projections' row counts: a product that overflows is a claim no tensor can match.
    for (what, heads) in [("head_count", n_heads), ("head_count_kv", n_kv_heads)] {
        if heads.checked_mul(head_dim).is_none() {
            return Err(g.error(format!(
                "attention.{what} {heads} times key_length {head_dim} overflows"
            )));
        }
    }
    if let Some(vl) = g.get_u64(&key("attention.value_length"))? {
        if vl as usize != head_dim {
            return Err(g.error("attention.value_length differs from key_length (unsupported)"));
        }
    }
    let rope_dim = g
        .get_u64(&key("rope.dimension_count"))?
        .map_or(head_dim, |v| v as usize);
    if rope_dim > head_dim || rope_dim % 2 != 0 || head_dim % 2 != 0 {
        return Err(g.error(format!(
            "invalid rope dimension {rope_dim} for head dim {head_dim}"
        )));
    }
    let positive = |k: &str, default: f64| -> Result<f32> {
        let v = g.get_f64(&key(k))?.unwrap_or(default) as f32;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(g.error(format!("{} is {v}; it must be a positive number", key(k))))
        }
    };
    let eps = positive("attention.layer_norm_rms_epsilon", 1e-5)?;
    let rope_base = positive("rope.freq_base", 10000.0)?;
    let scaling = g.get_str(&key("rope.scaling.type"))?.unwrap_or("none");
    let factor = g.get_f64(&key("rope.scaling.factor"))?;
    let rope_freq_scale = match (scaling, factor) {
        ("linear", Some(f)) if f > 0.0 => (1.0 / f) as f32,
        ("none", _) | (_, None) => {
            // Older files give the scale directly.
            g.get_f64(&key("rope.scale_linear"))?
                .filter(|f| *f > 0.0)
                .map_or(1.0, |f| (1.0 / f) as f32)
        }
        (other, Some(f)) => {
            if f != 1.0 {
                return Err(g.error(format!(
                    "unsupported rope scaling type '{other}' (factor {f}); supported: linear"
                )));
            }
            tracing::debug!(scaling = other, "rope scaling factor 1: no scaling");
            1.0
        }
    };
    let max_position = g
        .get_u64(&key("context_length"))?
        .map_or(2048, |v| v as usize);
    if max_position == 0 {
        return Err(g.error(format!("{} is 0", key("context_length"))));
    }
    let vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        Some(t) => {
            return Err(g.error(format!(
                "tensor 'token_embd.weight' has dims {:?}, expected 2-D",
                t.dims
            )))
        }
        None => return Err(g.error("missing tensor 'token_embd.weight'")),
    };
    let layers = (rules.gguf_layers)(
        g,
        &GgufShape {
            arch: &arch,
            hidden,
            n_layers,
            n_heads,
            head_dim,
            max_position,
        },
    )?;
    // LongRoPE's (Phi-3): 1 where the file has none.
    let rope_attn_factor = g
        .get_f64(&key("rope.scaling.attn_factor"))?
        .filter(|a| *a > 0.0)
        .map_or(1.0, |a| a as f32);
    Ok(LlamaConfig {
        architecture: arch,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn,
        vocab,
        eps,
        rope_base,
        rope_dim,
        rope_neox: rules.gguf_rope_neox,
        rope_freq_scale,
        rope_attn_factor,
        max_position,
        mrope_section: None,
        traits: layers.traits,
        windows: layers.windows,
        local_rope_base: layers.local_rope_base,
    })
}

impl LlamaModel {
    /// Build the model from a parsed GGUF file (the tokenizer supplies BOS/EOS ids) with its
    /// family's rules.
    pub fn from_gguf(g: &GgufFile, tok: &GgufTokenizer, rules: &DecoderRules) -> Result<Self> {
        let t0 = std::time::Instant::now();
        let cfg = read_config(g, rules)?;
        let l = Loader { g };
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let token_embd = l.matrix("token_embd.weight", cfg.vocab, h)?;
        let output = if g.tensor("output.weight").is_some() {
            l.matrix("output.weight", cfg.vocab, h)?
        } else {
            token_embd
        };
        let output_norm = l.vector("output_norm.weight", h)?;
        let rope_factors = l.optional_vector("rope_freqs.weight", cfg.rope_dim / 2)?;
        let context_rope = longrope(g, &l, &cfg)?;
        let layers = (0..cfg.n_layers)
            .map(|i| load_layer(&l, &cfg, |part| format!("blk.{i}.{}", part.gguf())))
            .collect::<Result<Vec<_>>>()?;
        let info = DecoderInfo {
            vocab_size: cfg.vocab,
            n_layers: cfg.n_layers,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            max_position: cfg.max_position,
            bos_token_id: tok.bos_token_id,
            eos_token_ids: tok.eos_token_ids.clone(),
        };
        tracing::info!(
            file = %g.path(),
            architecture = %cfg.architecture,
            layers = cfg.n_layers,
            hidden = h,
            heads = cfg.n_heads,
            kv_heads = cfg.n_kv_heads,
            ffn = cfg.ffn,
            vocab = cfg.vocab,
            tied_embeddings = g.tensor("output.weight").is_none(),
            rope_base = cfg.rope_base,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "built Llama-family decoder"
        );
        let mut model = LlamaModel {
            info,
            cfg,
            maps: vec![Arc::clone(g.mmap())],
            interleaved: None,
            file_pages: g.is_file_map(),
            token_embd,
            output,
            output_norm,
            rope_factors,
            context_rope,
            layers,
            activation_mode: ActivationMode::default(),
            state: Mutex::new(StepState::default()),
        };
        let max_position = model.cfg.max_position;
        crate::model::CausalLm::fit_context(&mut model, max_position);
        if model.activation_mode == ActivationMode::Q8 {
            if let Err(e) = model.interleave() {
                // The matrices stay as the file stores them: slower, the same results.
                tracing::warn!(error = %e, "matrices not interleaved");
            }
        }
        Ok(model)
    }
}

/// Phi-3's LongRoPE in GGUF: `rope_factors_long` and `rope_factors_short`, picked by the
/// served context against `rope.scaling.original_context_length` (as llama.cpp picks by its
/// context size).
fn longrope(g: &GgufFile, l: &Loader<'_>, cfg: &LlamaConfig) -> Result<Option<ContextRope>> {
    let n = cfg.rope_dim / 2;
    let (Some(long), Some(short)) = (
        l.optional_vector("rope_factors_long.weight", n)?,
        l.optional_vector("rope_factors_short.weight", n)?,
    ) else {
        return Ok(None);
    };
    let original = g
        .get_u64(&format!(
            "{}.rope.scaling.original_context_length",
            cfg.architecture
        ))?
        .ok_or_else(|| g.error("rope_factors_long without rope.scaling.original_context_length"))?;
    Ok(Some(ContextRope::LongRope {
        short,
        long,
        original: original as usize,
    }))
}
