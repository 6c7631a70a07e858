//! `config.json` of an HF checkpoint folder.
//!
//! One struct holds the fields any of our model families read; every field is optional so that a
//! config for another family still parses, and unknown fields are ignored. Model code asks for
//! the fields it needs through [`HfConfig::require`], which names the missing one.

use std::path::Path;

use serde::Deserialize;

use crate::error::{EngineError, Result};

/// A token id field that checkpoints write either as one number or as a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The fields of `config.json` that we use.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    pub hidden_act: Option<String>,
    /// BERT family.
    pub type_vocab_size: Option<usize>,
    pub layer_norm_eps: Option<f64>,
    pub position_embedding_type: Option<String>,
    pub pad_token_id: Option<u32>,
    /// Llama family.
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    pub bos_token_id: Option<TokenIds>,
    pub eos_token_id: Option<TokenIds>,
    pub torch_dtype: Option<String>,
    /// Sequence classification: one name per label, keyed by the label id as a string.
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
    pub num_labels: Option<usize>,
    pub problem_type: Option<String>,
    /// What sentence-transformers records for a CrossEncoder (`activation_fn`), in its
    /// current and its older key.
    pub sentence_transformers: Option<serde_json::Value>,
    pub sbert_ce_default_activation_function: Option<String>,
}

impl HfConfig {
    /// Reads and parses `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| EngineError::load(path.display().to_string(), e.to_string()))?;
        Self::from_json(&text)
            .map_err(|reason| EngineError::load(path.display().to_string(), reason))
    }

    /// Parses the text of a `config.json`; the error is the reason, for the caller to attach
    /// the file name to.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("invalid config.json: {e}"))
    }

    /// A field model code cannot do without: `Load` naming `config.json` and the field when it
    /// is absent.
    pub fn require<T: Copy>(&self, value: Option<T>, field: &str) -> Result<T> {
        value.ok_or_else(|| {
            EngineError::load("config.json", format!("missing required field `{field}`"))
        })
    }

    /// The first listed architecture, or an empty string.
    pub fn architecture(&self) -> &str {
        self.architectures.first().map(String::as_str).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_fields_and_ignores_unknown_ones() {
        let cfg = HfConfig::from_json(
            r#"{"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8,
                "layer_norm_eps": 1e-12, "eos_token_id": [2, 3], "bos_token_id": 1,
                "something_new": {"nested": true}}"#,
        )
        .unwrap();
        assert_eq!(cfg.architecture(), "BertModel");
        assert_eq!(cfg.hidden_size, Some(8));
        assert_eq!(cfg.layer_norm_eps, Some(1e-12));
        assert_eq!(cfg.eos_token_id.map(|t| t.to_vec()), Some(vec![2, 3]));
        assert_eq!(cfg.bos_token_id.map(|t| t.to_vec()), Some(vec![1]));
    }

    #[test]
    fn require_names_the_missing_field() {
        let cfg = HfConfig::default();
        let err = cfg.require(cfg.hidden_size, "hidden_size").unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
    }

    #[test]
    fn invalid_json_is_an_error() {
        assert!(HfConfig::from_json("{not json").is_err());
    }
}
