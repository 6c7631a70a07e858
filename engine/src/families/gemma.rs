//! Gemma 2 and Gemma 3 (text): Llama's layers with the embeddings scaled by √hidden, `1 + w`
//! RMSNorms, a norm after the attention and after the MLP as well as before each, GeGLU,
//! attention scaled by `query_pre_attn_scalar`, soft-capped attention scores and logits
//! (Gemma 2), per-head Q/K norms (Gemma 3; read from the weights present), and sliding-window
//! layers (Gemma 2 alternates from layer 0; Gemma 3 has one global layer in each
//! `sliding_window_pattern`, and its sliding layers turn with their own RoPE base).

use serde_json::Value;

use super::{Build, Family};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::models::llama::{
    activation, cfg_error, DecoderRules, FamilyTraits, GgufLayers, GgufShape, MlpActivation,
    LLAMA_RULES,
};

/// transformers' defaults for the soft caps: Gemma 2 caps scores at 50 and logits at 30,
/// Gemma 3 caps neither.
const GEMMA2_CAPS: (Option<f64>, Option<f64>) = (Some(50.0), Some(30.0));
const GEMMA3_CAPS: (Option<f64>, Option<f64>) = (None, None);

fn gemma2_traits(t: &Value, hidden: usize) -> Result<FamilyTraits> {
    traits(t, hidden, GEMMA2_CAPS)
}

fn gemma3_traits(t: &Value, hidden: usize) -> Result<FamilyTraits> {
    traits(t, hidden, GEMMA3_CAPS)
}

/// The traits of a Gemma `config.json`, with transformers' defaults for absent fields.
fn traits(
    t: &Value,
    hidden: usize,
    (attn_cap, final_cap): (Option<f64>, Option<f64>),
) -> Result<FamilyTraits> {
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
    Ok(FamilyTraits {
        embed_scale: Some((hidden as f64).sqrt() as f32),
        norm_offset: true,
        sandwich_norms: true,
        activation,
        attn_softcap: cap("attn_logit_softcapping", attn_cap)?,
        final_softcap: cap("final_logit_softcapping", final_cap)?,
        attn_scale: Some((1.0 / scalar.sqrt()) as f32),
    })
}

/// Gemma 2's sliding layers: the even ones.
fn gemma2_sliding_layer(_t: &Value, layer: usize) -> bool {
    layer.is_multiple_of(2)
}

/// Gemma 3's sliding layers: all but the last of each `sliding_window_pattern` (6 by default).
fn gemma3_sliding_layer(t: &Value, layer: usize) -> bool {
    let pattern = t
        .get("sliding_window_pattern")
        .or_else(|| t.get("_sliding_window_pattern"))
        .and_then(Value::as_u64)
        .map_or(6, |n| n.max(1) as usize);
    !(layer + 1).is_multiple_of(pattern)
}

/// A Gemma GGUF's defaults: the window when absent, the sliding period, the layer count of the
/// 27B shape, and the soft caps.
struct GgufDefaults {
    window: Option<usize>,
    period: usize,
    big: usize,
    caps: (Option<f32>, Option<f32>),
    /// Whether the file's attention soft cap is read (Gemma 3 has none).
    attn_cap: bool,
    /// Whether the sliding layers turn with `rope.freq_base_swa` (10000 when absent).
    local_rope: bool,
}

fn gemma2_gguf(g: &GgufFile, shape: &GgufShape) -> Result<GgufLayers> {
    gguf_layers(
        g,
        shape,
        &GgufDefaults {
            window: Some(4096),
            period: 2,
            big: 46,
            caps: (Some(50.0), Some(30.0)),
            attn_cap: true,
            local_rope: false,
        },
    )
}

fn gemma3_gguf(g: &GgufFile, shape: &GgufShape) -> Result<GgufLayers> {
    gguf_layers(
        g,
        shape,
        &GgufDefaults {
            window: None,
            period: 6,
            big: 62,
            caps: (None, None),
            attn_cap: false,
            local_rope: true,
        },
    )
}

/// What a Gemma GGUF says, read as llama.cpp reads it: the converter has already added the 1
/// to the norms; the windows come from `attention.sliding_window` (Gemma 2: 4096 when absent;
/// Gemma 3: none) and `attention.sliding_window_pattern` (a period, or one flag per layer;
/// by default 2 and 6, the last layer of each period global); Gemma 3's sliding layers turn
/// with `rope.freq_base_swa` (10000 when absent). llama.cpp does not store
/// `query_pre_attn_scalar`: it scales by `1 / √head_dim`, or `1 / √(hidden / heads)` for the
/// 27B shapes (46 layers for Gemma 2, 62 for Gemma 3), and so does this.
fn gguf_layers(g: &GgufFile, shape: &GgufShape, d: &GgufDefaults) -> Result<GgufLayers> {
    let cap = |k: &str, default: Option<f32>| -> Result<Option<f32>> {
        Ok(match g.get_f64(&shape.key(k))? {
            Some(c) if c > 0.0 => Some(c as f32),
            Some(_) => None,
            None => default,
        })
    };
    let attn_softcap = if d.attn_cap {
        cap("attn_logit_softcapping", d.caps.0)?
    } else {
        None
    };
    let final_softcap = cap("final_logit_softcapping", d.caps.1)?;
    let scale_dim = if shape.n_layers == d.big {
        shape.hidden / shape.n_heads.max(1)
    } else {
        shape.head_dim
    };
    let window = match g.get_u64(&shape.key("attention.sliding_window"))? {
        Some(0) => None,
        Some(w) => Some(w as usize),
        None => d.window,
    };
    let windows = match window {
        None => Vec::new(),
        Some(w) => sliding_layers(
            g,
            &shape.key("attention.sliding_window_pattern"),
            d.period,
            shape.n_layers,
        )?
        .into_iter()
        .map(|s| s.then_some(w))
        .collect(),
    };
    let swa_base = g.get_f64(&shape.key("rope.freq_base_swa"))?;
    let local_rope_base = match (d.local_rope, window) {
        (true, Some(_)) => Some(swa_base.unwrap_or(10000.0) as f32),
        _ => swa_base.map(|b| b as f32),
    };
    Ok(GgufLayers {
        traits: FamilyTraits {
            embed_scale: Some((shape.hidden as f64).sqrt() as f32),
            norm_offset: false,
            sandwich_norms: true,
            activation: MlpActivation::GeluTanh,
            attn_softcap,
            final_softcap,
            attn_scale: Some(1.0 / (scale_dim as f32).sqrt()),
        },
        windows,
        local_rope_base,
    })
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

static GEMMA2_RULES: DecoderRules = DecoderRules {
    gguf_rope_neox: true,
    default_window: Some(4096),
    sliding_layer: Some(gemma2_sliding_layer),
    hf_traits: gemma2_traits,
    tied_by_default: true,
    gguf_layers: gemma2_gguf,
    ..LLAMA_RULES
};

static GEMMA3_RULES: DecoderRules = DecoderRules {
    gguf_rope_neox: true,
    default_window: Some(4096),
    sliding_layer: Some(gemma3_sliding_layer),
    hf_traits: gemma3_traits,
    local_rope: true,
    tied_by_default: true,
    gguf_layers: gemma3_gguf,
};

pub static GEMMA2: Family = Family {
    name: "Gemma 2",
    hf_architectures: &["Gemma2ForCausalLM"],
    gguf_architectures: &["gemma2"],
    build: Build::Decoder {
        rules: &GEMMA2_RULES,
        media: None,
    },
};

pub static GEMMA3: Family = Family {
    name: "Gemma 3",
    hf_architectures: &["Gemma3ForCausalLM"],
    gguf_architectures: &["gemma3"],
    build: Build::Decoder {
        rules: &GEMMA3_RULES,
        media: None,
    },
};
