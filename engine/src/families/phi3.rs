//! Phi-3: Llama's layers with Q/K/V and gate/up each stored as one fused matrix (split by row
//! views at load), RoPE stored NeoX-style, LongRoPE (`rope_scaling.type: longrope`, or GGUF's
//! `rope_factors_long/short`), and every layer sliding within `sliding_window` where set.

use super::{Build, Family};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::models::llama::{every_layer_slides, DecoderRules, GgufLayers, GgufShape, LLAMA_RULES};

/// Phi-3's window as transformers applies it, from `attention.sliding_window` (llama.cpp
/// turns Phi-3's sliding window off; this follows the model's authors).
fn gguf_layers(g: &GgufFile, shape: &GgufShape) -> Result<GgufLayers> {
    let windows = match g.get_u64(&shape.key("attention.sliding_window"))? {
        Some(w) if w > 0 && (w as usize) < shape.max_position => {
            vec![Some(w as usize); shape.n_layers]
        }
        _ => Vec::new(),
    };
    Ok(GgufLayers {
        windows,
        ..GgufLayers::default()
    })
}

static RULES: DecoderRules = DecoderRules {
    gguf_rope_neox: true,
    sliding_layer: Some(every_layer_slides),
    gguf_layers,
    ..LLAMA_RULES
};

pub static PHI3: Family = Family {
    name: "Phi-3",
    hf_architectures: &["Phi3ForCausalLM"],
    gguf_architectures: &["phi3"],
    build: Build::Decoder {
        rules: &RULES,
        media: None,
    },
};
