//! From a checkpoint on disk (or in the weight cache's memory) to a model ready to serve: the
//! file readers ([`crate::hf`], [`crate::gguf`]) read, the registry ([`crate::families`]) says
//! which family the architecture is, and the family's model is built from the weights.
//!
//! - [`detect`] tells what a model path holds, and [`served_kind`] how it is served under
//!   `--runner` / `--convert`, for the engine's dispatch.
//! - [`load_encoder`] loads an embedding model or sequence classifier;
//!   [`load_decoder_embedder`] a decoder served as an embedding model.
//! - [`load_hf_decoder`] / [`load_gguf_decoder`] load a decoder; [`hf_decoder_from_weights`]
//!   and [`gguf_decoder`] do the same from weights already mapped (the weight cache).

mod embedder;
mod runner;

pub use embedder::load_decoder_embedder;
pub use runner::{served_kind, Convert, RunAs, Runner};

use std::path::Path;
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::families::{self, Build, EncoderHeadKind};
use crate::gguf::GgufFile;
use crate::hf::{self, classifier_info, HfConfig, SafetensorsWeights, SentenceTransformersConfig};
use crate::model::{CausalLm, EncoderHead, LoadedEncoder, Pooling};
use crate::models::bert::{self, BertEncoder, ClassifierLayout, EncoderSpec};
use crate::models::llama::{LlamaModel, LmHead};
use crate::models::media::MediaEncoders;
use crate::models::modernbert::ModernBertEncoder;
use crate::tokenizer;

/// A decoder checkpoint loaded with everything needed to serve it.
pub struct LoadedDecoder {
    pub model: Box<dyn CausalLm>,
    /// Ready to encode prompts exactly as the reference does (no BOS added unless the
    /// checkpoint says so).
    pub tokenizer: tokenizers::Tokenizer,
    /// The checkpoint's chat template (GGUF `tokenizer.chat_template` or the HF files).
    pub chat_template: Option<String>,
    /// Token strings the chat template may use as `bos_token` / `eos_token`.
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The architecture name, for logs and model cards (e.g. `llama`).
    pub architecture: String,
    /// The vision or audio encoders of a multimodal checkpoint.
    pub media: Option<Box<MediaEncoders>>,
}

/// What a model path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// An HF folder with an encoder (`model_type` bert, roberta, ...): [`load_encoder`].
    Encoder,
    /// An HF folder with a causal LM (`*ForCausalLM`, `*LMHeadModel`, ...).
    Decoder,
    /// An HF decoder folder served as an embedding model: an architecture that only embeds
    /// (`Qwen3Model`), or a decoder that [`served_kind`] turns into one.
    DecoderEmbedder,
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

/// Tells whether `path` is an encoder folder, a decoder folder or a GGUF file. Never fails:
/// anything unreadable is [`CheckpointKind::Unknown`].
pub fn detect(path: &Path) -> CheckpointKind {
    if path.is_file() {
        return if hf::has_extension(path, "gguf") {
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
                        .filter(|e| hf::has_extension(&e.path(), "gguf"))
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
    let build = families::by_hf_architecture(arch).map(|f| &f.build);
    if matches!(build, Some(Build::DecoderEmbedder { .. })) {
        return CheckpointKind::DecoderEmbedder;
    }
    let model_type = cfg.model_type.as_deref().unwrap_or("");
    let encoder_family = matches!(build, Some(Build::Encoder(_)));
    if ENCODER_MODEL_TYPES.contains(&model_type) || encoder_family {
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
    // A config without `architectures` is a plain BERT embedder when its model type says so.
    let head = match families::by_hf_architecture(&arch).map(|f| &f.build) {
        Some(Build::Encoder(head)) => Some(*head),
        None if arch.is_empty() && model_type == "bert" => Some(EncoderHeadKind::Embedding),
        _ => None,
    };
    let Some(head_kind) = head else {
        return Err(EngineError::load(
            dir.join("config.json").display().to_string(),
            format!(
                "unsupported encoder architecture `{}` (model_type `{model_type}`); supported: {}",
                if arch.is_empty() { "?" } else { &arch },
                families::hf_names(|b| matches!(b, Build::Encoder(_))).join(", ")
            ),
        ));
    };
    let classifies = head_kind != EncoderHeadKind::Embedding;
    let st = SentenceTransformersConfig::from_dir(dir)?;
    let max_position = cfg.require(cfg.max_position_embeddings, "max_position_embeddings")?;
    let max_len = max_position.saturating_sub(bert::position_offset(&cfg));
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
    let (pooling, normalize, head) = match classifies {
        true => (
            Pooling::Cls,
            false,
            EncoderHead::Classify(classifier_info(&cfg).map_err(|e| in_dir(dir, e))?),
        ),
        false if st.present => (
            st.pooling.unwrap_or(Pooling::Mean),
            st.normalize,
            EncoderHead::Embed,
        ),
        false => {
            tracing::info!("no modules.json: using [CLS] pooling with normalisation");
            (Pooling::Cls, true, EncoderHead::Embed)
        }
    };
    let weights = SafetensorsWeights::open(dir)?;
    if head_kind == EncoderHeadKind::ModernBertClassifier {
        let model = ModernBertEncoder::load(&read_config(dir)?, &weights, head, max_seq_len)
            .map_err(|e| in_dir(dir, e))?;
        return Ok(LoadedEncoder {
            model: Box::new(model),
            tokenizer: hf::load_tokenizer(dir)?,
            architecture: arch,
        });
    }
    let spec = EncoderSpec {
        pooling,
        normalize,
        head,
        classifier_layout: match head_kind {
            EncoderHeadKind::Classifier(layout) => layout,
            _ => ClassifierLayout::Bert,
        },
        max_seq_len,
    };
    let model = BertEncoder::load(&cfg, &weights, spec)?;
    let tokenizer = hf::load_tokenizer(dir)?;
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

/// `dir/config.json` as JSON.
fn read_config(dir: &Path) -> Result<serde_json::Value> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| EngineError::load(config_path.display().to_string(), e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| {
        EngineError::load(
            config_path.display().to_string(),
            format!("invalid JSON: {e}"),
        )
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
/// and special tokens) as its family says.
pub fn load_hf_decoder(dir: &Path) -> Result<LoadedDecoder> {
    hf_decoder_from_weights(dir, &SafetensorsWeights::open(dir)?)
}

/// [`load_hf_decoder`] with the weights already opened (from the folder's files, or from the
/// weight cache's shared memory); everything else comes from `dir`.
pub fn hf_decoder_from_weights(dir: &Path, weights: &SafetensorsWeights) -> Result<LoadedDecoder> {
    let config = read_config(dir)?;
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
            if let Some(gen) = hf::read_json_value(&dir.join("generation_config.json")) {
                out = from(&gen);
            }
        }
        out
    };
    let eos = ids("eos_token_id");
    let bos = ids("bos_token_id").first().copied();
    let (rules, media) = families::hf_decoder(&config).map_err(|e| in_dir(dir, e))?;
    let model = LlamaModel::from_hf(dir, &config, weights, bos, eos, rules, LmHead::Read)?;
    let media = match media {
        Some(load) => Some(Box::new(load(dir, &config, weights)?)),
        None => None,
    };
    let tokenizer = hf::load_tokenizer(dir)?;
    let (bos_token, eos_token) = hf::read_special_tokens(dir);
    let architecture = hf::architecture(&config).to_string();
    Ok(LoadedDecoder {
        model: Box::new(model),
        tokenizer,
        chat_template: hf::read_chat_template(dir),
        bos_token,
        eos_token,
        architecture,
        media,
    })
}

/// Load a GGUF decoder checkpoint: tokenizer, chat template, special tokens and the model.
pub fn load_gguf_decoder(path: &Path) -> Result<LoadedDecoder> {
    gguf_decoder(GgufFile::open(path)?)
}

/// [`load_gguf_decoder`] over a parsed file, wherever its bytes are mapped from.
pub fn gguf_decoder(gguf: GgufFile) -> Result<LoadedDecoder> {
    let t0 = Instant::now();
    let architecture = gguf
        .get_str("general.architecture")?
        .ok_or_else(|| gguf.error("missing metadata 'general.architecture'"))?
        .to_string();
    let rules = families::gguf_decoder(&architecture).map_err(|e| gguf.error(e))?;
    let mut type_counts: std::collections::BTreeMap<String, usize> = Default::default();
    for t in gguf.tensors() {
        *type_counts.entry(t.ggml_type.name()).or_default() += 1;
    }
    tracing::info!(
        file = %gguf.path(),
        version = gguf.version,
        architecture = %architecture,
        tensors = gguf.tensors().len(),
        types = ?type_counts,
        "parsed GGUF header"
    );

    let tok = tokenizer::from_gguf(&gguf)?;
    let chat_template = gguf.get_str("tokenizer.chat_template")?.map(str::to_string);
    let model = LlamaModel::from_gguf(&gguf, &tok, rules)?;
    // As llama.cpp: an id the tokenizer can give must have an embedding row.
    let rows = CausalLm::info(&model).vocab_size;
    if tok.vocab_size > rows {
        return Err(gguf.error(format!(
            "the vocabulary has {} tokens but token_embd.weight has {rows} rows",
            tok.vocab_size
        )));
    }
    tracing::info!(
        file = %gguf.path(),
        architecture = %architecture,
        vocab = tok.tokenizer.get_vocab_size(true),
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "loaded GGUF decoder"
    );
    Ok(LoadedDecoder {
        model: Box::new(model),
        tokenizer: tok.tokenizer,
        chat_template,
        bos_token: tok.bos_token,
        eos_token: tok.eos_token,
        architecture,
        media: None,
    })
}

/// [`gguf_decoder`] over GGUF bytes in memory: the fuzz target's entry and its seed corpus
/// test's, so both take the path a file takes at start-up, from the header to the model.
pub fn gguf_decoder_from_bytes(name: &str, bytes: &[u8]) -> Result<LoadedDecoder> {
    gguf_decoder(GgufFile::from_bytes(name, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("engine-load-{tag}-{}", std::process::id()));
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
