//! Gemma 2 and Gemma 3 (text): Llama's layers with the embeddings scaled by √hidden, `1 + w`
//! RMSNorms, a norm after the attention and after the MLP as well as before each, GeGLU,
//! attention scaled by `query_pre_attn_scalar`, soft-capped attention scores and logits
//! (Gemma 2), per-head Q/K norms (Gemma 3; loaded like Qwen3's), and sliding-window layers
//! (see `hf_config::layer_windows`; Gemma 3's turn with their own RoPE base).

use serde_json::Value;

use super::hf_config::{activation, cfg_error};
use super::{FamilyTraits, MlpActivation};
use crate::error::Result;

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
