//! The sentence-transformers files of an encoder checkpoint: `modules.json` (which modules run
//! after the transformer, a Normalize among them?), the Pooling module's `config.json` and
//! `sentence_bert_config.json` (`max_seq_length`).

use std::path::Path;

use serde::Deserialize;

use crate::error::{EngineError, Result};
use crate::model::Pooling;

/// What the sentence-transformers files say; all `None`/`false` for a plain HF folder.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SentenceTransformersConfig {
    /// `modules.json` exists.
    pub present: bool,
    /// From the Pooling module's config, if there is one.
    pub pooling: Option<Pooling>,
    /// A `sentence_transformers.models.Normalize` module is listed.
    pub normalize: bool,
    /// `sentence_bert_config.json`'s `max_seq_length`.
    pub max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type", default)]
    kind: String,
}

#[derive(Deserialize, Default)]
struct PoolingConfig {
    /// Newer sentence-transformers releases may write the mode as one string.
    pooling_mode: Option<String>,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

impl SentenceTransformersConfig {
    /// Reads the files present in `dir`; absent files leave their fields unset, present but
    /// malformed ones are `Load` errors.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut cfg = SentenceTransformersConfig::default();
        let sbert = dir.join("sentence_bert_config.json");
        if sbert.is_file() {
            let parsed: SentenceBertConfig = read_json(&sbert)?;
            cfg.max_seq_length = parsed.max_seq_length;
        }
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(cfg);
        }
        cfg.present = true;
        let modules: Vec<Module> = read_json(&modules_path)?;
        for module in &modules {
            if module.kind.ends_with(".Normalize") || module.kind == "Normalize" {
                cfg.normalize = true;
            } else if module.kind.ends_with(".Pooling") || module.kind == "Pooling" {
                let path = dir.join(&module.path).join("config.json");
                let pooling: PoolingConfig = read_json(&path)?;
                cfg.pooling = Some(
                    pooling_mode(&pooling)
                        .map_err(|reason| EngineError::load(path.display().to_string(), reason))?,
                );
            }
        }
        Ok(cfg)
    }
}

fn pooling_mode(cfg: &PoolingConfig) -> std::result::Result<Pooling, String> {
    if let Some(mode) = &cfg.pooling_mode {
        return match mode.as_str() {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "lasttoken" | "last" => Ok(Pooling::LastToken),
            other => Err(format!(
                "unsupported pooling_mode `{other}` (supported: mean, cls, lasttoken)"
            )),
        };
    }
    let unsupported = [
        (cfg.pooling_mode_max_tokens, "pooling_mode_max_tokens"),
        (
            cfg.pooling_mode_mean_sqrt_len_tokens,
            "pooling_mode_mean_sqrt_len_tokens",
        ),
        (
            cfg.pooling_mode_weightedmean_tokens,
            "pooling_mode_weightedmean_tokens",
        ),
    ];
    if let Some((_, name)) = unsupported.iter().find(|(on, _)| *on) {
        return Err(format!(
            "unsupported pooling mode `{name}` (supported: mean, cls, lasttoken)"
        ));
    }
    let chosen: Vec<Pooling> = [
        (cfg.pooling_mode_mean_tokens, Pooling::Mean),
        (cfg.pooling_mode_cls_token, Pooling::Cls),
        (cfg.pooling_mode_lasttoken, Pooling::LastToken),
    ]
    .into_iter()
    .filter_map(|(on, p)| on.then_some(p))
    .collect();
    match chosen.as_slice() {
        [one] => Ok(*one),
        [] => Err("no pooling mode is enabled".to_string()),
        _ => Err(
            "several pooling modes are enabled (their concatenation is not supported)".to_string(),
        ),
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::load(path.display().to_string(), e.to_string()))?;
    serde_json::from_str(&text)
        .map_err(|e| EngineError::load(path.display().to_string(), format!("invalid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("engine-hf-st-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        dir
    }

    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn reads_pooling_normalize_and_max_len() {
        let dir = tmpdir("full");
        std::fs::write(dir.join("modules.json"), MODULES).unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true,
                "pooling_mode_mean_tokens": false}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("sentence_bert_config.json"),
            r#"{"max_seq_length": 256}"#,
        )
        .unwrap();
        let cfg = SentenceTransformersConfig::from_dir(&dir).unwrap();
        assert!(cfg.present && cfg.normalize);
        assert_eq!(cfg.pooling, Some(Pooling::Cls));
        assert_eq!(cfg.max_seq_length, Some(256));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn plain_folder_has_nothing() {
        let dir = tmpdir("plain");
        let cfg = SentenceTransformersConfig::from_dir(&dir).unwrap();
        assert_eq!(cfg, SentenceTransformersConfig::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unsupported_pooling_is_a_load_error() {
        let dir = tmpdir("maxpool");
        std::fs::write(dir.join("modules.json"), MODULES).unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"pooling_mode_max_tokens": true}"#,
        )
        .unwrap();
        let err = SentenceTransformersConfig::from_dir(&dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("pooling_mode_max_tokens"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn string_pooling_mode() {
        let cfg = PoolingConfig {
            pooling_mode: Some("lasttoken".into()),
            ..PoolingConfig::default()
        };
        assert_eq!(pooling_mode(&cfg), Ok(Pooling::LastToken));
    }
}
