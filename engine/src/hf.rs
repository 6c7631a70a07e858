//! HF checkpoint folders: `config.json`, `*.safetensors` (one file or sharded), `tokenizer.json`,
//! `tokenizer_config.json`, the chat template, and the sentence-transformers files of encoders.
//!
//! - [`detect`] tells what a model path holds, for the engine's dispatch.
//! - [`load_encoder`] loads a BERT-family embedding model or sequence classifier ready to serve.
//! - [`load_decoder`] loads a Llama-family decoder; [`decoder_from_weights`] the same from
//!   weights already mapped (the weight cache).
//! - [`load_tokenizer`], [`read_chat_template`], [`read_special_tokens`] serve the decoder loaders.

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
use crate::model::{EncoderHead, LoadedEncoder, Pooling};
use crate::models::bert::{BertEncoder, ClassifierLayout, EncoderSpec};

/// What a model path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// An HF folder with an encoder (`model_type` bert, roberta, ...): [`load_encoder`].
    Encoder,
    /// An HF folder with a causal LM (`*ForCausalLM`, `*LMHeadModel`, ...).
    Decoder,
    /// A `.gguf` file, or a folder whose only weights are one `.gguf` file.
    Gguf,
    /// Nothing we recognise (no readable `config.json`, unknown architecture).
    Unknown,
}

/// Encoder families by `model_type`. BERT embedders and BERT, RoBERTa and XLM-R classifiers
/// load; the others are recognised so that their load error says what is missing.
const ENCODER_MODEL_TYPES: &[&str] = &[
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "mpnet",
    "nomic_bert",
    "modernbert",
    "deberta",
    "deberta-v2",
];

/// Embedding architectures [`load_encoder`] accepts.
const BERT_ARCHITECTURES: &[&str] = &["BertModel", "BertForMaskedLM", "BertForPreTraining"];

/// Sequence-classification architectures [`load_encoder`] accepts, with their head's layout.
const CLASSIFIER_ARCHITECTURES: &[(&str, ClassifierLayout)] = &[
    ("BertForSequenceClassification", ClassifierLayout::Bert),
    (
        "XLMRobertaForSequenceClassification",
        ClassifierLayout::Roberta,
    ),
    (
        "RobertaForSequenceClassification",
        ClassifierLayout::Roberta,
    ),
];

/// Tells whether `path` is an encoder folder, a decoder folder or a GGUF file. Never fails:
/// anything unreadable is [`CheckpointKind::Unknown`].
pub fn detect(path: &Path) -> CheckpointKind {
    if path.is_file() {
        return if has_extension(path, "gguf") {
            CheckpointKind::Gguf
        } else {
            CheckpointKind::Unknown
        };
    }
    let cfg = match HfConfig::from_dir(path) {
        Ok(cfg) => cfg,
        Err(_) => {
            let ggufs = std::fs::read_dir(path)
                .map(|it| {
                    it.filter_map(|e| e.ok())
                        .filter(|e| has_extension(&e.path(), "gguf"))
                        .count()
                })
                .unwrap_or(0);
            return if ggufs == 1 {
                CheckpointKind::Gguf
            } else {
                CheckpointKind::Unknown
            };
        }
    };
    let arch = cfg.architecture();
    let decoder_arch = ["ForCausalLM", "LMHeadModel", "ForConditionalGeneration"]
        .iter()
        .any(|suffix| arch.ends_with(suffix));
    if decoder_arch {
        return CheckpointKind::Decoder;
    }
    let model_type = cfg.model_type.as_deref().unwrap_or("");
    if ENCODER_MODEL_TYPES.contains(&model_type)
        || BERT_ARCHITECTURES.contains(&arch)
        || CLASSIFIER_ARCHITECTURES
            .iter()
            .any(|(name, _)| *name == arch)
    {
        return CheckpointKind::Encoder;
    }
    CheckpointKind::Unknown
}

/// Loads an encoder folder. An embedding model (`BertModel` and friends): pooling and
/// normalisation from the sentence-transformers files (without them: [CLS] pooling and
/// normalisation, as vLLM does for a plain `BertModel`). A sequence classifier (BERT, RoBERTa,
/// XLM-R `*ForSequenceClassification`): its head, labels and activations from `config.json`.
/// `tokenizer.json` with padding and truncation off. `max_seq_len` is
/// `sentence_bert_config.json`'s `max_seq_length` if present, else what the position table
/// holds.
pub fn load_encoder(dir: &Path) -> Result<LoadedEncoder> {
    let cfg = HfConfig::from_dir(dir)?;
    let arch = cfg.architecture().to_string();
    let model_type = cfg.model_type.clone().unwrap_or_default();
    let classifier = CLASSIFIER_ARCHITECTURES
        .iter()
        .find(|(name, _)| *name == arch)
        .map(|&(_, layout)| layout);
    let is_bert = if arch.is_empty() {
        model_type == "bert"
    } else {
        BERT_ARCHITECTURES.contains(&arch.as_str())
    };
    if !is_bert && classifier.is_none() {
        let supported: Vec<&str> = BERT_ARCHITECTURES
            .iter()
            .copied()
            .chain(CLASSIFIER_ARCHITECTURES.iter().map(|(name, _)| *name))
            .collect();
        return Err(EngineError::load(
            dir.join("config.json").display().to_string(),
            format!(
                "unsupported encoder architecture `{}` (model_type `{model_type}`); supported: {}",
                if arch.is_empty() { "?" } else { &arch },
                supported.join(", ")
            ),
        ));
    }
    let st = SentenceTransformersConfig::from_dir(dir)?;
    let max_position = cfg.require(cfg.max_position_embeddings, "max_position_embeddings")?;
    let max_len = max_position.saturating_sub(crate::models::bert::position_offset(&cfg));
    let max_seq_len = match st.max_seq_length {
        Some(n) if n > max_len => {
            tracing::warn!(
                max_seq_length = n,
                max_len,
                "sentence_bert_config max_seq_length exceeds what max_position_embeddings holds; using the latter"
            );
            max_len
        }
        Some(n) => n,
        None => max_len,
    };
    let (pooling, normalize, head) = match classifier {
        Some(_) => (
            Pooling::Cls,
            false,
            EncoderHead::Classify(classifier_info(&cfg).map_err(|e| in_dir(dir, e))?),
        ),
        None if st.present => (
            st.pooling.unwrap_or(Pooling::Mean),
            st.normalize,
            EncoderHead::Embed,
        ),
        None => {
            tracing::info!("no modules.json: using [CLS] pooling with normalisation");
            (Pooling::Cls, true, EncoderHead::Embed)
        }
    };
    let weights = SafetensorsWeights::open(dir)?;
    let spec = EncoderSpec {
        pooling,
        normalize,
        head,
        classifier_layout: classifier.unwrap_or(ClassifierLayout::Bert),
        max_seq_len,
    };
    let model = BertEncoder::load(&cfg, &weights, spec)?;
    let tokenizer = load_tokenizer(dir)?;
    Ok(LoadedEncoder {
        model: Box::new(model),
        tokenizer,
        architecture: if arch.is_empty() {
            "BertModel".to_string()
        } else {
            arch
        },
    })
}

/// A `config.json` error with the folder's file named.
fn in_dir(dir: &Path, e: EngineError) -> EngineError {
    match e {
        EngineError::Load { reason, .. } => {
            EngineError::load(dir.join("config.json").display().to_string(), reason)
        }
        other => other,
    }
}

/// Loads a decoder folder (`config.json`, safetensors, `tokenizer.json`, the chat template
/// and special tokens): the Llama-family decoder of [`crate::models::llama`].
pub fn load_decoder(dir: &Path) -> Result<crate::model::LoadedDecoder> {
    decoder_from_weights(dir, &SafetensorsWeights::open(dir)?)
}

/// [`load_decoder`] with the weights already opened (from the folder's files, or from the
/// weight cache's shared memory); everything else comes from `dir`.
pub fn decoder_from_weights(
    dir: &Path,
    weights: &SafetensorsWeights,
) -> Result<crate::model::LoadedDecoder> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| EngineError::load(config_path.display().to_string(), e.to_string()))?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        EngineError::load(
            config_path.display().to_string(),
            format!("invalid JSON: {e}"),
        )
    })?;
    let ids = |key: &str| -> Vec<u32> {
        let from = |v: &serde_json::Value| -> Vec<u32> {
            match v.get(key) {
                Some(serde_json::Value::Number(n)) => {
                    n.as_u64().map(|n| vec![n as u32]).unwrap_or_default()
                }
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .filter_map(|n| n.as_u64())
                    .map(|n| n as u32)
                    .collect(),
                _ => Vec::new(),
            }
        };
        let mut out = from(&config);
        if out.is_empty() {
            if let Some(gen) = read_json_value(&dir.join("generation_config.json")) {
                out = from(&gen);
            }
        }
        out
    };
    let eos = ids("eos_token_id");
    let bos = ids("bos_token_id").first().copied();
    let model = crate::models::llama::LlamaModel::from_hf(dir, &config, weights, bos, eos)?;
    let media = crate::models::media::MediaEncoders::load(dir, &config, weights)?.map(Box::new);
    let tokenizer = load_tokenizer(dir)?;
    let (bos_token, eos_token) = read_special_tokens(dir);
    let architecture = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|a| a.as_str())
        .unwrap_or("unknown")
        .to_string();
    Ok(crate::model::LoadedDecoder {
        model: Box::new(model),
        tokenizer,
        chat_template: read_chat_template(dir),
        bos_token,
        eos_token,
        architecture,
        media,
    })
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

fn token_string(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json_value(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring unparsable JSON file");
            None
        }
    }
}

fn has_extension(path: &Path, ext: &str) -> bool {
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
    fn detects_kinds() {
        let dir = tmpdir("detect");
        assert_eq!(detect(&dir), CheckpointKind::Unknown);
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["LlamaForCausalLM"]}"#,
        )
        .unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Decoder);
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["BertModel"], "model_type": "bert"}"#,
        )
        .unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Encoder);
        std::fs::write(dir.join("config.json"), r#"{"model_type": "xlm-roberta"}"#).unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Encoder);
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["XLMRobertaForSequenceClassification"]}"#,
        )
        .unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Encoder);
        std::fs::write(dir.join("config.json"), r#"{"model_type": "whisper"}"#).unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Unknown);
        let gguf = dir.join("m.gguf");
        std::fs::write(&gguf, b"GGUF").unwrap();
        assert_eq!(detect(&gguf), CheckpointKind::Gguf);
        std::fs::remove_file(dir.join("config.json")).unwrap();
        assert_eq!(detect(&dir), CheckpointKind::Gguf);
        let _ = std::fs::remove_dir_all(&dir);
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
    fn unsupported_architecture_is_named() {
        let dir = tmpdir("arch");
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}"#,
        )
        .unwrap();
        let err = load_encoder(&dir)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("XLMRobertaModel") && err.contains("BertModel"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
