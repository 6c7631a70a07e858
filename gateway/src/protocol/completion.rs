//! `/v1/completions` request and response types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sampling::request_with_sampling;
use super::Usage;

/// `prompt`: a string, a list of strings, a list of token ids, or a list of lists of ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

request_with_sampling! {
pub struct CompletionRequest via CompletionRequestWire {
    pub model: Option<String>,
    pub prompt: Option<PromptField>,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub add_special_tokens: Option<bool>,
    /// Not a declared field of vLLM's completion request, but a client-sent one is still seen
    /// and gated (CONTRACT section 2).
    pub mm_processor_kwargs: Option<super::RawKwargs>,
    pub media_io_kwargs: Option<super::RawKwargs>,
    pub prompt_embeds: Option<Box<Value>>,
}
}

#[derive(Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<Value>,
    /// The prompt's logprobs when asked for (never in a stream, as vLLM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Value>,
}

#[derive(Debug, Serialize, Default)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
}
