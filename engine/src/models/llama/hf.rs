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

use super::{load_layer, LlamaConfig, LlamaModel, StepState, Weight, WeightSource};
use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::model::{ActivationMode, DecoderInfo};

/// `architectures` entries this loader accepts.
pub const HF_DECODER_ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    // Llama's layers with q/k/v and gate/up each stored as one fused matrix (see `fused`).
    "Phi3ForCausalLM",
];

fn cfg_error(msg: impl Into<String>) -> EngineError {
    EngineError::load("config.json", msg)
}

/// The text model's settings: top level, or `text_config` where the checkpoint nests them.
fn text_section(config: &Value) -> &Value {
    config
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(config)
}

fn need_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .filter(|n| *n > 0)
        .ok_or_else(|| cfg_error(format!("`{key}` is missing or not a positive integer")))
}

/// The decoder's settings from `config.json`: the hyper-parameters, M-RoPE's sections, and the
/// per-frequency RoPE divisors a scaling type computes (`llama3`), as GGUF's `rope_freqs`.
pub struct HfDecoderConfig {
    pub cfg: LlamaConfig,
    pub mrope_section: Option<Vec<usize>>,
    pub rope_factors: Option<Vec<f32>>,
}

/// Reads the decoder's hyper-parameters from `config.json`.
pub fn read_hf_config(config: &Value, vocab_from_weights: usize) -> Result<HfDecoderConfig> {
    let arch = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !HF_DECODER_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(cfg_error(format!(
            "architecture `{arch}` is not supported as a decoder (supported: {})",
            HF_DECODER_ARCHITECTURES.join(", ")
        )));
    }
    let t = text_section(config);
    let hidden = need_usize(t, "hidden_size")?;
    let n_layers = need_usize(t, "num_hidden_layers")?;
    let n_heads = need_usize(t, "num_attention_heads")?;
    let n_kv_heads = t
        .get("num_key_value_heads")
        .and_then(Value::as_u64)
        .map_or(n_heads, |n| n as usize);
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(cfg_error(format!(
            "{n_heads} attention heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    let head_dim = match t.get("head_dim").and_then(Value::as_u64) {
        Some(d) => d as usize,
        None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
        None => {
            return Err(cfg_error(format!(
                "hidden size {hidden} is not a multiple of {n_heads} heads"
            )))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(cfg_error(format!("head dim {head_dim} must be even")));
    }
    let ffn = need_usize(t, "intermediate_size")?;
    // Settings that change the numbers and that these layers do not implement are refused
    // rather than ignored.
    if let Some(act) = t.get("hidden_act").and_then(Value::as_str) {
        if !matches!(act, "silu" | "swish") {
            return Err(cfg_error(format!(
                "hidden_act `{act}` is not supported by the Llama-family MLP (silu)"
            )));
        }
    }
    let partial = t
        .get("partial_rotary_factor")
        .or_else(|| {
            t.get("rope_parameters")
                .and_then(|r| r.get("partial_rotary_factor"))
        })
        .and_then(Value::as_f64);
    if partial.is_some_and(|p| p != 1.0) {
        return Err(cfg_error(format!(
            "partial_rotary_factor {} is not supported (RoPE over the whole head only)",
            partial.unwrap_or(1.0)
        )));
    }
    let eps = t
        .get("rms_norm_eps")
        .and_then(Value::as_f64)
        .unwrap_or(1e-6) as f32;
    let scaling = t
        .get("rope_scaling")
        .or_else(|| t.get("rope_parameters"))
        .filter(|v| v.is_object());
    let rope_base = t
        .get("rope_theta")
        .or_else(|| scaling.and_then(|s| s.get("rope_theta")))
        .and_then(Value::as_f64)
        .unwrap_or(10000.0) as f32;
    let mut rope_freq_scale = 1.0f32;
    let mut rope_attn_factor = 1.0f32;
    let mut rope_factors = None;
    let mut mrope_section = None;
    if let Some(s) = scaling {
        let kind = s
            .get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if let Some(sec) = s.get("mrope_section").and_then(Value::as_array) {
            let sec: Vec<usize> = sec
                .iter()
                .filter_map(Value::as_u64)
                .map(|n| n as usize)
                .collect();
            if sec.len() != 3 || sec.iter().sum::<usize>() * 2 != head_dim {
                return Err(cfg_error(format!(
                    "mrope_section {sec:?} must have three parts summing to head_dim / 2 = {}",
                    head_dim / 2
                )));
            }
            mrope_section = Some(sec);
        }
        match kind {
            "default" | "mrope" => {}
            "linear" => {
                let f = s.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
                if f <= 0.0 {
                    return Err(cfg_error("rope_scaling.factor must be positive"));
                }
                rope_freq_scale = (1.0 / f) as f32;
            }
            "llama3" => {
                let original = original_context(t, s);
                rope_factors = Some(llama3_factors(s, rope_base, head_dim, original)?);
            }
            "yarn" => {
                let original = original_context(t, s);
                let (factors, attn) = yarn_factors(s, rope_base, head_dim, original, t)?;
                rope_factors = Some(factors);
                rope_attn_factor = attn;
            }
            other => {
                return Err(cfg_error(format!(
                    "rope scaling `{other}` is not supported (supported: default, linear, llama3, yarn, mrope)"
                )))
            }
        }
    }
    let vocab = t
        .get("vocab_size")
        .or_else(|| config.get("vocab_size"))
        .and_then(Value::as_u64)
        .map_or(vocab_from_weights, |n| n as usize);
    let mut max_position = t
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .map_or(2048, |n| n as usize);
    // Sliding-window attention (Mistral v0.1's 4096) is not built: within the window full
    // attention computes the same numbers, so the model is served no longer than its window
    // rather than wrong past it. Qwen2's `use_sliding_window: false` turns the field off.
    let window = t
        .get("sliding_window")
        .and_then(Value::as_u64)
        .filter(|_| t.get("use_sliding_window").and_then(Value::as_bool) != Some(false))
        .map(|w| w as usize);
    if let Some(w) = window.filter(|&w| w < max_position) {
        if w == 0 {
            return Err(cfg_error("`sliding_window` must be positive"));
        }
        tracing::warn!(
            sliding_window = w,
            max_position_embeddings = max_position,
            "sliding-window attention is not built: sequences are limited to the window ({w} tokens), where full attention gives the same numbers"
        );
        max_position = w;
    }
    Ok(HfDecoderConfig {
        cfg: LlamaConfig {
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
            rope_dim: head_dim,
            rope_neox: true,
            rope_freq_scale,
            rope_attn_factor,
            max_position,
            mrope_section: mrope_section.as_deref().map(|s| [s[0], s[1], s[2]]),
        },
        mrope_section,
        rope_factors,
    })
}

/// The context the model was pretrained at, as transformers reads it for `llama3` and `yarn`:
/// a top-level `original_max_position_embeddings` (Phi-3 keeps it there), else the scaling's
/// own, else `max_position_embeddings`.
fn original_context(t: &Value, s: &Value) -> f64 {
    t.get("original_max_position_embeddings")
        .or_else(|| s.get("original_max_position_embeddings"))
        .or_else(|| t.get("max_position_embeddings"))
        .and_then(Value::as_f64)
        .unwrap_or(2048.0)
}

/// YaRN (transformers' `_compute_yarn_parameters`) as per-frequency divisors and the
/// attention factor: frequencies that turn fewer than `beta_slow` times over the original
/// context are interpolated (divided by `factor`), more than `beta_fast` times kept, with a
/// linear ramp between; cos and sin are scaled by `attention_factor` (by default
/// `0.1 ln(factor) + 1`, or the `mscale` / `mscale_all_dim` ratio).
fn yarn_factors(
    s: &Value,
    base: f32,
    head_dim: usize,
    original: f64,
    t: &Value,
) -> Result<(Vec<f32>, f32)> {
    let num = |key: &str| s.get(key).and_then(Value::as_f64);
    if num("partial_rotary_factor").is_some_and(|p| p != 1.0) {
        return Err(cfg_error(
            "rope_scaling `yarn` with a partial_rotary_factor is not supported",
        ));
    }
    let factor = match num("factor") {
        Some(f) => f,
        None => {
            t.get("max_position_embeddings")
                .and_then(Value::as_f64)
                .unwrap_or(original)
                / original
        }
    };
    if factor <= 0.0 {
        return Err(cfg_error("rope_scaling `yarn` needs a positive `factor`"));
    }
    let mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention = match (
        num("attention_factor"),
        num("mscale"),
        num("mscale_all_dim"),
    ) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
            mscale(factor, m) / mscale(factor, all)
        }
        _ => mscale(factor, 1.0),
    };
    // `or` as transformers reads them: 0 or absent take the defaults.
    let beta_fast = num("beta_fast").filter(|v| *v != 0.0).unwrap_or(32.0);
    let beta_slow = num("beta_slow").filter(|v| *v != 0.0).unwrap_or(1.0);
    let truncate = s.get("truncate").and_then(Value::as_bool).unwrap_or(true);
    let dim = head_dim as f64;
    let base = base as f64;
    let correction = |rotations: f64| {
        dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    let factors = (0..head_dim / 2)
        .map(|i| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            // New frequency = old · ((1 − keep) / factor + keep): the divisor is its inverse.
            (1.0 / ((1.0 - keep) / factor + keep)) as f32
        })
        .collect();
    Ok((factors, attention as f32))
}

/// Llama 3.1's RoPE scaling as per-frequency divisors (GGUF's `rope_freqs`, which the angle
/// divides by): frequencies whose wavelength is under `original_max_position_embeddings /
/// high_freq_factor` keep theirs, those over `original / low_freq_factor` are divided by
/// `factor`, and those between blend the two smoothly.
fn llama3_factors(s: &Value, base: f32, head_dim: usize, original: f64) -> Result<Vec<f32>> {
    let need = |key: &str| {
        s.get(key)
            .and_then(Value::as_f64)
            .filter(|v| *v > 0.0)
            .ok_or_else(|| cfg_error(format!("rope_scaling `llama3` needs a positive `{key}`")))
    };
    let factor = need("factor")?;
    let low = need("low_freq_factor")?;
    let high = need("high_freq_factor")?;
    if high <= low {
        return Err(cfg_error(format!(
            "rope_scaling `llama3`: high_freq_factor ({high}) must exceed low_freq_factor ({low})"
        )));
    }
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    Ok((0..head_dim / 2)
        .map(|i| {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            divisor as f32
        })
        .collect())
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
        let row_bytes = whole.len / total.max(1);
        Ok(Some(Weight {
            rows,
            start: whole.start + first * row_bytes,
            len: rows * row_bytes,
            ..whole
        }))
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

impl LlamaModel {
    /// Builds the decoder from an HF folder's parsed `config.json` and weights.
    pub fn from_hf(
        dir: &Path,
        config: &Value,
        weights: &SafetensorsWeights,
        bos_token_id: Option<u32>,
        eos_token_ids: Vec<u32>,
    ) -> Result<Self> {
        let t0 = std::time::Instant::now();
        let prefix = ["model.language_model.", "model.", "language_model.model."]
            .into_iter()
            .find(|p| weights.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| {
                EngineError::load(
                    dir.join("model.safetensors").display().to_string(),
                    "no `model.embed_tokens.weight` (or `model.language_model.embed_tokens.weight`): not a decoder checkpoint",
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
        } = read_hf_config(config, vocab_from_weights)?;
        let l = HfLoader {
            w: weights,
            qkv_rows: (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim,
            gate_up_rows: 2 * cfg.ffn,
        };
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let token_embd = l.matrix(&embed_name, cfg.vocab, h)?;
        let tied = text_section(config)
            .get("tie_word_embeddings")
            .or_else(|| config.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
            || !["lm_head.weight", "language_model.lm_head.weight"]
                .iter()
                .any(|n| weights.contains(n));
        let lm_head = if weights.contains("lm_head.weight") {
            "lm_head.weight"
        } else {
            "language_model.lm_head.weight"
        };
        let output = if tied {
            token_embd
        } else {
            l.matrix(lm_head, cfg.vocab, h)?
        };
        let layers = (0..cfg.n_layers)
            .map(|i| load_layer(&l, &cfg, |part| format!("{prefix}layers.{i}.{}", part.hf())))
            .collect::<Result<Vec<_>>>()?;
        let output_norm = l.vector(&format!("{prefix}norm.weight"), h)?;
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
        Ok(LlamaModel {
            info,
            cfg,
            maps: weights.maps(),
            token_embd,
            output,
            output_norm,
            rope_factors,
            layers,
            activation_mode: ActivationMode::default(),
            state: Mutex::new(StepState::default()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 100, "rope_theta": 1000000.0
        })
    }

    #[test]
    fn reads_the_text_settings() {
        let HfDecoderConfig {
            cfg,
            mrope_section: mrope,
            rope_factors,
        } = read_hf_config(&base(), 0).unwrap();
        assert_eq!(rope_factors, None);
        assert_eq!((cfg.head_dim, cfg.n_kv_heads, cfg.vocab), (16, 2, 100));
        assert!(cfg.rope_neox);
        assert_eq!(cfg.rope_base, 1e6);
        assert_eq!(mrope, None);
        let mut vl = base();
        vl["architectures"] = json!(["Qwen2VLForConditionalGeneration"]);
        vl["rope_scaling"] = json!({"type": "mrope", "mrope_section": [4, 2, 2]});
        assert_eq!(
            read_hf_config(&vl, 0).unwrap().mrope_section,
            Some(vec![4, 2, 2])
        );
        // Nested text settings (transformers 5 layout).
        let nested =
            json!({"architectures": ["Qwen2VLForConditionalGeneration"], "text_config": base()});
        assert_eq!(read_hf_config(&nested, 0).unwrap().cfg.hidden, 64);
    }

    #[test]
    fn a_sliding_window_bounds_the_context_unless_turned_off() {
        let mut v = base();
        v["max_position_embeddings"] = json!(32768);
        v["sliding_window"] = json!(4096);
        assert_eq!(read_hf_config(&v, 0).unwrap().cfg.max_position, 4096);
        v["use_sliding_window"] = json!(false);
        assert_eq!(read_hf_config(&v, 0).unwrap().cfg.max_position, 32768);
        let mut v = base();
        v["sliding_window"] = Value::Null;
        assert_eq!(read_hf_config(&v, 0).unwrap().cfg.max_position, 2048);
    }

    #[test]
    fn llama3_divisors_run_from_one_to_the_factor() {
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        v["rope_theta"] = json!(10000.0);
        let f = read_hf_config(&v, 0).unwrap().rope_factors.unwrap();
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[7], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(
            f.iter().any(|&x| x > 1.0 && x < 8.0),
            "a blended band: {f:?}"
        );
    }

    #[test]
    fn refuses_what_it_cannot_run_with_a_reason() {
        let msg = |v: Value| {
            read_hf_config(&v, 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let mut v = base();
        v["architectures"] = json!(["GPT2LMHeadModel"]);
        assert!(msg(v).contains("GPT2LMHeadModel"));
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
        assert!(msg(v).contains("longrope"));
        let mut v = base();
        v["hidden_act"] = json!("gelu_pytorch_tanh");
        assert!(msg(v).contains("hidden_act `gelu_pytorch_tanh`"));
        let mut v = base();
        v["partial_rotary_factor"] = json!(0.75);
        assert!(msg(v).contains("partial_rotary_factor 0.75"));
        let mut v = base();
        v["rope_parameters"] = json!({"rope_type": "default", "partial_rotary_factor": 0.5});
        assert!(msg(v).contains("partial_rotary_factor 0.5"));
        let mut v = base();
        v["rope_scaling"] = json!({"type": "mrope", "mrope_section": [4, 4, 4]});
        assert!(msg(v).contains("mrope_section"));
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(msg(v).contains("KV heads"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        assert!(msg(v).contains("hidden_size"));
    }
}
