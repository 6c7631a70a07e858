//! The engine handle the gateway holds: cheap to clone, thread-safe, async at the edge.
//! (Skeleton signatures; the engine-core work fills in the bodies.)

use std::sync::Arc;

use crate::api::{ChatTemplateOptions, Delta, GenerateRequest, ModelCard};
use crate::error::{EngineError, Result};

/// Settings for the serving machinery, from the CLI.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_active_seqs: Option<usize>,
    pub max_num_batched_tokens: usize,
    /// KV cache capacity in tokens (all sequences together).
    pub kv_cache_tokens: usize,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    pub threads: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_model_len: None,
            max_num_seqs: 256,
            max_num_active_seqs: None,
            max_num_batched_tokens: 2048,
            kv_cache_tokens: 65536,
            block_size: 16,
            enable_prefix_caching: true,
            threads: None,
        }
    }
}

/// One model to serve: a path (GGUF file or HF folder) and the name clients use.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub path: String,
    pub served_name: String,
}

/// All served models, routed by name.
#[derive(Clone)]
pub struct EngineHandle {
    _inner: Arc<()>,
}

/// One served model.
#[derive(Clone)]
pub struct ModelHandle {
    _inner: Arc<()>,
}

/// Output of one sequence. Dropping it cancels the sequence and frees its KV blocks.
pub struct GenerationStream {
    _inner: (),
}

impl EngineHandle {
    /// Load every model and start the engine threads. Errors name the file that failed.
    pub fn start(_models: &[ModelSpec], _config: &EngineConfig) -> Result<Self> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
    pub fn models(&self) -> Vec<ModelCard> {
        Vec::new()
    }
    pub fn model(&self, _name: &str) -> Option<ModelHandle> {
        None
    }
    /// True while every engine thread is alive.
    pub fn is_healthy(&self) -> bool {
        false
    }
}

impl ModelHandle {
    pub fn card(&self) -> &ModelCard {
        unimplemented!()
    }
    pub fn encode(&self, _text: &str, _add_special_tokens: bool) -> Result<Vec<u32>> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
    pub fn decode(&self, _ids: &[u32], _skip_special_tokens: bool) -> Result<String> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
    pub fn token_str(&self, _id: u32) -> Option<String> {
        None
    }
    pub fn vocab_size(&self) -> usize {
        0
    }
    pub fn render_chat(&self, _messages: &serde_json::Value, _opts: &ChatTemplateOptions) -> Result<String> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
    pub fn generate(&self, _req: GenerateRequest) -> Result<GenerationStream> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
    pub async fn embed(&self, _inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>> {
        Err(EngineError::Internal("not yet implemented".into()))
    }
}

impl GenerationStream {
    /// The next increment; `None` after the delta that carries `finish`.
    pub async fn next(&mut self) -> Option<Result<Delta>> {
        None
    }
}
