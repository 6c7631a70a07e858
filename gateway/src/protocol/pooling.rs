//! Embeddings, pooling, score, rerank and classify request and response types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Usage;

/// `input`: a string, a list of strings, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

/// Fields every pooling-family request shares.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PoolingFields {
    pub encoding_format: Option<String>,
    pub embed_dtype: Option<String>,
    pub endianness: Option<String>,
    pub dimensions: Option<i64>,
    pub use_activation: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
    pub padding: Option<Value>,
    /// Removed in vLLM; a request carrying it is refused.
    pub normalize: Option<Value>,
    pub user: Option<String>,
    pub add_special_tokens: Option<bool>,
    pub mm_processor_kwargs: Option<Value>,
    pub media_io_kwargs: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Option<EmbedInput>,
    pub messages: Option<Vec<super::chat::ChatMessage>>,
    #[serde(flatten)]
    pub pooling: PoolingFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PoolingRequest {
    pub model: Option<String>,
    pub input: Option<EmbedInput>,
    pub messages: Option<Vec<super::chat::ChatMessage>>,
    pub task: Option<String>,
    #[serde(flatten)]
    pub pooling: PoolingFields,
}

/// A side of a score request: one text or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TextOrTexts {
    One(String),
    Many(Vec<String>),
}

impl TextOrTexts {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            TextOrTexts::One(s) => vec![s],
            TextOrTexts::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ScoreRequest {
    pub model: Option<String>,
    pub queries: Option<TextOrTexts>,
    pub documents: Option<TextOrTexts>,
    pub items: Option<TextOrTexts>,
    pub data_1: Option<TextOrTexts>,
    pub data_2: Option<TextOrTexts>,
    pub text_1: Option<TextOrTexts>,
    pub text_2: Option<TextOrTexts>,
    #[serde(flatten)]
    pub pooling: PoolingFields,
}

/// A rerank document: a string or `{"text": ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RerankDocument {
    Text(String),
    Object { text: String },
}

impl RerankDocument {
    pub fn text(&self) -> &str {
        match self {
            RerankDocument::Text(t) | RerankDocument::Object { text: t } => t,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: Option<String>,
    pub documents: Option<Vec<RerankDocument>>,
    pub top_n: Option<i64>,
    pub return_documents: Option<bool>,
    #[serde(flatten)]
    pub pooling: PoolingFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClassifyRequest {
    pub model: Option<String>,
    pub input: Option<EmbedInput>,
    pub messages: Option<Vec<super::chat::ChatMessage>>,
    #[serde(flatten)]
    pub pooling: PoolingFields,
}

#[derive(Debug, Serialize)]
pub struct ListResponse<T: Serialize> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<T>,
    pub usage: Usage,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingData {
    pub index: usize,
    pub object: &'static str,
    pub embedding: Value,
}

#[derive(Debug, Serialize)]
pub struct PoolingData {
    pub index: usize,
    pub object: &'static str,
    pub data: Value,
}

#[derive(Debug, Serialize)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f64,
}

/// One input's classification: the label of the largest probability, and all of them.
#[derive(Debug, Serialize)]
pub struct ClassificationData {
    pub index: usize,
    pub label: Option<String>,
    pub probs: Vec<f64>,
    pub num_classes: usize,
}

#[derive(Debug, Serialize)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}

#[derive(Debug, Serialize)]
pub struct RerankUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize)]
pub struct RerankResult {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocOut>,
    pub relevance_score: f64,
}

#[derive(Debug, Serialize)]
pub struct RerankDocOut {
    pub text: String,
}
