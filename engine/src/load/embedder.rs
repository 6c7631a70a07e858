//! A decoder folder loaded as an embedding model: the family's decoder without its LM head,
//! pooled and normalised as the sentence-transformers files say.

use std::path::Path;

use super::{in_dir, read_config};
use crate::error::Result;
use crate::families;
use crate::hf::{self, SafetensorsWeights, SentenceTransformersConfig};
use crate::model::{LoadedEncoder, Pooling};
use crate::models::llama::{DecoderEmbedder, LlamaModel, LmHead};

/// Loads `dir` (`Qwen3ForCausalLM`, `Qwen3Model`, `LlamaModel`, ...) as an embedding model.
/// Pooling and normalisation come from the Pooling module named in `modules.json` and a
/// Normalize module beside it; without a Pooling module, the last token's state normalised
/// (what vLLM's `--convert embed` does). The longest input is `sentence_bert_config.json`'s
/// `max_seq_length` where it is below the decoder's positions.
pub fn load_decoder_embedder(dir: &Path) -> Result<LoadedEncoder> {
    let config = read_config(dir)?;
    let rules = families::hf_embedder(&config).map_err(|e| in_dir(dir, e))?;
    let st = SentenceTransformersConfig::from_dir(dir)?;
    let (pooling, normalize) = match st.pooling {
        Some(pooling) => (pooling, st.normalize),
        None => (Pooling::LastToken, true),
    };
    let weights = SafetensorsWeights::open(dir)?;
    let model = LlamaModel::from_hf(
        dir,
        &config,
        &weights,
        None,
        Vec::new(),
        rules,
        LmHead::Skip,
    )?;
    let max_position = model.config().max_position;
    if let Some(n) = st.max_seq_length.filter(|&n| n > max_position) {
        tracing::warn!(
            max_seq_length = n,
            max_position,
            "sentence_bert_config max_seq_length exceeds the model's positions; using the latter"
        );
    }
    let max_seq_len = st.max_seq_length.unwrap_or(max_position);
    tracing::info!(
        dir = %dir.display(),
        pooling = ?pooling,
        normalize,
        max_seq_len = max_seq_len.min(max_position),
        "decoder served as an embedding model"
    );
    Ok(LoadedEncoder {
        model: Box::new(DecoderEmbedder::new(model, pooling, normalize, max_seq_len)),
        tokenizer: hf::load_tokenizer(dir)?,
        architecture: crate::hf::architecture(&config).to_string(),
    })
}
