//! What a family changes in the Llama-shaped decoder. Each family file under
//! [`crate::families`] fills one [`DecoderRules`]; the config readers (HF and GGUF) consult it
//! instead of naming architectures, so a new Llama-shaped family needs no edit here.

use serde_json::Value;

use super::hf_config::activation;
use super::FamilyTraits;
use crate::error::Result;
use crate::gguf::GgufFile;

/// A family's departures from Llama, as its config files express them.
pub struct DecoderRules {
    /// GGUF only: whether RoPE turns NeoX-style (pairs `i`, `i + d/2`). llama.cpp's converter
    /// permutes Llama-style Q/K rows so that adjacent pairs turn instead (`false`).
    pub gguf_rope_neox: bool,
    /// `sliding_window` when `config.json` does not give one (transformers' class default).
    pub default_window: Option<usize>,
    /// Which layers slide when `config.json` has no `layer_types`, from the text config and the
    /// layer index. `None`: the family's layers never slide and the window fields are not read
    /// (transformers' Llama does not read them).
    pub sliding_layer: Option<fn(&Value, usize) -> bool>,
    /// The family's traits from `config.json`'s text section and the hidden size.
    pub hf_traits: fn(&Value, usize) -> Result<FamilyTraits>,
    /// Whether the sliding layers turn with a RoPE base of their own (`rope_local_base_freq`
    /// or `rope_parameters.sliding_attention`).
    pub local_rope: bool,
    /// `tie_word_embeddings` when `config.json` does not say (transformers' class default).
    pub tied_by_default: bool,
    /// Traits, per-layer windows and the local RoPE base from a GGUF's metadata.
    pub gguf_layers: fn(&GgufFile, &GgufShape) -> Result<GgufLayers>,
}

/// The hyper-parameters a GGUF family reader needs, read before it is called.
pub struct GgufShape<'a> {
    /// `general.architecture`, the prefix of the family's metadata keys.
    pub arch: &'a str,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub max_position: usize,
}

impl GgufShape<'_> {
    /// The family's metadata key `k` (`{arch}.{k}`).
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
}

/// What a GGUF family reader returns.
#[derive(Default)]
pub struct GgufLayers {
    pub traits: FamilyTraits,
    /// Per layer, its sliding window (empty: none slides).
    pub windows: Vec<Option<usize>>,
    pub local_rope_base: Option<f32>,
}

/// Llama's traits from `config.json`: only the MLP activation (`hidden_act`) is read.
pub fn llama_traits(t: &Value, _hidden: usize) -> Result<FamilyTraits> {
    Ok(FamilyTraits {
        activation: activation(t, "hidden_act")?,
        ..FamilyTraits::default()
    })
}

/// Llama's layers in a GGUF: no traits, no windows.
pub fn llama_gguf_layers(_g: &GgufFile, _shape: &GgufShape) -> Result<GgufLayers> {
    Ok(GgufLayers::default())
}

/// Every layer slides (Mistral, Phi-3), unless `use_sliding_window` is false.
pub fn every_layer_slides(t: &Value, _layer: usize) -> bool {
    t.get("use_sliding_window").and_then(Value::as_bool) != Some(false)
}

/// Llama's rules: every other family starts from these.
pub const LLAMA_RULES: DecoderRules = DecoderRules {
    gguf_rope_neox: false,
    default_window: None,
    sliding_layer: None,
    hf_traits: llama_traits,
    local_rope: false,
    tied_by_default: false,
    gguf_layers: llama_gguf_layers,
};
