//! `/tokenize` and `/detokenize`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<super::chat::ChatMessage>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub return_token_strs: Option<bool>,
    pub chat_template: Option<String>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub tools: Option<Value>,
    pub mm_processor_kwargs: Option<super::RawKwargs>,
    pub media_io_kwargs: Option<super::RawKwargs>,
}

#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
