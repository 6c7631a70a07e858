//! Gemma 2 and Gemma 3 (text): Llama's layers with the embeddings scaled by √hidden, `1 + w`
//! RMSNorms, a norm after the attention and after the MLP as well as before each, GeGLU,
//! attention scaled by `query_pre_attn_scalar`, soft-capped attention scores and logits
//! (Gemma 2), per-head Q/K norms (Gemma 3; loaded like Qwen3's), and sliding-window layers
//! (see `hf_config::layer_windows`; Gemma 3's turn with their own RoPE base).

use serde_json::Value;

use super::hf_config::{activation, cfg_error};
use super::{FamilyTraits, MlpActivation};
use crate::error::Result;
use crate::gguf::GgufFile;

/// The traits of a Gemma architecture, with transformers' defaults for absent fields;
/// `None` for every other architecture.
pub(super) fn traits(arch: &str, t: &Value, hidden: usize) -> Result<Option<FamilyTraits>> {
    // transformers' defaults: Gemma 2 caps scores at 50 and logits at 30, Gemma 3 caps neither.
    let (attn_cap, final_cap) = match arch {
        "Gemma2ForCausalLM" => (Some(50.0), Some(30.0)),
        "Gemma3ForCausalLM" => (None, None),
        _ => return Ok(None),
    };
    if t.get("use_bidirectional_attention")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        return Err(cfg_error(
            "use_bidirectional_attention is not supported (causal decoders only)",
        ));
    }
    let cap = |key: &str, default: Option<f64>| -> Result<Option<f32>> {
        match t.get(key) {
            None => Ok(default.map(|c| c as f32)),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|c| *c > 0.0)
                .map(|c| Some(c as f32))
                .ok_or_else(|| cfg_error(format!("`{key}` must be a positive number or null"))),
        }
    };
    let scalar = t
        .get("query_pre_attn_scalar")
        .map_or(Some(256.0), Value::as_f64)
        .filter(|s| *s > 0.0)
        .ok_or_else(|| cfg_error("`query_pre_attn_scalar` must be a positive number"))?;
    let activation = match t.get("hidden_activation") {
        None | Some(Value::Null) => MlpActivation::GeluTanh,
        Some(_) => activation(t, "hidden_activation")?,
    };
    Ok(Some(FamilyTraits {
        embed_scale: Some((hidden as f64).sqrt() as f32),
        norm_offset: true,
        sandwich_norms: true,
        activation,
        attn_softcap: cap("attn_logit_softcapping", attn_cap)?,
        final_softcap: cap("final_logit_softcapping", final_cap)?,
        attn_scale: Some((1.0 / scalar.sqrt()) as f32),
    }))
}

/// What a Gemma GGUF says, read as llama.cpp reads it: the converter has already added the 1
/// to the norms; the windows come from `attention.sliding_window` (Gemma 2: 4096 when absent;
/// Gemma 3: none) and `attention.sliding_window_pattern` (a period, or one flag per layer;
/// by default 2 and 6, the last layer of each period global); Gemma 3's sliding layers turn
/// with `rope.freq_base_swa` (10000 when absent). llama.cpp does not store
/// `query_pre_attn_scalar`: it scales by `1 / √head_dim`, or `1 / √(hidden / heads)` for the
/// 27B shapes (46 layers for Gemma 2, 62 for Gemma 3), and so does this.
pub(super) struct GgufGemma {
    pub traits: FamilyTraits,
    pub windows: Vec<Option<usize>>,
    pub local_rope_base: Option<f32>,
}

pub(super) fn gguf_traits(
    g: &GgufFile,
    arch: &str,
    shape: [usize; 4],
) -> Result<Option<GgufGemma>> {
    let [hidden, n_layers, n_heads, head_dim] = shape;
    let key = |k: &str| format!("{arch}.{k}");
    let (default_window, default_period, big, default_caps) = match arch {
        "gemma2" => (Some(4096), 2, 46, (Some(50.0), Some(30.0))),
        "gemma3" => (None, 6, 62, (None, None)),
        _ => return Ok(None),
    };
    let cap = |k: &str, default: Option<f32>| -> Result<Option<f32>> {
        Ok(match g.get_f64(&key(k))? {
            Some(c) if c > 0.0 => Some(c as f32),
            Some(_) => None,
            None => default,
        })
    };
    let attn_softcap = if arch == "gemma2" {
        cap("attn_logit_softcapping", default_caps.0)?
    } else {
        None
    };
    let final_softcap = cap("final_logit_softcapping", default_caps.1)?;
    let scale_dim = if n_layers == big {
        hidden / n_heads.max(1)
    } else {
        head_dim
    };
    let window = match g.get_u64(&key("attention.sliding_window"))? {
        Some(0) => None,
        Some(w) => Some(w as usize),
        None => default_window,
    };
    let windows = match window {
        None => Vec::new(),
        Some(w) => sliding_layers(
            g,
            &key("attention.sliding_window_pattern"),
            default_period,
            n_layers,
        )?
        .into_iter()
        .map(|s| s.then_some(w))
        .collect(),
    };
    let local_rope_base = match (arch, window) {
        ("gemma3", Some(_)) => {
            Some(g.get_f64(&key("rope.freq_base_swa"))?.unwrap_or(10000.0) as f32)
        }
        _ => g.get_f64(&key("rope.freq_base_swa"))?.map(|b| b as f32),
    };
    Ok(Some(GgufGemma {
        traits: FamilyTraits {
            embed_scale: Some((hidden as f64).sqrt() as f32),
            norm_offset: false,
            sandwich_norms: true,
            activation: MlpActivation::GeluTanh,
            attn_softcap,
            final_softcap,
            attn_scale: Some(1.0 / (scale_dim as f32).sqrt()),
        },
        windows,
        local_rope_base,
    }))
}

/// Which layers slide: `key` as one flag per layer, or as a period `n` (layer `i` slides
/// unless `i % n == n - 1`; 0: every layer), else `default_period`.
fn sliding_layers(
    g: &GgufFile,
    key: &str,
    default_period: usize,
    n_layers: usize,
) -> Result<Vec<bool>> {
    if let Some(flags) = g.get_array(key)? {
        if flags.len() != n_layers {
            return Err(g.error(format!(
                "{key} has {} entries for {n_layers} layers",
                flags.len()
            )));
        }
        return flags
            .iter()
            .map(|f| {
                f.as_bool()
                    .ok_or_else(|| g.error(format!("{key} must hold booleans")))
            })
            .collect();
    }
    let period = g.get_u64(key)?.map_or(default_period, |p| p as usize);
    Ok((0..n_layers)
        .map(|i| period == 0 || i % period < period - 1)
        .collect())
}
