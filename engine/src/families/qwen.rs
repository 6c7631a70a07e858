//! Qwen2 and Qwen3: Llama's layers with Q/K/V biases (Qwen2) or per-head Q/K norms (Qwen3),
//! both read from the weights present, RoPE stored NeoX-style, and sliding windows only when
//! `use_sliding_window` is set, from layer `max_window_layers` on.

use serde_json::Value;

use super::{Build, Family};
use crate::models::llama::{DecoderRules, LLAMA_RULES};

/// Qwen's sliding layers: from `max_window_layers` on, when `use_sliding_window` is true.
pub fn qwen_sliding_layer(t: &Value, layer: usize) -> bool {
    let from = t
        .get("max_window_layers")
        .and_then(Value::as_u64)
        .map_or(0, |n| n as usize);
    t.get("use_sliding_window").and_then(Value::as_bool) == Some(true) && layer >= from
}

pub static QWEN_RULES: DecoderRules = DecoderRules {
    gguf_rope_neox: true,
    sliding_layer: Some(qwen_sliding_layer),
    ..LLAMA_RULES
};

pub static QWEN2: Family = Family {
    name: "Qwen2",
    hf_architectures: &["Qwen2ForCausalLM"],
    gguf_architectures: &["qwen2"],
    build: Build::Decoder {
        rules: &QWEN_RULES,
        media: None,
    },
};

pub static QWEN3: Family = Family {
    name: "Qwen3",
    hf_architectures: &["Qwen3ForCausalLM"],
    gguf_architectures: &["qwen3"],
    build: Build::Decoder {
        rules: &QWEN_RULES,
        media: None,
    },
};

/// The bare model classes, which vLLM serves as embedding models (Qwen3-Embedding's own
/// config names `Qwen3ForCausalLM`, and is an embedding model by its sentence-transformers
/// files; see [`crate::load`]).
pub static QWEN2_EMBEDDER: Family = Family {
    name: "Qwen2 embedding",
    hf_architectures: &["Qwen2Model"],
    gguf_architectures: &[],
    build: Build::DecoderEmbedder { rules: &QWEN_RULES },
};

pub static QWEN3_EMBEDDER: Family = Family {
    name: "Qwen3 embedding",
    hf_architectures: &["Qwen3Model"],
    gguf_architectures: &[],
    build: Build::DecoderEmbedder { rules: &QWEN_RULES },
};
