//! Mistral: Llama's layers, every one sliding within `sliding_window` (4096 when the file has
//! none, transformers' class default; `null` turns it off).

use super::{Build, Family};
use crate::models::llama::{every_layer_slides, DecoderRules, LLAMA_RULES};

static RULES: DecoderRules = DecoderRules {
    default_window: Some(4096),
    sliding_layer: Some(every_layer_slides),
    ..LLAMA_RULES
};

pub static MISTRAL: Family = Family {
    name: "Mistral",
    hf_architectures: &["MistralForCausalLM"],
    // llama.cpp writes most Mistral files as `llama`; its older converter wrote `mistral`.
    // Neither stores the window, and llama.cpp attends globally on them; so does this.
    gguf_architectures: &["mistral"],
    build: Build::Decoder {
        rules: &RULES,
        media: None,
    },
};

/// The bare model class, which vLLM serves as an embedding model (e5-mistral's layout).
pub static MISTRAL_EMBEDDER: Family = Family {
    name: "Mistral embedding",
    hf_architectures: &["MistralModel"],
    gguf_architectures: &[],
    build: Build::DecoderEmbedder { rules: &RULES },
};
