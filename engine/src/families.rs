//! The registry: every model family the engine serves, one file each, found by the first of an
//! HF `config.json`'s `architectures` or by a GGUF's `general.architecture`.
//!
//! A family file names its architectures in each format and says what it builds: the
//! Llama-shaped decoder of [`crate::models::llama`] with the family's [`DecoderRules`] (and the
//! media encoders of a multimodal checkpoint), or a BERT-shaped encoder with its head. The
//! loaders ([`crate::load`]) read files and ask this table; the models never see a loader.
//! Adding a family is one new file here and one line in [`FAMILIES`].

mod bert;
mod gemma;
mod llama;
mod mistral;
mod modernbert;
mod phi3;
mod qwen;
mod qwen2_audio;
mod qwen2_vl;
mod roberta;

use std::path::Path;

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::hf::{self, SafetensorsWeights};
use crate::models::bert::ClassifierLayout;
use crate::models::llama::DecoderRules;
use crate::models::media::MediaEncoders;

/// Every family, in the order `--help` and errors list them.
pub static FAMILIES: &[&Family] = &[
    &llama::LLAMA,
    &mistral::MISTRAL,
    &qwen::QWEN2,
    &qwen::QWEN3,
    &phi3::PHI3,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &qwen2_vl::QWEN2_VL,
    &qwen2_audio::QWEN2_AUDIO,
    &llama::LLAMA_EMBEDDER,
    &mistral::MISTRAL_EMBEDDER,
    &qwen::QWEN2_EMBEDDER,
    &qwen::QWEN3_EMBEDDER,
    &bert::BERT,
    &bert::BERT_CLASSIFIER,
    &roberta::ROBERTA_CLASSIFIER,
    &modernbert::MODERNBERT_CLASSIFIER,
];

/// One family: its names and what it builds.
pub struct Family {
    /// For logs and errors.
    pub name: &'static str,
    /// HF `architectures` entries it loads.
    pub hf_architectures: &'static [&'static str],
    /// GGUF `general.architecture` values it loads.
    pub gguf_architectures: &'static [&'static str],
    pub build: Build,
}

/// What a family builds.
pub enum Build {
    /// The Llama-shaped decoder with the family's rules, and the media encoders of a
    /// multimodal checkpoint.
    Decoder {
        rules: &'static DecoderRules,
        media: Option<MediaLoader>,
    },
    /// The Llama-shaped decoder whose architecture only embeds (`Qwen3Model`, `LlamaModel`:
    /// the bare model class, no LM head), served with a pooling head as vLLM serves it.
    DecoderEmbedder { rules: &'static DecoderRules },
    /// A BERT-shaped encoder with its head.
    Encoder(EncoderHeadKind),
}

/// Loads a multimodal checkpoint's encoders from its folder, `config.json` and weights.
pub type MediaLoader = fn(&Path, &Value, &SafetensorsWeights) -> Result<MediaEncoders>;

/// The head on an encoder family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderHeadKind {
    /// Pooled embeddings (pooling and normalisation from the sentence-transformers files).
    Embedding,
    /// A sequence-classification head of this layout.
    Classifier(ClassifierLayout),
    /// ModernBERT's own encoder and classification head ([`crate::models::modernbert`]).
    ModernBertClassifier,
}

/// The family of an HF architecture name.
pub fn by_hf_architecture(arch: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.hf_architectures.contains(&arch))
}

/// The family of a GGUF `general.architecture`.
pub fn by_gguf_architecture(arch: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_architectures.contains(&arch))
}

/// The HF architecture names of the families `pick` selects, for error messages.
pub fn hf_names(pick: impl Fn(&Build) -> bool) -> Vec<&'static str> {
    FAMILIES
        .iter()
        .filter(|f| pick(&f.build))
        .flat_map(|f| f.hf_architectures.iter().copied())
        .collect()
}

/// Every GGUF architecture name, for error messages.
pub fn gguf_names() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.gguf_architectures.iter().copied())
        .collect()
}

/// The decoder family of an HF `config.json`, or a load error naming the architecture and
/// listing the decoders supported.
pub fn hf_decoder(config: &Value) -> Result<(&'static DecoderRules, Option<MediaLoader>)> {
    let arch = hf::architecture(config);
    match by_hf_architecture(arch).map(|f| &f.build) {
        Some(Build::Decoder { rules, media }) => Ok((*rules, *media)),
        _ => Err(EngineError::load(
            "config.json",
            format!(
                "architecture `{arch}` is not supported as a decoder (supported: {})",
                hf_names(|b| matches!(b, Build::Decoder { .. })).join(", ")
            ),
        )),
    }
}

/// The rules of a decoder served as an embedding model: a family that only embeds, or a
/// text decoder converted (vLLM's `--convert embed`); an error names anything else.
pub fn hf_embedder(config: &Value) -> Result<&'static DecoderRules> {
    let arch = hf::architecture(config);
    match by_hf_architecture(arch).map(|f| &f.build) {
        Some(Build::DecoderEmbedder { rules }) | Some(Build::Decoder { rules, media: None }) => {
            Ok(rules)
        }
        Some(Build::Decoder { media: Some(_), .. }) => Err(EngineError::load(
            "config.json",
            format!("architecture `{arch}` has media encoders: serving it as an embedding model is not built"),
        )),
        _ => Err(EngineError::load(
            "config.json",
            format!(
                "architecture `{arch}` is not supported as a decoder embedding model (supported: {})",
                hf_names(|b| matches!(b, Build::DecoderEmbedder { .. } | Build::Decoder { media: None, .. })).join(", ")
            ),
        )),
    }
}

/// The decoder rules of a GGUF `general.architecture`, or an error listing those supported.
pub fn gguf_decoder(arch: &str) -> std::result::Result<&'static DecoderRules, String> {
    match by_gguf_architecture(arch).map(|f| &f.build) {
        Some(Build::Decoder { rules, .. }) => Ok(rules),
        _ => Err(format!(
            "unsupported architecture '{arch}' (supported: {})",
            gguf_names().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_belongs_to_one_family() {
        let mut hf = hf_names(|_| true);
        let mut gguf = gguf_names();
        let (n_hf, n_gguf) = (hf.len(), gguf.len());
        hf.sort_unstable();
        hf.dedup();
        gguf.sort_unstable();
        gguf.dedup();
        assert_eq!(
            (hf.len(), gguf.len()),
            (n_hf, n_gguf),
            "a name in two families"
        );
        assert!(by_hf_architecture("Gemma2ForCausalLM").is_some_and(|f| f.name == "Gemma 2"));
        assert!(by_gguf_architecture("phi3").is_some_and(|f| f.name == "Phi-3"));
    }

    #[test]
    fn unknown_architectures_are_named_with_the_supported_list() {
        let err = hf_decoder(&serde_json::json!({"architectures": ["GPT2LMHeadModel"]}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("GPT2LMHeadModel") && err.contains("Gemma3ForCausalLM"),
            "{err}"
        );
        let err = gguf_decoder("falcon").err().unwrap_or_default();
        assert!(err.contains("falcon") && err.contains("qwen3"), "{err}");
        // An encoder is not a decoder.
        assert!(gguf_decoder("bert").is_err());
        assert!(hf_decoder(&serde_json::json!({"architectures": ["BertModel"]})).is_err());
    }
}
