//! Llama 1-3.x (and SmolLM): the decoder as [`crate::models::llama`] defines it. Layers never
//! slide (transformers' Llama does not read `sliding_window`).

use super::{Build, Family};
use crate::models::llama::LLAMA_RULES;

pub static LLAMA: Family = Family {
    name: "Llama",
    hf_architectures: &["LlamaForCausalLM"],
    gguf_architectures: &["llama"],
    build: Build::Decoder {
        rules: &LLAMA_RULES,
        media: None,
    },
};

/// The bare model class, which vLLM serves as an embedding model.
pub static LLAMA_EMBEDDER: Family = Family {
    name: "Llama embedding",
    hf_architectures: &["LlamaModel"],
    gguf_architectures: &[],
    build: Build::DecoderEmbedder {
        rules: &LLAMA_RULES,
    },
};
