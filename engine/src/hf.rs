//! HF checkpoint folders, read and nothing more: `config.json`, `*.safetensors` (one file or
//! sharded), `tokenizer.json`, `tokenizer_config.json`, the chat template, and the
//! sentence-transformers files of encoders. Which model a folder holds and how it is built is
//! [`crate::load`]'s and [`crate::families`]' business.

mod classifier;
mod config;
pub mod hub;
mod sentence_transformers;
mod weights;

use std::path::Path;

pub use self::classifier::classifier_info;
pub use self::config::{HfConfig, TokenIds};
pub use self::sentence_transformers::SentenceTransformersConfig;
pub use self::weights::{F32Tensor, RawTensor, SafetensorsWeights};

use crate::error::{EngineError, Result};

/// The first of `config.json`'s `architectures` (empty when absent).
pub fn architecture(config: &serde_json::Value) -> &str {
    config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("")
}

/// `dir/tokenizer.json` with its padding and truncation settings removed (callers pad or
/// truncate themselves; the file's values are often not the model's, e.g. MiniLM's 128).
pub fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = dir.join("tokenizer.json");
    let file = path.display().to_string();
    if !path.is_file() {
        return Err(EngineError::load(file, "tokenizer.json is missing"));
    }
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| EngineError::load(&file, e.to_string()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| EngineError::load(&file, e.to_string()))?;
    Ok(tokenizer)
}

/// The chat template of an HF folder: `chat_template.jinja`, else `chat_template.json`'s
/// `chat_template`, else `tokenizer_config.json`'s `chat_template` (a string, or a list of
/// named templates of which `default` or else the first is taken). `None` if there is none.
pub fn read_chat_template(dir: &Path) -> Option<String> {
    let jinja = dir.join("chat_template.jinja");
    if let Ok(text) = std::fs::read_to_string(&jinja) {
        return Some(text);
    }
    for file in ["chat_template.json", "tokenizer_config.json"] {
        let Some(value) = read_json_value(&dir.join(file)) else {
            continue;
        };
        if let Some(template) = template_from_value(value.get("chat_template")) {
            return Some(template);
        }
    }
    None
}

fn template_from_value(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(items) => {
            let named = |want: Option<&str>| {
                items.iter().find_map(|item| {
                    let name = item.get("name").and_then(|n| n.as_str());
                    if want.is_none() || name == want {
                        item.get("template")
                            .and_then(|t| t.as_str())
                            .map(str::to_string)
                    } else {
                        None
                    }
                })
            };
            named(Some("default")).or_else(|| named(None))
        }
        _ => None,
    }
}

/// `bos_token` and `eos_token` from `tokenizer_config.json` (plain strings or
/// `{"content": ...}` objects), falling back to `special_tokens_map.json`.
pub fn read_special_tokens(dir: &Path) -> (Option<String>, Option<String>) {
    let mut bos = None;
    let mut eos = None;
    for file in ["tokenizer_config.json", "special_tokens_map.json"] {
        if let Some(value) = read_json_value(&dir.join(file)) {
            bos = bos.or_else(|| token_string(value.get("bos_token")));
            eos = eos.or_else(|| token_string(value.get("eos_token")));
        }
    }
    (bos, eos)
}

/// The id of the pad token `tokenizer_config.json` (else `special_tokens_map.json`) names, as
/// Transformers' tokenizer has it; `None` when neither names one the vocabulary holds.
pub fn pad_token_id(dir: &Path, tokenizer: &tokenizers::Tokenizer) -> Option<u32> {
    ["tokenizer_config.json", "special_tokens_map.json"]
        .iter()
        .filter_map(|file| read_json_value(&dir.join(file)))
        .find_map(|v| token_string(v.get("pad_token")))
        .and_then(|token| tokenizer.token_to_id(&token))
}

fn token_string(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

pub(crate) fn read_json_value(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring unparsable JSON file");
            None
        }
    }
}

pub(crate) fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("engine-hf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn chat_template_sources() {
        let dir = tmpdir("template");
        assert_eq!(read_chat_template(&dir), None);
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                "bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#,
        )
        .unwrap();
        assert_eq!(read_chat_template(&dir).as_deref(), Some("D"));
        assert_eq!(
            read_special_tokens(&dir),
            (Some("<s>".into()), Some("</s>".into()))
        );
        std::fs::write(dir.join("chat_template.json"), r#"{"chat_template": "J"}"#).unwrap();
        assert_eq!(read_chat_template(&dir).as_deref(), Some("J"));
        std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").unwrap();
        assert_eq!(read_chat_template(&dir).as_deref(), Some("{{ messages }}"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pad_token_from_the_tokenizer_files() {
        let vocab: std::collections::HashMap<String, u32> =
            [("[UNK]", 0), ("[PAD]", 1), ("<pad>", 2), ("cat", 3)]
                .into_iter()
                .map(|(t, i)| (t.to_string(), i))
                .collect();
        let model = tokenizers::models::wordlevel::WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let tok = tokenizers::Tokenizer::new(model);
        let dir = tmpdir("pad");
        // No file names one: padding is then refused by the pooling routes.
        assert_eq!(pad_token_id(&dir, &tok), None);
        std::fs::write(
            dir.join("special_tokens_map.json"),
            r#"{"pad_token": "<pad>"}"#,
        )
        .unwrap();
        assert_eq!(pad_token_id(&dir, &tok), Some(2));
        // tokenizer_config.json wins, in either form.
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"pad_token": {"content": "[PAD]", "lstrip": false}}"#,
        )
        .unwrap();
        assert_eq!(pad_token_id(&dir, &tok), Some(1));
        // A pad token the vocabulary lacks is no pad token.
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"pad_token": "<|pad|>"}"#,
        )
        .unwrap();
        assert_eq!(pad_token_id(&dir, &tok), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
